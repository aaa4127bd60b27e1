package claude

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/participants/internal/hostbin"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Version is the Claude Code release the adapter runs (driver.Version),
// and NPMPackage the npm package that installs it.
const (
	Version    = driver.Version
	NPMPackage = "@anthropic-ai/claude-code@" + Version
)

// BinaryEnv names the environment variable that gives the host path of
// the Claude Code binary.
const BinaryEnv = "STILLPOINT_CLAUDE"

// SystemCache is where .ci/run installs Claude Code as root; otherwise it
// uses the user's cache directory (UserCache).
const SystemCache = "/var/cache/stillpoint/claude"

// InstallHint says how to install what the adapter needs on a host.
const InstallHint = "install Claude Code " + Version + " with `npm install --prefix " + SystemCache + " " + NPMPackage +
	"` (or --prefix ~/.cache/stillpoint/claude; or set " + BinaryEnv + " to its binary); .ci/run does it"

// ErrNotInstalled is returned (wrapped, with InstallHint) by Binary when
// Claude Code is not on the host.
var ErrNotInstalled = errors.New("claude: not installed")

// UserCache returns ~/.cache/stillpoint/claude (the user's cache
// directory), or "" without one.
func UserCache() string { return hostbin.UserCache("claude") }

// platformPackage is the npm package of Claude Code's native binary for
// this host.
func platformPackage() string {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	return filepath.Join("@anthropic-ai", "claude-code-linux-"+arch)
}

// Binary returns the host path of the Claude Code binary (a native
// program: no Node runs it). It is the one place that resolves it:
// $STILLPOINT_CLAUDE if set, else the platform binary of an npm install
// of NPMPackage in SystemCache or UserCache (the first that has one of
// version Version).
func Binary() (string, error) {
	return hostbin.NPM{Name: "Claude Code", Env: BinaryEnv, Caches: []string{SystemCache, UserCache()},
		Bin: filepath.Join(platformPackage(), "claude"), VersionOf: filepath.Join(platformPackage(), "package.json"),
		Version: Version, Err: ErrNotInstalled, Hint: InstallHint}.Find()
}

// The programs in SandboxBinDir, by name.
const (
	ClaudeName = "claude"
	DriverName = "claude-driver"
)

// SandboxBinDir is where every sandbox shows Claude Code and the driver,
// read-only (Binds).
const SandboxBinDir = "/opt/stillpoint/claude"

// Host is what a host gives the sandboxes: the host paths of the two
// programs.
type Host struct {
	Claude string
	Driver string
}

// Locate finds Claude Code on the host (Binary); driverPath is the host
// path of the static claude-driver.
func Locate(driverPath string) (Host, error) {
	cl, err := Binary()
	if err != nil {
		return Host{}, err
	}
	if err := hostbin.Executable(driverPath); err != nil {
		return Host{}, fmt.Errorf("claude: the driver %s: %v (CGO_ENABLED=0 go build ./cmd/claude-driver)", driverPath, err)
	}
	d, err := filepath.Abs(driverPath)
	return Host{Claude: cl, Driver: d}, err
}

// Binds stages h's programs in the host directory stage (hard links, or
// copies where a link cannot be made: once per owner, not per sandbox) and
// returns the bind that shows it read-only at SandboxBinDir in every
// sandbox, so that no snapshot copies Claude Code.
func (h Host) Binds(stage string) ([]provider.Bind, error) {
	binds, err := hostbin.Stage(stage, SandboxBinDir, map[string]string{ClaudeName: h.Claude, DriverName: h.Driver})
	if err != nil {
		return nil, fmt.Errorf("claude: %w", err)
	}
	return binds, nil
}
