package invariant

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// Ledger is what the checks read of the model server: its calls, those
// an episode sent again after their reply was saved, and those a later
// episode sent again. *modelserver.Server is one.
type Ledger interface {
	Ledger() []modelserver.Entry
	RepeatList() []modelserver.Repeat
	Reissued() []modelserver.Reissue
}

// Run is what Check reads of a run that ended.
type Run struct {
	// Run is the run's id. Required.
	Run string
	// JS and Bus are the bus the run used. Required.
	JS  natsjs.JetStream
	Bus *jetstream.Bus
	// Summary is the collector's.
	Summary collect.Summary
	// Results is the collector's output file; Rollouts the ids it was
	// given; Graded tells whether a result has its task's reward (nil:
	// every ok result with a verdict is).
	Results  string
	Rollouts []string
	Graded   func(collect.Result) bool
	// Model is the model server's ledger (nil: invariant 4 is not
	// checked and says so).
	Model Ledger
	// UserTurns is how many user turns each model call carries (0: one);
	// a call with another count had a turn injected. Codex's carry its
	// environment message beside the prompt.
	UserTurns int
	// Manifests holds what was verified at each commit (nil: nothing
	// was, and invariant 1 fails when a checkpoint committed).
	Manifests *Manifests
	// Sandboxes are the sandboxes left once the owner stopped (the
	// owner's reap), Processes the processes of the run still alive;
	// both must be empty.
	Sandboxes []string
	Processes []string
	// NeedRestore makes invariant 1 fail when nothing was restored (the
	// demo restores once by design; a chaos round only when a fault
	// called for it).
	NeedRestore bool
	// NoTrajectories says the owner ran no model relay (--direct-model):
	// no rollout has a trajectory, and invariant 8 is not checked.
	NoTrajectories bool
	// Settle is how long invariant 7 reads again the snapshots and records
	// it finds left (0: it reads once): on a cluster whose node came back,
	// a listing may be served by a replica still catching up.
	Settle time.Duration
}

// Result is one invariant checked.
type Result struct {
	// N is its number in PROTOCOL §7; Name says it in a few words.
	N    int
	Name string
	OK   bool
	// Detail says what was counted, and what failed.
	Detail string
}

