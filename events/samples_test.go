package events

import (
	"strings"
	"time"
)

var (
	testDeadline = time.Date(2026, 11, 29, 8, 0, 30, 0, time.UTC)
	testBridge   = Member("bridge.main")
)

func testPhase(seq uint64) PhaseHeader {
	return PhaseHeader{Run: "run1", CheckpointID: "ckpt-7", Seq: seq, Epoch: 2, Deadline: testDeadline,
		Members: []Member{"agent.a0", "owner.o0", "sandbox.sb-1"}}
}

// testRosterPhase is testPhase addressing its sandbox daemons by the
// roster of phase 1, as it reads from the stream (no names).
func testRosterPhase(seq uint64) PhaseHeader {
	h := testPhase(seq)
	h.Members = []Member{"agent.a0", "owner.o0"}
	h.Sandboxes = &RosterRef{Seq: 1, StreamSeq: 40, Count: 2, SHA256: RosterDigest([]Member{"sandbox.sb-1", "sandbox.sb-2"})}
	return h
}

func testAck(seq uint64) AckHeader {
	return AckHeader{Run: "run1", Member: "agent.a0", Seq: seq, CheckpointID: "ckpt-7", Epoch: 2, OK: true,
		State: StatePrepared, TookMS: 12}
}

func testOutcome() OutcomeHeader { return OutcomeHeader{Run: "run1", CheckpointID: "ckpt-7", Epoch: 2} }

