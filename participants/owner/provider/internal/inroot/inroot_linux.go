//go:build linux

package inroot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// rootDir writes into a sandbox's file system from the host. Every path is
// resolved with openat2(RESOLVE_IN_ROOT): a symbolic link in the image,
// even an absolute one, resolves inside the sandbox, never to the host.
type rootDir struct {
	fd   int
	path string
}

func openRoot(dir string) (*rootDir, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &rootDir{fd: fd, path: dir}, nil
}

func (r *rootDir) Close() error { return unix.Close(r.fd) }

// open opens rel (relative, cleaned) inside the root.
func (r *rootDir) open(rel string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(r.fd, rel, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // EAGAIN: a rename raced the resolution
		}
		if err != nil {
			return -1, &os.PathError{Op: "openat2", Path: path.Join(r.path, rel), Err: err}
		}
		return fd, nil
	}
}

// mkdirAll creates rel and its parents (mode 0755 before umask) inside
// the root.
func (r *rootDir) mkdirAll(rel string) error {
	if rel == "." || rel == "/" || rel == "" {
		return nil
	}
	fd, err := r.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		return unix.Close(fd)
	}
	if !errors.Is(err, unix.ENOENT) {
		return err
	}
	parent := path.Dir(rel)
	if err := r.mkdirAll(parent); err != nil {
		return err
	}
	pfd, err := r.open(parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	err = unix.Mkdirat(pfd, path.Base(rel), 0o755)
	unix.Close(pfd)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "mkdir", Path: path.Join(r.path, rel), Err: err}
	}
	fd, err = r.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// writeFile writes data to rel inside the root with the given mode,
// creating its parents.
func (r *rootDir) writeFile(rel string, data io.Reader, mode uint32) error {
	if err := r.mkdirAll(path.Dir(rel)); err != nil {
		return err
	}
	fd, err := r.open(rel, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, mode)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path.Join(r.path, rel))
	if _, err := io.Copy(f, data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(os.FileMode(mode & 0o777)); err != nil {
		f.Close()
		return err
	}
	if mode&0o7000 != 0 { // os.FileMode keeps these bits elsewhere
		if err := unix.Fchmod(fd, mode); err != nil {
			f.Close()
			return &os.PathError{Op: "fchmod", Path: f.Name(), Err: err}
		}
	}
	return f.Close()
}

// Populate writes a spec's working directory, Files and CopyIn into the
// sandbox root dir, and for each Bind its mount point (mount) or a copy of
// its regular files. The spec was validated.
func Populate(dir string, spec provider.Spec, mount bool) error {
	r, err := openRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	if spec.Workdir != "" {
		wd, _ := provider.CleanAbs("spec.Workdir", spec.Workdir)
		if err := r.mkdirAll(wd[1:]); err != nil {
			return fmt.Errorf("spec.Workdir: %w", err)
		}
	}
	for p, data := range spec.Files {
		rel, _ := provider.CleanRel("", p)
		if err := r.writeFile(rel, bytes.NewReader(data), 0o644); err != nil {
			return fmt.Errorf("spec.Files[%q]: %w", p, err)
		}
	}
	for i, c := range spec.CopyIn {
		if err := r.copyIn(c); err != nil {
			return fmt.Errorf("spec.CopyIn[%d]: %w", i, err)
		}
	}
	for i, b := range spec.Binds {
		rel, _ := provider.CleanRel("", b.SandboxDir)
		if err := r.mkdirAll(rel); err != nil {
			return fmt.Errorf("spec.Binds[%d]: %w", i, err)
		}
		if mount {
			continue
		}
		ents, err := os.ReadDir(b.HostDir)
		if err != nil {
			return fmt.Errorf("spec.Binds[%d]: %w", i, err)
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			c := provider.CopyIn{HostPath: path.Join(b.HostDir, e.Name()), SandboxPath: path.Join(rel, e.Name())}
			if err := r.copyIn(c); err != nil {
				return fmt.Errorf("spec.Binds[%d]: %w", i, err)
			}
		}
	}
	return nil
}

func (r *rootDir) copyIn(c provider.CopyIn) error {
	in, err := os.Open(c.HostPath)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: HostPath %q is not a regular file", provider.ErrInvalid, c.HostPath)
	}
	mode := c.Mode
	if mode == 0 {
		mode = uint32(fi.Mode().Perm())
		if fi.Mode()&os.ModeSetuid != 0 {
			mode |= unix.S_ISUID
		}
		if fi.Mode()&os.ModeSetgid != 0 {
			mode |= unix.S_ISGID
		}
	}
	rel, _ := provider.CleanRel("", c.SandboxPath)
	return r.writeFile(rel, in, mode)
}
