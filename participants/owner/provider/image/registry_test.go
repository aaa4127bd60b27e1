//go:build linux

package image

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

const (
	regUser = "stillpoint"
	regPass = "s3cret"
)

// testRegistry is go-containerregistry's in-memory registry on loopback
// behind basic auth, with a hook to break the blobs it serves.
type testRegistry struct {
	host  string
	blobs func(w http.ResponseWriter, r *http.Request) bool // true: handled
}

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	tr := &testRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != regUser || p != regPass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"who are you"}]}`, http.StatusUnauthorized)
			return
		}
		if tr.blobs != nil && strings.Contains(r.URL.Path, "/blobs/") && tr.blobs(w, r) {
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr.host = strings.TrimPrefix(srv.URL, "http://")
	return tr
}

// push puts img at repo:tag and returns the reference.
func (tr *testRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(tr.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: regUser, Password: regPass})
	if err := remote.Write(ref, img, auth); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// dockerConfig points DOCKER_CONFIG at a config.json holding the
// registry's credentials (or none).
func dockerConfig(t *testing.T, host string, withCreds bool) {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"auths":{}}`
	if withCreds {
		auth := base64.StdEncoding.EncodeToString([]byte(regUser + ":" + regPass))
		cfg = fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

func TestGetFromRegistryWithDockerConfigCredentials(t *testing.T) {
	tr := startRegistry(t)
	img := richImage(t)
	ref := tr.push(t, "swe/rich:v1", img)
	dockerConfig(t, tr.host, true)
	c := openCache(t, Options{}) // the default keychain: the docker config
	got, err := c.Get(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != digestOf(t, img) || got.Ref != ref || got.WorkingDir != "/work" {
		t.Fatalf("image = %+v, want digest %s", got, digestOf(t, img))
	}
	dst := filepath.Join(t.TempDir(), "root")
	os.Mkdir(dst, 0o755)
	if err := c.Rootfs(context.Background(), got, dst); err != nil {
		t.Fatal(err)
	}
	checkMerged(t, dst)
	byDigest, err := c.Get(context.Background(), tr.host+"/swe/rich@"+got.Digest)
	if err != nil || byDigest.Digest != got.Digest || c.unpacked.Load() != 2 {
		t.Fatalf("Get by digest: %+v, %v (%d layers unpacked in all)", byDigest, err, c.unpacked.Load())
	}
	if _, err := c.Get(context.Background(), tr.host+"/swe/none:v1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing repository: %v, want ErrNotFound", err)
	}
}

func TestGetFromRegistryWithoutCredentialsIsRefused(t *testing.T) {
	tr := startRegistry(t)
	ref := tr.push(t, "swe/rich:v1", richImage(t))
	dockerConfig(t, tr.host, false)
	c := openCache(t, Options{})
	_, err := c.Get(context.Background(), ref)
	if err == nil || !strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "refused access") ||
		!strings.Contains(err.Error(), "docker config") {
		t.Fatalf("Get without credentials: %v, want a refusal naming the reference and the docker config", err)
	}
	if left := cacheEntries(t, c); len(left) != 0 {
		t.Fatalf("a refused pull left %v", left)
	}
}

func TestBrokenRegistryImagesAreRefused(t *testing.T) {
	bottom := layerOf(t, fileE("a", strings.Repeat("a", 4096)))
	top := layerOf(t, fileE("b", strings.Repeat("b", 4096)))
	img := imageOf(t, v1.Config{}, bottom, top)
	topDigest := layerDigest(t, top).String()

	t.Run("missing blob", func(t *testing.T) {
		tr := startRegistry(t)
		ref := tr.push(t, "x/y:v1", img)
		dockerConfig(t, tr.host, true)
		tr.blobs = func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, topDigest) {
				http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"gone"}]}`, http.StatusNotFound)
				return true
			}
			return false
		}
		c := openCache(t, Options{})
		_, err := c.Get(context.Background(), ref)
		wantBad(t, c, err, ref, "missing blob "+topDigest)
	})
	t.Run("bad digest", func(t *testing.T) {
		tr := startRegistry(t)
		ref := tr.push(t, "x/y:v1", img)
		dockerConfig(t, tr.host, true)
		rc, _ := top.Compressed()
		b, _ := io.ReadAll(rc)
		for i := len(b) / 2; i < len(b)/2+8; i++ {
			b[i] ^= 0xff
		}
		tr.blobs = func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, topDigest) {
				w.Write(b)
				return true
			}
			return false
		}
		c := openCache(t, Options{})
		_, err := c.Get(context.Background(), ref)
		wantBad(t, c, err, ref, "the manifest says "+topDigest)
	})
	t.Run("unsafe path", func(t *testing.T) {
		tr := startRegistry(t)
		bad := layerOf(t, dirE("etc/"), symlinkE("etc/conf", "/etc"), fileE("etc/conf/passwd", "x"))
		ref := tr.push(t, "x/y:v1", imageOf(t, v1.Config{}, bottom, bad))
		dockerConfig(t, tr.host, true)
		c := openCache(t, Options{})
		_, err := c.Get(context.Background(), ref)
		wantBad(t, c, err, ref, layerDigest(t, bad).String(), "etc/conf/passwd", "symbolic link")
	})
}
