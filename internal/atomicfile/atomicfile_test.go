package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := Write(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "two" {
		t.Fatalf("read %q, %v; want two", b, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if _, err := os.Stat(p + tmpSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
}

func TestWriteReplacesALeftoverTemporary(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p+tmpSuffix, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("whole"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "whole" {
		t.Fatalf("read %q, want whole", b)
	}
}

func TestWriteKeepsTheOldContentOnError(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := Write(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory where the temporary file would go makes the write fail.
	if err := os.Mkdir(p+tmpSuffix, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("new"), 0o644); err == nil {
		t.Fatal("Write succeeded with its temporary path taken by a directory")
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("read %q after a failed write, want old", b)
	}
}

func TestWriteNeedsTheDirectory(t *testing.T) {
	err := Write(filepath.Join(t.TempDir(), "missing", "state.json"), []byte("x"), 0o644)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write into a missing directory: %v, want ErrNotExist", err)
	}
}

func TestReplaceReplaces(t *testing.T) {
	p := filepath.Join(t.TempDir(), "record.json")
	for _, v := range []string{"pending", "paused", "running"} {
		if err := Replace(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != v {
			t.Fatalf("read %q, want %q", b, v)
		}
	}
	if _, err := os.Stat(p + tmpSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
}
