package sandboxd

import (
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

func TestIdentity(t *testing.T) {
	self, err := IdentityOf(1)
	if err != nil || self.PID != 1 || !Alive(self) {
		t.Fatalf("IdentityOf(1) = %v, %v", self, err)
	}
	back, err := sandboxapi.ParseIdentity(self.String())
	if err != nil || back != self {
		t.Fatalf("ParseIdentity(%q) = %v, %v", self.String(), back, err)
	}
	// The same pid with another start time is another process: a
	// restarted supervisor.
	other := sandboxapi.Identity{PID: self.PID, Start: self.Start + 1}
	if Alive(other) || other == self {
		t.Fatal("a different start time must not match")
	}
	for _, bad := range []string{"", "1", "x:1", "1:y", "-1:2"} {
		if _, err := sandboxapi.ParseIdentity(bad); err == nil {
			t.Errorf("ParseIdentity(%q) accepted", bad)
		}
	}
}
