//go:build linux

package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// ImageFinder is what the provider needs of an image cache (satisfied by
// *image.Cache): a fork of a snapshot taken on an image finds that image
// by its digest, and every sandbox and kept snapshot holds its image so
// that the cache never prunes it from under them.
type ImageFinder interface {
	// Lookup returns the cached image of a manifest digest, or an error
	// naming the digest when it is not cached.
	Lookup(digest string) (*provider.Image, error)
	// Hold records that holder (a path-safe name) stands on the image.
	Hold(holder, digest string) error
	// Release drops holder's hold; a holder that holds nothing is no
	// error.
	Release(holder string) error
	// Holders lists the holders whose names start with prefix: New
	// finds the holds an earlier process left.
	Holders(prefix string) ([]string, error)
}

// stateHash names the state directory in hold names: 8 hex digits of its
// sha256, as the default cgroup parent does.
func stateHash(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return hex.EncodeToString(sum[:4])
}

// sandboxHolder and snapshotHolder are the names this provider holds
// images under in the cache.
func (o *Provider) sandboxHolder(id string) string {
	return "overlay-" + stateHash(o.cfg.StateDir) + "-sandbox-" + id
}

func (o *Provider) snapshotHolder(id string) string {
	return "overlay-" + stateHash(o.cfg.StateDir) + "-snap-" + id
}

// reconcileHolds makes the provider's holds in the image cache match its
// state directory, as an earlier process (killed between a hold and what
// it holds) may have left them: it releases a snapshot's hold whose
// snapshot does not exist and a sandbox's whose sandbox directory does
// not, and holds again the image of every snapshot that stands on one. A
// snapshot whose image the cache lost keeps no hold; its fork says so.
func (o *Provider) reconcileHolds() error {
	if o.cfg.Images == nil {
		return nil
	}
	prefix := "overlay-" + stateHash(o.cfg.StateDir) + "-"
	hs, err := o.cfg.Images.Holders(prefix)
	if err != nil {
		return fmt.Errorf("overlay: image holds: %w", err)
	}
	var errs []error
	for _, h := range hs {
		rest := strings.TrimPrefix(h, prefix)
		var gone bool
		if id, ok := strings.CutPrefix(rest, "snap-"); ok {
			gone = !o.snaps.Exists(id)
		} else if id, ok := strings.CutPrefix(rest, "sandbox-"); ok {
			_, err := os.Lstat(o.dir(id))
			gone = errors.Is(err, os.ErrNotExist)
		}
		if gone {
			errs = append(errs, o.release(h))
		}
	}
	ids, err := o.snaps.List()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("overlay: snapshots: %w", err))...)
	}
	for _, id := range ids {
		_, meta, done, err := o.snaps.Open(id)
		if err != nil {
			continue // removed meanwhile, or not a snapshot
		}
		done()
		if meta.Image != "" {
			_ = o.cfg.Images.Hold(o.snapshotHolder(id), meta.Image) // not cached: nothing to keep
		}
	}
	return errors.Join(errs...)
}

// checkImage checks an image's digest and layers before they become
// lowerdirs: absolute directories whose paths overlay's options can
// hold, none of them holding the state directory (a sandbox would see
// every other sandbox's upper layer through it).
func (o *Provider) checkImage(img *provider.Image) error {
	if img.Digest == "" || strings.ContainsAny(img.Digest, "/\x00") {
		return provider.InvalidField("spec.Image.Digest", "%q is not a digest", img.Digest)
	}
	if len(img.Layers) == 0 {
		return provider.InvalidField("spec.Image.Layers", "image %s (%s) has no layers", img.Ref, img.Digest)
	}
	for i, l := range img.Layers {
		field := fmt.Sprintf("spec.Image.Layers[%d]", i)
		switch {
		case !filepath.IsAbs(l):
			return provider.InvalidField(field, "%q is not absolute", l)
		case strings.ContainsAny(l, ",:\\\n"):
			return provider.InvalidField(field, "%q has a character overlay options cannot hold (, : \\ newline)", l)
		}
		st, err := os.Stat(l)
		if err != nil {
			// A layer the cache gave and the host lost (a prune, a disk):
			// the host's fault, not the spec's.
			return fmt.Errorf("%s: image %s: %w", field, img.Digest, err)
		}
		if !st.IsDir() {
			return provider.InvalidField(field, "%q is not a directory", l)
		}
		mask, err := stateMask(l, o.cfg.StateDir)
		if err != nil {
			return err
		}
		if mask != "" {
			return provider.InvalidField(field, "%q holds the state directory %s", l, o.cfg.StateDir)
		}
	}
	return nil
}

