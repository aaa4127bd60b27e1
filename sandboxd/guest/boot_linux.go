package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// Busybox is the initramfs's busybox, which Boot runs for modprobe and ip
// before it switches root.
const Busybox = "/bin/busybox"

// ModulesFile lists the kernel modules Boot loads, one name a line, in
// order.
const ModulesFile = "/etc/stillpoint/modules"

// deviceWait bounds the wait for a disk or a network device to appear
// once its driver is loaded.
const deviceWait = 20 * time.Second

// BootConfig is what the kernel command line says about the guest
// (ParseCmdline); the zero value of a field is its default.
type BootConfig struct {
	// Root is the root disk (sp.root, default /dev/vda): ext4, mounted
	// read-write and switched into.
	Root string
	// Bin is the read-only disk of the harness binaries (sp.bin, default
	// /dev/vdb; "none" for none), mounted at BinDir in the root.
	Bin string
	// BinDir is where Bin is mounted (sp.bindir, default
	// /opt/stillpoint/bin).
	BinDir string
	// IP is eth0's address (sp.ip, default 10.0.2.15/24; "none" leaves the
	// network down) and GW the default gateway (sp.gw, default 10.0.2.2).
	IP, GW string
	// Lease is the lease from boot until the first renewal (sp.lease, a Go
	// duration; 0, the default, is none: a template waits for its host).
	Lease time.Duration
	// Port is the control port's name (sp.ctl, default vmctl.PortName).
	Port string
}

// ParseCmdline reads the sp.* parameters of a kernel command line, with
// defaults for those it does not set.
func ParseCmdline(cmdline string) (BootConfig, error) {
	c := BootConfig{Root: "/dev/vda", Bin: "/dev/vdb", BinDir: "/opt/stillpoint/bin", IP: "10.0.2.15/24", GW: "10.0.2.2", Port: "stillpoint.ctl"}
	var errs []error
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(k, "sp.") {
			continue
		}
		switch k {
		case "sp.root":
			c.Root = v
		case "sp.bin":
			c.Bin = v
		case "sp.bindir":
			c.BinDir = v
		case "sp.ip":
			c.IP = v
		case "sp.gw":
			c.GW = v
		case "sp.ctl":
			c.Port = v
		case "sp.lease":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("guest: sp.lease=%s: want a duration such as 60s", v))
			}
			c.Lease = d
		}
	}
	if !filepath.IsAbs(c.BinDir) {
		errs = append(errs, fmt.Errorf("guest: sp.bindir=%s: must be absolute", c.BinDir))
	}
	return c, errors.Join(errs...)
}

// EarlyMounts mounts /proc, /sys and /dev (devtmpfs) in the initramfs, so
// that the init has a console and its command line; Boot comes after it.
func EarlyMounts() error {
	for _, m := range []struct{ src, dir, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := mount(m.src, m.dir, m.fstype, 0, ""); err != nil {
			return err
		}
	}
	return nil
}

// Boot makes the initramfs's PID 1 a sandbox's init, after EarlyMounts: it
// loads the modules of ModulesFile, brings up lo and eth0 (slirp's fixed
// address and gateway), mounts the root disk and the read-only binaries
// disk, moves /proc, /sys and /dev into it and switches root into it
// (MS_MOVE onto /, then chroot, as switch_root does), then mounts cgroup2
// (so freeze works), /dev/pts, /dev/shm, /tmp and /run in the new root.
// It runs before the reap loop: the busybox commands it starts are waited
// for by os/exec.
func Boot(ctx context.Context, c BootConfig, log zerolog.Logger) error {
	if err := loadModules(ctx, log); err != nil {
		return err
	}
	if c.IP != "none" {
		if err := network(ctx, c, log); err != nil {
			return err
		}
	}
	const newRoot = "/newroot"
	if err := waitDevice(ctx, c.Root); err != nil {
		return err
	}
	if err := mount(c.Root, newRoot, "ext4", unix.MS_NOATIME, ""); err != nil {
		return err
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "var/lib", strings.TrimPrefix(c.BinDir, "/")} {
		if err := os.MkdirAll(filepath.Join(newRoot, d), 0o755); err != nil {
			return fmt.Errorf("guest: boot: %w", err)
		}
	}
	if c.Bin != "" && c.Bin != "none" {
		if err := waitDevice(ctx, c.Bin); err != nil {
			return err
		}
		if err := mount(c.Bin, filepath.Join(newRoot, c.BinDir), "ext4", unix.MS_RDONLY|unix.MS_NOATIME, ""); err != nil {
			return err
		}
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("guest: boot: move %s: %w", d, err)
		}
	}
	if err := os.Chdir(newRoot); err != nil {
		return fmt.Errorf("guest: boot: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("guest: boot: move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("guest: boot: chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("guest: boot: %w", err)
	}
	for _, m := range []struct {
		src, dir, fstype string
		flags            uintptr
		data             string
	}{
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	} {
		if err := mount(m.src, m.dir, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	log.Info().Str("root", c.Root).Str("bin", c.Bin).Msg("switched root")
	return nil
}

func mount(src, dir, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("guest: boot: %w", err)
	}
	if err := unix.Mount(src, dir, fstype, flags, data); err != nil {
		return fmt.Errorf("guest: boot: mount %s (%s) on %s: %w", src, fstype, dir, err)
	}
	return nil
}

// loadModules loads the modules of ModulesFile in order (busybox
// modprobe: their dependencies come from modules.dep).
func loadModules(ctx context.Context, log zerolog.Logger) error {
	b, err := os.ReadFile(ModulesFile)
	if errors.Is(err, os.ErrNotExist) {
		log.Info().Msg("no " + ModulesFile + ": no module loaded")
		return nil
	}
	if err != nil {
		return fmt.Errorf("guest: boot: %w", err)
	}
	for _, name := range strings.Fields(string(b)) {
		if out, err := exec.CommandContext(ctx, Busybox, "modprobe", name).CombinedOutput(); err != nil {
			return fmt.Errorf("guest: boot: modprobe %s: %w: %s", name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// network brings up lo and eth0 with c.IP and a default route via c.GW.
func network(ctx context.Context, c BootConfig, log zerolog.Logger) error {
	if err := waitPath(ctx, "/sys/class/net/eth0"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", c.IP, "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", c.GW},
	} {
		if out, err := exec.CommandContext(ctx, Busybox, append([]string{"ip"}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("guest: boot: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	log.Info().Str("ip", c.IP).Str("gw", c.GW).Msg("network up")
	return nil
}

func waitDevice(ctx context.Context, dev string) error { return waitPath(ctx, dev) }

// waitPath waits for path to exist: devtmpfs and sysfs show a device once
// its driver has probed it, a little after modprobe returns.
func waitPath(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeoutCause(ctx, deviceWait, fmt.Errorf("guest: boot: %s did not appear within %s", path, deviceWait))
	defer cancel()
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) {
		_, err := os.Stat(path)
		return err == nil, nil
	})
	if err != nil {
		return context.Cause(ctx)
	}
	return nil
}

// PowerOff syncs and powers the machine off (QEMU, started with
// -no-reboot, exits); it returns only if the kernel refused.
func PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
