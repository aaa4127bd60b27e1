package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// ErrResidentClosed is returned by Join once the Resident's Run has
// ended, or before it started.
var ErrResidentClosed = errors.New("daemon: resident not running")

// Identity is one bus identity of a Resident: the member sandbox.<SandboxID>
// of Run, reached through Conn.
type Identity struct {
	// Run and SandboxID name the member. Required.
	Run       string
	SandboxID string
	// Conn says how to reach the bus. Every connection of a Resident gets
	// an inbox prefix of its own, drawn from crypto/rand.
	Conn jetstream.ConnConfig
	// Grace is the member's lease grace (default member.DefaultGrace).
	Grace time.Duration
	// AdoptEpoch is the restore's epoch when a fork's sandboxd is adopted
	// with its launches (Config.AdoptEpoch); 0 for a first identity.
	AdoptEpoch uint64
	// Failpoints are the daemon's (Config.Failpoints).
	Failpoints Failpoints
}

// ResidentConfig configures a Resident.
type ResidentConfig struct {
	// Supervisor runs the launches for the Resident's whole life; the
	// Resident runs it. Required.
	Supervisor *sandboxd.Supervisor
	// Relay, when set, is the sandbox's model relay, given to every
	// daemon of the Resident (Config.Relay): it outlives them, and a
	// restored fork's daemon finds it still holding. Its maker runs it.
	Relay Relay
	// Logger receives the logs.
	Logger zerolog.Logger
	// Stopped, when set, is called when a daemon stops by itself
	// (superseded, replaced, or its member failed), from the daemon's
	// goroutine, once its launches are stopped.
	Stopped func(member events.Member, err error)
}

// Resident is sandboxd as a microVM's init runs it: one Supervisor for the
// process's whole life, and on it one Daemon at a time. Join starts the
// daemon of an identity, replacing the one that runs: a fork of a memory
// snapshot (same process, same launches, same pids) takes a new sandbox id
// that way. The old daemon is detached first without touching shared
// state: its connection is closed before it is stopped, so nothing more
// of the old member reaches the bus (no leave, no heartbeat, no key
// deleted: the old name belongs to the snapshot's original sandbox, which
// may still run elsewhere). The new daemon gets a new connection with a
// random inbox prefix, a member instance and consumer name drawn from
// crypto/rand (reseed the kernel RNG first), the same state directory
// (launch records, episodes) and the epoch its restore adopts it into.
type Resident struct {
	cfg ResidentConfig
	log zerolog.Logger

	started chan struct{} // closed once Run runs

	mu      sync.Mutex // serialises Join, and guards what follows
	running bool
	runCtx  context.Context
	cur     *served
	wg      sync.WaitGroup // the daemons' goroutines
}

// served is a daemon the Resident runs, with its connection.
type served struct {
	d        *Daemon
	nc       *nats.Conn
	cancel   context.CancelFunc
	detached atomic.Bool // set before the connection is closed under it
	done     chan struct{}
	err      error // set before done closes
}

// NewResident returns a Resident; Run runs it.
func NewResident(cfg ResidentConfig) (*Resident, error) {
	if cfg.Supervisor == nil {
		return nil, errors.New("daemon: ResidentConfig.Supervisor is required")
	}
	return &Resident{cfg: cfg, log: cfg.Logger.With().Str("component", "resident").Logger(), started: make(chan struct{})}, nil
}

// Run runs the supervisor until ctx ends, then stops the daemon that runs
// (it leaves the run) and waits for it.
func (r *Resident) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running || r.runCtx != nil {
		r.mu.Unlock()
		return sandboxd.ErrAlreadyRunning
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.running, r.runCtx = true, dctx
	close(r.started)
	r.mu.Unlock()
	err := r.cfg.Supervisor.Run(dctx)
	r.mu.Lock()
	r.running = false
	cur := r.cur
	r.mu.Unlock()
	if cur != nil {
		cur.cancel()
		<-cur.done
		cur.nc.Close()
	}
	r.wg.Wait()
	return err
}

