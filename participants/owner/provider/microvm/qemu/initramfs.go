package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// GuestModulesFile is where the initramfs lists the modules the guest's
// init loads (busybox modprobe), one name a line, in order.
const GuestModulesFile = "/etc/stillpoint/modules"

// Initramfs describes a guest's initial RAM file system.
type Initramfs struct {
	// Assets has the busybox, the modules and the list to load.
	Assets Assets
	// Sandboxd is the host path of the static sandboxd: the guest's /init
	// (it runs `sandboxd init` when it is PID 1 named /init).
	Sandboxd string
	// Init replaces /init when set (the accelerator probe boots another
	// guest).
	Init []byte
	// Files are more files, keyed by absolute path in the guest.
	Files map[string][]byte
}

// Write builds the archive at dst (written to a temporary name and renamed).
func (ir Initramfs) Write(ctx context.Context, dst string) error {
	var buf bytes.Buffer
	c := NewCPIO(&buf)
	for _, d := range []string{"dev", "proc", "sys", "tmp", "mnt", "run", "root", "etc/stillpoint", "bin", "sbin", "usr/bin", "usr/sbin"} {
		if err := c.Dir(d, 0o755); err != nil {
			return err
		}
	}
	bb, err := os.ReadFile(ir.Assets.Busybox)
	if err != nil {
		return err
	}
	if err := c.File("bin/busybox", 0o755, bb); err != nil {
		return err
	}
	applets, err := BusyboxApplets(ctx, ir.Assets.Busybox)
	if err != nil {
		return err
	}
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		if err := c.Symlink(a, "/bin/busybox"); err != nil {
			return err
		}
	}
	init := ir.Init
	if init == nil {
		if init, err = os.ReadFile(ir.Sandboxd); err != nil {
			return err
		}
	}
	if err := c.File("init", 0o755, init); err != nil {
		return err
	}
	if err := c.File(GuestModulesFile, 0o644, []byte(strings.Join(ir.Assets.Load, "\n")+"\n")); err != nil {
		return err
	}
	mods := ir.Assets.Modules
	err = filepath.WalkDir(filepath.Join(mods, "lib"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(mods, p)
		if d.IsDir() {
			return c.Dir(rel, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return c.File(rel, 0o644, b)
	})
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(ir.Files)) {
		if err := c.File(path.Clean(name), 0o755, ir.Files[name]); err != nil {
			return err
		}
	}
	if err := c.Close(); err != nil {
		return err
	}
	return writeAtomic(dst, buf.Bytes())
}

// BusyboxApplets lists busybox's applets as paths relative to / (bin/sh,
// usr/bin/env, ...).
func BusyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	var as []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if a := strings.Trim(sc.Text(), "/ "); a != "" && !strings.Contains(a, "..") {
			as = append(as, a)
		}
	}
	return as, sc.Err()
}

// writeAtomic writes data to a temporary file beside dst and renames it.
func writeAtomic(dst string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(dst), ".tmp-"+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
