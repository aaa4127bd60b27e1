package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrAlreadyDone is returned (wrapped) by PublishOnce when the subject already holds a
	// message: the server refused the publish as a wrong last subject sequence, or deduplicated
	// it by its Nats-Msg-Id. For an ack subject this means the member has already acked the
	// phase, and the caller treats it as success.
	ErrAlreadyDone = errors.New("jetstream: already done")

	// ErrNoMsgID is returned by PublishDedup when the message has no Nats-Msg-Id header.
	ErrNoMsgID = errors.New("jetstream: message has no " + natsjs.MsgIDHeader + " header")
)

// PublishOnce publishes msg only if its subject holds no message yet: it sends the header
// Nats-Expected-Last-Subject-Sequence: 0, and keeps the Nats-Msg-Id header msg already has.
// This is the once-only ack of PROTOCOL.md §3. The guarantee has no time bound: it holds after
// the duplicate window too, for as long as the stream keeps the first message.
//
// When the subject already holds a message PublishOnce returns an error that matches
// ErrAlreadyDone. Usually the ack is then nil and the error also satisfies IsWrongLastSequence
// (a single-replica stream checks the expected sequence before the Nats-Msg-Id); a replicated
// stream may instead answer a repeat with the same Nats-Msg-Id, inside the duplicate window,
// with a duplicate ack, which is returned along with the error (its Sequence is the first
// message's).
// msg itself is not modified.
func PublishOnce(ctx context.Context, js natsjs.JetStream, msg *nats.Msg) (*natsjs.PubAck, error) {
	out, err := outgoing(js, msg)
	if err != nil {
		return nil, fmt.Errorf("jetstream: publish once: %w", err)
	}
	ack, err := publish(ctx, js, out, natsjs.WithExpectLastSequencePerSubject(0))
	switch {
	case IsWrongLastSequence(err):
		return nil, fmt.Errorf("%w: %s: %w", ErrAlreadyDone, out.Subject, err)
	case err != nil:
		return nil, fmt.Errorf("jetstream: publish once to %s: %w", out.Subject, err)
	case ack.Duplicate:
		return ack, fmt.Errorf("%w: %s: duplicate of %s sequence %d", ErrAlreadyDone, out.Subject, ack.Stream, ack.Sequence)
	}
	return ack, nil
}

// PublishDedup publishes msg, waits for the server's ack and returns it. msg must carry a
// Nats-Msg-Id header (else ErrNoMsgID): a repeat inside the stream's duplicate window is not
// stored again and its ack has Duplicate set and the first message's Sequence. After the window a
// repeat is stored again; use PublishOnce where that must never happen.
func PublishDedup(ctx context.Context, js natsjs.JetStream, msg *nats.Msg) (*natsjs.PubAck, error) {
	out, err := outgoing(js, msg)
	if err != nil {
		return nil, fmt.Errorf("jetstream: publish dedup: %w", err)
	}
	if out.Header.Get(natsjs.MsgIDHeader) == "" {
		return nil, fmt.Errorf("%w (subject %s)", ErrNoMsgID, out.Subject)
	}
	ack, err := publish(ctx, js, out)
	if err != nil {
		return nil, fmt.Errorf("jetstream: publish dedup to %s: %w", out.Subject, err)
	}
	return ack, nil
}

// IsWrongLastSequence reports whether err is the server's "wrong last sequence" refusal of an
// expected-sequence publish: error code 10071, or 10164, which replicated (R>1) streams report
// for the same condition.
func IsWrongLastSequence(err error) bool {
	apiErr, ok := errors.AsType[*natsjs.APIError](err)
	if !ok {
		return false
	}
	return apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant
}

// JSErrCodeDuplicateInProcess is the server's error code (10158, "duplicate message id is in
// process") for a publish whose Nats-Msg-Id is that of a message the stream is still storing: on
// a replicated stream, an earlier attempt of the same publish still being agreed on by its
// replicas. nats.go names no constant for it.
const JSErrCodeDuplicateInProcess natsjs.ErrorCode = 10158

