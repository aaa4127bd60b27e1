package timeline

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// Entry is one event of a run as the stream recorded it: what Read and
// Follow return.
type Entry struct {
	// StreamSeq and Time are the stream's sequence and receive time.
	StreamSeq uint64    `json:"stream_seq"`
	Time      time.Time `json:"time"`
	Subject   string    `json:"subject"`
	// Type, Source and CheckpointID are the event's ce-type, sender and
	// ce-subject.
	Type         events.Type `json:"type"`
	Source       string      `json:"source"`
	CheckpointID string      `json:"checkpoint_id"`
	// Summary says what the event says, in a line.
	Summary string `json:"summary"`
	// Data is the decoded payload.
	Data events.Data `json:"-"`
}

// Event returns the entry as the model (Builder) reads it.
func (e Entry) Event() Event {
	return Event{StreamSeq: e.StreamSeq, Time: e.Time, Source: e.Source, Data: e.Data}
}

// Read reads a run's events from the stream in order, as the
// post-mortem does with the nats CLI: an ordered consumer over sp.<run>.>,
// from the first message to the last one present when it read it. With a
// checkpoint id it keeps only that checkpoint's (or operation's) events.
// Events that do not decode are returned with their error in Summary.
func Read(ctx context.Context, js natsjs.JetStream, run, checkpoint string) ([]Entry, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if checkpoint != "" {
		if err := events.ValidateCheckpointID(checkpoint); err != nil {
			return nil, err
		}
	}
	cons, err := js.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.RunFilter(run)}, DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return nil, fmt.Errorf("bridge: timeline consumer: %w", err)
	}
	var out []Entry
	for {
		// On a cluster the first pull can reach the server before the
		// consumer the ordered consumer just created: asked again.
		m, err := live.Retry(ctx, live.Policy{Interval: poll.Every(50 * time.Millisecond), Tries: 21},
			func(context.Context) (natsjs.Msg, error) { return cons.Next(natsjs.FetchMaxWait(5 * time.Second)) })
		if live.NoResponders(err) && ctx.Err() != nil {
			return out, ctx.Err()
		}
		if err != nil {
			return out, fmt.Errorf("bridge: timeline of run %s: %w", run, err)
		}
		e, md, err := entryOf(m)
		if err != nil {
			return out, err
		}
		if checkpoint == "" || e.CheckpointID == checkpoint {
			out = append(out, expand(e)...)
		}
		// The consumer counts what is left of the run's events: none, and
		// the timeline is read to where it stood. (A wildcard last-message
		// lookup can find no responder on a cluster.)
		if md.NumPending == 0 {
			return out, nil
		}
	}
}

// entryOf reads one stream message as a timeline entry.
func entryOf(m natsjs.Msg) (Entry, *natsjs.MsgMetadata, error) {
	md, err := m.Metadata()
	if err != nil {
		return Entry{}, nil, fmt.Errorf("bridge: timeline: %w", err)
	}
	e := Entry{StreamSeq: md.Sequence.Stream, Time: md.Timestamp, Subject: m.Subject()}
	ev, d, err := events.Unmarshal(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		e.Summary = "undecodable: " + err.Error()
	} else {
		e.Type, e.Source, e.CheckpointID, e.Data = events.Type(ev.Type()), ev.Source(), ev.Subject(), d
		e.Summary = Summarize(d)
	}
	return e, md, nil
}

// expand returns e and, for a record of the sandbox daemons' prepare acks
// (events.PrepareAcked), an entry for each ack it holds, as the ack would
// have been stored: at the time the bridge heard it, on its core-NATS
// subject, with the record's stream sequence. So the timeline reads a
// daemon's prepare ack, its pause report included, wherever it travelled.
func expand(e Entry) []Entry {
	rec, ok := e.Data.(events.PrepareAcked)
	if !ok || len(rec.Acks) == 0 {
		return []Entry{e}
	}
	out := make([]Entry, 0, 1+len(rec.Acks))
	out = append(out, e)
	for _, h := range rec.Acks {
		a := h.Ack
		out = append(out, Entry{StreamSeq: e.StreamSeq, Time: h.At,
			Subject: events.LiveAckSubject(a.Run, a.Seq, events.PhasePrepare, a.Member),
			Type:    events.TypePrepareAck, Source: "/" + a.Run + "/" + string(a.Member), CheckpointID: a.CheckpointID,
			Summary: Summarize(a), Data: a})
	}
	return out
}

