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
	dir := filepath.Dir(path)
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
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
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
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
