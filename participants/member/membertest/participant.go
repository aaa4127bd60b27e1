package membertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

// Call is one call the runtime made on a Participant.
type Call struct {
	// Method is "prepare", "export", "resume", "install", "retire",
	// "forget", "release", "park" or "branch".
	Method string
	// CheckpointID is the checkpoint (or operation) the call was for, when
	// it has one.
	CheckpointID string
	// Keys are the episodes, rollouts, records or checkpoint ids involved,
	// sorted.
	Keys []string
	// Err is what the call returned.
	Err error
}

// RecordData is the data of every record the test participant exports.
type RecordData struct {
	Rollout string `json:"rollout"`
	Attempt int    `json:"attempt"`
	// Export counts the participant's exports, so that a second export of
	// the same checkpoint would show in the records' digest.
	Export int `json:"export"`
}

// Participant is a configurable participant for tests. It holds a set of
// live episodes; admission closes on the first Prepare of a checkpoint and
// reopens on Resume; readiness can be held back per episode; it exports
// one record per live episode; its install, prepare and export can be told
// to fail; its exports can be paced per record (SetWriteHook); and it
// records every call. It implements member.Participant and every optional interface, and
// the suite's Subject. It is safe for concurrent use.
type Participant struct {
	mu        sync.Mutex
	live      map[string]events.Episode
	blocked   map[string]bool
	restarts  []string
	open      bool
	prepared  map[string]bool
	exports   int
	exported  map[string]bool // checkpoints that hold external state
	calls     []Call
	notify    func()
	next      int
	prefix    string
	failInst  error
	slowInst  time.Duration
	failPrep  error
	pause     *events.PauseReport
	failExp   error
	failPark  error
	failRel   error
	failBr    error
	branchRec []events.Record
	writeHook func(ctx context.Context, checkpointID string, index int)
	member    *member.Member
}

// NewParticipant returns a participant holding eps, admission open. New
// work it adds (AddWork) gets rollout ids <prefix>-r<n>.
func NewParticipant(prefix string, eps ...events.Episode) *Participant {
	p := &Participant{
		live:     map[string]events.Episode{},
		blocked:  map[string]bool{},
		open:     true,
		prepared: map[string]bool{},
		exported: map[string]bool{},
		prefix:   prefix,
	}
	for _, ep := range eps {
		p.live[ep.String()] = ep
	}
	return p
}

var (
	_ member.Participant = (*Participant)(nil)
	_ member.Exporter    = (*Participant)(nil)
	_ member.Resumer     = (*Participant)(nil)
	_ member.Installer   = (*Participant)(nil)
	_ member.Retirer     = (*Participant)(nil)
	_ member.Forgetter   = (*Participant)(nil)
	_ member.Releaser    = (*Participant)(nil)
	_ member.Parker      = (*Participant)(nil)
	_ member.Brancher    = (*Participant)(nil)
	_ Subject            = (*Participant)(nil)
)

func (p *Participant) record(c Call) {
	slices.Sort(c.Keys)
	p.calls = append(p.calls, c)
}

func (p *Participant) changed() {
	p.mu.Lock()
	n := p.notify
	p.mu.Unlock()
	if n != nil {
		n()
	}
}

// Bind gives the participant its Member: it calls m.Notify when its
// readiness changes, and refuses retired attempts in AddWork through
// m.Admit.
func (p *Participant) Bind(m *member.Member) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.member = m
	p.notify = m.Notify
}

// Add makes eps live work.
func (p *Participant) Add(eps ...events.Episode) {
	p.mu.Lock()
	for _, ep := range eps {
		p.live[ep.String()] = ep
	}
	p.mu.Unlock()
	p.changed()
}

