package qemu

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// AssetsEnv names a directory of guest assets (what `make microvm-assets`
// writes: <dir>/current/{vmlinux,modules}); it overrides the cache
// directories.
const AssetsEnv = "STILLPOINT_MICROVM_ASSETS"

// SystemAssets and UserAssets are the cache directories `make
// microvm-assets` writes (as root, and otherwise), looked in in this
// order.
const (
	SystemAssets = "/var/cache/stillpoint/microvm"
	UserAssets   = ".cache/stillpoint/microvm" // under $HOME
)

// Assets are the host-side files a guest boots from.
type Assets struct {
	// KernelVersion is the guest kernel's release, e.g. 6.1.0-57-amd64.
	KernelVersion string
	// Kernel is the uncompressed vmlinux.
	Kernel string
	// Modules is a directory holding lib/modules/<KernelVersion>/ with the
	// guest's modules and their modules.dep.
	Modules string
	// Load lists the modules the guest loads at boot, in order.
	Load []string
	// Busybox is the host's static busybox, copied into every guest.
	Busybox string
	// QEMU and QEMUImg are qemu-system-x86_64 and qemu-img.
	QEMU, QEMUImg string
	// MkfsExt4 is e2fsprogs' mkfs.ext4.
	MkfsExt4 string
}

// ErrAssets is returned (wrapped, naming what to install or run) by
// FindAssets when something the microVMs need is missing.
var ErrAssets = errors.New("microvm: guest assets missing")

// FindAssets finds the guest kernel and modules (in dir, or $AssetsEnv,
// or the cache directories) and the host programs; what is missing is
// named with the package or make target that provides it.
func FindAssets(dir string) (Assets, error) {
	var a Assets
	var errs []error
	for _, t := range []struct {
		dst        *string
		name, from string
	}{
		{&a.QEMU, "qemu-system-x86_64", "qemu-system-x86"},
		{&a.QEMUImg, "qemu-img", "qemu-utils"},
		{&a.Busybox, "busybox", "busybox-static"},
		{&a.MkfsExt4, "mkfs.ext4", "e2fsprogs"},
	} {
		p, err := exec.LookPath(t.name)
		if err != nil {
			for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
				if fi, serr := os.Stat(filepath.Join(d, t.name)); serr == nil && fi.Mode().IsRegular() {
					p, err = filepath.Join(d, t.name), nil
					break
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s not found: apt-get install -y --no-install-recommends %s", ErrAssets, t.name, t.from))
			continue
		}
		*t.dst = p
	}
	if a.Busybox != "" {
		if dynamicELF(a.Busybox) {
			errs = append(errs, fmt.Errorf("%w: %s is linked dynamically; the guest needs busybox-static (apt-get install busybox-static)", ErrAssets, a.Busybox))
		}
	}
	var dirs []string
	switch {
	case dir != "":
		dirs = []string{dir}
	case os.Getenv(AssetsEnv) != "":
		dirs = []string{os.Getenv(AssetsEnv)}
	default:
		dirs = []string{SystemAssets}
		if home, err := os.UserHomeDir(); err == nil {
			dirs = append(dirs, filepath.Join(home, UserAssets))
		}
	}
	found := false
	for _, d := range dirs {
		cur, err := filepath.EvalSymlinks(filepath.Join(d, "current"))
		if err != nil {
			continue
		}
		kver := filepath.Base(cur)
		if _, err := os.Stat(filepath.Join(cur, "modules", "lib", "modules", kver, "modules.dep")); err != nil {
			continue
		}
		load, err := os.ReadFile(filepath.Join(cur, "modules", "load"))
		if err != nil {
			continue
		}
		a.KernelVersion, a.Kernel, a.Modules = kver, filepath.Join(cur, "vmlinux"), filepath.Join(cur, "modules")
		a.Load = strings.Fields(string(load))
		found = true
		break
	}
	if !found {
		errs = append(errs, fmt.Errorf("%w: no guest kernel in %s: run `make microvm-assets` (it downloads the Debian kernel package and extracts vmlinux and modules)", ErrAssets, strings.Join(dirs, " or ")))
	}
	return a, errors.Join(errs...)
}

// dynamicELF reports whether the ELF file at p names a program
// interpreter (a dynamic loader): a guest without the host's libraries
// cannot run it.
func dynamicELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}
