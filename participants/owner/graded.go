package owner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// This file keeps the verdicts of sessions that a verify ended, so that a
// checkpoint never holds a run waiting for a grade whose session is gone
// (PROTOCOL §6, Sandbox owner: "A verdict outlives its session").
//
// The members of a checkpoint prepare each on their own: an agent's
// prepare can find a run at its verify bookmark, waiting for the answer,
// while the owner, whose prepare comes a moment later, has already ended
// the graded session and sent the verdict. That checkpoint holds the run
// at verify and no session to grade it on. So the owner exports, beside
// its live sessions, the verdicts of the sessions verifies ended, and a
// restored owner answers a verify of such a session with its verdict: the
// grade that ran, not a second one.

// gradedKept is how long after its session ended a verdict is kept (and
// exported) once a checkpoint has exported it: the window in which an
// agent may still be at its verify bookmark for it (the answer in flight,
// or lost with a reconnect and asked again). A restored verdict is kept
// that long from the restore.
const gradedKept = 10 * time.Minute

// graded is the verdict of a session a verify ended.
type graded struct {
	episode  events.Episode
	verdict  json.RawMessage
	ended    time.Time
	exported bool // a checkpoint's export has carried it
}

// recordGraded keeps the verdict of session id, ended by its verify, in
// the exported mode (no other exports anything), and drops the verdicts
// kept long enough.
func (o *Owner) recordGraded(id string, ep events.Episode, verdict json.RawMessage) {
	if o.mode != ModeExported {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	maps.DeleteFunc(o.graded, func(_ string, g *graded) bool { return g.kept(now) })
	o.graded[id] = &graded{episode: ep, verdict: bytes.Clone(verdict), ended: now}
}

// kept tells whether g has been kept long enough: exported by a
// checkpoint, and ended more than gradedKept ago.
func (g *graded) kept(now time.Time) bool { return g.exported && now.Sub(g.ended) > gradedKept }

// gradedVerdict returns the kept verdict of session id when the session is
// gone: a verify of it (a restored run at its verify bookmark, or a repeat)
// is answered with it. The caller holds o.mu.
func (o *Owner) gradedVerdict(id string) (json.RawMessage, bool) {
	g, ok := o.graded[id]
	if !ok || o.sessions[id] != nil {
		return nil, false
	}
	return bytes.Clone(g.verdict), true
}

// gradedRecords returns the records of the kept verdicts in scope (every
// one when scope is empty), after dropping those kept long enough, and
// marks them exported. An episode a live session serves (in live) is
// skipped: the session is what a restore continues.
func (o *Owner) gradedRecords(scope map[events.Episode]bool, live map[events.Episode]string) ([]events.Record, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	var recs []events.Record
	for _, id := range slices.Sorted(maps.Keys(o.graded)) {
		g := o.graded[id]
		if g.kept(now) {
			delete(o.graded, id)
			continue
		}
		if len(scope) > 0 && !scope[g.episode] {
			continue
		}
		if _, ok := live[g.episode]; ok {
			continue
		}
		b, err := json.Marshal(ownerapi.RecordData{Session: id, Verdict: g.verdict})
		if err != nil {
			return nil, err
		}
		recs = append(recs, events.Record{Key: g.episode.String(), Data: b})
		g.exported = true
	}
	return recs, nil
}

// retireGraded forgets the verdicts of the given attempts and their
// earlier attempts; the caller holds o.mu.
func (o *Owner) retireGraded(eps []events.Episode) {
	for id, g := range o.graded {
		for _, ep := range eps {
			if g.episode.Rollout == ep.Rollout && g.episode.Attempt <= ep.Attempt {
				delete(o.graded, id)
				break
			}
		}
	}
}

// checkGradedRecord validates the record of a kept verdict: a session, the
// verdict (JSON), and nothing of a sandbox.
func checkGradedRecord(d ownerapi.RecordData) error {
	if d.Sandbox != (ownerapi.SandboxRef{}) || d.Workdir != "" || len(bytes.TrimSpace(d.Data)) > 0 && !bytes.Equal(bytes.TrimSpace(d.Data), []byte("null")) {
		return fmt.Errorf("data.verdict: a graded session's record names no sandbox, workdir or session data")
	}
	if !json.Valid(d.Verdict) {
		return fmt.Errorf("data.verdict: not JSON: %.40q", d.Verdict)
	}
	return nil
}
