package member_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// startCore starts sandbox member sandbox.sb1 of run1 on the core feed
// (Config.StateFile) with its state file in dir, connected through env;
// scoped, its catch-up is that of a sandbox with a user of its own
// (Config.NoPull).
func startCore(t *testing.T, env *jstest.Env, dir string, episodes int, scoped bool) *membertest.Handle {
	t.Helper()
	return membertest.StartMember(t, env, "run1", "sandbox.sb1", membertest.NewParticipant("sb1"),
		membertest.Options{StateFile: filepath.Join(dir, "position.json"), NoPull: scoped, Episodes: episodes})
}

// catchUps are the core feed's two catch-ups: by next-by-subject direct
// gets, and a sandbox's own user's (by the newest phase, then a consumer
// for the time it takes).
var catchUps = []struct {
	name   string
	scoped bool
}{{"next by subject", false}, {"scoped", true}}

// consumers returns how many consumers the stream has.
func consumers(t *testing.T, env *jstest.Env) int {
	t.Helper()
	info, err := env.Bus.Stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// ackSeq returns the stream sequence of m's ack to phase seq.
// PROTOCOL §3, Consumers: a sandbox daemon on the core feed answers every
// phase of a checkpoint and leaves no consumer on the stream; its state file
// keeps the phase sequence it handled.
func TestCoreFeedKeepsNoConsumer(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	before := consumers(t, env)
	dir := t.TempDir()
	h := startCore(t, env, dir, 1, false)
	name := h.Member.Name()
	eps := []events.Episode{{Rollout: "sb1-r0"}}
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }

	seq := bridge.Publish(events.Prepare{PhaseHeader: header("c1")})
	want(t, bridge.Ack(seq, events.PhasePrepare, name), "", events.StatePrepared)
	if n := consumers(t, env); n != before {
		t.Errorf("the stream has %d consumers with the member running, %d before it started", n, before)
	}
	seq = bridge.Publish(events.Commit{PhaseHeader: header("c1"), Scope: eps})
	ack := bridge.Ack(seq, events.PhaseCommit, name)
	want(t, ack, "", events.StateCommitted)
	if c, ok := ack.(events.CommitAck); !ok || c.Manifest != nil {
		// It holds no live episode: it exported nothing, and a member
		// that exports nothing writes no manifest (PROTOCOL §5, commit).
		t.Errorf("commit ack %+v, want one with no manifest", ack)
	}
	last := bridge.Publish(events.Resume{PhaseHeader: header("c1")})
	want(t, bridge.Ack(last, events.PhaseResume, name), "", events.StateIdle)
	if n := consumers(t, env); n != before {
		t.Errorf("the stream has %d consumers with the member running, %d before it started", n, before)
	}
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "position.json"))
	if err != nil || !strings.Contains(string(b), `"phase_seq":`) {
		t.Fatalf("state file %s, %v: want the phase sequence handled", b, err)
	}
}

// PROTOCOL §3, Consumers: a phase the subscription lost (as one published
// before it was up) shows as a gap in the phase sequence at the next one;
// the member reads what it missed from the stream and answers it first.
// Without it, the lost resume would leave c1 open and the prepare of c2
// refused.
func TestCoreFeedFillsAGap(t *testing.T) {
	for _, c := range catchUps {
		t.Run(c.name, func(t *testing.T) { fillsAGap(t, c.scoped) })
	}
}

func fillsAGap(t *testing.T, scoped bool) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	before := consumers(t, env)
	h := startCore(t, env, t.TempDir(), 0, scoped)
	name := h.Member.Name()
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }

	seq1 := bridge.Publish(events.Prepare{PhaseHeader: header("c1")})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)
	member.LoseCoreArrivals(h.Member, 1)
	seq2 := bridge.Publish(events.Resume{PhaseHeader: header("c1")})
	seq3 := bridge.Publish(events.Prepare{PhaseHeader: header("c2")})
	want(t, bridge.Ack(seq2, events.PhaseResume, name), "", events.StateIdle)
	want(t, bridge.Ack(seq3, events.PhasePrepare, name), "", events.StatePrepared)
	if a, b := bridge.AckedAt(seq2, events.PhaseResume, name), bridge.AckedAt(seq3, events.PhasePrepare, name); a.After(b) {
		t.Errorf("the lost resume was answered at %s, after the prepare that followed it (%s)", a, b)
	}
	bridge.Barrier(name)
	for _, s := range []struct {
		seq uint64
		p   events.Phase
	}{{seq1, events.PhasePrepare}, {seq2, events.PhaseResume}, {seq3, events.PhasePrepare}} {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
	noConsumerLeft(t, env, before)
}

