//go:build linux

package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// template is a warm template: a booted guest's device state and RAM
// file, and its disk layer, which every fresh sandbox of its images forks.
type template struct {
	key string
	dir string
	// mount is where the guest mounts the harness disk ("": BinDirInGuest).
	mount string
	meta  vmMeta
	mu    sync.Mutex // held while it is built
	ok    bool
}

// initrdPath is the guests' initramfs, named for what it holds.
func (m *MicroVM) initrdPath() string {
	return filepath.Join(m.cache, "initrd-"+m.initrdKey)
}

// buildInitrd writes the initramfs (busybox, the modules, sandboxd as
// /init) unless it is there.
func (m *MicroVM) buildInitrd(ctx context.Context) error {
	h := sha256.New()
	for _, p := range []string{m.cfg.Sandboxd, m.assets.Busybox} {
		if err := hashFile(h, p); err != nil {
			return err
		}
	}
	fmt.Fprintf(h, "%s\n%v\n", m.assets.KernelVersion, m.assets.Load)
	m.initrdKey = hex.EncodeToString(h.Sum(nil))[:16]
	if _, err := os.Stat(m.initrdPath()); err == nil {
		return nil
	}
	return microvm.Initramfs{Assets: m.assets, Sandboxd: m.cfg.Sandboxd}.Write(ctx, m.initrdPath())
}

// baseImage returns the root image every sandbox's disk starts from,
// building it once: from BaseDir, or from a tree of busybox applets.
func (m *MicroVM) baseImage(ctx context.Context) (string, error) {
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	if m.base != "" {
		return m.base, nil
	}
	dir := m.cfg.BaseDir
	if dir == "" {
		var err error
		if dir, err = m.defaultBaseTree(ctx); err != nil {
			return "", err
		}
	}
	img, err := m.imageOf(ctx, "base", dir, m.cfg.BaseSize)
	if err == nil {
		m.base = img
	}
	return img, err
}

// harnessMount is where the guest mounts the harness disk for binds: ""
// (BinDirInGuest) for at most the one bind there, else HarnessRootInGuest,
// the disk then holding every bind at its place below it.
func harnessMount(binds []Bind) string {
	for _, b := range binds {
		if rel, _ := cleanRel("", b.SandboxDir); "/"+rel != BinDirInGuest {
			return HarnessRootInGuest
		}
	}
	return ""
}

