package commandkind

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// DefaultMaxPin is the default of Kind.MaxPin: the pinned archive goes
// into the session data, which every checkpoint exports.
const DefaultMaxPin = 1 << 20

// outputTail is how much of a command's output an error or a verdict
// keeps, from its end.
const outputTail = 4 << 10

// Kind is the owner's side of command tasks (an owner.TaskKind, with setup
// and fork spec). Its zero value serves sandboxes without sandboxd, which
// only the owner's own tests want; `stillpoint owner --task-kind command`
// sets Sandboxd and Harness.
type Kind struct {
	// Sandboxd is the sandboxd config (binary, server, run, credentials):
	// sandboxd is every sandbox's first process when Binary is set.
	Sandboxd owner.SandboxdConfig
	// Harness is the host path of a static harness binary, copied into
	// each sandbox at owner.BinDir/<its name> unless it comes with the
	// bound binaries directory; empty puts none in (the sandbox then runs
	// what the host's root holds).
	Harness string
	// MaxPin bounds the pinned archive, in bytes (default DefaultMaxPin).
	MaxPin int
	// TempDir is where a git workspace is cloned on the host (default
	// os.TempDir()).
	TempDir string
}

// The owner abilities the kind has.
var (
	_ owner.TaskKind = Kind{}
	_ owner.Setuper  = Kind{}
	_ owner.Forker   = Kind{}
)

func (k Kind) maxPin() int {
	if k.MaxPin <= 0 {
		return DefaultMaxPin
	}
	return k.MaxPin
}

// HarnessPath returns where the harness is in a sandbox, "" without one.
func (k Kind) HarnessPath() string { return owner.HarnessPath(k.Harness) }

// Spec implements owner.TaskKind: it checks the task (ParseTask, and that
// its workspace is on the host) and returns the sandbox sb-<episode> in
// the task's working directory, with sandboxd as its first process and
// the harness in it.
func (k Kind) Spec(sessionID string, ep events.Episode, raw json.RawMessage) (provider.Spec, error) {
	t, err := ParseTask(raw)
	if err != nil {
		return provider.Spec{}, err
	}
	if err := t.Workspace.checkHost(); err != nil {
		return provider.Spec{}, err
	}
	s := provider.Spec{Workdir: t.workdir(), ImageRef: t.Image}
	return owner.SessionSpec(sessionID, ep, s, k.Sandboxd, k.Harness)
}

// ForkSpec implements owner.Forker: a restored fork starts sandboxd again
// under its own id; its files (the workspace, a copied harness) come from
// the snapshot.
func (k Kind) ForkSpec(s provider.Spec) provider.Spec { return owner.ForkSpec(s, k.Sandboxd) }

// Data is the session data of a command task: what its grade needs,
// recorded at setup and exported with the session's snapshot.
type Data struct {
	// Kind is "command".
	Kind string `json:"kind"`
	// Verify, Env and Pins are the task's.
	Verify Verify   `json:"verify"`
	Env    []string `json:"env,omitempty"`
	Pins   []string `json:"pins,omitempty"`
	// Pinned is the pinned paths as a tar archive, taken after the setup.
	Pinned []byte `json:"pinned,omitempty"`
	// Setup is the JSON objects the setup commands printed, merged (a
	// later key wins); the verify gets it in SessionDataEnv.
	Setup json.RawMessage `json:"setup,omitempty"`
}

// dataKind is Data.Kind.
const dataKind = "command"

// Setup implements owner.Setuper: it copies the workspace into the working
// directory, runs the setup commands, records the pinned paths, and
// returns the session data (a Data). Anything that fails wraps ErrSetup
// with the command's output.
func (k Kind) Setup(ctx context.Context, x owner.Execer, s *owner.Session, raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: session %s has no task: command sessions are seeded with one", ErrTask, s.ID)
	}
	t, err := ParseTask(raw)
	if err != nil {
		return nil, err
	}
	dir := path.Join(s.Sandbox.ProcRoot, s.Workdir)
	if !t.Workspace.empty() {
		if err := k.copyIn(ctx, x, s.Sandbox.ID, dir, t.Workspace); err != nil {
			return nil, fmt.Errorf("%w: workspace: %w", ErrSetup, err)
		}
	}
	setup := map[string]json.RawMessage{}
	for i, st := range t.Setup {
		res, timedOut, err := run(ctx, x, s.Sandbox.ID, st.Command, provider.ExecOptions{Dir: dir, Env: t.Env}, st.Timeout.or(DefaultSetupTimeout))
		field := fmt.Sprintf("setup[%d] %q", i, st.Command)
		switch {
		case timedOut:
			return nil, fmt.Errorf("%w: %s timed out after %s: %s", ErrSetup, field, st.Timeout.or(DefaultSetupTimeout), tail(res))
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %w", ErrSetup, field, err)
		case res.ExitCode != 0:
			return nil, fmt.Errorf("%w: %s exited %d: %s", ErrSetup, field, res.ExitCode, tail(res))
		}
		if line := lastLine(res.Stdout); len(line) > 0 && line[0] == '{' {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(line, &obj); err != nil {
				return nil, fmt.Errorf("%w: %s: its last line is not a JSON object: %v", ErrSetup, field, err)
			}
			maps.Copy(setup, obj)
		}
	}
	d := Data{Kind: dataKind, Verify: t.Verify, Env: t.Env, Pins: t.pins()}
	if len(d.Pins) > 0 {
		argv := append([]string{"tar", "-c", "-f", "-", "--"}, d.Pins...)
		res, _, err := run(ctx, x, s.Sandbox.ID, argv, provider.ExecOptions{Dir: dir}, DefaultSetupTimeout)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: pin: %w", ErrSetup, err)
		case res.ExitCode != 0:
			return nil, fmt.Errorf("%w: pin %q: tar exited %d (is every pinned path in the workspace after the setup?): %s",
				ErrSetup, d.Pins, res.ExitCode, bytes.TrimSpace(res.Stderr))
		case len(res.Stdout) > k.maxPin():
			return nil, fmt.Errorf("%w: %w: pin %q: %d bytes as an archive, more than the limit of %d", ErrSetup, ErrPinTooLarge,
				d.Pins, len(res.Stdout), k.maxPin())
		}
		d.Pinned = res.Stdout
	}
	if len(setup) > 0 {
		if d.Setup, err = json.Marshal(setup); err != nil {
			return nil, err
		}
	}
	return json.Marshal(d)
}

