package scripted

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// HarnessPath is where the scripted harness is in a sandbox: in the bound
// binaries directory (owner.BinDir), or copied there.
const HarnessPath = owner.BinDir + "/scripted-harness"

// Workdir is the working directory of a scripted task's sandbox.
const Workdir = "/work"

// Kind is the owner's side of scripted tasks (an owner.TaskKind, with
// setup and fork spec): a sandbox per session with sandboxd as its first
// process and the harness in it, the task's check pinned into the session
// data at setup, and a grade that runs that check.
type Kind struct {
	// Sandboxd is the sandboxd config (binary, server, run, credentials).
	Sandboxd owner.SandboxdConfig
	// Harness is the host path of the static scripted-harness binary.
	Harness string
}

// The owner abilities the kind has.
var (
	_ owner.TaskKind = Kind{}
	_ owner.Setuper  = Kind{}
	_ owner.Forker   = Kind{}
)

// bound tells whether the harness comes with the bound binaries directory.
func (k Kind) bound() bool {
	return k.Sandboxd.BinDir != "" && filepath.Join(k.Sandboxd.BinDir, path.Base(HarnessPath)) == filepath.Clean(k.Harness)
}

// Spec implements owner.TaskKind: the sandbox sb-<episode>, its working
// directory Workdir with the task's files in it, sandboxd as its first
// process and the harness copied in (unless it comes with the bound
// binaries directory). The task must be a Task with a check.
func (k Kind) Spec(sessionID string, ep events.Episode, task json.RawMessage) (provider.Spec, error) {
	t, err := ParseTask(task)
	if err != nil {
		return provider.Spec{}, err
	}
	if t.Check == nil {
		return provider.Spec{}, fmt.Errorf("%w: task %s", ErrNoCheck, t.Script)
	}
	id := "sb-" + strings.ReplaceAll(ep.String(), ".", "_")
	if len(id) > 64 {
		return provider.Spec{}, fmt.Errorf("session %s: sandbox id %q too long", sessionID, id)
	}
	s := provider.Spec{ID: id, Workdir: Workdir}
	for p, content := range t.Files {
		if s.Files == nil {
			s.Files = map[string][]byte{}
		}
		s.Files[path.Join(Workdir[1:], p)] = []byte(content)
	}
	if !k.bound() {
		s.CopyIn = []provider.CopyIn{{HostPath: k.Harness, SandboxPath: HarnessPath[1:], Mode: 0o755}}
	}
	return owner.SandboxdSpec(s, k.Sandboxd), nil
}

// sessionData is what the setup pins into a session's data.
type sessionData struct {
	Check *Check `json:"check"`
}

// Setup implements owner.Setuper: it pins the task's check into the
// session data, which is exported and restored with the session.
func (k Kind) Setup(_ context.Context, _ owner.Execer, s *owner.Session, task json.RawMessage) (json.RawMessage, error) {
	t, err := ParseTask(task)
	if err != nil {
		return nil, err
	}
	if t.Check == nil {
		return nil, fmt.Errorf("%w: session %s", ErrNoCheck, s.ID)
	}
	return json.Marshal(sessionData{Check: t.Check})
}

// ForkSpec implements owner.Forker: a restored fork starts sandboxd again
// under its own id; its files, a copied harness included, come from the
// snapshot, and a bound harness is bound again.
func (k Kind) ForkSpec(s provider.Spec) provider.Spec {
	return owner.SandboxdSpec(s, k.Sandboxd)
}

// Grade implements owner.TaskKind: it runs the check the setup pinned in
// the sandbox's working directory and compares its output with the
// expected one, field by field. The verdict is a Verdict.
func (k Kind) Grade(ctx context.Context, x owner.Execer, s *owner.Session) (json.RawMessage, error) {
	var d sessionData
	if len(s.Data) > 0 {
		if err := json.Unmarshal(s.Data, &d); err != nil {
			return nil, fmt.Errorf("scripted: session %s data: %w", s.ID, err)
		}
	}
	if d.Check == nil || len(d.Check.Command) == 0 {
		return nil, fmt.Errorf("%w: session %s holds no check", ErrNoCheck, s.ID)
	}
	res, err := x.Exec(ctx, s.Sandbox.ID, d.Check.Command, provider.ExecOptions{})
	if err != nil {
		return nil, err
	}
	got, want := strings.Fields(string(res.Stdout)), strings.Fields(d.Check.Expect)
	v := Verdict{Reward: 1}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		v = Verdict{Reward: 0, Detail: fmt.Sprintf("sandbox holds %q, want %q", got, want)}
	}
	return json.Marshal(v)
}
