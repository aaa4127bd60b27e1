package member

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Where a member's manifest in a checkpoint is (PROTOCOL §3, §5 restore):
// in its once-only commit ack, sp.<run>.ack.<commit seq>.commit.<member>,
// while the stream keeps it; in the checkpoint's member list (schema 2)
// after; in its own sp_manifests key in a schema-1 run.

// FindManifest returns the member manifest of m in checkpoint of run.
// With commitSeq (the checkpoint's commit phase sequence, which a restore
// names) it direct-gets m's commit ack of that sequence; without it, or
// when that ack is gone from the stream, it reads the checkpoint manifest:
// schema 2 gives the commit sequence and then the member list (verified
// by its digest), schema 1 the member's own key. A checkpoint manifest of
// another schema is refused, naming it. A manifest that names another
// member, checkpoint or run, an ack that does not decode, and a list that
// does not match its digest return ErrCorruptRecords; no manifest (m
// exported nothing, or was not in the commit) ErrNoManifest.
func FindManifest(ctx context.Context, bus *jetstream.Bus, run, checkpoint string, m events.Member, commitSeq uint64) (events.MemberManifest, error) {
	return findManifest(ctx, bus, run, checkpoint, m, commitSeq, false)
}

// findManifest is FindManifest; with acksKept (a restore's SourceAcks: the
// stream keeps every ack of that commit) a member with no ack there has no
// manifest, and no list is read: a fresh member that was not in the commit
// (a sandbox forked under a new name) costs one direct get.
func findManifest(ctx context.Context, bus *jetstream.Bus, run, checkpoint string, m events.Member, commitSeq uint64, acksKept bool) (events.MemberManifest, error) {
	if commitSeq > 0 {
		man, found, err := manifestInAck(ctx, bus.Stream, run, checkpoint, m, commitSeq)
		if found || err != nil {
			return man, err
		}
		if acksKept {
			return events.MemberManifest{}, fmt.Errorf("%w: no commit ack of %s on %s, and the stream keeps them all", ErrNoManifest, m,
				events.AckSubject(run, commitSeq, events.PhaseCommit, m))
		}
	}
	cm, err := readCheckpoint(ctx, bus.Manifests, run, checkpoint)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		// No checkpoint manifest (yet, or any more): a schema-1 member key
		// is all there may be.
		return GetManifest(ctx, bus.Manifests, run, checkpoint, m)
	}
	if err != nil {
		return events.MemberManifest{}, err
	}
	if cm.Schema == events.CheckpointSchemaInline {
		return GetManifest(ctx, bus.Manifests, run, checkpoint, m)
	}
	if cm.Aborted || cm.MemberList == nil {
		return events.MemberManifest{}, fmt.Errorf("%w: checkpoint %s of run %s was aborted", ErrNoManifest, checkpoint, run)
	}
	if commitSeq == 0 || commitSeq != cm.CommitSeq {
		man, found, err := manifestInAck(ctx, bus.Stream, run, checkpoint, m, cm.CommitSeq)
		if found || err != nil {
			return man, err
		}
	}
	// The ack is older than the stream keeps: the member list has it.
	if bus.Checkpoints == nil {
		return events.MemberManifest{}, fmt.Errorf("member: member list of %s: no %s store opened", checkpoint, jetstream.BucketCheckpoints)
	}
	if err := cm.LoadMembers(func(o string) ([]byte, error) { return bus.Checkpoints.GetBytes(ctx, o) }); err != nil {
		if errors.Is(err, events.ErrMismatch) || errors.Is(err, natsjs.ErrObjectNotFound) || errors.Is(err, events.ErrInvalid) || errors.Is(err, events.ErrMalformed) {
			return events.MemberManifest{}, fmt.Errorf("%w: %w", ErrCorruptRecords, err)
		}
		return events.MemberManifest{}, fmt.Errorf("member: %w", err)
	}
	for _, mm := range cm.Members {
		if mm.Member == m {
			return mm, nil
		}
	}
	return events.MemberManifest{}, fmt.Errorf("%w: %s is not in the member list of %s", ErrNoManifest, m, checkpoint)
}