// noConsumerLeft waits until the stream has the consumers it had before
// the member started: a scoped catch-up's consumer goes when it is done.
func noConsumerLeft(t *testing.T, env *jstest.Env, before int) {
	t.Helper()
	poll.Wait(t, 30*time.Second, "the catch-up's consumer to go", func() bool { return consumers(t, env) == before })
}

// PROTOCOL §5, Fencing, on the core feed: a zombie bridge's phase, which
// the stream refuses (fenced on the run's last phase), still reaches a core
// subscription of the publish subject; the core feed hears only what the
// stream stored, as it republishes it. Here the zombie's resume of c1 comes
// first and is refused, and the member answers the live bridge's commit of
// the same sequence, not the resume.
func TestCoreFeedNeverHearsARefusedPhase(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	h := startCore(t, env, t.TempDir(), 1, false)
	name := h.Member.Name()
	seq1 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)

	header := bridge.Header("c1", 10*time.Second, name)
	zombie, err := events.Marshal(bridge.Name, events.Resume{PhaseHeader: header}, events.WithID("zombie"))
	if err != nil {
		t.Fatal(err)
	}
	// Fenced as a bridge fences a phase, on the run's last phase: the
	// zombie has seen none.
	if _, err := env.JS.PublishMsg(t.Context(), zombie, natsjs.WithExpectLastSequenceForSubject(0, events.PhaseFilter("run1"))); err == nil {
		t.Fatal("the zombie's fenced publish was stored")
	}
	seq2 := bridge.Publish(events.Commit{PhaseHeader: header, Scope: []events.Episode{{Rollout: "sb1-r0"}}})
	want(t, bridge.Ack(seq2, events.PhaseCommit, name), "", events.StateCommitted)
	bridge.Barrier(name)
	if a, ok := bridge.Lookup(seq2, events.PhaseResume, name); ok {
		t.Errorf("the member answered the refused resume: %+v", a)
	}
}

// PROTOCOL §3, Consumers: the phases published while the member's
// connection was cut reach it by no subscription; once it has reconnected
// it reads them from the stream, by itself, and answers them in order,
// each once.
func TestCoreFeedCatchesUpAfterADisconnect(t *testing.T) {
	for _, c := range catchUps {
		t.Run(c.name, func(t *testing.T) { catchesUpAfterADisconnect(t, c.scoped) })
	}
}

func catchesUpAfterADisconnect(t *testing.T, scoped bool) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	before := consumers(t, env)
	px := startProxy(t, env.URL)
	through := *env
	through.URL = px.url
	h := startCore(t, &through, t.TempDir(), 0, scoped)
	name := h.Member.Name()
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }

	seq1 := bridge.Publish(events.Prepare{PhaseHeader: header("c1")})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)

	px.cut(t)
	seq2 := bridge.Publish(events.Resume{PhaseHeader: header("c1")})
	seq3 := bridge.Publish(events.Retire{PhaseHeader: header("retire-3"), Episodes: []events.Episode{{Rollout: "r9", Attempt: 2}}})
	seq4 := bridge.Publish(events.Prepare{PhaseHeader: header("c2")})
	if _, ok := bridge.Lookup(seq2, events.PhaseResume, name); ok {
		t.Fatal("the member answered through a cut connection")
	}
	px.restore(t)

	want(t, bridge.Ack(seq2, events.PhaseResume, name), "", events.StateIdle)
	want(t, bridge.Ack(seq3, events.PhaseRetire, name), "", events.StateIdle)
	want(t, bridge.Ack(seq4, events.PhasePrepare, name), "", events.StatePrepared)
	if err := h.Member.Admit(events.Episode{Rollout: "r9", Attempt: 2}); err == nil {
		t.Error("the retire published while the member was cut off was not applied")
	}
	a2, a3, a4 := bridge.AckedAt(seq2, events.PhaseResume, name), bridge.AckedAt(seq3, events.PhaseRetire, name), bridge.AckedAt(seq4, events.PhasePrepare, name)
	if a2.After(a3) || a3.After(a4) {
		t.Errorf("acks at %s, %s, %s: not in the phases' order", a2, a3, a4)
	}
	bridge.Barrier(name)
	for _, s := range []struct {
		seq uint64
		p   events.Phase
	}{{seq1, events.PhasePrepare}, {seq2, events.PhaseResume}, {seq3, events.PhaseRetire}, {seq4, events.PhasePrepare}} {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
	noConsumerLeft(t, env, before)
	if err := h.Stop(); err != nil {
		t.Errorf("Run: %v, want nil after a clean stop", err)
	}
}

