//go:build !linux

package procfs

import (
	"errors"
	"syscall"
)

// ReadFile returns errors.ErrUnsupported off Linux.
func ReadFile(_ string, buf []byte) ([]byte, error) { return buf[:0], errors.ErrUnsupported }

// ReadStat returns errors.ErrUnsupported off Linux.
func ReadStat(_ int, buf []byte) (Stat, []byte, error) {
	return Stat{}, buf[:0], errors.ErrUnsupported
}

// ReadTaskStat returns errors.ErrUnsupported off Linux.
func ReadTaskStat(_, _ int, buf []byte) (Stat, []byte, error) {
	return Stat{}, buf[:0], errors.ErrUnsupported
}

// OpenStat returns errors.ErrUnsupported off Linux.
func OpenStat(int) (int, error) { return -1, errors.ErrUnsupported }

// ReadStatFD returns errors.ErrUnsupported off Linux.
func ReadStatFD(_ int, buf []byte) (Stat, []byte, error) {
	return Stat{}, buf[:0], errors.ErrUnsupported
}

// Tasks returns errors.ErrUnsupported off Linux.
func Tasks(int) ([]int, error) { return nil, errors.ErrUnsupported }

// Children returns errors.ErrUnsupported off Linux.
func Children(_, _ int, buf []byte, out []int) ([]int, []byte, error) {
	return out, buf, errors.ErrUnsupported
}

// Tree returns errors.ErrUnsupported off Linux.
func Tree(int) ([]int, error) { return nil, errors.ErrUnsupported }

// SignalPending reports false off Linux.
func SignalPending(_, _ int, _ syscall.Signal, buf []byte) (bool, []byte) { return false, buf }

// VforkWait reports false off Linux.
func VforkWait(_, _ int, buf []byte) (bool, []byte) { return false, buf }

// EnvironHas reports false off Linux.
func EnvironHas(_ int, _, buf []byte) (bool, []byte) { return false, buf }

// PIDs returns errors.ErrUnsupported off Linux.
func PIDs() ([]int, error) { return nil, errors.ErrUnsupported }

// Cgroup returns errors.ErrUnsupported off Linux.
func Cgroup(_ int, buf []byte) (string, []byte, error) { return "", buf, errors.ErrUnsupported }

// SelfCgroup returns errors.ErrUnsupported off Linux.
func SelfCgroup() (string, error) { return "", errors.ErrUnsupported }

// NSpid returns errors.ErrUnsupported off Linux.
func NSpid(int) ([]int, error) { return nil, errors.ErrUnsupported }

// Mounts returns errors.ErrUnsupported off Linux.
func Mounts() ([]Mount, error) { return nil, errors.ErrUnsupported }
