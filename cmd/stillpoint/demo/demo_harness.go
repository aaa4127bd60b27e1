package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	osexec "os/exec"
	"path/filepath"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/exec/example"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// What differs by --harness: the task set, the model calls' user turns
// and the binaries a run builds or finds.

// The harnesses of --harness.
const (
	harnessScripted = "scripted"
	harnessOpenCode = "opencode"
	harnessClaude   = "claude"
	harnessCodex    = "codex"
	harnessExec     = "exec"
)

// tasksSWE is --tasks swe: the SWE-style set (tasks.SWE).
const tasksSWE = "swe"

// openCodeInFlight is the most OpenCode rollouts the demo runs at once:
// each is a large process (docs/OPENCODE.md, What the tests cost).
const openCodeInFlight = 8

// TaskSet returns the run's tasks and model script, and how many
// rollouts the collector keeps in flight: the scripted set of --rollouts
// tasks, all at once; or, with --harness opencode or claude, the first
// --rollouts tasks of the repository set for the harness's tools, at most
// openCodeInFlight at once; with --tasks swe, the SWE-style set's.
func (d *Fleet) TaskSet(ctx context.Context) ([]collect.Task, modelserver.Script, int, error) {
	if !d.realHarness() {
		ts, script := tasks.Set(tasks.Options{N: d.f.rollouts, ToolSeconds: d.f.tool.Seconds(), Steps: cmp.Or(d.f.steps, 2)})
		for _, turns := range script {
			d.lastTurn = len(turns) - 1
		}
		return ts, script, d.f.rollouts, nil
	}
	// The real harnesses are named as the task set's harnesses are.
	var (
		ts     []collect.Task
		script modelserver.Script
		err    error
	)
	if d.f.tasks == tasksSWE {
		d.Say("writing the SWE-style set's images (the first time, their Debian base is built with debootstrap: a few minutes)")
		ts, script, err = tasks.SWE(ctx, tasks.SWEOptions{Dir: filepath.Join(d.dir, "swe"), ToolSeconds: d.f.tool.Seconds(), Harness: d.f.harness,
			Progress: d.env.Stderr})
	} else {
		ts, script, err = tasks.Repos(tasks.RepoOptions{Dir: filepath.Join(d.dir, "repos"), ToolSeconds: d.f.tool.Seconds(), Harness: d.f.harness})
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("demo: %w", err)
	}
	if len(ts) > d.f.rollouts {
		for _, t := range ts[d.f.rollouts:] {
			delete(script, t.RolloutID)
		}
		ts = ts[:d.f.rollouts]
	}
	return ts, script, min(len(ts), openCodeInFlight), nil
}

// realHarness tells a real harness (OpenCode, Claude Code, Codex) on the
// repository tasks.
func (d *Fleet) realHarness() bool {
	return d.f.harness == harnessOpenCode || d.f.harness == harnessClaude || d.f.harness == harnessCodex
}

// userTurns is how many user turns each of the harness's model calls
// carries: Codex's carry its environment message beside the prompt.
func (d *Fleet) userTurns() int {
	if d.f.harness == harnessCodex {
		return 2
	}
	return 1
}

// build builds the static binaries that go into sandboxes; with --harness
// opencode, claude or codex it finds the harness (and OpenCode's ripgrep)
// and builds its driver, and with --harness exec it writes the example
// agent and its spec into the work directory.
func (d *Fleet) build(ctx context.Context) error {
	pkgs := []string{build.Sandboxd, build.ScriptedHarness}
	what := "sandboxd and scripted harness"
	if d.f.harness == harnessExec {
		if _, err := osexec.LookPath("python3"); err != nil {
			return fmt.Errorf("demo: --harness exec runs a Python 3 agent, and python3 is not on PATH (apt-get install python3): %w", err)
		}
		d.execDir = filepath.Join(d.dir, "exec-harness")
		if _, err := example.Write(d.execDir); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	if d.f.harness == harnessCodex {
		if _, err := codex.Binary(); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		pkgs, what = append(pkgs, build.CodexDriver), what+" and the Codex driver"
	}
	if d.f.harness == harnessOpenCode {
		if _, err := opencode.Binary(); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if _, err := opencode.Ripgrep(); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		pkgs, what = append(pkgs, build.OpenCodeDriver), what+" and the OpenCode driver"
	}
	if d.f.harness == harnessClaude {
		if _, err := claude.Binary(); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		pkgs, what = append(pkgs, build.ClaudeDriver), what+" and the Claude Code driver"
	}
	d.Say("building the static %s (CGO_ENABLED=0)", what)
	bins, err := build.Static(ctx, pkgs...)
	if errors.Is(err, build.ErrNoModule) || errors.Is(err, build.ErrNoGo) {
		return fmt.Errorf("demo: run it from the stillpoint checkout (it builds sandboxd and the harness with the Go toolchain): go run ./cmd/stillpoint demo: %w", err)
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.sandboxd, d.harness, d.driver = bins[build.Sandboxd], bins[build.ScriptedHarness], cmp.Or(bins[build.OpenCodeDriver], bins[build.ClaudeDriver], bins[build.CodexDriver])
	return nil
}
