package inspect

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteText prints the report for a person: one section each for the
// pointers, the checkpoints (a line per checkpoint, then one per member
// manifest), the snapshots and the live members, then the problems.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s\n", r.Run)
	if r.Latest != nil {
		fmt.Fprintf(&b, "LATEST %s epoch %d commit-seq %d (moved %s)\n", r.Latest.CheckpointID, r.Latest.Epoch, r.Latest.CommitSeq, stamp(r.Latest.Updated))
	} else {
		b.WriteString("LATEST none\n")
	}
	if r.Head != nil {
		fmt.Fprintf(&b, "HEAD seq %d epoch %d (updated %s)\n", r.Head.Seq, r.Head.Epoch, stamp(r.Head.Updated))
	} else {
		b.WriteString("HEAD none\n")
	}
	fmt.Fprintf(&b, "\ncheckpoints kept: %d\n", len(r.Checkpoints))
	for _, c := range r.Checkpoints {
		switch {
		case c.Aborted:
			fmt.Fprintf(&b, "  %s epoch %d aborted: %s\n", c.ID, c.Epoch, c.Reason)
			continue
		case c.Verified:
			fmt.Fprintf(&b, "  %s epoch %d created %s: %d continued, %d restarted, %d members, verified", c.ID, c.Epoch, stamp(c.Created),
				c.Continued, c.Restarted, len(c.Members))
		default:
			fmt.Fprintf(&b, "  %s epoch %d created %s: %d continued, %d restarted, %d members, NOT VERIFIED", c.ID, c.Epoch, stamp(c.Created),
				c.Continued, c.Restarted, len(c.Members))
		}
		if c.Stop {
			b.WriteString(", stop")
		}
		if c.Released {
			b.WriteString(", left by a failed release (restored no more)")
		}
		b.WriteString("\n")
		if c.MemberList != "" {
			fmt.Fprintf(&b, "    member list %s\n", c.MemberList)
		}
		for _, m := range c.Members {
			verdict := "ok"
			if !m.OK {
				verdict = m.Problem
			}
			fmt.Fprintf(&b, "    %-28s %8d B  %d records  sha256 %.16s  in %s  %s\n", m.Member, m.Size, m.Count, m.SHA256, m.Bucket, verdict)
		}
	}
	fmt.Fprintf(&b, "\nsnapshots in the owner's index: %d\n", len(r.Snapshots))
	for _, s := range r.Snapshots {
		fmt.Fprintf(&b, "  %s named by %s", s.ID, strings.Join(s.Checkpoints, ","))
		if len(s.Unkept) > 0 {
			fmt.Fprintf(&b, " (not kept: %s)", strings.Join(s.Unkept, ","))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\nlive members: %d\n", len(r.Members))
	for _, m := range r.Members {
		served := "not served yet"
		if m.Served {
			served = fmt.Sprintf("epoch %d", m.Epoch)
		}
		fmt.Fprintf(&b, "  %-28s instance %s  %s  heartbeat %s\n", m.Member, m.Instance, served, stamp(m.Heartbeat))
	}
	if len(r.Problems) > 0 {
		fmt.Fprintf(&b, "\nproblems: %d\n", len(r.Problems))
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "  %s\n", p)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