// readCheckpoint reads and validates the checkpoint manifest of id, as
// the KV holds it (members not loaded). A missing key is
// natsjs.ErrKeyNotFound.
func readCheckpoint(ctx context.Context, kv natsjs.KeyValue, run, id string) (events.CheckpointManifest, error) {
	key := events.ManifestKey(run, id)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return events.CheckpointManifest{}, err
	}
	if err != nil {
		return events.CheckpointManifest{}, fmt.Errorf("member: read checkpoint manifest %s: %w", key, err)
	}
	var cm events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &cm); err != nil {
		return events.CheckpointManifest{}, fmt.Errorf("%w: checkpoint manifest %s: %v", ErrCorruptRecords, key, err)
	}
	if err := cm.Validate(); err != nil {
		return events.CheckpointManifest{}, fmt.Errorf("member: checkpoint manifest %s: %w", key, err)
	}
	return cm, nil
}

// AckGetter reads the last message of a subject from the stream: a
// natsjs.Stream is one.
type AckGetter interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error)
}

// manifestInAck reads m's commit ack of commitSeq: found is false when the
// stream has none (never sent, or aged out).
func manifestInAck(ctx context.Context, stream AckGetter, run, checkpoint string, m events.Member, commitSeq uint64) (events.MemberManifest, bool, error) {
	subject := events.AckSubject(run, commitSeq, events.PhaseCommit, m)
	ack, found, err := recordedAck(ctx, stream, subject)
	if !found || err != nil {
		return events.MemberManifest{}, found, err
	}
	if ack.Run != run || ack.CheckpointID != checkpoint || ack.Member != m {
		return events.MemberManifest{}, true, fmt.Errorf("%w: the ack on %s is %s's of %s/%s", ErrCorruptRecords, subject, ack.Member, ack.Run, ack.CheckpointID)
	}
	if !ack.OK {
		return events.MemberManifest{}, true, fmt.Errorf("%w: the commit ack on %s is a failure", ErrNoManifest, subject)
	}
	if ack.Manifest == nil {
		return events.MemberManifest{}, true, fmt.Errorf("%w: the commit ack on %s exported nothing", ErrNoManifest, subject)
	}
	return *ack.Manifest, true, nil
}

// recordedAck reads and decodes the commit ack on subject; found is false
// when there is none. An ack that does not decode (a forged one, a
// manifest of another member) is ErrCorruptRecords.
func recordedAck(ctx context.Context, stream AckGetter, subject string) (events.CommitAck, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	raw, err := stream.GetLastMsgForSubject(cctx, subject)
	cancel()
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return events.CommitAck{}, false, nil
	}
	if err != nil {
		return events.CommitAck{}, false, fmt.Errorf("member: read %s: %w", subject, err)
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return events.CommitAck{}, true, fmt.Errorf("%w: %s: %w", ErrCorruptRecords, subject, err)
	}
	ack, ok := d.(events.CommitAck)
	if !ok {
		return events.CommitAck{}, true, fmt.Errorf("%w: %s holds a %s, not a commit ack", ErrCorruptRecords, subject, d.Type())
	}
	return ack, true, nil
}

// CheckRecorded compares the commit ack recorded first on subject (the
// once-only ack a repeat was refused for) with want, the manifest this
// process would have sent (nil: none): another manifest there returns
// ErrManifestExists naming every difference, as a schema-1 member's
// second create of its key did.
func CheckRecorded(ctx context.Context, stream AckGetter, subject string, want *events.MemberManifest) error {
	ack, found, err := recordedAck(ctx, stream, subject)
	if err != nil || !found {
		return err
	}
	if !ack.OK {
		return nil // a failure answered first; it says so itself
	}
	var have events.MemberManifest
	var w events.MemberManifest
	if ack.Manifest != nil {
		have = *ack.Manifest
	}
	if want != nil {
		w = *want
	}
	if (ack.Manifest == nil) != (want == nil) {
		return fmt.Errorf("%w: %s: recorded %d records, this process exported %d", ErrManifestExists, subject, have.Count, w.Count)
	}
	if diff := manifestDiff(have, w); diff != "" {
		return fmt.Errorf("%w: %s: %s", ErrManifestExists, subject, diff)
	}
	return nil
}
