package agent

import (
	"fmt"
	"time"
)

// ClockPolicy is what a restore that takes a launch over in place does with
// its sandbox's wall clock (Config.ClockPolicy).
type ClockPolicy string

// The clock policies.
const (
	// ClockContinuous keeps the sandbox's clock continuous with the moment
	// of the pause when the pause froze the launch (nothing of it ran on
	// the clock the restore jumps), and leaves it alone otherwise.
	ClockContinuous ClockPolicy = "continuous"
	// ClockHost sets the sandbox's clock to the host's time, for harnesses
	// that need real time (TLS and the like).
	ClockHost ClockPolicy = "host"
)

// clockAction is what a clock decision does.
type clockAction uint8

const (
	// clockLeave leaves the sandbox's clock as the restore left it.
	clockLeave clockAction = iota
	// clockKept: the provider's forks already run on from the snapshot's
	// instant, which is what continuity asks; nothing to set.
	clockKept
	// clockSetBack sets the clock to the pause's wall clock plus the
	// sandbox's uptime since the pause.
	clockSetBack
	// clockSetHost sets the clock to the host's time.
	clockSetHost
)

var clockActionNames = [...]string{"leave", "kept_continuous", "set_back", "set_host"}

// String returns the action's log name.
func (a clockAction) String() string {
	if int(a) < len(clockActionNames) {
		return clockActionNames[a]
	}
	return fmt.Sprintf("clockAction(%d)", uint8(a))
}

// clockFacts is what a clock decision is made from: the policy, the held
// pause (did it freeze; the sandbox's wall clock and uptime when it was
// acknowledged), the sandbox's clocks now, and how the provider's forks
// keep time.
type clockFacts struct {
	Policy ClockPolicy
	// Frozen tells the held pause froze the launch.
	Frozen bool
	// PauseWall and PauseUptime are the sandbox's clocks at the pause.
	PauseWall   time.Time
	PauseUptime float64
	// NowWall and NowUptime are the sandbox's clocks now (the restored
	// daemon's answer).
	NowWall   time.Time
	NowUptime float64
	// Continuous tells the provider's forks run on from the snapshot's
	// instant (provider clock "continuous"); SetsClock that the owner can
	// set a sandbox's clock.
	Continuous bool
	SetsClock  bool
}

// clockDecision is a decision: the action, the wall clock to set
// (clockSetBack; zero for the host's time) and why, for the log and the
// launch record.
type clockDecision struct {
	Action clockAction
	Wall   time.Time
	Why    string
}

// String returns "<action>: <why>".
func (d clockDecision) String() string { return d.Action.String() + ": " + d.Why }

// decideClock decides what to do with a restored sandbox's clock. It is
// pure: the facts in, the decision out.
func decideClock(f clockFacts) clockDecision {
	if f.Policy == ClockHost {
		if !f.SetsClock {
			return clockDecision{Action: clockLeave, Why: "policy host, but the provider cannot set a sandbox's clock"}
		}
		return clockDecision{Action: clockSetHost, Why: "policy host: the sandbox's clock goes to the host's time"}
	}
	if !f.Frozen {
		return clockDecision{Action: clockLeave, Why: "the pause did not freeze the launch: its processes ran on the clock, which stays as the restore left it"}
	}
	elapsed := max(f.NowUptime-f.PauseUptime, 0)
	want := f.PauseWall.Add(time.Duration(elapsed * float64(time.Second)))
	if f.Continuous {
		return clockDecision{Action: clockKept, Wall: want,
			Why: fmt.Sprintf("the pause froze the launch and the provider's forks run on from the snapshot's instant (%.3fs of uptime since the pause, wall %s, continuous %s)",
				elapsed, f.NowWall.UTC().Format(time.RFC3339Nano), want.UTC().Format(time.RFC3339Nano))}
	}
	if !f.SetsClock {
		return clockDecision{Action: clockLeave, Why: "the pause froze the launch, but the provider cannot set a sandbox's clock back"}
	}
	return clockDecision{Action: clockSetBack, Wall: want,
		Why: fmt.Sprintf("the pause froze the launch: the clock goes back to the pause's wall clock plus %.3fs of uptime since it", elapsed)}
}
