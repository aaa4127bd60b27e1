package agent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// TrajectoryReader is what the agent calls on a sandbox's daemon to read
// its relay's capture file. sandboxclient.Client implements it.
type TrajectoryReader interface {
	Trajectory(ctx context.Context, r sandboxapi.TrajectoryRequest) (sandboxapi.TrajectoryChunk, error)
}

var _ TrajectoryReader = (*sandboxclient.Client)(nil)

// MaxTrajectoryBytes bounds a capture file the agent reads: the file is
// in the sandbox, where the workload may have made it any size.
const MaxTrajectoryBytes = 256 << 20

// TrajectoryObject is the name of a rollout's trajectory in the
// trajectories store.
func TrajectoryObject(run, rollout string) string { return run + "/" + rollout + ".jsonl" }

// OwnTrajectories opens agent m's own trajectories store in run,
// events.TrajectoriesBucket, asking the run's bridge to make it if it does
// not exist yet (jetstream.OwnStore): an agent with credentials of its own
// stores its rollouts' trajectories there, makes no stream itself, and may
// write no other agent's store, nor the shared BucketTrajectories.
func OwnTrajectories(ctx context.Context, js natsjs.JetStream, run string, m events.Member) (natsjs.ObjectStore, error) {
	store, err := jetstream.OwnStore(ctx, js, run, m, jetstream.StoreTrajectories)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	return store, nil
}

// trajectoryStore returns the store the agent stores r's trajectory in
// and the bucket a result names for it: its own (OwnTrajectories, opened
// once) when it connects with credentials of its own, whose user may write
// no other store; the shared BucketTrajectories ("") otherwise. An open
// the bus does not answer is tried again, as putTrajectory's store, until
// r ends.
func (a *Agent) trajectoryStore(r *run) (natsjs.ObjectStore, string, error) {
	if !a.ownCreds() {
		return a.cfg.Bus.Trajectories, "", nil
	}
	bucket := events.TrajectoriesBucket(a.cfg.Run, a.name)
	a.trajMu.Lock()
	store := a.trajectories
	a.trajMu.Unlock()
	for try := 1; store == nil; try++ {
		var err error
		store, err = OwnTrajectories(r.ctx, a.cfg.JS, a.cfg.Run, a.name)
		if err != nil && (r.ctx.Err() != nil || !busUnanswered(err)) {
			return nil, "", err
		}
		if err != nil {
			r.log.Warn().Err(err).Int("try", try).Str("bucket", bucket).Msg("the agent's own trajectories store did not open; trying again")
			backOff(r, try)
		}
	}
	a.trajMu.Lock()
	defer a.trajMu.Unlock()
	if a.trajectories == nil {
		a.trajectories = store
	}
	return a.trajectories, bucket, nil
}

// collectTrajectory reads the capture file of the rollout's sandbox (its
// relay's: every model call of every launch of the rollout, those a
// restore kept included) once the harness has finished, checks it, and
// stores it in the agent's trajectories store (trajectoryStore), which no
// release deletes: trajectories are results.
// A rollout whose launches all called the model directly has none, and
// why says so; a file the workload spoiled (it does not read) is no
// trajectory either, and why names the fault. An error is a sandbox or a
// bus that failed: the rollout's infrastructure, never its result.
func (a *Agent) collectTrajectory(r *run, bm agentapi.Bookmark) (ref *agentapi.TrajectoryRef, why string, err error) {
	captured := false
	for _, l := range bm.Launches {
		captured = captured || l.Captured
	}
	if !captured {
		return nil, "no launch called the model through a capturing relay: the owner runs none", nil
	}
	for _, l := range bm.Launches {
		if !l.Captured {
			// Its calls are in no file: a trajectory without them would
			// not be the rollout's.
			return nil, fmt.Sprintf("launch %s called the model directly (its sandbox's daemon runs no relay): its calls are not captured", l.ID), nil
		}
	}
	a.mu.Lock()
	sandbox := cmp.Or(r.sandbox, bm.Sandbox)
	a.mu.Unlock()
	dc, err := a.sandbox(sandbox)
	if err != nil {
		return nil, "", err
	}
	tr, ok := dc.(TrajectoryReader)
	if !ok {
		return nil, "the sandbox's daemon client reads no trajectory", nil
	}
	var data bytes.Buffer
	size := int64(-1)
	var capture sandboxapi.CaptureStatus
	for off := int64(0); size < 0 || off < size; {
		ch, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.TrajectoryChunk, error) {
			return tr.Trajectory(ctx, sandboxapi.TrajectoryRequest{Offset: off})
		})
		if err != nil {
			return nil, "", fmt.Errorf("agent: %s: reading the trajectory of sandbox %s at %d: %w", r.key, sandbox, off, err)
		}
		if size < 0 {
			size, capture = ch.Size, ch.Capture
			if size > MaxTrajectoryBytes {
				return nil, fmt.Sprintf("the capture file is %d bytes, over the %d a trajectory may have", size, MaxTrajectoryBytes), nil
			}
		}
		if ch.Offset != off || (len(ch.Data) == 0 && off < size) {
			return nil, fmt.Sprintf("the capture file changed while it was read (%d bytes at %d of %d)", len(ch.Data), ch.Offset, size), nil
		}
		data.Write(ch.Data)
		off += int64(len(ch.Data))
	}
	if data.Len() > int(size) {
		data.Truncate(int(size))
	}
	x, err := trajectory.Read(bytes.NewReader(data.Bytes()))
	if err != nil {
		return nil, "the capture file does not read: " + err.Error(), nil
	}
	if capture.Errors > 0 {
		r.log.Error().Str("sandbox", sandbox).Uint64("errors", capture.Errors).Str("last_error", capture.LastError).
			Msg("the relay failed to capture some model calls: the trajectory ends before them")
	}
	store, bucket, err := a.trajectoryStore(r)
	if err != nil {
		return nil, "", fmt.Errorf("agent: %s: storing the trajectory: %w", r.key, err)
	}
	sum := sha256.Sum256(data.Bytes())
	rep := trajectory.Check(x.Calls())
	ref = &agentapi.TrajectoryRef{Object: TrajectoryObject(a.cfg.Run, bm.Rollout), Bucket: bucket, SHA256: hex.EncodeToString(sum[:]),
		Bytes: int64(data.Len()), Calls: x.Len(), Check: rep, Branch: trajectoryBranch(bm, x.Calls())}
	meta := natsjs.ObjectMeta{Name: ref.Object, Description: "trajectory of rollout " + bm.Rollout, Metadata: trajectoryMeta(r, bm, ref, nil)}
	if err := putTrajectory(r.ctx, r.log, store, meta, data.Bytes(), func(try int) { backOff(r, try) }); err != nil {
		return nil, "", fmt.Errorf("agent: %s: storing the trajectory: %w", r.key, err)
	}
	ev := r.log.Info()
	if !rep.OK() {
		ev = r.log.Warn().Strs("problems", rep.Problems)
	}
	ev.Str("object", ref.Object).Str("bucket", cmp.Or(ref.Bucket, jetstream.BucketTrajectories)).Int("calls", ref.Calls).Int64("bytes", ref.Bytes).Int("token_breaks", rep.TokenBreaks).
		Bool("ok", rep.OK()).Msg("trajectory stored")
	return ref, "", nil
}

