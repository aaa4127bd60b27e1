package member

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Checkpoint names the checkpoint a prepare (or a commit's readiness
// re-check) is about.
type Checkpoint struct {
	// Run is the run id.
	Run string
	// ID is the checkpoint id.
	ID string
	// Seq is the sequence of the phase event that asked.
	Seq uint64
	// Epoch is the run's epoch.
	Epoch uint64
	// Deadline is when the bridge stops waiting for the answer.
	Deadline time.Time
}

// Report is a participant's readiness (PROTOCOL §5, prepare).
type Report struct {
	// Ready tells whether every piece of the participant's work is at a
	// boundary. A report that is Ready and lists Blockers counts as not
	// ready: the runtime fails closed.
	Ready bool
	// Blockers are the keys (capture keys, session ids) not at a boundary
	// yet; all of them, the runtime caps the list it sends.
	Blockers []string
	// Restarts are the episode capture keys the participant cannot capture;
	// they do not block, they restart from their input after a crash.
	Restarts []string
	// Counts are the participant's own tallies (runs parked, sessions
	// held), at most 64 entries.
	Counts map[string]int
	// Pause is what a sandbox daemon did to its launch (PROTOCOL §6); it
	// goes into the prepare ack.
	Pause *events.PauseReport
}

// validate checks what the report will put into an ack, so that a
// participant's mistake fails its prepare instead of its ack.
func (r Report) validate() error {
	var errs []error
	for i, b := range r.Blockers {
		if b == "" || len(b) > 256 {
			errs = append(errs, fmt.Errorf("blockers[%d]: must be 1 to 256 bytes", i))
			break
		}
	}
	for i, k := range r.Restarts {
		if _, err := events.ParseEpisode(k); err != nil {
			errs = append(errs, fmt.Errorf("restarts[%d]: %w", i, err))
			break
		}
	}
	if len(r.Counts) > 64 {
		errs = append(errs, fmt.Errorf("counts: %d entries, limit 64", len(r.Counts)))
	}
	return errors.Join(errs...)
}

// Participant is what every member drives: the one required method.
//
// Prepare closes admission on its first call for a checkpoint (new work
// waits for the resume; short requests in flight finish) and reports
// readiness. The runtime calls it again whenever the participant calls
// Member.Notify, and at least every Config.PollEvery, until the report is
// ready or the phase deadline draws near; once more at commit, to check that
// readiness has not regressed. It reports; it must not wait for readiness
// itself, and must return promptly when ctx is done. Two prepare events of
// the same checkpoint may call it concurrently. Resumer.Resume may be
// called without a Prepare before it (a resume that arrives before the
// first call), and must then do nothing harmful.
type Participant interface {
	Prepare(ctx context.Context, cp Checkpoint) (Report, error)
}

// PrepareFunc adapts a function to Participant.
type PrepareFunc func(ctx context.Context, cp Checkpoint) (Report, error)

// Prepare calls f.
func (f PrepareFunc) Prepare(ctx context.Context, cp Checkpoint) (Report, error) { return f(ctx, cp) }

// Exporter is implemented by a participant with state to checkpoint.
// Export yields the records of the commit's scope one by one, and an
// error (with a zero record) to fail the export; Records adapts a slice.
// The runtime writes each record as it comes (PROTOCOL §5, commit):
// sha256 as it goes, the stop signal checked before each; so a
// participant with much to export can stream it, and one that needs time
// per record takes it inside the iteration, where ctx ending stops it.
// Export is called once per checkpoint id: the runtime keeps the records,
// and a redelivered or repeated commit writes them again, as does Park. A
// participant without Exporter exports zero records (its member manifest
// is still created). Do not change a record's Data once it is yielded.
type Exporter interface {
	Export(ctx context.Context, c events.Commit) iter.Seq2[events.Record, error]
}

// Records yields records, or only err when it is not nil: an export that
// has its records at hand.
func Records(records []events.Record, err error) iter.Seq2[events.Record, error] {
	return func(yield func(events.Record, error) bool) {
		if err != nil {
			yield(events.Record{}, err)
			return
		}
		for _, r := range records {
			if !yield(r, nil) {
				return
			}
		}
	}
}

// Resumer is implemented by a participant that closes admission: Resume
// reopens it (parked work continues). It is called on a resume, on a lease
// expiry, after a prepare that failed and after a restore that failed.
type Resumer interface {
	Resume(ctx context.Context, checkpointID string) error
}

// Continuer is a Resumer that says what it did: a sandbox daemon continues
// its paused launch and reports it, and the report goes into the resume
// ack. When a participant implements Continuer, Resume is not called.
type Continuer interface {
	Continue(ctx context.Context, checkpointID string) (*events.PauseReport, error)
}

// Installer is implemented by a participant that can be restored. Install
// gets the records of its own member manifest in the source checkpoint,
// already verified (size, sha256, count) and filtered to the restore's
// scope, and installs all of them or none; it returns the checkpointed
// episodes it installed (they continue as their Next attempt). If ctx is
// done it must install nothing and return an error.
type Installer interface {
	Install(ctx context.Context, r events.Restore, records []events.Record) (restored []events.Episode, err error)
}

// Brancher is implemented by a participant that can branch what it
// installs (PROTOCOL §5, Branch). Branch reads the member's records of the
// branch phase's parents (records: those the source checkpoint, or the
// older one that carried a parent, holds) and installs, for each
// BranchSpec whose parent they hold, a copy that continues as the
// branch's episode, beside everything the member runs; all or none. It
// returns the branch episodes it installed (none when it holds no parent).
// If ctx is done it must install nothing and return an error. A retire of
// a branch episode undoes its install (Retirer).
type Brancher interface {
	Branch(ctx context.Context, b events.Branch, records []events.Record) (branched []events.Episode, err error)
}

// Retirer is implemented by a participant that runs per-episode work.
// Retire stops the work of the given attempts (and their earlier
// attempts) and waits until it has stopped. The runtime has already marked
// them refused (Member.Admit). It must tolerate repeats; a retire cut short
// must leave what still runs tracked, so that a retry stops it.
type Retirer interface {
	Retire(ctx context.Context, episodes []events.Episode) error
}

// Forgetter is implemented by a participant that keeps its own per-rollout
// refusal state; the runtime drops its retire marks itself.
type Forgetter interface {
	Forget(ctx context.Context, rollouts []string) error
}

// Releaser is implemented by a participant with external state that
// checkpoints name (an owner's snapshots). Release deletes what no kept
// checkpoint names and returns the ids it deleted.
type Releaser interface {
	Release(ctx context.Context, keep []string) (deleted []string, err error)
}

// Parker is implemented by a participant that holds compute outside the
// process (sandboxes). After a commit with stop, once the outcome
// checkpoint.committed shows the checkpoint is durable, Park frees what
// the exported records hold. Best effort: failures are logged.
type Parker interface {
	Park(ctx context.Context, records []events.Record) error
}
