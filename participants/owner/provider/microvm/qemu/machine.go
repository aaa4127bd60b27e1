package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The guest's network, as slirp gives it: the guest's address and the
// gateway, and the addresses its guestfwd rules listen on.
const (
	GuestAddr    = "10.0.2.15/24"
	GuestGateway = "10.0.2.2"
	// GuestNATS is where the guest reaches the NATS server.
	GuestNATS = "10.0.2.100:4222"
	// GuestUpstream is where the guest reaches the model upstream.
	GuestUpstream = "10.0.2.90:8080"
)

// Disk is one virtio block device of a machine.
type Disk struct {
	// ID is the block node's name (the same in a template and its forks).
	ID string
	// File is the image: qcow2 (its backing chain is opened from it) or raw.
	File   string
	Format string
	// ReadOnly opens it read-only.
	ReadOnly bool
}

// Machine is the QEMU command line of one microVM.
type Machine struct {
	// Accel is "tcg" or "kvm".
	Accel string
	// MemMiB is the guest's RAM.
	MemMiB int
	// RAMFile, when set, backs the guest's RAM with that file; RAMShared
	// maps it shared (a template writes its RAM there), else private
	// (copy-on-write: a fork of the template).
	RAMFile   string
	RAMShared bool
	// Kernel and Initrd boot the guest; Append is the kernel command line.
	Kernel, Initrd, Append string
	// Disks are attached in order (vda, vdb, ...).
	Disks []Disk
	// QMP and Control are the unix sockets of QMP and of the control
	// channel's virtio-serial port; Serial is the file the console goes to.
	QMP, Control, Serial string
	// Forwards are slirp guestfwd rules: guest address:port → host
	// address:port, each guest connection relayed by its own
	// `busybox nc` (a chardev target would be one connection for the
	// machine's life). Nothing else is reachable from the guest.
	Forwards map[string]string
	// Busybox is the host's busybox, whose nc relays Forwards.
	Busybox string
	// Incoming starts the machine waiting for a migration
	// (-incoming defer; QMP migrate-incoming then feeds it).
	Incoming bool
	// CPU is the CPU model under TCG (default qemu64; "max" has the
	// instructions a modern binary such as OpenCode's needs). KVM always
	// uses the host's.
	CPU string
}

// Args returns QEMU's arguments.
func (m Machine) Args() []string {
	accel := "tcg,thread=multi,tb-size=64"
	cpu := "qemu64"
	if m.CPU != "" {
		cpu = m.CPU
	}
	if m.Accel == "kvm" {
		accel, cpu = "kvm", "host"
	}
	mem := fmt.Sprintf("%dM", m.MemMiB)
	args := []string{
		"-accel", accel, "-cpu", cpu, "-smp", "1", "-m", mem,
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
	}
	machine := "microvm"
	if m.RAMFile != "" {
		share := "off"
		if m.RAMShared {
			share = "on"
		}
		args = append(args, "-object", fmt.Sprintf("memory-backend-file,id=ram0,size=%s,mem-path=%s,share=%s", mem, m.RAMFile, share))
	} else {
		args = append(args, "-object", "memory-backend-ram,id=ram0,size="+mem)
	}
	machine += ",memory-backend=ram0"
	args = append(args, "-M", machine,
		"-serial", "file:"+m.Serial,
		"-qmp", "unix:"+m.QMP+",server=on,wait=off",
		"-kernel", m.Kernel, "-initrd", m.Initrd, "-append", m.Append)
	for _, d := range m.Disks {
		ro := "off"
		if d.ReadOnly {
			ro = "on"
		}
		args = append(args,
			"-blockdev", fmt.Sprintf("driver=%s,node-name=%s,read-only=%s,file.driver=file,file.filename=%s,file.locking=off", d.Format, d.ID, ro, d.File),
			"-device", fmt.Sprintf("virtio-blk-device,drive=%s,id=%s-dev", d.ID, d.ID))
	}
	netdev := "user,id=n0,restrict=on"
	for _, g := range slices.Sorted(maps.Keys(m.Forwards)) {
		host, port, _ := strings.Cut(m.Forwards[g], ":")
		netdev += fmt.Sprintf(",guestfwd=tcp:%s-cmd:%s nc %s %s", g, strings.ReplaceAll(m.Busybox, ",", ",,"), host, port)
	}
	args = append(args, "-netdev", netdev, "-device", "virtio-net-device,netdev=n0,id=net0",
		"-device", "virtio-serial-device,id=vser0",
		"-chardev", "socket,id=ctl0,path="+m.Control+",server=on,wait=off",
		"-device", "virtserialport,chardev=ctl0,id=ctlport,name=stillpoint.ctl")
	if m.Incoming {
		args = append(args, "-incoming", "defer")
	}
	return args
}

// KernelArgs returns the guest kernel's command line: the console on the
// serial port, a panic powers off, the TSC's frequency given (without it
// the timer calibration can hang a boot under load), and the sp.*
// parameters the guest's init reads (docs/MICROVM.md): the root disk
// (vda), the harness disk (vdb, read-only at /opt/stillpoint/bin), the
// address and gateway, and the lease before the first identify (0: none).
func KernelArgs(tscKHz int64, bootLease time.Duration) string {
	return strings.Join([]string{"console=ttyS0", "panic=-1", "quiet", "loglevel=1",
		fmt.Sprintf("tsc_early_khz=%d", tscKHz), "tsc=reliable",
		"sp.root=/dev/vda", "sp.bin=/dev/vdb", "sp.ip=" + GuestAddr, "sp.gw=" + GuestGateway,
		"sp.lease=" + bootLease.String()}, " ")
}

// HostTSCKHz reads the host CPU's frequency in kHz from /proc/cpuinfo
// (the guest's TSC runs at the host's under both TCG and KVM).
func HostTSCKHz() (int64, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0, fmt.Errorf("/proc/cpuinfo: cpu MHz %q", v)
		}
		return int64(mhz * 1000), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("/proc/cpuinfo has no cpu MHz line")
}
