package guest

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reseed adds entropy to the kernel's pool, credited (RNDADDENTROPY: a
// struct rand_pool_info, the count in bits), and makes the CRNG reseed
// from the pool at once (RNDRESEEDCRNG), so that every getrandom after it
// (crypto/rand) differs from that of any other fork of the same snapshot.
// It needs CAP_SYS_ADMIN.
func Reseed(entropy []byte) error {
	if len(entropy) == 0 {
		return fmt.Errorf("guest: reseed: no entropy")
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("guest: reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+(len(entropy)+3)/4*4)
	binary.NativeEndian.PutUint32(info[0:], uint32(len(entropy)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	if err := ioctl(f, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); err != nil {
		return fmt.Errorf("guest: reseed: ioctl RNDADDENTROPY: %w", err)
	}
	if err := ioctl(f, unix.RNDRESEEDCRNG, 0); err != nil {
		return fmt.Errorf("guest: reseed: ioctl RNDRESEEDCRNG: %w", err)
	}
	return nil
}

func ioctl(f *os.File, req uint, arg uintptr) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
