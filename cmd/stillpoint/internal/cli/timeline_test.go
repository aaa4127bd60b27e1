package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestTimelineOfALiveRun: a bridge and three members, each with its role's
// permissions, take a checkpoint;
// then, while `stillpoint timeline --follow` watches, fail one (a member's
// export fails) and release. The live view prints each checkpoint's block once
// it is over and ends after --until-idle; the text, JSON and HTML views of
// the finished run name every member of every phase with its latency, the
// failing member's error code and each outcome.
func TestTimelineOfALiveRun(t *testing.T) {
	const run = "tl-live"
	env := jstest.Start(t, jstest.WithRoles())
	hs := membertest.StartMembers(t, env.As(embedded.RoleAgent), run, 3, membertest.Options{Episodes: 1})
	nc, js := env.As(embedded.RoleBridge).Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: bus, PhaseTimeout: 30 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatal(err)
	}
	// Every view reads the stream as the controller's role does.
	asController := []string{"--nats-url", env.URL, "--nkey", embedded.SeedFile(env.AuthDir, embedded.RoleController)}
	tl := func(args ...string) []string {
		return append(append(slices.Clone(asController), "timeline", "--run", run), args...)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	// The live view, off a terminal: plain key=value lines, then blocks.
	// It reads c1 from the stream, then follows c2 and the release as
	// they happen.
	live := &jstest.Buffer{}
	followed := make(chan int, 1)
	go func() {
		followed <- Main(tl("--follow", "--until-idle", "10s"), live, live)
	}()
	poll.Wait(t, 30*time.Second, "the live view to print c1 once its resume is answered", func() bool {
		return strings.Contains(live.String(), "checkpoint c1  COMMITTED")
	})
	hs[2].Participant.FailExport(errors.New("disk full"))
	if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusFailed {
		t.Fatalf("c2: %+v %v, want failed", res, err)
	}
	hs[2].Participant.FailExport(nil)
	if op, err := b.Release(t.Context(), bridgeapi.ReleaseRequest{KeepLatest: 1}); err != nil || op.Status != bridgeapi.StatusCompleted {
		t.Fatalf("release: %+v %v", op, err)
	}
	select {
	case code := <-followed:
		if code != 0 {
			t.Fatalf("timeline --follow exited %d:\n%s", code, live.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("timeline --follow --until-idle 10s did not end:\n%s", live.String())
	}
	out := live.String()
	for _, want := range []string{"op=c1 kind=checkpoint phase=prepare seq=1 epoch=0 members=3 event=published",
		"op=c1 kind=checkpoint phase=prepare seq=1 event=answered acks=3 failed=0",
		"checkpoint c1  COMMITTED", "checkpoint c2  FAILED", "ERROR export_failed", "release release-"} {
		if !strings.Contains(out, want) {
			t.Errorf("the live view lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "checkpoint c1  COMMITTED") > strings.Index(out, "op=c2 ") {
		t.Errorf("c1's block came after c2 began, not when c1 was over:\n%s", out)
	}

	// The finished run: text.
	var text, errb bytes.Buffer
	if code := Main(tl(), &text, &errb); code != 0 {
		t.Fatalf("timeline exited %d: %s", code, errb.String())
	}
	for _, h := range hs {
		if n := strings.Count(text.String(), string(h.Name)+" "); n < 7 {
			t.Errorf("%s is on %d lines of the text, want one per phase of c1 (3), c2 (3) and the release", h.Name, n)
		}
	}
	for _, want := range []string{"outcome: COMMITTED", "outcome: FAILED", "ERROR export_failed", "disk full", " ms ok"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the text lacks %q:\n%s", want, text.String())
		}
	}

	// JSON: one object per operation.
	var js1 bytes.Buffer
	if code := Main(tl("--json"), &js1, &errb); code != 0 {
		t.Fatalf("timeline --json exited %d: %s", code, errb.String())
	}
	dec := json.NewDecoder(&js1)
	var ops []timeline.Op
	for dec.More() {
		var op timeline.Op
		if err := dec.Decode(&op); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if len(ops) != 3 || ops[0].ID != "c1" || ops[1].Status != timeline.StatusFailed || ops[2].Kind != timeline.KindRelease {
		t.Fatalf("JSON ops %+v", ops)
	}
	for _, p := range ops[0].Phases {
		if len(p.Acks) != 3 {
			t.Errorf("c1 %s has %d acks", p.Phase, len(p.Acks))
		}
		for _, a := range p.Acks {
			// A resume's acks are not stored: the bridge's record of them
			// says who answered, without a time each (PROTOCOL §3).
			heard := p.Phase == events.PhaseResume
			if a.Status != timeline.AckOK || !heard && (a.LatencyMS == nil || *a.LatencyMS < 0) {
				t.Errorf("c1 %s ack %+v", p.Phase, a)
			}
		}
		if hd := p.Heard; p.Phase == events.PhaseResume && (hd == nil || hd.Answered != 3 || hd.Expected != 3 || hd.MaxMS < hd.P50MS) {
			t.Errorf("c1 resume: the record of its acks %+v", hd)
		}
	}
	// The failing member's export_failed is there; a member whose commit was
	// still running when the abort's resume came answers stale_checkpoint
	// (late, and only on a busy machine), and no member fails otherwise.
	var failed []timeline.Ack
	exportFailed := 0
	for _, p := range ops[1].Phases {
		for _, a := range p.Acks {
			switch {
			case a.Status != timeline.AckError:
			case a.Member == hs[2].Name && a.Code == "export_failed":
				exportFailed++
			case a.Code == "stale_checkpoint" && a.Late:
			default:
				failed = append(failed, a)
			}
		}
	}
	if exportFailed != 1 || len(failed) != 0 {
		t.Errorf("c2: %d export_failed acks of %s (want 1), other failed acks %+v (want none)", exportFailed, hs[2].Name, failed)
	}

	// The old view stays: one line per event.
	var evs bytes.Buffer
	if code := Main(tl("--events", "--checkpoint", "c1"), &evs, &errb); code != 0 {
		t.Fatalf("timeline --events exited %d: %s", code, errb.String())
	}
	if !strings.Contains(evs.String(), "checkpoint c1 committed") || strings.Contains(evs.String(), "c2") {
		t.Errorf("--events --checkpoint c1 printed:\n%s", evs.String())
	}

	// HTML: one file, the model inside.
	page := filepath.Join(t.TempDir(), "tl.html")
	if code := Main(tl("--html", page), &bytes.Buffer{}, &errb); code != 0 {
		t.Fatalf("timeline --html exited %d: %s", code, errb.String())
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if !strings.Contains(string(html), `"member":"`+string(h.Name)+`"`) {
			t.Errorf("the page's data lacks %s", h.Name)
		}
	}
}

// TestTimelineUntilIdleNeedsFollow: --until-idle alone is a usage error.
func TestTimelineUntilIdleNeedsFollow(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"timeline", "--run", "r", "--until-idle", "1s"}, &out, &errb); code != ExitUsage {
		t.Fatalf("exit %d, want %d: %s", code, ExitUsage, errb.String())
	}
}

// TestLiveViewOnATerminal: on a terminal the live view keeps one status
// line counting the open phase's acks, rewritten in place, and clears it
// before it prints the block of an operation that is over.
func TestLiveViewOnATerminal(t *testing.T) {
	var out bytes.Buffer
	v := &liveView{g: &globals{stdout: &out}, f: timelineFlags{run: "r1"}, term: true}
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	var seq uint64
	add := func(after time.Duration, d events.Data) {
		t.Helper()
		seq++
		t0 = t0.Add(after)
		if err := v.add(timeline.Entry{StreamSeq: seq, Time: t0, Data: d}); err != nil {
			t.Fatal(err)
		}
	}
	members := []events.Member{"agent.a1", "agent.a2"}
	h := func(seq uint64) events.PhaseHeader {
		return events.PhaseHeader{Run: "r1", CheckpointID: "c1", Seq: seq, Deadline: t0.Add(time.Minute), Members: members}
	}
	ack := func(seq uint64, m events.Member) events.ResumeAck {
		return events.ResumeAck{AckHeader: events.AckHeader{Run: "r1", Member: m, Seq: seq, CheckpointID: "c1", OK: true, State: events.StateIdle}}
	}
	add(0, events.Prepare{PhaseHeader: h(1)})
	if !strings.HasSuffix(out.String(), "\r\x1b[Kcheckpoint c1: prepare seq 1, 0/2 acks") {
		t.Fatalf("no status line after the prepare: %q", out.String())
	}
	add(time.Millisecond, events.PrepareAck{AckHeader: ack(1, "agent.a1").AckHeader, Ready: true})
	if !strings.HasSuffix(out.String(), "\r\x1b[Kcheckpoint c1: prepare seq 1, 1/2 acks") {
		t.Fatalf("the status line does not count the ack: %q", out.String())
	}
	add(time.Millisecond, events.PrepareAck{AckHeader: ack(1, "agent.a2").AckHeader, Ready: true})
	add(time.Millisecond, events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: "r1", CheckpointID: "c1"}, Members: members})
	if strings.Contains(out.String(), "COMMITTED") {
		t.Fatal("printed before the resume that follows")
	}
	add(time.Millisecond, events.Resume{PhaseHeader: h(2)})
	add(time.Millisecond, ack(2, "agent.a1"))
	add(time.Millisecond, ack(2, "agent.a2"))
	s := out.String()
	i := strings.Index(s, "checkpoint c1  COMMITTED")
	if i < 0 || !strings.HasSuffix(s[:i], "\r\x1b[K") {
		t.Fatalf("the block is not printed on a cleared line: %q", s)
	}
	if strings.Contains(s[i:], "acks\r") || strings.Contains(s[i:], "/2 acks") {
		t.Errorf("a status line after the operation was over: %q", s[i:])
	}
	if strings.Contains(s, "event=published") {
		t.Errorf("key=value lines on a terminal: %q", s)
	}
}
