package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
)

// ImageResolver resolves the image a task names (spec.ImageRef) into an
// unpacked image on this host, held under a holder of the owner's from
// the resolution until the sandbox's provider holds it: *image.Cache.
type ImageResolver interface {
	// GetHeld resolves ref and makes holder hold the image, atomically
	// with its check: no prune removes it before Release(holder). An
	// error wrapping image.ErrBadImage or image.ErrNotFound is the
	// task's; any other is the host's.
	GetHeld(ctx context.Context, ref, holder string) (*provider.Image, error)
	// Release drops holder's hold; one that holds nothing is no error.
	Release(holder string) error
	// Holders lists the holders whose names start with prefix.
	Holders(prefix string) ([]string, error)
}

// LaunchUserFile is where, inside a sandbox on an image with a User, the
// owner writes that user (spec.Files) for sandboxd (--launch-user-file,
// which SandboxdSpec passes): the harness's launches run as that user. It
// is a file of the sandbox so that a snapshot keeps it and a fork's
// sandboxd finds it.
const LaunchUserFile = "/etc/stillpoint/launch-user"

// seedHolderPrefix starts the names the owner holds images under while
// it seeds: "owner-<8 hex of the state directory's sha256, or of run and
// name without one>-seed-".
func seedHolderPrefix(cfg Config) string {
	id := cfg.StateDir
	if id == "" {
		id = "run " + cfg.Run + " owner " + cfg.Name
	} else {
		id = filepath.Clean(id)
	}
	sum := sha256.Sum256([]byte(id))
	return "owner-" + hex.EncodeToString(sum[:4]) + "-seed-"
}

// releaseSeedHolds releases the seed holds an earlier process of this
// owner left (it crashed while seeding): nothing stands on them now.
func (o *Owner) releaseSeedHolds() {
	if o.cfg.Images == nil {
		return
	}
	prefix := seedHolderPrefix(o.cfg)
	hs, err := o.cfg.Images.Holders(prefix)
	if err != nil {
		o.log.Warn().Err(err).Str("prefix", prefix).Msg("image cache: cannot list the seed holds an earlier process left")
	}
	for _, h := range hs {
		if err := o.cfg.Images.Release(h); err != nil {
			o.log.Warn().Err(err).Str("holder", h).Msg("image cache: cannot release a seed hold an earlier process left")
		}
	}
}

// resolveImage resolves spec.ImageRef, when set, before any sandbox is
// made: it sets spec.Image and applies the image's config (Env before the
// spec's own entries, which win; WorkingDir when the kind left Workdir
// ""; User for sandboxd). The image is held under a seed holder of the
// owner's until the returned release, which the caller calls once the
// sandbox has started (its provider holds the image then) or failed.
// A bad or missing image wraps ErrBadTask (the task's fault, 400); any
// other failure (a registry's 5xx or timeout, a full disk, a lock) is
// the host's and is returned as it is (500), never as the rollout's
// result. Both name the reference.
func (o *Owner) resolveImage(ctx context.Context, sessionID string, spec *provider.Spec) (release func(), err error) {
	release = func() {}
	ref := spec.ImageRef
	if ref == "" || spec.Image != nil {
		return release, nil
	}
	if o.cfg.Images == nil {
		return release, fmt.Errorf("%w: session %s: image %q: this owner has no image cache (Config.Images)", ErrBadTask, sessionID, ref)
	}
	holder := fmt.Sprintf("%s%s-%d", seedHolderPrefix(o.cfg), token(sessionID), o.seeds.Add(1))
	if len(holder) > 200 {
		holder = fmt.Sprintf("%s%d", seedHolderPrefix(o.cfg), o.seeds.Load())
	}
	img, err := o.cfg.Images.GetHeld(ctx, ref, holder)
	if err == nil && (img == nil || len(img.Layers) == 0) {
		err = fmt.Errorf("%w: the image cache returned no layers", image.ErrBadImage)
	}
	release = func() {
		if err := o.cfg.Images.Release(holder); err != nil {
			o.log.Warn().Err(err).Str("session", sessionID).Str("holder", holder).Msg("image cache: cannot release the seed's hold")
		}
	}
	if err != nil {
		release()
		if errors.Is(err, image.ErrBadImage) || errors.Is(err, image.ErrNotFound) || errors.Is(err, ErrBadTask) {
			return func() {}, fmt.Errorf("%w: session %s: image %q: %w", ErrBadTask, sessionID, ref, err)
		}
		return func() {}, fmt.Errorf("owner: session %s: image %q: %w", sessionID, ref, err)
	}
	applyImage(spec, img)
	o.log.Info().Str("session", sessionID).Str("image", ref).Str("digest", img.Digest).Int("layers", len(img.Layers)).Msg("image resolved")
	return release, nil
}

// applyImage sets spec.Image to img and applies its config.
func applyImage(spec *provider.Spec, img *provider.Image) {
	spec.Image = img
	spec.Env = withImageEnv(img.Env, spec.Env)
	if spec.Workdir == "" {
		spec.Workdir = img.WorkingDir
	}
	if u := img.User; u != "" && u != "root" && u != "0" && u != "0:0" {
		files := make(map[string][]byte, len(spec.Files)+1)
		for k, v := range spec.Files {
			files[k] = v
		}
		files[LaunchUserFile[1:]] = []byte(u + "\n")
		spec.Files = files
	}
}

// withImageEnv returns the image's entries whose keys env does not set,
// then env.
func withImageEnv(image, env []string) []string {
	if len(image) == 0 {
		return env
	}
	keys := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	out := make([]string, 0, len(image)+len(env))
	for _, kv := range image {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}
