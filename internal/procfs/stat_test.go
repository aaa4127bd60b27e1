package procfs

import (
	"errors"
	"slices"
	"testing"
)

func TestParseStat(t *testing.T) {
	line := []byte("4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 3 0 123456 1000 100\n")
	st, err := ParseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{State: 'S', PPID: 1, PGID: 4242, Session: 4242, UTime: 17, STime: 4, Threads: 3, Start: 123456}
	if st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	for _, bad := range []string{"1 (x) S 1", "1 (x)", "no name at all", ""} {
		if _, err := ParseStat([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseStat(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestParsePIDs(t *testing.T) {
	got := ParsePIDs([]byte("12 345\n6\n"), []int{1})
	if want := []int{1, 12, 345, 6}; !slices.Equal(got, want) {
		t.Fatalf("ParsePIDs = %v, want %v", got, want)
	}
	if got := ParsePIDs([]byte("7"), nil); !slices.Equal(got, []int{7}) {
		t.Fatalf("ParsePIDs without a newline = %v, want [7]", got)
	}
	if got := ParsePIDs(nil, nil); len(got) != 0 {
		t.Fatalf("ParsePIDs(nil) = %v", got)
	}
}

func TestParseMount(t *testing.T) {
	cases := []struct {
		line string
		want Mount
		ok   bool
	}{
		{"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
			Mount{Root: "/mnt1", Point: "/mnt2", FSType: "ext3"}, true},
		{"30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw",
			Mount{Root: "/", Point: "/sys/fs/cgroup/unified", FSType: "cgroup2"}, true},
		{`40 30 0:40 /a\040b /mnt/with\040space\134 rw - tmpfs tmpfs rw`,
			Mount{Root: "/a b", Point: `/mnt/with space\`, FSType: "tmpfs"}, true},
		{`41 30 0:41 / /odd\04 rw - tmpfs tmpfs rw`, Mount{Root: "/", Point: `/odd\04`, FSType: "tmpfs"}, true},
		{"36 35 98:0 /mnt1 /mnt2 rw", Mount{}, false},
		{"36 35 - ext3", Mount{}, false},
	}
	for _, c := range cases {
		got, ok := ParseMount(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseMount(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestPaths(t *testing.T) {
	if got := Path(42, "/stat"); got != "/proc/42/stat" {
		t.Errorf("Path = %q", got)
	}
	if got := TaskPath(42, 43, "/children"); got != "/proc/42/task/43/children" {
		t.Errorf("TaskPath = %q", got)
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 3 0 123456 1000 100\n"))
	f.Add([]byte("1 (x) S"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseStat(b)
		if err != nil && st.Start != 0 {
			t.Fatalf("error %v with a start time %d", err, st.Start)
		}
	})
}

func FuzzParseMount(f *testing.F) {
	f.Add("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue")
	f.Add(`40 30 0:40 /a\040b /m\1 rw - tmpfs tmpfs rw`)
	f.Add(" - ")
	f.Fuzz(func(t *testing.T, line string) {
		m, ok := ParseMount(line)
		if ok && m.FSType == "" {
			t.Fatalf("ParseMount(%q) ok without a file system type", line)
		}
	})
}
