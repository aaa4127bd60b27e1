//go:build linux

package provider

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// vmMeta is the vm.json of a sandbox, a snapshot or a template: what its
// disk is made of and, for a running VM, which QEMU runs it.
type vmMeta struct {
	// Chain is the disk's qcow2 layers (paths: under <state>/layers, or a
	// template's), top first; the bottom one's backing file is Base.
	Chain []string `json:"chain"`
	// Pending is a layer being made (a snapshot's new top): kept by the
	// collector although no chain holds it yet.
	Pending string `json:"pending,omitempty"`
	// Base and Harness are the raw root and harness images (cache/images).
	Base    string `json:"base"`
	Harness string `json:"harness"`
	// HarnessMount is where the guest mounts the harness image, when not
	// at BinDirInGuest (harnessMount): the template's command line, which
	// its forks share.
	HarnessMount string `json:"harness_mount,omitempty"`
	// CPU is the template's CPU model (MicroVMConfig.CPU), which its forks
	// share ("": the default).
	CPU string `json:"cpu,omitempty"`
	// Gen picks the guest address of NATS (10.0.2.(100+Gen)): a fork's
	// differs from its parent's, so the parent's connection, restored in
	// the fork, never reaches the server.
	Gen    int `json:"gen"`
	MemMiB int `json:"mem_mib"`
	// PID and Start name the QEMU process (Start: field 22 of its stat).
	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// NATSHost is the host address NATS connections are relayed to.
	NATSHost string `json:"nats_host,omitempty"`
	// Sandbox is the sandbox a snapshot was taken of.
	Sandbox string `json:"sandbox,omitempty"`
}

func readVMMeta(dir string) (vmMeta, error) {
	var m vmMeta
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	return m, err
}

func writeVMMeta(dir string, m vmMeta) error { return writeJSON(filepath.Join(dir, "vm.json"), m) }

// machine is a running QEMU of this process.
type machine struct {
	id     string
	dir    string
	pid    int
	cmd    *exec.Cmd
	qmp    *microvm.QMP
	ctl    *microvm.Control
	exited chan struct{} // closed once QEMU exited (not yet reaped)
	reaped chan struct{}
	// cg is the QEMU's cgroup ("" without one): it holds QEMU and the
	// relays of its guestfwd rules, which libslirp starts in sessions of
	// their own, out of reach of a kill of QEMU's process group.
	cg   cgroup.Dir
	node string // the block node of the disk's top layer
	// ctlSock is the control channel's socket.
	ctlSock string
	// hello is the guest's answer to its identify or reidentify.
	hello vmctl.Hello
	// initExited says the guest's plain init exited (vmctl.EventInit, or
	// Hello.InitExited): Exec refuses with ErrExited, as for the other
	// providers' sandboxes whose init exited.
	initExited atomic.Bool

	mu   sync.Mutex // guards meta
	meta vmMeta

	stopMu    sync.Mutex // serialises stop; guards stopLease and closed
	stopLease context.CancelFunc
	leaseDone chan struct{}
	closed    bool // the channels are closed
}

func (vm *machine) gone() bool {
	select {
	case <-vm.exited:
		return true
	default:
		return false
	}
}

