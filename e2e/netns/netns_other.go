//go:build !linux

package netns

import (
	"context"
	"errors"
)

// Net is the network of one run; only Linux has one.
type Net struct{}

// New returns errors.ErrUnsupported: network namespaces are Linux's.
func New(context.Context, string, []string) (*Net, error) { return nil, errors.ErrUnsupported }

// New returns errors.ErrUnsupported: network namespaces are Linux's.
func (Config) New(context.Context) (*Net, error) { return nil, errors.ErrUnsupported }

// Sweep returns errors.ErrUnsupported: network namespaces are Linux's.
func Sweep(context.Context, string) error { return errors.ErrUnsupported }

// CheckTools returns errors.ErrUnsupported: network namespaces are Linux's.
func CheckTools() error { return errors.ErrUnsupported }

// Close does nothing.
func (*Net) Close() error { return nil }
