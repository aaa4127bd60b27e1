package sandboxd

import "testing"

func TestIdentity(t *testing.T) {
	self, err := IdentityOf(1)
	if err != nil || self.PID != 1 || !self.Alive() {
		t.Fatalf("IdentityOf(1) = %v, %v", self, err)
	}
	back, err := ParseIdentity(self.String())
	if err != nil || back != self {
		t.Fatalf("ParseIdentity(%q) = %v, %v", self.String(), back, err)
	}
	// The same pid with another start time is another process: a
	// restarted supervisor.
	other := Identity{PID: self.PID, Start: self.Start + 1}
	if other.Alive() || other == self {
		t.Fatal("a different start time must not match")
	}
	for _, bad := range []string{"", "1", "x:1", "1:y", "-1:2"} {
		if _, err := ParseIdentity(bad); err == nil {
			t.Errorf("ParseIdentity(%q) accepted", bad)
		}
	}
}
