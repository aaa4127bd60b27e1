//go:build linux

package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/snapstore"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// Snapshot captures the sandbox at one instant: the guest syncs, the VM
// stops, its disk's top layer is frozen (a new one takes the writes), its
// RAM goes to the snapshot's RAM file and its device state to the devices
// file (with Config.FullCopy, both to the state file), and it runs on.
func (m *Provider) Snapshot(ctx context.Context, id, snapshotID string) (provider.Snapshot, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateID("snapshotID", snapshotID)); err != nil {
		return provider.Snapshot{}, err
	}
	box, err := m.boxes.LockLive(id)
	if err != nil {
		return provider.Snapshot{}, err
	}
	defer box.Mu.Unlock()
	if box.vm == nil {
		return provider.Snapshot{}, fmt.Errorf("%w: sandbox %q was left by an earlier process", provider.ErrNotFound, id)
	}
	meta := snapstore.Meta{ID: snapshotID, Provider: m.Name(), Sandbox: id}
	return m.snaps.Create(meta, func(dst string) (provider.Snapshot, error) {
		return m.snapshotInto(ctx, box.vm, dst)
	})
}

// DeleteSnapshot removes snapshots/<snapshotID> and the disk layers only it
// held.
func (m *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.dropRAMCache(snapshotID)
	return errors.Join(m.snaps.Delete(snapshotID), m.gc())
}

