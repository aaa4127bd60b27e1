package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// LeaderLastMsg returns the last message on subject (a filter may have wildcards) of stream, read
// from the stream's leader by the API's message get ($JS.API.STREAM.MSG.GET.<stream>) on nc, or
// natsjs.ErrMsgNotFound when nothing matches. A direct get, which the streams allow, may be
// answered by any replica, one that has not applied the last writes yet: what a decision rests
// on, such as the fence of the next phase, is read here, so that it holds what this process
// wrote. It waits at most leaderGetTimeout for the answer.
func LeaderLastMsg(ctx context.Context, nc *nats.Conn, stream, subject string) (*natsjs.RawStreamMsg, error) {
	req, _ := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{subject})
	msg, err := leaderGet(ctx, nc, stream, req)
	if err != nil && !errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, fmt.Errorf("jetstream: read the last of %s in %s from the leader: %w", subject, stream, err)
	}
	return msg, err
}

// leaderGetTimeout bounds a LeaderLastMsg, whatever its context's deadline.
const leaderGetTimeout = 10 * time.Second

// jsNoMessageFound is the JetStream API error code of a message get that found none.
const jsNoMessageFound = 10037

// leaderGet sends the message get req to stream's leader and reads its answer.
func leaderGet(ctx context.Context, nc *nats.Conn, stream string, req []byte) (*natsjs.RawStreamMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderGetTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == jsNoMessageFound:
		return nil, natsjs.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("%s (%d)", resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, errors.New("no message in the answer")
	}
	out := &natsjs.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("headers: %w", err)
		}
	}
	return out, nil
}

// KVLeaderValues reads the current values of bucket's keys under filter, keyed by key, as the
// stream's leader holds them: the keys from the stream's info (which the leader answers), each
// key's last message by LeaderLastMsg; deleted and purged keys are left out (KVRemoved). KVValues
// reads through a consumer of one replica, which the server places on any peer of the stream, one
// that has not applied the last writes or that came back and is still catching up: a listing a
// decision rests on, such as what a release deletes, is read here. It makes one request per key.
func KVLeaderValues(ctx context.Context, js natsjs.JetStream, bucket, filter string) (map[string][]byte, error) {
	last, err := KVLeaderLast(ctx, js, bucket, filter)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for k, m := range last {
		if !KVRemoved(m.Header) {
			out[k] = m.Data
		}
	}
	return out, nil
}

// KVLeaderLast reads the last message of each of bucket's keys under filter, keyed by key, as
// KVLeaderValues does, deleted and purged keys included: their delete or purge marker, whose
// headers may say who removed the key. It makes one request per key.
func KVLeaderLast(ctx context.Context, js natsjs.JetStream, bucket, filter string) (map[string]*natsjs.RawStreamMsg, error) {
	stream, prefix := "KV_"+bucket, "$KV."+bucket+"."
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("jetstream: read %s from the leader: %w", bucket, err)
	}
	info, err := s.Info(ctx, natsjs.WithSubjectFilter(prefix+filter))
	if err != nil {
		return nil, fmt.Errorf("jetstream: read %s from the leader: %w", bucket, err)
	}
	out := map[string]*natsjs.RawStreamMsg{}
	for subj := range info.State.Subjects {
		m, err := LeaderLastMsg(ctx, js.Conn(), stream, subj)
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			continue // purged since the info
		}
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(subj, prefix)] = m
	}
	return out, nil
}
