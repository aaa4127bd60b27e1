//go:build !linux

package sandboxd

import (
	"errors"
	"fmt"

	"github.com/rs/zerolog"
)

// newHost fails off Linux: the supervisor needs /proc, pidfds, a child
// subreaper and cgroup v2.
func newHost(Config, zerolog.Logger) (host, error) {
	return nil, fmt.Errorf("sandboxd: process supervision needs Linux: %w", errors.ErrUnsupported)
}

// IdentityOf returns errors.ErrUnsupported off Linux.
func IdentityOf(int) (Identity, error) { return Identity{}, errors.ErrUnsupported }

// Alive reports false off Linux.
func (i Identity) Alive() bool { return false }
