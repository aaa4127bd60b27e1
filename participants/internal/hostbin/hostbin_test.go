package hostbin_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/internal/hostbin"
)

var errMissing = errors.New("missing")

// Find takes the environment variable first, then the first cache with
// the program, refusing another version; Stage links the programs into
// one directory shown at the sandbox directory.
func TestFindAndStage(t *testing.T) {
	dir := t.TempDir()
	write := func(path, content string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	empty, cache := filepath.Join(dir, "empty"), filepath.Join(dir, "cache")
	bin := write(filepath.Join(cache, "node_modules", "pkg", "bin", "prog"), "#!/bin/sh\n", 0o755)
	write(filepath.Join(cache, "node_modules", "pkg", "package.json"), `{"version":"1.2.3"}`, 0o644)
	n := hostbin.NPM{Name: "Prog", Env: "HOSTBIN_TEST_PROG", Caches: []string{"", empty, cache}, Bin: "pkg/bin/prog",
		VersionOf: "pkg/package.json", Version: "1.2.3", Err: errMissing, Hint: "install it"}
	if got, err := n.Find(); err != nil || got != bin {
		t.Fatalf("Find: %q %v", got, err)
	}
	n.Version = "2.0.0"
	if _, err := n.Find(); !errors.Is(err, errMissing) || !strings.Contains(err.Error(), `version "1.2.3"`) || !strings.HasSuffix(err.Error(), "install it") {
		t.Fatalf("another version: %v", err)
	}
	other := write(filepath.Join(dir, "other"), "#!/bin/sh\n", 0o755)
	t.Setenv(n.Env, other)
	if got, err := n.Find(); err != nil || got != other {
		t.Fatalf("Find with %s: %q %v", n.Env, got, err)
	}
	t.Setenv(n.Env, filepath.Join(dir, "nothing"))
	if _, err := n.Find(); !errors.Is(err, errMissing) {
		t.Fatalf("a missing $%s: %v", n.Env, err)
	}

	stage := filepath.Join(dir, "stage")
	for range 2 { // staging again keeps what is there
		binds, err := hostbin.Stage(stage, "/opt/prog", map[string]string{"prog": bin, "other": other})
		if err != nil || len(binds) != 1 || binds[0].HostDir != stage || binds[0].SandboxDir != "opt/prog" {
			t.Fatalf("Stage: %+v %v", binds, err)
		}
	}
	if err := hostbin.Executable(filepath.Join(stage, "prog")); err != nil {
		t.Fatal(err)
	}
	if err := hostbin.Executable(filepath.Join(cache, "node_modules", "pkg", "package.json")); err == nil {
		t.Fatal("a file without x bits is executable")
	}
}
