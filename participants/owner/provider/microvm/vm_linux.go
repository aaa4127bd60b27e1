//go:build linux

package microvm

import (
	"context"
	"fmt"
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
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// machine is a running QEMU of this process.
type machine struct {
	id     string
	dir    string
	pid    int
	cmd    *exec.Cmd
	qmp    *qemu.QMP
	ctl    *qemu.Control
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

// natsForward returns the guest address for generation gen and the host
// address of the server a member flag --nats-url names.
func natsForward(gen int, natsURL string) (guest, host, guestURL string, err error) {
	u, err := url.Parse(natsURL)
	if err != nil || u.Host == "" {
		return "", "", "", provider.InvalidField("spec.Init --nats-url", "%q is not a URL with a host", natsURL)
	}
	host = u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	if h := u.Hostname(); h == "localhost" {
		host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	if err := checkHostPort(host); err != nil {
		return "", "", "", provider.InvalidField("spec.Init --nats-url", "%q: %v", natsURL, err)
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
func (m *Provider) launch(ctx context.Context, spec provider.Spec, req vmctl.Request, snapshotID string) (*machine, error) {
	var parent vmMeta
	var state, ram string
	if snapshotID == "" {
		base, err := m.rootImage(ctx, spec.Image)
		if err != nil {
			return nil, err
		}
		harness, err := m.harnessImage(ctx, spec.Binds, spec.CopyIn)
		if err != nil {
			return nil, err
		}
		t, err := m.template(ctx, base, imageDigest(spec.Image), harness, harnessMount(spec.Binds))
		if err != nil {
			return nil, err
		}
		parent, state, ram = t.meta, filepath.Join(t.dir, "state"), filepath.Join(t.dir, "ram")
	} else {
		sdir, _, release, err := m.snaps.Open(snapshotID)
		if err != nil {
			return nil, err
		}
		defer release() // the snapshot stays until QEMU has read its state
		if parent, err = vmFile(sdir).Read(); err != nil {
			return nil, fmt.Errorf("%w: snapshotID %q is not a microvm snapshot: %w", provider.ErrInvalid, snapshotID, err)
		}
		state = filepath.Join(sdir, fullStateFile)
		// A snapshot's RAM file, mapped copy-on-write (one taken with
		// Config.FullCopy has its RAM in the state file).
		if parent.RAMFile {
			state, ram = filepath.Join(sdir, devicesFile), filepath.Join(sdir, ramFile)
			if err := checkRAMFile(ram, parent); err != nil {
				return nil, fmt.Errorf("%w: snapshot %q: %w", provider.ErrInvalid, snapshotID, err)
			}
		}
	}
	if parent.MemMiB != m.cfg.MemMiB {
		return nil, provider.InvalidField("MemMiB", "the snapshot's guest has %d MiB, this provider %d", parent.MemMiB, m.cfg.MemMiB)
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
		fwd[qemu.GuestUpstream] = m.cfg.Upstream
	}
	dir := m.boxes.Dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	top := m.layer(newLayerName())
	meta := vmMeta{Chain: append([]string{top}, parent.Chain...), Base: parent.Base, Image: parent.Image, Harness: parent.Harness, HarnessMount: parent.HarnessMount, CPU: parent.CPU,
		Gen: gen, MemMiB: m.cfg.MemMiB, NATSHost: hostNATS}
	// The reference first, then the layer: the collector never sees a
	// layer that nothing holds but that someone is about to use.
	if err := vmFile(dir).Write(meta); err != nil {
		return nil, err
	}
	if err := qemu.Overlay(ctx, m.assets.QEMUImg, parent.Chain[0], "qcow2", top); err != nil {
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
func (m *Provider) machineFor(id, dir string, meta vmMeta, fwd map[string]string) qemu.Machine {
	args := qemu.KernelArgs(m.tscKHz, 2*time.Minute)
	if meta.HarnessMount != "" {
		args += " sp.bindir=" + meta.HarnessMount
	}
	return qemu.Machine{
		Accel: m.accel, MemMiB: meta.MemMiB,
		Kernel: m.assets.Kernel, Initrd: m.initrdPath(), Append: args,
		Disks: []qemu.Disk{
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
func (m *Provider) startQEMU(id, dir string, mc qemu.Machine, meta vmMeta, dieWithOwner bool) (*machine, error) {
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
	if mc.RAMFile != "" && !mc.RAMShared {
		m.useRAM(mc.RAMFile, 1)
		go func() { // ends with QEMU, once reaped
			<-vm.reaped
			m.useRAM(mc.RAMFile, -1)
		}()
	}
	meta.PID = vm.pid
	if st, _, err := procfs.ReadStat(vm.pid, nil); err == nil {
		meta.Start = st.Start
	}
	vm.meta = meta
	if err := vmFile(dir).Write(meta); err != nil {
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
	if vm.qmp, err = qemu.DialQMP(qctx, mc.QMP); err != nil {
		return vm, fmt.Errorf("%w (qemu: %s)", err, tailFile(filepath.Join(dir, "qemu.log"), 1024))
	}
	return vm, nil
}

// reap waits for QEMU's exit, kills what is left in its cgroup (the nc
// relays of its guestfwd rules), and reaps it.
func (vm *machine) reap() {
	procs.WaitExit(vm.pid)
	close(vm.exited)
	if vm.cg != "" {
		_ = vm.cg.Kill()
	}
	_ = vm.cmd.Wait()
	close(vm.reaped)
}

// restore loads state into an incoming VM and runs it: the device state
// of the template or of a snapshot (the VM maps their RAM file
// copy-on-write), or a full-copy snapshot's RAM and devices.
// x-ignore-shared is on in every VM (a stream states it and the
// destination must match); it skips only RAM mapped shared, the
// template's, so the stream of a fork's snapshot carries all of its RAM,
// which the snapshot splits into its RAM file.
func (m *Provider) restore(ctx context.Context, vm *machine, state string) error {
	if err := vm.qmp.SetIgnoreShared(ctx, true); err != nil {
		return err
	}
	if err := vm.qmp.Do(ctx, "migrate-incoming", map[string]any{"uri": qemu.LoadURI(state)}, nil); err != nil {
		return err
	}
	st, err := vm.qmp.WaitStatus(ctx, "inmigrate")
	if err != nil {
		return err
	}
	if st != "paused" && st != "running" {
		return fmt.Errorf("%w: after the incoming migration the VM is %q (qemu: %s)", qemu.ErrQMP, st, tailFile(filepath.Join(vm.dir, "qemu.log"), 1024))
	}
	if err := vm.qmp.Do(ctx, "cont", nil, nil); err != nil {
		return err
	}
	vm.ctl, err = qemu.DialControl(ctx, vm.ctlSock, m.onNotice(vm.id, vm))
	return err
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
