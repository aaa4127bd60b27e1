package bridge

import (
	"context"
	"errors"
	"slices"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// The controller's operations. Each one validates its request, takes the
// run's operation slot, finishes what a previous bridge left open, reads
// what its ask needs, and drives the machine. A failure of the fleet is
// not an error: the result has Status failed and names every blocker and
// member. Errors are for what kept the bridge from deciding (a bad
// request, another operation open, the bus).

// errNoResult is a machine that finished without a result: a bug.
var errNoResult = errors.New("bridge: the operation ended without a result")

// begin returns the machine to ask: the held checkpoint's, which refuses
// every other operation, or a fresh one once whatever was left open is
// finished, with the run's state. The caller holds the operation slot.
func (b *Bridge) begin(ctx context.Context) (*machine.Machine, runState, error) {
	b.mu.Lock()
	h := b.held
	b.mu.Unlock()
	if h != nil {
		return h.m, runState{}, nil
	}
	st, err := b.recoverLocked(ctx)
	return machine.New(b.machineConfig()), st, err
}

// ask drives m with in and returns its finish, or the error that ended it.
func (b *Bridge) ask(ctx context.Context, m *machine.Machine, in machine.Input) (machine.Finish, error) {
	fin, err := b.drive(ctx, m, in)
	if err = firstErr(err, fin.Err); err != nil {
		return fin, err
	}
	if fin.Checkpoint == nil && fin.Restore == nil && fin.Op == nil && fin.Branch == nil {
		return fin, errNoResult
	}
	return fin, nil
}

// Checkpoint takes a checkpoint: prepare, commit, manifest, LATEST,
// outcome, resume (PROTOCOL §5, Bridge rules).
func (b *Bridge) Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.unlock()
	m, st, err := b.begin(ctx)
	if err != nil {
		return nil, err
	}
	v := st.view()
	if m.State() == machine.StateIdle { // a held machine refuses before it reads a view
		// Without an id the machine makes a new one, which has no key.
		if req.ID != "" {
			if v.Manifest, _, err = b.manifest(ctx, req.ID); err != nil {
				return nil, err
			}
		}
		if v.Manifest == nil {
			if v.Previous, err = b.previous(ctx); err != nil {
				return nil, err
			}
			var infos []events.MemberInfo
			if v.Members, infos, err = b.liveMembers(ctx, st.epoch, false); err != nil {
				return nil, err
			}
			if out := machine.AwaitingRejoin(v.Previous, infos, req.Unfinished); len(out) > 0 {
				v.Members = slices.DeleteFunc(v.Members, func(m events.Member) bool { return out[m] })
				b.log.Info().Strs("left_out", sortedNames(out)).
					Msg("fresh members whose names hold unfinished progress in LATEST are left out: they wait for a rejoin")
			}
			v.Instances = make(map[events.Member]string, len(infos))
			for _, info := range infos {
				v.Instances[info.Member] = info.Instance
			}
		}
	}
	fin, err := b.ask(ctx, m, machine.CheckpointAsked{Request: req, View: v})
	if err != nil {
		return nil, err
	}
	b.logCheckpoint(fin.Checkpoint)
	return fin.Checkpoint, nil
}

// Commit commits the checkpoint held prepared by a Checkpoint with Hold;
// stop parks the fleet as in CheckpointRequest.
func (b *Bridge) Commit(ctx context.Context, id string, stop bool) (*bridgeapi.CheckpointResult, error) {
	return b.unhold(ctx, id, func(v machine.View) machine.Input { return machine.CommitAsked{ID: id, Stop: stop, View: v} })
}

// Abort abandons the held checkpoint id: abort marker, outcome, resume.
func (b *Bridge) Abort(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	return b.unhold(ctx, id, func(v machine.View) machine.Input { return machine.AbortAsked{ID: id, View: v} })
}

// unhold asks the held checkpoint's machine to commit or abort it, with
// the run's last phase: another bridge that published since fences it.
func (b *Bridge) unhold(ctx context.Context, id string, ask func(machine.View) machine.Input) (*bridgeapi.CheckpointResult, error) {
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.unlock()
	m, v := machine.New(b.machineConfig()), machine.View{} // an idle machine holds nothing
	if b.heldID() == id {
		// Read first: a read that fails leaves the checkpoint held. No
		// renew comes in between, as this holds the operation slot.
		st, err := b.state(ctx)
		if err != nil {
			return nil, err
		}
		if h := b.takeHold(); h != nil {
			m, v = h.m, st.view()
		}
	}
	fin, err := b.ask(ctx, m, ask(v))
	if err != nil {
		return nil, err
	}
	b.logCheckpoint(fin.Checkpoint)
	return fin.Checkpoint, nil
}

func (b *Bridge) logCheckpoint(r *bridgeapi.CheckpointResult) {
	ev := b.log.Info()
	if r.Status == bridgeapi.StatusFailed {
		ev = b.log.Warn()
		if r.Failure != nil {
			ev = ev.Str("failed_phase", string(r.Failure.Phase)).Str("reason", r.Failure.Reason).Int("failed_members", len(r.Failure.Errors))
		}
	}
	ev.Str("checkpoint", r.CheckpointID).Str("status", r.Status).Int64("prepare_ms", r.PrepareMS).Int64("commit_ms", r.CommitMS).
		Bool("stop", r.Stop).Msg("checkpoint " + r.Status)
}

