//go:build !linux

package chaos

import (
	"context"
	"errors"
)

// netWorld is chaos's network with --netns; only Linux has one.
type netWorld struct{}

func startNet(context.Context, []string) (*netWorld, error) { return nil, errors.ErrUnsupported }

func (*netWorld) tag() string                     { return "" }
func (*netWorld) close()                          {}
func (*netWorld) heal(context.Context) error      { return errors.ErrUnsupported }
func (*netWorld) clientAddr(int) string           { return "" }
func (*netWorld) routeAddr(int) string            { return "" }
func (*netWorld) advertise(int) string            { return "" }
func (*netWorld) enter(int) []string              { return nil }
func (w *chaosWorld) wrap() func(string) []string { return nil }
func (w *chaosWorld) modelHost() string           { return "127.0.0.1" }

func (i *injector) netFault(context.Context, plannedFault) error { return errors.ErrUnsupported }
