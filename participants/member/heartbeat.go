package member

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// register announces the member and puts its heartbeat; it returns the
// TTL of its heartbeat: its kind's (PROTOCOL §3, Liveness), the max age of
// its kind's bucket (jetstream.HeartbeatBucket), which no put overrides. A
// sandbox daemon's heartbeat is in a bucket of its own
// (jetstream.BucketDaemons), and it announces nothing on the stream: its
// credentials publish nothing there (docs/PERMISSIONS.md).
func (m *Member) register(ctx context.Context) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	kind := m.cfg.Member.Kind()
	// A user that reads no stream info (Config.NoPull) cannot read the
	// bucket's TTL, which its info holds: it takes the topology's default.
	ttl := jetstream.DefaultHeartbeatTTL(jetstream.HeartbeatBucket(kind))
	if !m.cfg.NoPull {
		st, err := m.cfg.Bus.Heartbeats(kind).Status(cctx)
		if err != nil {
			return 0, fmt.Errorf("member: heartbeats bucket: %w", err)
		}
		ttl = jetstream.HeartbeatTTL(st)
	}
	// Joined first: the audit log shows the member before anything can be
	// addressed to it through its heartbeat.
	if kind != events.KindSandbox {
		joined := events.MemberJoined{Run: m.cfg.Run, Member: m.cfg.Member, Capabilities: m.info.Capabilities,
			Host: m.info.Host, PID: m.info.PID}
		if err := m.announce(cctx, joined); err != nil {
			return 0, err
		}
	}
	if err := m.putInfo(cctx); err != nil {
		return 0, err
	}
	return ttl, nil
}

func (m *Member) announce(ctx context.Context, d events.Data) error {
	msg, err := events.Marshal(m.cfg.Member, d)
	if err != nil {
		return fmt.Errorf("member: %s: %w", d.Type(), err)
	}
	if _, err := jetstream.PublishDedup(ctx, m.cfg.JS, msg); err != nil {
		return fmt.Errorf("member: %s: %w", d.Type(), err)
	}
	return nil
}

func (m *Member) putInfo(ctx context.Context) error {
	m.infoMu.Lock()
	defer m.infoMu.Unlock()
	m.info.Heartbeat = m.cfg.Now().UTC()
	b, err := json.Marshal(m.info)
	if err != nil {
		return fmt.Errorf("member: heartbeat: %w", err)
	}
	// No put carries a TTL of its own (Nats-TTL): the bucket refuses one,
	// and its max age is the TTL.
	key, bucket := events.MemberKey(m.cfg.Run, m.cfg.Member), jetstream.HeartbeatBucket(m.cfg.Member.Kind())
	write := func(expect int64) (uint64, error) {
		return jetstream.KVWrite(ctx, m.cfg.JS, bucket, key, b, expect)
	}
	if m.infoRev == 0 {
		// Registration takes the name, from any earlier process of it.
		rev, err := write(-1)
		if err != nil {
			return fmt.Errorf("member: heartbeat: %w", err)
		}
		m.infoRev = rev
		return nil
	}
	// Later beats only update what this process wrote: if another process
	// of the same name has written since, this one was replaced.
	rev, err := write(int64(m.infoRev))
	if err == nil {
		m.infoRev = rev
		return nil
	}
	value, revision, gerr := jetstream.KVGet(ctx, m.cfg.JS, bucket, key)
	switch {
	case errors.Is(gerr, natsjs.ErrKeyNotFound):
		// Expired (a long pause, a slow heartbeat): register again.
		rev, err = write(0)
	case gerr != nil:
		return fmt.Errorf("member: heartbeat: %w", gerr)
	default:
		// Only another process of this member replaces it: a value that
		// names no instance (a foreign write of the key) is written over.
		var other events.MemberInfo
		if json.Unmarshal(value, &other) == nil && other.Instance != "" && other.Instance != m.info.Instance {
			return fmt.Errorf("%w: instance %s holds %s", ErrReplaced, other.Instance, key)
		}
		rev, err = write(int64(revision))
	}
	if err != nil {
		return fmt.Errorf("member: heartbeat: %w", err)
	}
	m.infoRev = rev
	return nil
}

// heartbeat refreshes the member's key every third of its TTL.
func (m *Member) heartbeat(ctx context.Context, ttl time.Duration) {
	every := ttl / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			err := m.putInfo(cctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				m.heartbeatFailed(err)
			}
		}
	}
}

// heartbeatFailed logs a failed heartbeat; a replaced member tells its
// loop to stop.
func (m *Member) heartbeatFailed(err error) {
	if errors.Is(err, ErrReplaced) {
		select {
		case m.consumeErrs <- err:
		default:
		}
		return
	}
	m.log.Warn().Err(err).Msg("heartbeat")
}

// leave publishes MemberLeft (a sandbox daemon announces nothing: see
// register). On a clean stop it deletes the heartbeat key, unless another
// process has written it since; a superseded member leaves the key to
// expire, since it may now belong to its successor.
func (m *Member) leave(ctx context.Context, reason string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	epoch, _ := m.machine.Epoch()
	if m.cfg.Member.Kind() != events.KindSandbox {
		if err := m.announce(cctx, events.MemberLeft{Run: m.cfg.Run, Member: m.cfg.Member, Epoch: epoch, Reason: reason}); err != nil {
			m.log.Warn().Err(err).Msg("leave")
		}
	}
	if reason == "superseded" {
		return
	}
	m.infoMu.Lock()
	rev := m.infoRev
	m.infoMu.Unlock()
	err := jetstream.KVDelete(cctx, m.cfg.JS, jetstream.HeartbeatBucket(m.cfg.Member.Kind()), events.MemberKey(m.cfg.Run, m.cfg.Member), rev)
	if err != nil {
		m.log.Debug().Err(err).Msg("heartbeat key left in place")
	}
}
