package owner

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// SandboxdPath is where the sandboxd binary goes inside a sandbox when it
// is copied in.
const SandboxdPath = "/usr/local/bin/sandboxd"

// BinDir is where SandboxdConfig.BinDir shows inside a sandbox.
const BinDir = "/opt/stillpoint/bin"

// SandboxdConfig says how to start sandboxd as a sandbox's first process.
type SandboxdConfig struct {
	// Binary is the host path of the static sandboxd binary; it is copied
	// into the sandbox at SandboxdPath.
	Binary string
	// NATSURL is the server the daemon joins (the sandbox shares the
	// host's network namespace, so loopback reaches it).
	NATSURL string
	// Run is the run id.
	Run string
	// CredsFile, when set, is copied in and used (--creds): the sandbox's
	// own NATS credentials, a .creds file. NKeyFile, when set instead, is
	// an nkey seed file copied in and used (--nkey), such as the sandbox
	// role's of `stillpoint server --auth-dir` (embedded.RoleSandbox: it
	// acks, heartbeats and serves only as a sandbox). Every sandbox gets
	// the same file, and the harness inside may be able to read it.
	CredsFile string
	NKeyFile  string
	// Creds, when set instead, gives each sandbox a user of its own,
	// renewed while it lives (the owner's Config.SandboxCreds must be the
	// same): the daemon takes --creds from a directory shown read-only.
	Creds *SandboxCreds
	// Args are more sandboxd member flags (e.g. --mode stop).
	Args []string
	// BinDir, when set, is a host directory holding Binary (and whatever
	// else sandboxes run, such as a harness), shown read-only at BinDir in
	// each sandbox instead of copied in: snapshots then carry none of it.
	BinDir string
	// Binds are more host directories shown read-only in every sandbox
	// and every fork: the programs a harness runs that are the same for
	// all (OpenCode, ripgrep and the OpenCode driver), which no snapshot
	// copies.
	Binds []provider.Bind
}

// SandboxdSpec returns spec with sandboxd as the first process, member
// sandbox.<spec.ID> of the run: the daemon the agent launches the harness
// through, and that pauses it at every checkpoint.
func SandboxdSpec(spec provider.Spec, c SandboxdConfig) provider.Spec {
	bin := SandboxdPath
	if c.BinDir != "" {
		spec.Binds = append(spec.Binds, provider.Bind{HostDir: c.BinDir, SandboxDir: BinDir[1:]})
		bin = path.Join(BinDir, path.Base(c.Binary))
	} else {
		spec.CopyIn = append(spec.CopyIn, provider.CopyIn{HostPath: c.Binary, SandboxPath: SandboxdPath[1:], Mode: 0o755})
	}
	init := []string{bin, "member", "--nats-url", c.NATSURL, "--run", c.Run, "--id", spec.ID,
		"--state", "/var/lib/stillpoint-sandboxd", "--launch-user-file", LaunchUserFile}
	if c.CredsFile != "" {
		spec.CopyIn = append(spec.CopyIn, provider.CopyIn{HostPath: c.CredsFile, SandboxPath: "etc/stillpoint/nats.creds", Mode: 0o600})
		init = append(init, "--creds", "/etc/stillpoint/nats.creds")
	}
	if c.Creds != nil {
		init = append(init, "--creds", c.Creds.spec(&spec))
	}
	if c.NKeyFile != "" {
		spec.CopyIn = append(spec.CopyIn, provider.CopyIn{HostPath: c.NKeyFile, SandboxPath: "etc/stillpoint/nats.nk", Mode: 0o600})
		init = append(init, "--nkey", "/etc/stillpoint/nats.nk")
	}
	spec.Binds = append(spec.Binds, c.Binds...)
	spec.Init = append(init, c.Args...)
	return spec
}

// HarnessPath returns where a harness binary at host path harness is in a
// sandbox, BinDir/<its name> ("" without one): copied there by
// SessionSpec, or shown there with c.BinDir.
func HarnessPath(harness string) string {
	if harness == "" {
		return ""
	}
	return path.Join(BinDir, filepath.Base(harness))
}

// SessionSpec completes s into the sandbox of a session of episode ep for
// a task kind whose harness is the static binary at host path harness: its
// id sb-<episode>, the harness copied in at HarnessPath unless it comes
// with c's bound binaries directory, and sandboxd as its first process
// when c.Binary is set (ForkSpec for a restored fork).
func SessionSpec(sessionID string, ep events.Episode, s provider.Spec, c SandboxdConfig, harness string) (provider.Spec, error) {
	s.ID = "sb-" + strings.ReplaceAll(ep.String(), ".", "_")
	if err := provider.ValidateID("sandbox id", s.ID); err != nil {
		return provider.Spec{}, fmt.Errorf("session %s: %w", sessionID, err)
	}
	bound := c.BinDir != "" && filepath.Join(c.BinDir, filepath.Base(harness)) == filepath.Clean(harness)
	if harness != "" && !bound {
		s.CopyIn = append(s.CopyIn, provider.CopyIn{HostPath: harness, SandboxPath: HarnessPath(harness)[1:], Mode: 0o755})
	}
	return ForkSpec(s, c), nil
}

// ForkSpec returns s with sandboxd as its first process under s's own id
// when c.Binary is set (a restored fork's files come from the snapshot),
// s unchanged otherwise.
func ForkSpec(s provider.Spec, c SandboxdConfig) provider.Spec {
	if c.Binary == "" {
		return s
	}
	return SandboxdSpec(s, c)
}
