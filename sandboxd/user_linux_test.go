//go:build linux

package sandboxd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// A container image's user, in each form its config writes, resolves
// against the root's /etc/passwd and /etc/group; one that names nobody
// there is refused naming it.
func TestResolveUser(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd", "root:x:0:0:root:/root:/bin/sh\n# a comment\napp:x:1000:1000::/home/app:/bin/sh\n")
	write("group", "root:x:0:\nstaff:x:50:\nwheel:x:10:app,other\napp:x:1000:\ndocker:x:999:other,app\n")
	for _, c := range []struct {
		spec string
		want User
	}{
		{"app", User{UID: 1000, GID: 1000, Groups: []uint32{10, 999}}},
		{"1000", User{UID: 1000, GID: 1000, Groups: []uint32{10, 999}}},
		{"app:staff", User{UID: 1000, GID: 50, Groups: []uint32{10, 999}}},
		{"1000:2000", User{UID: 1000, GID: 2000, Groups: []uint32{10, 999}}},
		{"1001", User{UID: 1001}},
		{"1001:50", User{UID: 1001, GID: 50}},
		{"root", User{}},
	} {
		got, err := ResolveUser(c.spec, root)
		if err != nil || got.UID != c.want.UID || got.GID != c.want.GID || !slices.Equal(got.Groups, c.want.Groups) {
			t.Errorf("ResolveUser(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "nobody", "app:nogroup", "app:", ":50"} {
		if _, err := ResolveUser(bad, root); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ResolveUser(%q): %v, want ErrInvalidConfig", bad, err)
		}
	}
	// A missing launch-user file names nobody; a present one its first line.
	if u, err := ReadLaunchUser(filepath.Join(root, "none")); u != "" || err != nil {
		t.Errorf("missing file: %q %v", u, err)
	}
	write("launch-user", " app:staff \nmore\n")
	if u, err := ReadLaunchUser(filepath.Join(root, "etc/launch-user")); u != "app:staff" || err != nil {
		t.Errorf("launch-user file: %q %v", u, err)
	}
}

// With a launch user, the harness runs as that user, with its groups,
// and pauses and resumes as any launch does; the supervisor stays root.
func TestLaunchRunsAsTheLaunchUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (to run a launch as another user); run it with sudo")
	}
	s := startSupervisor(t, Config{LaunchUser: &User{UID: 1234, GID: 2345, Groups: []uint32{3456}}})
	// A directory the user may enter (t.TempDir's parent is root's alone).
	dir, err := os.MkdirTemp("", "launch-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	id := launchID(t, "u")
	rec := mustLaunch(t, s, Spec{ID: id, Command: `id -u; id -g; id -G; read x < /dev/null; sleep 0.2`, Dir: dir})
	if _, err := s.Pause(ctxT(t), id, sandboxapi.ModeFreeze); err != nil {
		t.Fatalf("pause a launch of another user: %v", err)
	}
	if _, err := s.Continue(ctxT(t), id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	rc, err := s.Wait(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rc.ExitCode != 0 {
		t.Fatalf("receipt %+v, output %q", rc, readFile(t, rec.Output))
	}
	if out := readFile(t, rec.Output); out != "1234\n2345\n2345 3456\n" {
		t.Errorf("the launch ran as %q, want uid 1234, gid 2345, groups 2345 3456", out)
	}
	if os.Geteuid() != 0 {
		t.Error("the supervisor is no longer root")
	}
}
