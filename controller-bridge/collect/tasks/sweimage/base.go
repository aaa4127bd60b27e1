package sweimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Where and what the base is made of.
const (
	// DefaultCache is the cache directory of the base (as the microVM
	// assets are cached under /var/cache/stillpoint).
	DefaultCache = "/var/cache/stillpoint/swe"
	// Suite and Mirror are what debootstrap installs from.
	Suite  = "bookworm"
	Mirror = "http://deb.debian.org/debian"
	// baseName names the base's files in the cache; it changes with
	// Packages, so a cache of other packages is never taken for it.
	baseName = "rootfs-bookworm-v1"
)

// Packages are the packages debootstrap adds to the minimal base.
var Packages = []string{"python3", "python3-pytest", "git", "ca-certificates"}

// ImagePath is the PATH of the images.
const ImagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Base is the cached base: the root file system and its layer.
type Base struct {
	// Rootfs is the root file system's directory.
	Rootfs string
	// Layer is the gzip layer tarball of Rootfs, LayerInfo its digests.
	Layer     string
	LayerInfo LayerInfo
}

// LayerInfo are a cached layer's digests and size.
type LayerInfo struct {
	Digest string `json:"digest"`  // sha256:<hex> of the gzip tarball
	DiffID string `json:"diff_id"` // sha256:<hex> of the tar stream
	Size   int64  `json:"size"`    // the gzip tarball's size
}

// EnsureBase returns the cached base in cache (DefaultCache when ""),
// building what is missing: the root file system by debootstrap (a
// minute or two, with progress lines to progress, nil for none), then its
// layer. Concurrent callers, in this process or others, build it once.
func EnsureBase(ctx context.Context, cache string, progress io.Writer) (Base, error) {
	if cache == "" {
		cache = DefaultCache
	}
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return Base{}, fmt.Errorf("sweimage: cache %s: %w", cache, err)
	}
	unlock, err := lock(ctx, filepath.Join(cache, ".lock"), progress)
	if err != nil {
		return Base{}, fmt.Errorf("sweimage: cache %s: lock: %w", cache, err)
	}
	defer unlock()
	b := Base{Rootfs: filepath.Join(cache, baseName), Layer: filepath.Join(cache, baseName+".tar.gz")}
	if _, err := os.Stat(b.Rootfs + ".done"); err != nil {
		if err := debootstrap(ctx, b.Rootfs, progress); err != nil {
			return Base{}, err
		}
	}
	info := b.Layer + ".json"
	if raw, err := os.ReadFile(info); err == nil && json.Unmarshal(raw, &b.LayerInfo) == nil {
		if st, err := os.Stat(b.Layer); err == nil && st.Size() == b.LayerInfo.Size {
			return b, nil
		}
	}
	fmt.Fprintf(progress, "sweimage: writing the base layer %s\n", b.Layer)
	if b.LayerInfo, err = writeLayerFile(ctx, b.Layer, func(tw *tar.Writer) error { return tarTree(ctx, tw, b.Rootfs, "", false) }); err != nil {
		return Base{}, fmt.Errorf("sweimage: base layer %s: %w", b.Layer, err)
	}
	raw, _ := json.Marshal(b.LayerInfo)
	if err := writeFileAtomic(info, raw); err != nil {
		return Base{}, err
	}
	return b, nil
}

