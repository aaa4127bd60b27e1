package member

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// TestPhaseLog: a phase's logger writes the phase's fields with each event
// at a level that is on, and makes no context for levels that are off.
func TestPhaseLog(t *testing.T) {
	var out bytes.Buffer
	base := zerolog.New(&out).Level(zerolog.WarnLevel)
	h := events.PhaseHeader{Run: "run1", CheckpointID: "ckpt-7", Seq: 12, Epoch: 3, Deadline: time.Now()}
	l := phaseLog(&base, h, events.PhasePrepare)
	l.Debug().Msg("off")
	l.Info().Msg("off too")
	if l.made != nil || out.Len() != 0 {
		t.Fatalf("events below the level: context made %v, wrote %q", l.made != nil, out.String())
	}
	l.Warn().Str("x", "y").Msg("on")
	got := out.String()
	for _, want := range []string{`"level":"warn"`, `"checkpoint":"ckpt-7"`, `"phase":"prepare"`, `"seq":12`, `"epoch":3`, `"x":"y"`, `"message":"on"`} {
		if !strings.Contains(got, want) {
			t.Errorf("%s: no %s", got, want)
		}
	}
	out.Reset()
	plainLog(&base).Error().Msg("plain")
	if got := out.String(); !strings.Contains(got, `"level":"error"`) || strings.Contains(got, "checkpoint") {
		t.Errorf("plain: %s", got)
	}
}
