//go:build !linux

package demo

import "errors"

// RunProcesses reads the process table of Linux alone.
func RunProcesses(string) ([]string, error) { return nil, errors.ErrUnsupported }
