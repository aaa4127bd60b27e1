package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The errors of the restore endpoints, answered with their sandboxapi
// codes.
var (
	// ErrIdentityChanged is returned by Resume and Collect when the
	// supervisor named is not the one that owns the launch now.
	ErrIdentityChanged = errors.New("daemon: supervisor identity changed")
	// ErrNotHolding is returned by Resume for a launch that is not in the
	// pause named, and by Collect for one that has not ended.
	ErrNotHolding = errors.New("daemon: launch not held in that pause")
	// ErrNoRelay is returned by the relay endpoints of a daemon that runs
	// no model relay.
	ErrNoRelay = errors.New("daemon: no model relay")
)

// Held tells whether launch r.LaunchID is still the one a checkpoint left
// held: owned by supervisor r.Identity and paused in pause r.PauseSeq
// (PROTOCOL §6, Restore of a process-keeping snapshot). It answers every
// such question with a verdict; its error is only for a request it cannot
// read.
func (d *Daemon) Held(r sandboxapi.HeldRequest) (sandboxapi.HeldAnswer, error) {
	if err := sandboxd.ValidateID(r.LaunchID); err != nil {
		return sandboxapi.HeldAnswer{}, err
	}
	ans := sandboxapi.HeldAnswer{Identity: d.identityFor(r.LaunchID)}
	if d.cfg.Relay != nil {
		ans.Relay = d.cfg.Relay.Status()
	}
	ans.Wall, ans.Uptime = d.sup.Clocks()
	rec, err := d.launches.Status(r.LaunchID)
	switch {
	case errors.Is(err, sandboxd.ErrUnknownLaunch):
		ans.Verdict, ans.Reason = sandboxapi.VerdictUnknownLaunch, "no launch "+r.LaunchID+" in this sandbox"
		return ans, nil
	case err != nil:
		return ans, err
	}
	ans.Record = &rec
	ans.Verdict, ans.Reason = verdict(r, ans.Identity, rec)
	return ans, nil
}

// verdict decides a HeldRequest on the supervisor's identity and the
// launch's record.
func verdict(r sandboxapi.HeldRequest, self sandboxapi.Identity, rec sandboxapi.Record) (sandboxapi.Verdict, string) {
	switch {
	case self != r.Identity:
		return sandboxapi.VerdictIdentityChanged, fmt.Sprintf("the supervisor is %s, not %s", self, r.Identity)
	case rec.Supervisor != r.Identity:
		return sandboxapi.VerdictIdentityChanged, fmt.Sprintf("the launch belongs to supervisor %s, not %s", rec.Supervisor, r.Identity)
	case rec.State == sandboxapi.StateEnded:
		out := "ended"
		if rec.Receipt != nil {
			out = rec.Receipt.Outcome.String()
		}
		return sandboxapi.VerdictEnded, fmt.Sprintf("the launch ended (%s) in pause %d", out, rec.Pauses.Seq)
	case rec.State != sandboxapi.StatePaused:
		return sandboxapi.VerdictNotHolding, fmt.Sprintf("the launch is %s, not paused", rec.State)
	case rec.Pauses.Seq != r.PauseSeq:
		return sandboxapi.VerdictNotHolding, fmt.Sprintf("the launch is in pause %d, not %d", rec.Pauses.Seq, r.PauseSeq)
	}
	return sandboxapi.VerdictHeld, fmt.Sprintf("held in pause %d (%s, frozen %v) by %s", rec.Pauses.Seq, rec.Pauses.Mode, rec.Pauses.Frozen, self)
}

// takenOver is a take-over that continued a launch: what a Resume asked
// and what it answered, answered again to the same Resume.
type takenOver struct {
	seq      int
	identity sandboxapi.Identity
	rep      sandboxapi.PauseResult
}

// Resume takes over a launch a checkpoint from before a restore left held:
// if it is still held in pause r.PauseSeq by supervisor r.Identity, it is
// continued (thawed, when the hold froze it), and the relay is released
// unless a checkpoint is open (that checkpoint's resume releases it then).
// Re-point the relay first: a call it re-sends then goes to the new model
// server. A continue that fails has stopped the launch: the calls the relay
// held for it are dropped, never sent on. Resume is idempotent: the same
// request again, once the launch is continued (and not paused since), is
// answered as the first was; while the first is still continuing, it waits
// for it.
func (d *Daemon) Resume(ctx context.Context, r sandboxapi.ResumeRequest) (sandboxapi.PauseResult, error) {
	for {
		rep, wait, err := d.resume(ctx, r)
		if wait == nil {
			return rep, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return sandboxapi.PauseResult{}, fmt.Errorf("%w: launch %s is being resumed: %w", ErrNotHolding, r.LaunchID, context.Cause(ctx))
		}
	}
}

