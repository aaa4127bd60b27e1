//go:build !linux

package demo

import "errors"

func runProcesses(string) ([]string, error) { return nil, errors.ErrUnsupported }

func sandboxProcesses(string) ([]int, []int, error) { return nil, nil, errors.ErrUnsupported }

func killPID(int) error { return errors.ErrUnsupported }
