package collect

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// ErrStopped is returned by Run after Stop: a checkpoint with stop
// committed, and the collection can be continued by running it again.
var ErrStopped = errors.New("collect: stopped after a committed checkpoint")

// ExitStopped is the exit status of a collection stopped by a checkpoint
// (EX_TEMPFAIL: run it again to continue).
const ExitStopped = 75

// Controller is the bridge as the collector drives it: *bridge.Bridge in
// process or *client.Client over HTTP.
type Controller interface {
	Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error)
	Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error)
	Retire(ctx context.Context, episodes []string) (*bridgeapi.OpResult, error)
	Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error)
	Status(ctx context.Context) (*bridgeapi.Status, error)
	Branch(ctx context.Context, req bridgeapi.BranchRequest) (*bridgeapi.BranchResult, error)
}

var _ Controller = (*client.Client)(nil) // *bridge.Bridge: progress_test.go

// Task is one line of the tasks file.
type Task struct {
	RolloutID string          `json:"rollout_id"`
	Task      json.RawMessage `json:"task"`
	// BranchOf and Branch name, for a branch the collection adopted
	// (branch.go), its parent rollout and its number.
	BranchOf string `json:"branch_of,omitempty"`
	Branch   int    `json:"branch,omitempty"`
}

// ReadTasks reads a tasks JSONL file, checking every line; a duplicate
// rollout id is an error.
func ReadTasks(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Task
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(trimSpace(line)) == 0 {
			continue
		}
		var t Task
		if err := json.Unmarshal(line, &t); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if err := events.ValidateRollout("rollout_id", t.RolloutID); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if len(t.Task) == 0 {
			return nil, fmt.Errorf("%s:%d: no task", path, n)
		}
		if prev, ok := seen[t.RolloutID]; ok {
			return nil, fmt.Errorf("%s:%d: rollout %s already on line %d", path, n, t.RolloutID, prev)
		}
		seen[t.RolloutID] = n
		out = append(out, t)
	}
	return out, sc.Err()
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// Config configures a Collector.
type Config struct {
	// Run is the run id. Required.
	Run string
	// Tasks are the rollouts to collect. Required.
	Tasks []Task
	// Output is the results file (JSONL, one line per rollout). Required.
	Output string
	// DispatchLog is the dispatch log (default Output + ".dispatch").
	DispatchLog string
	// Trajectories, when set, is a directory that gets each result's
	// trajectory (the agent's capture file from the store, checked against
	// the result's sha256 and size) as <rollout>.jsonl, written before the
	// result.
	Trajectories string
	// Agents are the names of the run's agents. Required.
	Agents []string
	// Conn reaches the agents; JS and Bus read the fleet's state.
	// Required.
	Conn *nats.Conn
	JS   natsjs.JetStream
	Bus  *jetstream.Bus
	// Controller is the bridge. Required.
	Controller Controller
	// Concurrency bounds the rollouts in flight (default 64).
	Concurrency int
	// CheckpointEvery takes a checkpoint this often (0: only on request).
	CheckpointEvery time.Duration
	// Keep is how many committed checkpoints to keep (the rest are
	// released after each commit). At the end, Keep 0 releases everything.
	Keep int
	// InfraAttempts is how many attempts a rollout is given that the
	// infrastructure fails (agentapi.CodeInfra: its sandbox would not
	// start, a fork, an exec or a grade failed on the owner's or a
	// daemon's side) before its line is written infra_failed (default 3).
	// Each is retired and sent again as the next attempt.
	InfraAttempts int
	// RecoverGrace is how long a collector that saw the fleet restart waits
	// for every agent and owner to come back (default 60 s); a partial loss
	// (some restarted, the others answer as the processes that served) is
	// decided without waiting it out.
	RecoverGrace time.Duration
	// RestoreTimeout is the deadline of the restore phase the collector
	// asks for (default 5 minutes). A restore forks every snapshot, which
	// on a busy machine or with microVMs takes longer than a checkpoint's
	// phase, and one that runs out starts every unfinished rollout over:
	// beside that, waiting costs little. A member that dies fails the
	// restore at once, whatever its deadline.
	RestoreTimeout time.Duration
	// AskAgain is how often a rollout request still unanswered is asked
	// again (default 30 s). Core NATS delivers at most once: an answer
	// lost with the agent's connection (a partition of its node) is a
	// loss the collector's connection never sees, and the agent answers a
	// repeat from the run it has, never with a second one.
	AskAgain time.Duration
	// OnCommit, when set, is called after each committed checkpoint, before
	// older ones are released (the demo verifies every member manifest).
	OnCommit func(ctx context.Context, res *bridgeapi.CheckpointResult)
	// Logger receives structured logs.
	Logger zerolog.Logger
	// Progress, when set, receives a live status line (a terminal).
	Progress io.Writer
	// Metrics, when set, receives the collector's metrics: results written
	// and how they continued after checkpoints. nil: off.
	Metrics *metrics.Set
}

