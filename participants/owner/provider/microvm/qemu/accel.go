package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

// ProbeBudget is how long the probe guest has under KVM to boot and run
// its loop. Under TCG the boot alone takes seconds; under a KVM that runs
// at speed, all of it well under one. A KVM that is there but does not run
// a stock guest at speed (PVM, nested without hardware support) misses it.
const ProbeBudget = 6 * time.Second

// probeInit is the probe guest's /init: a loop of a million shell
// additions (about 1 s at native speed), then power off.
const probeInit = `#!/bin/sh
echo stillpoint-probe-start
i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done
echo stillpoint-probe-done
reboot -f
`

// PickAccel chooses the accelerator for mode ("auto", "kvm" or "tcg")
// and says why. auto boots a probe guest under KVM (when /dev/kvm opens)
// and takes KVM only when it finishes within ProbeBudget; the answer is
// kept in cacheDir for this host kernel and guest kernel.
func PickAccel(ctx context.Context, a Assets, mode, cacheDir string, tscKHz int64) (accel, reason string, err error) {
	kvmErr := kvmUsable()
	switch mode {
	case "tcg":
		return "tcg", "tcg: asked for", nil
	case "kvm":
		if kvmErr != nil {
			return "", "", fmt.Errorf("%w: accel kvm: %w", errors.ErrUnsupported, kvmErr)
		}
		return "kvm", "kvm: asked for", nil
	case "auto":
	default:
		return "", "", fmt.Errorf("accel %q: want auto, kvm or tcg", mode)
	}
	if kvmErr != nil {
		return "tcg", fmt.Sprintf("tcg: %v", kvmErr), nil
	}
	var uts syscall.Utsname
	_ = syscall.Uname(&uts)
	host := strings.TrimRight(string(bytesOf(uts.Release[:])), "\x00")
	cache := filepath.Join(cacheDir, "accel-"+sanitize(host)+"-"+a.KernelVersion)
	if b, err := os.ReadFile(cache); err == nil {
		acc, why, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		if acc == "kvm" || acc == "tcg" {
			return acc, acc + ": " + why + " (probed earlier)", nil
		}
	}
	took, perr := Probe(ctx, a, tscKHz, filepath.Join(cacheDir, ".probe"))
	if perr == nil && took <= ProbeBudget {
		accel, reason = "kvm", fmt.Sprintf("a probe guest ran under KVM in %s", took.Round(time.Millisecond))
	} else if perr == nil {
		accel, reason = "tcg", fmt.Sprintf("a probe guest took %s under KVM (budget %s): KVM does not run it at speed here", took.Round(time.Millisecond), ProbeBudget)
	} else {
		accel, reason = "tcg", fmt.Sprintf("a probe guest did not finish under KVM in %s: %v", ProbeBudget, perr)
	}
	_ = os.WriteFile(cache, []byte(accel+" "+reason+"\n"), 0o600)
	return accel, accel + ": " + reason, nil
}

func bytesOf[T int8 | uint8](s []T) []byte {
	b := make([]byte, len(s))
	for i, c := range s {
		b[i] = byte(c)
	}
	return b
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// kvmUsable reports why /dev/kvm cannot be used, or nil.
func kvmUsable() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("no usable /dev/kvm: %w", err)
	}
	return f.Close()
}

// Probe boots the probe guest under KVM in dir and returns how long it
// took from QEMU's start to the guest's last line; it gives up after
// ProbeBudget.
//
// The probe's QEMU dies with this process (Pdeathsig: under a KVM that
// does not run it at speed it would spin for ever); one that an earlier
// process left anyway (its pid file in dir) is killed first.
func Probe(ctx context.Context, a Assets, tscKHz int64, dir string) (time.Duration, error) {
	if err := KillProbeLeftover(dir); err != nil {
		return 0, err
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initrd")
	if err := (Initramfs{Assets: a, Init: []byte(probeInit)}).Write(ctx, initrd); err != nil {
		return 0, err
	}
	serial := filepath.Join(dir, "serial")
	args := []string{"-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "128M", "-M", "microvm",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "file:" + serial,
		"-kernel", a.Kernel, "-initrd", initrd, "-append", fmt.Sprintf("console=ttyS0 panic=-1 quiet tsc_early_khz=%d tsc=reliable", tscKHz)}
	var out bytes.Buffer
	cmd := exec.Command(a.QEMU, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	// Pdeathsig follows the thread that forks: locked, it is not one the
	// runtime ends meanwhile.
	runtime.LockOSThread()
	err := cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return 0, err
	}
	if st, _, err := procfs.ReadStat(cmd.Process.Pid, nil); err == nil {
		_ = os.WriteFile(filepath.Join(dir, probePIDFile), fmt.Appendf(nil, "%d %d %d\n", cmd.Process.Pid, st.Start, os.Getpid()), 0o600)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // ends when QEMU exits, which the kill below ensures
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}()
	pctx, cancel := context.WithTimeout(ctx, ProbeBudget)
	defer cancel()
	var took time.Duration
	err = poll.Until(pctx, poll.Every(20*time.Millisecond), func() (bool, error) {
		b, _ := os.ReadFile(serial)
		if bytes.Contains(b, []byte("stillpoint-probe-done")) {
			took = time.Since(t0)
			return true, nil
		}
		select {
		case err := <-done:
			done <- err
			return false, fmt.Errorf("qemu exited: %v: %s", err, strings.TrimSpace(out.String()))
		default:
		}
		return false, nil
	})
	return took, err
}

// probePIDFile names the probe's QEMU in the probe's directory: "<pid>
// <start> <owner pid>" (start: field 22 of its stat).
const probePIDFile = "qemu.pid"

// KillProbeLeftover kills the probe QEMU an earlier process left in dir
// (when its pid still names that process and the process that started it
// is no longer its parent: a live provider's probe is left alone) and
// waits until it is gone.
func KillProbeLeftover(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, probePIDFile))
	if err != nil {
		return nil
	}
	var pid, owner int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d %d", &pid, &start, &owner); err != nil || pid <= 0 {
		return nil
	}
	same := func() bool {
		st, _, err := procfs.ReadStat(pid, nil)
		return err == nil && st.Start == start && st.State != 'Z'
	}
	if st, _, err := procfs.ReadStat(pid, nil); err != nil || st.Start != start || st.State == 'Z' || st.PPID == owner {
		return nil
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := poll.Until(ctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) { return !same(), nil }); err != nil {
		return fmt.Errorf("the probe QEMU %d an earlier process left did not exit: %w", pid, err)
	}
	return nil
}
