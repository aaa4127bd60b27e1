package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"regexp"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// source is a resolved reference: the image's identity, its config and
// how to read each of its layer blobs. Nothing of it has been checked
// beyond what resolving needed.
type source struct {
	ref    string
	digest string // manifest digest; a docker save archive's: its config's
	config *v1.ConfigFile
	layers []layerSource // bottom first
}

// layerSource is one layer blob to read.
type layerSource struct {
	digest string // the blob's digest; "" when the form gives none
	size   int64  // the blob's size; -1 when the form gives none
	diffID string // the config's rootfs.diff_ids entry
	open   func() (io.ReadCloser, error)
}

// The annotations a layout's index names an image by.
const (
	annotRefName       = "org.opencontainers.image.ref.name"
	annotContainerName = "io.containerd.image.name"
)

// resolve turns ref into a source: an absolute path is a layout
// directory or a docker save archive, anything else a registry reference.
func (c *Cache) resolve(ctx context.Context, ref string) (*source, error) {
	if strings.HasPrefix(ref, "/") {
		p, sel, st, err := splitPath(ref)
		if err != nil {
			return nil, err
		}
		if st.IsDir() {
			return resolveLayout(ref, p, sel)
		}
		return resolveArchive(ref, p, sel)
	}
	return c.resolveRemote(ctx, ref)
}

// splitPath splits a path reference into the path and its selector
// (":<name>", "@sha256:<hex>" or ""): the path ends at the first ':' or
// '@' after its last '/'; when that names nothing, a longer prefix that
// exists (a selector "<repo>:<tag>" may hold '/') is tried.
func splitPath(ref string) (p, sel string, st fs.FileInfo, err error) {
	var cands []int // where the path may end: the rule's split first
	slash := strings.LastIndex(ref, "/")
	if i := strings.IndexAny(ref[slash:], ":@"); i >= 0 {
		cands = append(cands, slash+i)
	}
	cands = append(cands, len(ref))
	for i := slash - 1; i > 0; i-- {
		if ref[i] == ':' || ref[i] == '@' {
			cands = append(cands, i)
		}
	}
	for _, i := range cands {
		if st, err := os.Stat(ref[:i]); err == nil {
			return ref[:i], ref[i:], st, nil
		}
	}
	_, err = os.Stat(ref[:cands[0]])
	return "", "", nil, fmt.Errorf("image %s: %w: %w", ref, ErrNotFound, err)
}

func badf(ref, format string, a ...any) error {
	return fmt.Errorf("image %s: %w: %s", ref, ErrBadImage, fmt.Sprintf(format, a...))
}

var selDigest = regexp.MustCompile(`^@(sha256:[a-f0-9]{64})$`)

// resolveLayout resolves an OCI image layout directory.
func resolveLayout(ref, dir, sel string) (*source, error) {
	lp := layout.Path(dir)
	raw, err := os.ReadFile(path.Join(dir, "index.json"))
	if err != nil {
		return nil, badf(ref, "not an OCI image layout: %v", err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, badf(ref, "index.json: %v", err)
	}
	desc, err := pickDescriptor(ref, idx, sel)
	if err != nil {
		return nil, err
	}
	// An index inside (docker's OCI export): the platform's image.
	for depth := 0; desc.MediaType.IsIndex(); depth++ {
		if depth > 4 {
			return nil, badf(ref, "indexes nested too deep")
		}
		b, err := readBlob(ref, lp, *desc)
		if err != nil {
			return nil, err
		}
		child, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return nil, badf(ref, "index %s: %v", desc.Digest, err)
		}
		if desc, err = pickPlatform(ref, child); err != nil {
			return nil, err
		}
	}
	b, err := readBlob(ref, lp, *desc)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil {
		return nil, badf(ref, "manifest %s: %v", desc.Digest, err)
	}
	cb, err := readBlob(ref, lp, m.Config)
	if err != nil {
		return nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cb))
	if err != nil {
		return nil, badf(ref, "config %s: %v", m.Config.Digest, err)
	}
	src := &source{ref: ref, digest: desc.Digest.String(), config: cfg}
	if len(m.Layers) != len(cfg.RootFS.DiffIDs) {
		return nil, badf(ref, "manifest has %d layers, config %d diff ids", len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	for i, l := range m.Layers {
		if _, err := os.Stat(blobPath(dir, l.Digest)); err != nil {
			return nil, badf(ref, "missing blob %s (layer %d): %v", l.Digest, i, err)
		}
		h := l.Digest
		src.layers = append(src.layers, layerSource{
			digest: h.String(),
			size:   l.Size,
			diffID: cfg.RootFS.DiffIDs[i].String(),
			open:   func() (io.ReadCloser, error) { return lp.Blob(h) },
		})
	}
	return src, nil
}

func blobPath(dir string, h v1.Hash) string {
	return path.Join(dir, "blobs", h.Algorithm, h.Hex)
}

// readBlob reads a small blob (manifest, config) of a layout and checks
// its digest and size against desc.
func readBlob(ref string, lp layout.Path, desc v1.Descriptor) ([]byte, error) {
	if desc.Digest.Algorithm != "sha256" {
		return nil, badf(ref, "blob %s: only sha256 digests are read", desc.Digest)
	}
	b, err := lp.Bytes(desc.Digest)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, badf(ref, "missing blob %s", desc.Digest)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: blob %s: %w", ref, desc.Digest, err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != desc.Digest.Hex {
		return nil, badf(ref, "blob %s has digest sha256:%s", desc.Digest, got)
	}
	if desc.Size != int64(len(b)) {
		return nil, badf(ref, "blob %s has %d bytes, want %d", desc.Digest, len(b), desc.Size)
	}
	return b, nil
}