// lock takes an exclusive flock on p, saying so when it must wait.
func lock(ctx context.Context, p string, progress io.Writer) (func(), error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		fmt.Fprintf(progress, "sweimage: waiting for another builder of %s\n", filepath.Dir(p))
		for unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			select {
			case <-ctx.Done():
				f.Close()
				return nil, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return func() { _ = f.Close() }, nil
}

// debootstrap builds the root file system at dir (dir.tmp first, renamed
// when complete, then the stamp dir.done), printing a line every 15 s.
func debootstrap(ctx context.Context, dir string, progress io.Writer) error {
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		return errors.New("sweimage: the SWE images' base needs debootstrap: apt-get install -y debootstrap")
	}
	tmp, logPath := dir+".tmp", dir+".log"
	for _, p := range []string{tmp, dir} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("sweimage: %w", err)
		}
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("sweimage: %w", err)
	}
	defer logf.Close()
	args := []string{"--variant=minbase", "--include=" + strings.Join(Packages, ","), Suite, tmp, Mirror}
	fmt.Fprintf(progress, "sweimage: building the SWE base image: debootstrap %s (its log: %s)\n", strings.Join(args, " "), logPath)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sweimage: debootstrap: %w", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err = <-waited:
		case <-tick.C:
			fmt.Fprintf(progress, "sweimage: debootstrap: %.0f s so far\n", time.Since(t0).Seconds())
			continue
		}
		break
	}
	if err != nil {
		out, _ := os.ReadFile(logPath)
		if len(out) > 2048 {
			out = out[len(out)-2048:]
		}
		return fmt.Errorf("sweimage: debootstrap %s: %w (is %s reachable?); the end of its log %s:\n%s", strings.Join(args, " "), err, Mirror, logPath, out)
	}
	// What a container image leaves out: the downloaded packages and
	// the package lists.
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*", "var/log/*.log"} {
		matches, _ := filepath.Glob(filepath.Join(tmp, glob))
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("sweimage: %w", err)
	}
	if err := writeFileAtomic(dir+".done", []byte(time.Now().UTC().Format(time.RFC3339)+"\n")); err != nil {
		return err
	}
	fmt.Fprintf(progress, "sweimage: the SWE base image is built in %.0f s: %s\n", time.Since(t0).Seconds(), dir)
	return nil
}

// writeLayerFile writes a gzip tar layer at p (through p.tmp) with fill,
// and returns its digests.
func writeLayerFile(ctx context.Context, p string, fill func(*tar.Writer) error) (LayerInfo, error) {
	f, err := os.Create(p + ".tmp")
	if err != nil {
		return LayerInfo{}, err
	}
	defer os.Remove(p + ".tmp")
	defer f.Close()
	info, err := writeLayer(f, fill)
	if err != nil {
		return LayerInfo{}, err
	}
	if err := f.Sync(); err != nil {
		return LayerInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return LayerInfo{}, err
	}
	return info, os.Rename(p+".tmp", p)
}

// writeLayer writes a gzip tar layer to w with fill and returns its
// digests.
func writeLayer(w io.Writer, fill func(*tar.Writer) error) (LayerInfo, error) {
	zsum, dsum := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, zsum)}
	gz, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed)
	tw := tar.NewWriter(io.MultiWriter(gz, dsum))
	if err := fill(tw); err != nil {
		return LayerInfo{}, err
	}
	if err := tw.Close(); err != nil {
		return LayerInfo{}, err
	}
	if err := gz.Close(); err != nil {
		return LayerInfo{}, err
	}
	return LayerInfo{Digest: "sha256:" + hex.EncodeToString(zsum.Sum(nil)), DiffID: "sha256:" + hex.EncodeToString(dsum.Sum(nil)), Size: cw.n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// skipContents are the directories of a root file system whose contents
// an image leaves out (a sandbox mounts its own).
var skipContents = map[string]bool{"dev": true, "proc": true, "sys": true, "run": true, "tmp": true, "debootstrap": true}

// tarTree writes the tree at root into tw under prefix ("" or "dir/"),
// keeping ownership, modes, modification times, extended attributes,
// hard links, symbolic links, devices and FIFOs (owned by root when
// rootOwned); sockets are left out.
func tarTree(ctx context.Context, tw *tar.Writer, root, prefix string, rootOwned bool) error {
	links := map[[2]uint64]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			if prefix == "" {
				return nil
			}
			rel = strings.TrimSuffix(prefix, "/")
		} else {
			rel = prefix + rel
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = rel, int(st.Uid), int(st.Gid), "", ""
		if rootOwned {
			h.Uid, h.Gid = 0, 0
		}
		h.Format = tar.FormatPAX
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		if d.IsDir() {
			h.Name += "/"
		}
		key := [2]uint64{st.Dev, st.Ino}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := links[key]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				links[key] = rel
			}
		}
		if x, err := xattrs(p); err != nil {
			return err
		} else if len(x) > 0 {
			h.PAXRecords = x
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		if d.IsDir() && rel != "" && prefix == "" && skipContents[rel] {
			return fs.SkipDir
		}
		return nil
	})
}

// xattrs returns the extended attributes of p as PAX records.
func xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) || n <= 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: list xattrs: %w", p, err)
	}
	out := map[string]string{}
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, string(name), val)
		if err != nil {
			continue
		}
		out["SCHILY.xattr."+string(name)] = string(val[:m])
	}
	return out, nil
}

// writeFileAtomic writes b at p through a temporary file.
func writeFileAtomic(p string, b []byte) error {
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}
