//go:build linux

package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// template is a warm template: a booted guest's device state and RAM
// file, and its disk layer, which every fresh sandbox of its images forks.
type template struct {
	key string
	dir string
	// mount is where the guest mounts the harness disk ("": BinDirInGuest).
	mount string
	// image is the digest of the container image of its root disk ("":
	// the provider's base).
	image string
	meta  vmMeta
	mu    sync.Mutex // held while it is built
	ok    bool
}

// template returns the warm template of the images, booting it once: base
// the root disk (of the container image of digest image, or "" for the
// provider's base tree), harness the harness disk, mounted at mount.
//
// Its key names each image by its file (inode and modification time) as
// well as its path: a booted guest holds the file system's state in its
// RAM, and a template must never be started over other bytes than those it
// booted on. An image is fixed once built (qemu.Ext4Image); a cache an
// older build replaced an image in simply gets a new template.
func (m *Provider) template(ctx context.Context, base, image, harness, mount string) (*template, error) {
	bid, err := fileIdentity(base)
	if err != nil {
		return nil, err
	}
	hid, err := fileIdentity(harness)
	if err != nil {
		return nil, err
	}
	parts := []string{m.initrdKey, m.assets.Kernel, base, bid, harness, hid, m.accel, fmt.Sprint(m.cfg.MemMiB)}
	if mount != "" {
		parts = append(parts, "mount "+mount) // the guest's command line differs
	}
	if m.cfg.CPU != "" {
		parts = append(parts, "cpu "+m.cfg.CPU)
	}
	h := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	key := hex.EncodeToString(h[:])[:16]
	m.tmplMu.Lock()
	t := m.templates[key]
	if t == nil {
		t = &template{key: key, dir: filepath.Join(m.cache, "templates", key), mount: mount, image: image}
		m.templates[key] = t
	}
	m.tmplMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ok {
		touchTemplate(t)
		return t, nil
	}
	if meta, err := vmFile(t.dir).Read(); err == nil && t.complete() {
		t.meta, t.ok = meta, true // an earlier process made it
		touchTemplate(t)
		return t, nil
	}
	t0 := time.Now()
	unlock, err := lockFile(t.dir + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if meta, err := vmFile(t.dir).Read(); err == nil && t.complete() {
		t.meta, t.ok = meta, true // another process made it meanwhile
		return t, nil
	}
	if err := m.bootTemplate(ctx, t, base, harness); err != nil {
		_ = os.RemoveAll(t.dir)
		return nil, fmt.Errorf("warm template: %w", err)
	}
	m.log.Info().Str("template", key).Dur("took", time.Since(t0)).Str("accel", m.accel).Msg("microvm: warm template booted and saved")
	t.ok = true
	return t, nil
}

// complete tells whether the template's build finished: its "complete"
// file is there.
func (t *template) complete() bool {
	fi, err := os.Stat(filepath.Join(t.dir, "complete"))
	return err == nil && fi.Mode().IsRegular()
}

// fileIdentity names the file at p as it is now: its inode and its
// modification time, which another file put at p would not share.
func fileIdentity(p string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", fmt.Errorf("image %s: %w", p, err)
	}
	return fmt.Sprintf("dev %d ino %d mtime %d.%09d", st.Dev, st.Ino, st.Mtim.Sec, st.Mtim.Nsec), nil
}

// lockFile takes an exclusive flock on p (made if missing), so that
// providers sharing a cache build each template once.
func lockFile(p string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}

// bootTemplate boots a guest with its RAM in a shared file, waits until
// its init is ready, and saves its device state (the RAM stays in the
// file, which never changes again).
func (m *Provider) bootTemplate(ctx context.Context, t *template, base, harness string) error {
	// A process that died while it built this template may have left its
	// QEMU (paused, so its lease cannot end it): vm.json is the only
	// record of it.
	if meta, err := vmFile(t.dir).Read(); err == nil {
		if err := killLeftover(meta, m.cfg.StopTimeout); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(t.dir)
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	layer := filepath.Join(t.dir, "disk.qcow2")
	t.meta = vmMeta{Chain: []string{layer}, Base: base, Image: t.image, Harness: harness, HarnessMount: t.mount, CPU: m.cfg.CPU, Gen: 0, MemMiB: m.cfg.MemMiB}
	if err := vmFile(t.dir).Write(t.meta); err != nil {
		return err
	}
	if err := qemu.Overlay(ctx, m.assets.QEMUImg, base, "raw", layer); err != nil {
		return err
	}
	id := "template-" + t.key
	mc := m.machineFor(id, t.dir, t.meta, nil)
	mc.RAMFile, mc.RAMShared = filepath.Join(t.dir, "ram"), true
	vm, err := m.startQEMU(id, t.dir, mc, t.meta, true)
	defer func() {
		if vm != nil {
			_ = vm.stop(context.Background(), m.cfg.StopTimeout)
		}
		_ = m.clearVMCgroup(context.Background(), id) // also made when QEMU did not start
	}()
	defer func() { _ = m.removeSockets(id) }() // the success path below checks it
	if err != nil {
		return err
	}
	if vm.ctl, err = qemu.DialControl(ctx, mc.Control, m.onNotice(id, vm)); err != nil {
		return err
	}
	hello, err := vm.ctl.Hello(ctx)
	if err != nil {
		return fmt.Errorf("the template guest did not answer: %w (console: %s)", err, tailFile(mc.Serial, 2048))
	}
	if hello.State != vmctl.StateTemplate {
		return fmt.Errorf("%w: the template guest is %q, not %q", qemu.ErrGuest, hello.State, vmctl.StateTemplate)
	}
	q := vm.qmp
	for _, step := range []func() error{
		func() error { return q.SetIgnoreShared(ctx, true) },
		func() error { return q.SetFastMigration(ctx) },
		func() error { return q.Do(ctx, "stop", nil, nil) },
		func() error {
			return q.Do(ctx, "migrate", map[string]any{"uri": qemu.SaveURI(filepath.Join(t.dir, "state"))}, nil)
		},
		func() error { _, err := q.WaitMigration(ctx); return err },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	if err := vm.stop(ctx, m.cfg.StopTimeout); err != nil {
		return err
	}
	if err := m.removeSockets(id); err != nil {
		return err
	}
	t.meta.PID, t.meta.Start = 0, 0
	if err := vmFile(t.dir).Write(t.meta); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(t.dir, "complete"), nil, 0o600)
}

// reapTemplateLeftovers kills the QEMUs that earlier processes left while
// they built a template (vm.json names one until the template is saved)
// and the accelerator probe's, unless another process holds the
// template's lock (it is building it now).
func (m *Provider) reapTemplateLeftovers() error {
	var errs []error
	tdir := filepath.Join(m.cache, "templates")
	ents, _ := os.ReadDir(tdir)
	for _, e := range ents {
		d := filepath.Join(tdir, e.Name())
		meta, err := vmFile(d).Read()
		if !e.IsDir() || err != nil || meta.PID == 0 {
			continue
		}
		f, err := os.OpenFile(d+".lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			errs = append(errs, killLeftover(meta, m.cfg.StopTimeout), m.clearVMCgroup(context.Background(), "template-"+e.Name()))
		}
		f.Close()
	}
	return errors.Join(append(errs, qemu.KillProbeLeftover(filepath.Join(m.cache, ".probe")))...)
}
