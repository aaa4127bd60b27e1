package hostbin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// NPM says where a program an npm package installs is, and which version
// it must be.
type NPM struct {
	// Name names the program in errors ("Claude Code").
	Name string
	// Env names the environment variable that gives the program's host
	// path, ahead of any install.
	Env string
	// Caches are the npm prefixes searched in order; "" entries are
	// skipped.
	Caches []string
	// Bin is the program's path in a prefix, from its node_modules.
	Bin string
	// VersionOf is the package.json, from node_modules, whose version must
	// be Version.
	VersionOf string
	Version   string
	// Err is wrapped, with Hint, by every error of Find.
	Err  error
	Hint string
}

// Find returns the host path of the program: $Env if set, else Bin in the
// first of Caches that has it, of version Version.
func (n NPM) Find() (string, error) {
	if p := os.Getenv(n.Env); p != "" {
		if err := Executable(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v; %s", n.Err, n.Env, p, err, n.Hint)
		}
		return p, nil
	}
	var tried []string
	for _, dir := range n.Caches {
		if dir == "" {
			continue
		}
		bin := filepath.Join(dir, "node_modules", n.Bin)
		tried = append(tried, bin)
		if Executable(bin) != nil {
			continue
		}
		if v := packageVersion(filepath.Join(dir, "node_modules", n.VersionOf)); v != n.Version {
			return "", fmt.Errorf("%w: %s is version %q, the adapter runs %s; %s", n.Err, bin, v, n.Version, n.Hint)
		}
		return bin, nil
	}
	return "", fmt.Errorf("%w: no %s binary at %q; %s", n.Err, n.Name, tried, n.Hint)
}

// UserCache returns ~/.cache/stillpoint/<name> (the user's cache
// directory), or "" without one.
func UserCache(name string) string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "stillpoint", name)
}

// Executable tells why p is not an executable regular file, nil if it is.
func Executable(p string) error {
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

// Stage puts the programs (host paths by name) in the host directory stage
// (hard links, or copies where a link cannot be made: once per owner, not
// per sandbox) and returns the bind that shows it read-only at sandboxDir
// (absolute) in every sandbox, so that no snapshot copies them.
func Stage(stage, sandboxDir string, programs map[string]string) ([]provider.Bind, error) {
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return nil, err
	}
	for name, src := range programs {
		if err := place(src, filepath.Join(stage, name)); err != nil {
			return nil, fmt.Errorf("staging %s: %w", name, err)
		}
	}
	abs, err := filepath.Abs(stage)
	if err != nil {
		return nil, err
	}
	return []provider.Bind{{HostDir: abs, SandboxDir: sandboxDir[1:]}}, nil
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
