//go:build !linux

package sandboxd

import (
	"context"
	"errors"
	"os"
)

// ChildSpec is a process to start outside any launch (Linux only).
type ChildSpec struct {
	// Argv is the program and its arguments.
	Argv []string
	// Dir is the working directory.
	Dir string
	// Env is the environment.
	Env []string
	// Files are the child's stdin, stdout and stderr.
	Files [3]*os.File
	// Setsid starts the child in a new session.
	Setsid bool
}

// Child is a process StartChild started (Linux only).
type Child struct{}

// HoldReaper returns errors.ErrUnsupported off Linux.
func HoldReaper() (func(), error) { return nil, errors.ErrUnsupported }

// StartChild returns errors.ErrUnsupported off Linux.
func StartChild(ChildSpec) (*Child, error) { return nil, errors.ErrUnsupported }

// PID returns 0 off Linux.
func (c *Child) PID() int { return 0 }

// Wait returns errors.ErrUnsupported off Linux.
func (c *Child) Wait(context.Context) (int, string, error) { return 0, "", errors.ErrUnsupported }

// Kill does nothing off Linux.
func (c *Child) Kill() {}