// resume is one try of Resume: wait, when not nil, is closed when the
// take-over of the same launch in flight is done; ask again then.
func (d *Daemon) resume(ctx context.Context, r sandboxapi.ResumeRequest) (sandboxapi.PauseResult, <-chan struct{}, error) {
	ans, err := d.Held(r)
	if err != nil {
		return sandboxapi.PauseResult{}, nil, err
	}
	d.mu.Lock()
	if ch := d.resuming[r.LaunchID]; ch != nil {
		d.mu.Unlock()
		return sandboxapi.PauseResult{}, ch, nil
	}
	if t, ok := d.taken[r.LaunchID]; ok && t.seq == r.PauseSeq && t.identity == r.Identity &&
		(ans.Verdict == sandboxapi.VerdictNotHolding || ans.Verdict == sandboxapi.VerdictEnded) && ans.Record != nil && ans.Record.Pauses.Seq == r.PauseSeq {
		// Continued by the same take-over, and not paused since (running, or
		// ended after it): an answer the agent did not get (its request
		// timed out), answered again.
		d.mu.Unlock()
		return t.rep, nil, nil
	}
	d.mu.Unlock()
	switch ans.Verdict {
	case sandboxapi.VerdictHeld:
	case sandboxapi.VerdictUnknownLaunch:
		return sandboxapi.PauseResult{}, nil, fmt.Errorf("%w: %s", sandboxd.ErrUnknownLaunch, r.LaunchID)
	case sandboxapi.VerdictIdentityChanged:
		return sandboxapi.PauseResult{}, nil, fmt.Errorf("%w: %s", ErrIdentityChanged, ans.Reason)
	default:
		return sandboxapi.PauseResult{}, nil, fmt.Errorf("%w: %s", ErrNotHolding, ans.Reason)
	}
	d.mu.Lock()
	if d.open != "" {
		open := d.open
		d.mu.Unlock()
		return sandboxapi.PauseResult{}, nil, fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, open)
	}
	if ch := d.resuming[r.LaunchID]; ch != nil {
		d.mu.Unlock()
		return sandboxapi.PauseResult{}, ch, nil
	}
	// From here until the continue is done a prepare counts the launch as
	// a blocker and leaves it alone: it would otherwise take the held
	// launch for one its agent paused, or pause it under a mark that the
	// end of the take-over then clears.
	done := make(chan struct{})
	d.resuming[r.LaunchID] = done
	old := d.paused[r.LaunchID]
	d.mu.Unlock()
	rep, err := d.launches.Continue(ctx, r.LaunchID)
	d.mu.Lock()
	delete(d.resuming, r.LaunchID)
	close(done)
	if old != "" && d.paused[r.LaunchID] == old {
		delete(d.paused, r.LaunchID) // the snapshot's checkpoint's mark, if this daemon had it
	}
	if err == nil {
		d.taken[r.LaunchID] = takenOver{seq: r.PauseSeq, identity: r.Identity, rep: rep}
	}
	d.mu.Unlock()
	if d.member != nil {
		d.member.Notify() // a prepare that found it resuming asks again
	}
	if err != nil {
		// The continue failed and stopped the launch: what the relay held
		// for its harness must not reach the model server.
		d.dropAfterRestore(r.LaunchID, "take-over failed: "+err.Error())
		return rep, nil, err
	}
	d.releaseAfterRestore(r.LaunchID, "taken over")
	d.log.Warn().Str("launch", r.LaunchID).Int("pause_seq", r.PauseSeq).Bool("frozen", rep.Frozen).
		Stringer("identity", rep.Identity).Msg("resumed a restored launch in place")
	return rep, nil, nil
}

// Collect returns the receipt of a launch that ended while a checkpoint
// held it, owned by supervisor identity, and releases the relay as Resume
// does.
func (d *Daemon) Collect(r sandboxapi.CollectRequest) (sandboxapi.Receipt, error) {
	if err := sandboxd.ValidateID(r.LaunchID); err != nil {
		return sandboxapi.Receipt{}, err
	}
	rec, err := d.launches.Status(r.LaunchID)
	if err != nil {
		return sandboxapi.Receipt{}, err
	}
	switch self := d.identityFor(r.LaunchID); {
	case self != r.Identity || rec.Supervisor != r.Identity:
		return sandboxapi.Receipt{}, fmt.Errorf("%w: the launch belongs to %s under supervisor %s, not %s", ErrIdentityChanged, rec.Supervisor, self, r.Identity)
	case rec.State != sandboxapi.StateEnded || rec.Receipt == nil:
		return sandboxapi.Receipt{}, fmt.Errorf("%w: launch %s is %s, not ended", ErrNotHolding, r.LaunchID, rec.State)
	}
	d.mu.Lock()
	if d.open == "" {
		delete(d.paused, r.LaunchID) // no checkpoint of this daemon's is open: the mark is a restored one's
	}
	d.mu.Unlock()
	d.releaseAfterRestore(r.LaunchID, "collected")
	return *rec.Receipt, nil
}

