package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// tmpSuffix marks a temporary file of Write; a crash can leave one behind,
// and the next Write of the same path replaces it.
const tmpSuffix = ".tmp"

// Write replaces the file at path with data, created with perm, and makes
// the replacement durable: the file is fsynced before the rename and its
// directory after it. The directory must exist. On error the old content
// is left in place.
func Write(path string, data []byte, perm os.FileMode) error {
	if err := replace(path, data, perm, true); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	return nil
}

// Replace is Write without the fsyncs: readers and a process started after
// a crash of this one see the old content or the new, never a torn file,
// but a crash of the machine may bring back an older content. It is for a
// state that is rewritten often and whose loss with the machine is
// harmless: sandboxd's launch record between its durable first and last
// states (the paused and running-again states of every pause), since a
// machine crash kills the launch and its recovery ignores those states.
func Replace(path string, data []byte, perm os.FileMode) error {
	return replace(path, data, perm, false)
}

func replace(path string, data []byte, perm os.FileMode, durable bool) error {
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	_, err = f.Write(data)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, errors.Join(err, removeIfExists(tmp)))
	}
	return nil
}

// SyncDir fsyncs a directory, so that a rename or a create in it survives a
// crash of the machine.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("atomicfile: sync %s: %w", dir, err)
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