// IsDuplicateInProcess reports whether err is the server's refusal of a publish whose
// Nats-Msg-Id is still being stored (JSErrCodeDuplicateInProcess): the earlier attempt may yet
// land or fail, so the publish is worth making again after a pause, when the stream answers it
// as a duplicate (landed) or stores it (the earlier attempt failed).
func IsDuplicateInProcess(err error) bool {
	apiErr, ok := errors.AsType[*natsjs.APIError](err)
	return ok && apiErr.ErrorCode == JSErrCodeDuplicateInProcess
}

// publishTimeout bounds the wait for a server ack when ctx has no deadline, as a synchronous
// publish of nats.go does.
const publishTimeout = 5 * time.Second

// asyncAckTimeout is the async ack timeout New sets: after it the connection forgets an ack that
// never came. It is the longest wait of publish, far above the callers' own bounds (a member
// waits 10 s for its ack), so that it frees what was abandoned without cutting them short.
const asyncAckTimeout = time.Minute

// maxStallWait is how long publish lets nats.go wait for room among the outstanding acks before
// it publishes synchronously instead (nats.go's own default).
const maxStallWait = 200 * time.Millisecond

// New returns a JetStream context on nc for the publishes of this package: an async publish
// whose ack never comes is failed and forgotten after asyncAckTimeout, so that no pending ack
// stays registered on the connection for good. Every JetStream a participant or the bridge
// publishes acks or outcomes with should come from New.
func New(nc *nats.Conn) (natsjs.JetStream, error) {
	return natsjs.New(nc, natsjs.WithPublishAsyncTimeout(asyncAckTimeout))
}

// publish sends msg and waits for the server's ack. It publishes asynchronously and waits on the
// future: many goroutines of one process publishing at once (a host's members acking a phase)
// then share one reply subscription and pipeline on the connection instead of each paying a
// request round trip of its own. When the connection has too many acks outstanding it falls
// back to a synchronous publish. A ctx that is already done publishes nothing; one that ends
// while the ack is on its way returns ctx's error unless the ack is already in (the message
// may still be stored: callers publish idempotently). The wait is ctx's, at most
// asyncAckTimeout, or publishTimeout when ctx has no deadline. Pass a JetStream made by New so that an ack that never comes is
// also forgotten by the connection.
func publish(ctx context.Context, js natsjs.JetStream, msg *nats.Msg, opts ...natsjs.PublishOpt) (*natsjs.PubAck, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// No deadline: publishTimeout. One past asyncAckTimeout: that, as the
	// connection gives up on the ack then anyway.
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > asyncAckTimeout {
		limit := asyncAckTimeout
		if !ok {
			limit = publishTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	dl, _ := ctx.Deadline()
	// Waiting for room among the outstanding acks must not outlast ctx.
	stall := min(time.Until(dl), maxStallWait)
	if stall <= 0 {
		return nil, context.DeadlineExceeded
	}
	f, err := js.PublishMsgAsync(msg, append(opts[:len(opts):len(opts)], natsjs.WithStallWait(stall))...)
	if errors.Is(err, natsjs.ErrTooManyStalledMsgs) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return js.PublishMsg(ctx, msg, opts...)
	}
	if err != nil {
		return nil, err
	}
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-ctx.Done():
		// An answer that came at the same moment wins over the context.
		select {
		case ack := <-f.Ok():
			return ack, nil
		case err := <-f.Err():
			return nil, err
		default:
			return nil, ctx.Err()
		}
	}
}

// outgoing checks the arguments of a publish and returns a copy of msg that the publish may add
// headers to without touching the caller's message.
func outgoing(js natsjs.JetStream, msg *nats.Msg) (*nats.Msg, error) {
	switch {
	case js == nil:
		return nil, errors.New("nil JetStream")
	case msg == nil:
		return nil, errors.New("nil message")
	case msg.Subject == "":
		return nil, errors.New("message has no subject")
	}
	out := nats.NewMsg(msg.Subject)
	for k, vs := range msg.Header {
		out.Header[k] = append([]string(nil), vs...)
	}
	out.Data = msg.Data
	return out, nil
}
