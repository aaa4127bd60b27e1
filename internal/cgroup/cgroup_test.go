package cgroup

import "testing"

func TestParseEvents(t *testing.T) {
	cases := map[string]Events{
		"populated 1\nfrozen 0\n": {Populated: true},
		"populated 0\nfrozen 1\n": {Frozen: true},
		"populated 1\nfrozen 1":   {Populated: true, Frozen: true},
		"populated 1\n":           {Populated: true}, // kernels before 5.2 have no frozen line
		"":                        {},
		"garbage\nfrozen 2\n":     {},
	}
	for in, want := range cases {
		if got := parseEvents([]byte(in)); got != want {
			t.Errorf("parseEvents(%q) = %+v, want %+v", in, got, want)
		}
	}
}

func TestChild(t *testing.T) {
	if got := Dir("/sys/fs/cgroup/a").Child("b/c"); got != "/sys/fs/cgroup/a/b/c" {
		t.Errorf("Child = %s", got)
	}
}
