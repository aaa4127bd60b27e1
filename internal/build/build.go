package build

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// The module's programs, as Static takes them.
const (
	// Stillpoint is the CLI: server, bridge, owner, agent, collect, demo.
	Stillpoint = "./cmd/stillpoint"
	// Sandboxd is the in-sandbox daemon.
	Sandboxd = "./cmd/sandboxd"
	// ScriptedHarness is the scripted coding-agent harness.
	ScriptedHarness = "./cmd/scripted-harness"
	// OpenCodeDriver is the in-sandbox driver of OpenCode.
	OpenCodeDriver = "./cmd/opencode-driver"
	// ClaudeDriver is the in-sandbox driver of Claude Code.
	ClaudeDriver = "./cmd/claude-driver"
	// CodexDriver is the in-sandbox driver of Codex.
	CodexDriver = "./cmd/codex-driver"
)

// Module is the path of the module whose programs Static builds.
const Module = "github.com/stillpoint/stillpoint"

// Sentinel errors.
var (
	// ErrNoModule is returned when the working directory is not in a
	// checkout of Module.
	ErrNoModule = errors.New("build: not in a checkout of " + Module)
	// ErrNoGo is returned when the go command is not in PATH.
	ErrNoGo = errors.New("build: the go command is not in PATH (install Go: https://go.dev/dl)")
)

// unusedFor is how long a copy in the shared directory may go unused
// before a build removes it.
const unusedFor = 24 * time.Hour

// Binaries maps each package Static was given to its binary.
type Binaries map[string]string

// built is this process's builds, by package: the one piece of state the
// package keeps, so that a process builds a program once.
var built = struct {
	sync.Mutex
	bins Binaries
}{bins: Binaries{}}

// Static builds pkgs, directories of main packages relative to the module
// root ("./cmd/sandboxd"), as static binaries (CGO_ENABLED=0), each named
// for its directory's last element, and returns their paths. A package
// already built by this process is not built again.
func Static(ctx context.Context, pkgs ...string) (Binaries, error) {
	built.Lock()
	defer built.Unlock()
	var todo []string
	for _, p := range pkgs {
		if _, ok := built.bins[p]; !ok && !slices.Contains(todo, p) {
			todo = append(todo, p)
		}
	}
	if len(todo) > 0 {
		bins, err := buildShared(ctx, todo)
		if err != nil {
			return nil, err
		}
		for p, b := range bins {
			built.bins[p] = b
		}
	}
	out := Binaries{}
	for _, p := range pkgs {
		out[p] = built.bins[p]
	}
	return out, nil
}

// buildShared builds pkgs in the checkout's shared directory, under its
// lock, and returns the content-named copies.
func buildShared(ctx context.Context, pkgs []string) (Binaries, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, ErrNoGo
	}
	root, err := moduleRoot(ctx, goBin)
	if err != nil {
		return nil, err
	}
	dir, err := sharedDir(root)
	if err != nil {
		return nil, err
	}
	unlock, err := lock(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	stage, tmp := filepath.Join(dir, "stage"), filepath.Join(dir, "tmp")
	for _, d := range []string{stage, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("build: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, goBin, append([]string{"build", "-o", stage + "/"}, pkgs...)...)
	cmd.Dir = root
	// The link goes to GOTMPDIR, beside stage, so that the go command moves
	// it into place with a rename, not a copy over the old binary.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTMPDIR="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	bins := Binaries{}
	for _, p := range pkgs {
		b, err := publish(filepath.Join(dir, "bin"), filepath.Join(stage, path.Base(p)))
		if err != nil {
			return nil, fmt.Errorf("build: %s: %w", p, err)
		}
		bins[p] = b
	}
	prune(filepath.Join(dir, "bin"), time.Now().Add(-unusedFor))
	return bins, nil
}

// moduleRoot returns the directory of the working directory's go.mod,
// which must be Module's.
func moduleRoot(ctx context.Context, goBin string) (string, error) {
	out, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", ErrNoModule
	}
	f, err := os.Open(mod)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoModule, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			if strings.Trim(strings.TrimSpace(name), `"`) != Module {
				return "", fmt.Errorf("%w: %s is module %s", ErrNoModule, mod, name)
			}
			return filepath.Dir(mod), nil
		}
	}
	return "", fmt.Errorf("%w: %s names no module", ErrNoModule, mod)
}

// sharedDir returns (and makes) the checkout's directory in the user's
// cache directory, or the temporary directory without one.
func sharedDir(root string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(base, "stillpoint-build", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build: %w", err)
	}
	return dir, nil
}

// lock takes the exclusive file lock at p, waiting for it while ctx
// lasts, and returns its release.
func lock(ctx context.Context, p string) (func(), error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("build: lock: %w", err)
	}
	err = poll.Until(ctx, poll.Backoff(10*time.Millisecond, 250*time.Millisecond), func() (bool, error) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("build: lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

// publish copies the binary src into binDir/<name>-<hash>/<name>, unless
// that copy exists, and marks it used.
func publish(binDir, src string) (string, error) {
	name := filepath.Base(src)
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	dir := filepath.Join(binDir, name+"-"+hex.EncodeToString(h.Sum(nil)[:8]))
	dst := filepath.Join(dir, name)
	if _, err := os.Stat(dst); err != nil {
		if err := copyExecutable(f, dir, dst); err != nil {
			return "", err
		}
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	return dst, nil
}

// copyExecutable copies src (from its start) to dst through a temporary
// file in dir, renamed into place.
func copyExecutable(src *os.File, dir, dst string) error {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// prune removes the copies in binDir not used since before.
func prune(binDir string, before time.Time) {
	ents, err := os.ReadDir(binDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && e.IsDir() && fi.ModTime().Before(before) {
			_ = os.RemoveAll(filepath.Join(binDir, e.Name()))
		}
	}
}

// TB is what StaticForTest needs of a test: testing.TB has it. (So that
// this package, which the demo uses, does not import package testing.)
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// StaticForTest is Static for a test: it fails the test if the build
// fails. Builds are bounded by buildTimeout.
func StaticForTest(t TB, pkgs ...string) Binaries {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	bins, err := Static(ctx, pkgs...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return bins
}

// buildTimeout bounds StaticForTest: linking the three programs takes
// seconds, but other test binaries of the same run may hold the lock
// while they link theirs, on a loaded machine.
const buildTimeout = 5 * time.Minute