// copyIn streams the workspace into dir through the sandbox's tar.
func (k Kind) copyIn(ctx context.Context, x owner.Execer, id, dir string, w Workspace) error {
	tmp := k.TempDir
	if tmp == "" {
		tmp = os.TempDir()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	var werr error
	var wg sync.WaitGroup
	wg.Go(func() {
		werr = w.writeTar(ctx, pw, tmp)
		pw.CloseWithError(werr)
	})
	res, err := x.Exec(ctx, id, []string{"tar", "-x", "-f", "-"}, provider.ExecOptions{Dir: dir, Stdin: pr})
	// A tar that ended early stops the writer.
	pr.CloseWithError(errStoppedReading)
	cancel()
	wg.Wait()
	switch {
	case werr != nil && !errors.Is(werr, errStoppedReading) && !errors.Is(werr, context.Canceled):
		return werr // the cause: the sandbox's tar saw the stream cut
	case err != nil:
		return err
	case res.ExitCode != 0:
		return fmt.Errorf("tar in the sandbox exited %d: %s", res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

// errStoppedReading ends the writer of a workspace whose reader is gone.
var errStoppedReading = errors.New("the sandbox's tar stopped reading")

// Grade implements owner.TaskKind: it writes the pinned paths back from
// the session data, runs the verify command in the working directory and
// returns its Verdict.
func (k Kind) Grade(ctx context.Context, x owner.Execer, s *owner.Session) (json.RawMessage, error) {
	var d Data
	if err := json.Unmarshal(s.Data, &d); err != nil || d.Kind != dataKind || len(d.Verify.Command) == 0 {
		return nil, fmt.Errorf("%w: session %s: %.200s", ErrData, s.ID, s.Data)
	}
	t0 := time.Now()
	dir := path.Join(s.Sandbox.ProcRoot, s.Workdir)
	if len(d.Pins) > 0 {
		argv := append([]string{"sh", "-c", `rm -rf -- "$@" && exec tar -x -f -`, "pin"}, d.Pins...)
		res, err := x.Exec(ctx, s.Sandbox.ID, argv, provider.ExecOptions{Dir: dir, Stdin: bytes.NewReader(d.Pinned)})
		if err != nil {
			return nil, fmt.Errorf("commandkind: session %s: write the pinned paths back: %w", s.ID, err)
		}
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("commandkind: session %s: write the pinned paths back: exit %d: %s", s.ID, res.ExitCode, tail(res))
		}
	}
	setup := d.Setup
	if len(setup) == 0 {
		setup = json.RawMessage("{}")
	}
	env := append(append([]string(nil), d.Env...), SessionDataEnv+"="+string(setup))
	timeout := d.Verify.Timeout.or(DefaultVerifyTimeout)
	res, timedOut, err := run(ctx, x, s.Sandbox.ID, d.Verify.Command, provider.ExecOptions{Dir: dir, Env: env}, timeout)
	if err != nil && !timedOut {
		return nil, fmt.Errorf("commandkind: session %s: verify %q: %w", s.ID, d.Verify.Command, err)
	}
	v := Verdict{ExitCode: res.ExitCode, Output: tail(res), TookMS: time.Since(t0).Milliseconds()}
	switch {
	case timedOut:
		v.Detail = fmt.Sprintf("the verify timed out after %s", timeout)
	case d.Verify.Reward == RewardJSON:
		if v.Reward, v.Result, err = rewardOf(res.Stdout); err != nil {
			v.Reward, v.Detail = 0, err.Error()
		}
	case res.ExitCode == 0:
		v.Reward = 1
	default:
		v.Detail = fmt.Sprintf("the verify exited %d", res.ExitCode)
	}
	return json.Marshal(v)
}

// run runs argv in the sandbox for at most timeout; timedOut tells that
// the timeout, not ctx, ended it.
func run(ctx context.Context, x owner.Execer, id string, argv []string, opts provider.ExecOptions, timeout time.Duration) (res provider.ExecResult, timedOut bool, err error) {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err = x.Exec(tctx, id, argv, opts)
	if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		return res, true, err
	}
	return res, false, err
}

// tail returns the end of a command's output, stdout then stderr.
func tail(res provider.ExecResult) string {
	out := append(bytes.Clone(res.Stdout), res.Stderr...)
	if len(out) > outputTail {
		out = out[len(out)-outputTail:]
	}
	return strings.ToValidUTF8(string(bytes.TrimSpace(out)), "?")
}
