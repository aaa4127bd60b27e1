package provider

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestSpecValidate(t *testing.T) {
	ok := Spec{ID: "sess-1_a", Workdir: "/srv/x", Env: []string{"A=1", "B="},
		Files:  map[string][]byte{"etc/x.conf": nil, "./a/./b": nil},
		CopyIn: []CopyIn{{HostPath: "/usr/bin/true", SandboxPath: "bin/sandboxd", Mode: 0o755}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	// Every bad field is reported, each by name.
	bad := Spec{ID: "a/b", Init: []string{""}, Env: []string{"=x"}, Workdir: "/../x",
		Files:  map[string][]byte{"../up": nil, "/abs": nil},
		CopyIn: []CopyIn{{HostPath: "rel", SandboxPath: "x/../../y", Mode: 0o17777}}}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	for _, field := range []string{"spec.ID", "spec.Init[0]", "spec.Env[0]", "spec.Workdir", `spec.Files["../up"]`,
		`spec.Files["/abs"]`, "spec.CopyIn[0].HostPath", "spec.CopyIn[0].SandboxPath", "spec.CopyIn[0].Mode"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s:\n%v", field, err)
		}
	}
	if err := ValidateID("snapshotID", strings.Repeat("a", 64)); err != nil {
		t.Errorf("64-byte id refused: %v", err)
	}
	for _, id := range []string{"", "-a", "a.b", "a b", "a*", "a>", strings.Repeat("a", 65), ".."} {
		if err := ValidateID("snapshotID", id); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "snapshotID") {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
}

func TestCleanPaths(t *testing.T) {
	for in, want := range map[string]string{"a/b": "a/b", "./a//b/": "a/b", "a/./b": "a/b"} {
		if got, err := CleanRel("f", in); err != nil || got != want {
			t.Errorf("CleanRel(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", ".", "./", "/a", "..", "a/..", "a/../b", "a\x00b"} {
		if _, err := CleanRel("f", in); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanRel(%q) accepted", in)
		}
	}
	if got, err := CleanAbs("f", "/a//b/"); err != nil || got != "/a/b" {
		t.Errorf("cleanAbs = %q, %v", got, err)
	}
	if got := WithDefaults([]string{"PATH=/x", "A=1"}, "PATH=/default", "HOME=/root"); !slices.Equal(got, []string{"PATH=/x", "A=1", "HOME=/root"}) {
		t.Errorf("withDefaults = %v", got)
	}
}
