package sandboxd

import (
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

func TestParseStat(t *testing.T) {
	line := []byte("4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 3 0 123456 1000 100\n")
	st, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := statInfo{state: 'S', ppid: 1, pgrp: 4242, session: 4242, utime: 17, stime: 4, threads: 3, start: 123456}
	if st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	if _, err := parseStat([]byte("1 (x) S 1")); err == nil {
		t.Fatal("short stat accepted")
	}
}

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
