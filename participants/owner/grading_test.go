package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// bounded is a provider with bounds (Bounded).
type bounded struct {
	fullProvider
	b provider.Bounds
}

func (p bounded) Bounds() provider.Bounds { return p.b }

// A grade's own sandbox (GradeSandboxes.Fresh): named by the owner, never
// a session's; started although the provider's live bound is taken by the
// session graded, and counted against it while it lives; not snapshotted
// by a checkpoint taken while it lives; gone when removed. A spec naming
// an image the owner cannot resolve is refused before any sandbox.
func TestGradeSandboxes(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	cfg := baseConfig(t, env, bounded{fullProvider: d, b: provider.Bounds{Live: 1}}, "o1")
	var o *Owner
	cfg.TaskKind = TaskFuncs{GradeFn: func(ctx context.Context, x Execer, s *Session) (json.RawMessage, error) {
		g, ok := x.(GradeSandboxes)
		if !ok {
			return nil, fmt.Errorf("the grade's Execer %T is not a GradeSandboxes", x)
		}
		if _, _, err := g.Fresh(ctx, provider.Spec{ImageRef: "/no/such/image"}); !errors.Is(err, ErrBadTask) || len(d.Sandboxes()) != 1 {
			return nil, fmt.Errorf("Fresh of an image without a cache: %v, sandboxes %v", err, d.Sandboxes())
		}
		sb, remove, err := g.Fresh(ctx, provider.Spec{ID: s.Sandbox.ID, Workdir: "/w", Files: map[string][]byte{"w/f": []byte("graded")}})
		if err != nil {
			return nil, err
		}
		defer remove()
		if sb.ID == s.Sandbox.ID || !strings.HasPrefix(sb.ID, "gr") || !slices.Contains(d.Sandboxes(), sb.ID) {
			return nil, fmt.Errorf("grading sandbox %q (session's %q, provider's %v)", sb.ID, s.Sandbox.ID, d.Sandboxes())
		}
		res, err := x.Exec(ctx, sb.ID, []string{"cat", "f"}, provider.ExecOptions{})
		if err != nil || string(res.Stdout) != "graded" {
			return nil, fmt.Errorf("cat f in the grading sandbox: %q %v", res.Stdout, err)
		}
		// The live bound is taken: a session's start waits its turn.
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = o.StartSession(wctx, "s2", ep("r2", 0), provider.Spec{})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("a session started beside the grading sandbox beyond the live bound: %v", err)
		}
		recs := checkpoint(t, o, "c1")
		if len(recs) != 1 || decode(t, recs[0]).Sandbox.SandboxID != s.Sandbox.ID || len(snapshots(t, d)) != 1 {
			return nil, fmt.Errorf("a checkpoint while the grade runs: %v, snapshots %v", recs, snapshots(t, d))
		}
		remove()
		remove()
		if slices.Contains(d.Sandboxes(), sb.ID) {
			return nil, fmt.Errorf("grading sandbox %s left after remove", sb.ID)
		}
		return json.RawMessage(`{"reward":1}`), nil
	}}
	o = newOwner(t, cfg)
	ctx := t.Context()
	start(t, o, "s1", ep("r1", 0))
	res, err := o.verify(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
	if err != nil || string(res.Result) != `{"reward":1}` {
		t.Fatalf("verify: %s %v", res.Result, err)
	}
	if sbs := d.Sandboxes(); len(sbs) != 0 {
		t.Fatalf("sandboxes after the grade ended its session: %v", sbs)
	}
	// With room again, a session starts.
	start(t, o, "s2", ep("r2", 0))
	if err := o.CloseSession(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
