//go:build !linux

package provider

import (
	"errors"
	"time"

	"github.com/rs/zerolog"
)

// OverlayConfig configures an Overlay provider (Linux only).
type OverlayConfig struct {
	StateDir      string
	BaseDir       string
	CgroupParent  string
	FreezeTimeout time.Duration
	StopTimeout   time.Duration
	StartTimeout  time.Duration
}

// Overlay is the overlay provider; it exists on Linux only.
type Overlay struct{}

// Dir is the dir provider; it exists on Linux only.
type Dir struct{}

// NewOverlay returns errors.ErrUnsupported outside Linux.
func NewOverlay(OverlayConfig) (*Overlay, error) { return nil, errors.ErrUnsupported }

// NewDir returns errors.ErrUnsupported outside Linux.
func NewDir(string) (*Dir, error) { return nil, errors.ErrUnsupported }

// Default returns errors.ErrUnsupported outside Linux.
func Default(string) (*Overlay, *Dir, error) { return nil, nil, errors.ErrUnsupported }

// DefaultSandboxLease is the microvm provider's default lease (Linux only).
const DefaultSandboxLease = 60 * time.Second

// MicroVMConfig configures a MicroVM provider (Linux only).
type MicroVMConfig struct {
	StateDir   string
	CacheDir   string
	PruneCache bool
	Sandboxd   string
	Accel      string
	Lease      time.Duration
	Upstream   string
	Logger     zerolog.Logger
}

// MicroVM is the microvm provider; it exists on Linux only.
type MicroVM struct{}

// NewMicroVM returns errors.ErrUnsupported outside Linux.
func NewMicroVM(MicroVMConfig) (*MicroVM, error) { return nil, errors.ErrUnsupported }