// Result is one line of the output file.
type Result struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	Episode   string `json:"episode"`
	Agent     string `json:"agent"`
	OK        bool   `json:"ok"`
	Error     string `json:"error,omitempty"`
	// Outcome tells the three kinds of line apart: OutcomeGraded (OK, a
	// result), OutcomeFailed (the rollout's own failure) and
	// OutcomeInfraFailed (the infrastructure failed every attempt the
	// rollout was given: no result of it, which a trainer filters out).
	// Empty in lines written before it was: OK tells those apart.
	Outcome string        `json:"outcome,omitempty"`
	Result  *agent.Result `json:"result,omitempty"`
	Time    time.Time     `json:"time"`
	// BranchOf and Branch are a branch's parent rollout and number
	// (events.BranchRollout); empty for a rollout of the tasks.
	BranchOf string `json:"branch_of,omitempty"`
	Branch   int    `json:"branch,omitempty"`
}

// The outcomes of a results line (Result.Outcome).
const (
	OutcomeGraded      = "graded"
	OutcomeFailed      = "failed"
	OutcomeInfraFailed = "infra_failed"
)

// dispatchEntry is one line of the dispatch log.
type dispatchEntry struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	Agent     string `json:"agent"`
	// Instance is the agent process's instance when it was sent, and
	// Owners the owners' instances: a recovery asks that process again, or
	// knows it (or the owner of its sandbox) is gone.
	Instance string    `json:"instance,omitempty"`
	Owners   string    `json:"owners,omitempty"`
	Time     time.Time `json:"time"`
}

// CheckpointStat is one checkpoint the collector asked for.
type CheckpointStat struct {
	ID        string `json:"checkpoint_id"`
	Status    string `json:"status"`
	Stop      bool   `json:"stop,omitempty"`
	PrepareMS int64  `json:"prepare_ms"`
	CommitMS  int64  `json:"commit_ms"`
	Continued int    `json:"continued"`
	// Carried counts the episodes it holds through an older checkpoint
	// (their members were gone), Retired those it names retired.
	Carried int    `json:"carried,omitempty"`
	Retired int    `json:"retired,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Began is when the collector asked for it.
	Began time.Time `json:"began"`
}

// Summary is what a collection did.
type Summary struct {
	Rollouts int `json:"rollouts"`
	// Results counts the output's lines (this run and earlier ones);
	// Failed those with an error, InfraFailed those of them the
	// infrastructure failed (no result of the rollout); InfraRetried
	// counts attempts ended by an infrastructure fault and sent again.
	Results      int `json:"results"`
	Failed       int `json:"failed"`
	InfraFailed  int `json:"infra_failed"`
	InfraRetried int `json:"infra_retried"`
	// ContinuedInPlace counts results with a launch a checkpoint paused and
	// that went on; Relaunched those with a launch that continued a saved
	// session (after a stop or a crash); Restored those continued from a
	// restored checkpoint.
	ContinuedInPlace int `json:"continued_in_place"`
	Relaunched       int `json:"relaunched"`
	// Rebinds counts, by outcome (resumed_in_place, relay_gone,
	// identity_changed, not_holding, ended_collected, takeover_failed),
	// what restores did with the launches a process-keeping snapshot
	// kept, over the results' launch logs.
	Rebinds     map[string]int   `json:"rebinds,omitempty"`
	Restored    int              `json:"restored"`
	Checkpoints []CheckpointStat `json:"checkpoints"`
	Restores    []string         `json:"restores"`
	// Rejoins are the checkpoints rejoins continued the rollouts of
	// members that came back from (PROTOCOL §5, Rejoin).
	Rejoins    []string      `json:"rejoins,omitempty"`
	Recoveries int           `json:"recoveries"`
	Retired    int           `json:"retired"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	// Branches are the branches adopted (counted in Rollouts), with their
	// outcomes and rewards; BranchesFailed counts the branches of branch
	// operations that failed (retired, never collected).
	Branches       []BranchStat `json:"branches,omitempty"`
	BranchesFailed int          `json:"branches_failed,omitempty"`
}

