//go:build linux

package snapstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Meta is a snapshot's meta.json.
type Meta struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	Base     string `json:"base,omitempty"`
	// Image is the digest of the image the snapshot's sandbox stood on
	// ("" when it stood on Base): a fork needs that image.
	Image   string        `json:"image,omitempty"`
	Sandbox string        `json:"sandbox"`
	Size    int64         `json:"size"`
	Files   int           `json:"files"`
	Took    time.Duration `json:"took"`
	Created time.Time     `json:"created"`
}

// Store is <state>/snapshots: one directory per snapshot holding
// meta.json and the copied files. A snapshot is built under a ".tmp-" name
// and renamed into place, so a snapshot directory is always complete; a
// deleted one is renamed to ".del-" before its files are removed. The
// store's directory is fsynced before create or delete reports success.
type Store struct {
	dir string
	// mu: Fork holds it shared while it copies from a snapshot; the renames
	// of create and delete hold it exclusively.
	mu sync.RWMutex
}

const (
	tmpPrefix = ".tmp-"
	delPrefix = ".del-"
)

// New returns the store in dir, which it creates, and removes what an
// earlier process left half made or half deleted.
func New(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), delPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id) }

// Create makes snapshot meta.ID: fill copies the files into the directory
// it is given and returns what it copied (Size, Files) and how long the
// sandbox was held (Took).
func (s *Store) Create(meta Meta, fill func(dir string) (provider.Snapshot, error)) (provider.Snapshot, error) {
	if _, err := os.Lstat(s.path(meta.ID)); err == nil {
		return provider.Snapshot{}, fmt.Errorf("%w: snapshot %q", provider.ErrExists, meta.ID)
	}
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+meta.ID+"-")
	if err != nil {
		return provider.Snapshot{}, err
	}
	st, err := fill(tmp)
	if err == nil {
		meta.Size, meta.Files, meta.Took, meta.Created = st.Size, st.Files, st.Took, time.Now().UTC()
		err = metaFile(tmp).Write(meta)
	}
	if err == nil {
		s.mu.Lock()
		if _, serr := os.Lstat(s.path(meta.ID)); serr == nil {
			err = fmt.Errorf("%w: snapshot %q", provider.ErrExists, meta.ID)
		} else if err = os.Rename(tmp, s.path(meta.ID)); err == nil {
			// The rename is what makes the snapshot; it is durable once the
			// store's directory is synced. A snapshot that cannot be made
			// durable is taken back.
			if err = atomicfile.SyncDir(s.dir); err != nil {
				err = errors.Join(err, os.RemoveAll(s.path(meta.ID)))
			}
		}
		s.mu.Unlock()
	}
	if err != nil {
		return provider.Snapshot{}, errors.Join(err, os.RemoveAll(tmp))
	}
	return provider.Snapshot{ID: meta.ID, Size: meta.Size, Files: meta.Files, Took: meta.Took}, nil
}

// Exists tells whether snapshot id is in the store.
func (s *Store) Exists(id string) bool {
	_, err := os.Lstat(s.path(id))
	return err == nil
}

// Open returns a snapshot's directory and meta, holding the store shared
// until release is called.
func (s *Store) Open(id string) (dir string, meta Meta, release func(), err error) {
	s.mu.RLock()
	dir = s.path(id)
	meta, err = metaFile(dir).Read()
	if err != nil {
		s.mu.RUnlock()
		if errors.Is(err, fs.ErrNotExist) {
			return "", meta, nil, fmt.Errorf("%w: snapshot %q", provider.ErrNotFound, id)
		}
		return "", meta, nil, fmt.Errorf("snapshot %q: %w", id, err)
	}
	return dir, meta, s.mu.RUnlock, nil
}

// Delete removes a snapshot; a missing one is not an error. It confirms
// the directory is gone.
func (s *Store) Delete(id string) error {
	del, err := os.MkdirTemp(s.dir, delPrefix+id+"-")
	if err != nil {
		return err
	}
	s.mu.Lock()
	err = os.Rename(s.path(id), filepath.Join(del, id))
	s.mu.Unlock()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return errors.Join(err, os.Remove(del))
	}
	if err := os.RemoveAll(del); err != nil {
		return fmt.Errorf("%w: snapshot %q: %w", provider.ErrLeftover, id, err)
	}
	for _, p := range []string{s.path(id), del} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: snapshot %q: %s is still there", provider.ErrLeftover, id, p)
		}
	}
	// Durable: a crash of the machine does not bring the snapshot back.
	return atomicfile.SyncDir(s.dir)
}

// List returns the ids of the complete snapshots, sorted.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// metaFile is the meta.json of a snapshot's directory.
func metaFile(dir string) atomicfile.JSON[Meta] {
	return atomicfile.JSON[Meta]{Path: filepath.Join(dir, "meta.json"), Perm: 0o600, Indent: true}
}
