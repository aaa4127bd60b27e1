//go:build linux

package microvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
)

// stop kills QEMU's session and waits until it is reaped, at most
// timeout and until ctx ends; once it is, it closes the channels and
// waits for every goroutine of the machine. A stop that gave up is tried
// again by the next call, which checks afresh; a stop after a successful
// one returns nil.
func (vm *machine) stop(ctx context.Context, timeout time.Duration) error {
	vm.stopMu.Lock()
	defer vm.stopMu.Unlock()
	if vm.stopLease != nil {
		vm.stopLease()
		<-vm.leaseDone
		vm.stopLease = nil
	}
	select {
	case <-vm.reaped:
	default:
		_ = syscall.Kill(-vm.pid, syscall.SIGKILL) // QEMU; its session is its own
		if vm.cg != "" {
			_ = vm.cg.Kill() // and its relays, in sessions of their own
		}
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-vm.reaped:
		case <-t.C:
			return fmt.Errorf("%w: qemu %d of %s did not exit within %s", provider.ErrLeftover, vm.pid, vm.id, timeout)
		case <-ctx.Done():
			return fmt.Errorf("%w: qemu %d of %s not reaped yet: %w", provider.ErrLeftover, vm.pid, vm.id, ctx.Err())
		}
	}
	if !vm.closed {
		vm.closed = true
		if vm.ctl != nil {
			_ = vm.ctl.Close()
		}
		if vm.qmp != nil {
			_ = vm.qmp.Close()
		}
	}
	return nil
}

// killLeftover kills the QEMU an earlier process left running (if the pid
// still names it) and waits until it is gone.
func killLeftover(meta vmMeta, timeout time.Duration) error {
	if meta.PID <= 0 {
		return nil
	}
	same := func() bool { return procs.Running(meta.PID, meta.Start) }
	if !same() {
		return nil
	}
	_ = syscall.Kill(-meta.PID, syscall.SIGKILL)
	_ = syscall.Kill(meta.PID, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll.Until(ctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) { return !same(), nil }); err != nil {
		return fmt.Errorf("%w: qemu %d left by an earlier process did not exit", provider.ErrLeftover, meta.PID)
	}
	return nil
}

// vmCgroup is the cgroup of VM id's QEMU ("" when the provider runs
// without cgroups): <cgroup v2>/stillpoint-vms/<state hash>/<id hash>, a
// path a restarted provider finds again.
func (m *Provider) vmCgroup(id string) cgroup.Dir {
	if m.cgroups == "" {
		return ""
	}
	return m.cgroups.Child(shortHash(id))
}

// makeVMCgroup makes the cgroup for VM id's QEMU, emptying one an earlier
// process left. It is called with sockMu held shared: the parent is
// removed under it held exclusively (clearVMCgroup).
func (m *Provider) makeVMCgroup(id string) (cgroup.Dir, error) {
	cg := m.vmCgroup(id)
	if cg == "" {
		return "", nil
	}
	if err := os.MkdirAll(string(m.cgroups), 0o755); err != nil {
		return "", fmt.Errorf("microvm: the VMs' cgroup: %w", err)
	}
	if _, err := cgroup.Create(string(cg)); errors.Is(err, fs.ErrExist) {
		if err := m.emptyCgroup(context.Background(), cg); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("microvm: a VM's cgroup: %w", err)
	}
	return cg, nil
}

// emptyCgroup kills every process of cg and waits until it holds none.
func (m *Provider) emptyCgroup(ctx context.Context, cg cgroup.Dir) error {
	if _, err := os.Stat(string(cg)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := cg.Kill(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: kill cgroup %s: %w", provider.ErrLeftover, cg, err)
	}
	ok, err := cg.WaitEvents(ctx, time.Now().Add(m.cfg.StopTimeout), func(e cgroup.Events) bool { return !e.Populated })
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !ok {
		pids, _ := cg.AllProcs()
		return fmt.Errorf("%w: cgroup %s still holds %v: %v", provider.ErrLeftover, cg, pids, err)
	}
	return nil
}

// clearVMCgroup empties VM id's cgroup (QEMU, its relays) and removes it,
// and the parent once no VM's cgroup is left in it.
func (m *Provider) clearVMCgroup(ctx context.Context, id string) error {
	cg := m.vmCgroup(id)
	if cg == "" {
		return nil
	}
	if err := m.emptyCgroup(ctx, cg); err != nil {
		return err
	}
	if err := cg.Remove(ctx, time.Now().Add(m.cfg.StopTimeout)); err != nil {
		return fmt.Errorf("%w: %w", provider.ErrLeftover, err)
	}
	m.sockMu.Lock()
	defer m.sockMu.Unlock()
	if err := unix.Rmdir(string(m.cgroups)); err != nil && err != unix.ENOENT && err != unix.EBUSY && err != unix.ENOTEMPTY {
		return fmt.Errorf("%w: rmdir %s: %w", provider.ErrLeftover, m.cgroups, err)
	}
	return nil
}