// samples returns one valid payload of every event type and the member
// that sends it.
func samples() map[Type]struct {
	src  Member
	data Data
} {
	ep := func(s string) Episode { e, _ := ParseEpisode(s); return e }
	manifest := &MemberManifest{Schema: ManifestSchema, Run: "run1", CheckpointID: "ckpt-7", Member: "agent.a0",
		Object: "run1/ckpt-7/agent.a0.e3b0c44298fc1c14.jsonl", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		Count: 2, Size: 120, Episodes: []string{"r1", "r2-a3"}}
	out := map[Type]struct {
		src  Member
		data Data
	}{}
	add := func(src Member, d Data) {
		out[d.Type()] = struct {
			src  Member
			data Data
		}{src, d}
	}
	add(testBridge, Prepare{testPhase(1)})
	add(testBridge, Renew{testRosterPhase(2)})
	add(testBridge, Commit{PhaseHeader: testPhase(3), Scope: []Episode{ep("r1"), ep("r2-a3")}, Stop: true})
	add(testBridge, Resume{PhaseHeader: testRosterPhase(4), Aborted: true})
	add(testBridge, Restore{PhaseHeader: testPhase(5), Source: "ckpt-6", Scope: []Episode{ep("r1.x")}})
	add(testBridge, Retire{PhaseHeader: testPhase(6), Episodes: []Episode{ep("r1-a1")}})
	add(testBridge, Forget{PhaseHeader: testPhase(7), Rollouts: []string{"r1"}})
	add(testBridge, Release{PhaseHeader: testPhase(8), Keep: []string{"ckpt-6", "ckpt-7"}})
	branches := []BranchSpec{NewBranchSpec(ep("r1-a1"), 1, 11), NewBranchSpec(ep("r1-a1"), 2, 12)}
	add(testBridge, Branch{PhaseHeader: testPhase(9), Source: "ckpt-6", SourceCommitSeq: 4, SourceAcks: true, Branches: branches})
	pa := PrepareAck{AckHeader: testAck(1), Restarts: []string{"r9"}, Counts: map[string]int{"parked": 3},
		Pause: &PauseReport{Mode: "freeze", PauseSeq: 1, Identity: "41:9912", Wall: testDeadline, Uptime: 3.5, PIDCount: 4, PIDs: []int{41, 42}, TookMS: 1.2}}
	pa.State = StatePreparing
	pa.SetBlockers([]string{"r3", "r4"})
	add("agent.a0", pa)
	add("agent.a0", RenewAck{AckHeader: testAck(2), Lease: testDeadline.Add(10 * time.Minute)})
	ca := CommitAck{AckHeader: testAck(3), Manifest: manifest}
	ca.State = StateCommitted
	add("agent.a0", ca)
	ra := ResumeAck{AckHeader: testAck(4)}
	ra.State = StateIdle
	add("agent.a0", ra)
	rs := RestoreAck{AckHeader: testAck(5), Source: "ckpt-6", Restored: []string{"r1.x-a1"}}
	rs.State = StateRestored
	add("agent.a0", rs)
	rt := RetireAck{AckHeader: testAck(6)}
	rt.Fail(CodeInvalidPhase, "resume first")
	add("agent.a0", rt)
	add("agent.a0", ForgetAck{AckHeader: testAck(7)})
	add("agent.a0", ReleaseAck{AckHeader: testAck(8), Deleted: []string{"snap-1"}})
	add("agent.a0", BranchAck{AckHeader: testAck(9), Branched: []string{"r1.b1-a2", "r1.b2-a2"}})
	add(testBridge, CheckpointCommitted{OutcomeHeader: testOutcome(), Continued: []string{"r1"}, Restarted: []string{"r2-a1"},
		Members: []Member{"agent.a0"}, PrepareMS: 40, CommitMS: 90, Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		PrepareSeq: 6, CommitSeq: 7, Exports: []MemberExport{{Member: "agent.a0", Kind: KindAgent, Instance: "i0", Epoch: 3,
			Object: "run-1/ckpt-7/agent.a0.0123456789abcdef.jsonl", SHA256: strings.Repeat("ab", 32), Size: 120, Count: 2, Episodes: 1}}})
	add(testBridge, CheckpointFailed{OutcomeHeader: testOutcome(), Phase: PhasePrepare, Reason: "2 members not ready",
		Blockers: map[Member][]string{"agent.a0": {"r3"}}, BlockerCount: map[Member]int{"agent.a0": 1},
		Errors: []MemberError{{Member: "owner.o0", Code: CodeMissingAck}}, Members: []Member{"agent.a0", "owner.o0"},
		PrepareSeq: 6, PrepareMS: 2000})
	add(testBridge, RestoreCompleted{OutcomeHeader: testOutcome(), Source: "ckpt-6", Restored: []string{"r1-a1"}})
	add(testBridge, RestoreFailed{OutcomeHeader: testOutcome(), Source: "ckpt-6",
		Errors: []MemberError{{Member: "owner.o0", Code: CodeInstallFailed, Detail: "fork failed"}}, Retired: []string{"r1-a1"}})
	add(testBridge, ReleaseCompleted{OutcomeHeader: testOutcome(), Keep: []string{"ckpt-7"}, Deleted: []string{"ckpt-5"}})
	add(testBridge, ReleaseFailed{OutcomeHeader: testOutcome(), Keep: []string{"ckpt-7"}, Reason: "1 of 2 members did not release",
		Errors: []MemberError{{Member: "owner.o0", Code: "release_failed", Detail: "disk"}}, Deleted: map[Member][]string{"agent.a0": {"snap-1"}}})
	add(testBridge, BranchCompleted{OutcomeHeader: testOutcome(), Source: "ckpt-6", Branches: branches,
		Agents: map[string]Member{"r1.b1": "agent.a0", "r1.b2": "agent.a0"}})
	add(testBridge, BranchFailed{OutcomeHeader: testOutcome(), Source: "ckpt-6", Branches: branches,
		Errors: []MemberError{{Member: "owner.o0", Code: CodeInstallFailed, Detail: "fork failed"}}, Retired: []string{"r1.b1-a2", "r1.b2-a2"}})
	add("sandbox.sb-1", MemberJoined{Run: "run1", Member: "sandbox.sb-1", Epoch: 2, Capabilities: []string{"pause:freeze", "pause:stop"}, Host: "node-3", PID: 77, Version: "dev"})
	add(testBridge, Roster{Run: "run1", CheckpointID: "ckpt-7", Seq: 1, Epoch: 2, Members: []Member{"sandbox.sb-1", "sandbox.sb-2"}})
	add(testBridge, ResumeAcked{Run: "run1", CheckpointID: "ckpt-7", Seq: 4, Epoch: 2, Expected: 3, Answered: 2,
		Missing: []Member{"sandbox.sb-1"}, MissingCount: 1, Errors: []MemberError{{Member: "agent.a0", Code: CodeCheckpointConflict}}, ErrorCount: 1,
		HeldCalls: 2, P50MS: 3.5, MaxMS: 9})
	add(testBridge, PrepareAcked{Run: "run1", CheckpointID: "ckpt-7", Seq: 2, Epoch: 2, Expected: 4, Answered: 3, Ready: 1,
		Missing: []Member{"sandbox.sb-4"}, MissingCount: 1, NotReady: []Member{"sandbox.sb-2"}, NotReadyCount: 1,
		Errors: []MemberError{{Member: "sandbox.sb-3", Code: CodeCheckpointConflict}}, ErrorCount: 1, P50MS: 2.5, MaxMS: 7, Part: 1, Parts: 1,
		Pauses:       []PauseTally{{Mode: "freeze", Count: 1, Still: true, PIDsMin: 2, PIDsMax: 2, TookMaxMS: 1.5}},
		NotableCount: 2, Acks: []HeardAck{{At: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Ack: PrepareAck{AckHeader: AckHeader{Run: "run1",
			Member: "sandbox.sb-2", Seq: 2, CheckpointID: "ckpt-7", Epoch: 2, OK: true, State: StatePreparing, TookMS: 3}, BlockerCount: 1,
			Blockers: []string{"launch-1"}}}}})
	add("sandbox.sb-1", MemberLeft{Run: "run1", Member: "sandbox.sb-1", Epoch: 2, Reason: "shutdown"})
	return out
}
