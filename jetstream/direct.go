package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// DirectGet returns the last message on subject (which may end in a wildcard) of stream, by the
// subject form of a direct get, $JS.API.DIRECT.GET.<stream>.<subject>, on nc. A user whose
// permissions name the subjects it may read (a sandbox's own, docs/PERMISSIONS.md) can make it
// and nothing else: a natsjs.Stream reads the stream's info first (STREAM.INFO, which lists every
// subject of the stream), and the request form of a direct get carries its subject in the body,
// where no permission sees it. The stream must allow direct gets (STILLPOINT and every KV bucket
// do). It returns an error wrapping natsjs.ErrMsgNotFound when the subject has no message. A
// context without a deadline waits at most directGetTimeout.
func DirectGet(ctx context.Context, nc *nats.Conn, stream, subject string) (*natsjs.RawStreamMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directGetTimeout)
		defer cancel()
	}
	api := "$JS.API.DIRECT.GET." + stream + "." + subject
	r, err := nc.RequestWithContext(ctx, api, nil)
	if err != nil {
		return nil, fmt.Errorf("jetstream: direct get of %s from %s: %w", subject, stream, err)
	}
	msg, err := directMsg(r)
	if err != nil {
		return nil, fmt.Errorf("jetstream: direct get of %s from %s: %w", subject, stream, err)
	}
	return msg, nil
}

// directGetTimeout bounds a DirectGet whose context has no deadline.
const directGetTimeout = 10 * time.Second

// directMsg reads a direct get's reply: the message with the stream's
// headers saying where it was stored, or a status without one (404: none).
func directMsg(r *nats.Msg) (*natsjs.RawStreamMsg, error) {
	if len(r.Data) == 0 {
		switch status := r.Header.Get("Status"); status {
		case "":
		case "404":
			return nil, natsjs.ErrMsgNotFound
		default:
			return nil, fmt.Errorf("status %s: %s", status, r.Header.Get("Description"))
		}
	}
	seq, err := strconv.ParseUint(r.Header.Get(natsjs.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("no stream sequence in the reply: %w", err)
	}
	subject := r.Header.Get(natsjs.SubjectHeader)
	if subject == "" {
		return nil, errors.New("no subject in the reply")
	}
	at, _ := time.Parse(time.RFC3339Nano, r.Header.Get(natsjs.TimeStampHeaer))
	return &natsjs.RawStreamMsg{Subject: subject, Sequence: seq, Header: r.Header, Data: r.Data, Time: at}, nil
}

// Direct reads the last message of a subject of one stream by DirectGet: what a member whose user
// has no stream info reads the stream with, in place of a natsjs.Stream.
type Direct struct {
	// Conn is the connection the gets go on.
	Conn *nats.Conn
	// Stream is the stream's name.
	Stream string
}

// GetLastMsgForSubject returns the last message on subject (DirectGet), as natsjs.Stream's does.
func (d Direct) GetLastMsgForSubject(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error) {
	return DirectGet(ctx, d.Conn, d.Stream, subject)
}
