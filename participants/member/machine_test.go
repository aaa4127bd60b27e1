package member_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

const (
	self  events.Member = "agent.a"
	grace               = time.Minute
)

var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

// mt drives a Machine with a fake clock and a bridge's sequence numbers.
type mt struct {
	t     *testing.T
	m     *member.Machine
	now   time.Time
	seq   uint64
	epoch uint64
	op    uint64 // the op of the last effect that started a handler
	man   events.MemberManifest
}

func newMT(t *testing.T) *mt {
	return &mt{t: t, m: member.NewMachine("run1", self, grace), now: t0}
}

func (x *mt) hdr(id string) events.PhaseHeader {
	x.seq++
	return events.PhaseHeader{Run: "run1", CheckpointID: id, Seq: x.seq, Epoch: x.epoch, Deadline: x.now.Add(10 * time.Second), Members: []events.Member{self}}
}

func (x *mt) step(in member.Input) []member.Effect {
	x.t.Helper()
	effs, err := x.m.Step(x.now, in)
	if err != nil && !x.m.Superseded() {
		x.t.Fatalf("Step(%T): %v", in, err)
	}
	for _, e := range effs {
		switch e := e.(type) {
		case member.WaitReady:
			x.op = e.Op
		case member.WriteCommit:
			x.op = e.Op
		case member.InstallRestore:
			x.op = e.Op
		case member.CallParticipant:
			x.op = e.Op
		}
	}
	return effs
}

func (x *mt) phase(d events.PhaseEvent) []member.Effect {
	return x.step(member.PhaseReceived{Data: d})
}

func (x *mt) prepare(id string) []member.Effect {
	return x.phase(events.Prepare{PhaseHeader: x.hdr(id)})
}

func (x *mt) ready(r member.Report) []member.Effect {
	return x.step(member.ReadinessReported{Op: x.op, Report: r})
}

func (x *mt) commit(id string, scope ...events.Episode) []member.Effect {
	return x.phase(events.Commit{PhaseHeader: x.hdr(id), Scope: scope})
}

func (x *mt) written(id string) []member.Effect {
	x.man = events.MemberManifest{Schema: 1, Run: "run1", CheckpointID: id, Member: self,
		Object: events.RecordsObject("run1", id, self, strings.Repeat("ab", 32)), SHA256: strings.Repeat("ab", 32), Count: 1, Size: 10, Episodes: []string{"r1"}}
	return x.step(member.RecordsWritten{Op: x.op, Manifest: x.man})
}

func (x *mt) resume(id string) []member.Effect {
	return x.phase(events.Resume{PhaseHeader: x.hdr(id)})
}

func (x *mt) restore(id, source string, scope ...events.Episode) []member.Effect {
	return x.phase(events.Restore{PhaseHeader: x.hdr(id), Source: source, Scope: scope})
}

func (x *mt) retire(eps ...events.Episode) []member.Effect {
	return x.phase(events.Retire{PhaseHeader: x.hdr("op"), Episodes: eps})
}

// prepared brings the machine to prepared on id.
func (x *mt) prepared(id string) {
	x.prepare(id)
	x.ready(member.Report{Ready: true})
	x.state(member.StatePrepared)
}

// committed brings the machine to committed on id.
func (x *mt) committed(id string, stop bool) {
	x.prepared(id)
	x.phase(events.Commit{PhaseHeader: x.hdr(id), Stop: stop})
	x.written(id)
	x.state(member.StateCommitted)
}

func (x *mt) state(s member.State) {
	x.t.Helper()
	if got := x.m.State(); got != s {
		x.t.Fatalf("state %s, want %s", got, s)
	}
}

// describe renders effects as short strings: "reply prepare ok prepared",
// "reply commit stale_checkpoint idle", "wait", "write", "manifest",
// "install", "call retire", "reopen c1 (resume)", "drop", "supersede",
// "park c1".
func describe(effs []member.Effect) []string {
	var out []string
	for _, e := range effs {
		switch e := e.(type) {
		case member.Reply:
			code := "ok"
			if !e.Header.OK {
				code = e.Header.Error.Code
			}
			out = append(out, fmt.Sprintf("reply %s %s %s", e.Phase, code, e.Header.State))
		case member.WaitReady:
			out = append(out, "wait")
		case member.WriteCommit:
			out = append(out, "write")
		case member.InstallRestore:
			out = append(out, "install")
		case member.CallParticipant:
			out = append(out, "call "+string(e.Data.Phase()))
		case member.Reopen:
			out = append(out, fmt.Sprintf("reopen %s (%s)", e.CheckpointID, e.Reason))
		case member.Drop:
			out = append(out, "drop")
		case member.Supersede:
			out = append(out, "supersede")
		case member.Park:
			out = append(out, "park "+e.CheckpointID)
		default:
			out = append(out, fmt.Sprintf("%T", e))
		}
	}
	return out
}

var (
	r1 = events.Episode{Rollout: "r1"}
	r2 = events.Episode{Rollout: "r2"}
)

