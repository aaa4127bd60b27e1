package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	"github.com/stillpoint/stillpoint/participants/claude/driver"
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
func UserCache() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "stillpoint", "claude")
}

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
	if p := os.Getenv(BinaryEnv); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v; %s", ErrNotInstalled, BinaryEnv, p, err, InstallHint)
		}
		return p, nil
	}
	var tried []string
	for _, dir := range []string{SystemCache, UserCache()} {
		if dir == "" {
			continue
		}
		pkg := filepath.Join(dir, "node_modules", platformPackage())
		bin := filepath.Join(pkg, "claude")
		tried = append(tried, bin)
		if executable(bin) != nil {
			continue
		}
		if v := packageVersion(filepath.Join(pkg, "package.json")); v != Version {
			return "", fmt.Errorf("%w: %s is version %q, the adapter runs %s; %s", ErrNotInstalled, bin, v, Version, InstallHint)
		}
		return bin, nil
	}
	return "", fmt.Errorf("%w: no Claude Code binary at %q; %s", ErrNotInstalled, tried, InstallHint)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		return errors.New("not an executable file")
	}
	return nil
}

func packageVersion(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	_ = json.Unmarshal(b, &p)
	return p.Version
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
	if err := executable(driverPath); err != nil {
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
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return nil, err
	}
	for name, src := range map[string]string{ClaudeName: h.Claude, DriverName: h.Driver} {
		if err := place(src, filepath.Join(stage, name)); err != nil {
			return nil, fmt.Errorf("claude: staging %s: %w", name, err)
		}
	}
	abs, err := filepath.Abs(stage)
	if err != nil {
		return nil, err
	}
	return []provider.Bind{{HostDir: abs, SandboxDir: SandboxBinDir[1:]}}, nil
}

// place puts src at dst (replacing it atomically): a hard link, else a
// copy. A dst that is src already stays.
func place(src, dst string) error {
	if a, err := os.Stat(src); err == nil {
		if b, err := os.Stat(dst); err == nil && os.SameFile(a, b) {
			return nil
		}
	}
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		if err := copyFile(src, tmp); err != nil {
			_ = os.Remove(tmp)
			return err
		}
	}
	return os.Rename(tmp, dst)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