// Committed returns the committed checkpoints.
func (s *Summary) Committed() []CheckpointStat {
	var out []CheckpointStat
	for _, c := range s.Checkpoints {
		if c.Status == bridgeapi.StatusCommitted {
			out = append(out, c)
		}
	}
	return out
}

// flight is one request in flight.
type flight struct {
	cancel context.CancelFunc
	gen    uint64
}

// Collector runs one collection.
type Collector struct {
	cfg   Config
	log   zerolog.Logger
	byID  map[string]Task
	start time.Time

	mu      sync.Mutex
	out     *os.File
	dlog    *os.File
	done    map[string]Result // by rollout id
	attempt map[string]int    // the attempt to send next (or in flight)
	route   map[string]string // rollout -> agent name, from a restored checkpoint
	// agentOwner is the owner each agent's heartbeat names (agent name
	// -> owner member): whose restart loses its rollouts.
	agentOwner map[string]events.Member
	infra      map[string]int // rollout -> attempts the infrastructure ended
	// startOvers counts each rollout's attempts started over (parked,
	// stale, its session held, its sandbox lost): the later ones wait
	// (startOverWait).
	startOvers map[string]int
	sentTo     map[string]dispatchEntry // rollout -> its last dispatch
	// restoredQ are the attempts a restore or a rejoin queued (rollout ->
	// attempt): their next send is a first one, to whichever process the
	// restore installed them in; any other send of an attempt sent before
	// names the process it went to (agent.Request.SentTo).
	restoredQ map[string]int
	instances map[string]string // member -> its live instance
	inflight  map[string]*flight
	queue     []string
	sum       Summary
	ckptOpen  bool
	lastEvent string
	// redrawNow asks the live line to be drawn at once (a checkpoint
	// opened or ended), not at the next tick.
	redrawNow chan struct{}
	// tick is how often the live line is redrawn; zero is 250 ms.
	tick       time.Duration
	stopping   bool
	recovering bool
	// pendingRetire are attempts to retire before more dispatches.
	pendingRetire []string
	// fatal ends Run: a result that could not be written.
	fatal error
	gen   uint64
	// ckptSeq counts the checkpoints this collector named.
	ckptSeq int

	// retries are unfinished rollouts to queue again (Run's loop does).
	retries []retry

	// branches are the branches adopted, by rollout; branchOpen the branch
	// operations whose phase is on the stream without an outcome yet,
	// branchClosed those with one; branchSeq the stream sequence of the
	// last branch event read (branch.go).
	branches     map[string]branchInfo
	branchOpen   map[string]bool
	branchClosed map[string]bool
	branchSeq    uint64

	ckptNow chan struct{}
	stopNow chan struct{}
	stopped bool
	changed chan struct{} // a rollout ended
	fleet   chan string   // a member restarted: the reason

	// work holds the goroutines Run starts: one per request in flight and
	// the fleet watcher. Run waits for them before it returns.
	work sync.WaitGroup
}