// call sends a request on the control channel; a VM that exits meanwhile
// ends the call.
func (vm *machine) call(ctx context.Context, req vmctl.Request) (*vmctl.Response, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // ends with the call: cancel closes ctx.Done
		select {
		case <-vm.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := vm.ctl.Call(ctx, req)
	if err != nil && vm.gone() {
		return nil, fmt.Errorf("%w: the VM of %s exited: %w", ErrExited, vm.id, err)
	}
	return resp, err
}

// natsForward returns the guest address for generation gen and the host
// address of the server a member flag --nats-url names.
func natsForward(gen int, natsURL string) (guest, host, guestURL string, err error) {
	u, err := url.Parse(natsURL)
	if err != nil || u.Host == "" {
		return "", "", "", invalid("spec.Init --nats-url", "%q is not a URL with a host", natsURL)
	}
	host = u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	if h := u.Hostname(); h == "localhost" {
		host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	if err := checkHostPort(host); err != nil {
		return "", "", "", invalid("spec.Init --nats-url", "%q: %v", natsURL, err)
	}
	guest = fmt.Sprintf("10.0.2.%d:4222", 100+gen%100)
	gu := *u
	gu.Host = guest
	return guest, host, gu.String(), nil
}

// checkHostPort accepts host:port where host is an IP address or a DNS
// name and port a number: it goes into QEMU's -netdev option, where a
// comma would start another option (restrict=off among them).
func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if host == "" || strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != "" {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	return nil
}

// launch starts spec's VM: a fork of the template of its images, or of
// snapshotID, then identified (or re-identified) over the control channel.
// It returns the machine even when it fails later, so that the teardown
// stops it.
func (m *MicroVM) launch(ctx context.Context, spec Spec, req vmctl.Request, snapshotID string) (*machine, error) {
	var parent vmMeta
	var state, ram string
	if snapshotID == "" {
		base, err := m.baseImage(ctx)
		if err != nil {
			return nil, err
		}
		harness, err := m.harnessImage(ctx, spec.Binds, spec.CopyIn)
		if err != nil {
			return nil, err
		}
		t, err := m.template(ctx, base, harness, harnessMount(spec.Binds))
		if err != nil {
			return nil, err
		}
		parent, state, ram = t.meta, filepath.Join(t.dir, "state"), filepath.Join(t.dir, "ram")
	} else {
		sdir, _, release, err := m.snaps.open(snapshotID)
		if err != nil {
			return nil, err
		}
		defer release() // the snapshot stays until QEMU has read its state
		if parent, err = readVMMeta(sdir); err != nil {
			return nil, fmt.Errorf("%w: snapshotID %q is not a microvm snapshot: %w", ErrInvalid, snapshotID, err)
		}
		state = filepath.Join(sdir, "state")
		if spec.Epoch == 0 && req.Run != "" {
			return nil, invalid("spec.Epoch", "a fork of a microvm snapshot whose sandboxd runs on needs the restore's epoch")
		}
	}
	if parent.MemMiB != m.cfg.MemMiB {
		return nil, invalid("MemMiB", "the snapshot's guest has %d MiB, this provider %d", parent.MemMiB, m.cfg.MemMiB)
	}
	gen := parent.Gen + 1
	fwd := map[string]string{}
	var guestURL, hostNATS string
	if req.NATSURL != "" {
		guestNATS, host, gurl, err := natsForward(gen, req.NATSURL)
		if err != nil {
			return nil, err
		}
		fwd[guestNATS], guestURL, hostNATS = host, gurl, host
	}
	if m.cfg.Upstream != "" {
		fwd[microvm.GuestUpstream] = m.cfg.Upstream
	}
	dir := m.boxes.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	top := m.layer(newLayerName())
	meta := vmMeta{Chain: append([]string{top}, parent.Chain...), Base: parent.Base, Harness: parent.Harness, HarnessMount: parent.HarnessMount, CPU: parent.CPU,
		Gen: gen, MemMiB: m.cfg.MemMiB, NATSHost: hostNATS}
	// The reference first, then the layer: the collector never sees a
	// layer that nothing holds but that someone is about to use.
	if err := writeVMMeta(dir, meta); err != nil {
		return nil, err
	}
	if err := microvm.Overlay(ctx, m.assets.QEMUImg, parent.Chain[0], "qcow2", top); err != nil {
		return nil, err
	}
	mc := m.machineFor(spec.ID, dir, meta, fwd)
	mc.RAMFile, mc.Incoming = ram, true
	t0 := time.Now()
	vm, err := m.startQEMU(spec.ID, dir, mc, meta, false)
	if err != nil {
		return vm, err
	}
	tQEMU := time.Now()
	if err := m.restore(ctx, vm, state); err != nil {
		return vm, fmt.Errorf("restore: %w (qemu: %s)", err, tailFile(filepath.Join(dir, "qemu.log"), 1024))
	}
	req.NATSURL = guestURL
	req.Entropy = entropy()
	req.Wall = time.Now().UTC()
	req.LeaseMS = m.cfg.Lease.Milliseconds()
	req.Op = vmctl.OpIdentify
	if snapshotID == "" {
		req.SetClock = true // the template's clock stopped when it was made
	} else {
		req.Op, req.Epoch = vmctl.OpReidentify, spec.Epoch
		if req.Run == "" {
			req.Init = nil // it runs on from the snapshot
		}
	}
	tRestore := time.Now()
	hello, err := vm.ctl.Hello(ctx)
	if err != nil {
		return vm, fmt.Errorf("hello: %w", err)
	}
	tHello := time.Now()
	if hello.InitExited {
		vm.initExited.Store(true) // a fork of a snapshot taken after the init exited
	}
	resp, err := vm.call(ctx, req)
	if err != nil {
		return vm, fmt.Errorf("%s %s: %w (console: %s)", req.Op, spec.ID, err, tailFile(filepath.Join(dir, "console.log"), 2048))
	}
	m.log.Debug().Str("sandbox", spec.ID).Str("state", string(hello.State)).Str("op", string(req.Op)).
		Dur("qemu", tQEMU.Sub(t0)).Dur("restore", tRestore.Sub(tQEMU)).Dur("hello", tHello.Sub(tRestore)).
		Dur("identify", time.Since(tHello)).Msg("microvm: guest running and identified")
	if resp.Hello != nil {
		vm.hello = *resp.Hello
	}
	m.startLease(vm)
	return vm, nil
}

// machineFor returns the command line every VM of a template shares (the
// same devices in the same order), with its own sockets and console.
func (m *MicroVM) machineFor(id, dir string, meta vmMeta, fwd map[string]string) microvm.Machine {
	args := microvm.KernelArgs(m.tscKHz, 2*time.Minute)
	if meta.HarnessMount != "" {
		args += " sp.bindir=" + meta.HarnessMount
	}
	return microvm.Machine{
		Accel: m.accel, MemMiB: meta.MemMiB,
		Kernel: m.assets.Kernel, Initrd: m.initrdPath(), Append: args,
		Disks: []microvm.Disk{
			{ID: "root", File: meta.Chain[0], Format: "qcow2"},
			{ID: "harness", File: meta.Harness, Format: "raw", ReadOnly: true},
		},
		QMP: m.sock(id, "q"), Control: m.sock(id, "c"), Serial: filepath.Join(dir, "console.log"),
		Forwards: fwd, Busybox: m.assets.Busybox, CPU: meta.CPU,
	}
}

// startQEMU starts QEMU in a session of its own (an owner that dies does
// not take it along: the lease does), records it in dir's vm.json and
// connects to its QMP socket. With dieWithOwner (a template's QEMU, which
// is paused while it is saved, when its lease cannot run) it gets SIGKILL
// when this process dies.
func (m *MicroVM) startQEMU(id, dir string, mc microvm.Machine, meta vmMeta, dieWithOwner bool) (*machine, error) {
	// The sockets' directory stays until QEMU has made its sockets in it.
	m.sockMu.RLock()
	defer m.sockMu.RUnlock()
	if err := os.MkdirAll(m.socks, 0o700); err != nil {
		return nil, err
	}
	for _, s := range []string{mc.QMP, mc.Control} {
		_ = os.Remove(s)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cg, err := m.makeVMCgroup(id)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(m.assets.QEMU, mc.Args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cg != "" {
		fd, err := cg.OpenFD()
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if dieWithOwner {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		// Pdeathsig follows the thread that forks: locked, it is not one
		// the runtime ends meanwhile.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	vm := &machine{id: id, dir: dir, pid: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{}), reaped: make(chan struct{}), node: "root", meta: meta, ctlSock: mc.Control, cg: cg}
	go vm.reap() // ended by QEMU's exit, which stop brings about
	meta.PID = vm.pid
	if st, _, err := procfs.ReadStat(vm.pid, nil); err == nil {
		meta.Start = st.Start
	}
	vm.meta = meta
	if err := writeVMMeta(dir, meta); err != nil {
		return vm, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qctx, qcancel := context.WithCancel(ctx)
	defer qcancel()
	go func() { // ends with this function: qcancel
		select {
		case <-vm.exited:
			qcancel()
		case <-qctx.Done():
		}
	}()
	if vm.qmp, err = microvm.DialQMP(qctx, mc.QMP); err != nil {
		return vm, fmt.Errorf("%w (qemu: %s)", err, tailFile(filepath.Join(dir, "qemu.log"), 1024))
	}
	return vm, nil
}

// reap waits for QEMU's exit, kills what is left in its cgroup (the nc
// relays of its guestfwd rules), and reaps it.
func (vm *machine) reap() {
	waitExit(vm.pid)
	close(vm.exited)
	if vm.cg != "" {
		_ = vm.cg.Kill()
	}
	_ = vm.cmd.Wait()
	close(vm.reaped)
}

// restore loads state into an incoming VM and runs it: the template's
// device state (its RAM is the shared file) or a snapshot's RAM and
// devices. x-ignore-shared is on in every VM (a stream states it and the
// destination must match); it skips only RAM mapped shared, the
// template's, so a snapshot of a fork carries all of its RAM.
func (m *MicroVM) restore(ctx context.Context, vm *machine, state string) error {
	if err := vm.qmp.SetIgnoreShared(ctx, true); err != nil {
		return err
	}
	if err := vm.qmp.Do(ctx, "migrate-incoming", map[string]any{"uri": microvm.LoadURI(state)}, nil); err != nil {
		return err
	}
	st, err := vm.qmp.WaitStatus(ctx, "inmigrate")
	if err != nil {
		return err
	}
	if st != "paused" && st != "running" {
		return fmt.Errorf("%w: after the incoming migration the VM is %q (qemu: %s)", microvm.ErrQMP, st, tailFile(filepath.Join(vm.dir, "qemu.log"), 1024))
	}
	if err := vm.qmp.Do(ctx, "cont", nil, nil); err != nil {
		return err
	}
	vm.ctl, err = microvm.DialControl(ctx, vm.ctlSock, m.onNotice(vm.id, vm))
	return err
}

func (m *MicroVM) onNotice(id string, vm *machine) func(vmctl.Notice) {
	return func(n vmctl.Notice) {
		ev := m.log.Debug()
		switch n.Event {
		case vmctl.EventPowerOff:
			ev = m.log.Warn()
		case vmctl.EventInit:
			vm.initExited.Store(true)
		}
		ev.Str("sandbox", id).Str("event", string(n.Event)).Str("why", n.Why).Str("msg", n.Msg).Msg("microvm: guest notice")
	}
}

// startLease renews the guest's lease every third of it until stop.
func (m *MicroVM) startLease(vm *machine) {
	ctx, cancel := context.WithCancel(context.Background())
	vm.stopLease, vm.leaseDone = cancel, make(chan struct{})
	every := m.cfg.Lease / 3
	go func() { // stopped by vm.stop: stopLease, then <-leaseDone
		defer close(vm.leaseDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-vm.exited:
				return
			case <-t.C:
			}
			cctx, ccancel := context.WithTimeout(ctx, every)
			_, err := vm.call(cctx, vmctl.Request{Op: vmctl.OpLease, UntilMS: m.cfg.Lease.Milliseconds()})
			ccancel()
			if err != nil && ctx.Err() == nil {
				m.log.Warn().Err(err).Str("sandbox", vm.id).Msg("microvm: lease renewal failed")
			}
		}
	}()
}

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
			return fmt.Errorf("%w: qemu %d of %s did not exit within %s", ErrLeftover, vm.pid, vm.id, timeout)
		case <-ctx.Done():
			return fmt.Errorf("%w: qemu %d of %s not reaped yet: %w", ErrLeftover, vm.pid, vm.id, ctx.Err())
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
	same := func() bool {
		st, _, err := procfs.ReadStat(meta.PID, nil)
		return err == nil && st.Start == meta.Start && st.State != 'Z'
	}
	if !same() {
		return nil
	}
	_ = syscall.Kill(-meta.PID, syscall.SIGKILL)
	_ = syscall.Kill(meta.PID, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll.Until(ctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) { return !same(), nil }); err != nil {
		return fmt.Errorf("%w: qemu %d left by an earlier process did not exit", ErrLeftover, meta.PID)
	}
	return nil
}

// snapshotInto takes the snapshot into dst: vm.json and the state file.
//
// From QMP stop on, the VM is paused and its guest's lease cannot fire, so
// everything up to the VM running again is done under a context of its
// own (bounded by StartTimeout, not ended by ctx): the end of ctx ends
// only the wait for the migration, which is then cancelled in QEMU (a
// migration left running would pause the VM again when it completes, and
// refuse the next snapshot), and the VM is resumed in every case (resume).
func (m *MicroVM) snapshotInto(ctx context.Context, vm *machine, dst string) (copyStats, time.Duration, error) {
	var st copyStats
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, _ = vm.call(sctx, vmctl.Request{Op: vmctl.OpSync}) // best effort: stop flushes the disk anyway
	cancel()
	vm.mu.Lock()
	defer vm.mu.Unlock()
	name := newLayerName()
	top := m.layer(name)
	meta := vm.meta
	meta.Pending = top
	if err := writeVMMeta(vm.dir, meta); err != nil {
		return st, 0, err
	}
	q := vm.qmp
	if err := q.SetFastMigration(ctx); err != nil {
		return st, 0, err
	}
	if err := ctx.Err(); err != nil {
		return st, 0, err
	}
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	defer pcancel()
	t0 := time.Now()
	err := q.Do(pctx, "stop", nil, nil)
	frozen := meta.Chain
	if err == nil {
		node := "n" + name[:8]
		err = q.Do(pctx, "blockdev-snapshot-sync", map[string]any{"node-name": vm.node, "snapshot-file": top,
			"snapshot-node-name": node, "format": "qcow2"}, nil)
		if err == nil {
			vm.node = node
			meta.Chain = append([]string{top}, meta.Chain...)
			err = m.migrateOut(ctx, pctx, q, filepath.Join(dst, "state"))
		}
	}
	// Whether stop, the disk's snapshot or the migration failed, the VM
	// may be paused: it runs again before this returns.
	rerr := resume(pctx, vm)
	took := time.Since(t0)
	meta.Pending = ""
	vm.meta = meta
	err = errors.Join(err, rerr, writeVMMeta(vm.dir, meta))
	if rerr != nil {
		m.log.Error().Err(rerr).Str("sandbox", vm.id).Msg("microvm: the VM could not be resumed after a snapshot: it stays paused until stopped")
	}
	if err != nil {
		return st, took, err
	}
	snap := vmMeta{Chain: frozen, Base: meta.Base, Harness: meta.Harness, HarnessMount: meta.HarnessMount, CPU: meta.CPU,
		Gen: meta.Gen, MemMiB: meta.MemMiB, Sandbox: vm.id}
	if err := writeVMMeta(dst, snap); err != nil {
		return st, took, err
	}
	if fi, err := os.Stat(filepath.Join(dst, "state")); err == nil {
		st.bytes, st.entries = fi.Size(), 1
	}
	return st, took, nil
}

// migrateOut writes the VM's state to the file at path and waits until
// the migration completed. Commands go under pctx; the wait ends with ctx
// too, and a migration that did not complete is cancelled, waited for
// until QEMU says it ended, so that no migration is left running.
func (m *MicroVM) migrateOut(ctx, pctx context.Context, q *microvm.QMP, path string) error {
	if err := q.Do(pctx, "migrate", map[string]any{"uri": microvm.SaveURI(path)}, nil); err != nil {
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
func endMigration(ctx context.Context, q *microvm.QMP) error {
	_ = q.Do(ctx, "migrate_cancel", nil, nil)
	return poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		var info microvm.MigrationInfo
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
			return false, fmt.Errorf("%w: the VM of %s exited", ErrExited, vm.id)
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
		return fmt.Errorf("%w: resume after the snapshot: %w (last: %v)", microvm.ErrQMP, err, last)
	}
	return nil
}

// layer is the path of a disk layer.
func (m *MicroVM) layer(name string) string { return filepath.Join(m.layers, name+".qcow2") }

func newLayerName() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

// gc removes the disk layers no sandbox, snapshot or template holds. It
// lists the layers before it reads who holds them, and a layer is made
// only after a vm.json names it: a layer made meanwhile is not listed.
func (m *MicroVM) gc() error {
	m.gcMu.Lock()
	defer m.gcMu.Unlock()
	ents, err := os.ReadDir(m.layers)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, parent := range []string{filepath.Join(m.cfg.StateDir, "sandboxes"), filepath.Join(m.cfg.StateDir, "snapshots")} {
		dirs, err := os.ReadDir(parent)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, d := range dirs {
			m.holdLayers(held, filepath.Join(parent, d.Name()))
		}
	}
	var errs []error
	for _, e := range ents {
		if held[filepath.Join(m.layers, e.Name())] {
			continue
		}
		if err := os.Remove(filepath.Join(m.layers, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// holdLayers marks the layers dir's vm.json names, also in a snapshot
// being made or deleted (".tmp-" and ".del-" directories hold one level
// more).
func (m *MicroVM) holdLayers(held map[string]bool, dir string) {
	meta, err := readVMMeta(dir)
	if err != nil {
		subs, _ := os.ReadDir(dir)
		for _, s := range subs {
			if s.IsDir() {
				if meta, err := readVMMeta(filepath.Join(dir, s.Name())); err == nil {
					markChain(held, meta)
				}
			}
		}
		return
	}
	markChain(held, meta)
}

func markChain(held map[string]bool, meta vmMeta) {
	for _, l := range meta.Chain {
		held[l] = true
	}
	if meta.Pending != "" {
		held[meta.Pending] = true
	}
}

// tailFile returns the last n bytes of a file, for error messages.
func tailFile(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// vmCgroup is the cgroup of VM id's QEMU ("" when the provider runs
// without cgroups): <cgroup v2>/stillpoint-vms/<state hash>/<id hash>, a
// path a restarted provider finds again.
func (m *MicroVM) vmCgroup(id string) cgroup.Dir {
	if m.cgroups == "" {
		return ""
	}
	return m.cgroups.Child(shortHash(id))
}

// makeVMCgroup makes the cgroup for VM id's QEMU, emptying one an earlier
// process left. It is called with sockMu held shared: the parent is
// removed under it held exclusively (clearVMCgroup).
func (m *MicroVM) makeVMCgroup(id string) (cgroup.Dir, error) {
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
func (m *MicroVM) emptyCgroup(ctx context.Context, cg cgroup.Dir) error {
	if _, err := os.Stat(string(cg)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := cg.Kill(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: kill cgroup %s: %w", ErrLeftover, cg, err)
	}
	ok, err := cg.WaitEvents(ctx, time.Now().Add(m.cfg.StopTimeout), func(e cgroup.Events) bool { return !e.Populated })
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !ok {
		pids, _ := cg.AllProcs()
		return fmt.Errorf("%w: cgroup %s still holds %v: %v", ErrLeftover, cg, pids, err)
	}
	return nil
}

// clearVMCgroup empties VM id's cgroup (QEMU, its relays) and removes it,
// and the parent once no VM's cgroup is left in it.
func (m *MicroVM) clearVMCgroup(ctx context.Context, id string) error {
	cg := m.vmCgroup(id)
	if cg == "" {
		return nil
	}
	if err := m.emptyCgroup(ctx, cg); err != nil {
		return err
	}
	if err := cg.Remove(ctx, time.Now().Add(m.cfg.StopTimeout)); err != nil {
		return fmt.Errorf("%w: %w", ErrLeftover, err)
	}
	m.sockMu.Lock()
	defer m.sockMu.Unlock()
	if err := unix.Rmdir(string(m.cgroups)); err != nil && err != unix.ENOENT && err != unix.EBUSY && err != unix.ENOTEMPTY {
		return fmt.Errorf("%w: rmdir %s: %w", ErrLeftover, m.cgroups, err)
	}
	return nil
}
