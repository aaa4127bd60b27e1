//go:build linux

package microvm

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

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
func (m *Provider) registerCacheUser() error {
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
func (m *Provider) cacheUsers() []string {
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
// user (registerCacheUser) stands on, the images (root disks, of the base
// tree or of a container image, and harness disks) that no kept template
// and no such sandbox or snapshot needs, and stale initramfs and root
// trees. A template or an image's root disk another process is building
// (its lock held) stays.
func (m *Provider) pruneCache() error {
	held := map[string]bool{}
	for _, state := range m.cacheUsers() {
		for _, parent := range []string{filepath.Join(state, "sandboxes"), filepath.Join(state, "snapshots")} {
			dirs, _ := os.ReadDir(parent)
			for _, d := range dirs {
				metas := []vmMeta{}
				if meta, err := vmFile(filepath.Join(parent, d.Name())).Read(); err == nil {
					metas = append(metas, meta)
				} else if subs, _ := os.ReadDir(filepath.Join(parent, d.Name())); len(subs) > 0 {
					for _, sub := range subs { // a snapshot being made or deleted
						if meta, err := vmFile(filepath.Join(parent, d.Name(), sub.Name())).Read(); err == nil {
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
		if meta, err := vmFile(d).Read(); err == nil {
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
		if held[p] || !stale(p) {
			continue
		}
		if build, ok := imageBuild(p); ok {
			// An image's root disk or a dead build's staging directory:
			// not while a build of that image holds the lock, which stays
			// (two builders must never lock two files of one name).
			if strings.HasSuffix(p, ".lock") {
				continue
			}
			f, err := os.OpenFile(build+".lock", os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
				errs = append(errs, os.RemoveAll(p))
			}
			f.Close()
			continue
		}
		errs = append(errs, os.Remove(p))
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

// imageBuild returns, for the path of an image's root disk, its lock or
// its staging directory (imageDisk), the path they share without
// extension.
func imageBuild(p string) (string, bool) {
	if !strings.HasPrefix(filepath.Base(p), "image-") {
		return "", false
	}
	for _, ext := range []string{".ext4", ".lock", ".stage"} {
		if b, ok := strings.CutSuffix(p, ext); ok {
			return b, true
		}
	}
	return "", false
}
