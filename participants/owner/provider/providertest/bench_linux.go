//go:build linux

package providertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// benchSize is a changed tree: bytes of file data in files files, 100 per
// directory.
type benchSize struct {
	name  string
	bytes int64
	files int
}

var benchSizes = []benchSize{
	{"1MiB", 1 << 20, 100},
	{"100MiB", 100 << 20, 10_000},
	{"1GiB", 1 << 30, 10_000},
}

// genTree writes the tree under dir (through the sandbox's Root, so into
// its upper layer) and syncs, so that no write-back of it runs while the
// timer does.
func genTree(b *testing.B, dir string, sz benchSize) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 2<<20)
	for i := range pool {
		pool[i] = byte(rng.Uint32())
	}
	per := int(sz.bytes / int64(sz.files))
	for i := range sz.files {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		off := (i * 7919) % (len(pool) - per)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), pool[off:off+per], 0o644); err != nil {
			b.Fatal(err)
		}
	}
	unix.Sync()
}

// BenchSnapshot: one Snapshot of a sandbox whose changes are the tree
// (overlay: frozen, upper copied, thawed), on the provider newProvider
// makes. The snapshot is deleted and the disk synced outside the timer.
func BenchSnapshot(b *testing.B, newProvider func(testing.TB) provider.Provider) {
	ctx := context.Background()
	for _, sz := range tier.Sizes(benchSizes...) {
		b.Run("size="+sz.name, func(b *testing.B) {
			p := newProvider(b)
			sb := Start(b, p, provider.Spec{ID: "bench"})
			genTree(b, filepath.Join(sb.Root, "data"), sz)
			b.SetBytes(sz.bytes)
			i := 0
			for b.Loop() {
				s := Snapshot(b, p, "bench", fmt.Sprintf("s%d", i))
				b.StopTimer()
				if s.Files < sz.files {
					b.Fatalf("snapshot has %d entries, want at least %d", s.Files, sz.files)
				}
				if err := p.DeleteSnapshot(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				unix.Sync()
				i++
				b.StartTimer()
			}
		})
	}
}

// BenchCopyBaseline: cp -a of the same tree, the yardstick of
// BenchSnapshot in the same run.
func BenchCopyBaseline(b *testing.B) {
	RequireRoot(b)
	for _, sz := range tier.Sizes(benchSizes...) {
		b.Run("size="+sz.name, func(b *testing.B) {
			dir := b.TempDir()
			src := filepath.Join(dir, "upper")
			genTree(b, filepath.Join(src, "data"), sz)
			b.SetBytes(sz.bytes)
			i := 0
			for b.Loop() {
				dst := filepath.Join(dir, fmt.Sprintf("copy%d", i))
				if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
					b.Fatalf("cp -a: %v\n%s", err, out)
				}
				b.StopTimer()
				if err := os.RemoveAll(dst); err != nil {
					b.Fatal(err)
				}
				unix.Sync()
				i++
				b.StartTimer()
			}
		})
	}
}

// BenchFork: Fork a snapshot of the tree into a running sandbox (copy
// the snapshot's files, mount, start the init), on the provider
// newProvider makes. Stopped outside the timer.
func BenchFork(b *testing.B, newProvider func(testing.TB) provider.Provider) {
	ctx := context.Background()
	for _, sz := range tier.Sizes(benchSizes[:2]...) {
		b.Run("size="+sz.name, func(b *testing.B) {
			p := newProvider(b)
			sb := Start(b, p, provider.Spec{ID: "bench"})
			genTree(b, filepath.Join(sb.Root, "data"), sz)
			Snapshot(b, p, "bench", "base")
			unix.Sync()
			b.SetBytes(sz.bytes)
			i := 0
			for b.Loop() {
				f := Fork(b, p, "base", provider.Spec{ID: fmt.Sprintf("f%d", i)})
				b.StopTimer()
				if err := p.Stop(ctx, f.ID); err != nil {
					b.Fatal(err)
				}
				unix.Sync()
				i++
				b.StartTimer()
			}
		})
	}
}

// BenchStart: start-to-ready of a fresh sandbox (Start returns once its
// init runs inside the finished sandbox), on the provider newProvider
// makes. Stopped outside the timer.
func BenchStart(b *testing.B, newProvider func(testing.TB) provider.Provider) {
	ctx := context.Background()
	p := newProvider(b)
	i := 0
	for b.Loop() {
		sb := Start(b, p, provider.Spec{ID: fmt.Sprintf("s%d", i)})
		b.StopTimer()
		if err := p.Stop(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		i++
		b.StartTimer()
	}
}

// BenchStartImage: start-to-ready of a fresh sandbox on the host's root
// (start/host, as BenchStart) and on an image of two layers copied from
// the host (start/image, CachedHostImage: no copy per sandbox), on one
// provider newProvider makes with a real image cache (*image.Cache) as
// its finder, in the same run: each start on the image holds it in the
// cache, as an owner's does. start/image reports its time over
// start/host's as image/host. Stopped outside the timer.
func BenchStartImage(b *testing.B, newProvider func(testing.TB) (provider.Provider, ImageCache)) {
	ctx := context.Background()
	p, cache := newProvider(b)
	img := CachedHostImage(b, cache)
	// The image is a root a shell runs in.
	sb := Start(b, p, provider.Spec{ID: "check", Image: img, Env: img.Env})
	if got := Sh(b, p, sb.ID, "test ! -e /etc/motd && ls /usr/bin/ls"); got != "/usr/bin/ls\n" {
		b.Fatalf("in the image: %q", got)
	}
	if hs, err := cache.Holders(""); err != nil || len(hs) != 1 {
		b.Fatalf("holds of the started sandbox: %v, %v; want its own (is the cache the provider's finder?)", hs, err)
	}
	if err := p.Stop(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
	unix.Sync()
	var host, onImage float64 // ns per start
	run := func(name string, spec func(i int) provider.Spec, per *float64) {
		b.Run(name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				sb := Start(b, p, spec(i))
				b.StopTimer()
				if err := p.Stop(ctx, sb.ID); err != nil {
					b.Fatal(err)
				}
				i++
				b.StartTimer()
			}
			*per = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if name == "start/image" && host > 0 {
				b.ReportMetric(*per/host, "image/host")
			}
		})
	}
	run("start/host", func(i int) provider.Spec { return provider.Spec{ID: fmt.Sprintf("h%d", i)} }, &host)
	run("start/image", func(i int) provider.Spec { return provider.Spec{ID: fmt.Sprintf("i%d", i), Image: img, Env: img.Env} }, &onImage)
}
