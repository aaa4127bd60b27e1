package timeline

import "github.com/stillpoint/stillpoint/events"

// kindOf is the kind of operation phase p belongs to.
func kindOf(p events.Phase) Kind {
	switch p {
	case events.PhasePrepare, events.PhaseRenew, events.PhaseCommit, events.PhaseResume:
		return KindCheckpoint
	case events.PhaseRestore:
		return KindRestore
	case events.PhaseRelease:
		return KindRelease
	case events.PhaseRetire:
		return KindRetire
	case events.PhaseForget:
		return KindForget
	case events.PhaseBranch:
		return KindBranch
	}
	return KindUnknown
}

// kindOfOutcome is the kind of operation an outcome of type t ends.
func kindOfOutcome(t events.Type) Kind {
	switch t {
	case events.TypeCheckpointCommitted, events.TypeCheckpointFailed:
		return KindCheckpoint
	case events.TypeRestoreCompleted, events.TypeRestoreFailed:
		return KindRestore
	case events.TypeReleaseCompleted, events.TypeReleaseFailed:
		return KindRelease
	case events.TypeBranchCompleted, events.TypeBranchFailed:
		return KindBranch
	}
	return KindUnknown
}

// outcomeOf reads an outcome event, or returns nil for any other.
func outcomeOf(e Event) (*Outcome, string) {
	o := &Outcome{Time: e.Time, StreamSeq: e.StreamSeq}
	if e.Data == nil {
		return nil, ""
	}
	o.Type = e.Data.Type()
	var h events.OutcomeHeader
	switch v := e.Data.(type) {
	case events.CheckpointCommitted:
		h, o.Status, o.Continued, o.Restarted = v.OutcomeHeader, StatusCommitted, len(v.Continued), len(v.Restarted)
		o.Carried, o.Retired = len(events.CarriedEpisodes(v.Carried)), len(v.Retired)
		o.Stop = v.Stop
	case events.CheckpointFailed:
		h, o.Status, o.Phase, o.Reason, o.Errors = v.OutcomeHeader, StatusFailed, v.Phase, v.Reason, v.Errors
	case events.RestoreCompleted:
		h, o.Status, o.Source, o.Restored = v.OutcomeHeader, StatusCompleted, v.Source, len(v.Restored)
	case events.RestoreFailed:
		h, o.Status, o.Source, o.Errors = v.OutcomeHeader, StatusFailed, v.Source, v.Errors
		o.Reason = "restore installed nothing"
	case events.BranchCompleted:
		h, o.Status, o.Source, o.Branches = v.OutcomeHeader, StatusCompleted, v.Source, len(v.Branches)
	case events.BranchFailed:
		h, o.Status, o.Source, o.Branches, o.Errors = v.OutcomeHeader, StatusFailed, v.Source, len(v.Branches), v.Errors
		o.Retired, o.Reason = len(v.Retired), "the branches were retired everywhere"
	case events.ReleaseCompleted:
		h, o.Status, o.Keep, o.Deleted = v.OutcomeHeader, StatusCompleted, v.Keep, v.Deleted
	case events.ReleaseFailed:
		h, o.Status, o.Keep, o.Reason, o.Errors = v.OutcomeHeader, StatusFailed, v.Keep, v.Reason, v.Errors
	default:
		return nil, ""
	}
	o.Epoch = h.Epoch
	return o, h.CheckpointID
}