// pickDescriptor picks the image of a layout's index that sel names.
func pickDescriptor(ref string, idx *v1.IndexManifest, sel string) (*v1.Descriptor, error) {
	switch {
	case sel == "":
		if len(idx.Manifests) == 1 {
			return &idx.Manifests[0], nil
		}
		var names []string
		for _, d := range idx.Manifests {
			names = append(names, d.Digest.String()+" "+d.Annotations[annotRefName])
		}
		return nil, badf(ref, "the layout holds %d images (%s): pick one with @sha256:<hex> or :<name>",
			len(idx.Manifests), strings.Join(names, ", "))
	case selDigest.MatchString(sel):
		for i, d := range idx.Manifests {
			if d.Digest.String() == sel[1:] {
				return &idx.Manifests[i], nil
			}
		}
	case strings.HasPrefix(sel, ":") && len(sel) > 1:
		for i, d := range idx.Manifests {
			if d.Annotations[annotRefName] == sel[1:] || d.Annotations[annotContainerName] == sel[1:] {
				return &idx.Manifests[i], nil
			}
		}
	default:
		return nil, badf(ref, "selector %q: want @sha256:<hex> or :<name>", sel)
	}
	return nil, fmt.Errorf("image %s: %w: the layout has no image %s", ref, ErrNotFound, sel)
}

// pickPlatform picks the host's platform's image of an index, or its only
// entry.
func pickPlatform(ref string, idx *v1.IndexManifest) (*v1.Descriptor, error) {
	if len(idx.Manifests) == 1 {
		return &idx.Manifests[0], nil
	}
	for i, d := range idx.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			return &idx.Manifests[i], nil
		}
	}
	return nil, fmt.Errorf("image %s: %w: no linux/%s image in its index", ref, ErrNotFound, runtime.GOARCH)
}

// resolveArchive resolves a docker save archive. It has no manifest
// digest: the image's digest is its config's (docker's image id); each
// layer is checked by its diff id, and by its blob digest when its name
// carries one (blobs/sha256/<hex>).
func resolveArchive(ref, file, sel string) (*source, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	entries, err := scanArchive(file)
	if err != nil {
		return nil, badf(ref, "not a tar archive: %v", err)
	}
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, badf(ref, "not a docker save archive (manifest.json): %v", err)
	}
	var d *tarball.Descriptor
	switch {
	case sel == "" && len(m) == 1:
		d = &m[0]
	case sel == "":
		return nil, badf(ref, "the archive holds %d images: pick one with :<repo>:<tag>", len(m))
	case strings.HasPrefix(sel, ":"):
		want, err := name.NewTag(sel[1:])
		if err != nil {
			return nil, badf(ref, "selector %q: %v", sel, err)
		}
		for i := range m {
			for _, t := range m[i].RepoTags {
				if got, err := name.NewTag(t); err == nil && got.Name() == want.Name() {
					d = &m[i]
				}
			}
		}
		if d == nil {
			return nil, fmt.Errorf("image %s: %w: the archive has no image %s", ref, ErrNotFound, sel[1:])
		}
	default:
		return nil, badf(ref, "selector %q: want :<repo>:<tag>", sel)
	}
	cb, err := entries.read(file, d.Config)
	if err != nil {
		return nil, badf(ref, "config %s: %v", d.Config, err)
	}
	sum := sha256.Sum256(cb)
	cdigest := "sha256:" + hex.EncodeToString(sum[:])
	if want := blobHexOf(d.Config); want != "" && want != cdigest[7:] {
		return nil, badf(ref, "config %s has digest %s", d.Config, cdigest)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cb))
	if err != nil {
		return nil, badf(ref, "config %s: %v", d.Config, err)
	}
	if len(d.Layers) != len(cfg.RootFS.DiffIDs) {
		return nil, badf(ref, "manifest.json has %d layers, config %d diff ids", len(d.Layers), len(cfg.RootFS.DiffIDs))
	}
	src := &source{ref: ref, digest: cdigest, config: cfg}
	for i, lp := range d.Layers {
		h, err := entries.resolve(lp)
		if err != nil {
			return nil, badf(ref, "missing blob %s (layer %d)", lp, i)
		}
		ls := layerSource{size: entries[h].Size, diffID: cfg.RootFS.DiffIDs[i].String()}
		if bh := blobHexOf(lp); bh != "" {
			ls.digest = "sha256:" + bh
		}
		ls.open = func() (io.ReadCloser, error) { return entries.open(file, h) }
		src.layers = append(src.layers, ls)
	}
	return src, nil
}

