package testcpu

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// Dir is the directory of the slot files: one per quarter of a core, and
// the gate that the test gathering its slots holds meanwhile.
var Dir = filepath.Join(os.TempDir(), "stillpoint-testcpu")

// Quarters is how many slots the machine has: four per core.
var Quarters = 4 * runtime.NumCPU()

// retry is how often a test waiting for the gate or for slots looks again.
const retry = 50 * time.Millisecond

// Take holds cores (rounded up to a quarter, at most the machine's) for t
// until t ends, waiting while the other tests of the machine hold them. It
// fails t if t's context ends first. cores is what t keeps busy on
// average, measured alone. A test holds one share: when t or a test it
// runs in (a parent, by name) already holds one, Take does nothing, for a
// test that held slots and waited for more could wait forever on one that
// holds the gate and waits for its slots.
func Take(t testing.TB, cores float64) {
	t.Helper()
	name := t.Name()
	if holding(name) {
		return
	}
	q := min(max(int(math.Ceil(cores*4)), 1), Quarters)
	held, err := take(t.Context(), q)
	if err != nil {
		t.Fatalf("waiting for %.2f of the machine's cores: %v", cores, err)
	}
	shares.Lock()
	shares.by[name] = true
	shares.Unlock()
	t.Cleanup(func() {
		shares.Lock()
		delete(shares.by, name)
		shares.Unlock()
		release(held) // a lock goes with the last descriptor of its file
	})
}

// shares are the names of the tests of this process that hold a share.
var shares = struct {
	sync.Mutex
	by map[string]bool
}{by: map[string]bool{}}

// holding tells whether the test named name, or one it runs in, holds a
// share.
func holding(name string) bool {
	shares.Lock()
	defer shares.Unlock()
	for {
		if shares.by[name] {
			return true
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return false
		}
		name = name[:i]
	}
}

// take gathers q slots. The one gathering holds the gate, so that two
// tests never each hold part of what both want, and a large share is not
// passed over by small ones: the gate's holder only waits for slots to
// be released.
func take(ctx context.Context, q int) ([]*os.File, error) {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return nil, err
	}
	gate, err := lock(ctx, filepath.Join(Dir, "gate"))
	if err != nil {
		return nil, err
	}
	defer gate.Close()
	var held []*os.File
	got := make([]bool, Quarters)
	err = poll.Until(ctx, poll.Every(retry), func() (bool, error) {
		for i := range Quarters {
			if len(held) == q {
				return true, nil
			}
			if got[i] {
				continue
			}
			f, ok, err := tryLock(filepath.Join(Dir, fmt.Sprintf("slot-%d", i)))
			if err != nil {
				return false, err
			}
			if ok {
				held, got[i] = append(held, f), true
			}
		}
		return len(held) == q, nil
	})
	if err != nil {
		release(held)
		return nil, err
	}
	return held, nil
}

// lock takes path's lock, waiting until it is free or ctx ends.
func lock(ctx context.Context, path string) (*os.File, error) {
	var f *os.File
	err := poll.Until(ctx, poll.Every(retry), func() (ok bool, err error) {
		f, ok, err = tryLock(path)
		return ok, err
	})
	return f, err
}

// tryLock takes path's lock if it is free: the open file holds it.
func tryLock(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, err
	}
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err {
	case nil:
		return f, true, nil
	case unix.EWOULDBLOCK:
		f.Close()
		return nil, false, nil
	default:
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
}

func release(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