// lowerDirs are the overlay's lower directories, top first: the image's
// layers reversed, or the base.
func (o *Provider) lowerDirs(img *provider.Image) []string {
	if img == nil {
		return []string{o.cfg.BaseDir}
	}
	l := slices.Clone(img.Layers)
	slices.Reverse(l)
	return l
}

// maxMountData is what mount(2) copies of its options: one page.
const maxMountData = 4095

// mountOverlay mounts the overlay of lowers (top first) with upper and
// work on merged. Options that do not fit in one page (many layers, long
// paths) go through the new mount API, one lowerdir+ per layer.
func mountOverlay(lowers []string, upper, work, merged string) error {
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", strings.Join(lowers, ":"), upper, work, overlayOptions)
	if len(opts) <= maxMountData {
		if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", merged, err)
		}
		return nil
	}
	if err := mountOverlayFS(lowers, upper, work, merged); err != nil {
		return fmt.Errorf("mount overlay of %d layers on %s (fsopen, lowerdir+; Linux 6.8 or later): %w", len(lowers), merged, err)
	}
	return nil
}

// mountOverlayFS mounts an overlay through fsopen, fsconfig, fsmount and
// move_mount, with no bound on the number of lower directories.
func mountOverlayFS(lowers []string, upper, work, merged string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fd)
	set := func(k, v string) error {
		if err := unix.FsconfigSetString(fd, k, v); err != nil {
			return fmt.Errorf("fsconfig %s=%s: %w", k, v, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if err := errors.Join(set("upperdir", upper), set("workdir", work)); err != nil {
		return err
	}
	for _, kv := range strings.Split(overlayOptions, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if err := set(k, v); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// imageOf returns the image a fork of a snapshot stands on: the one its
// meta records, found in the image cache, or nil for a snapshot over the
// base. A spec that names an image must name that one.
func (o *Provider) imageOf(snapshotID, digest string, spec *provider.Image) (*provider.Image, error) {
	if digest == "" {
		if spec != nil {
			return nil, fmt.Errorf("%w: snapshot %s stands on the base, not on image %s", provider.ErrInvalid, snapshotID, spec.Digest)
		}
		return nil, nil
	}
	if spec != nil && spec.Digest != digest {
		return nil, fmt.Errorf("%w: snapshot %s stands on image %s, not on %s", provider.ErrInvalid, snapshotID, digest, spec.Digest)
	}
	if o.cfg.Images == nil {
		return nil, fmt.Errorf("%w: snapshot %s stands on image %s; it is not in the image cache: the provider has none (Config.Images)",
			provider.ErrInvalid, snapshotID, digest)
	}
	img, err := o.cfg.Images.Lookup(digest)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %s stands on image %s; it is not in the image cache: %w", provider.ErrInvalid, snapshotID, digest, err)
	}
	if img == nil || img.Digest != digest {
		return nil, fmt.Errorf("%w: snapshot %s stands on image %s; the image cache returned another", provider.ErrInvalid, snapshotID, digest)
	}
	return img, nil
}

// holdImage makes sandbox id hold img in the cache (no cache: nothing to
// hold).
func (o *Provider) holdImage(id string, img *provider.Image) error {
	if img == nil || o.cfg.Images == nil {
		return nil
	}
	if err := o.cfg.Images.Hold(o.sandboxHolder(id), img.Digest); err != nil {
		return fmt.Errorf("hold image %s for sandbox %s: %w", img.Digest, id, err)
	}
	return nil
}

// holdForSnapshot makes snapshot snapshotID, about to be taken, hold img:
// from before it exists until DeleteSnapshot.
func (o *Provider) holdForSnapshot(snapshotID string, img *provider.Image) error {
	if o.snaps.Exists(snapshotID) {
		return fmt.Errorf("%w: snapshot %q", provider.ErrExists, snapshotID)
	}
	if o.cfg.Images == nil {
		return nil
	}
	if err := o.cfg.Images.Hold(o.snapshotHolder(snapshotID), img.Digest); err != nil {
		return fmt.Errorf("hold image %s for snapshot %s: %w", img.Digest, snapshotID, err)
	}
	return nil
}

// release drops holder's hold, if the provider has a cache.
func (o *Provider) release(holder string) error {
	if o.cfg.Images == nil {
		return nil
	}
	if err := o.cfg.Images.Release(holder); err != nil {
		return fmt.Errorf("release image hold %s: %w", holder, err)
	}
	return nil
}

// withImageEnv puts the image's environment before env (a later entry
// wins, so env's own stay): what the owner did for the sandbox the
// snapshot was taken of, done again for its fork.
func withImageEnv(img *provider.Image, env []string) []string {
	if img == nil || len(img.Env) == 0 {
		return env
	}
	keys := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	var out []string
	for _, kv := range img.Env {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}
