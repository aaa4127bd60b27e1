//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// ent is one entry of a test layer.
type ent struct {
	name   string
	typ    byte
	mode   int64
	body   string // a file's content
	link   string // a symlink's or hard link's target
	uid    int
	gid    int
	xattrs map[string]string
	major  int64
	minor  int64
}

var testTime = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// tarOf writes entries as a tar stream.
func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, ModTime: testTime, Devmajor: e.major, Devminor: e.minor,
			Format: tar.FormatPAX,
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[xattrPAX+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func dirE(name string) ent             { return ent{name: name, typ: tar.TypeDir} }
func fileE(name, body string) ent      { return ent{name: name, typ: tar.TypeReg, body: body} }
func linkE(name, target string) ent    { return ent{name: name, typ: tar.TypeLink, link: target} }
func symlinkE(name, target string) ent { return ent{name: name, typ: tar.TypeSymlink, link: target} }

// layerOf is a gzip-compressed layer of entries.
func layerOf(t *testing.T, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf is an image of layers (bottom first) with cfg.
func imageOf(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes imgs into a new OCI layout; names[i] (if any) is the
// ref.name annotation of imgs[i].
func writeLayout(t *testing.T, imgs []v1.Image, names ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for i, img := range imgs {
		var opts []layout.Option
		if i < len(names) {
			opts = append(opts, layout.WithAnnotations(map[string]string{annotRefName: names[i]}))
		}
		if err := p.AppendImage(img, opts...); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func openCache(t *testing.T, opts Options) *Cache {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the image cache's tests need root (owners, devices, trusted xattrs, mounts): run go test as root")
	}
	opts.Logger = zerolog.New(zerolog.NewTestWriter(t))
	c, err := Open(filepath.Join(t.TempDir(), "cache"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cacheEntries lists what the cache holds in its layers/, images/,
// layermeta/ and tmp/ directories.
func cacheEntries(t *testing.T, c *Cache) []string {
	t.Helper()
	var out []string
	for _, d := range []string{layersDir, imagesDir, metaDir, tmpDir} {
		ents, err := os.ReadDir(filepath.Join(c.dir, d))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			out = append(out, d+"/"+e.Name())
		}
	}
	return out
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func xattr(t *testing.T, p, name string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		t.Fatalf("getxattr %s %s: %v", p, name, err)
	}
	return string(buf[:n])
}
