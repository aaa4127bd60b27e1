package owner

import (
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// SandboxdPath is where the sandboxd binary goes inside a sandbox.
const SandboxdPath = "/usr/local/bin/sandboxd"

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
	// CredsFile, when set, is copied in and used: the sandbox's own NATS
	// credentials. The intended permissions, for an operator to issue:
	// subscribe to sp.<run>.phase.> and sp.<run>.outcome.>, publish only
	// sp.<run>.ack.*.*.sandbox.<id>, sp.<run>.member.sandbox.<id> and its
	// service replies, and the sp_members key <run>.sandbox.<id>.
	CredsFile string
	// Args are more sandboxd member flags (e.g. --mode stop).
	Args []string
}

// SandboxdSpec returns spec with sandboxd as the first process, member
// sandbox.<spec.ID> of the run: the daemon the agent launches the harness
// through, and that pauses it at every checkpoint.
func SandboxdSpec(spec provider.Spec, c SandboxdConfig) provider.Spec {
	spec.CopyIn = append(spec.CopyIn, provider.CopyIn{HostPath: c.Binary, SandboxPath: SandboxdPath[1:], Mode: 0o755})
	init := []string{SandboxdPath, "member", "--nats-url", c.NATSURL, "--run", c.Run, "--id", spec.ID,
		"--state", "/var/lib/stillpoint-sandboxd"}
	if c.CredsFile != "" {
		spec.CopyIn = append(spec.CopyIn, provider.CopyIn{HostPath: c.CredsFile, SandboxPath: "etc/stillpoint/nats.creds", Mode: 0o600})
		init = append(init, "--creds", "/etc/stillpoint/nats.creds")
	}
	spec.Init = append(init, c.Args...)
	return spec
}
