package member

import (
	"context"
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
)

// installRestore reads and verifies the member's own records in the
// source checkpoint and installs those in scope, all or none.
func (m *Member) installRestore(ctx context.Context, e InstallRestore) {
	r := e.Restore
	fail := func(code string, err error) {
		m.post(ctx, RestoreFinished{Op: e.Op, Err: &events.AckError{Code: code, Detail: err.Error()}})
	}
	// An episode the source carries (PROTOCOL §5, Progress only moves
	// forward) comes from the one checkpoint that holds it whole: its
	// records in the source, if any, are left out.
	carried := r.CarriedFrom()
	scope := map[events.Episode]bool{}
	for _, ep := range r.Scope {
		if _, ok := carried[ep]; !ok {
			scope[ep] = true
		}
	}
	keep := func(rec events.Record) bool {
		ep, err := events.ParseEpisode(rec.Key)
		return err != nil || scope[ep]
	}
	// A participant that neither exports nor installs (a sandbox daemon)
	// has no records in any checkpoint and could install none: it reads
	// nothing, so that its credentials need no read of the run's
	// checkpoint manifests or member lists.
	_, exports := m.cfg.Participant.(Exporter)
	if _, installs := m.cfg.Participant.(Installer); !exports && !installs {
		m.post(ctx, RestoreFinished{Op: e.Op})
		return
	}
	// Its own commit ack of the source's commit is its manifest; the
	// member list when the stream no longer has it (FindManifest).
	// A member with a manifest in neither the source nor a carried source
	// exported nothing there and installs nothing (PROTOCOL §5, commit).
	_, records, err := readRecords(ctx, m.cfg.Bus, m.cfg.Run, r.Source, m.cfg.Member, r.SourceCommitSeq, r.SourceAcks, keep)
	held := err == nil
	if errors.Is(err, ErrNoManifest) {
		m.log.Info().Str("checkpoint", r.CheckpointID).Str("source", r.Source).Msg("no records of this member in the source checkpoint")
		err = nil
	}
	for _, c := range r.Carried {
		if err != nil || ctx.Err() != nil {
			break
		}
		in := map[events.Episode]bool{}
		for _, ep := range c.Episodes {
			in[ep] = true
		}
		var more []events.Record
		_, more, err = readRecords(ctx, m.cfg.Bus, m.cfg.Run, c.Source, m.cfg.Member, c.SourceCommitSeq, c.SourceAcks, func(rec events.Record) bool {
			ep, err := events.ParseEpisode(rec.Key)
			return err == nil && in[ep]
		})
		switch {
		case errors.Is(err, ErrNoManifest):
			err = nil // the member held none of them there
		case err == nil:
			held = true
			m.log.Info().Str("checkpoint", r.CheckpointID).Str("carried_from", c.Source).Int("records", len(more)).Msg("records of carried episodes")
			records = append(records, more...)
		default:
			err = fmt.Errorf("carried from %s: %w", c.Source, err)
		}
	}
	if ctx.Err() != nil {
		return
	}
	switch {
	case errors.Is(err, ErrCorruptRecords):
		fail(CodeCorruptRecords, err)
		return
	case err != nil:
		fail(events.CodeInstallFailed, err)
		return
	case !held:
		m.log.Info().Str("checkpoint", r.CheckpointID).Msg("nothing of this member to restore")
		m.post(ctx, RestoreFinished{Op: e.Op})
		return
	}
	inst, ok := m.cfg.Participant.(Installer)
	if !ok {
		if len(records) > 0 {
			fail(events.CodeInstallFailed, fmt.Errorf("member: %d records in scope and the participant cannot install (no Installer)", len(records)))
			return
		}
		m.post(ctx, RestoreFinished{Op: e.Op})
		return
	}
	installed, err := inst.Install(ctx, r, records)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		fail(events.CodeInstallFailed, fmt.Errorf("install: %w", err))
		return
	}
	keys := make([]string, 0, len(installed))
	for _, ep := range installed {
		if err := ep.Validate(); err != nil {
			fail(events.CodeInstallFailed, fmt.Errorf("install returned an invalid episode: %w", err))
			return
		}
		keys = append(keys, ep.Next().String())
	}
	m.post(ctx, RestoreFinished{Op: e.Op, Restored: keys})
}
