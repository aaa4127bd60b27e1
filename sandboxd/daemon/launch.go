package daemon

import (
	"context"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// This file is the daemon's admission of a launch: refused while a
// checkpoint is open, and recorded (its episode, its no-pause) before
// the supervisor starts it.

// launch starts a launch for episode, unless a checkpoint is open. Its
// episode (and its no-pause) is recorded before the supervisor starts it,
// so that no crash leaves a launch that a retire cannot find (PROTOCOL §7,
// invariant 6), and put back as it was if the supervisor refuses it. A
// launch whose id is taken, or being launched, is refused before anything
// is recorded: the launch that has the id stays as it was. A prepare that
// comes while it registers waits for it; an attempt retired meanwhile is
// stopped again at once.
func (d *Daemon) launch(ctx context.Context, episode string, nopause bool, edits []string, branch *sandboxapi.BranchLabel, spec sandboxd.Spec) (sandboxapi.Record, error) {
	if err := spec.Validate(); err != nil {
		return sandboxapi.Record{}, err // before anything is recorded under its id
	}
	var ep events.Episode
	if episode != "" {
		var err error
		if ep, err = events.ParseEpisode(episode); err != nil {
			return sandboxapi.Record{}, err
		}
		if err := d.member.Admit(ep); err != nil {
			return sandboxapi.Record{}, err
		}
	}
	d.mu.Lock()
	effs, err := d.core.Step(LaunchAsked{Launch: spec.ID, Episode: episode, Holding: d.holdingLocked(), Edits: edits, Branch: branch})
	if err == nil {
		d.doLocked(ctx, effs) // the relay's drop and label, with admission
	}
	d.mu.Unlock()
	if err != nil {
		return sandboxapi.Record{}, err
	}
	defer d.step(ctx, LaunchRegistered{Launch: spec.ID})
	if _, err := d.launches.Status(spec.ID); err == nil {
		return sandboxapi.Record{}, fmt.Errorf("%w: %s", sandboxd.ErrLaunchExists, spec.ID)
	}
	undo, err := d.recordLaunch(spec.ID, episode, nopause)
	if err != nil {
		return sandboxapi.Record{}, err
	}
	rec, err := d.launches.Launch(ctx, spec)
	if err != nil && rec.ID == "" {
		undo() // refused (the supervisor's zero record): it leaves nothing
		return rec, err
	}
	if err != nil {
		return rec, err // it started and failed, and is recorded so
	}
	if episode != "" {
		if err := d.member.Admit(ep); err != nil {
			// Retired while it registered: a retired attempt leaves nothing.
			_, _ = d.launches.Cancel(context.WithoutCancel(ctx), spec.ID)
			return rec, err
		}
	}
	return rec, nil
}

// recordLaunch records launch id's episode (persisted) and whether
// checkpoints leave it alone, and returns the func that puts back what
// was recorded before.
func (d *Daemon) recordLaunch(id, episode string, nopause bool) (undo func(), err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	effs, _ := d.core.Step(LaunchRecorded{Launch: id, Episode: episode, NoPause: nopause})
	if err := d.saveLocked(effs); err != nil {
		_, _ = d.core.Step(LaunchUnrecorded{Launch: id})
		return nil, err
	}
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		effs, _ := d.core.Step(LaunchUnrecorded{Launch: id, Save: true})
		if err := d.saveLocked(effs); err != nil {
			d.log.Warn().Err(err).Str("launch", id).Msg("forget the episode of a refused launch")
		}
	}, nil
}

// saveLocked writes the episodes file of the SaveEpisodes among effs.
// d.mu is held.
func (d *Daemon) saveLocked(effs []Effect) error {
	for _, e := range effs {
		if s, ok := e.(SaveEpisodes); ok {
			if err := d.saveEpisodes(s.Episodes); err != nil {
				return err
			}
		}
	}
	return nil
}
