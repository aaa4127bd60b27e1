package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// --launch-user wins over --launch-user-file; a missing file names
// nobody; a user is resolved in the sandbox's /etc/passwd (under
// STILLPOINT_SANDBOX_ROOT when set), and an unknown one is refused.
func TestLaunchUserFlags(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/stillpoint"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"etc/passwd": "app:x:1000:1001::/home/app:/bin/sh\n", "etc/group": "", "etc/stillpoint/launch-user": "app\n"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("STILLPOINT_SANDBOX_ROOT", root)
	resolve := func(args ...string) (string, error) {
		t.Helper()
		o, err := parseMemberFlags(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.launchUserFile != "" {
			o.launchUserFile = filepath.Join(root, o.launchUserFile) // as memberCmd maps it
		}
		u, err := o.resolveLaunchUser()
		if u == nil {
			return "none", err
		}
		return fmt.Sprintf("%d/%d", u.UID, u.GID), err
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "none"},
		{[]string{"--launch-user-file", "/etc/stillpoint/missing"}, "none"},
		{[]string{"--launch-user-file", "/etc/stillpoint/launch-user"}, "1000/1001"},
		{[]string{"--launch-user", "7:8", "--launch-user-file", "/etc/stillpoint/launch-user"}, "7/8"},
	} {
		if got, err := resolve(c.args...); got != c.want || err != nil {
			t.Errorf("%v: %s, %v; want %s", c.args, got, err, c.want)
		}
	}
	if _, err := resolve("--launch-user", "nobody"); err == nil {
		t.Error("an unknown user was not refused")
	}
}
