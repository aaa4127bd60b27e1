//go:build linux

package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
)

// defaultBaseTree makes the default root tree: busybox and its applets,
// the few files and directories a shell and sandboxd expect.
func (m *Provider) defaultBaseTree(ctx context.Context) (string, error) {
	tools, err := hostTools(ctx, m.cfg.HostTools, false)
	if err != nil {
		return "", err
	}
	libs, err := hostTools(ctx, m.cfg.HostLibraries, true)
	if err != nil {
		return "", err
	}
	for _, l := range libs {
		if !slices.Contains(tools, l) {
			tools = append(tools, l)
		}
	}
	key := sha256.New()
	fmt.Fprintf(key, "%s\n", m.initrdKey)
	for _, f := range tools {
		fi, err := os.Stat(f.Src)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(key, "%s %s %d %d\n", f.Src, f.Dst, fi.Size(), fi.ModTime().UnixNano())
	}
	dir := filepath.Join(m.cache, "basetree-"+hex.EncodeToString(key.Sum(nil))[:16])
	if _, err := os.Stat(dir + ".complete"); err == nil {
		return dir, nil
	}
	// One builder at a time: owners of other processes (another run, a
	// test beside this one) that want the same tree wait for it here, and
	// never read a tree another removes and builds again.
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if _, err := os.Stat(dir + ".complete"); err == nil {
		return dir, nil // built by the owner this one waited for
	}
	_ = os.RemoveAll(dir)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "root", "var/lib", "var/tmp", "run",
		"proc", "sys", "dev", "work", strings.TrimPrefix(BinDirInGuest, "/")} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return "", err
	}
	bb, err := os.ReadFile(m.assets.Busybox)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bb, 0o755); err != nil {
		return "", err
	}
	applets, err := qemu.BusyboxApplets(ctx, m.assets.Busybox)
	if err != nil {
		return "", err
	}
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, a)), 0o755); err != nil {
			return "", err
		}
		if err := os.Symlink("/bin/busybox", filepath.Join(dir, a)); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	// The host tools replace busybox's applets of their names, with the
	// shared libraries they load at the same paths.
	for _, f := range tools {
		dst := filepath.Join(dir, f.Dst)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		_ = os.Remove(dst)
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			return "", err
		}
	}
	for name, data := range map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":    "127.0.0.1 localhost\n",
		"etc/hostname": "sandbox\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return "", err
		}
	}
	return dir, os.WriteFile(dir+".complete", nil, 0o644)
}

// hostFile is one host file of the default root tree: Src on the host,
// Dst in the tree.
type hostFile struct{ Src, Dst string }

// hostTools resolves HostTools entries ("PROG", installed at its host
// path, or "PATH=PROG", installed at PATH) and adds the shared libraries
// each program loads (ldd) at their host paths; with onlyLibs
// (HostLibraries), the libraries alone.
func hostTools(ctx context.Context, entries []string, onlyLibs bool) ([]hostFile, error) {
	seen := map[string]bool{}
	var out []hostFile
	add := func(src, dst string) {
		if !seen[dst] {
			seen[dst] = true
			out = append(out, hostFile{src, dst})
		}
	}
	for _, e := range entries {
		dst, prog, named := strings.Cut(e, "=")
		if !named {
			prog = e
		}
		p, err := exec.LookPath(prog)
		if err != nil {
			return nil, provider.InvalidField("HostTools", "%s: %v", prog, err)
		}
		if p, err = filepath.Abs(p); err != nil {
			return nil, err
		}
		if !named {
			dst = p
		}
		if !filepath.IsAbs(dst) {
			return nil, provider.InvalidField("HostTools", "%q: the path in the tree must be absolute", e)
		}
		if !onlyLibs {
			add(p, dst)
		}
		ldd, err := exec.CommandContext(ctx, "ldd", p).Output()
		if err != nil {
			continue // a static program ("not a dynamic executable")
		}
		for _, line := range strings.Split(string(ldd), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				add(f[2], f[2])
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				add(f[0], f[0])
			}
		}
	}
	return out, nil
}
