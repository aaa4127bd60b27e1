//go:build !linux

package chaos

import "errors"

func sandboxProcesses(string) ([]int, []int, error) { return nil, nil, errors.ErrUnsupported }

func killPID(int) error { return errors.ErrUnsupported }
