//go:build linux

package registry

import (
	"fmt"
	"os"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
)

// Open returns the provider name (auto, overlay, dir or microvm) with its state under
// stateDir, and why it is the one: "auto" is Default; microvm is
// configured by mv (its StateDir is set to stateDir) and says which
// accelerator it uses. images, when not nil, is the image cache the
// overlay provider finds and holds its sandboxes' images in (the microvm
// provider takes its own through mv).
func Open(name, stateDir string, mv microvm.Config, images overlay.ImageFinder) (p provider.Provider, reason string, err error) {
	switch name {
	case "auto":
		return Default(stateDir, images)
	case "overlay":
		ov, err := overlay.New(overlay.Config{StateDir: stateDir, Images: images})
		if err != nil {
			return nil, "", err
		}
		return ov, "", nil
	case "dir":
		d, err := dir.New(stateDir)
		if err != nil {
			return nil, "", err
		}
		return d, "", nil
	case "microvm":
		mv.StateDir = stateDir
		m, err := microvm.New(mv)
		if err != nil {
			return nil, "", err
		}
		return m, m.Reason(), nil
	}
	return nil, "", fmt.Errorf("%w: --provider %q: want auto, overlay, dir or microvm", provider.ErrInvalid, name)
}

// Default chooses the provider to use with state under stateDir: the
// overlay provider when the process is root on Linux and a trial run
// works (overlay's Probe: mount an overlay, make a cgroup that can
// freeze), the dir provider otherwise. The reason says which and why.
// images is the overlay provider's image cache, as for Open.
func Default(stateDir string, images overlay.ImageFinder) (p provider.Provider, reason string, err error) {
	why := ""
	if euid := os.Geteuid(); euid != 0 {
		why = fmt.Sprintf("dir: not root (euid %d); the overlay provider needs root", euid)
	} else if ov, err := overlay.New(overlay.Config{StateDir: stateDir, Images: images}); err != nil {
		why = fmt.Sprintf("dir: overlay unavailable: %v", err)
	} else if err := ov.Probe(); err != nil {
		why = fmt.Sprintf("dir: overlay probe failed: %v", err)
	} else {
		return ov, "overlay: root on Linux; trial overlay mount and freezable cgroup v2 worked", nil
	}
	d, err := dir.New(stateDir)
	if err != nil {
		return nil, "", err
	}
	return d, why, nil
}
