package microvm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/tier"
)

// auto picks KVM only when a probe guest runs at speed under it: here
// (PVM, or no /dev/kvm) that is TCG, with a reason, and the answer is kept
// for the next provider.
func TestPickAccel(t *testing.T) {
	tier.Long(t)
	a, err := FindAssets("")
	if err != nil {
		t.Fatalf("the probe needs QEMU and the guest kernel: %v", err)
	}
	khz, err := HostTSCKHz()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if acc, why, err := PickAccel(ctx, a, "tcg", t.TempDir(), khz); err != nil || acc != "tcg" || why == "" {
		t.Fatalf("tcg: %q %q %v", acc, why, err)
	}
	cache := t.TempDir()
	t0 := time.Now()
	acc, why, err := PickAccel(ctx, a, "auto", cache, khz)
	if err != nil || (acc != "tcg" && acc != "kvm") {
		t.Fatalf("auto: %q %q %v", acc, why, err)
	}
	t.Logf("auto: %s (%s) in %s", acc, why, time.Since(t0).Round(time.Millisecond))
	if acc == "kvm" && !strings.Contains(why, "ran under KVM") {
		t.Errorf("kvm chosen without a probe that ran at speed: %s", why)
	}
	if kvmUsable() != nil && acc != "tcg" {
		t.Errorf("no usable /dev/kvm but auto chose %s", acc)
	}
	again, why2, err := PickAccel(ctx, a, "auto", cache, khz)
	if err != nil || again != acc || (kvmUsable() == nil && !strings.Contains(why2, "probed earlier")) {
		t.Errorf("second auto: %q %q %v, want %s from the cache", again, why2, err, acc)
	}
	if _, err := os.Stat(cache); err != nil {
		t.Fatal(err)
	}
}
