package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

const ackSubject = "sp.run1.ack.1.prepare.agent.a"

func ackMsg(subject, id string) *nats.Msg {
	m := nats.NewMsg(subject)
	if id != "" {
		m.Header.Set(natsjs.MsgIDHeader, id)
	}
	m.Data = []byte(`{"member":"agent.a","seq":1,"ok":true}`)
	return m
}

// subjectCount returns how many messages the stream holds on subject.
func subjectCount(ctx context.Context, t *testing.T, s natsjs.Stream, subject string) uint64 {
	t.Helper()
	info, err := s.Info(ctx, natsjs.WithSubjectFilter(subject))
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Subjects[subject]
}

func TestPublishOnce(t *testing.T) {
	env := jstest.Start(t, jstest.WithTopology(jetstream.Topology{Duplicates: time.Second}))
	checkPublishOnce(testContext(t), t, env)
}

// checkPublishOnce is the once-only ack of PROTOCOL.md §3: a member acks a phase once, inside the
// duplicate window and after it.
func checkPublishOnce(ctx context.Context, t *testing.T, env *jstest.Env) {
	t.Helper()
	msg := ackMsg(ackSubject, "run1/1/prepare/agent.a")

	first, err := jetstream.PublishOnce(ctx, env.JS, msg)
	if err != nil {
		t.Fatalf("first PublishOnce: %v", err)
	}
	published := time.Now()
	if first.Duplicate || first.Sequence == 0 {
		t.Fatalf("first PublishOnce ack %+v, want a new message", first)
	}
	if len(msg.Header) != 1 {
		t.Errorf("PublishOnce changed the caller's message headers: %v", msg.Header)
	}

	// Inside the duplicate window.
	ack, err := jetstream.PublishOnce(ctx, env.JS, msg)
	if !errors.Is(err, jetstream.ErrAlreadyDone) {
		t.Fatalf("PublishOnce inside the duplicate window: ack %+v, err %v; want ErrAlreadyDone", ack, err)
	}
	if ack != nil && (!ack.Duplicate || ack.Sequence != first.Sequence) {
		t.Errorf("PublishOnce inside the duplicate window: ack %+v, want a duplicate of sequence %d", ack, first.Sequence)
	}
	t.Logf("inside the window: ack %+v, err %v", ack, err)

	// Wait out the window, then keep repeating until the server no longer deduplicates by
	// Nats-Msg-Id: every repeat must still be refused, now by the expected subject sequence.
	window := env.Topology.Duplicates
	timer := time.NewTimer(time.Until(published.Add(window)))
	select {
	case <-timer.C:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	poll.Wait(t, 5*window, fmt.Sprintf("the server to stop deduplicating after the %s window", window), func() bool {
		ack, err = jetstream.PublishOnce(ctx, env.JS, msg)
		if !errors.Is(err, jetstream.ErrAlreadyDone) {
			t.Fatalf("PublishOnce after the duplicate window: ack %+v, err %v; want ErrAlreadyDone", ack, err)
		}
		return jetstream.IsWrongLastSequence(err)
	})
	if ack != nil {
		t.Errorf("wrong-last-sequence refusal came with ack %+v, want nil", ack)
	}
	t.Logf("after the window (%s later): %v", time.Since(published).Round(time.Millisecond), err)

	if n := subjectCount(ctx, t, env.Bus.Stream, ackSubject); n != 1 {
		t.Errorf("stream holds %d messages on %s, want 1", n, ackSubject)
	}

	// Another member's ack of the same phase is its own subject.
	if _, err := jetstream.PublishOnce(ctx, env.JS, ackMsg("sp.run1.ack.1.prepare.agent.b", "run1/1/prepare/agent.b")); err != nil {
		t.Errorf("PublishOnce for another member: %v", err)
	}
}

func TestPublishOnceWithoutMsgID(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	if _, err := jetstream.PublishOnce(ctx, env.JS, ackMsg(ackSubject, "")); err != nil {
		t.Fatal(err)
	}
	ack, err := jetstream.PublishOnce(ctx, env.JS, ackMsg(ackSubject, ""))
	if !errors.Is(err, jetstream.ErrAlreadyDone) || !jetstream.IsWrongLastSequence(err) || ack != nil {
		t.Fatalf("second PublishOnce without a msg id: ack %+v, err %v; want ErrAlreadyDone from a wrong last sequence", ack, err)
	}
	if n := subjectCount(ctx, t, env.Bus.Stream, ackSubject); n != 1 {
		t.Errorf("stream holds %d messages on %s, want 1", n, ackSubject)
	}
}

func TestPublishDedup(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	const subject = "sp.run1.phase.prepare"

	first, err := jetstream.PublishDedup(ctx, env.JS, ackMsg(subject, "evt-1"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate {
		t.Fatalf("first PublishDedup ack %+v: duplicate", first)
	}
	second, err := jetstream.PublishDedup(ctx, env.JS, ackMsg(subject, "evt-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !second.Duplicate || second.Sequence != first.Sequence {
		t.Errorf("second PublishDedup ack %+v, want a duplicate of sequence %d", second, first.Sequence)
	}
	if n := subjectCount(ctx, t, env.Bus.Stream, subject); n != 1 {
		t.Errorf("stream holds %d messages on %s, want 1", n, subject)
	}

	if _, err := jetstream.PublishDedup(ctx, env.JS, ackMsg(subject, "")); !errors.Is(err, jetstream.ErrNoMsgID) {
		t.Errorf("PublishDedup without a msg id: %v, want ErrNoMsgID", err)
	}
	if _, err := jetstream.PublishDedup(ctx, env.JS, nil); err == nil {
		t.Error("PublishDedup(nil): got nil error")
	}
}

func TestIsWrongLastSequence(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("x"), false},
		{&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequence}, true},
		{&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequenceConstant}, true},
		{&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamNotFound}, false},
	} {
		if got := jetstream.IsWrongLastSequence(tc.err); got != tc.want {
			t.Errorf("IsWrongLastSequence(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

// TestPublishOnceBurst: many goroutines publish once each on one connection
// whose outstanding async acks are capped far below the burst, so most
// publishes wait for room first (or, after the stall wait, publish
// synchronously). Every subject ends with exactly one message and a second
// round reports every ack as done.
func TestPublishOnceBurst(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	js, err := natsjs.New(env.Conn, natsjs.WithPublishAsyncMaxPending(2))
	if err != nil {
		t.Fatal(err)
	}
	const burst = 40
	subject := func(i int) string { return "sp.run1.ack.9.prepare.agent.b" + strconv.Itoa(i) }
	round := func() []error {
		errs := make([]error, burst)
		var wg sync.WaitGroup
		for i := range burst {
			wg.Go(func() { _, errs[i] = jetstream.PublishOnce(ctx, js, ackMsg(subject(i), "")) })
		}
		wg.Wait()
		return errs
	}
	for i, err := range round() {
		if err != nil {
			t.Errorf("member %d: first PublishOnce: %v", i, err)
		}
	}
	for i, err := range round() {
		if !errors.Is(err, jetstream.ErrAlreadyDone) {
			t.Errorf("member %d: second PublishOnce: %v, want ErrAlreadyDone", i, err)
		}
	}
	for i := range burst {
		if n := subjectCount(ctx, t, env.Bus.Stream, subject(i)); n != 1 {
			t.Errorf("%s holds %d messages, want 1", subject(i), n)
		}
	}
}

// TestPublishOnceCancelled: a context already done publishes nothing.
func TestPublishOnceCancelled(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	const subject = "sp.run1.ack.9.prepare.agent.cancelled"
	if _, err := jetstream.PublishOnce(ctx, env.JS, ackMsg(subject, "")); !errors.Is(err, context.Canceled) {
		t.Fatalf("PublishOnce with a cancelled context: %v, want context.Canceled", err)
	}
	if n := subjectCount(testContext(t), t, env.Bus.Stream, subject); n != 0 {
		t.Fatalf("%s holds %d messages after a cancelled publish, want 0", subject, n)
	}
}

// A replicated stream answers a publish whose Nats-Msg-Id it is still
// storing with 10158; IsDuplicateInProcess tells it from the other
// refusals, wrapped or not.
func TestIsDuplicateInProcess(t *testing.T) {
	inProcess := &natsjs.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}
	if !jetstream.IsDuplicateInProcess(inProcess) || !jetstream.IsDuplicateInProcess(fmt.Errorf("publish: %w", inProcess)) {
		t.Fatal("10158 not told")
	}
	wrongLast := &natsjs.APIError{Code: 400, ErrorCode: natsjs.JSErrCodeStreamWrongLastSequence}
	if jetstream.IsDuplicateInProcess(wrongLast) || jetstream.IsDuplicateInProcess(errors.New("10158")) || jetstream.IsDuplicateInProcess(nil) {
		t.Fatal("another error told as 10158")
	}
}