// AddWork admits n new episodes (attempt 0) and returns them. It fails the
// test if one is refused.
func (p *Participant) AddWork(t testing.TB, n int) []events.Episode {
	t.Helper()
	var eps []events.Episode
	p.mu.Lock()
	m := p.member
	for range n {
		p.next++
		eps = append(eps, events.Episode{Rollout: fmt.Sprintf("%s-r%d", p.prefix, p.next)})
	}
	p.mu.Unlock()
	for _, ep := range eps {
		if m != nil {
			if err := m.Admit(ep); err != nil {
				t.Fatalf("membertest: admit %s: %v", ep, err)
			}
		}
	}
	p.Add(eps...)
	return eps
}

// Finish ends the work of eps: it is no longer live.
func (p *Participant) Finish(eps ...events.Episode) {
	p.mu.Lock()
	for _, ep := range eps {
		delete(p.live, ep.String())
		delete(p.blocked, ep.String())
	}
	p.mu.Unlock()
	p.changed()
}

// Block holds readiness back on ep (a blocker while it is live).
func (p *Participant) Block(ep events.Episode) {
	p.mu.Lock()
	p.blocked[ep.String()] = true
	p.mu.Unlock()
	p.changed()
}

// Unblock lets ep be ready again and notifies the runtime.
func (p *Participant) Unblock(ep events.Episode) {
	p.mu.Lock()
	delete(p.blocked, ep.String())
	p.mu.Unlock()
	p.changed()
}

// Hold blocks ep and returns the func that unblocks it.
func (p *Participant) Hold(ep events.Episode) (release func()) {
	p.Block(ep)
	var once sync.Once
	return func() { once.Do(func() { p.Unblock(ep) }) }
}

// SetRestarts sets the capture keys the participant reports it cannot
// capture.
func (p *Participant) SetRestarts(keys ...string) {
	p.mu.Lock()
	p.restarts = slices.Clone(keys)
	p.mu.Unlock()
	p.changed()
}

// FailInstall makes every Install fail with err (nil: succeed).
func (p *Participant) FailInstall(err error) { p.mu.Lock(); p.failInst = err; p.mu.Unlock() }

// SlowInstall makes every Install take d first, as forking many
// snapshots does, or until its context ends.
func (p *Participant) SlowInstall(d time.Duration) { p.mu.Lock(); p.slowInst = d; p.mu.Unlock() }

// FailPrepare makes every Prepare fail with err (nil: succeed).
func (p *Participant) FailPrepare(err error) { p.mu.Lock(); p.failPrep = err; p.mu.Unlock() }

// ReportPause makes every Prepare report rep, as a sandbox daemon reports
// how it paused its launches (nil: no pause, a sandbox with no launch).
func (p *Participant) ReportPause(rep *events.PauseReport) { p.mu.Lock(); p.pause = rep; p.mu.Unlock() }

// FailExport makes every Export fail with err (nil: succeed).
func (p *Participant) FailExport(err error) { p.mu.Lock(); p.failExp = err; p.mu.Unlock() }

// FailPark makes every Park fail with err (nil: succeed).
func (p *Participant) FailPark(err error) { p.mu.Lock(); p.failPark = err; p.mu.Unlock() }

// FailRelease makes every Release fail with err, deleting nothing (nil:
// succeed).
func (p *Participant) FailRelease(err error) { p.mu.Lock(); p.failRel = err; p.mu.Unlock() }

// SetWriteHook makes every export call hook before it yields each record
// (nil: no hook), so that a test can pace a commit's write: the runtime
// writes each record as the export yields it. The hook may block until
// ctx is done; the export then stops.
func (p *Participant) SetWriteHook(hook func(ctx context.Context, checkpointID string, index int)) {
	p.mu.Lock()
	p.writeHook = hook
	p.mu.Unlock()
}

// PaceWrites is SetWriteHook without the checkpoint id, for the suite.
func (p *Participant) PaceWrites(before func(ctx context.Context, index int)) {
	if before == nil {
		p.SetWriteHook(nil)
		return
	}
	p.SetWriteHook(func(ctx context.Context, _ string, i int) { before(ctx, i) })
}

// Live returns the capture keys of the live episodes, sorted.
func (p *Participant) Live() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.live))
}