// putTrajectory stores data as the object meta names, again after wait
// while the bus does not answer (a server restarting, a stream between
// leaders): a fault of the bus is never the rollout's result. A failed Put
// purges the chunks it sent, and the next replaces whatever of it landed;
// the sandbox holds the file meanwhile. Any other error, or ctx's end,
// returns.
func putTrajectory(ctx context.Context, log zerolog.Logger, store natsjs.ObjectStore, meta natsjs.ObjectMeta, data []byte, wait func(try int)) error {
	for try := 1; ; try++ {
		_, err := store.Put(ctx, meta, bytes.NewReader(data))
		if err == nil || ctx.Err() != nil || !busUnanswered(err) {
			return err
		}
		log.Warn().Err(err).Int("try", try).Str("object", meta.Name).Msg("the trajectories store did not answer; storing the trajectory again")
		wait(try)
	}
}

// noteVerdict adds the grade to the stored trajectory's metadata, where
// `stillpoint trajectory` reads the reward. The trajectory stands without
// it: a failure is logged. It is noted only in the store this agent
// writes (trajectoryStore): one a bookmark of an earlier build names in
// the shared store, which an agent's own user may not write, stays
// without it.
func (a *Agent) noteVerdict(r *run, bm agentapi.Bookmark, ref *agentapi.TrajectoryRef, verdict []byte) {
	meta := natsjs.ObjectMeta{Name: ref.Object, Description: "trajectory of rollout " + bm.Rollout, Metadata: trajectoryMeta(r, bm, ref, verdict)}
	store, bucket, err := a.trajectoryStore(r)
	if err == nil && bucket != ref.Bucket {
		err = fmt.Errorf("the trajectory is in %s, and this agent writes %s",
			cmp.Or(ref.Bucket, jetstream.BucketTrajectories), cmp.Or(bucket, jetstream.BucketTrajectories))
	}
	if err == nil {
		err = store.UpdateMeta(r.ctx, ref.Object, meta)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("object", ref.Object).Msg("the trajectory's metadata does not name its verdict")
	}
}

// trajectoryMeta is the metadata of r's stored trajectory ref: its rollout,
// episode, calls and digest, a branch's header (ref.Branch, as JSON) and
// the verdict once graded.
func trajectoryMeta(r *run, bm agentapi.Bookmark, ref *agentapi.TrajectoryRef, verdict []byte) map[string]string {
	m := map[string]string{"rollout": bm.Rollout, "episode": r.key, "calls": strconv.Itoa(ref.Calls), "sha256": ref.SHA256}
	if ref.Branch != nil {
		if b, err := json.Marshal(ref.Branch); err == nil {
			m["branch"] = string(b)
		}
	}
	if verdict != nil {
		m["verdict"] = string(verdict)
	}
	return m
}
