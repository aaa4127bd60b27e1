package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Reserved ports are distinct, below the ephemeral range, free to bind,
// and not handed out again while held: another Reserve (here another
// open file description, as another process's) skips them.
func TestReserve(t *testing.T) {
	lo, err := ephemeralLow()
	if err != nil {
		t.Fatal(err)
	}
	a, err := Reserve("127.0.0.1", 6)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	b, err := Reserve("127.0.0.1", 6)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	seen := map[int]bool{}
	for _, p := range append(append([]int(nil), a.List...), b.List...) {
		if seen[p] {
			t.Fatalf("port %d handed out twice: %v %v", p, a.List, b.List)
		}
		seen[p] = true
		if p < lowest || p >= lo {
			t.Errorf("port %d is not in [%d, %d), below the ephemeral range", p, lowest, lo)
		}
	}
	l, err := net.Listen("tcp", a.Addr("127.0.0.1", 0))
	if err != nil {
		t.Fatalf("a reserved port does not bind: %v", err)
	}
	l.Close()
	path := filepath.Join(os.TempDir(), "stillpoint-ports", strconv.Itoa(a.List[0]))
	if f, ok := lock(path); ok {
		f.Close()
		t.Fatal("a held port's lock was taken again")
	}
	a.Release()
	f, ok := lock(path)
	if !ok {
		t.Fatal("a released port's lock is still held")
	}
	f.Close()
}
