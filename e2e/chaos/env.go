package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Env is what the chaos command takes from the program it is part of.
type Env struct {
	// Stdout gets the rounds and the table, Stderr the warnings.
	Stdout, Stderr io.Writer
	// Conn is the connection flags, read by `chaos collect`, which chaos
	// starts with the NATS server's URL.
	Conn *jetstream.ConnConfig
	// HandleTerm, when set, makes SIGTERM call stop instead of ending the
	// command's context, until the returned undo: `chaos collect` stops
	// after a checkpoint, as `stillpoint collect` does.
	HandleTerm func(stop func()) (undo func())
}

// Sentinel errors of the chaos command.
var (
	// ErrUsage is wrapped by the errors of a command called wrongly.
	ErrUsage = errors.New("chaos: usage")
	// ErrInvariants is returned once the rounds ran and the table was
	// printed, when an invariant failed in some round.
	ErrInvariants = errors.New("chaos: invariants failed")
)

// build builds the static stillpoint binary the NATS server and the fleet
// run as, and the sandboxd and harness binaries that go into sandboxes.
func (w *chaosWorld) build(ctx context.Context) error {
	fmt.Fprintln(w.env.Stdout, "chaos: building the static stillpoint, sandboxd and scripted harness (CGO_ENABLED=0)")
	bins, err := build.Static(ctx, build.Stillpoint, build.Sandboxd, build.ScriptedHarness)
	if errors.Is(err, build.ErrNoModule) || errors.Is(err, build.ErrNoGo) {
		return fmt.Errorf("chaos: run it from the stillpoint checkout (it builds the binaries with the Go toolchain): go run ./e2e/cmd/chaos: %w", err)
	}
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	w.program, w.sandboxd, w.harness = bins[build.Stillpoint], bins[build.Sandboxd], bins[build.ScriptedHarness]
	return nil
}
