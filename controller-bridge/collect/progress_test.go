package collect

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// draws is a terminal that hands each drawing of the live line to the
// test.
type draws chan string

// The bridge in process is a Controller, as the HTTP client is.
var _ Controller = (*bridge.Bridge)(nil)

func (d draws) Write(p []byte) (int, error) {
	d <- string(p)
	return len(p), nil
}

// next waits for a drawing that contains want, and fails the test after
// ten seconds.
func (d draws) next(t *testing.T, want string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-d:
			if strings.Contains(s, want) {
				return s
			}
		case <-timeout:
			t.Fatalf("no drawing of the live line says %q", want)
		}
	}
}

// TestLiveLineRedrawnWhenACheckpointOpensAndEnds: the line is drawn as
// soon as a checkpoint opens and as soon as it ends, not only at the next
// tick. The tick here is an hour, so only those redraws can show it; a
// real bridge runs the checkpoint and a real member holds its commit
// write open meanwhile.
func TestLiveLineRedrawnWhenACheckpointOpensAndEnds(t *testing.T) {
	const run = "progress"
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 1, membertest.Options{Episodes: 1})
	hold := make(chan struct{})
	hs[0].Participant.SetWriteHook(func(ctx context.Context, _ string, _ int) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	})
	nc, js := env.Connect(t)
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: env.Bus, PhaseTimeout: 30 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-bridgeDone })

	screen := make(draws, 64)
	c := &Collector{cfg: Config{Run: run, Controller: b, Progress: screen}, log: zerolog.Nop(),
		redrawNow: make(chan struct{}, 1), tick: time.Hour}
	stop := c.progress(ctx)
	defer stop()
	screen.next(t, "0 checkpoints")

	done := make(chan *bridgeapi.CheckpointResult, 1)
	go func() { done <- c.checkpoint(ctx, false) }()
	screen.next(t, "checkpointing…")
	close(hold)
	res := <-done
	if res == nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v", res)
	}
	line := screen.next(t, "checkpoint "+res.CheckpointID+" committed")
	if !strings.Contains(line, "1 checkpoints (last: prepare ") || strings.Contains(line, "checkpointing") {
		t.Errorf("the line after the checkpoint: %q", line)
	}
}
