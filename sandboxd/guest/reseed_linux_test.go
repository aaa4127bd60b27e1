package guest

import (
	"bytes"
	"crypto/rand"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestReseed feeds entropy to the kernel as the guest does after a fork.
// On a host kernel the CRNG is reseeded anyway; what is checked is that
// both ioctls are accepted (struct layout, constants, privilege) and that
// the pool counts as full after them. The fork test in QEMU shows the
// effect that matters: two forks of one snapshot draw different bytes.
func TestReseed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestReseed needs root (CAP_SYS_ADMIN for RNDADDENTROPY): run the tests as root, as CI does")
	}
	before := make([]byte, 32)
	_, _ = rand.Read(before)
	ent := make([]byte, 64)
	_, _ = rand.Read(ent)
	if err := Reseed(ent); err != nil {
		t.Fatal(err)
	}
	after := make([]byte, 32)
	_, _ = rand.Read(after)
	if bytes.Equal(before, after) {
		t.Fatal("getrandom repeated itself across a reseed")
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/entropy_avail")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 256 {
		t.Fatalf("entropy_avail %q after a reseed of 512 bits: want at least 256", b)
	}
	if err := Reseed(nil); err == nil {
		t.Fatal("Reseed(nil): no error")
	}
}