// Member returns the member that runs now, if any.
func (r *Resident) Member() (events.Member, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return "", false
	}
	select {
	case <-r.cur.done:
		return "", false
	default:
	}
	return r.cur.d.Name(), true
}

// Join makes id the Resident's bus identity and returns once its member
// joined (its heartbeat is in sp_daemons). A daemon already running is
// detached and stopped first (see Resident). A Join that fails leaves no
// daemon running. Join waits for Run to start; once Run has returned it
// fails with ErrResidentClosed.
func (r *Resident) Join(ctx context.Context, id Identity) (events.Member, error) {
	select {
	case <-r.started:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return "", ErrResidentClosed
	}
	if old := r.cur; old != nil {
		r.cur = nil
		// Closed first: whatever the old member does from now on fails
		// locally and reaches no server. Marked before: a daemon that
		// stops on its closed connection has not stopped by itself, and
		// its launches go on.
		old.detached.Store(true)
		old.nc.Close()
		old.cancel()
		<-old.done
		r.log.Info().Str("old", string(old.d.Name())).Err(old.err).Msg("detached the old identity")
	}
	s, err := r.start(ctx, id)
	if err != nil {
		return "", err
	}
	select {
	case <-s.d.Joined():
		r.cur = s
		return s.d.Name(), nil
	case <-s.done:
		s.nc.Close()
		return "", fmt.Errorf("daemon: %s did not join: %w", s.d.Name(), s.err)
	case <-ctx.Done():
		s.detached.Store(true)
		s.nc.Close()
		s.cancel()
		<-s.done
		return "", ctx.Err()
	}
}

// start connects and starts the daemon of id on the supervisor. r.mu is
// held.
func (r *Resident) start(ctx context.Context, id Identity) (*served, error) {
	nc, err := jetstream.Connect(ctx, id.Conn, nats.CustomInboxPrefix("_INBOX."+events.NewID()))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		nc.Close()
		return nil, err
	}
	d, err := New(Config{Run: id.Run, SandboxID: id.SandboxID, JS: js, Bus: bus, Supervisor: r.cfg.Supervisor,
		Grace: id.Grace, AdoptEpoch: id.AdoptEpoch, Relay: r.cfg.Relay,
		Failpoints: id.Failpoints, Logger: r.cfg.Logger})
	if err != nil {
		nc.Close()
		return nil, err
	}
	dctx, cancel := context.WithCancel(r.runCtx)
	s := &served{d: d, nc: nc, cancel: cancel, done: make(chan struct{})}
	r.wg.Go(func() {
		s.err = d.Serve(dctx)
		close(s.done)
		joined := false
		select {
		case <-d.Joined():
			joined = true
		default:
		}
		// A daemon that never joined (the Join fails and says why) or that
		// Join detached has not stopped by itself.
		if dctx.Err() == nil && !s.detached.Load() && joined {
			// It stopped by itself: superseded, replaced, or failed. As Run
			// does when its daemon stops, its work stops: a superseded
			// member's launches must not go on beside the new epoch's.
			nc.Close()
			r.log.Warn().Err(s.err).Str("member", string(d.Name())).Msg("the daemon stopped; stopping its launches")
			r.stopLaunches(dctx)
			if r.cfg.Stopped != nil {
				r.cfg.Stopped(d.Name(), s.err)
			}
		}
	})
	return s, nil
}

// stopLaunchesWait bounds the kills of stopLaunches.
const stopLaunchesWait = 30 * time.Second

// stopLaunches kills every launch of the supervisor that has not ended.
func (r *Resident) stopLaunches(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, stopLaunchesWait)
	defer cancel()
	for _, rec := range r.cfg.Supervisor.List() {
		if rec.State == sandboxapi.StateEnded {
			continue
		}
		if _, err := r.cfg.Supervisor.Cancel(ctx, rec.ID); err != nil && !errors.Is(err, sandboxd.ErrUnknownLaunch) {
			r.log.Warn().Err(err).Str("launch", rec.ID).Msg("stop a launch of a daemon that stopped")
		}
	}
}
