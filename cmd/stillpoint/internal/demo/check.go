package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/e2e/tasks"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// invariant is one PROTOCOL §7 check of the demo.
type invariant struct {
	n      int
	name   string
	ok     bool
	detail string
}

// check checks the PROTOCOL §7 invariants on the run that just ended.
func (c *demoChecks) check(ctx context.Context, d *demo, js natsjs.JetStream, bus *jetstream.Bus, ms *modelserver.Server, sum collect.Summary, leftover []string) []invariant {
	var out []invariant
	add := func(n int, name string, ok bool, format string, args ...any) {
		out = append(out, invariant{n: n, name: name, ok: ok, detail: fmt.Sprintf(format, args...)})
	}
	committed := sum.Committed()

	// 1. Every committed checkpoint's member manifests verify; one restored.
	c.mu.Lock()
	bad, nman := c.bad, c.manifests
	c.mu.Unlock()
	add(1, "committed checkpoints restore and verify", len(bad) == 0 && len(sum.Restores) > 0,
		"%d member manifests of %d checkpoints verified (size, sha256, count) at commit; %v restored into fresh processes%s",
		nman, len(committed), sum.Restores, list(bad))

	// 2. A checkpoint resumed without a manifest never gets one.
	var failed, wrong []string
	for _, ck := range sum.Checkpoints {
		if ck.Status == bridgeapi.StatusCommitted || ck.ID == "" {
			continue
		}
		failed = append(failed, ck.ID)
		if e, err := bus.Manifests.Get(ctx, events.ManifestKey(d.run, ck.ID)); err == nil {
			var m events.CheckpointManifest
			if json.Unmarshal(e.Value(), &m) != nil || !m.Aborted {
				wrong = append(wrong, ck.ID)
			}
		}
	}
	add(2, "no manifest after a resume", len(wrong) == 0, "%d checkpoints failed %v, none has a manifest other than its abort marker%s", len(failed), failed, list(wrong))

	// 3. Exactly one result per rollout, each graded.
	lines, dups, missing, ungraded := readResults(filepath.Join(d.dir, "results.jsonl"), d.ids, d.graded)
	add(3, "exactly one result per rollout", len(dups) == 0 && len(missing) == 0 && len(ungraded) == 0,
		"%d lines for %d rollouts; duplicates %v, missing %v, graded otherwise than their tasks expect %v", lines, len(d.ids), dups, missing, ungraded)

	// 4. No model call repeated, no user turn injected.
	repeats := ms.Repeats()
	injected := 0
	for _, e := range ms.Ledger() {
		if e.UserTurns != 1 {
			injected++
		}
	}
	var restoredFrom time.Time
	for _, ck := range sum.Checkpoints {
		if len(sum.Restores) > 0 && ck.ID == sum.Restores[0] {
			restoredFrom = ck.Began
		}
	}
	early := 0
	reissued := ms.Reissued()
	for _, r := range reissued {
		if !r.Saved.IsZero() && (restoredFrom.IsZero() || r.Saved.Before(restoredFrom)) {
			early++
		}
	}
	add(4, "no model call repeated, no turn injected", len(repeats) == 0 && injected == 0 && early == 0,
		"%d calls; %d sent again after their reply was saved, %d with an injected user turn; %d re-issued by a restored attempt, each a call whose reply the crash lost (saved after the restored checkpoint began, or never; %d saved before)",
		len(ms.Ledger()), len(repeats), injected, len(reissued), early)

	// 5. Paused launches were still: every pause a sandbox acked was confirmed.
	paused, unconfirmed := 0, []string{}
	for _, ck := range committed {
		entries, err := bridge.ReadTimeline(ctx, js, d.run, ck.ID)
		if err != nil {
			unconfirmed = append(unconfirmed, ck.ID+": "+err.Error())
			continue
		}
		for _, e := range entries {
			a, ok := e.Data.(events.PrepareAck)
			if !ok || a.Member.Kind() != events.KindSandbox || a.Pause == nil {
				continue
			}
			paused++
			// A hold (a provider whose snapshots keep processes) is still
			// only when it also froze the launch (restore_sandbox_clock).
			still := a.Pause.Mode == "freeze" || a.Pause.Mode == "stop" || (a.Pause.Mode == "hold" && a.Pause.Frozen)
			if a.Pause.Fallback != "" || !still {
				unconfirmed = append(unconfirmed, fmt.Sprintf("%s/%s: %s %s", ck.ID, a.Member, a.Pause.Mode, a.Pause.Fallback))
			}
		}
	}
	add(5, "paused launches stood still", len(unconfirmed) == 0,
		"%d sandbox pauses at prepare, each confirmed by the kernel (frozen cgroup, a hold that froze, or every thread stopped) before the snapshot%s", paused, list(unconfirmed))

	// 6 and 7. Nothing left: sandboxes, snapshots, records.
	snaps, serr := countSnapshots(ctx, bus.Snapshots, d.run)
	records, rerr := countObjects(ctx, bus.Records, d.run+"/")
	var cerrs []string
	for _, e := range []error{serr, rerr} {
		if e != nil {
			cerrs = append(cerrs, e.Error())
		}
	}
	add(6, "retired attempts left nothing", len(leftover) == 0, "%d attempts retired; %d sandboxes left after the owner stopped%s", sum.Retired, len(leftover), list(leftover))
	add(7, "the final release left nothing", snaps == 0 && records == 0 && len(leftover) == 0 && len(cerrs) == 0,
		"%d snapshots indexed, %d record objects, %d sandboxes of run %s left%s", snaps, records, len(leftover), d.run, list(cerrs))
	return out
}

