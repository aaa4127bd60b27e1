//go:build !linux

package sandboxd

import (
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// newHost fails off Linux: the supervisor needs /proc, pidfds, a child
// subreaper and cgroup v2.
func newHost(Config, zerolog.Logger) (host, error) {
	return nil, fmt.Errorf("sandboxd: process supervision needs Linux: %w", errors.ErrUnsupported)
}

// IdentityOf returns errors.ErrUnsupported off Linux.
func IdentityOf(int) (sandboxapi.Identity, error) {
	return sandboxapi.Identity{}, errors.ErrUnsupported
}

// Alive reports false off Linux.
func Alive(sandboxapi.Identity) bool { return false }
