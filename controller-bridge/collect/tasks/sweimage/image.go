package sweimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RefNameAnnotation names an image in an OCI layout's index.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Workdir is where an image holds its repository: its WorkingDir.
const Workdir = "/testbed"

// Spec is one image to write: its name in the layout and the host
// directory (a git repository) put at Workdir, owned by root.
type Spec struct {
	Name string
	Repo string
}

// Write writes an image per spec into the OCI image layout at dir (made
// if missing; an image of the same name there is replaced): the base's
// layer and one holding the spec's repository at Workdir, with the config
// WorkingDir Workdir and PATH ImagePath. It returns each image's
// reference, "<dir>:<name>", by name. The base's layer goes into the
// layout as a hard link of the cached one where it can.
func Write(ctx context.Context, base Base, dir string, specs []Spec) (map[string]string, error) {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, ":@") {
		return nil, fmt.Errorf("sweimage: layout %q: want an absolute path with no ':' or '@'", dir)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			return nil, fmt.Errorf("sweimage: layout %s: %w", dir, err)
		}
	}
	baseLayer, err := cachedLayer(base)
	if err != nil {
		return nil, err
	}
	hex := strings.TrimPrefix(base.LayerInfo.Digest, "sha256:")
	blob := filepath.Join(dir, "blobs", "sha256", hex)
	if _, err := os.Stat(blob); err != nil {
		if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
			return nil, err
		}
		_ = os.Link(base.Layer, blob) // else WriteImage copies it
	}
	refs := map[string]string{}
	for _, s := range specs {
		if s.Name == "" || strings.ContainsAny(s.Name, ":@/") {
			return nil, fmt.Errorf("sweimage: image name %q: want one with no ':', '@' or '/'", s.Name)
		}
		var buf bytes.Buffer
		if _, err := writeLayer(&buf, func(tw *tar.Writer) error {
			return tarTree(ctx, tw, s.Repo, strings.TrimPrefix(Workdir, "/")+"/", true)
		}); err != nil {
			return nil, fmt.Errorf("sweimage: image %s: the layer of %s: %w", s.Name, s.Repo, err)
		}
		repoLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("sweimage: image %s: %w", s.Name, err)
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err = mutate.ConfigFile(img, &v1.ConfigFile{Architecture: runtime.GOARCH, OS: "linux",
			Config: v1.Config{Env: []string{"PATH=" + ImagePath, "LANG=C.UTF-8"}, WorkingDir: Workdir, Cmd: []string{"/bin/bash"}}})
		if err != nil {
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, baseLayer, repoLayer); err != nil {
			return nil, fmt.Errorf("sweimage: image %s: %w", s.Name, err)
		}
		ann := map[string]string{RefNameAnnotation: s.Name}
		if err := p.ReplaceImage(img, match.Name(s.Name), layout.WithAnnotations(ann)); err != nil {
			return nil, fmt.Errorf("sweimage: image %s into %s: %w", s.Name, dir, err)
		}
		refs[s.Name] = dir + ":" + s.Name
	}
	return refs, nil
}

// cachedLayer is the base's layer, with the digests the cache recorded,
// so that nothing reads the whole tarball to find them again.
func cachedLayer(b Base) (v1.Layer, error) {
	digest, err := v1.NewHash(b.LayerInfo.Digest)
	if err != nil {
		return nil, fmt.Errorf("sweimage: base layer %s: %w", b.Layer, err)
	}
	diffID, err := v1.NewHash(b.LayerInfo.DiffID)
	if err != nil {
		return nil, fmt.Errorf("sweimage: base layer %s: %w", b.Layer, err)
	}
	return &fileLayer{path: b.Layer, digest: digest, diffID: diffID, size: b.LayerInfo.Size}, nil
}

// fileLayer is a gzip layer tarball on disk whose digests are known.
type fileLayer struct {
	path           string
	digest, diffID v1.Hash
	size           int64
}

func (l *fileLayer) Digest() (v1.Hash, error) { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)     { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) {
	return types.OCILayer, nil
}
func (l *fileLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, closers{zr, f}}, nil
}

type closers []io.Closer

func (c closers) Close() error {
	var errs []error
	for _, x := range c {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}
