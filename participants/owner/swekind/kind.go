package swekind

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Defaults of the kind.
const (
	// DefaultTestTimeout bounds the test run of a grade; one that runs
	// out is reward 0.
	DefaultTestTimeout = 30 * time.Minute
	// DefaultMaxPatch bounds the model's patch a verdict carries, in
	// bytes; a longer one is cut and the verdict says so.
	DefaultMaxPatch = 256 << 10
	// DefaultMaxDiff bounds the model's diff a grade takes from the
	// session's sandbox, in bytes; a longer one is not graded (reward 0).
	DefaultMaxDiff = 32 << 20
	// DefaultDiffTimeout bounds the taking of the model's diff (git runs
	// in the agent's sandbox, where its config may run filters).
	DefaultDiffTimeout = 5 * time.Minute
)

// outputTail is how much of a command's output an error or a verdict
// keeps, from its end.
const outputTail = 8 << 10

// Kind is the owner's side of swe tasks (an owner.TaskKind, with setup
// and fork spec). `stillpoint owner --task-kind swe` sets Sandboxd and
// Harness; its zero value serves sandboxes without sandboxd (tests).
type Kind struct {
	// Sandboxd is the sandboxd config: sandboxd is every sandbox's first
	// process when Binary is set.
	Sandboxd owner.SandboxdConfig
	// Harness is the host path of a static harness binary, copied into
	// each sandbox at owner.BinDir/<its name> unless it comes with the
	// bound binaries directory; empty puts none in.
	Harness string
	// TestTimeout bounds a grade's test run (default DefaultTestTimeout).
	TestTimeout time.Duration
	// MaxPatch bounds the model patch a verdict carries (default
	// DefaultMaxPatch).
	MaxPatch int
	// MaxDiff bounds the model's diff a grade takes (default
	// DefaultMaxDiff).
	MaxDiff int
}

// The owner abilities the kind has.
var (
	_ owner.TaskKind = Kind{}
	_ owner.Setuper  = Kind{}
	_ owner.Forker   = Kind{}
)

// HarnessPath returns where the harness is in a sandbox, "" without one.
func (k Kind) HarnessPath() string { return owner.HarnessPath(k.Harness) }

// Spec implements owner.TaskKind: it checks the instance and returns the
// sandbox sb-<episode> made of the instance's image (ImageRef), with
// sandboxd as its first process and the harness in it. Workdir is left
// "": the owner sets the image's WorkingDir.
func (k Kind) Spec(sessionID string, ep events.Episode, raw json.RawMessage) (provider.Spec, error) {
	in, err := ParseInstance(raw)
	if err != nil {
		return provider.Spec{}, err
	}
	s := provider.Spec{ImageRef: in.Image}
	return owner.SessionSpec(sessionID, ep, s, k.Sandboxd, k.Harness)
}

// ForkSpec implements owner.Forker: a restored fork starts sandboxd again
// under its own id; its files come from the snapshot.
func (k Kind) ForkSpec(s provider.Spec) provider.Spec { return owner.ForkSpec(s, k.Sandboxd) }

// Data is the session data of a swe task: what its grade needs, recorded
// at setup and exported with the session's snapshot, out of the agent's
// reach.
type Data struct {
	// Kind is "swe".
	Kind string `json:"kind"`
	// InstanceID is the instance's.
	InstanceID string `json:"instance_id"`
	// BaseCommit is the full id of the commit the repository was at.
	BaseCommit string `json:"base_commit"`
	// TestPatch, FailToPass, PassToPass and TestCmd are the instance's.
	TestPatch  string   `json:"test_patch"`
	FailToPass []string `json:"FAIL_TO_PASS"`
	PassToPass []string `json:"PASS_TO_PASS"`
	TestCmd    string   `json:"test_cmd"`
	// Workdir is the repository's directory in the sandbox.
	Workdir string `json:"workdir"`
	// Image is the instance's image: the grade's fresh sandbox is made
	// of it.
	Image string `json:"image"`
}

// dataKind is Data.Kind.
const dataKind = "swe"

// Setup implements owner.Setuper: it checks that the repository in the
// working directory (the image's WorkingDir) is at the base commit, and
// returns the session data (a Data).
func (k Kind) Setup(ctx context.Context, x owner.Execer, s *owner.Session, raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: session %s has no task: swe sessions are seeded with an instance", ErrTask, s.ID)
	}
	in, err := ParseInstance(raw)
	if err != nil {
		return nil, err
	}
	wd := s.Workdir
	if wd == "" {
		wd = "/"
	}
	res, err := x.Exec(ctx, s.Sandbox.ID, append(gitArgv(), "rev-parse", "--verify", "HEAD^{commit}"),
		provider.ExecOptions{Dir: path.Join(s.Sandbox.ProcRoot, wd)})
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: instance %s: git rev-parse HEAD in %s: %w", ErrSetup, in.InstanceID, wd, err)
	case res.ExitCode != 0:
		return nil, fmt.Errorf("%w: instance %s: no git repository at %s in image %s (git rev-parse HEAD exited %d): %s",
			ErrSetup, in.InstanceID, wd, in.Image, res.ExitCode, tail(res))
	}
	head := strings.TrimSpace(string(res.Stdout))
	if !strings.HasPrefix(head, strings.ToLower(in.BaseCommit)) {
		return nil, fmt.Errorf("%w: instance %s: the repository at %s in image %s is at %s, not at base_commit %s",
			ErrSetup, in.InstanceID, wd, in.Image, head, in.BaseCommit)
	}
	return json.Marshal(Data{Kind: dataKind, InstanceID: in.InstanceID, BaseCommit: head, TestPatch: in.TestPatch,
		FailToPass: in.FailToPass, PassToPass: in.PassToPass, TestCmd: in.testCmd(), Workdir: wd, Image: in.Image})
}

// gitArgv is git with what the grade does not take from the repository:
// no hooks, no file system monitor, any owner of the repository.
func gitArgv() []string {
	return []string{"git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "safe.directory=*"}
}

// tail returns the end of a command's output, stdout then stderr.
func tail(res provider.ExecResult) string {
	out := append(bytes.Clone(res.Stdout), res.Stderr...)
	if len(out) > outputTail {
		out = out[len(out)-outputTail:]
	}
	return strings.ToValidUTF8(string(bytes.TrimSpace(out)), "?")
}
