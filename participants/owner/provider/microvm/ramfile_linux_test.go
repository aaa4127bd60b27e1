//go:build linux

package microvm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// A snapshot's RAM is a file of its own, sparse where the guest's pages
// are zero, beside a state file of devices only. A fork maps it
// copy-on-write: it holds in anonymous memory only the pages it wrote,
// and reads the rest from the file's cache. Deleting the snapshot while
// the fork runs gives back the file's cached pages that no fork maps,
// and the fork runs on.
func TestMicroVMForkMapsItsSnapshotsRAM(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	ctx := context.Background()
	providertest.Start(t, m, provider.Spec{ID: "a", Init: counterInit, Workdir: "/work"})
	waitCounter(t, m, "a", 3)
	if _, err := m.Snapshot(ctx, "a", "s1"); err != nil {
		t.Fatal(err)
	}
	dir, _, release, err := m.snaps.Open("s1")
	if err != nil {
		t.Fatal(err)
	}
	release()
	meta, err := vmFile(dir).Read()
	if err != nil || !meta.RAMFile || meta.RAMPages == 0 {
		t.Fatalf("snapshot vm.json %+v %v: want its RAM in a file, and the pages written", meta, err)
	}
	if _, err := os.Stat(filepath.Join(dir, fullStateFile)); err == nil {
		t.Fatal("the snapshot has a full-copy state file: an owner of that design would fork it on zeroed RAM")
	}
	ram, err := os.Open(filepath.Join(dir, ramFile))
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	fi, _ := ram.Stat()
	st, _ := os.Stat(filepath.Join(dir, devicesFile))
	guest := int64(m.cfg.MemMiB) << 20
	if fi.Size() != guest || allocated(fi) >= guest || allocated(fi) < 16<<20 {
		t.Fatalf("RAM file of %d bytes, %d allocated: want the guest's %d, sparse where its pages are zero", fi.Size(), allocated(fi), guest)
	}
	if st.Size() > 1<<20 {
		t.Fatalf("state file of %d bytes: want the devices and the small RAM blocks only", st.Size())
	}
	sb, err := m.Fork(ctx, "s1", provider.Spec{ID: "f", Init: counterInit, Workdir: "/work", Epoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := counter(t, m, "f")
	waitCounter(t, m, "f", last+3)
	rss, anon := ramMapping(t, sb.InitPID)
	t.Logf("state file %d KiB; RAM file %d MiB allocated; the fork maps %d MiB of it, %d MiB of them copied", st.Size()>>10, allocated(fi)>>20, rss>>20, anon>>20)
	if anon > allocated(fi)/4 {
		t.Errorf("the fork holds %d MiB of anonymous copies of its RAM file's %d MiB: want only the pages it wrote", anon>>20, allocated(fi)>>20)
	}
	// The snapshot's writes reach the disk (the kernel's writeback would,
	// within its expiry): only clean pages can be given back.
	if err := ram.Sync(); err != nil {
		t.Fatal(err)
	}
	before := resident(t, ram)
	if err := m.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	after := resident(t, ram)
	rss, anon = ramMapping(t, sb.InitPID)
	t.Logf("the RAM file's cache: %d MiB before the snapshot's deletion, %d MiB after; the fork maps %d MiB of it", before>>20, after>>20, (rss-anon)>>20)
	// Not every unmapped page goes at once (the kernel keeps those it
	// holds a reference to for a moment, as readahead does), but without
	// the deletion's advice none would: the cache stays as it was.
	if mapped := rss - anon; before-after < (before-mapped)/2 {
		t.Errorf("after the deletion %d bytes of the RAM file stay cached (%d before): want most of the %d the fork does not map given back", after, before, before-mapped)
	}
	last, _ = counter(t, m, "f")
	waitCounter(t, m, "f", last+3) // the fork runs on from the unlinked file
}

// resident counts the bytes of f in the page cache.
func resident(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	vec := make([]byte, (len(b)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(os.Getpagesize())
}

// ramMapping reads from QEMU's smaps its mapping of a RAM file: its
// resident bytes and how many of them are anonymous (copied on write).
func ramMapping(t *testing.T, pid int) (rss, anon int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in, found := false, false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			path := strings.Join(fields[5:], " ")
			in = strings.HasSuffix(strings.TrimSuffix(path, " (deleted)"), "/ram")
			found = found || in
			continue
		}
		if !in || len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			rss += kb << 10
		case "Anonymous:":
			anon += kb << 10
		}
	}
	if !found {
		t.Fatalf("QEMU %d maps no RAM file", pid)
	}
	return rss, anon
}

// A RAM file is checked before a fork maps it: of the guest's size, and
// holding on disk every page the snapshot wrote; a file a crash of the
// machine cut (its blocks never allocated: holes, which the guest would
// read as zeros) or lost is refused, naming what is wrong.
func TestCheckRAMFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), ramFile)
	snap := vmMeta{MemMiB: 1, RAMPages: 8}
	if err := checkRAMFile(path, snap); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("a missing RAM file: %v", err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(2 << 20); err != nil {
		t.Fatal(err)
	}
	if err := checkRAMFile(path, snap); err == nil || !strings.Contains(err.Error(), "not its guest's 1 MiB") {
		t.Fatalf("a RAM file of another size: %v", err)
	}
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := checkRAMFile(path, snap); err == nil || !strings.Contains(err.Error(), "on disk of the 32768 the snapshot wrote") {
		t.Fatalf("a RAM file of holes: %v", err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 8*os.Getpagesize()), 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := checkRAMFile(path, snap); err != nil {
		t.Fatalf("a RAM file with its pages: %v", err)
	}
}