// AdmissionOpen reports whether admission is open.
func (p *Participant) AdmissionOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Calls returns every call so far, in order.
func (p *Participant) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Count returns how many calls of method were made (for prepare: how many
// checkpoints it closed admission for).
func (p *Participant) Count(method string) int {
	n := 0
	for _, c := range p.Calls() {
		if c.Method == method {
			n++
		}
	}
	return n
}

// Prepare closes admission on the first call for a checkpoint and reports
// the blocked live episodes as blockers.
func (p *Participant) Prepare(_ context.Context, cp member.Checkpoint) (member.Report, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failPrep != nil {
		return member.Report{}, p.failPrep
	}
	if !p.prepared[cp.ID] {
		p.prepared[cp.ID] = true
		p.open = false
		p.record(Call{Method: "prepare", CheckpointID: cp.ID})
	}
	var blockers []string
	for k := range p.live {
		if p.blocked[k] {
			blockers = append(blockers, k)
		}
	}
	slices.Sort(blockers)
	return member.Report{
		Ready:    len(blockers) == 0,
		Blockers: blockers,
		Restarts: slices.Clone(p.restarts),
		Counts:   map[string]int{"live": len(p.live)},
		Pause:    p.pause,
	}, nil
}

// Export yields one record per live episode in the scope (every live
// episode when the scope is empty), sorted by key: it takes them under its
// lock, then yields them one by one, calling the write hook (if any)
// before each and stopping once ctx is done.
func (p *Participant) Export(ctx context.Context, c events.Commit) iter.Seq2[events.Record, error] {
	recs, err := p.export(c)
	p.mu.Lock()
	hook := p.writeHook
	p.mu.Unlock()
	return func(yield func(events.Record, error) bool) {
		if err != nil {
			yield(events.Record{}, err)
			return
		}
		for i, r := range recs {
			if hook != nil {
				hook(ctx, c.CheckpointID, i)
			}
			if err := ctx.Err(); err != nil {
				yield(events.Record{}, err)
				return
			}
			if !yield(r, nil) {
				return
			}
		}
	}
}

func (p *Participant) export(c events.Commit) ([]events.Record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failExp != nil {
		p.record(Call{Method: "export", CheckpointID: c.CheckpointID, Err: p.failExp})
		return nil, p.failExp
	}
	p.exports++
	scope := map[string]bool{}
	for _, ep := range c.Scope {
		scope[ep.String()] = true
	}
	var recs []events.Record
	var keys []string
	for _, k := range slices.Sorted(maps.Keys(p.live)) {
		if len(scope) > 0 && !scope[k] {
			continue
		}
		ep := p.live[k]
		b, _ := json.Marshal(RecordData{Rollout: ep.Rollout, Attempt: ep.Attempt, Export: p.exports})
		recs = append(recs, events.Record{Key: k, Data: b})
		keys = append(keys, k)
	}
	p.exported[c.CheckpointID] = true
	p.record(Call{Method: "export", CheckpointID: c.CheckpointID, Keys: keys})
	return recs, nil
}

// Resume reopens admission.
func (p *Participant) Resume(_ context.Context, checkpointID string) error {
	p.mu.Lock()
	p.open = true
	p.record(Call{Method: "resume", CheckpointID: checkpointID})
	p.mu.Unlock()
	p.changed()
	return nil
}

// Install installs every record's episode as its next attempt, all or
// none, and closes admission until the resume.
func (p *Participant) Install(ctx context.Context, r events.Restore, records []events.Record) ([]events.Episode, error) {
	p.mu.Lock()
	slow := p.slowInst
	p.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-time.After(slow):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(records))
	for _, rec := range records {
		keys = append(keys, rec.Key)
	}
	fail := func(err error) ([]events.Episode, error) {
		p.record(Call{Method: "install", CheckpointID: r.CheckpointID, Keys: keys, Err: err})
		return nil, err
	}
	if p.failInst != nil {
		return fail(p.failInst)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	var installed []events.Episode
	for _, rec := range records {
		var d RecordData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			return fail(fmt.Errorf("record %s: %w", rec.Key, err))
		}
		ep, err := events.ParseEpisode(rec.Key)
		if err != nil || ep != (events.Episode{Rollout: d.Rollout, Attempt: d.Attempt}) {
			return fail(fmt.Errorf("record %s does not match its data %+v", rec.Key, d))
		}
		installed = append(installed, ep)
	}
	for _, ep := range installed {
		next := ep.Next()
		p.live[next.String()] = next
	}
	p.open = false
	p.record(Call{Method: "install", CheckpointID: r.CheckpointID, Keys: keys})
	return installed, nil
}