// identityFor is the supervisor identity the restore endpoints see for
// launch id: the supervisor's, unless Failpoints.IdentityPrefix says
// otherwise.
func (d *Daemon) identityFor(id string) sandboxapi.Identity {
	self := d.sup.Identity()
	if p := d.cfg.Failpoints.IdentityPrefix; p != "" && strings.HasPrefix(id, p) {
		d.log.Warn().Str("launch", id).Msg("failpoint: the launch reads as owned by another supervisor")
		self.Start++
	}
	return self
}

// releaseAfterRestore releases the relay a restored snapshot kept held,
// unless a checkpoint of this daemon's is open: that checkpoint's resume
// releases it then, as if its prepare had taken the hold.
func (d *Daemon) releaseAfterRestore(id, why string) {
	if d.cfg.Relay == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.cfg.Relay.Holding() {
		return
	}
	if d.open != "" {
		d.heldBy = d.open
		return
	}
	d.log.Info().Str("launch", id).Str("why", why).Msg("releasing the model relay")
	d.cfg.Relay.Release()
}

// dropAfterRestore drops what the relay a restored snapshot kept holds
// (Relay.Drop): the launch it held them for is gone. A checkpoint of this
// daemon's that is open holds the relay again at once, and its resume
// releases it.
func (d *Daemon) dropAfterRestore(id, why string) {
	if d.cfg.Relay == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.cfg.Relay.Holding() {
		return
	}
	d.log.Warn().Str("launch", id).Str("why", why).Msg("dropping the calls a restore left held")
	d.cfg.Relay.Drop(why)
	if d.open != "" {
		d.cfg.Relay.Hold()
		d.heldBy = d.open
	}
}

// RelayStatus returns the relay's status (ErrNoRelay without one).
func (d *Daemon) RelayStatus() (sandboxapi.RelayStatus, error) {
	if d.cfg.Relay == nil {
		return sandboxapi.RelayStatus{}, ErrNoRelay
	}
	return d.cfg.Relay.Status(), nil
}

// ErrNoCapture is returned by the trajectory endpoint of a daemon whose
// relay captures nothing.
var ErrNoCapture = errors.New("daemon: the relay captures no model calls")

// Trajectory reads a chunk of the relay's capture file (ErrNoRelay
// without a relay, ErrNoCapture without a capture).
func (d *Daemon) Trajectory(r sandboxapi.TrajectoryRequest) (sandboxapi.TrajectoryChunk, error) {
	if d.cfg.Relay == nil {
		return sandboxapi.TrajectoryChunk{}, ErrNoRelay
	}
	path := d.cfg.Relay.CapturePath()
	if path == "" {
		return sandboxapi.TrajectoryChunk{}, ErrNoCapture
	}
	if r.Offset < 0 {
		return sandboxapi.TrajectoryChunk{}, fmt.Errorf("%w: offset %d", jetstream.ErrBadRequest, r.Offset)
	}
	limit := r.Limit
	if limit <= 0 || limit > sandboxapi.MaxTrajectoryChunk {
		limit = sandboxapi.MaxTrajectoryChunk
	}
	st := d.cfg.Relay.Status()
	// Not through a link the workload put in its place: the relay's file
	// or nothing.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return sandboxapi.TrajectoryChunk{}, fmt.Errorf("daemon: the capture file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return sandboxapi.TrajectoryChunk{}, fmt.Errorf("daemon: the capture file: %w", err)
	}
	out := sandboxapi.TrajectoryChunk{Offset: r.Offset, Size: fi.Size()}
	if st.Capture != nil {
		out.Capture = *st.Capture
	}
	if r.Offset >= fi.Size() {
		return out, nil
	}
	buf := make([]byte, min(int64(limit), fi.Size()-r.Offset))
	n, err := f.ReadAt(buf, r.Offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return sandboxapi.TrajectoryChunk{}, fmt.Errorf("daemon: the capture file: %w", err)
	}
	out.Data = buf[:n]
	return out, nil
}

// Repoint re-points the relay (ErrNoRelay without one); while a
// checkpoint is open it is refused with ErrAdmissionClosed: the take-over
// it belongs to waits for the resume.
func (d *Daemon) Repoint(r sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	if d.cfg.Relay == nil {
		return sandboxapi.RelayStatus{}, ErrNoRelay
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open != "" {
		return d.cfg.Relay.Status(), fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, d.open)
	}
	return d.cfg.Relay.Repoint(r.URL, r.Generation)
}
