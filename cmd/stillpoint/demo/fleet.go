package demo

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/child"
)

// FleetConfig is what NewFleet takes: a scripted task set on a NATS
// server that runs already.
type FleetConfig struct {
	// Env is where the fleet says what it does (Stdout) and logs its
	// warnings (Stderr).
	Env Env
	// Who starts the lines it says.
	Who string
	// Dir is the run's work directory: logs, results, the owners' state.
	Dir string
	// Program is the stillpoint binary the bridge, the owners and the
	// agents run as; Sandboxd and Harness the static binaries that go
	// into sandboxes.
	Program, Sandboxd, Harness string
	// NATSURL is the server's; Run the run id; Token the bridge's API
	// token.
	NATSURL, Run, Token string
	// Rollouts, Agents, Provider, Tool and Steps are the demo's
	// --rollouts, --agents, --provider, --tool-time and the scripted
	// tasks' tool calls.
	Rollouts, Agents int
	Provider         string
	Tool             time.Duration
	Steps            int
	// Wrap, when set, gives the argv that each process of the fleet is
	// started under, by the process's name ("bridge", "agent-a",
	// OwnerProc(owner)): a program that enters a network namespace and
	// then runs the rest, say. nil or an empty prefix starts the process
	// as it is.
	Wrap func(proc string) []string
	// RegisterWait bounds the wait for a process started again to register
	// (default 30 s); a node cut off from the bus registers only once the
	// cut heals.
	RegisterWait time.Duration
}

// NewFleet returns the world of one run of the scripted task set, with no
// process started yet.
func NewFleet(c FleetConfig) *Fleet {
	return &Fleet{env: c.Env, who: c.Who, dir: c.Dir, self: c.Program, sandboxd: c.Sandboxd, harness: c.Harness,
		natsURL: c.NATSURL, run: c.Run, token: c.Token, procs: map[string]*child.Process{}, wrap: c.Wrap, registerWait: c.RegisterWait,
		f:   demoFlags{rollouts: c.Rollouts, agents: c.Agents, provider: c.Provider, tool: c.Tool, steps: c.Steps, harness: harnessScripted},
		log: zerolog.New(c.Env.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()}
}

// Dir returns the run's work directory.
func (d *Fleet) Dir() string { return d.dir }

// RunID returns the run's id.
func (d *Fleet) RunID() string { return d.run }

// Token returns the bridge's API token.
func (d *Fleet) Token() string { return d.token }
