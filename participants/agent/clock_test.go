package agent

import (
	"testing"
	"time"
)

// The clock after a restore (PROTOCOL §6): set or kept continuous only when
// the pause froze the launch; left alone when it did not; the host policy
// sets the host's time where the provider can set a clock at all.
func TestClockDecisionOnlyWhenFrozen(t *testing.T) {
	pause := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := pause.Add(3 * time.Hour) // a provider that set the guest to host time
	base := clockFacts{Policy: ClockContinuous, PauseWall: pause, PauseUptime: 100, NowWall: now, NowUptime: 102.5}
	cases := []struct {
		name string
		edit func(*clockFacts)
		want clockAction
		wall time.Time
	}{
		{"not frozen: left", func(f *clockFacts) { f.SetsClock = true }, clockLeave, time.Time{}},
		{"not frozen, continuous provider: left", func(f *clockFacts) { f.Continuous, f.SetsClock = true, true }, clockLeave, time.Time{}},
		{"frozen, continuous provider: kept", func(f *clockFacts) { f.Frozen, f.Continuous, f.SetsClock = true, true, true }, clockKept, pause.Add(2500 * time.Millisecond)},
		{"frozen, provider sets host time: set back", func(f *clockFacts) { f.Frozen, f.SetsClock = true, true }, clockSetBack, pause.Add(2500 * time.Millisecond)},
		{"frozen, cannot set: left", func(f *clockFacts) { f.Frozen = true }, clockLeave, time.Time{}},
		{"uptime went backwards: no negative elapsed", func(f *clockFacts) { f.Frozen, f.SetsClock, f.NowUptime = true, true, 50 }, clockSetBack, pause},
		{"host policy: host time", func(f *clockFacts) { f.Policy, f.SetsClock = ClockHost, true }, clockSetHost, time.Time{}},
		{"host policy, frozen: host time all the same", func(f *clockFacts) { f.Policy, f.Frozen, f.SetsClock = ClockHost, true, true }, clockSetHost, time.Time{}},
		{"host policy, cannot set: left", func(f *clockFacts) { f.Policy = ClockHost }, clockLeave, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := base
			c.edit(&f)
			d := decideClock(f)
			if d.Action != c.want || !d.Wall.Equal(c.wall) || d.Why == "" {
				t.Fatalf("decideClock(%+v) = %v (wall %s), want %v (wall %s)", f, d, d.Wall, c.want, c.wall)
			}
		})
	}
}