// snapshotInto takes the snapshot into dst: vm.json, the state file and
// (unless Config.FullCopy) the RAM file.
//
// From QMP stop on, the VM is paused and its guest's lease cannot fire, so
// everything up to the VM running again is done under a context of its
// own (bounded by StartTimeout, not ended by ctx): the end of ctx ends
// only the wait for the migration, which is then cancelled in QEMU (a
// migration left running would pause the VM again when it completes, and
// refuse the next snapshot), and the VM is resumed in every case (resume).
func (m *Provider) snapshotInto(ctx context.Context, vm *machine, dst string) (provider.Snapshot, error) {
	var st provider.Snapshot
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, _ = vm.call(sctx, vmctl.Request{Op: vmctl.OpSync}) // best effort: stop flushes the disk anyway
	// A fork resumes with the guest's lease as the snapshot found it: a
	// whole one, renewed at the last instant, lets the fork run until its
	// reidentify however busy the host is (best effort, as renewals are).
	_, _ = vm.call(sctx, vmctl.Request{Op: vmctl.OpLease, UntilMS: m.cfg.Lease.Milliseconds()})
	cancel()
	vm.mu.Lock()
	defer vm.mu.Unlock()
	name := newLayerName()
	top := m.layer(name)
	meta := vm.meta
	meta.Pending = top
	if err := vmFile(vm.dir).Write(meta); err != nil {
		return st, err
	}
	q := vm.qmp
	if err := q.SetFastMigration(ctx); err != nil {
		return st, err
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	defer pcancel()
	t0 := time.Now()
	var pages int64
	err := q.Do(pctx, "stop", nil, nil)
	frozen := meta.Chain
	if err == nil {
		node := "n" + name[:8]
		err = q.Do(pctx, "blockdev-snapshot-sync", map[string]any{"node-name": vm.node, "snapshot-file": top,
			"snapshot-node-name": node, "format": "qcow2"}, nil)
		if err == nil {
			vm.node = node
			meta.Chain = append([]string{top}, meta.Chain...)
			if m.cfg.FullCopy {
				err = m.migrateOut(ctx, pctx, q, qemu.SaveURI(filepath.Join(dst, fullStateFile)))
			} else {
				pages, err = m.migrateSplit(ctx, pctx, vm, dst)
			}
		}
	}
	// Whether stop, the disk's snapshot or the migration failed, the VM
	// may be paused: it runs again before this returns.
	// The VM runs again under a time of its own: a split that used up
	// pctx must not leave it paused.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	defer rcancel()
	rerr := resume(rctx, vm)
	took := time.Since(t0)
	meta.Pending = ""
	vm.meta = meta
	err = errors.Join(err, rerr, vmFile(vm.dir).Write(meta))
	if rerr != nil {
		m.log.Error().Err(rerr).Str("sandbox", vm.id).Msg("microvm: the VM could not be resumed after a snapshot: it stays paused until stopped")
	}
	st.Took = took
	if err != nil {
		return st, err
	}
	snap := vmMeta{Chain: frozen, Base: meta.Base, Image: meta.Image, Harness: meta.Harness, HarnessMount: meta.HarnessMount, CPU: meta.CPU,
		Gen: meta.Gen, MemMiB: meta.MemMiB, Sandbox: vm.id, RAMFile: !m.cfg.FullCopy, RAMPages: pages}
	if err := vmFile(dst).Write(snap); err != nil {
		return st, err
	}
	for _, f := range []string{fullStateFile, devicesFile, ramFile} {
		if fi, err := os.Stat(filepath.Join(dst, f)); err == nil {
			st.Size += allocated(fi)
			st.Files++
		}
	}
	return st, nil
}

// migrateSplit migrates the VM to a socket of this process, which writes
// the guest's RAM block into dst's RAM file (a sparse file of the guest's
// size, each page at its offset) and the rest of the stream, the devices,
// into dst's devices file (qemu.SplitRAM). It returns, with the count of
// distinct pages written, once both QEMU says the migration completed and
// the stream was written.
func (m *Provider) migrateSplit(ctx, pctx context.Context, vm *machine, dst string) (int64, error) {
	sock := m.sock(vm.id, "m")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return 0, err
	}
	defer os.Remove(sock)
	defer ln.Close()
	ram, err := os.OpenFile(filepath.Join(dst, ramFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	defer ram.Close()
	if err := ram.Truncate(int64(vm.meta.MemMiB) << 20); err != nil {
		return 0, err
	}
	state, err := os.OpenFile(filepath.Join(dst, devicesFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	defer state.Close()
	type result struct {
		st  qemu.SplitStats
		err error
	}
	split := make(chan result, 1)
	go func() { // ends when QEMU closes the stream, or the listener is closed
		conn, err := ln.Accept()
		if err != nil {
			split <- result{err: err}
			return
		}
		defer conn.Close()
		stop := context.AfterFunc(pctx, func() { conn.Close() })
		defer stop()
		st, err := qemu.SplitRAM(conn, state, ram, qemu.GuestRAMBlock, int64(vm.meta.MemMiB)<<20)
		split <- result{st, err}
	}()
	err = m.migrateOut(ctx, pctx, vm.qmp, "unix:"+sock)
	if err != nil {
		ln.Close()
		<-split
		return 0, err
	}
	var r result
	select {
	case r = <-split:
	case <-pctx.Done():
		ln.Close()
		r = <-split
		r.err = errors.Join(pctx.Err(), r.err)
	}
	if r.err != nil {
		return 0, fmt.Errorf("snapshot: splitting the migration stream: %w", r.err)
	}
	return r.st.Written, nil
}

// migrateOut migrates the VM's state to uri and waits until the migration
// completed. Commands go under pctx; the wait ends with ctx too, and a
// migration that did not complete is cancelled, waited for until QEMU says
// it ended, so that no migration is left running.
func (m *Provider) migrateOut(ctx, pctx context.Context, q *qemu.QMP, uri string) error {
	if err := q.Do(pctx, "migrate", map[string]any{"uri": uri}, nil); err != nil {
		return errors.Join(err, endMigration(pctx, q))
	}
	wctx, wcancel := context.WithCancel(pctx)
	defer wcancel()
	stop := context.AfterFunc(ctx, wcancel)
	defer stop()
	_, err := q.WaitMigration(wctx)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("snapshot: %w", ctx.Err())
	}
	return errors.Join(err, endMigration(pctx, q))
}

// endMigration cancels an outgoing migration and waits until QEMU reports
// it ended (cancelled, failed, or completed after all).
func endMigration(ctx context.Context, q *qemu.QMP) error {
	_ = q.Do(ctx, "migrate_cancel", nil, nil)
	return poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		var info qemu.MigrationInfo
		if err := q.Do(ctx, "query-migrate", nil, &info); err != nil {
			return false, err
		}
		switch info.Status {
		case "", "none", "cancelled", "failed", "completed":
			return true, nil
		}
		return false, nil
	})
}

// resume runs the VM again after stop: QEMU marks a migration completed
// before the VM reaches postmigrate, and refuses cont in between
// ("Migration is not finalized yet"), so it looks at the run state and
// sends cont until the VM runs, QEMU exits, or ctx ends.
func resume(ctx context.Context, vm *machine) error {
	q := vm.qmp
	var last error
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) {
		if vm.gone() {
			return false, fmt.Errorf("%w: the VM of %s exited", provider.ErrExited, vm.id)
		}
		st, err := q.Status(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		switch st {
		case "running":
			return true, nil
		case "finish-migrate":
			return false, nil // moving on to postmigrate
		}
		if err := q.Do(ctx, "cont", nil, nil); err != nil {
			last = err
			return false, nil
		}
		return false, nil // looked at again: running now?
	})
	if err != nil {
		return fmt.Errorf("%w: resume after the snapshot: %w (last: %v)", qemu.ErrQMP, err, last)
	}
	return nil
}
