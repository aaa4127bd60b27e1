package embedded

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nats-io/jwt/v2"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// Limits bound what every run's account may hold and do, each -1 (or 0) for no bound. NATS counts
// them per account, so each bounds a run as a whole: a member that floods what it may make fills
// its own run's share, never another run's. There is no per-user quota in NATS (docs/PERMISSIONS.md,
// Limits).
type Limits struct {
	// Storage is the bytes of JetStream storage a run's streams may use together.
	Storage int64 `json:"storage"`
	// Consumers is how many JetStream consumers a run's streams may have at once.
	Consumers int64 `json:"consumers,omitempty"`
	// Connections is how many clients of a run may be connected at once.
	Connections int64 `json:"connections,omitempty"`
}

// NoLimits is Limits with no bound.
var NoLimits = Limits{Storage: -1, Consumers: -1, Connections: -1}

// withDefaults returns l with every unset (zero) field -1: no bound (a limits file of an earlier
// build names fewer fields).
func (l Limits) withDefaults() Limits {
	for _, f := range []*int64{&l.Storage, &l.Consumers, &l.Connections} {
		if *f == 0 {
			*f = -1
		}
	}
	return l
}

// validate names every field of l that is below -1.
func (l Limits) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{{"Storage", l.Storage}, {"Consumers", l.Consumers}, {"Connections", l.Connections}} {
		if f.v < -1 {
			errs = append(errs, fmt.Errorf("%w: Limits.%s %d: want -1 or 0 (no bound) or a positive count", ErrInvalidConfig, f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// limitsFile is where SetLimits keeps the limits, in the authority's dir.
func (a *Authority) limitsFile() atomicfile.JSON[Limits] {
	return atomicfile.JSON[Limits]{Path: filepath.Join(a.dir, "limits.json"), Perm: 0o600}
}

// Limits returns the limits of the runs' accounts (SetLimits; no bound when never set).
func (a *Authority) Limits() Limits {
	l, err := a.limitsFile().Read()
	if err != nil {
		return NoLimits
	}
	return l.withDefaults()
}

// SetLimits keeps l in the authority's dir and writes every run's account JWT again with it, so
// that a server on the dir applies it (WatchRuns), and runs added later get it too.
func (a *Authority) SetLimits(l Limits) error {
	if err := l.validate(); err != nil {
		return err
	}
	if err := a.limitsFile().Write(l.withDefaults()); err != nil {
		return fmt.Errorf("embedded: limits: %w", err)
	}
	for _, run := range a.Runs() {
		ra, err := a.run(run)
		if err != nil {
			return err
		}
		if err := a.writeAccountJWT(ra); err != nil {
			return err
		}
	}
	return nil
}

// SandboxSubs is how many subscriptions a sandbox's user may hold at once: its daemon needs a
// few dozen (its service, its feed, its inbox); a workload that read its credentials gets no more.
const SandboxSubs = 256

// memberLimits are the NATS limits of a member kind's users: a sandbox's subscriptions are
// bounded (SandboxSubs); a message is at most the server's max payload, as for every client.
func memberLimits(k events.MemberKind) jwt.NatsLimits {
	l := jwt.NatsLimits{Subs: jwt.NoLimit, Data: jwt.NoLimit, Payload: jwt.NoLimit}
	if k == events.KindSandbox {
		l.Subs = SandboxSubs
	}
	return l
}