// proxy forwards TCP connections to a server, and can cut them all (and
// refuse new ones) until restored: a network cut between one client and
// the server while the others carry on.
type proxy struct {
	url    string
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, serverURL string) *proxy {
	t.Helper()
	target := strings.TrimPrefix(serverURL, "nats://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.url = "nats://" + p.addr
	p.serve(ln)
	t.Cleanup(func() { p.cut(t) })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[s] = true, true
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			p.wg.Go(func() { pipe(s, c) })
			p.wg.Go(func() { pipe(c, s) })
		}
	})
}

// cut closes the listener and every connection, and waits for the
// forwarding to end.
func (p *proxy) cut(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

// restore listens again on the same address.
func (p *proxy) restore(t *testing.T) {
	t.Helper()
	var ln net.Listener
	poll.Wait(t, 10*time.Second, "the proxy's address again", func() bool {
		var err error
		ln, err = net.Listen("tcp", p.addr)
		if err != nil && !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("proxy: listen on %s again: %v", p.addr, err)
		}
		return err == nil
	})
	p.serve(ln)
}

// PROTOCOL §3, live phases: the bridge publishes no live copy of a phase
// that addresses no sandbox daemon (a commit), and each copy names the one
// before it; a daemon that saw that one takes the next as it comes, with no
// read of the stream for the phase it never heard.
func TestCoreFeedFollowsTheLiveChain(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	h := startCore(t, env, t.TempDir(), 1, false)
	name := h.Member.Name()
	agent := events.Member("agent.a")
	seq1 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name, agent)})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)
	before := member.CoreCatchUps(h.Member)
	bridge.Publish(events.Commit{PhaseHeader: bridge.Header("c1", 10*time.Second, agent)})
	seq3 := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name, agent)})
	want(t, bridge.Ack(seq3, events.PhaseResume, name), "", events.StateIdle)
	seq4 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c2", 10*time.Second, name, agent)})
	want(t, bridge.Ack(seq4, events.PhasePrepare, name), "", events.StatePrepared)
	if n := member.CoreCatchUps(h.Member) - before; n != 0 {
		t.Errorf("%d catch-ups from the stream for a commit that was no daemon's", n)
	}
	// A live copy that does not follow the last one seen (one lost) still
	// makes the member read the stream.
	member.LoseCoreArrivals(h.Member, 1)
	seq5 := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c2", 10*time.Second, name, agent)})
	seq6 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c3", 10*time.Second, name, agent)})
	want(t, bridge.Ack(seq5, events.PhaseResume, name), "", events.StateIdle)
	want(t, bridge.Ack(seq6, events.PhasePrepare, name), "", events.StatePrepared)
	if n := member.CoreCatchUps(h.Member) - before; n == 0 {
		t.Error("a lost live copy was not read from the stream")
	}
}

