//go:build !linux

package child

import (
	"errors"
	"fmt"
	"syscall"
)

type processOS struct{}

// Start starts the process of spec; on this system it returns an error
// wrapping errors.ErrUnsupported.
func Start(spec Spec) (*Process, error) {
	return nil, fmt.Errorf("child: start %s: %w", spec.Name, errors.ErrUnsupported)
}

func (processOS) signal(syscall.Signal) error      { return errors.ErrUnsupported }
func (processOS) signalGroup(syscall.Signal) error { return errors.ErrUnsupported }
