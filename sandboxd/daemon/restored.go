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
	seq := -1
	if ans.Record != nil {
		seq = ans.Record.Pauses.Seq
	}
	d.mu.Lock()
	effs, err := d.core.Step(TakeOverAsked{Launch: r.LaunchID, PauseSeq: r.PauseSeq, Identity: r.Identity,
		Verdict: ans.Verdict, Reason: ans.Reason, RecordSeq: seq})
	wait := d.tookOver
	d.mu.Unlock()
	if err != nil {
		return sandboxapi.PauseResult{}, nil, err
	}
	for _, e := range effs {
		switch e := e.(type) {
		case WaitTakeOver:
			return sandboxapi.PauseResult{}, wait, nil
		case AnswerAgain:
			return e.Result, nil, nil
		}
	}
	rep, err := d.launches.Continue(ctx, r.LaunchID)
	d.mu.Lock()
	effs, _ = d.core.Step(TakeOverDone{Launch: r.LaunchID, PauseSeq: r.PauseSeq, Identity: r.Identity, Result: rep, Err: err,
		Holding: d.holdingLocked()})
	close(d.tookOver)
	d.tookOver = make(chan struct{})
	d.doLocked(ctx, effs) // notify a prepare that found it resuming; release or drop the relay's hold
	d.mu.Unlock()
	if err != nil {
		return rep, nil, err
	}
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
	effs, _ := d.core.Step(Collected{Launch: r.LaunchID, Holding: d.holdingLocked()})
	d.doLocked(context.Background(), effs)
	d.mu.Unlock()
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

// Repoint re-points the relay (ErrNoRelay without one) and, with
// r.Branch, sets its branch label (an invalid one is a bad request);
// while a checkpoint is open it is refused with ErrAdmissionClosed: the
// take-over it belongs to waits for the resume.
func (d *Daemon) Repoint(r sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	if d.cfg.Relay == nil {
		return sandboxapi.RelayStatus{}, ErrNoRelay
	}
	if r.Branch != nil {
		if err := r.Branch.Validate(); err != nil {
			return d.cfg.Relay.Status(), fmt.Errorf("daemon: relay_repoint: branch: %w", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.core.Step(RepointAsked{URL: r.URL, Generation: r.Generation}); err != nil {
		return d.cfg.Relay.Status(), err
	}
	return d.cfg.Relay.RepointBranch(r.URL, r.Generation, r.Branch)
}
