package ownerapi

import "testing"

func TestSubject(t *testing.T) {
	if got := Subject("r1", "o1"); got != "spsvc.r1.owner.o1" {
		t.Fatalf("Subject = %q", got)
	}
}

// A path inside the sandbox is the same path to its processes when they
// have a root of their own, and under Root when they see the host's paths.
func TestInSandbox(t *testing.T) {
	for _, c := range []struct{ root, want string }{{"", "/work"}, {"/", "/work"}, {"/srv/sb1", "/srv/sb1/work"}} {
		if got := (SessionInfo{Root: c.root}).InSandbox("/work"); got != c.want {
			t.Errorf("root %q: InSandbox = %q, want %q", c.root, got, c.want)
		}
	}
}
