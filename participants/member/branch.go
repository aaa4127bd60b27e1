package member

import (
	"context"
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
)

// branch reads the member's records of the branch's parents, as
// installRestore reads a scope (the source's records of the parents it
// does not carry; each carried source's of the parents it carries), and
// hands them to the participant's Brancher. It returns the capture keys
// of the branch episodes installed: none when the member held no record
// of the parents (PROTOCOL §5, Branch).
func (m *Member) branch(ctx context.Context, b events.Branch) ([]string, *events.AckError) {
	fail := func(code string, err error) ([]string, *events.AckError) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = events.CodeDeadlineExceeded
		}
		return nil, &events.AckError{Code: code, Detail: err.Error()}
	}
	// Like a restore, a participant that neither exports nor installs has
	// no records anywhere: it reads nothing.
	_, exports := m.cfg.Participant.(Exporter)
	_, installs := m.cfg.Participant.(Installer)
	_, branches := m.cfg.Participant.(Brancher)
	if !exports && !installs && !branches {
		return nil, nil
	}
	// A branch episode a retire refused (a failed operation's, or a lost
	// attempt's) is never installed again: it would run refused.
	for _, s := range b.Branches {
		if err := m.Admit(s.Episode); err != nil {
			return fail(events.CodeStaleAttempt, fmt.Errorf("branch %s: %w", s.Episode, err))
		}
	}
	carried := b.CarriedFrom()
	scope := map[events.Episode]bool{}
	for _, ep := range b.Parents() {
		if _, ok := carried[ep]; !ok {
			scope[ep] = true
		}
	}
	_, records, err := readRecords(ctx, m.cfg.Bus, m.cfg.Run, b.Source, m.cfg.Member, b.SourceCommitSeq, b.SourceAcks, func(rec events.Record) bool {
		ep, err := events.ParseEpisode(rec.Key)
		return err == nil && scope[ep]
	})
	if errors.Is(err, ErrNoManifest) {
		err = nil // the member exported nothing there: it holds no parent
	}
	for _, c := range b.Carried {
		if err != nil {
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
			err = nil
		case err == nil:
			records = append(records, more...)
		default:
			err = fmt.Errorf("carried from %s: %w", c.Source, err)
		}
	}
	switch {
	case errors.Is(err, ErrCorruptRecords):
		return fail(CodeCorruptRecords, err)
	case err != nil:
		return fail(events.CodeInstallFailed, err)
	case len(records) == 0:
		m.log.Info().Str("branch", b.CheckpointID).Str("source", b.Source).Msg("no records of the parents: nothing to branch")
		return nil, nil
	}
	br, ok := m.cfg.Participant.(Brancher)
	if !ok {
		return fail(events.CodeInstallFailed, fmt.Errorf("member: %d records of the parents and the participant cannot branch (no Brancher)", len(records)))
	}
	branched, err := br.Branch(ctx, b, records)
	if err != nil {
		return fail(events.CodeInstallFailed, fmt.Errorf("branch: %w", err))
	}
	want := map[events.Episode]bool{}
	for _, s := range b.Branches {
		want[s.Episode] = true
	}
	keys := make([]string, 0, len(branched))
	for _, ep := range branched {
		if !want[ep] {
			return fail(events.CodeInstallFailed, fmt.Errorf("branch returned %s, which is none of the phase's branch episodes", ep))
		}
		keys = append(keys, ep.String())
	}
	m.log.Info().Str("branch", b.CheckpointID).Str("source", b.Source).Int("records", len(records)).Strs("branched", keys).Msg("branched")
	return keys, nil
}
