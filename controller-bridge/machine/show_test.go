package machine

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// The stable text form of effects that the golden scripts expect: one
// line per effect, times relative to t0, lists comma-joined ("-" when
// empty).

func members(ms []events.Member) string {
	if len(ms) == 0 {
		return "-"
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m)
	}
	return strings.Join(out, ",")
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ",")
}

func episodes(es []events.Episode) string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.String()
	}
	return list(out)
}

func since(t time.Time) string { return t.Sub(t0).String() }

func errs(es []events.MemberError) string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = string(e.Member) + ":" + e.Code
	}
	return list(out)
}

func blockers(b map[events.Member][]string) string {
	var out []string
	for m, bs := range b {
		out = append(out, fmt.Sprintf("%s:[%s]", m, strings.Join(bs, ",")))
	}
	sort.Strings(out)
	return list(out)
}

func failure(f *bridgeapi.Failure) string {
	if f == nil {
		return ""
	}
	s := fmt.Sprintf(" failure: phase=%s reason=%q errors=%s", f.Phase, f.Reason, errs(f.Errors))
	if len(f.Blockers) > 0 {
		s += " blockers=" + blockers(f.Blockers)
	}
	return s
}

func flagIf(b bool, name string) string {
	if b {
		return " " + name
	}
	return ""
}