// Follow reads a run's events as Read does, from the
// first one, and goes on with each new one as the stream stores it,
// sending every entry to out in stream order (with a checkpoint id, only
// that checkpoint's or operation's). It blocks until ctx ends, and
// returns ctx's error then; it stops and waits for the consumer it
// started before it returns.
func Follow(ctx context.Context, js natsjs.JetStream, run, checkpoint string, out chan<- Entry) error {
	if err := events.ValidateRun(run); err != nil {
		return err
	}
	if checkpoint != "" {
		if err := events.ValidateCheckpointID(checkpoint); err != nil {
			return err
		}
	}
	cons, err := js.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.RunFilter(run)}, DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("bridge: timeline consumer: %w", err)
	}
	// The consumer's callback hands each message to this goroutine, which
	// alone decodes and sends, so entries keep the stream's order.
	msgs := make(chan natsjs.Msg)
	stopped := make(chan struct{})
	cc, err := cons.Consume(func(m natsjs.Msg) {
		select {
		case msgs <- m:
		case <-stopped:
		}
	})
	if err != nil {
		return fmt.Errorf("bridge: timeline of run %s: %w", run, err)
	}
	defer func() {
		close(stopped)
		cc.Stop()
		<-cc.Closed()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-msgs:
			e, _, err := entryOf(m)
			if err != nil {
				return err
			}
			if checkpoint != "" && e.CheckpointID != checkpoint {
				continue
			}
			for _, e := range expand(e) {
				select {
				case out <- e:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
}

// Summarize says in one line what an event says.
func Summarize(d events.Data) string {
	switch v := d.(type) {
	case events.PhaseEvent:
		h := v.Header()
		s := fmt.Sprintf("%s seq %d epoch %d to %d members, deadline %s", v.Phase(), h.Seq, h.Epoch, len(h.Members)+sandboxCount(h), h.Deadline.Format(time.RFC3339))
		switch p := v.(type) {
		case events.Commit:
			s += fmt.Sprintf(", scope %d, stop %v", len(p.Scope), p.Stop)
		case events.Restore:
			s += ", from " + p.Source
		case events.Release:
			s += fmt.Sprintf(", keep %v", p.Keep)
		}
		return s
	case events.Ack:
		h := v.Header()
		s := fmt.Sprintf("%s ack of seq %d by %s: ", v.Answers(), h.Seq, h.Member)
		if !h.OK {
			return s + "error " + h.Error.Code + ": " + h.Error.Detail
		}
		switch a := v.(type) {
		case events.PrepareAck:
			if !a.Ready {
				return s + fmt.Sprintf("not ready, %d blockers %s", a.BlockerCount, strings.Join(a.Blockers, ","))
			}
			return s + fmt.Sprintf("ready, %d restarts", len(a.Restarts))
		case events.CommitAck:
			if a.Manifest == nil {
				return s + "exported nothing"
			}
			return s + fmt.Sprintf("exported %d records sha256 %.12s", a.Manifest.Count, a.Manifest.SHA256)
		case events.RestoreAck:
			return s + fmt.Sprintf("restored %d", len(a.Restored))
		}
		return s + "ok, now " + string(h.State)
	case events.CheckpointCommitted:
		return fmt.Sprintf("checkpoint %s committed: %d continued, %d restarted, prepare %d ms, commit %d ms",
			v.CheckpointID, len(v.Continued), len(v.Restarted), v.PrepareMS, v.CommitMS)
	case events.CheckpointFailed:
		return fmt.Sprintf("checkpoint %s failed in %s: %s", v.CheckpointID, v.Phase, v.Reason)
	case events.RestoreCompleted:
		return fmt.Sprintf("restore %s from %s completed: %d restored", v.CheckpointID, v.Source, len(v.Restored))
	case events.RestoreFailed:
		return fmt.Sprintf("restore %s from %s failed: %d members, %d retired", v.CheckpointID, v.Source, len(v.Errors), len(v.Retired))
	case events.ReleaseCompleted:
		return fmt.Sprintf("release %s: kept %v, deleted %v", v.CheckpointID, v.Keep, v.Deleted)
	case events.ReleaseFailed:
		var who []string
		for _, e := range v.Errors {
			who = append(who, string(e.Member)+" "+e.Code)
		}
		return fmt.Sprintf("release %s failed: %s (%s); nothing of the bridge's deleted", v.CheckpointID, v.Reason, strings.Join(who, ", "))
	case events.Roster:
		return fmt.Sprintf("roster of seq %d: %d sandbox daemons", v.Seq, len(v.Members))
	case events.ResumeAcked:
		s := fmt.Sprintf("resume seq %d acked by %d of %d members (p50 %.1f ms, max %.1f ms)", v.Seq, v.Answered, v.Expected, v.P50MS, v.MaxMS)
		if v.MissingCount > 0 {
			s += fmt.Sprintf(", %d silent (%s)", v.MissingCount, strings.Join(memberStrings(v.Missing), ","))
		}
		if v.ErrorCount > 0 {
			s += fmt.Sprintf(", %d errors", v.ErrorCount)
		}
		return s
	case events.PrepareAcked:
		s := fmt.Sprintf("prepare seq %d: %d of %d sandbox daemons answered, %d ready (p50 %.1f ms, max %.1f ms); part %d of %d, %d acks",
			v.Seq, v.Answered, v.Expected, v.Ready, v.P50MS, v.MaxMS, v.Part, v.Parts, len(v.Acks))
		if v.MissingCount > 0 {
			s += fmt.Sprintf(", %d silent (%s)", v.MissingCount, strings.Join(memberStrings(v.Missing), ","))
		}
		if v.NotReadyCount > 0 {
			s += fmt.Sprintf(", %d not ready", v.NotReadyCount)
		}
		if v.ErrorCount > 0 {
			s += fmt.Sprintf(", %d errors", v.ErrorCount)
		}
		return s
	case events.MemberJoined:
		return fmt.Sprintf("%s joined (epoch %d, %v)", v.Member, v.Epoch, v.Capabilities)
	case events.MemberLeft:
		return fmt.Sprintf("%s left: %s", v.Member, v.Reason)
	}
	return string(d.Type())
}

// sandboxCount is the number of sandbox daemons phase h addresses by its
// roster.
func sandboxCount(h events.PhaseHeader) int {
	if h.Sandboxes == nil {
		return 0
	}
	return h.Sandboxes.Count
}

// memberStrings returns ms as strings.
func memberStrings(ms []events.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m)
	}
	return out
}
