package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
)

// timelineFlags are the flags of `stillpoint timeline`.
type timelineFlags struct {
	run, checkpoint, html string
	asJSON, eventsView    bool
	follow                bool
	untilIdle             time.Duration
	// terminal forces the live view's terminal mode (tests); nil asks
	// whether stdout is a terminal.
	terminal *bool
}

func newTimelineCmd(g *globals) *cobra.Command {
	var f timelineFlags
	cmd := &cobra.Command{
		Use:   "timeline",
		Short: "Show a run's checkpoints: each phase, every member's ack and its latency, the outcome",
		Long: `Read a run back from the STILLPOINT stream with an ordered consumer and show, per
checkpoint (and restore, release, retire, forget), each phase with its publish time
and every member's ack: the latency from the phase's publish to the ack in
milliseconds (both stream times), ok or the error code, a prepare's blockers and
readiness, members slowest first, members that never answered as MISSING, and the
outcome. --checkpoint keeps one checkpoint's (or operation's) events.

--events prints the stream as it is instead, one line per event (time since the
first event, stream sequence, sender, what it said). --json prints the model, one
JSON object per operation (docs/TIMELINE.md documents it); with --events, one per
event. --html FILE writes one self-contained page (no server, no network) with a
Gantt-style picture: a row per member, a bar per phase from its publish to that
member's ack, failures and missing acks marked.

--follow keeps reading as the run goes on: an operation's block is printed once its
outcome (and the resume after it) is in; on a terminal a status line counts the acks
of the open phase, otherwise each phase and each completed phase is a plain
key=value line. It ends on SIGINT, or after --until-idle of no new event.
docs/POSTMORTEM.md shows the same with the nats CLI.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.untilIdle > 0 && !f.follow {
				return &exitError{code: ExitUsage, err: errors.New("--until-idle needs --follow")}
			}
			_, js, closeBus, err := openBus(cmd.Context(), g, "stillpoint-timeline", 1)
			if err != nil {
				return err
			}
			defer closeBus()
			if f.follow {
				return followTimeline(cmd.Context(), g, js, f)
			}
			entries, err := timeline.Read(cmd.Context(), js, f.run, f.checkpoint)
			if err != nil {
				return err
			}
			if f.eventsView {
				return writeEvents(g.stdout, entries, f.asJSON)
			}
			var b timeline.Builder
			for _, e := range entries {
				b.Add(e.Event())
			}
			ops := b.Ops(time.Now())
			return writeOps(g, f, ops)
		},
	}
	cmd.Flags().StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	cmd.Flags().StringVar(&f.checkpoint, "checkpoint", "", "keep only this checkpoint's or operation's events")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print one JSON object per operation (with --events, per event)")
	cmd.Flags().BoolVar(&f.eventsView, "events", false, "print one line per event, in stream order")
	cmd.Flags().StringVar(&f.html, "html", "", "also write the timeline as one self-contained HTML page to this file")
	cmd.Flags().BoolVar(&f.follow, "follow", false, "keep reading as the run goes on, until SIGINT or --until-idle")
	cmd.Flags().DurationVar(&f.untilIdle, "until-idle", 0, "with --follow: end once no event came for this long")
	return cmd
}

// writeEvents prints the one-line-per-event view.
func writeEvents(w io.Writer, entries []timeline.Entry, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, e := range entries {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	}
	var t0 time.Time
	for i, e := range entries {
		if i == 0 {
			t0 = e.Time
		}
		if err := writeEvent(w, t0, e); err != nil {
			return err
		}
	}
	return nil
}

func writeEvent(w io.Writer, t0 time.Time, e timeline.Entry) error {
	_, err := fmt.Fprintf(w, "%+10.3fs  #%-6d %-28s %s\n", e.Time.Sub(t0).Seconds(), e.StreamSeq, e.Source, e.Summary)
	return err
}

// writeOps prints ops as text or JSON, and writes the HTML page if asked.
func writeOps(g *globals, f timelineFlags, ops []timeline.Op) error {
	if f.asJSON {
		enc := json.NewEncoder(g.stdout)
		for _, op := range ops {
			if err := enc.Encode(op); err != nil {
				return err
			}
		}
	} else if err := timeline.WriteText(g.stdout, ops); err != nil {
		return err
	}
	if f.html == "" {
		return nil
	}
	return writeHTMLFile(f.html, f.run, ops)
}

func writeHTMLFile(path, run string, ops []timeline.Op) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	err = timeline.WriteHTML(out, timeline.Page{Run: run, Generated: time.Now().UTC(), Ops: ops})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// isTerminal tells whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// followTimeline is `timeline --follow`: it reads the run as it goes on
// and prints each operation once it is over, until ctx ends or the run was
// idle for f.untilIdle. Operations still open then are printed as they
// stand.
func followTimeline(ctx context.Context, g *globals, js natsjs.JetStream, f timelineFlags) error {
	term := isTerminal(g.stdout)
	if f.terminal != nil {
		term = *f.terminal
	}
	if f.asJSON || f.eventsView {
		term = false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	grp, gctx := errgroup.WithContext(ctx)
	entries := make(chan timeline.Entry)
	grp.Go(func() error { return timeline.Follow(gctx, js, f.run, f.checkpoint, entries) })

	v := &liveView{g: g, f: f, term: term}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if f.untilIdle > 0 {
		idleTimer = time.NewTimer(f.untilIdle)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	var err error
loop:
	for {
		select {
		case e := <-entries:
			if idleTimer != nil {
				idleTimer.Reset(f.untilIdle)
			}
			if err = v.add(e); err != nil {
				break loop
			}
		case now := <-tick.C:
			if err = v.flush(now); err != nil {
				break loop
			}
		case <-idle:
			break loop
		case <-gctx.Done():
			break loop
		}
	}
	cancel()
	if werr := grp.Wait(); werr != nil && !errors.Is(werr, context.Canceled) && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	return v.end(time.Now())
}

// liveView is the state of `timeline --follow`.
type liveView struct {
	g    *globals
	f    timelineFlags
	term bool
	b    timeline.Builder
	t0   time.Time
	n    int
	// status is the terminal's status line now shown, "" if none.
	status string
	// complete marks the phases whose acks were all reported, by op and seq.
	complete map[string]bool
}

func (v *liveView) add(e timeline.Entry) error {
	if v.n == 0 {
		v.t0 = e.Time
	}
	v.n++
	id := v.b.Add(e.Event())
	if v.f.eventsView {
		return writeEvent(v.g.stdout, v.t0, e)
	}
	if id != "" && !v.term && !v.f.asJSON {
		if err := v.progress(id, e); err != nil {
			return err
		}
	}
	return v.flush(e.Time)
}

// progress prints the plain lines of a live run off a terminal: one per
// phase published, one when a phase has every ack it named.
func (v *liveView) progress(id string, e timeline.Entry) error {
	op, _ := v.b.Op(id, e.Time)
	w := v.g.stdout
	for _, p := range op.Phases {
		key := fmt.Sprintf("%s/%d", id, p.Seq)
		if p.StreamSeq == e.StreamSeq {
			_, err := fmt.Fprintf(w, "time=%s op=%s kind=%s phase=%s seq=%d epoch=%d members=%d event=published\n",
				e.Time.UTC().Format(time.RFC3339Nano), id, op.Kind, p.Phase, p.Seq, p.Epoch, len(p.Expected))
			if err != nil {
				return err
			}
		}
		answered, failed := 0, 0
		var slowest timeline.Ack
		for _, a := range p.Acks {
			switch a.Status {
			case timeline.AckPending, timeline.AckMissing:
				continue
			case timeline.AckError, timeline.AckNotReady:
				failed++
			}
			answered++
			if slowest.LatencyMS == nil || (a.LatencyMS != nil && *a.LatencyMS > *slowest.LatencyMS) {
				slowest = a
			}
		}
		if v.complete == nil {
			v.complete = map[string]bool{}
		}
		if answered == len(p.Acks) && answered > 0 && p.StreamSeq != 0 && !v.complete[key] {
			v.complete[key] = true
			lat := "?"
			if slowest.LatencyMS != nil {
				lat = fmt.Sprintf("%.3f", *slowest.LatencyMS)
			}
			_, err := fmt.Fprintf(w, "time=%s op=%s kind=%s phase=%s seq=%d event=answered acks=%d failed=%d slowest=%s slowest_ms=%s\n",
				e.Time.UTC().Format(time.RFC3339Nano), id, op.Kind, p.Phase, p.Seq, answered, failed, slowest.Member, lat)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// flush prints the operations that are over as of now, and on a terminal
// the status line of the open one.
func (v *liveView) flush(now time.Time) error {
	if v.f.eventsView {
		return nil
	}
	for _, id := range v.b.Open() {
		if !v.b.Done(id, now) {
			continue
		}
		op, _ := v.b.Op(id, now)
		if err := v.print(op); err != nil {
			return err
		}
	}
	if !v.term {
		return nil
	}
	status := ""
	if open := v.b.Open(); len(open) > 0 {
		op, _ := v.b.Op(open[len(open)-1], now)
		if n := len(op.Phases); n > 0 {
			p := op.Phases[n-1]
			answered := 0
			for _, a := range p.Acks {
				if a.Status != timeline.AckPending && a.Status != timeline.AckMissing {
					answered++
				}
			}
			status = fmt.Sprintf("%s %s: %s seq %d, %d/%d acks", op.Kind, op.ID, p.Phase, p.Seq, answered, len(p.Acks))
		}
	}
	if status == v.status {
		return nil
	}
	v.status = status
	_, err := fmt.Fprintf(v.g.stdout, "\r\x1b[K%s", status)
	return err
}

// print prints one operation's block (or JSON object), clearing the
// status line first.
func (v *liveView) print(op timeline.Op) error {
	w := v.g.stdout
	if v.term && v.status != "" {
		if _, err := io.WriteString(w, "\r\x1b[K"); err != nil {
			return err
		}
		v.status = ""
	}
	if v.f.asJSON {
		return json.NewEncoder(w).Encode(op)
	}
	if err := timeline.WriteText(w, []timeline.Op{op}); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

// end prints what is still open and writes the HTML page if asked.
func (v *liveView) end(now time.Time) error {
	if !v.f.eventsView {
		for _, id := range v.b.Open() {
			op, _ := v.b.Op(id, now)
			if err := v.print(op); err != nil {
				return err
			}
		}
		if v.term && v.status != "" {
			if _, err := io.WriteString(v.g.stdout, "\r\x1b[K"); err != nil {
				return err
			}
		}
	}
	if v.f.html == "" {
		return nil
	}
	return writeHTMLFile(v.f.html, v.f.run, v.b.Ops(now))
}