func list(s []string) string {
	if len(s) == 0 {
		return ""
	}
	if len(s) > 5 {
		s = append(s[:5:5], fmt.Sprintf("… %d more", len(s)-5))
	}
	return ": " + strings.Join(s, "; ")
}

// graded tells whether a result has the reward its task expects: 1 from
// the scripted set's check; from a repository task's own tests, 1 after
// the scripted fix and 0 for the control task, which fixes nothing.
func (d *demo) graded(r collect.Result) bool {
	if !r.OK || r.Result == nil {
		return false
	}
	if d.f.harness == harnessOpenCode {
		var v commandkind.Verdict
		want := 1.0
		if r.RolloutID == tasks.ControlID {
			want = 0
		}
		return json.Unmarshal(r.Result.Verdict, &v) == nil && v.Reward == want && v.Output != ""
	}
	var v scripted.Verdict
	return json.Unmarshal(r.Result.Verdict, &v) == nil && v.Reward == 1
}

// readResults reads the output: how many lines, the rollouts with more
// than one, those of ids without one, and those graded wrongly.
func readResults(path string, ids []string, graded func(collect.Result) bool) (lines int, dups, missing, ungraded []string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, []string{err.Error()}, nil
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r collect.Result
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		lines++
		seen[r.RolloutID]++
		if seen[r.RolloutID] == 2 {
			dups = append(dups, r.RolloutID)
		}
		if !graded(r) {
			ungraded = append(ungraded, r.RolloutID)
		}
	}
	for _, id := range ids {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	return lines, dups, missing, ungraded
}

// countSnapshots counts the snapshot index entries of run.
func countSnapshots(ctx context.Context, kv natsjs.KeyValue, run string) (int, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return 0, fmt.Errorf("list the snapshot index: %w", err)
	}
	n := 0
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("read the snapshot index: %w", err)
		}
		var entry struct {
			Run string `json:"run"`
		}
		if json.Unmarshal(e.Value(), &entry) == nil && entry.Run == run {
			n++
		}
	}
	return n, nil
}

// countObjects counts the objects whose name starts with prefix.
func countObjects(ctx context.Context, store natsjs.ObjectStore, prefix string) (int, error) {
	infos, err := store.List(ctx)
	if errors.Is(err, natsjs.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list the records: %w", err)
	}
	n := 0
	for _, i := range infos {
		if strings.HasPrefix(i.Name, prefix) && !i.Deleted {
			n++
		}
	}
	return n, nil
}