// harnessImage returns the read-only image of what the guest shows at
// BinDirInGuest: the one bound directory and the files Spec.CopyIn puts
// there (an empty image without either), cached by content. With binds
// elsewhere below HarnessRootInGuest (harnessMount), the image holds each
// bind at its place below that root instead, the files too.
func (m *MicroVM) harnessImage(ctx context.Context, binds []Bind, copyIn []CopyIn) (string, error) {
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	root := BinDirInGuest
	if harnessMount(binds) != "" {
		root = HarnessRootInGuest
	}
	var files []CopyIn
	for _, c := range copyIn {
		if rel, _ := cleanRel("", c.SandboxPath); strings.HasPrefix("/"+rel+"/", root+"/") {
			files = append(files, c)
		}
	}
	dir := ""
	switch {
	case len(files) > 0 || root != BinDirInGuest:
		// Staged: the bound tree and the files, in a directory of their
		// own, remembered by what they are made of.
		key := sha256.New()
		for _, b := range binds {
			fmt.Fprintf(key, "bind %s %s\n", b.HostDir, b.SandboxDir)
			if root != BinDirInGuest {
				// What the tree holds (names, sizes, times): a bind whose
				// files change gets a new image.
				if err := filepath.WalkDir(b.HostDir, func(p string, d fs.DirEntry, err error) error {
					if err != nil {
						return err
					}
					fi, err := os.Stat(p) // through links, as copyTree reads them
					if err != nil {
						return err
					}
					fmt.Fprintf(key, " %s %d %d %o\n", p, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
					return nil
				}); err != nil {
					return "", invalid("spec.Binds", "%v", err)
				}
			}
		}
		for _, c := range files {
			fi, err := os.Stat(c.HostPath)
			if err != nil {
				return "", invalid("spec.CopyIn", "%v", err)
			}
			fmt.Fprintf(key, "file %s %s %d %d %o\n", c.HostPath, c.SandboxPath, fi.Size(), fi.ModTime().UnixNano(), c.Mode)
		}
		k := hex.EncodeToString(key.Sum(nil))
		if img, ok := m.staged[k]; ok {
			return img, nil
		}
		stage, err := os.MkdirTemp(m.cache, ".stage-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(stage)
		switch {
		case root != BinDirInGuest:
			if err := os.Mkdir(stage+"/t", 0o755); err != nil {
				return "", err
			}
			for _, b := range binds {
				rel, _ := cleanRel("", b.SandboxDir)
				dst := filepath.Join(stage, "t", strings.TrimPrefix("/"+rel, root))
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return "", err
				}
				if _, err := copyTree(ctx, b.HostDir, dst); err != nil {
					return "", err
				}
			}
		case len(binds) == 1:
			if _, err := copyTree(ctx, binds[0].HostDir, stage+"/t"); err != nil {
				return "", err
			}
		default:
			if err := os.Mkdir(stage+"/t", 0o755); err != nil {
				return "", err
			}
		}
		for _, c := range files {
			rel, _ := cleanRel("", c.SandboxPath)
			dst := filepath.Join(stage, "t", strings.TrimPrefix("/"+rel, root))
			b, err := os.ReadFile(c.HostPath)
			if err != nil {
				return "", err
			}
			mode := os.FileMode(c.Mode)
			if mode == 0 {
				mode = 0o755
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return "", err
			}
			if err := os.WriteFile(dst, b, mode); err != nil {
				return "", err
			}
		}
		img, err := m.sizedImage(ctx, stage+"/t")
		if err == nil {
			m.staged[k] = img
		}
		return img, err
	case len(binds) == 1:
		dir = binds[0].HostDir
	default:
		dir = filepath.Join(m.cache, "empty")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	return m.sizedImage(ctx, dir)
}

// sizedImage is the harness image of dir, sized for its files.
func (m *MicroVM) sizedImage(ctx context.Context, dir string) (string, error) {
	size, err := treeSize(dir)
	if err != nil {
		return "", err
	}
	return m.imageOf(ctx, "harness", dir, size+size/4+16<<20)
}

// imageOf builds (once) the ext4 image of dir's tree, named for its
// content, in cache/images.
func (m *MicroVM) imageOf(ctx context.Context, kind, dir string, size int64) (string, error) {
	sum, err := treeHash(dir)
	if err != nil {
		return "", err
	}
	imgs := filepath.Join(m.cache, "images")
	if err := os.MkdirAll(imgs, 0o700); err != nil {
		return "", err
	}
	img := filepath.Join(imgs, fmt.Sprintf("%s-%s-%d.ext4", kind, sum[:16], size>>20))
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	if err := microvm.Ext4Image(ctx, m.assets.MkfsExt4, dir, img, "sp-"+kind, size); err != nil {
		return "", err
	}
	return img, nil
}

// defaultBaseTree makes the default root tree: busybox and its applets,
// the few files and directories a shell and sandboxd expect.
func (m *MicroVM) defaultBaseTree(ctx context.Context) (string, error) {
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
	applets, err := microvm.BusyboxApplets(ctx, m.assets.Busybox)
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
			return nil, invalid("HostTools", "%s: %v", prog, err)
		}
		if p, err = filepath.Abs(p); err != nil {
			return nil, err
		}
		if !named {
			dst = p
		}
		if !filepath.IsAbs(dst) {
			return nil, invalid("HostTools", "%q: the path in the tree must be absolute", e)
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

// template returns the warm template of the images, booting it once.
func (m *MicroVM) template(ctx context.Context, base, harness, mount string) (*template, error) {
	parts := []string{m.initrdKey, m.assets.Kernel, base, harness, m.accel, fmt.Sprint(m.cfg.MemMiB)}
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
		t = &template{key: key, dir: filepath.Join(m.cache, "templates", key), mount: mount}
		m.templates[key] = t
	}
	m.tmplMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ok {
		touchTemplate(t)
		return t, nil
	}
	if meta, err := readVMMeta(t.dir); err == nil && fileIsRegular(filepath.Join(t.dir, "complete")) {
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
	if meta, err := readVMMeta(t.dir); err == nil && fileIsRegular(filepath.Join(t.dir, "complete")) {
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
func (m *MicroVM) bootTemplate(ctx context.Context, t *template, base, harness string) error {
	// A process that died while it built this template may have left its
	// QEMU (paused, so its lease cannot end it): vm.json is the only
	// record of it.
	if meta, err := readVMMeta(t.dir); err == nil {
		if err := killLeftover(meta, m.cfg.StopTimeout); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(t.dir)
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	layer := filepath.Join(t.dir, "disk.qcow2")
	t.meta = vmMeta{Chain: []string{layer}, Base: base, Harness: harness, HarnessMount: t.mount, CPU: m.cfg.CPU, Gen: 0, MemMiB: m.cfg.MemMiB}
	if err := writeVMMeta(t.dir, t.meta); err != nil {
		return err
	}
	if err := microvm.Overlay(ctx, m.assets.QEMUImg, base, "raw", layer); err != nil {
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
	if vm.ctl, err = microvm.DialControl(ctx, mc.Control, m.onNotice(id, vm)); err != nil {
		return err
	}
	hello, err := vm.ctl.Hello(ctx)
	if err != nil {
		return fmt.Errorf("the template guest did not answer: %w (console: %s)", err, tailFile(mc.Serial, 2048))
	}
	if hello.State != vmctl.StateTemplate {
		return fmt.Errorf("%w: the template guest is %q, not %q", microvm.ErrGuest, hello.State, vmctl.StateTemplate)
	}
	q := vm.qmp
	for _, step := range []func() error{
		func() error { return q.SetIgnoreShared(ctx, true) },
		func() error { return q.SetFastMigration(ctx) },
		func() error { return q.Do(ctx, "stop", nil, nil) },
		func() error {
			return q.Do(ctx, "migrate", map[string]any{"uri": microvm.SaveURI(filepath.Join(t.dir, "state"))}, nil)
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
	if err := writeVMMeta(t.dir, t.meta); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(t.dir, "complete"), nil, 0o600)
}

// reapTemplateLeftovers kills the QEMUs that earlier processes left while
// they built a template (vm.json names one until the template is saved)
// and the accelerator probe's, unless another process holds the
// template's lock (it is building it now).
func (m *MicroVM) reapTemplateLeftovers() error {
	var errs []error
	tdir := filepath.Join(m.cache, "templates")
	ents, _ := os.ReadDir(tdir)
	for _, e := range ents {
		d := filepath.Join(tdir, e.Name())
		meta, err := readVMMeta(d)
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
	return errors.Join(append(errs, microvm.KillProbeLeftover(filepath.Join(m.cache, ".probe")))...)
}

// treeHash hashes a directory tree: every entry's path, type, mode and
// size, the contents of files and the targets of links.
func treeHash(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%o\x00%d\x00", rel, fi.Mode(), fi.Size())
		switch {
		case fi.Mode().IsRegular():
			return hashFile(h, p)
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			fmt.Fprintf(h, "%s\x00", t)
			return err
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func hashFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// treeSize sums the sizes of a tree's regular files.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size() + 4096
		}
		return nil
	})
	return n, err
}

// Pruning of the cache: PruneKeep templates are always kept (the most
// recently used), and any used within PruneUnused.
const (
	PruneKeep   = 4
	PruneUnused = time.Hour
)

// registerCacheUser records this provider's state directory in the
// cache's users/ (one file a state directory, holding its path), so that
// the pruning of any provider sharing the cache sees what this one's
// sandboxes and snapshots stand on.
func (m *MicroVM) registerCacheUser() error {
	dir := filepath.Join(m.cache, "users")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	state := filepath.Clean(m.cfg.StateDir)
	return os.WriteFile(filepath.Join(dir, shortHash(state)), []byte(state+"\n"), 0o600)
}

// cacheUsers returns the state directories registered as users of the
// cache (this one's always), dropping the registrations of those that are
// gone.
func (m *MicroVM) cacheUsers() []string {
	own := filepath.Clean(m.cfg.StateDir)
	out := []string{own}
	dir := filepath.Join(m.cache, "users")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		state := strings.TrimSpace(string(b))
		if state == own || state == "" {
			continue
		}
		if _, err := os.Stat(state); errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(filepath.Join(dir, e.Name())) // nothing of it can stand on the cache
			continue
		}
		out = append(out, state)
	}
	return out
}

// touchTemplate marks a template used now, for pruneCache.
func touchTemplate(t *template) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(t.dir, "complete"), now, now)
}

// pruneCache removes from the cache the templates beyond the PruneKeep
// most recently used that were not used for PruneUnused and that no
// sandbox or snapshot of any state directory registered as the cache's
// user (registerCacheUser) stands on, the images no
// kept template or own disk needs, and stale initramfs and root trees. A
// template another process is building (its lock held) stays.
func (m *MicroVM) pruneCache() error {
	held := map[string]bool{}
	for _, state := range m.cacheUsers() {
		for _, parent := range []string{filepath.Join(state, "sandboxes"), filepath.Join(state, "snapshots")} {
			dirs, _ := os.ReadDir(parent)
			for _, d := range dirs {
				metas := []vmMeta{}
				if meta, err := readVMMeta(filepath.Join(parent, d.Name())); err == nil {
					metas = append(metas, meta)
				} else if subs, _ := os.ReadDir(filepath.Join(parent, d.Name())); len(subs) > 0 {
					for _, sub := range subs { // a snapshot being made or deleted
						if meta, err := readVMMeta(filepath.Join(parent, d.Name(), sub.Name())); err == nil {
							metas = append(metas, meta)
						}
					}
				}
				for _, meta := range metas {
					for _, l := range append(meta.Chain, meta.Base, meta.Harness) {
						held[l] = true
					}
				}
			}
		}
	}
	tdir := filepath.Join(m.cache, "templates")
	ents, _ := os.ReadDir(tdir)
	type tmpl struct {
		dir  string
		used time.Time
	}
	var ts []tmpl
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := filepath.Join(tdir, e.Name())
		fi, err := os.Stat(filepath.Join(d, "complete"))
		if err != nil {
			fi, err = os.Stat(d)
		}
		if err == nil {
			ts = append(ts, tmpl{d, fi.ModTime()})
		}
	}
	slices.SortFunc(ts, func(a, b tmpl) int { return b.used.Compare(a.used) })
	var errs []error
	keep := map[string]bool{}
	for i, t := range ts {
		if i < PruneKeep || time.Since(t.used) < PruneUnused || held[filepath.Join(t.dir, "disk.qcow2")] {
			keep[t.dir] = true
			continue
		}
		f, err := os.OpenFile(t.dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			keep[t.dir] = true // being built or read by another process
			continue
		}
		errs = append(errs, os.RemoveAll(t.dir), os.Remove(t.dir+".lock"))
		f.Close()
	}
	for d := range keep {
		if meta, err := readVMMeta(d); err == nil {
			held[meta.Base], held[meta.Harness] = true, true
		}
	}
	stale := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && time.Since(fi.ModTime()) > PruneUnused
	}
	imgs, _ := os.ReadDir(filepath.Join(m.cache, "images"))
	for _, e := range imgs {
		p := filepath.Join(m.cache, "images", e.Name())
		if !held[p] && stale(p) {
			errs = append(errs, os.Remove(p))
		}
	}
	top, _ := os.ReadDir(m.cache)
	for _, e := range top {
		p := filepath.Join(m.cache, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "initrd-") && p != m.initrdPath() && stale(p),
			strings.HasPrefix(e.Name(), "basetree-") && stale(p):
			errs = append(errs, os.RemoveAll(p))
		}
	}
	return errors.Join(errs...)
}