// show prints an effect in the scripts' stable text form.
func show(e Effect) string {
	switch e := e.(type) {
	case PublishPhase:
		h := e.Event.Header()
		s := fmt.Sprintf("publish %s %s seq=%d epoch=%d deadline=%s members=%s", e.Event.Phase(), h.CheckpointID, h.Seq, h.Epoch,
			since(h.Deadline), members(h.Members))
		if h.Sandboxes != nil {
			names, _ := h.Sandboxes.Names()
			s += " sandboxes=" + members(names)
		}
		switch p := e.Event.(type) {
		case events.Commit:
			s += " scope=" + episodes(p.Scope) + flagIf(p.Stop, "stop")
		case events.Resume:
			s += flagIf(p.Aborted, "aborted")
		case events.Restore:
			s += " source=" + p.Source + " scope=" + episodes(p.Scope)
		case events.Retire:
			s += " episodes=" + episodes(p.Episodes)
		case events.Forget:
			s += " rollouts=" + list(p.Rollouts)
		case events.Release:
			s += " keep=" + list(p.Keep) + flagIf(p.Final, "final")
		}
		return s + fmt.Sprintf(" fence=%d", e.Fence)
	case StartGathering:
		how := "recorded"
		if e.Watch {
			how = "watch"
		}
		return fmt.Sprintf("gather %s seq=%d %s", e.Event.Phase(), e.Event.Header().Seq, how)
	case StopGathering:
		how := "read back"
		if e.Decided {
			how = "decided"
		}
		return fmt.Sprintf("stop gathering %s seq=%d %s", e.Phase, e.Seq, how)
	case SetTimer:
		return "timer " + e.After.String()
	case WriteMemberList:
		var l events.MemberList
		if err := json.Unmarshal(e.Data, &l); err != nil {
			return "write member list " + e.CheckpointID + ": " + err.Error()
		}
		var ms []events.Member
		for _, mm := range l.Members {
			ms = append(ms, mm.Member)
		}
		return fmt.Sprintf("write member list %s members=%s", e.CheckpointID, members(ms))
	case CreateManifest:
		m := e.Manifest
		if m.Aborted {
			return fmt.Sprintf("create abort marker %s epoch=%d prepare=%dms reason=%q", m.CheckpointID, m.Epoch, m.PrepareMS, m.Reason)
		}
		var ms []events.Member
		for _, mm := range m.Members {
			ms = append(ms, mm.Member)
		}
		return fmt.Sprintf("create manifest %s epoch=%d members=%s continued=%s restarted=%s prepare-seq=%d commit-seq=%d prepare=%dms commit=%dms%s",
			m.CheckpointID, m.Epoch, members(ms), list(m.Continued), list(m.Restarted), m.PrepareSeq, m.CommitSeq, m.PrepareMS, m.CommitMS, flagIf(m.Stop, "stop"))
	case MoveLatest:
		return fmt.Sprintf("move latest %s commit-seq=%d", e.Latest.CheckpointID, e.Latest.CommitSeq)
	case PublishOutcome:
		switch o := e.Outcome.(type) {
		case events.CheckpointCommitted:
			var ex []string
			for _, e := range o.Exports {
				ex = append(ex, fmt.Sprintf("%s@%d:%dB", e.Member, e.Epoch, e.Size))
			}
			s := fmt.Sprintf("outcome checkpoint.committed %s continued=%s restarted=%s members=%s%s prepare-seq=%d commit-seq=%d exports=%s",
				o.CheckpointID, list(o.Continued), list(o.Restarted), members(o.Members), flagIf(o.Stop, "stop"), o.PrepareSeq, o.CommitSeq, list(ex))
			if o.ExportsCut > 0 {
				s += fmt.Sprintf(" exports-cut=%d", o.ExportsCut)
			}
			return s
		case events.CheckpointFailed:
			s := fmt.Sprintf("outcome checkpoint.failed %s phase=%s reason=%q errors=%s members=%s prepare-seq=%d commit-seq=%d", o.CheckpointID,
				o.Phase, o.Reason, errs(o.Errors), members(o.Members), o.PrepareSeq, o.CommitSeq)
			if len(o.Blockers) > 0 {
				s += " blockers=" + blockers(o.Blockers)
			}
			return s
		case events.RestoreCompleted:
			return fmt.Sprintf("outcome restore.completed %s epoch=%d restored=%s", o.CheckpointID, o.Epoch, list(o.Restored))
		case events.RestoreFailed:
			return fmt.Sprintf("outcome restore.failed %s epoch=%d errors=%s retired=%s", o.CheckpointID, o.Epoch, errs(o.Errors), list(o.Retired))
		case events.ReleaseCompleted:
			return fmt.Sprintf("outcome release.completed %s keep=%s deleted=%s", o.CheckpointID, list(o.Keep), list(o.Deleted))
		case events.ReleaseFailed:
			var md []string
			for m, ids := range o.Deleted {
				md = append(md, fmt.Sprintf("%s:[%s]", m, strings.Join(ids, ",")))
			}
			sort.Strings(md)
			return fmt.Sprintf("outcome release.failed %s keep=%s reason=%q errors=%s member-deleted=%s", o.CheckpointID, list(o.Keep), o.Reason,
				errs(o.Errors), list(md))
		}
	case ListCheckpoints:
		return "list checkpoints " + e.Release
	case DeleteCheckpoints:
		var ds []string
		for _, d := range e.Delete {
			ds = append(ds, d.CheckpointID+map[bool]string{true: "(keep marker)"}[d.KeepMarker])
		}
		return fmt.Sprintf("delete %s keep=%s", list(ds), list(e.Keep))
	case MarkReleased:
		var md []string
		for m, ids := range e.Mark.Deleted {
			md = append(md, fmt.Sprintf("%s:[%s]", m, strings.Join(ids, ",")))
		}
		sort.Strings(md)
		return fmt.Sprintf("mark released keep=%s op=%s deleted=%s failed=%s", list(e.Keep), e.Mark.Op, list(md), errs(e.Mark.Failed))
	case ReadManifest:
		return "read manifest " + e.CheckpointID
	case ReadOutcome:
		return fmt.Sprintf("read outcome %s %s", e.Type.Noun(), e.ID)
	case WatchResume:
		return fmt.Sprintf("watch resume seq=%d", e.Event.Seq)
	case Note:
		who := ""
		if e.Member != "" {
			who = " " + string(e.Member)
		}
		return fmt.Sprintf("note %s%s: %s", []string{"debug", "info", "warn", "error"}[e.Level], who, e.Msg)
	case Finish:
		switch {
		case e.Err != nil:
			return "finish error: " + e.Err.Error()
		case e.Checkpoint != nil:
			r := e.Checkpoint
			return fmt.Sprintf("finish checkpoint %s %s epoch=%d members=%s continued=%s restarted=%s prepare=%dms commit=%dms%s%s",
				r.CheckpointID, r.Status, r.Epoch, members(r.Members), list(r.Continued), list(r.Restarted), r.PrepareMS, r.CommitMS,
				flagIf(r.Stop, "stop"), failure(r.Failure))
		case e.Restore != nil:
			r := e.Restore
			return fmt.Sprintf("finish restore %s %s source=%s epoch=%d members=%s restored=%s retired=%s%s", r.RestoreID, r.Status, r.Source,
				r.Epoch, members(r.Members), list(r.Restored), list(r.Retired), failure(r.Failure))
		case e.Op != nil:
			r := e.Op
			var md []string
			for m, ids := range r.MemberDeleted {
				md = append(md, fmt.Sprintf("%s:[%s]", m, strings.Join(ids, ",")))
			}
			sort.Strings(md)
			return fmt.Sprintf("finish %s %s %s members=%s keep=%s deleted=%s member-deleted=%s%s", r.Phase, r.OpID, r.Status,
				members(r.Members), list(r.Keep), list(r.Deleted), list(md), failure(r.Failure))
		}
	}
	return fmt.Sprintf("%T %+v", e, e)
}
