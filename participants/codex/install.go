package codex

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/stillpoint/stillpoint/participants/codex/driver"
	"github.com/stillpoint/stillpoint/participants/internal/hostbin"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Version is the Codex CLI release the adapter runs (driver.Version), and
// NPMPackage the npm package that installs it.
const (
	Version    = driver.Version
	NPMPackage = "@openai/codex@" + Version
)

// BinaryEnv names the environment variable that gives the host path of
// the Codex binary.
const BinaryEnv = "STILLPOINT_CODEX"

// SystemCache is where .ci/run installs Codex as root; otherwise it uses
// the user's cache directory (UserCache).
const SystemCache = "/var/cache/stillpoint/codex"

// InstallHint says how to install Codex on a host.
const InstallHint = "install Codex " + Version + " with `npm install --prefix " + SystemCache + " " + NPMPackage +
	"` (or --prefix ~/.cache/stillpoint/codex; or set " + BinaryEnv + " to its binary); .ci/run does it"

// ErrNotInstalled is returned (wrapped, with InstallHint) by Binary when
// Codex is not on the host.
var ErrNotInstalled = errors.New("codex: not installed")

// UserCache returns ~/.cache/stillpoint/codex (the user's cache
// directory), or "" without one.
func UserCache() string { return hostbin.UserCache("codex") }

// platform returns the npm package of Codex's binary for this host and
// the binary's path in it: a static musl build, with no glibc or Node
// dependency.
func platform() (pkg, bin string) {
	switch runtime.GOARCH {
	case "arm64":
		return "@openai/codex-linux-arm64", "vendor/aarch64-unknown-linux-musl/bin/codex"
	}
	return "@openai/codex-linux-x64", "vendor/x86_64-unknown-linux-musl/bin/codex"
}

// Binary returns the host path of the Codex binary. It is the one place
// that resolves it: $STILLPOINT_CODEX if set, else the platform binary of
// an npm install of NPMPackage in SystemCache or UserCache (the first
// that has one of version Version).
func Binary() (string, error) {
	pkg, rel := platform()
	// The platform package is an alias of @openai/codex@<v>-linux-<arch>.
	return hostbin.NPM{Name: "Codex", Env: BinaryEnv, Caches: []string{SystemCache, UserCache()},
		Bin: filepath.Join(pkg, rel), VersionOf: filepath.Join("@openai", "codex", "package.json"),
		Version: Version, Err: ErrNotInstalled, Hint: InstallHint}.Find()
}

// The programs in SandboxBinDir, by name.
const (
	CodexName  = "codex"
	DriverName = "codex-driver"
)

// SandboxBinDir is where every sandbox shows Codex and the driver,
// read-only (Binds).
const SandboxBinDir = "/opt/stillpoint/codex"

// Host is what a host gives the sandboxes: the host paths of the two
// programs.
type Host struct {
	Codex  string
	Driver string
}

// Locate finds Codex on the host (Binary); driverPath is the host path of
// the static codex-driver.
func Locate(driverPath string) (Host, error) {
	cx, err := Binary()
	if err != nil {
		return Host{}, err
	}
	if err := hostbin.Executable(driverPath); err != nil {
		return Host{}, fmt.Errorf("codex: the driver %s: %v (CGO_ENABLED=0 go build ./cmd/codex-driver)", driverPath, err)
	}
	d, err := filepath.Abs(driverPath)
	return Host{Codex: cx, Driver: d}, err
}

// Binds stages h's programs in the host directory stage (hard links, or
// copies where a link cannot be made: once per owner, not per sandbox) and
// returns the bind that shows it read-only at SandboxBinDir in every
// sandbox, so that no snapshot copies Codex (300 MB).
func (h Host) Binds(stage string) ([]provider.Bind, error) {
	binds, err := hostbin.Stage(stage, SandboxBinDir, map[string]string{CodexName: h.Codex, DriverName: h.Driver})
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	return binds, nil
}