// FailBranch makes Branch fail with err (nil: succeed).
func (p *Participant) FailBranch(err error) { p.mu.Lock(); p.failBr = err; p.mu.Unlock() }

// BranchRecords returns the records the last Branch call was given.
func (p *Participant) BranchRecords() []events.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.branchRec)
}

// Branch makes each branch whose parent a record holds live work, as its
// branch episode, all or none, or fails as told.
func (p *Participant) Branch(ctx context.Context, b events.Branch, records []events.Record) ([]events.Episode, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.branchRec = slices.Clone(records)
	keys := make([]string, 0, len(records))
	for _, rec := range records {
		keys = append(keys, rec.Key)
	}
	fail := func(err error) ([]events.Episode, error) {
		p.record(Call{Method: "branch", CheckpointID: b.CheckpointID, Keys: keys, Err: err})
		return nil, err
	}
	if p.failBr != nil {
		return fail(p.failBr)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	held := map[events.Episode]bool{}
	for _, rec := range records {
		ep, err := events.ParseEpisode(rec.Key)
		if err != nil {
			return fail(fmt.Errorf("record %s: %w", rec.Key, err))
		}
		held[ep] = true
	}
	var branched []events.Episode
	for _, s := range b.Branches {
		if held[s.Parent] {
			branched = append(branched, s.Episode)
		}
	}
	for _, ep := range branched {
		p.live[ep.String()] = ep
	}
	p.record(Call{Method: "branch", CheckpointID: b.CheckpointID, Keys: keys})
	return branched, nil
}

// Retire ends the live episodes of the retired attempts and earlier ones.
func (p *Participant) Retire(_ context.Context, eps []events.Episode) error {
	p.mu.Lock()
	var keys []string
	for _, ep := range eps {
		keys = append(keys, ep.String())
		for k, live := range p.live {
			if live.Rollout == ep.Rollout && live.Attempt <= ep.Attempt {
				delete(p.live, k)
				delete(p.blocked, k)
			}
		}
	}
	p.record(Call{Method: "retire", Keys: keys})
	p.mu.Unlock()
	p.changed()
	return nil
}

// Forget records the call.
func (p *Participant) Forget(_ context.Context, rollouts []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record(Call{Method: "forget", Keys: slices.Clone(rollouts)})
	return nil
}

// Release deletes the external state of every exported checkpoint not in
// keep and returns those checkpoint ids, or fails as told.
func (p *Participant) Release(_ context.Context, keep []string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failRel != nil {
		p.record(Call{Method: "release", Err: p.failRel})
		return nil, p.failRel
	}
	var deleted []string
	for id := range p.exported {
		if !slices.Contains(keep, id) {
			deleted = append(deleted, id)
			delete(p.exported, id)
		}
	}
	slices.Sort(deleted)
	p.record(Call{Method: "release", Keys: deleted})
	return deleted, nil
}

// Park records the records' keys, or fails as told.
func (p *Participant) Park(_ context.Context, records []events.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(records))
	for _, r := range records {
		keys = append(keys, r.Key)
	}
	p.record(Call{Method: "park", Keys: keys, Err: p.failPark})
	return p.failPark
}

// ErrInjected is a failure tests inject.
var ErrInjected = errors.New("membertest: injected failure")

// Drain takes every record an export yields, as the runtime does, or the
// error it yields first.
func Drain(records iter.Seq2[events.Record, error]) ([]events.Record, error) {
	var out []events.Record
	for r, err := range records {
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
