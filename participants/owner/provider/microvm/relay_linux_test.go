//go:build linux

package microvm

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// relayModel is the host's model server for the relay test: it records
// every call, and answers only once it is told to (before that it holds
// the call, as a model server that dies with the crash would).
type relayModel struct {
	mu     sync.Mutex
	calls  []string
	answer bool
}

func (m *relayModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.calls = append(m.calls, string(b))
	answer := m.answer
	m.mu.Unlock()
	if !answer {
		<-r.Context().Done()
		return
	}
	_, _ = io.WriteString(w, `{"answer":"from the model"}`)
}

func (m *relayModel) ledger() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.calls...)
}

// The sandbox side of an in-place resume, in real microVMs: a harness in
// the guest calls the model through sandboxd's relay; a checkpoint's
// prepare holds the relay and freezes the harness (a hold pause with
// freeze, cgroup v2 in the guest); the VM is snapshotted with the call in
// flight and forked, and the fork's daemon, re-identified in place, says
// the launch is still held by the same supervisor, re-sends the cut call
// byte for byte when re-pointed, and continues the pause: the harness (the
// same pid) gets its answer and runs on.
func TestMicroVMRelayHoldsACallThroughAFork(t *testing.T) {
	tier.Long(t)
	requireMicroVM(t)
	env := jstest.Start(t)
	model := &relayModel{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: model}}
	srv.Start()
	defer srv.Close()
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	m, err := New(Config{StateDir: t.TempDir(), CacheDir: microvmCache(), PruneCache: true, Sandboxd: sd,
		Accel: "tcg", Lease: 20 * time.Second, Upstream: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupMicroVM(t, m)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	upstream := "http://" + qemu.GuestUpstream
	relayInit := func(id string) []string {
		return append(memberInit(env.URL, id), "--relay", "127.0.0.1:18480", "--relay-upstream", upstream)
	}
	providertest.Start(t, m, provider.Spec{ID: "m1", Init: relayInit("m1"), Workdir: "/work"})
	orig := membertest.WaitRegistered(t, env, "run1", events.Member("sandbox.m1"), nil)
	nc, _ := env.Connect(t)
	client := func(id string) *sandboxclient.Client {
		c, err := sandboxclient.New(nc, "run1", id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	st, err := client("m1").RelayStatus(ctx)
	if err != nil || !st.Up || st.URL != "http://127.0.0.1:18480" || st.Upstream != upstream {
		t.Fatalf("relay status: %+v, %v", st, err)
	}
	call := `{"messages":[{"role":"user","content":"cut by the crash"}]}`
	rec, err := client("m1").Launch(ctx, sandboxapi.LaunchRequest{LaunchID: "l1", Episode: "r1", Mode: "hold", Freeze: true,
		Command: `wget -q -O /work/answer --header 'Content-Type: application/json' --post-data '` + call + `' ` +
			st.URL + `/v1/chat/completions; i=0; while :; do i=$((i+1)); echo $i >> /work/count; sleep 0.2; done`})
	if err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, time.Minute, "the harness's call at the model server", func() bool { return len(model.ledger()) == 1 })

	bridge := membertest.NewBridge(t, env, "run1")
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", time.Minute, orig.Member)})
	ack := bridge.Ack(seq, events.PhasePrepare, orig.Member).(events.PrepareAck)
	if !ack.Ready || ack.Pause == nil || ack.Pause.Mode != "hold" || !ack.Pause.Frozen {
		t.Fatalf("prepare ack: ready %v pause %+v", ack.Ready, ack.Pause)
	}
	identity, err := sandboxapi.ParseIdentity(ack.Pause.Identity)
	if err != nil {
		t.Fatal(err)
	}
	providertest.Snapshot(t, m, "m1", "s1")
	// The crash: the model server the call was at is gone, another
	// answers at the same forward.
	model.mu.Lock()
	model.answer = true
	model.mu.Unlock()
	providertest.Fork(t, m, "s1", provider.Spec{ID: "f1", Init: relayInit("f1"), Workdir: "/work", Epoch: 2})
	membertest.WaitRegistered(t, env, "run1", events.Member("sandbox.f1"), nil)
	f1 := client("f1")
	held, err := f1.Held(ctx, "l1", ack.Pause.PauseSeq, identity)
	if err != nil || held.Verdict != sandboxapi.VerdictHeld || held.Record == nil || held.Record.PID != rec.PID ||
		!held.Record.Pauses.Frozen || !held.Relay.Holding || held.Relay.Calls.InFlight != 1 {
		t.Fatalf("held in the fork: %+v (%v), record %+v", held, err, held.Record)
	}
	if _, err := f1.Repoint(ctx, upstream, 1); err != nil {
		t.Fatal(err)
	}
	rep, err := f1.Resume(ctx, "l1", ack.Pause.PauseSeq, identity)
	if err != nil || rep.State != sandboxapi.StateRunning || !rep.Frozen {
		t.Fatalf("resume in the fork: %+v, %v", rep, err)
	}
	poll.Wait(t, time.Minute, "the cut call re-sent", func() bool { return len(model.ledger()) == 2 })
	// The relay captures with token ids (its default): the call goes
	// upstream with the fields that ask for them, before the harness's.
	upstreamCall := `{"return_token_ids":true,"logprobs":true,"top_logprobs":0,` + strings.TrimPrefix(call, "{")
	if got := model.ledger(); got[0] != upstreamCall || got[1] != upstreamCall {
		t.Fatalf("the model server's ledger: %q, want %s twice, byte for byte (once cut, once re-sent)", got, upstreamCall)
	}
	poll.Wait(t, time.Minute, "the harness's answer in the fork", func() bool {
		return strings.Contains(providertest.Sh(t, m, "f1", "cat /work/answer 2>/dev/null; true"), "from the model")
	})
	last := waitCounterFile(t, m, "f1", 1)
	waitCounterFile(t, m, "f1", last+2)
	if got, _ := f1.Status(ctx, "l1"); got.PID != rec.PID || got.State != sandboxapi.StateRunning {
		t.Fatalf("the launch in the fork: %+v, want pid %d running", got, rec.PID)
	}
	if n := len(model.ledger()); n != 2 {
		t.Fatalf("the model server saw %d calls, want 2", n)
	}
}
