//go:build !linux

package guest

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// BootConfig is what the kernel command line says (Linux only).
type BootConfig struct {
	// Port is the control port's name.
	Port string
	// Lease is the boot lease.
	Lease time.Duration
}

// ParseCmdline returns errors.ErrUnsupported off Linux.
func ParseCmdline(string) (BootConfig, error) { return BootConfig{}, errors.ErrUnsupported }

// EarlyMounts returns errors.ErrUnsupported off Linux.
func EarlyMounts() error { return errors.ErrUnsupported }

// Boot returns errors.ErrUnsupported off Linux.
func Boot(context.Context, BootConfig, zerolog.Logger) error { return errors.ErrUnsupported }

// PowerOff returns errors.ErrUnsupported off Linux.
func PowerOff() error { return errors.ErrUnsupported }

// Reseed returns errors.ErrUnsupported off Linux.
func Reseed([]byte) error { return errors.ErrUnsupported }

// Members starts sandboxd member in the guest (Linux only).
type Members interface {
	// Join starts the member of an identify.
	Join(ctx context.Context, req vmctl.Request) (string, error)
	// Rejoin re-identifies the running member in place.
	Rejoin(ctx context.Context, req vmctl.Request) (string, error)
}
