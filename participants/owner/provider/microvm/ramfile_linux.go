//go:build linux

package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
)

// A snapshot's RAM file: what it is named, how a fork checks it, and how
// its memory goes back (docs/MICROVM.md, "Memory").

// allocated is a file's size on disk: a RAM file's holes are its guest's
// zero pages.
func allocated(fi os.FileInfo) int64 {
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		return min(sys.Blocks*512, fi.Size())
	}
	return fi.Size()
}

// The files of a snapshot: a full-copy snapshot's state holds its RAM;
// one with a RAM file has its devices in a file of another name, which an
// owner that knows only full copies does not find (it fails the fork
// instead of running the guest on zeroed memory).
const (
	fullStateFile = "state"
	devicesFile   = "devices"
	ramFile       = "ram"
)

// checkRAMFile checks a snapshot's RAM file: the guest's size, and at
// least the pages the snapshot wrote on disk (its blocks are allocated
// only once their data is, so a file a crash of the machine cut reads
// short here, never as zeros in the guest).
func checkRAMFile(path string, snap vmMeta) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("its RAM file: %w", err)
	}
	if fi.Size() != int64(snap.MemMiB)<<20 {
		return fmt.Errorf("its RAM file has %d bytes, not its guest's %d MiB", fi.Size(), snap.MemMiB)
	}
	if got, want := allocated(fi), snap.RAMPages*qemu.PageSize; got < want {
		return fmt.Errorf("its RAM file holds %d bytes on disk of the %d the snapshot wrote", got, want)
	}
	return nil
}

// dropRAMCache gives back the cached pages of a snapshot's RAM file that
// no fork maps, when a running fork keeps the file (unlinked) alive: the
// forks keep the pages they map, the rest need not wait for the kernel's
// reclaim. With no fork mapping it, the unlink alone frees every page,
// dirty ones unwritten, which the advice would first write back.
func (m *Provider) dropRAMCache(snapshotID string) {
	dir, _, release, err := m.snaps.Open(snapshotID)
	if err != nil {
		return
	}
	defer release()
	path := filepath.Join(dir, ramFile)
	if !m.mapped(path) {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		m.log.Debug().Err(err).Str("snapshot", snapshotID).Msg("microvm: the RAM file's cache stays until reclaimed")
	}
}

// useRAM counts a QEMU of this process that maps the RAM file at path
// (n = 1) or one that exited (n = -1).
func (m *Provider) useRAM(path string, n int) {
	m.ramMu.Lock()
	defer m.ramMu.Unlock()
	if m.ramUsers[path] += n; m.ramUsers[path] <= 0 {
		delete(m.ramUsers, path)
	}
}

// mapped tells whether a QEMU of this process maps the RAM file at path.
func (m *Provider) mapped(path string) bool {
	m.ramMu.Lock()
	defer m.ramMu.Unlock()
	return m.ramUsers[path] > 0
}