// PROTOCOL §3, live acks: a sandbox daemon's prepare ack is not on the
// stream, so a restarted daemon could not tell a prepare it answered from
// one it did not, and would pause its launches again for a checkpoint long
// over. Its core feed writes its position past a prepare at once, where it
// writes others at most every 30 s: a process killed right after its
// prepare ack starts after it.
func TestCoreFeedSavesItsPositionPastAPrepare(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	dir := t.TempDir()
	h := startCore(t, env, dir, 0, false)
	name := h.Member.Name()
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
	saved := func() uint64 {
		var pos struct {
			PhaseSeq uint64 `json:"phase_seq"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "position.json"))
		if err == nil {
			_ = json.Unmarshal(b, &pos)
		}
		return pos.PhaseSeq
	}
	bridge.Barrier(name) // the first position, written at once; the next wait up to 30 s
	poll.Wait(t, 5*time.Second, "the first position", func() bool { return saved() >= 1 })

	seq := bridge.Publish(events.Prepare{PhaseHeader: header("c1")})
	want(t, bridge.Ack(seq, events.PhasePrepare, name), "", events.StatePrepared)
	poll.Wait(t, 5*time.Second, "the position past the prepare", func() bool { return saved() >= seq })

	// A resume is idempotent: its position may wait.
	rseq := bridge.Publish(events.Resume{PhaseHeader: header("c1")})
	want(t, bridge.Ack(rseq, events.PhaseResume, name), "", events.StateIdle)
	time.Sleep(500 * time.Millisecond)
	if got := saved(); got != seq {
		t.Errorf("position %d after the resume %d, want %d: only a prepare is written at once", got, rseq, seq)
	}
}

// sandboxLike is the test participant as a sandbox daemon is: it prepares,
// reopens admission and retires, and neither exports nor installs records
// (its sandbox is its owner's to snapshot), so it runs without the bus a
// sandbox's own user cannot open.
type sandboxLike struct {
	membertest.Subject
	p *membertest.Participant
}

func (s sandboxLike) Resume(ctx context.Context, id string) error { return s.p.Resume(ctx, id) }
func (s sandboxLike) Retire(ctx context.Context, eps []events.Episode) error {
	return s.p.Retire(ctx, eps)
}

// startOwnUser starts sandbox.sb1 of run1 as a sandbox daemon runs with a
// user of its own (Config.NoPull on the core feed), connected with that
// user's credentials: a permissions violation fails the test.
func startOwnUser(t *testing.T, env *jstest.Env) (*membertest.Handle, *membertest.Participant) {
	t.Helper()
	const name events.Member = "sandbox.sb1"
	p := membertest.NewParticipant("sb1")
	h := membertest.StartMember(t, env.WithCreds(env.MemberCreds(t, "run1", name)), "run1", name, sandboxLike{p, p},
		membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json"), NoPull: true})
	return h, p
}

// calls returns the participant's calls of method, as "method id".
func calls(p *membertest.Participant, method string) []string {
	var out []string
	for _, c := range p.Calls() {
		if c.Method == method {
			out = append(out, c.Method+" "+c.CheckpointID)
		}
	}
	return out
}

// PROTOCOL §3, Consumers: a sandbox daemon with a user of its own reads
// what it missed by direct gets whose subjects name the newest phase of
// each kind, and makes no consumer (its user may make none). Here it
// prepared c1 and lost every live copy after: c1's resume, the whole of c2
// and a retire. It acts on the retire, the run's newest operation (c3's
// prepare) and the end of c1, whose resume is no longer the newest: it
// reopens c1 before the retire, as its lease would. It never prepares c2,
// an operation over whose resume it cannot read, and answers each phase it
// acts on once, all as its own user.
func TestCoreFeedCatchesUpByDirectGetsAsItsOwnUser(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority("run1"))
	bridge := membertest.NewBridge(t, env, "run1")
	before := consumers(t, env)
	h, p := startOwnUser(t, env)
	name, agent := h.Name, events.Member("agent.a")
	both := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name, agent) }
	seq1 := bridge.Publish(events.Prepare{PhaseHeader: both("c1")})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)

	member.LoseCoreArrivals(h.Member, 4)
	bridge.Publish(events.Commit{PhaseHeader: bridge.Header("c1", 10*time.Second, agent)})
	bridge.Publish(events.Resume{PhaseHeader: both("c1")})
	seq4 := bridge.Publish(events.Prepare{PhaseHeader: both("c2")})
	bridge.Publish(events.Commit{PhaseHeader: bridge.Header("c2", 10*time.Second, agent)})
	bridge.Publish(events.Resume{PhaseHeader: both("c2")})
	seq7 := bridge.Publish(events.Retire{PhaseHeader: both("retire-7"), Episodes: []events.Episode{{Rollout: "r9", Attempt: 2}}})
	seq8 := bridge.Publish(events.Prepare{PhaseHeader: both("c3")})

	want(t, bridge.Ack(seq7, events.PhaseRetire, name), "", events.StateIdle)
	want(t, bridge.Ack(seq8, events.PhasePrepare, name), "", events.StatePrepared)
	if err := h.Member.Admit(events.Episode{Rollout: "r9", Attempt: 2}); err == nil {
		t.Error("the retire it missed was not applied")
	}
	if a, b := bridge.AckedAt(seq7, events.PhaseRetire, name), bridge.AckedAt(seq8, events.PhasePrepare, name); a.After(b) {
		t.Errorf("the retire was answered at %s, after the prepare that followed it (%s)", a, b)
	}
	if a, ok := bridge.Lookup(seq4, events.PhasePrepare, name); ok {
		t.Errorf("it answered c2's prepare, an operation over: %+v", a)
	}
	if got, want := calls(p, "prepare"), []string{"prepare c1", "prepare c3"}; !slices.Equal(slices.Compact(got), want) {
		t.Errorf("prepares %q, want %q: c2 is over", got, want)
	}
	if got := calls(p, "resume"); !slices.Contains(got, "resume c1") {
		t.Errorf("resumes %q: c1, whose resume it could not read, is still open", got)
	}
	if n := member.CoreCatchUps(h.Member); n < 2 {
		t.Errorf("%d catch-ups, want the start's and the gap's", n)
	}
	if n := consumers(t, env); n != before {
		t.Errorf("the stream has %d consumers, %d before the member started", n, before)
	}
	bridge.Barrier(name)
	for _, s := range []struct {
		seq uint64
		p   events.Phase
	}{{seq1, events.PhasePrepare}, {seq7, events.PhaseRetire}, {seq8, events.PhasePrepare}} {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
}

// PROTOCOL §5, Lease: a sandbox daemon with a user of its own that missed
// the commit with stop of the checkpoint it prepared, and what came after
// it, commits it when it reads it (it is the newest commit) and stays
// parked: the operation after it is no resume of its checkpoint, and
// nothing reopens admission before a bridge finishes that checkpoint.
func TestCoreFeedCatchUpNeverResumesAStopCommit(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority("run1"))
	bridge := membertest.NewBridge(t, env, "run1")
	h, p := startOwnUser(t, env)
	name := h.Name
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
	seq1 := bridge.Publish(events.Prepare{PhaseHeader: header("c1")})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)

	member.LoseCoreArrivals(h.Member, 1)
	seq2 := bridge.Publish(events.Commit{PhaseHeader: header("c1"), Stop: true})
	seq3 := bridge.Publish(events.Release{PhaseHeader: header("release-3")})
	want(t, bridge.Ack(seq2, events.PhaseCommit, name), "", events.StateCommitted)
	// Refused, prepared or committed: the catch-up hands it over while the
	// commit's write may still run.
	if code := membertest.Code(bridge.Ack(seq3, events.PhaseRelease, name)); code != events.CodeInvalidPhase {
		t.Errorf("release: code %q, want %q: resume first", code, events.CodeInvalidPhase)
	}
	seq4 := bridge.Publish(events.Resume{PhaseHeader: header("other")})
	want(t, bridge.Ack(seq4, events.PhaseResume, name), events.CodeCheckpointConflict, events.StateCommitted)
	if got := calls(p, "resume"); len(got) != 0 {
		t.Errorf("resumes %q after a commit with stop", got)
	}
}
