package opencode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/stillpoint/stillpoint/participants/internal/hostbin"
	"github.com/stillpoint/stillpoint/participants/opencode/driver"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Version is the OpenCode release the adapter runs (driver.Version), and
// NPMPackage the npm package that installs it.
const (
	Version    = driver.Version
	NPMPackage = "opencode-ai@" + Version
)

// BinaryEnv names the environment variable that gives the host path of
// the OpenCode binary; RipgrepEnv the one that gives ripgrep's.
const (
	BinaryEnv  = "STILLPOINT_OPENCODE"
	RipgrepEnv = "STILLPOINT_RIPGREP"
)

// SystemCache is where .ci/run installs OpenCode as root; otherwise it
// uses the user's cache directory (UserCache).
const SystemCache = "/var/cache/stillpoint/opencode"

// InstallHint says how to install what the adapter needs on a host.
const InstallHint = "install OpenCode " + Version + " with `npm install --prefix " + SystemCache + " " + NPMPackage +
	"` (or --prefix ~/.cache/stillpoint/opencode; or set " + BinaryEnv + " to its binary) and ripgrep with `apt-get install -y ripgrep`; .ci/run does both"

// ErrNotInstalled is returned (wrapped, with InstallHint) by Binary and
// Ripgrep when the program is not on the host.
var ErrNotInstalled = errors.New("opencode: not installed")

// UserCache returns ~/.cache/stillpoint/opencode (the user's cache
// directory), or "" without one.
func UserCache() string { return hostbin.UserCache("opencode") }

// platformPackage is the npm package of OpenCode's binary for this host.
func platformPackage() string {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	return "opencode-linux-" + arch
}

// Binary returns the host path of the OpenCode binary. It is the one place
// that resolves it: $STILLPOINT_OPENCODE if set, else the platform binary
// of an npm install of NPMPackage in SystemCache or UserCache (the first
// that has one of version Version).
func Binary() (string, error) {
	return hostbin.NPM{Name: "OpenCode", Env: BinaryEnv, Caches: []string{SystemCache, UserCache()},
		Bin: filepath.Join(platformPackage(), "bin", "opencode"), VersionOf: filepath.Join(platformPackage(), "package.json"),
		Version: Version, Err: ErrNotInstalled, Hint: InstallHint}.Find()
}

// Ripgrep returns the host path of rg (OpenCode's glob and grep tools run
// it, and would download it otherwise): $STILLPOINT_RIPGREP, else rg on
// PATH.
func Ripgrep() (string, error) {
	p := os.Getenv(RipgrepEnv)
	if p == "" {
		var err error
		if p, err = exec.LookPath("rg"); err != nil {
			return "", fmt.Errorf("%w: ripgrep (rg) is not on PATH; %s", ErrNotInstalled, InstallHint)
		}
	}
	if err := hostbin.Executable(p); err != nil {
		return "", fmt.Errorf("%w: %s: %v; %s", ErrNotInstalled, p, err, InstallHint)
	}
	return filepath.Abs(p)
}

// The programs in SandboxBinDir, by name.
const (
	OpenCodeName = "opencode"
	RipgrepName  = "rg"
	DriverName   = "opencode-driver"
)

// SandboxBinDir is where every sandbox shows OpenCode, ripgrep and the
// driver, read-only (Binds).
const SandboxBinDir = "/opt/stillpoint/opencode"

// Host is what a host gives the sandboxes: the host paths of the three
// programs.
type Host struct {
	OpenCode string
	Ripgrep  string
	Driver   string
}

// Locate finds OpenCode and ripgrep on the host (Binary, Ripgrep); driver
// is the host path of the static opencode-driver.
func Locate(driverPath string) (Host, error) {
	oc, err := Binary()
	if err != nil {
		return Host{}, err
	}
	rg, err := Ripgrep()
	if err != nil {
		return Host{}, err
	}
	if err := hostbin.Executable(driverPath); err != nil {
		return Host{}, fmt.Errorf("opencode: the driver %s: %v (CGO_ENABLED=0 go build ./cmd/opencode-driver)", driverPath, err)
	}
	d, err := filepath.Abs(driverPath)
	return Host{OpenCode: oc, Ripgrep: rg, Driver: d}, err
}

// Binds stages h's programs in the host directory stage (hard links, or
// copies where a link cannot be made: once per owner, not per sandbox) and
// returns the bind that shows it read-only at SandboxBinDir in every
// sandbox, so that no snapshot copies OpenCode.
func (h Host) Binds(stage string) ([]provider.Bind, error) {
	binds, err := hostbin.Stage(stage, SandboxBinDir, map[string]string{OpenCodeName: h.OpenCode, RipgrepName: h.Ripgrep, DriverName: h.Driver})
	if err != nil {
		return nil, fmt.Errorf("opencode: %w", err)
	}
	return binds, nil
}
