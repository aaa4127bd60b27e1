package build

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// forget drops this process's memory of its builds, as a new process
// starts without it.
func forget() {
	built.Lock()
	built.bins = Binaries{}
	built.Unlock()
}

func TestStaticBuildsStaticBinariesOnce(t *testing.T) {
	bins := StaticForTest(t, ScriptedHarness)
	bin := bins[ScriptedHarness]
	if filepath.Base(bin) != "scripted-harness" {
		t.Fatalf("binary %s: want it named scripted-harness", bin)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a program interpreter: not a static binary", bin)
		}
	}
	f.Close()
	fi, err := os.Stat(bin)
	if err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("binary %s: %v, mode %v", bin, err, fi.Mode())
	}

	// Again in this process: the same binary, no build.
	if again := StaticForTest(t, ScriptedHarness)[ScriptedHarness]; again != bin {
		t.Fatalf("a second Static gave %s, want %s", again, bin)
	}

	// As another process would: the go command finds the stage up to date
	// and the copy is the same file, left alone.
	forget()
	start := time.Now()
	if again := StaticForTest(t, ScriptedHarness)[ScriptedHarness]; again != bin {
		t.Fatalf("a build in a fresh process gave %s, want %s", again, bin)
	}
	if after, err := os.Stat(bin); err != nil || !after.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("the shared copy was rewritten: %v %v", after.ModTime(), err)
	}
	t.Logf("an up-to-date build took %s", time.Since(start).Round(time.Millisecond))
}

func TestStaticOutsideTheModule(t *testing.T) {
	forget()
	t.Chdir(t.TempDir())
	if _, err := Static(t.Context(), ScriptedHarness); !errors.Is(err, ErrNoModule) {
		t.Fatalf("Static outside a checkout: %v, want ErrNoModule", err)
	}
	forget()
}

func TestStaticReportsABuildFailure(t *testing.T) {
	forget()
	_, err := Static(t.Context(), "./no/such/program")
	if err == nil || !strings.Contains(err.Error(), "go build ./no/such/program") {
		t.Fatalf("Static of a missing package: %v", err)
	}
}

func TestPruneRemovesOnlyOldCopies(t *testing.T) {
	dir := t.TempDir()
	old, fresh := filepath.Join(dir, "a-1"), filepath.Join(dir, "a-2")
	for _, d := range []string{old, fresh} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * unusedFor)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	prune(dir, time.Now().Add(-unusedFor))
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old copy is still there: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("the fresh copy is gone: %v", err)
	}
}
