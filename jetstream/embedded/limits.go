package embedded

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/jwt/v2"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// Limits bound what every run's account may hold: Storage is the bytes of JetStream storage a
// run's streams may use together (-1: no bound). A member that floods its run's stream fills its
// own run's quota; no other run's.
type Limits struct {
	Storage int64 `json:"storage"`
}

// limitsFile is where SetLimits keeps the limits, in the authority's dir.
const limitsFile = "limits.json"

// Limits returns the limits of the runs' accounts (SetLimits; no bound when never set).
func (a *Authority) Limits() Limits {
	b, err := os.ReadFile(filepath.Join(a.dir, limitsFile))
	var l Limits
	if err != nil || json.Unmarshal(b, &l) != nil || l.Storage == 0 {
		return Limits{Storage: -1}
	}
	return l
}

// SetLimits keeps l in the authority's dir and writes every run's account JWT again with it, so
// that a server on the dir applies it (WatchRuns), and runs added later get it too.
func (a *Authority) SetLimits(l Limits) error {
	if l.Storage == 0 || l.Storage < -1 {
		return fmt.Errorf("%w: Limits.Storage %d: want -1 (no bound) or a positive byte count", ErrInvalidConfig, l.Storage)
	}
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(a.dir, limitsFile), b, 0o600); err != nil {
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