// Check checks every invariant of PROTOCOL §7 on r and returns them in
// order. A check that cannot read what it needs fails, saying why.
func Check(ctx context.Context, r Run) []Result {
	var out []Result
	add := func(n int, name string, ok bool, format string, args ...any) {
		out = append(out, Result{N: n, Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	tl, terr := readTimeline(ctx, r.JS, r.Run)
	committed, failed := outcomes(tl, r.Summary)

	// 1. Every committed checkpoint's member manifests verify; one restored.
	var bad, unverified []string
	nman := 0
	if r.Manifests != nil {
		// A checkpoint the collector did not see commit (its bridge died
		// before it answered) is verified now, unless a release deleted
		// it meanwhile: then it is counted as not verified.
		for _, id := range committed {
			if !r.Manifests.seen(id) {
				if _, err := r.Bus.Manifests.Get(ctx, events.ManifestKey(r.Run, id)); err == nil {
					r.Manifests.OnCommit(ctx, r.Bus, r.Run, id)
				} else {
					unverified = append(unverified, id)
				}
			}
		}
		bad, nman = r.Manifests.result()
		unverified = append(unverified, r.Manifests.released()...)
		// A manifest read after a release deleted it (a verification
		// that waited out a server's restart while the run went on) is
		// not verified, and no violation; one missing with no release
		// after its commit is.
		for _, id := range r.Manifests.missing() {
			if releasedAfter(tl, id) {
				unverified = append(unverified, id)
			} else {
				bad = append(bad, id+": manifest: not found, and no release after its commit")
			}
		}
	} else if len(committed) > 0 {
		bad = append(bad, "no manifest verified at commit")
	}
	if terr != nil {
		bad = append(bad, "timeline: "+terr.Error())
	}
	add(1, "committed checkpoints restore and verify", len(bad) == 0 && (!r.NeedRestore || len(r.Summary.Restores) > 0),
		"%d member manifests of %d checkpoints verified (size, sha256, count) at commit; %d released before the collector heard of them (%v); %v restored into fresh processes%s",
		nman, len(committed), len(unverified), unverified, r.Summary.Restores, list(bad))

	// 2. A checkpoint resumed without a manifest never gets one.
	var wrong []string
	for _, id := range failed {
		e, err := r.Bus.Manifests.Get(ctx, events.ManifestKey(r.Run, id))
		if err != nil {
			continue // no manifest, no marker: a failure reported before its marker was kept
		}
		var m events.CheckpointManifest
		if json.Unmarshal(e.Value(), &m) != nil || !m.Aborted {
			wrong = append(wrong, id)
		}
	}
	add(2, "no manifest after a resume", len(wrong) == 0, "%d checkpoints failed %v, none has a manifest other than its abort marker%s", len(failed), failed, list(wrong))

	// 3. Exactly one result per rollout, each graded.
	// The branches the run made count as rollouts; a branch is graded
	// when it has a result (its reward may differ from its parent's).
	graded := r.Graded
	if graded == nil {
		graded = func(res collect.Result) bool { return res.OK && res.Result != nil }
	}
	rollouts := slices.Clone(r.Rollouts)
	for _, id := range sortedKeys(branchRollouts(tl)) {
		if !slices.Contains(rollouts, id) {
			rollouts = append(rollouts, id)
		}
	}
	gradedAll := func(res collect.Result) bool {
		if res.BranchOf != "" {
			return res.OK && res.Result != nil
		}
		return graded(res)
	}
	lines, dups, missing, ungraded := ReadResults(r.Results, rollouts, gradedAll)
	add(3, "exactly one result per rollout", len(dups) == 0 && len(missing) == 0 && len(ungraded) == 0,
		"%d lines for %d rollouts (%d branches); duplicates %v, missing %v, graded otherwise than their tasks expect %v", lines, len(rollouts), len(rollouts)-len(r.Rollouts), dups, missing, ungraded)

	// 4. No model call repeated, no user turn injected.
	if r.Model == nil {
		add(4, "no model call repeated, no turn injected", false, "no model ledger to read")
	} else {
		out = append(out, model(r.Model, tl, r.UserTurns))
	}

	// 5. Paused launches were still: every pause a sandbox acked was confirmed.
	isCommitted := map[string]bool{}
	for _, id := range committed {
		isCommitted[id] = true
	}
	// A daemon's prepare ack travels on core NATS: the bridge's record of a
	// prepare counts its daemons' pauses by kind (and holds the acks of
	// those that did not stand still whole, which the timeline reads as
	// acks: named below, not counted again); an ack an earlier build
	// stored is read as it is.
	paused, unconfirmed := 0, []string{}
	recorded := map[uint64]bool{}    // prepares whose record was read
	stored := map[uint64]bool{}      // prepares with a daemon's ack stored (an earlier build)
	addressed := map[uint64]string{} // a committed checkpoint's prepares that addressed sandbox daemons
	for _, e := range tl {
		switch d := e.Data.(type) {
		case events.Prepare:
			if isCommitted[d.CheckpointID] && d.Sandboxes != nil && d.Sandboxes.Count > 0 {
				addressed[d.Seq] = d.CheckpointID
			}
		case events.PrepareAcked:
			if !isCommitted[d.CheckpointID] || recorded[d.Seq] {
				continue
			}
			recorded[d.Seq] = true
			for _, p := range d.Pauses {
				paused += p.Count
				rep := events.PauseReport{Mode: p.Mode, Frozen: p.Frozen}
				if p.Fallback {
					rep.Fallback = "fallback"
				}
				if !p.Still || !rep.Still() {
					unconfirmed = append(unconfirmed, fmt.Sprintf("%s: %d %s pauses (frozen %v, fallback %v)", d.CheckpointID, p.Count, p.Mode, p.Frozen, p.Fallback))
				}
			}
			// The record keeps the acks that did not stand still whole: name
			// each one's daemon and why.
			for _, h := range d.Acks {
				if h.Ack.Pause != nil && !h.Ack.Pause.Still() {
					unconfirmed = append(unconfirmed, fmt.Sprintf("%s/%s: %s %s", d.CheckpointID, h.Ack.Member, h.Ack.Pause.Mode, h.Ack.Pause.Fallback))
				}
			}
		case events.PrepareAck:
			if !isCommitted[e.CheckpointID] || d.Member.Kind() != events.KindSandbox {
				continue
			}
			// Stored by an earlier build, counted here; on a live subject,
			// held whole by a record, which counted it and lists its kind.
			if strings.HasPrefix(e.Subject, events.LivePrefix+".") {
				continue
			}
			stored[d.Seq] = true
			if d.Pause == nil {
				continue
			}
			paused++
			// A hold (a provider whose snapshots keep processes) is still
			// only when it also froze the launch (restore_sandbox_clock).
			if !d.Pause.Still() {
				unconfirmed = append(unconfirmed, fmt.Sprintf("%s/%s: %s %s", e.CheckpointID, d.Member, d.Pause.Mode, d.Pause.Fallback))
			}
		}
	}
	// A record missing says nothing of its daemons' pauses: not taken for
	// still.
	for seq, id := range addressed {
		if !recorded[seq] && !stored[seq] {
			unconfirmed = append(unconfirmed, fmt.Sprintf("%s: no record of the sandbox daemons' acks of prepare %d", id, seq))
		}
	}
	slices.Sort(unconfirmed)
	if terr != nil {
		unconfirmed = append(unconfirmed, "timeline: "+terr.Error())
	}
	add(5, "paused launches stood still", len(unconfirmed) == 0,
		"%d sandbox pauses at prepare, each confirmed by the kernel (frozen cgroup, a hold that froze, or every thread stopped) before the snapshot%s", paused, list(unconfirmed))

	// 6 and 7. Nothing left: sandboxes, processes, snapshots, records.
	snaps, records, serr, rerr := leftovers(ctx, r)
	var cerrs []string
	for _, e := range []error{serr, rerr} {
		if e != nil {
			cerrs = append(cerrs, e.Error())
		}
	}
	left := append(slices.Clone(r.Sandboxes), r.Processes...)
	add(6, "retired attempts left nothing", len(left) == 0, "%d attempts retired; %d sandboxes and %d processes left after the owner stopped%s",
		r.Summary.Retired, len(r.Sandboxes), len(r.Processes), list(left))
	add(7, "the final release left nothing", snaps == 0 && len(records) == 0 && len(left) == 0 && len(cerrs) == 0,
		"%d snapshots indexed, %d record objects, %d sandboxes of run %s left%s", snaps, len(records), len(r.Sandboxes), r.Run, list(append(records, cerrs...)))

	// 8. Every result's trajectory is its surviving chain.
	out = append(out, Trajectories(ctx, r))

	// 9. No committed checkpoint loses a rollout the one before held.
	out = append(out, progress(tl, committed, r.Manifests, r.Results))

	// 10. Branches continue their parent's calls, each alone.
	out = append(out, Branches(ctx, r, tl))
	return out
}

// readTimeline reads the run's timeline, again while the read fails
// (readAgain): a cluster that just lost a node, or a server started again,
// can fail a read.
func readTimeline(ctx context.Context, js natsjs.JetStream, run string) ([]timeline.Entry, error) {
	var tl []timeline.Entry
	err := readAgain(ctx, func(context.Context) error {
		var err error
		tl, err = timeline.Read(ctx, js, run, "")
		return err
	}, func(error) bool { return false })
	return tl, err
}

// releasedAfter tells whether the timeline has a completed release after
// checkpoint id's commit outcome that deleted it.
func releasedAfter(tl []timeline.Entry, id string) bool {
	committed := false
	for _, e := range tl {
		switch {
		case e.Type == events.TypeCheckpointCommitted && e.CheckpointID == id:
			committed = true
		case committed && e.Type == events.TypeReleaseCompleted:
			if rc, ok := e.Data.(events.ReleaseCompleted); ok && slices.Contains(rc.Deleted, id) {
				return true
			}
		}
	}
	return false
}

// outcomes returns the checkpoints the stream says committed and failed,
// in the order of their outcomes, and adds the failures the collector saw
// that have no outcome on the stream (a bridge that died before it
// reported, say).
func outcomes(tl []timeline.Entry, sum collect.Summary) (committed, failed []string) {
	seen := map[string]bool{}
	for _, e := range tl {
		switch e.Type {
		case events.TypeCheckpointCommitted:
			committed = append(committed, e.CheckpointID)
			seen[e.CheckpointID] = true
		case events.TypeCheckpointFailed:
			failed = append(failed, e.CheckpointID)
			seen[e.CheckpointID] = true
		}
	}
	for _, ck := range sum.Checkpoints {
		if ck.ID != "" && !seen[ck.ID] && ck.Status != "committed" {
			failed = append(failed, ck.ID)
		}
	}
	return committed, failed
}

// model checks invariant 4 on the model server's ledger, each call with
// users user turns (0: one). A call sent again is legitimate only when
// the restored world had lost its reply: re-issued by a restored attempt
// (the next attempt of its rollout), or re-sent in
// place by a process a restore continued (a snapshot that kept the
// harness, whose relay re-sends the calls the snapshot cut: the process
// keeps its old episode), its reply delivered before a restore of its
// rollout began and the call sent again after, its reply saved only after
// the restored checkpoint began (or never). Anything else sent again is a
// repeat.
func model(l Ledger, tl []timeline.Entry, users int) Result {
	began := map[string]time.Time{} // checkpoint or operation → its first event
	from := map[string]string{}     // restored episode → its checkpoint
	type restore struct {
		began  time.Time
		source string
	}
	restores := map[string][]restore{} // rollout → the restores that restored it
	// A carried episode is restored from the checkpoint that holds it
	// whole, older than the restore's source (PROTOCOL §5): its calls are
	// lost since that one began. By restore id, episode → that checkpoint.
	carried := map[string]map[events.Episode]string{}
	for _, e := range tl {
		if _, ok := began[e.CheckpointID]; !ok {
			began[e.CheckpointID] = e.Time
		}
		if r, ok := e.Data.(events.Restore); ok {
			carried[e.CheckpointID] = r.CarriedFrom()
		}
		if rc, ok := e.Data.(events.RestoreCompleted); ok {
			for _, ep := range rc.Restored {
				src := rc.Source
				p, err := events.ParseEpisode(ep)
				if err == nil && p.Attempt > 0 {
					if c, ok := carried[e.CheckpointID][events.Episode{Rollout: p.Rollout, Attempt: p.Attempt - 1}]; ok {
						src = c
					}
				}
				from[ep] = src
				if err == nil {
					restores[p.Rollout] = append(restores[p.Rollout], restore{began[e.CheckpointID], src})
				}
			}
		}
	}
	ledger := l.Ledger()
	injected := 0
	for _, e := range ledger {
		if e.UserTurns != max(users, 1) {
			injected++
		}
	}
	restored, over, early, inPlace, repeats := 0, 0, 0, 0, 0
	lostBy := func(saved time.Time, src string) {
		restored++
		if !saved.IsZero() && saved.Before(began[src]) {
			early++
		}
	}
	for _, r := range l.RepeatList() {
		src := ""
		if p, err := events.ParseEpisode(r.Episode); err == nil {
			for _, rs := range restores[p.Rollout] {
				// The reply went to the world before the restore, and the
				// call came again from the restored one.
				if r.Delivered.Before(rs.began) && rs.began.Before(r.Again) {
					src = rs.source // the last such restore
				}
			}
		}
		if src == "" {
			repeats++
			continue
		}
		inPlace++
		lostBy(r.Saved, src)
	}
	// restoredFrom tells whether the restored episode later continues
	// earlier: earlier is the attempt the restore held, or one a restore
	// of that held, and so on. A call of an attempt that was retired and
	// started over, re-issued by a restored later attempt that had not
	// reached it, is work done over, not a call the restore lost.
	restoredFrom := func(later, earlier string) bool {
		for k := later; ; {
			if _, ok := from[k]; !ok {
				return false
			}
			p, err := events.ParseEpisode(k)
			if err != nil || p.Attempt == 0 {
				return false
			}
			k = events.Episode{Rollout: p.Rollout, Attempt: p.Attempt - 1}.String()
			if k == earlier {
				return true
			}
		}
	}
	for _, r := range l.Reissued() {
		src, ok := from[r.Later]
		if !ok || !restoredFrom(r.Later, r.Earlier) {
			over++
			continue
		}
		lostBy(r.Saved, src)
	}
	return Result{N: 4, Name: "no model call repeated, no turn injected", OK: repeats == 0 && injected == 0 && early == 0,
		Detail: fmt.Sprintf("%d calls; %d sent again after their reply was saved, %d with an injected user turn; %d re-issued by a restored attempt or re-sent in place by a restored process (%d), each a call whose reply the crash lost (saved after the restored checkpoint began, or never; %d saved before); %d by attempts that started over from their input",
			len(ledger), repeats, injected, restored, inPlace, early, over)}
}

// Failed returns the names of the invariants that failed.
func Failed(rs []Result) []string {
	var out []string
	for _, r := range rs {
		if !r.OK {
			out = append(out, r.Name)
		}
	}
	return out
}

// Write prints the results, one line each: ok or FAILED, the number, the
// name and the detail.
func Write(w io.Writer, rs []Result) {
	for _, r := range rs {
		mark := "ok"
		if !r.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "  %-6s %d. %s: %s\n", mark, r.N, r.Name, r.Detail)
	}
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

// leftovers counts the run's snapshots indexed and records objects, and
// while it finds some reads again, for up to r.Settle: a listing may be
// served by a replica that is still catching up after its node of a
// cluster came back (its consumer placed there), and show objects the
// release deleted a moment ago. What is really left stays and is counted.
func leftovers(ctx context.Context, r Run) (snaps int, records []string, serr, rerr error) {
	deadline := time.Now().Add(r.Settle)
	for {
		snaps, serr = countSnapshots(ctx, r.Bus.Snapshots, r.Run)
		records, rerr = recordObjects(ctx, r.JS, r.Bus.Records, r.Run)
		if snaps == 0 && len(records) == 0 || serr != nil || rerr != nil || time.Now().After(deadline) {
			return snaps, records, serr, rerr
		}
		select {
		case <-ctx.Done():
			return snaps, records, serr, rerr
		case <-time.After(500 * time.Millisecond):
		}
	}
}