// New checks cfg and returns a collector ready to Run.
func New(cfg Config) (*Collector, error) {
	var errs []error
	if err := events.ValidateRun(cfg.Run); err != nil {
		errs = append(errs, fmt.Errorf("collect: Run: %w", err))
	}
	if len(cfg.Tasks) == 0 {
		errs = append(errs, errors.New("collect: no tasks"))
	}
	if cfg.Output == "" {
		errs = append(errs, errors.New("collect: Output is required"))
	}
	if len(cfg.Agents) == 0 {
		errs = append(errs, errors.New("collect: Agents is required"))
	}
	for _, a := range cfg.Agents {
		if err := events.ValidateToken("agent", a); err != nil {
			errs = append(errs, fmt.Errorf("collect: Agents: %w", err))
		}
	}
	if cfg.Conn == nil || cfg.JS == nil || cfg.Bus == nil || cfg.Controller == nil {
		errs = append(errs, errors.New("collect: Conn, JS, Bus and Controller are required"))
	}
	if cfg.Keep < 0 || cfg.Concurrency < 0 || cfg.AskAgain < 0 {
		errs = append(errs, errors.New("collect: Keep, Concurrency and AskAgain must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.DispatchLog == "" {
		cfg.DispatchLog = cfg.Output + ".dispatch"
	}
	cfg.Metrics.InitCollector()
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 64
	}
	if cfg.RecoverGrace == 0 {
		cfg.RecoverGrace = 60 * time.Second
	}
	if cfg.InfraAttempts == 0 {
		cfg.InfraAttempts = 3
	}
	if cfg.RestoreTimeout == 0 {
		cfg.RestoreTimeout = 5 * time.Minute
	}
	if cfg.AskAgain == 0 {
		cfg.AskAgain = 30 * time.Second
	}
	c := &Collector{cfg: cfg, log: cfg.Logger.With().Str("run", cfg.Run).Str("component", "collect").Logger(),
		byID: map[string]Task{}, done: map[string]Result{}, attempt: map[string]int{}, route: map[string]string{}, agentOwner: map[string]events.Member{}, infra: map[string]int{}, startOvers: map[string]int{},
		sentTo: map[string]dispatchEntry{}, restoredQ: map[string]int{}, instances: map[string]string{},
		branches: map[string]branchInfo{}, branchOpen: map[string]bool{}, branchClosed: map[string]bool{},
		inflight: map[string]*flight{}, ckptNow: make(chan struct{}, 1), stopNow: make(chan struct{}),
		changed: make(chan struct{}, 1), fleet: make(chan string, 1), redrawNow: make(chan struct{}, 1)}
	for _, t := range cfg.Tasks {
		if _, dup := c.byID[t.RolloutID]; dup {
			return nil, fmt.Errorf("collect: rollout %s twice in the tasks", t.RolloutID)
		}
		c.byID[t.RolloutID] = t
	}
	return c, nil
}

// CheckpointNow asks for a checkpoint as soon as none is open.
func (c *Collector) CheckpointNow() {
	select {
	case c.ckptNow <- struct{}{}:
	default:
	}
}

// Stop asks for a checkpoint with stop; Run then returns ErrStopped once
// it committed.
func (c *Collector) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped {
		c.stopped = true
		close(c.stopNow)
	}
}

// Summary returns what the collection did so far.
func (c *Collector) Summary() Summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sum
	s.Checkpoints = slices.Clone(s.Checkpoints)
	s.Restores = slices.Clone(s.Restores)
	s.Rejoins = slices.Clone(s.Rejoins)
	s.Rollouts = len(c.cfg.Tasks)
	s.Branches = c.branchStats()
	s.Results, s.Failed, s.InfraFailed, s.ContinuedInPlace, s.Relaunched, s.Restored = 0, 0, 0, 0, 0, 0
	s.Rebinds = nil
	for _, r := range c.done {
		s.Results++
		if !r.OK {
			s.Failed++
			if r.Outcome == OutcomeInfraFailed {
				s.InfraFailed++
			}
			continue
		}
		for _, l := range r.Result.Launches {
			if l.Rebind != "" {
				if s.Rebinds == nil {
					s.Rebinds = map[string]int{}
				}
				s.Rebinds[l.Rebind]++
			}
		}
		inPlace, relaunched := continuedHow(r.Result)
		if inPlace {
			s.ContinuedInPlace++
		}
		if relaunched {
			s.Relaunched++
		}
		if r.Result.Restored {
			s.Restored++
		}
	}
	if !c.start.IsZero() {
		s.Elapsed = time.Since(c.start)
	}
	return s
}

// continuedHow tells whether a result has a launch a checkpoint paused and
// that went on to finish in place, and whether it has one that continued
// a saved session (a relaunch).
func continuedHow(r *agent.Result) (inPlace, relaunched bool) {
	if r == nil {
		return false, false
	}
	for _, l := range r.Launches {
		inPlace = inPlace || (l.Pauses > 0 && l.Ended == agent.LaunchFinished)
		relaunched = relaunched || l.Continued
	}
	return inPlace, relaunched
}

// Results returns the results written so far, by rollout id.
func (c *Collector) Results() map[string]Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Result, len(c.done))
	for k, v := range c.done {
		out[k] = v
	}
	return out
}

// agentOf returns the agent a rollout goes to: the one that holds it in
// the restored checkpoint, else one chosen by hash.
func (c *Collector) agentOf(id string) string {
	if a, ok := c.route[id]; ok {
		return a
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	// An attempt after an infrastructure fault goes to the next agent:
	// the one that failed it may sit on the failing node.
	return c.cfg.Agents[(int(h.Sum32()%uint32(len(c.cfg.Agents)))+c.infra[id])%len(c.cfg.Agents)]
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
