package timeline

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// clock formats the times of the text view: UTC, to the millisecond.
const clock = "15:04:05.000"

// WriteText writes ops as plain text: per operation a heading with its
// outcome, then each phase with its publish time and every member's
// answer, slowest first.
func WriteText(w io.Writer, ops []Op) error {
	for i, op := range ops {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := writeOp(w, op); err != nil {
			return err
		}
	}
	return nil
}

func writeOp(w io.Writer, op Op) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s  %s  epoch %d  started %s UTC, %d members\n", op.Kind, op.ID, strings.ToUpper(string(op.Status)),
		op.Epoch, op.Start.UTC().Format(clock), len(op.Members))
	for _, p := range op.Phases {
		b.WriteString("  " + PhaseLine(p) + "\n")
		for _, a := range p.Acks {
			b.WriteString("    " + AckLine(a) + "\n")
		}
	}
	if op.Outcome != nil {
		b.WriteString("  " + OutcomeLine(*op.Outcome) + "\n")
	} else {
		b.WriteString("  outcome: none on the stream yet\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// PhaseLine says in a line when a phase was published and how its acks
// stand.
func PhaseLine(p Phase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s seq %-4d", p.Phase, p.Seq)
	if p.Published.IsZero() {
		b.WriteString(" phase event not on the stream")
	} else {
		fmt.Fprintf(&b, " published %s  #%d", p.Published.UTC().Format(clock), p.StreamSeq)
	}
	if !p.Deadline.IsZero() {
		fmt.Fprintf(&b, "  deadline %s", p.Deadline.UTC().Format(clock))
	}
	n := map[AckStatus]int{}
	for _, a := range p.Acks {
		n[a.Status]++
	}
	fmt.Fprintf(&b, "  %d/%d answered", len(p.Acks)-n[AckMissing]-n[AckPending], len(p.Acks))
	for _, s := range []AckStatus{AckError, AckNotReady, AckMissing, AckPending} {
		if n[s] > 0 {
			fmt.Fprintf(&b, ", %d %s", n[s], strings.ReplaceAll(string(s), "_", " "))
		}
	}
	if p.Aborted {
		b.WriteString("  (aborts the checkpoint)")
	}
	if p.Republished > 0 {
		fmt.Fprintf(&b, "  (published %d more times)", p.Republished)
	}
	return b.String()
}

// AckLine says in a line what a member answered a phase.
func AckLine(a Ack) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-28s ", a.Member)
	switch {
	case a.Status == AckMissing:
		b.WriteString("   MISSING  never answered")
		return b.String()
	case a.Status == AckPending:
		b.WriteString("   pending  no answer yet")
		return b.String()
	case a.LatencyMS != nil:
		fmt.Fprintf(&b, "%9.3f ms ", *a.LatencyMS)
	default:
		b.WriteString("        ? ms ")
	}
	switch a.Status {
	case AckOK:
		b.WriteString("ok")
	case AckNotReady:
		fmt.Fprintf(&b, "NOT READY, %d blockers", a.BlockerCount)
		if len(a.Blockers) > 0 {
			b.WriteString(" " + strings.Join(a.Blockers, ","))
		}
	case AckError:
		b.WriteString("ERROR " + a.Code)
		if a.Detail != "" {
			b.WriteString(": " + a.Detail)
		}
	}
	if a.Ready != nil && *a.Ready {
		b.WriteString(", ready")
	}
	if a.State != "" {
		b.WriteString(", now " + string(a.State))
	}
	fmt.Fprintf(&b, ", took %d ms, epoch %d", a.TookMS, a.Epoch)
	var marks []string
	if a.Late {
		marks = append(marks, "late")
	}
	if a.Unexpected {
		marks = append(marks, "not named by the phase")
	}
	if a.BeforePhase {
		marks = append(marks, "stored before its phase")
	}
	if a.Duplicates > 0 {
		marks = append(marks, fmt.Sprintf("%d duplicates", a.Duplicates))
	}
	if len(marks) > 0 {
		b.WriteString(" (" + strings.Join(marks, ", ") + ")")
	}
	return b.String()
}

// OutcomeLine says in a line what the bridge concluded.
func OutcomeLine(o Outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "outcome: %s at %s, %s after the first phase", strings.ToUpper(string(o.Status)), o.Time.UTC().Format(clock),
		time.Duration(o.AfterMS*float64(time.Millisecond)).Round(time.Millisecond))
	switch o.Type {
	case events.TypeCheckpointCommitted:
		fmt.Fprintf(&b, ": %d continued, %d restarted", o.Continued, o.Restarted)
		if o.Carried+o.Retired > 0 {
			fmt.Fprintf(&b, ", %d carried, %d retired", o.Carried, o.Retired)
		}
		if o.Stop {
			b.WriteString(", stop")
		}
	case events.TypeRestoreCompleted:
		fmt.Fprintf(&b, ": %d restored from %s", o.Restored, o.Source)
	case events.TypeReleaseCompleted:
		fmt.Fprintf(&b, ": kept %v, deleted %v", o.Keep, o.Deleted)
	case events.TypeBranchCompleted:
		fmt.Fprintf(&b, ": %d branches from %s", o.Branches, o.Source)
	case events.TypeBranchFailed:
		fmt.Fprintf(&b, ": %d branches from %s, %d retired", o.Branches, o.Source, o.Retired)
	}
	if o.Phase != "" {
		fmt.Fprintf(&b, " in %s", o.Phase)
	}
	if o.Reason != "" {
		b.WriteString(": " + o.Reason)
	}
	for _, e := range o.Errors {
		fmt.Fprintf(&b, "\n    %-28s %s", e.Member, e.Code)
		if e.Detail != "" {
			b.WriteString(": " + e.Detail)
		}
	}
	if o.Repeated > 0 {
		fmt.Fprintf(&b, "\n    (the outcome is on the stream %d more times)", o.Repeated)
	}
	return b.String()
}
