//go:build !linux

package cgroup

import (
	"context"
	"errors"
	"time"
)

// Mount returns errors.ErrUnsupported off Linux.
func Mount() (string, error) { return "", errors.ErrUnsupported }

// Self returns errors.ErrUnsupported off Linux.
func Self() (Dir, error) { return "", errors.ErrUnsupported }

// Create returns errors.ErrUnsupported off Linux.
func Create(string) (Dir, error) { return "", errors.ErrUnsupported }

// OpenFD returns errors.ErrUnsupported off Linux.
func (d Dir) OpenFD() (int, error) { return -1, errors.ErrUnsupported }

// Check returns errors.ErrUnsupported off Linux.
func (d Dir) Check() error { return errors.ErrUnsupported }

// Add returns errors.ErrUnsupported off Linux.
func (d Dir) Add(int) error { return errors.ErrUnsupported }

// SetFreeze returns errors.ErrUnsupported off Linux.
func (d Dir) SetFreeze(bool) error { return errors.ErrUnsupported }

// Freeze returns errors.ErrUnsupported off Linux.
func (d Dir) Freeze(context.Context, time.Time) error { return errors.ErrUnsupported }

// Thaw returns errors.ErrUnsupported off Linux.
func (d Dir) Thaw(context.Context, time.Time) error { return errors.ErrUnsupported }

// Kill returns errors.ErrUnsupported off Linux.
func (d Dir) Kill() error { return errors.ErrUnsupported }

// Events returns errors.ErrUnsupported off Linux.
func (d Dir) Events() (Events, error) { return Events{}, errors.ErrUnsupported }

// WaitEvents returns errors.ErrUnsupported off Linux.
func (d Dir) WaitEvents(context.Context, time.Time, func(Events) bool) (bool, error) {
	return false, errors.ErrUnsupported
}

// Procs returns errors.ErrUnsupported off Linux.
func (d Dir) Procs() ([]int, error) { return nil, errors.ErrUnsupported }

// AllProcs returns errors.ErrUnsupported off Linux.
func (d Dir) AllProcs() ([]int, error) { return nil, errors.ErrUnsupported }

// Remove returns errors.ErrUnsupported off Linux.
func (d Dir) Remove(context.Context, time.Time) error { return errors.ErrUnsupported }
