package invariant

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// A release deletes a checkpoint's records, member list and key while the
// checker may be reading them: a read that finds them missing or partial
// is a verdict only from a view no release is changing.

// acrossRelease tells whether a release may have deleted checkpoint id
// (committed at phase sequence commitSeq) under its verification: the
// run's last release phase came after that commit and does not keep id.
// It waits, for readFor at most, until that release has an outcome on the
// stream, so that what is read next is what it left. Every read is from
// the stream's leader. An error reading says no: the verdict stands.
func acrossRelease(ctx context.Context, bus *jetstream.Bus, run, id string, commitSeq uint64) bool {
	nc := bus.JS.Conn()
	raw, err := jetstream.LeaderLastMsg(ctx, nc, jetstream.StreamName, events.PhaseSubject(run, events.PhaseRelease))
	if err != nil {
		return false // none, or unreadable
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	rel, ok := d.(events.Release)
	if err != nil || !ok || rel.Seq <= commitSeq || slices.Contains(rel.Keep, id) {
		return false
	}
	ended := func() bool {
		for _, t := range []events.Type{events.TypeReleaseCompleted, events.TypeReleaseFailed} {
			o, err := jetstream.LeaderLastMsg(ctx, nc, jetstream.StreamName, events.OutcomeSubject(run, t))
			if err == nil && o.Sequence > raw.Sequence {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(readFor)
	for !ended() {
		if time.Now().After(deadline) {
			return true // still running: read what it left so far
		}
		select {
		case <-ctx.Done():
			return true
		case <-time.After(releasePoll):
		}
	}
	return true
}

// releasePoll is how often acrossRelease looks for the release's outcome.
const releasePoll = 200 * time.Millisecond

// afterRelease verifies checkpoint id again once a release ran across its
// first verification: its key, read from the stream's leader (a replica
// may not have applied the release's writes yet), gone or marked released
// is a checkpoint released, no violation; one the release left unmarked
// is verified whole again, and what does not verify then is one.
func afterRelease(ctx context.Context, bus *jetstream.Bus, run, id string) verified {
	bucket := bus.Manifests.Bucket()
	raw, err := jetstream.LeaderLastMsg(ctx, bus.JS.Conn(), "KV_"+bucket, "$KV."+bucket+"."+events.ManifestKey(run, id))
	switch {
	case errors.Is(err, natsjs.ErrMsgNotFound) || err == nil && jetstream.KVRemoved(raw.Header):
		return verified{gone: true}
	case err == nil:
		var m events.CheckpointManifest
		if json.Unmarshal(raw.Data, &m) == nil && m.Released != nil {
			return verified{marked: true}
		}
	}
	return verify(ctx, bus, run, id)
}
