package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/procfs"
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

// TestKillProbeLeftover: a probe QEMU whose provider died (its parent is
// no longer the process that started it) is killed; a live provider's is
// not. A sleep stands in for QEMU.
func TestKillProbeLeftover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		owner int
		dies  bool
	}{{"left", 0, true}, {"live", os.Getpid(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(waited) }()
			defer func() { _ = cmd.Process.Kill(); <-waited }()
			st, _, err := procfs.ReadStat(cmd.Process.Pid, nil)
			if err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("%d %d %d\n", cmd.Process.Pid, st.Start, tc.owner)
			if err := os.WriteFile(filepath.Join(dir, probePIDFile), []byte(line), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := KillProbeLeftover(dir); err != nil {
				t.Fatal(err)
			}
			// KillProbeLeftover returns once its target is gone (a zombie
			// here, until Wait), or at once when it leaves it alone.
			st, _, err = procfs.ReadStat(cmd.Process.Pid, nil)
			if gone := err != nil || st.State == 'Z'; gone != tc.dies {
				t.Fatalf("probe gone: %v, want %v", gone, tc.dies)
			}
		})
	}
}
