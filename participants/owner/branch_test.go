package owner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
)

// newOverlay returns an overlay provider under t.TempDir(), empty when the
// test ends.
func newOverlay(t *testing.T) *overlay.Provider {
	t.Helper()
	p, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("overlay provider (run as root on Linux with overlayfs and cgroup v2): %v", err)
	}
	t.Cleanup(func() { checkEmpty(t, p) })
	return p
}

// branchPhase is a branch phase of the parents, n branches each, in epoch.
func branchPhase(source string, epoch uint64, n int, parents ...events.Episode) events.Branch {
	b := events.Branch{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "branch-1", Epoch: epoch}, Source: source}
	for _, p := range parents {
		for k := 1; k <= n; k++ {
			b.Branches = append(b.Branches, events.NewBranchSpec(p, k, uint64(100*k)))
		}
	}
	return b
}

// A session's snapshot branched 4 ways on overlay gives 4 sandboxes with
// ids, sandboxd identities (each its own NATS user, minted for its id),
// and files of their own, each answering sandbox_access under its branch
// session and serving its branch episode; a record of no parent is left
// alone; a retire of a branch episode stops its sandbox alone.
func TestBranchForksASnapshotNWays(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority(testRun))
	p := newOverlay(t)
	ctx := t.Context()
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	signerFile := filepath.Join(t.TempDir(), "sandbox-signer.json")
	if err := env.Authority.WriteSigner(testRun, events.KindSandbox, signerFile); err != nil {
		t.Fatal(err)
	}
	signer, err := embedded.LoadSigner(signerFile)
	if err != nil {
		t.Fatal(err)
	}
	creds := &SandboxCreds{Minter: signer, Run: testRun, Dir: filepath.Join(t.TempDir(), "creds"), TTL: time.Minute}
	if err := creds.Check(); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, env, p, "o1")
	cfg.SandboxCreds = creds
	// The parents run no daemon; every fork starts sandboxd anew, as a
	// fork of an overlay snapshot does.
	cfg.TaskKind = TaskFuncs{ForkSpecFn: func(s provider.Spec) provider.Spec {
		return ForkSpec(s, SandboxdConfig{Binary: sd, NATSURL: env.URL, Run: testRun, Creds: creds, Args: []string{"--grace", "1s"}})
	}}
	o := newOwner(t, cfg)
	c := serve(t, env, o)
	s1 := start(t, o, "s1", ep("r1", 0))
	s2 := start(t, o, "s2", ep("r2", 0))
	sh(t, p, s1.Sandbox.ID, "echo parent > /parent.txt")
	recs := checkpoint(t, o, "c1")
	if len(recs) != 2 {
		t.Fatalf("records %+v", recs)
	}
	sh(t, p, s1.Sandbox.ID, "echo later > /later.txt")

	b := branchPhase("c1", 3, 4, ep("r1", 0))
	eps, err := o.Branch(ctx, b, recs)
	if err != nil {
		t.Fatalf("Branch: %v", err)
	}
	var want []events.Episode
	for _, s := range b.Branches {
		want = append(want, s.Episode)
	}
	if !slices.Equal(eps, want) {
		t.Fatalf("branched %v, want %v", eps, want)
	}
	ids := map[string]bool{s1.Sandbox.ID: true, s2.Sandbox.ID: true}
	var forks []*Session
	for k := 1; k <= 4; k++ {
		s, ok := o.Session(fmt.Sprintf("s1.b%d", k))
		if !ok {
			t.Fatalf("no session s1.b%d", k)
		}
		if s.Episode != (events.Episode{Rollout: fmt.Sprintf("r1.b%d", k), Attempt: 1}) {
			t.Errorf("session %s serves %s", s.ID, s.Episode)
		}
		if ids[s.Sandbox.ID] {
			t.Errorf("session %s: sandbox %s is not its own", s.ID, s.Sandbox.ID)
		}
		ids[s.Sandbox.ID] = true
		acc, err := c.SandboxAccess(ctx, s.ID)
		if err != nil || acc.SandboxID != s.Sandbox.ID {
			t.Errorf("sandbox_access %s: %+v %v, want %s", s.ID, acc, err, s.Sandbox.ID)
		}
		forks = append(forks, s)
	}
	if _, ok := o.Session("s2.b1"); ok {
		t.Error("the record of no parent was branched")
	}

	// Files: each fork holds the checkpoint's and not later ones, and
	// what one writes the others do not see.
	for i, f := range forks {
		if got := sh(t, p, f.Sandbox.ID, "cat /parent.txt; test -e /later.txt || echo no-later"); got != "parent\nno-later\n" {
			t.Errorf("fork %s holds %q", f.Sandbox.ID, got)
		}
		sh(t, p, f.Sandbox.ID, fmt.Sprintf("echo %d > /mine-%d.txt", i, i))
	}
	for i, f := range forks {
		got := sh(t, p, f.Sandbox.ID, "ls / | grep '^mine-' || true")
		if got != fmt.Sprintf("mine-%d.txt\n", i) {
			t.Errorf("fork %s sees %q, want only its own file", f.Sandbox.ID, got)
		}
	}

	// Identities: each fork's daemon joins as sandbox.<its id>, with a
	// user minted for that id alone.
	for _, f := range forks {
		m, _ := events.NewMember(events.KindSandbox, f.Sandbox.ID)
		poll.Wait(t, 60*time.Second, "the heartbeat of "+string(m), func() bool {
			_, err := env.Bus.Daemons.Get(ctx, events.MemberKey(testRun, m))
			return err == nil
		})
		raw, err := os.ReadFile(filepath.Join(creds.Dir, f.Sandbox.ID, "nats.creds"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.ParseDecoratedJWT(raw)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil || uc.Name != f.Sandbox.ID {
			t.Errorf("fork %s: its credentials name %q (%v)", f.Sandbox.ID, uc.Name, err)
		}
	}

	// The same branches again are refused: their sessions exist.
	if _, err := o.Branch(ctx, b, recs); !errors.Is(err, ErrSessionExists) {
		t.Errorf("Branch again: %v, want ErrSessionExists", err)
	}

	// A retire of one branch stops its sandbox alone.
	if err := o.Retire(ctx, []events.Episode{b.Branches[1].Episode}); err != nil {
		t.Fatal(err)
	}
	if _, ok := o.Session("s1.b2"); ok {
		t.Error("the retired branch's session is still tracked")
	}
	if slices.Contains(p.Sandboxes(), forks[1].Sandbox.ID) {
		t.Errorf("the retired branch's sandbox %s still runs", forks[1].Sandbox.ID)
	}
	if !slices.Contains(p.Sandboxes(), forks[0].Sandbox.ID) || !slices.Contains(p.Sandboxes(), s1.Sandbox.ID) {
		t.Errorf("sandboxes %v: a retire of one branch stopped another or the parent", p.Sandboxes())
	}

	for _, id := range []string{"s1", "s2", "s1.b1", "s1.b3", "s1.b4"} {
		if err := o.CloseSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// failingForks is a real provider whose Fork fails from the n-th call on.
type failingForks struct {
	fullProvider
	calls, failFrom atomic.Int32
}

func (f *failingForks) Fork(ctx context.Context, snapshotID string, spec provider.Spec) (*provider.Sandbox, error) {
	if f.calls.Add(1) >= f.failFrom.Load() {
		return nil, errors.New("fork refused (injected)")
	}
	return f.fullProvider.Fork(ctx, snapshotID, spec)
}

// A fork that fails fails the branch and leaves no fork of it behind and
// no session; a verdict record of a parent (a graded session) is refused
// naming its session.
func TestBranchAllOrNone(t *testing.T) {
	env := jstest.Start(t)
	p := &failingForks{fullProvider: newOverlay(t)}
	p.failFrom.Store(1 << 30)
	ctx := t.Context()
	o := newOwner(t, baseConfig(t, env, p, "o1"))
	s1 := start(t, o, "s1", ep("r1", 0))
	recs := checkpoint(t, o, "c1")
	held := p.Sandboxes()

	p.failFrom.Store(3) // the third fork fails; SnapshotParallelism 1 orders them
	o.cfg.SnapshotParallelism = 1
	_, err := o.Branch(ctx, branchPhase("c1", 1, 4, ep("r1", 0)), recs)
	if err == nil || !strings.Contains(err.Error(), "injected") || !strings.Contains(err.Error(), "r1.b3") {
		t.Fatalf("Branch with a failing fork: %v, want the injected failure naming r1.b3", err)
	}
	if got := p.Sandboxes(); !slices.Equal(got, held) {
		t.Errorf("sandboxes %v, want only %v: no fork left", got, held)
	}
	for k := 1; k <= 4; k++ {
		if _, ok := o.Session(fmt.Sprintf("s1.b%d", k)); ok {
			t.Errorf("session s1.b%d installed by a failed branch", k)
		}
	}

	// A verdict kept for a graded parent has no sandbox to fork.
	verdict := []events.Record{{Key: "r1", Data: []byte(`{"session":"s1","verdict":{"reward":1}}`)}}
	if _, err := o.Branch(ctx, branchPhase("c1", 1, 1, ep("r1", 0)), verdict); !errors.Is(err, ErrBranchGraded) || !strings.Contains(err.Error(), "s1") {
		t.Errorf("Branch of a graded parent: %v, want ErrBranchGraded naming s1", err)
	}
	if err := o.EndSession(ctx, s1.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
