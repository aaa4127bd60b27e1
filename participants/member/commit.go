package member

import (
	"context"
	"fmt"
	"slices"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// writeCommit re-checks readiness, exports once (or takes the export the
// machine kept), writes the records and reports their manifest, which the
// commit ack carries (PROTOCOL §5, commit). A stop (ctx) ends it without a
// report: the machine has answered the commit already, and no ack carries
// its manifest.
func (m *Member) writeCommit(ctx context.Context, e WriteCommit) {
	c := e.Commit
	fail := func(ex *Export, code, format string, args ...any) {
		m.post(ctx, RecordsWritten{Op: e.Op, Export: ex, Err: &events.AckError{Code: code, Detail: fmt.Sprintf(format, args...)}})
	}
	cp := Checkpoint{Run: c.Run, ID: c.CheckpointID, Seq: c.Seq, Epoch: c.Epoch, Deadline: c.Deadline}
	rep, err := m.cfg.Participant.Prepare(ctx, cp)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		fail(nil, events.CodeInternal, "readiness re-check: %v", err)
		return
	}
	// Readiness can regress after prepare; never commit such a cut.
	if !rep.Ready || len(rep.Blockers) > 0 {
		b := rep.Blockers
		if len(b) > 10 {
			b = b[:10]
		}
		fail(nil, events.CodeInvalidPhase, "no longer ready to commit: %d blockers %v", len(rep.Blockers), b)
		return
	}
	// Fail closed: a restart in scope would continue a rollout whose state
	// this member never captured.
	restarts := map[string]bool{}
	for _, k := range append(slices.Clone(e.Restarts), rep.Restarts...) {
		restarts[k] = true
	}
	var inScope []string
	for _, ep := range c.Scope {
		if restarts[ep.String()] {
			inScope = append(inScope, ep.String())
		}
	}
	if len(inScope) > 0 {
		slices.Sort(inScope)
		fail(nil, events.CodeRestartInScope, "the scope names episodes that restart here: %v", inScope)
		return
	}
	records, fresh, err := m.export(ctx, e)
	if ctx.Err() != nil {
		return // stopped by a resume or a lease expiry: no manifest, ever
	}
	if err != nil {
		fail(nil, events.CodeExportFailed, "export: %v", err)
		return
	}
	man, err := m.write(ctx, c.CheckpointID, records)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		fail(fresh, events.CodeExportFailed, "%v", err)
		return
	}
	m.post(ctx, RecordsWritten{Op: e.Op, Export: fresh, Manifest: man})
}

// export returns the records of the commit: the ones the checkpoint
// exported already, or the participant's, taken one at a time as its
// Export yields them (TakeExport). fresh is the new export, for the machine
// to keep; nil when the records were reused.
func (m *Member) export(ctx context.Context, e WriteCommit) (records []events.Record, fresh *Export, err error) {
	if e.Export != nil {
		return e.Export.Records, nil, nil
	}
	c := e.Commit
	var recs []events.Record
	if x, ok := m.cfg.Participant.(Exporter); ok {
		if recs, _, err = TakeExport(ctx, m.cfg.Run, c.CheckpointID, m.cfg.Member, x.Export(ctx, c)); err != nil {
			return nil, nil, err
		}
	}
	return recs, &Export{Scope: slices.Clone(c.Scope), Records: recs}, nil
}

// write stores the records of checkpoint id, in an object named by their
// digest (a rewrite is of the same bytes), and returns their manifest,
// which the commit ack carries. No records write nothing: the ack then
// carries no manifest.
func (m *Member) write(ctx context.Context, id string, records []events.Record) (events.MemberManifest, error) {
	if len(records) == 0 {
		return Digest(m.cfg.Run, id, m.cfg.Member, nil)
	}
	store, err := m.recordsStore(ctx)
	if err != nil {
		return events.MemberManifest{}, err
	}
	return WriteRecords(ctx, store, m.cfg.Run, id, m.cfg.Member, records)
}

// recordsStore returns the store the member writes its records to: its
// own (OwnRecords) when it connects with credentials of its own, whose
// user may write no other store; the shared BucketRecords otherwise. A
// member's own credentials are told by the inbox prefix jetstream.Connect
// set from them (jetstream.MemberInboxPrefix of its run and name).
func (m *Member) recordsStore(ctx context.Context) (natsjs.ObjectStore, error) {
	if m.cfg.Conn == nil || m.cfg.Conn.Opts.InboxPrefix != jetstream.MemberInboxPrefix(m.cfg.Run, string(m.cfg.Member.Kind()), m.cfg.Member.Name()) {
		return m.cfg.Bus.Records, nil
	}
	m.recordsMu.Lock()
	defer m.recordsMu.Unlock()
	if m.records == nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		store, err := OwnRecords(cctx, m.cfg.JS, m.cfg.Run, m.cfg.Member)
		if err != nil {
			return nil, err
		}
		m.records = store
	}
	return m.records, nil
}

// park frees what a stop commit exported, best effort, in a worker.
func (m *Member) park(ctx context.Context, e Park) {
	p, ok := m.cfg.Participant.(Parker)
	if !ok {
		return
	}
	m.lastPark++
	m.spawn(ctx, ^m.lastPark, e.CheckpointID, func(ctx context.Context) {
		log := m.log.With().Str("checkpoint", e.CheckpointID).Logger()
		if e.LeaseExpired {
			log.Warn().Msg("the lease ran out after a commit with stop and no outcome came: parking the export rather than resuming it")
		}
		if err := p.Park(ctx, e.Records); err != nil {
			log.Warn().Err(err).Msg("parking the exported work failed")
			return
		}
		log.Info().Int("records", len(e.Records)).Msg("exported work parked")
	})
}
