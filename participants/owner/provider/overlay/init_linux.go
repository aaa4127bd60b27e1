//go:build linux

package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
)

// The overlay provider starts a sandbox's first process by running its own
// executable again (/proc/self/exe) with argv[0] = initArg0 and the
// sandbox's setup in the environment variable initEnv. The package's init
// function recognizes that pair before main runs, sets the sandbox up and
// execs spec.Init (or becomes the idle init). A Go process cannot set up
// namespaces for itself once its threads run, but this one is born in its
// new PID, mount and UTS namespaces and in its cgroup (clone3 with
// CLONE_INTO_CGROUP), so everything left to do is per process (mounts,
// pivot_root) or done on the thread that later execs (the cgroup
// namespace).
const (
	initArg0 = "stillpoint-sandbox-init"
	initEnv  = "STILLPOINT_SANDBOX_INIT"
	// initStatusFD is the write end of a close-on-exec pipe: a successful
	// exec closes it with nothing written (the sandbox is ready); a failure
	// writes its error and exits.
	initStatusFD = 3
)

// initConfig is the setup handed to the helper.
type initConfig struct {
	Root        string     `json:"root"`         // host path of the overlay's merged dir
	Hostname    string     `json:"hostname"`     // the sandbox id
	Cgroup      string     `json:"cgroup"`       // host path of the sandbox's cgroup
	CgroupMount string     `json:"cgroup_mount"` // where cgroup v2 is mounted, on the host and inside
	Workdir     string     `json:"workdir"`      // inside
	Mask        string     `json:"mask"`         // inside path to cover with an empty read-only tmpfs
	Argv        []string   `json:"argv"`         // empty: idle init
	Env         []string   `json:"env"`
	Binds       []initBind `json:"binds,omitempty"` // host directories shown read-only inside
}

// initBind is one read-only bind mount of a host directory.
type initBind struct {
	Host   string `json:"host"`
	Inside string `json:"inside"`
}

func init() {
	if len(os.Args) != 1 || os.Args[0] != initArg0 {
		return
	}
	cfg, ok := os.LookupEnv(initEnv)
	if !ok {
		return
	}
	sandboxInit(cfg) // does not return
}

func sandboxInit(cfg string) {
	runtime.LockOSThread() // unshare(CLONE_NEWCGROUP) and exec on this thread
	syscall.CloseOnExec(initStatusFD)
	status := os.NewFile(initStatusFD, "status")
	fail := func(err error) {
		fmt.Fprintf(status, "sandbox init: %v", err)
		os.Exit(1)
	}
	var c initConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		fail(err)
	}
	if err := c.setup(); err != nil {
		fail(err)
	}
	if len(c.Argv) == 0 {
		status.Close()
		idleInit()
	}
	prog, err := lookPath(c.Argv[0], c.Env)
	if err != nil {
		fail(err)
	}
	err = procs.WhileTextBusy(func() error { return syscall.Exec(prog, c.Argv, c.Env) })
	fail(fmt.Errorf("exec %s: %w", prog, err))
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// setup runs as pid 1 of the new PID namespace, in new mount and UTS
// namespaces and already in the sandbox's cgroup.
func (c initConfig) setup() error {
	// A cgroup namespace rooted at the sandbox's cgroup, so that
	// /proc/self/cgroup inside reads 0::/ and matches the bind mount below.
	// Unshared here rather than at clone: a namespace made by clone is
	// rooted at the parent's cgroup, not at CLONE_INTO_CGROUP's target.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	r := c.Root
	cgInside := c.CgroupMount
	var mounts []mountSpec
	if c.Mask != "" {
		// First, so that a mount below (a tmpfs /tmp) may cover it in turn.
		mounts = append(mounts, mountSpec{"tmpfs", c.Mask, "tmpfs", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "mode=755,size=4k"})
	}
	mounts = append(mounts, []mountSpec{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=64k"},
		{"sysfs", "/sys", "sysfs", unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	}...)
	if strings.HasPrefix(cgInside, "/sys/fs/cgroup/") {
		// Hybrid layout: a tmpfs at /sys/fs/cgroup holds the v2 mount point.
		mounts = append(mounts, mountSpec{"tmpfs", "/sys/fs/cgroup", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "mode=755,size=4k"})
	}
	for _, m := range mounts {
		if err := mkdirInside(r, m.target); err != nil {
			return err
		}
		if err := unix.Mount(m.source, r+m.target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
		if m.target == "/dev" {
			if err := setupDev(r + "/dev"); err != nil {
				return err
			}
		}
	}
	for _, b := range c.Binds {
		if err := mkdirInside(r, b.Inside); err != nil {
			return err
		}
		if err := unix.Mount(b.Host, r+b.Inside, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", b.Host, b.Inside, err)
		}
		if err := unix.Mount("", r+b.Inside, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", b.Inside, err)
		}
	}
	// The sandbox's own cgroup as the root of its v2 hierarchy.
	if err := mkdirInside(r, cgInside); err != nil {
		return err
	}
	if err := unix.Mount(c.Cgroup, r+cgInside, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind cgroup %s on %s: %w", c.Cgroup, cgInside, err)
	}
	if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := pivotRoot(r); err != nil {
		return err
	}
	if err := unix.Chdir(c.Workdir); err != nil {
		return fmt.Errorf("chdir %s: %w", c.Workdir, err)
	}
	return nil
}

// mkdirInside makes the mount point p (absolute, inside) under root if it
// is missing, refusing symbolic links on the way: nothing runs in the
// sandbox yet, so a path checked here stays what it is.
func mkdirInside(root, p string) error {
	cur := root
	for _, el := range strings.Split(strings.Trim(p, "/"), "/") {
		cur += "/" + el
		var st unix.Stat_t
		err := unix.Lstat(cur, &st)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Mkdir(cur, 0o755)
			if err == nil {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("mount point %s: %s is not a directory", p, cur)
		}
	}
	return nil
}

// setupDev fills the sandbox's /dev tmpfs with the usual devices.
func setupDev(dev string) error {
	nodes := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, n := range nodes {
		if err := unix.Mknod(dev+"/"+n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
	}
	links := [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}}
	for _, l := range links {
		if err := unix.Symlink(l[0], dev+"/"+l[1]); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := unix.Mkdir(dev+"/"+d, 0o755); err != nil {
			return fmt.Errorf("mkdir /dev/%s: %w", d, err)
		}
	}
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("tmpfs", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	return nil
}

// pivotRoot makes root the root of the mount namespace and detaches the
// old root with every host mount under it, so the sandbox holds no
// reference to other sandboxes' overlays (a chroot would keep them all).
func pivotRoot(root string) error {
	oldRoot, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(oldRoot)
	newRoot, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(newRoot)
	if err := unix.Fchdir(newRoot); err != nil {
		return err
	}
	// pivot_root(".", "."): the old root ends up stacked on the new one.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", root, err)
	}
	if err := unix.Fchdir(oldRoot); err != nil {
		return err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host root: %w", err)
	}
	return unix.Chdir("/")
}

// idleInit is the init of a sandbox without spec.Init: it reaps orphans
// and exits on SIGTERM or SIGINT.
func idleInit() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// lookPath finds prog in env's PATH the way execvp does, inside the
// sandbox (after pivot_root).
func lookPath(prog string, env []string) (string, error) {
	if strings.Contains(prog, "/") {
		return prog, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range strings.Split(pathVar, ":") {
		if dir == "" {
			dir = "."
		}
		p := path.Join(dir, prog)
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %q", prog, pathVar)
}
