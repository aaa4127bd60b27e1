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
func (d *Daemon) launch(ctx context.Context, episode string, nopause bool, spec sandboxd.Spec) (sandboxapi.Record, error) {
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
	if d.open != "" {
		open := d.open
		d.mu.Unlock()
		return sandboxapi.Record{}, fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, open)
	}
	if d.registering[spec.ID] {
		d.mu.Unlock()
		return sandboxapi.Record{}, fmt.Errorf("%w: %s is being launched", sandboxd.ErrLaunchExists, spec.ID)
	}
	d.registering[spec.ID] = true
	if d.cfg.Relay != nil && d.cfg.Relay.Holding() {
		// Admission is open and the relay still holds: a hold the
		// snapshot of a restored sandbox kept, whose held launch its agent
		// abandoned (or never took over). Its calls are dropped, never sent
		// on (the relaunched harness makes its own), and the new launch's
		// calls flow. Decided and done under d.mu, with admission: a
		// prepare's hold cannot come between.
		d.log.Warn().Str("launch", spec.ID).Msg("dropping the calls a restore left held: a new launch")
		d.cfg.Relay.Drop("a new launch " + spec.ID + " replaces the held one")
	}
	if d.cfg.Relay != nil && episode != "" {
		if err := d.cfg.Relay.Label(episode, spec.ID); err != nil {
			d.log.Warn().Err(err).Str("launch", spec.ID).Msg("the launch's model calls are not captured")
		}
	}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.registering, spec.ID)
		d.mu.Unlock()
		d.member.Notify()
	}()
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
	prevEpisode, hadEpisode := d.episodes[id]
	prevNopause := d.nopause[id]
	putBack := func() {
		if hadEpisode {
			d.episodes[id] = prevEpisode
		} else {
			delete(d.episodes, id)
		}
		if !prevNopause {
			delete(d.nopause, id)
		}
	}
	if episode != "" {
		d.episodes[id] = episode
		if err := d.saveEpisodesLocked(); err != nil {
			putBack()
			return nil, err
		}
	}
	if nopause {
		d.nopause[id] = true
	}
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		putBack()
		if episode == "" {
			return
		}
		if err := d.saveEpisodesLocked(); err != nil {
			d.log.Warn().Err(err).Str("launch", id).Msg("forget the episode of a refused launch")
		}
	}, nil
}