// TestMachine checks the phase machine against PROTOCOL.md §5, one row per
// rule, named after its section.
func TestMachine(t *testing.T) {
	rows := []struct {
		name  string
		setup func(x *mt)
		do    func(x *mt) []member.Effect
		want  []string
		state member.State
	}{
		{"§5 transitions: idle -prepare-> preparing, waits for readiness", nil,
			func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"wait"}, member.StatePreparing},
		{"§5 transitions: preparing -ready-> prepared", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect { return x.ready(member.Report{Ready: true}) },
			[]string{"reply prepare ok prepared"}, member.StatePrepared},
		{"§5 prepare: not ready by the reply time answers with blockers, stays preparing", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect { return x.ready(member.Report{Blockers: []string{"r1"}}) },
			[]string{"reply prepare ok preparing"}, member.StatePreparing},
		{"§5 prepare: a second prepare of the open id waits again", func(x *mt) {
			x.prepare("c1")
			x.ready(member.Report{Blockers: []string{"r1"}})
		}, func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"wait"}, member.StatePreparing},
		{"§5 prepare: a failing Prepare reopens admission", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect {
				return x.step(member.ReadinessReported{Op: x.op, Err: errors.New("boom")})
			},
			[]string{"reopen c1 (prepare failed)", "reply prepare internal idle"}, member.StateIdle},
		{"§5 transitions: prepared -commit-> writes the records", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.commit("c1", r1) },
			[]string{"write"}, member.StatePrepared},
		{"§5 transitions: prepared -commit-> committed once the records are written, the ack their manifest's record", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
		}, func(x *mt) []member.Effect { return x.written("c1") },
			[]string{"reply commit ok committed"}, member.StateCommitted},
		{"§5 commit: a failed write answers the error and stays prepared", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
		}, func(x *mt) []member.Effect {
			return x.step(member.RecordsWritten{Op: x.op, Err: &events.AckError{Code: events.CodeExportFailed, Detail: "x"}})
		}, []string{"reply commit export_failed prepared"}, member.StatePrepared},
		{"§5 commit: a duplicate commit while writing is answered with it", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
			x.commit("c1", r1)
		}, func(x *mt) []member.Effect { return x.written("c1") },
			[]string{"reply commit ok committed", "reply commit ok committed"}, member.StateCommitted},
		{"§5 commit: another scope while writing is a conflict", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
		}, func(x *mt) []member.Effect { return x.commit("c1", r2) },
			[]string{"reply commit checkpoint_conflict prepared"}, member.StatePrepared},
		{"§5 transitions: committed -resume-> idle", func(x *mt) { x.committed("c1", false) },
			func(x *mt) []member.Effect { return x.resume("c1") },
			[]string{"reopen c1 (resume)", "reply resume ok idle"}, member.StateIdle},
		{"§5 transitions: idle -restore-> restored", nil,
			func(x *mt) []member.Effect {
				x.restore("r1", "k1", r1)
				return x.step(member.RestoreFinished{Op: x.op, Restored: []string{"r1-a1"}})
			}, []string{"reply restore ok restored"}, member.StateRestored},
		{"§5 restore: a failed install reopens admission, the member stays fresh and idle", func(x *mt) { x.restore("r1", "k1", r1) },
			func(x *mt) []member.Effect {
				return x.step(member.RestoreFinished{Op: x.op, Err: &events.AckError{Code: events.CodeInstallFailed, Detail: "x"}})
			}, []string{"reopen r1 (restore failed)", "reply restore install_failed idle"}, member.StateIdle},
		{"§5 restore: only on a member that has not served", func(x *mt) {
			x.prepared("c1")
			x.resume("c1")
		}, func(x *mt) []member.Effect { return x.restore("r1", "k1", r1) },
			[]string{"reply restore invalid_phase idle"}, member.StateIdle},
		{"§5 Restarted members: a prepare published before the process started is refused, the member stays fresh", nil,
			func(x *mt) []member.Effect {
				return x.step(member.PhaseReceived{Data: events.Prepare{PhaseHeader: x.hdr("c1")}, BeforeStart: true})
			}, []string{"reply prepare restarted idle"}, member.StateIdle},
		{"§5 Restarted members: refused that prepare, the member can still be restored into", func(x *mt) {
			x.step(member.PhaseReceived{Data: events.Prepare{PhaseHeader: x.hdr("c1")}, BeforeStart: true})
			x.resume("c1")
		}, func(x *mt) []member.Effect {
			x.restore("r1", "k1", r1)
			return x.step(member.RestoreFinished{Op: x.op, Restored: []string{"r1-a1"}})
		}, []string{"reply restore ok restored"}, member.StateRestored},
		{"§5 Restarted members: a retire from before the start marks, and the member can still be restored into", func(x *mt) {
			x.step(member.PhaseReceived{Data: events.Retire{PhaseHeader: x.hdr("op"), Episodes: []events.Episode{r1}}, BeforeStart: true})
			x.step(member.CallFinished{Op: x.op})
		}, func(x *mt) []member.Effect {
			x.restore("r1", "k1", r2)
			return x.step(member.RestoreFinished{Op: x.op, Restored: []string{"r2-a1"}})
		}, []string{"reply restore ok restored"}, member.StateRestored},
		{"§5 Restarted members: a member that has served prepares a phase from before its start", func(x *mt) {
			x.prepared("c1")
			x.resume("c1")
		}, func(x *mt) []member.Effect {
			return x.step(member.PhaseReceived{Data: events.Prepare{PhaseHeader: x.hdr("c2")}, BeforeStart: true})
		}, []string{"wait"}, member.StatePreparing},
		{"§5 restore: a resume during the install cancels it", func(x *mt) { x.restore("r1", "k1", r1) },
			func(x *mt) []member.Effect { return x.resume("r1") },
			[]string{"reopen r1 (resume)", "reply restore stale_checkpoint idle", "reply resume ok idle"}, member.StateIdle},
		{"§5 transitions: restored -resume-> idle", func(x *mt) {
			x.restore("r1", "k1", r1)
			x.step(member.RestoreFinished{Op: x.op})
		}, func(x *mt) []member.Effect { return x.resume("r1") },
			[]string{"reopen r1 (resume)", "reply resume ok idle"}, member.StateIdle},
		{"§5 Fencing: a resumed id is stale", func(x *mt) {
			x.prepared("c1")
			x.resume("c1")
		}, func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"reply prepare stale_checkpoint idle"}, member.StateIdle},
		{"§5 Fencing: a commit of a resumed id is stale", func(x *mt) {
			x.prepared("c1")
			x.resume("c1")
		}, func(x *mt) []member.Effect { return x.commit("c1") },
			[]string{"reply commit stale_checkpoint idle"}, member.StateIdle},
		{"§5 Fencing: a resume of an unknown id while idle is ok and fences it", func(x *mt) { x.resume("c1") },
			func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"reply prepare stale_checkpoint idle"}, member.StateIdle},
		{"§5 Fencing: a resume of a resumed id is ok, whatever is open now", func(x *mt) {
			x.resume("c1")
			x.prepared("c2")
		}, func(x *mt) []member.Effect { return x.resume("c1") },
			[]string{"reply resume ok prepared"}, member.StatePrepared},
		{"§5 Fencing: another id while one is open is a conflict", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.prepare("c2") },
			[]string{"reply prepare checkpoint_conflict prepared"}, member.StatePrepared},
		{"§5 Fencing: resuming another id while one is open is a conflict", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.resume("c2") },
			[]string{"reply resume checkpoint_conflict prepared"}, member.StatePrepared},
		{"§5 Fencing: commit in idle is invalid_phase", nil,
			func(x *mt) []member.Effect { return x.commit("c1") },
			[]string{"reply commit invalid_phase idle"}, member.StateIdle},
		{"§5 Fencing: commit while preparing is invalid_phase", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect { return x.commit("c1") },
			[]string{"reply commit invalid_phase preparing"}, member.StatePreparing},
		{"§5 Fencing: renew in idle is invalid_phase", nil,
			func(x *mt) []member.Effect { return x.phase(events.Renew{PhaseHeader: x.hdr("c1")}) },
			[]string{"reply renew invalid_phase idle"}, member.StateIdle},
		{"§5 Fencing: retire while a checkpoint is open: resume first", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.retire(r1) },
			[]string{"reply retire invalid_phase prepared"}, member.StatePrepared},
		{"§5 Fencing: release while a restore installs: resume first", func(x *mt) { x.restore("r1", "k1", r1) },
			func(x *mt) []member.Effect { return x.phase(events.Release{PhaseHeader: x.hdr("op")}) },
			[]string{"reply release invalid_phase idle"}, member.StateIdle},
		{"§5 retire: allowed when restored", func(x *mt) {
			x.restore("r1", "k1", r1)
			x.step(member.RestoreFinished{Op: x.op})
		}, func(x *mt) []member.Effect { return x.retire(r1.Next()) },
			[]string{"call retire"}, member.StateRestored},
		{"§5 retire: the participant's answer is the ack", func(x *mt) { x.retire(r1) },
			func(x *mt) []member.Effect { return x.step(member.CallFinished{Op: x.op}) },
			[]string{"reply retire ok idle"}, member.StateIdle},
		{"§5 Idempotence: a duplicate prepare gets the recorded reply", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"reply prepare ok prepared"}, member.StatePrepared},
		{"§5 Idempotence: a duplicate commit gets the recorded reply", func(x *mt) { x.committed("c1", false) },
			func(x *mt) []member.Effect { return x.commit("c1") },
			[]string{"reply commit ok committed"}, member.StateCommitted},
		{"§5 Idempotence: a duplicate restore gets the recorded reply", func(x *mt) {
			x.restore("r1", "k1", r1)
			x.step(member.RestoreFinished{Op: x.op})
		}, func(x *mt) []member.Effect { return x.restore("r1", "k1", r1) },
			[]string{"reply restore ok restored"}, member.StateRestored},
		{"§5 a resume during a commit write answers the commit stale", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
		}, func(x *mt) []member.Effect { return x.resume("c1") },
			[]string{"reopen c1 (resume)", "reply commit stale_checkpoint idle", "reply resume ok idle"}, member.StateIdle},
		{"§5 a resume during a commit write: records written after it never get a manifest", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
			x.resume("c1")
		}, func(x *mt) []member.Effect { return x.written("c1") },
			nil, member.StateIdle},
		{"§5 a resume while a prepare waits answers the prepare stale", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect { return x.resume("c1") },
			[]string{"reopen c1 (resume)", "reply prepare stale_checkpoint idle", "reply resume ok idle"}, member.StateIdle},
		{"§5 a readiness report after the resume is dropped", func(x *mt) {
			x.prepare("c1")
			x.resume("c1")
		}, func(x *mt) []member.Effect { return x.ready(member.Report{Ready: true}) },
			nil, member.StateIdle},
		{"§5 Lease: no expiry before deadline + grace", func(x *mt) {
			x.prepared("c1")
			x.now = x.now.Add(10*time.Second + grace - time.Nanosecond)
		}, func(x *mt) []member.Effect { return x.step(member.LeaseTick{}) },
			nil, member.StatePrepared},
		{"§5 Lease: at deadline + grace the member resumes by itself, no ack", func(x *mt) {
			x.prepared("c1")
			x.now = x.now.Add(10*time.Second + grace)
		}, func(x *mt) []member.Effect { return x.step(member.LeaseTick{}) },
			[]string{"reopen c1 (lease expired)"}, member.StateIdle},
		{"§5 Lease: expiry fences the id", func(x *mt) {
			x.prepared("c1")
			x.now = x.now.Add(time.Hour)
			x.step(member.LeaseTick{})
		}, func(x *mt) []member.Effect { return x.commit("c1") },
			[]string{"reply commit stale_checkpoint idle"}, member.StateIdle},
		{"§5 Lease: expiry during a commit write answers the commit", func(x *mt) {
			x.prepared("c1")
			x.commit("c1", r1)
			x.now = x.now.Add(time.Hour)
		}, func(x *mt) []member.Effect { return x.step(member.LeaseTick{}) },
			[]string{"reopen c1 (lease expired)", "reply commit stale_checkpoint idle"}, member.StateIdle},
		{"§5 Lease: expiry after a stop commit whose outcome never came parks the export, never resumes it", func(x *mt) {
			x.committed("c1", true)
			x.now = x.now.Add(time.Hour)
		}, func(x *mt) []member.Effect { return x.step(member.LeaseTick{}) },
			[]string{"park c1"}, member.StateCommitted},
		{"§5 Lease: that export is parked once, and stays closed", func(x *mt) {
			x.committed("c1", true)
			x.now = x.now.Add(time.Hour)
			x.step(member.LeaseTick{})
			x.now = x.now.Add(time.Hour)
			x.step(member.LeaseTick{})
		}, func(x *mt) []member.Effect {
			return x.step(member.OutcomeReceived{Committed: events.CheckpointCommitted{
				OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"}, Members: []events.Member{self}}})
		}, nil, member.StateCommitted},
		{"§5 Lease: a parked stop commit the bridge then aborts resumes", func(x *mt) {
			x.committed("c1", true)
			x.now = x.now.Add(time.Hour)
			x.step(member.LeaseTick{})
		}, func(x *mt) []member.Effect { return x.resume("c1") },
			[]string{"reopen c1 (resume)", "reply resume ok idle"}, member.StateIdle},
		{"§5 Lease: expiry after a commit without stop resumes", func(x *mt) {
			x.committed("c1", false)
			x.now = x.now.Add(time.Hour)
		}, func(x *mt) []member.Effect { return x.step(member.LeaseTick{}) },
			[]string{"reopen c1 (lease expired)"}, member.StateIdle},
		{"§5 Epochs: a phase of an older epoch is ignored", func(x *mt) {
			x.epoch = 2
			x.resume("x")
			x.epoch = 1
		}, func(x *mt) []member.Effect { return x.prepare("c1") },
			[]string{"drop"}, member.StateIdle},
		{"§5 Epochs: a newer epoch supersedes a member that served", func(x *mt) {
			x.prepared("c1")
			x.resume("c1")
			x.epoch = 1
		}, func(x *mt) []member.Effect { return x.prepare("c2") },
			[]string{"supersede"}, member.StateIdle},
		{"§5 Epochs: a newer epoch not addressed to a member that served still supersedes it", func(x *mt) {
			x.prepared("c1")
			x.epoch = 1
		}, func(x *mt) []member.Effect {
			h := x.hdr("r1")
			h.Members = []events.Member{"agent.fresh"}
			return x.phase(events.Restore{PhaseHeader: h, Source: "c0"})
		}, []string{"supersede"}, member.StatePrepared},
		{"§5 Epochs: a restore of a newer epoch goes to a member that has not served", func(x *mt) {
			x.resume("c0")
			x.epoch = 1
		}, func(x *mt) []member.Effect { return x.restore("r1", "k1", r1) },
			[]string{"install"}, member.StateIdle},
		{"§5 Epochs: a phase for other members is ignored", nil,
			func(x *mt) []member.Effect {
				h := x.hdr("c1")
				h.Members = []events.Member{"agent.b"}
				return x.phase(events.Prepare{PhaseHeader: h})
			}, []string{"drop"}, member.StateIdle},
		{"§5 commit with stop: park once the outcome names the member", func(x *mt) { x.committed("c1", true) },
			func(x *mt) []member.Effect {
				return x.step(member.OutcomeReceived{Committed: events.CheckpointCommitted{
					OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"}, Members: []events.Member{self}}})
			}, []string{"park c1"}, member.StateCommitted},
		{"§5 commit without stop: no park", func(x *mt) { x.committed("c1", false) },
			func(x *mt) []member.Effect {
				return x.step(member.OutcomeReceived{Committed: events.CheckpointCommitted{
					OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"}, Members: []events.Member{self}}})
			}, nil, member.StateCommitted},
		{"§5 commit: a prepare or restore deadline already passed is refused, nothing changes", func(x *mt) {},
			func(x *mt) []member.Effect {
				h := x.hdr("c1")
				h.Deadline = x.now
				return x.phase(events.Prepare{PhaseHeader: h})
			}, []string{"reply prepare deadline_exceeded idle"}, member.StateIdle},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			x := newMT(t)
			if row.setup != nil {
				row.setup(x)
			}
			got := describe(row.do(x))
			if !slices.Equal(got, row.want) {
				t.Fatalf("effects %q, want %q", got, row.want)
			}
			x.state(row.state)
		})
	}
}

// §5 Fencing: the machine remembers the last ResumedKept resumed ids.
func TestMachineFencesLast64(t *testing.T) {
	x := newMT(t)
	for i := range member.ResumedKept + 1 {
		x.resume(fmt.Sprintf("c%d", i))
	}
	if x.m.Resumed("c0") || !x.m.Resumed("c1") || !x.m.Resumed(fmt.Sprintf("c%d", member.ResumedKept)) {
		t.Fatalf("c0 fenced %v, c1 %v", x.m.Resumed("c0"), x.m.Resumed("c1"))
	}
	if got := describe(x.prepare("c0")); !slices.Equal(got, []string{"wait"}) {
		t.Fatalf("prepare of an id forgotten by the fence: %q", got)
	}
}

// §5 Lease: every accepted phase extends it to deadline + grace, never
// backwards; a refused phase does not.
func TestMachineLease(t *testing.T) {
	x := newMT(t)
	if !x.m.Lease().IsZero() {
		t.Fatal("lease while idle")
	}
	h := x.hdr("c1")
	x.phase(events.Prepare{PhaseHeader: h})
	if want := h.Deadline.Add(grace); !x.m.Lease().Equal(want) {
		t.Fatalf("lease %s, want %s", x.m.Lease(), want)
	}
	long := x.hdr("c1")
	long.Deadline = long.Deadline.Add(time.Hour)
	effs := x.phase(events.Renew{PhaseHeader: long})
	ack := effs[0].(member.Reply).Ack(0).(events.RenewAck)
	if want := long.Deadline.Add(grace); !x.m.Lease().Equal(want) || !ack.Lease.Equal(want) {
		t.Fatalf("lease %s, ack %s, want %s", x.m.Lease(), ack.Lease, want)
	}
	x.phase(events.Renew{PhaseHeader: x.hdr("c1")})
	if want := long.Deadline.Add(grace); !x.m.Lease().Equal(want) {
		t.Fatalf("lease moved back to %s", x.m.Lease())
	}
	far := x.hdr("c2")
	far.Deadline = far.Deadline.Add(10 * time.Hour)
	x.phase(events.Renew{PhaseHeader: far}) // conflict: refused, no extension
	if want := long.Deadline.Add(grace); !x.m.Lease().Equal(want) {
		t.Fatalf("a refused renew moved the lease to %s", x.m.Lease())
	}
	x.resume("c1")
	if !x.m.Lease().IsZero() {
		t.Fatal("lease after resume")
	}
}

// §5 retire marks: per rollout the highest retired attempt, refused at or
// below it, until forget.
func TestMachineRetireMarks(t *testing.T) {
	x := newMT(t)
	x.retire(events.Episode{Rollout: "r1", Attempt: 2}, events.Episode{Rollout: "r1", Attempt: 1})
	for _, c := range []struct {
		ep    events.Episode
		stale bool
	}{{events.Episode{Rollout: "r1"}, true}, {events.Episode{Rollout: "r1", Attempt: 2}, true},
		{events.Episode{Rollout: "r1", Attempt: 3}, false}, {events.Episode{Rollout: "r2"}, false}} {
		if err := x.m.Admit(c.ep); errors.Is(err, member.ErrStaleAttempt) != c.stale {
			t.Errorf("Admit(%s) = %v, want stale %v", c.ep, err, c.stale)
		}
	}
	marks, v1 := x.m.Marks(), x.m.MarksVersion()
	if marks["r1"] != 2 {
		t.Fatalf("marks %v", marks)
	}
	x.phase(events.Forget{PhaseHeader: x.hdr("op"), Rollouts: []string{"r1"}})
	if err := x.m.Admit(events.Episode{Rollout: "r1"}); err != nil {
		t.Fatalf("after forget: %v", err)
	}
	if x.m.MarksVersion() == v1 {
		t.Fatal("marks version unchanged by forget")
	}
}

// §5 Epochs: a member serves the epoch of the first phase it handles; the
// acks carry it.
func TestMachineEpochAdoption(t *testing.T) {
	x := newMT(t)
	if _, ok := x.m.Epoch(); ok {
		t.Fatal("epoch before any phase")
	}
	x.epoch = 3
	effs := x.resume("c0")
	if e, ok := x.m.Epoch(); !ok || e != 3 || effs[0].(member.Reply).Header.Epoch != 3 || x.m.Served() {
		t.Fatalf("epoch %d %v, served %v", e, ok, x.m.Served())
	}
	x.epoch = 4 // not served yet: adopt the newer epoch
	x.prepared("c1")
	if e, _ := x.m.Epoch(); e != 4 || !x.m.Served() {
		t.Fatalf("epoch %d, served %v; want 4, served", e, x.m.Served())
	}
}

// §5 Epochs fence zombies, the adopted sandbox daemon: a member adopted
// into epoch 3 has served it from the start. A phase of epoch 2 is
// dropped, one of 3 is served, a restore is refused (it served), and a
// phase of epoch 4 supersedes it.
func TestMachineAdoptedEpoch(t *testing.T) {
	x := newMT(t)
	x.m.Adopt(3)
	if e, ok := x.m.Epoch(); !ok || e != 3 || !x.m.Served() {
		t.Fatalf("after Adopt(3): epoch %d %v, served %v", e, ok, x.m.Served())
	}
	x.epoch = 2
	if got := describe(x.prepare("old")); !slices.Equal(got, []string{"drop"}) {
		t.Fatalf("a prepare of epoch 2: %v", got)
	}
	x.epoch = 3
	if got := describe(x.restore("restore-e3", "c1", r1)); !slices.Equal(got, []string{"reply restore invalid_phase idle"}) {
		t.Fatalf("a restore into the adopted member: %v", got)
	}
	x.prepared("c2")
	x.resume("c2")
	x.epoch = 4
	if got := describe(x.prepare("c3")); !slices.Equal(got, []string{"supersede"}) || !x.m.Superseded() {
		t.Fatalf("a prepare of epoch 4: %v", got)
	}
}

// §5 prepare: the ack of a not-ready prepare caps its blockers and counts
// them all.
func TestMachineBlockersCapped(t *testing.T) {
	x := newMT(t)
	x.prepare("c1")
	var blockers []string
	for i := range 150 {
		blockers = append(blockers, fmt.Sprintf("r%d", i))
	}
	effs := x.ready(member.Report{Blockers: blockers, Restarts: []string{"r9-a1"}})
	ack := effs[0].(member.Reply).Ack(1500 * time.Millisecond).(events.PrepareAck)
	if ack.Ready || len(ack.Blockers) != events.MaxBlockers || ack.BlockerCount != 150 || ack.TookMS != 1500 {
		t.Fatalf("ack %d blockers, count %d, took %d", len(ack.Blockers), ack.BlockerCount, ack.TookMS)
	}
	if err := ack.Validate(); err != nil {
		t.Fatalf("ack does not validate: %v", err)
	}
}

// §5 prepare: the reply time is the deadline less min(1 s, a tenth of the
// time left).
func TestReplyAt(t *testing.T) {
	for _, c := range []struct{ left, before time.Duration }{
		{30 * time.Second, time.Second}, {5 * time.Second, 500 * time.Millisecond}, {0, 0}, {-time.Second, 0},
	} {
		d := t0.Add(c.left)
		if got := member.ReplyAt(t0, d); !got.Equal(d.Add(-c.before)) {
			t.Errorf("left %s: reply at %s before the deadline, want %s", c.left, d.Sub(got), c.before)
		}
	}
}

// §5 states: every transition lists its legal successors; the rest are
// refused naming both states.
func TestCheckTransition(t *testing.T) {
	legal := map[[2]member.State]bool{
		{member.StateIdle, member.StatePreparing}:     true,
		{member.StateIdle, member.StateRestored}:      true,
		{member.StatePreparing, member.StatePrepared}: true,
		{member.StatePreparing, member.StateIdle}:     true,
		{member.StatePrepared, member.StateCommitted}: true,
		{member.StatePrepared, member.StateIdle}:      true,
		{member.StateCommitted, member.StateIdle}:     true,
		{member.StateRestored, member.StateIdle}:      true,
	}
	states := []member.State{member.StateIdle, member.StatePreparing, member.StatePrepared, member.StateCommitted, member.StateRestored}
	for _, from := range states {
		if !from.Wire().Valid() {
			t.Errorf("%s is not a wire state", from)
		}
		for _, to := range states {
			err := member.CheckTransition(from, to)
			if legal[[2]member.State{from, to}] != (err == nil) {
				t.Errorf("%s -> %s: %v", from, to, err)
			}
			if err != nil && (!errors.Is(err, member.ErrTransition) || !strings.Contains(err.Error(), from.String()) || !strings.Contains(err.Error(), to.String())) {
				t.Errorf("error %q does not name both states", err)
			}
		}
	}
	if s := member.State(9).String(); s != "State(9)" {
		t.Errorf("String of an unknown state: %s", s)
	}
}

// §5 commit: export once per checkpoint id. The machine keeps what a
// commit exported, even when its write failed; a later commit writes the
// same records again, a commit of another scope is refused, Park gets the
// records, and a reopen drops them.
func TestMachineExportOnce(t *testing.T) {
	recs := []events.Record{{Key: "r1", Data: []byte(`{"n":1}`)}}
	ex := &member.Export{Scope: []events.Episode{r1}, Records: recs}
	writeOf := func(effs []member.Effect) member.WriteCommit {
		t.Helper()
		for _, e := range effs {
			if w, ok := e.(member.WriteCommit); ok {
				return w
			}
		}
		t.Fatalf("no write in %q", describe(effs))
		return member.WriteCommit{}
	}

	x := newMT(t)
	x.prepared("c1")
	if w := writeOf(x.commit("c1", r1)); w.Export != nil {
		t.Fatalf("the first commit reuses %+v", w.Export)
	}
	failed := x.step(member.RecordsWritten{Op: x.op, Export: ex, Err: &events.AckError{Code: events.CodeExportFailed, Detail: "store down"}})
	if got := describe(failed); !slices.Equal(got, []string{"reply commit export_failed prepared"}) {
		t.Fatalf("effects %q", got)
	}
	if got, ok := x.m.Exported("c1"); !ok || !sameRecords(got.Records, recs) {
		t.Fatalf("kept %+v %v, want the export of the failed write", got, ok)
	}

	other := x.commit("c1", r2)
	if got := describe(other); !slices.Equal(got, []string{"reply commit checkpoint_conflict prepared"}) {
		t.Fatalf("a commit of another scope: %q", got)
	}
	if d := other[0].(member.Reply).Header.Error.Detail; !strings.Contains(d, "another scope") {
		t.Fatalf("detail %q", d)
	}

	w := writeOf(x.phase(events.Commit{PhaseHeader: x.hdr("c1"), Scope: []events.Episode{r1}, Stop: true}))
	if w.Export == nil || !sameRecords(w.Export.Records, recs) {
		t.Fatalf("the retry reuses %+v, want the kept export", w.Export)
	}
	x.written("c1")
	x.state(member.StateCommitted)
	effs := x.step(member.OutcomeReceived{Committed: events.CheckpointCommitted{
		OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"}, Members: []events.Member{self}, Stop: true}})
	if len(effs) != 1 || !sameRecords(effs[0].(member.Park).Records, recs) {
		t.Fatalf("park %q, want the exported records", describe(effs))
	}

	x.resume("c1")
	if _, ok := x.m.Exported("c1"); ok {
		t.Fatal("the export outlived the resume")
	}
}

// §5 commit: a write that reports no export (the records were reused)
// keeps the machine's export as it was; a result after the resume keeps
// nothing.
func TestMachineExportAfterResumeDropped(t *testing.T) {
	x := newMT(t)
	x.prepared("c1")
	x.commit("c1", r1)
	op := x.op
	x.resume("c1")
	x.step(member.RecordsWritten{Op: op, Export: &member.Export{Scope: []events.Episode{r1}}})
	if _, ok := x.m.Exported("c1"); ok {
		t.Fatal("an export reported after the resume was kept")
	}
}

// §5 Epochs fence zombies: once superseded, the machine answers nothing,
// starts nothing and says so.
func TestMachineSupersededIgnoresEverything(t *testing.T) {
	x := newMT(t)
	x.prepared("c1")
	x.resume("c1")
	x.epoch = 1
	if got := describe(x.prepare("c2")); !slices.Equal(got, []string{"supersede"}) || !x.m.Superseded() {
		t.Fatalf("effects %q, superseded %v", got, x.m.Superseded())
	}
	for _, in := range []member.Input{
		member.PhaseReceived{Data: events.Prepare{PhaseHeader: x.hdr("c3")}},
		member.LeaseTick{},
		member.ReadinessReported{Op: x.op, Report: member.Report{Ready: true}},
	} {
		effs, err := x.m.Step(x.now, in)
		if len(effs) != 0 || !errors.Is(err, member.ErrSuperseded) {
			t.Fatalf("Step(%T) after the supersession: %q, %v", in, describe(effs), err)
		}
	}
	if _, err := newMT(t).m.Step(t0, nil); !errors.Is(err, member.ErrUnknownInput) {
		t.Fatalf("Step(nil): %v", err)
	}
}

// §5 retire marks: Marks is a snapshot the driver can hand out; later
// retires do not change it.
func TestMachineMarksSnapshot(t *testing.T) {
	x := newMT(t)
	x.retire(events.Episode{Rollout: "r1", Attempt: 1})
	snap := x.m.Marks()
	x.retire(events.Episode{Rollout: "r1", Attempt: 5}, events.Episode{Rollout: "r2"})
	if len(snap) != 1 || snap["r1"] != 1 {
		t.Fatalf("snapshot changed to %v", snap)
	}
	if m := x.m.Marks(); m["r1"] != 5 || len(m) != 2 {
		t.Fatalf("marks %v", m)
	}
}

func sameRecords(a, b []events.Record) bool {
	return slices.EqualFunc(a, b, func(x, y events.Record) bool { return x.Key == y.Key && string(x.Data) == string(y.Data) })
}

// Only a sandbox daemon may be adopted into an epoch (PROTOCOL §5).
func TestConfigAdoptEpochOnlySandbox(t *testing.T) {
	for _, tc := range []struct {
		m  events.Member
		ok bool
	}{{"agent.a", false}, {"owner.o", false}, {"sandbox.s", true}} {
		err := member.Config{Run: "run1", Member: tc.m, AdoptEpoch: 2, Now: time.Now}.Validate()
		if mentions := err != nil && strings.Contains(err.Error(), "AdoptEpoch"); mentions == tc.ok {
			t.Errorf("%s: %v", tc.m, err)
		}
	}
}

// §5 commit: the commit ack is the manifest's record; an export of no
// records acks with no manifest at all.
func TestMachineCommitAckCarriesTheManifest(t *testing.T) {
	for _, empty := range []bool{false, true} {
		x := newMT(t)
		x.prepared("c1")
		x.commit("c1", r1)
		var effs []member.Effect
		if empty {
			man, err := member.Digest("run1", "c1", self, nil)
			if err != nil {
				t.Fatal(err)
			}
			effs = x.step(member.RecordsWritten{Op: x.op, Manifest: man})
		} else {
			effs = x.written("c1")
		}
		if got := describe(effs); !slices.Equal(got, []string{"reply commit ok committed"}) {
			t.Fatalf("empty=%v: %q", empty, got)
		}
		ack := effs[0].(member.Reply).Ack(0).(events.CommitAck)
		switch {
		case empty && ack.Manifest != nil:
			t.Fatalf("an export of nothing acks with manifest %+v", ack.Manifest)
		case !empty && (ack.Manifest == nil || ack.Manifest.SHA256 != x.man.SHA256):
			t.Fatalf("ack manifest %+v, want %+v", ack.Manifest, x.man)
		}
	}
}

// §3, Consumers: a feed that missed phases it cannot read again says which
// operation comes next (PhasesMissed). An operation open on the member
// that is not that one has ended (the bridge runs one at a time): it is
// reopened as the lease would, only sooner, and its id fenced; a member
// parked by a commit with stop, or whose checkpoint's newest commit had
// stop, is left to the lease; nothing else changes.
func TestMachinePhasesMissed(t *testing.T) {
	const reopened = "reopen c1 (ended while its phases were missed)"
	rows := []struct {
		name  string
		setup func(x *mt)
		in    member.PhasesMissed
		want  []string
		state member.State
	}{
		{"prepared, the run gone on to another checkpoint: reopened", func(x *mt) { x.prepared("c1") },
			member.PhasesMissed{Next: "c2"}, []string{reopened}, member.StateIdle},
		{"preparing: reopened, the prepare waiting answered stale", func(x *mt) { x.prepare("c1") },
			member.PhasesMissed{Next: "retire-7"}, []string{reopened, "reply prepare stale_checkpoint idle"}, member.StateIdle},
		{"restored, the run gone on to a retire: reopened", func(x *mt) {
			x.restore("c1", "k1", r1)
			x.step(member.RestoreFinished{Op: x.op})
		}, member.PhasesMissed{Next: "retire-7"}, []string{reopened}, member.StateIdle},
		{"the next phase is the open operation's own: nothing", func(x *mt) { x.prepared("c1") },
			member.PhasesMissed{Next: "c1"}, nil, member.StatePrepared},
		{"the next phase is of a newer epoch: nothing (it supersedes)", func(x *mt) { x.prepared("c1") },
			member.PhasesMissed{Next: "restore-e1", Epoch: 1}, nil, member.StatePrepared},
		{"committed with stop: parked, left to the lease", func(x *mt) { x.committed("c1", true) },
			member.PhasesMissed{Next: "c2"}, nil, member.StateCommitted},
		{"prepared, the checkpoint's newest commit had stop: left to the lease", func(x *mt) { x.prepared("c1") },
			member.PhasesMissed{Next: "release-9", StopCommit: "c1"}, nil, member.StatePrepared},
		{"committed without stop: reopened", func(x *mt) { x.committed("c1", false) },
			member.PhasesMissed{Next: "c2"}, []string{reopened}, member.StateIdle},
		{"idle: nothing", nil, member.PhasesMissed{Next: "c2"}, nil, member.StateIdle},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			x := newMT(t)
			if r.setup != nil {
				r.setup(x)
			}
			if got := describe(x.step(r.in)); !slices.Equal(got, r.want) {
				t.Fatalf("effects %q, want %q", got, r.want)
			}
			x.state(r.state)
			if r.state != member.StateIdle || r.want == nil {
				return
			}
			// Ended: its id is fenced, and the next operation is taken.
			if got := describe(x.prepare("c1")); !slices.Equal(got, []string{"reply prepare stale_checkpoint idle"}) {
				t.Errorf("a prepare of the ended id: %q, want it stale", got)
			}
			if got := describe(x.prepare("c2")); !slices.Equal(got, []string{"wait"}) {
				t.Errorf("the next checkpoint's prepare: %q, want it taken", got)
			}
		})
	}
}