var blobName = regexp.MustCompile(`(?:^|[/:])([a-f0-9]{64})(?:\.json|\.tar|\.tar\.gz)?$`)

// blobHexOf returns the digest hex of its content that an archive entry's
// name carries (docker's blobs/sha256/<hex> and <hex>.json,
// go-containerregistry's sha256:<hex> and <hex>.tar.gz), or "".
func blobHexOf(p string) string {
	if m := blobName.FindStringSubmatch(p); m != nil && !strings.HasSuffix(p, "/layer.tar") {
		return m[1]
	}
	return ""
}

// archiveEntries are an archive's entries by cleaned name.
type archiveEntries map[string]*tar.Header

func scanArchive(file string) (archiveEntries, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := archiveEntries{}
	tr := tar.NewReader(f) // skips entries by seeking
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[path.Clean(h.Name)] = h
	}
}

// resolve follows symbolic links (docker's layer dedup) to a regular
// entry's name.
func (e archiveEntries) resolve(p string) (string, error) {
	p = path.Clean(p)
	for range 16 {
		h, ok := e[p]
		if !ok {
			return "", fs.ErrNotExist
		}
		switch h.Typeflag {
		case tar.TypeReg:
			return p, nil
		case tar.TypeSymlink:
			p = path.Clean(path.Join(path.Dir(p), h.Linkname))
		case tar.TypeLink:
			p = path.Clean(h.Linkname)
		default:
			return "", fmt.Errorf("%s is not a file", p)
		}
	}
	return "", fmt.Errorf("%s: too many links", p)
}

func (e archiveEntries) read(file, p string) ([]byte, error) {
	h, err := e.resolve(p)
	if err != nil {
		return nil, err
	}
	rc, err := e.open(file, h)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// open opens the regular entry p of the archive.
func (e archiveEntries) open(file, p string) (io.ReadCloser, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			f.Close()
			if err == io.EOF {
				err = fmt.Errorf("%s: %w", p, fs.ErrNotExist)
			}
			return nil, err
		}
		if path.Clean(h.Name) == p && h.Typeflag == tar.TypeReg {
			return struct {
				io.Reader
				io.Closer
			}{tr, f}, nil
		}
	}
}

// resolveRemote resolves a registry reference, with the cache's keychain.
func (c *Cache) resolveRemote(ctx context.Context, ref string) (*source, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, badf(ref, "neither an absolute path nor a registry reference: %v", err)
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(c.opts.Keychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, registryErr(ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	if len(m.Layers) != len(cfg.RootFS.DiffIDs) {
		return nil, badf(ref, "manifest has %d layers, config %d diff ids", len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	src := &source{ref: ref, digest: dg.String(), config: cfg}
	for i, l := range m.Layers {
		if l.MediaType == types.DockerForeignLayer || l.MediaType == types.OCIRestrictedLayer {
			return nil, badf(ref, "layer %s is a foreign layer, not in the registry", l.Digest)
		}
		layer, err := img.LayerByDigest(l.Digest)
		if err != nil {
			return nil, registryErr(ref, err)
		}
		src.layers = append(src.layers, layerSource{
			digest: l.Digest.String(),
			size:   l.Size,
			diffID: cfg.RootFS.DiffIDs[i].String(),
			open:   layer.Compressed,
		})
	}
	return src, nil
}

// registryErr words a registry's error: a missing repository, tag or blob
// is ErrNotFound, refused credentials say where they are read from.
func registryErr(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("image %s: the registry refused access (HTTP %d): check the credentials in the docker config ($DOCKER_CONFIG/config.json or ~/.docker/config.json): %w",
				ref, te.StatusCode, err)
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("image %s: %w: %w", ref, ErrNotFound, err)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return fmt.Errorf("image %s: %w: %w", ref, ErrNotFound, err)
			}
		}
	}
	return fmt.Errorf("image %s: registry: %w", ref, err)
}