// Restore restores a committed checkpoint (LATEST by default) into the
// fresh members of the run, opening the next epoch. It is all or none: if
// any member fails, the next attempts of the scope are retired everywhere,
// the fleet resumes and the result is failed; those rollouts then restart
// from their input. Members of the old epoch that are still alive are
// superseded by the new epoch and stop.
func (b *Bridge) Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.unlock()
	m, st, err := b.begin(ctx)
	if err != nil {
		return nil, err
	}
	v := st.view()
	if m.State() == machine.StateIdle {
		if v.Latest, _, err = b.latest(ctx); err != nil {
			return nil, err
		}
		source := req.Source
		if source == "" && v.Latest != nil {
			source = v.Latest.CheckpointID
		}
		if source != "" {
			if v.Manifest, _, err = b.manifest(ctx, source); err != nil {
				return nil, err
			}
		}
		if v.Manifest != nil {
			if v.Sources, err = b.carrySources(ctx, v.Manifest); err != nil {
				return nil, err
			}
		}
		if v.Members, _, err = b.liveMembers(ctx, 0, true); err != nil {
			return nil, err
		}
		if v.StreamMaxAge, err = b.streamMaxAge(ctx); err != nil {
			return nil, err
		}
	}
	fin, err := b.ask(ctx, m, machine.RestoreAsked{Request: req, View: v})
	if err != nil {
		return nil, err
	}
	r := fin.Restore
	b.log.Info().Str("restore", r.RestoreID).Str("source", r.Source).Uint64("epoch", r.Epoch).Str("status", r.Status).
		Int("restored", len(r.Restored)).Int("retired", len(r.Retired)).Msg("restore " + r.Status)
	return r, nil
}

// Retire refuses the given attempts (and earlier ones of the same
// rollouts) on every member from now on and stops their work.
func (b *Bridge) Retire(ctx context.Context, episodes []string) (*bridgeapi.OpResult, error) {
	eps, err := bridgeapi.RetireRequest{Episodes: episodes}.Parse()
	if err != nil {
		return nil, err
	}
	return b.runOp(ctx, func(v machine.View) machine.Input { return machine.RetireAsked{Episodes: eps, View: v} }, false)
}

// Forget drops the refusal marks of rollouts that are finished for good.
func (b *Bridge) Forget(ctx context.Context, rollouts []string) (*bridgeapi.OpResult, error) {
	if err := (bridgeapi.ForgetRequest{Rollouts: rollouts}).Validate(); err != nil {
		return nil, err
	}
	return b.runOp(ctx, func(v machine.View) machine.Input { return machine.ForgetAsked{Rollouts: rollouts, View: v} }, false)
}

// Release asks every member to delete external state (snapshots) that no
// kept checkpoint names, then deletes the manifests and records of every
// checkpoint not kept. A release that keeps nothing is the final release:
// it leaves no manifest, record or LATEST of the run. Abort markers are
// kept by every release, so that an aborted checkpoint can never be
// created later (PROTOCOL §7, invariant 2).
func (b *Bridge) Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return b.runOp(ctx, func(v machine.View) machine.Input { return machine.ReleaseAsked{Request: req, View: v} }, true)
}

// runOp runs a retire, forget or release: to the members of the run's epoch
// (and, for a release, with every checkpoint key).
func (b *Bridge) runOp(ctx context.Context, ask func(machine.View) machine.Input, checkpoints bool) (*bridgeapi.OpResult, error) {
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.unlock()
	m, st, err := b.begin(ctx)
	if err != nil {
		return nil, err
	}
	v := st.view()
	if m.State() == machine.StateIdle {
		if v.Members, _, err = b.liveMembers(ctx, st.epoch, false); err != nil {
			return nil, err
		}
		if checkpoints {
			if v.Checkpoints, err = b.checkpoints(ctx); err != nil {
				return nil, err
			}
		}
	}
	fin, err := b.ask(ctx, m, ask(v))
	if err != nil {
		return nil, err
	}
	r := fin.Op
	b.log.Info().Str("op", r.OpID).Str("status", r.Status).Strs("keep", r.Keep).Strs("deleted", r.Deleted).Msg(string(r.Phase) + " done")
	return r, nil
}

// Status reads the run's state from the bus. What is open comes from the
// machine, fed the open operation's history as recovery would be.
func (b *Bridge) Status(ctx context.Context) (*bridgeapi.Status, error) {
	// What it reports outlives the stream's phases: the head this
	// bridge has still to write is written first.
	b.flushHead(ctx)
	st, err := b.state(ctx)
	if err != nil {
		return nil, err
	}
	s := &bridgeapi.Status{Run: b.cfg.Run, Epoch: st.epoch, Seq: st.seq, Checkpoints: []bridgeapi.CheckpointInfo{},
		Members: []events.MemberInfo{}, Held: b.heldID()}
	if st.last != nil {
		s.LastPhase, s.LastCheckpoint = st.last.Phase(), st.last.Header().CheckpointID
	}
	m, err := b.replay(ctx, st)
	if err != nil {
		return nil, err
	}
	s.Open = m.Open()
	if s.Latest, _, err = b.latest(ctx); err != nil {
		return nil, err
	}
	all, err := b.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range all {
		info := bridgeapi.CheckpointInfo{CheckpointID: c.CheckpointID, Epoch: c.Epoch, Created: c.Created,
			Aborted: c.Aborted, Reason: c.Reason, Continued: len(c.Continued), Restarted: len(c.Restarted), Members: len(c.Members), Stop: c.Stop}
		if c.Released != nil {
			info.Released = c.Released.Op
		}
		s.Checkpoints = append(s.Checkpoints, info)
	}
	_, infos, err := b.liveMembers(ctx, st.epoch, false)
	if err != nil {
		return nil, err
	}
	if infos != nil {
		s.Members = infos
	}
	return s, nil
}

// sortedNames returns the members of a set, sorted, for a log.
func sortedNames(set map[events.Member]bool) []string {
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, string(m))
	}
	slices.Sort(out)
	return out
}
