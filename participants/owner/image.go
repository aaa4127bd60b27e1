package owner

import (
	"context"
	"fmt"
	"strings"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// ImageResolver resolves the image a task names (spec.ImageRef) into an
// unpacked image on this host: *image.Cache's Get.
type ImageResolver interface {
	Get(ctx context.Context, ref string) (*provider.Image, error)
}

// LaunchUserFile is where, inside a sandbox on an image with a User, the
// owner writes that user (spec.Files) for sandboxd (--launch-user-file,
// which SandboxdSpec passes): the harness's launches run as that user. It
// is a file of the sandbox so that a snapshot keeps it and a fork's
// sandboxd finds it.
const LaunchUserFile = "/etc/stillpoint/launch-user"

// resolveImage resolves spec.ImageRef, when set, before any sandbox is
// made: it sets spec.Image and applies the image's config (Env before the
// spec's own entries, which win; WorkingDir when the kind left Workdir
// ""; User for sandboxd). A failure wraps ErrBadTask and names the
// reference.
func (o *Owner) resolveImage(ctx context.Context, sessionID string, spec *provider.Spec) error {
	ref := spec.ImageRef
	if ref == "" || spec.Image != nil {
		return nil
	}
	if o.cfg.Images == nil {
		return fmt.Errorf("%w: session %s: image %q: this owner has no image cache (Config.Images)", ErrBadTask, sessionID, ref)
	}
	img, err := o.cfg.Images.Get(ctx, ref)
	if err == nil && (img == nil || len(img.Layers) == 0) {
		err = fmt.Errorf("the image cache returned no layers")
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("owner: session %s: image %q: %w", sessionID, ref, err)
		}
		return fmt.Errorf("%w: session %s: image %q: %w", ErrBadTask, sessionID, ref, err)
	}
	applyImage(spec, img)
	o.log.Info().Str("session", sessionID).Str("image", ref).Str("digest", img.Digest).Int("layers", len(img.Layers)).Msg("image resolved")
	return nil
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
