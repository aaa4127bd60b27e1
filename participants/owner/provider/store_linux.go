//go:build linux

package provider

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
)

// snapMeta is a snapshot's meta.json.
type snapMeta struct {
	ID       string        `json:"id"`
	Provider string        `json:"provider"`
	Base     string        `json:"base,omitempty"`
	Sandbox  string        `json:"sandbox"`
	Size     int64         `json:"size"`
	Files    int           `json:"files"`
	Took     time.Duration `json:"took"`
	Created  time.Time     `json:"created"`
}

// snapStore is <state>/snapshots: one directory per snapshot holding
// meta.json and the copied files. A snapshot is built under a ".tmp-" name
// and renamed into place, so a snapshot directory is always complete; a
// deleted one is renamed to ".del-" before its files are removed. The
// store's directory is fsynced before create or delete reports success.
type snapStore struct {
	dir string
	// mu: Fork holds it shared while it copies from a snapshot; the renames
	// of create and delete hold it exclusively.
	mu sync.RWMutex
}

const (
	tmpPrefix = ".tmp-"
	delPrefix = ".del-"
)

// newSnapStore creates dir and removes what an earlier process left half
// made or half deleted.
func newSnapStore(dir string) (*snapStore, error) {
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
	return &snapStore{dir: dir}, nil
}

func (s *snapStore) path(id string) string { return filepath.Join(s.dir, id) }

// create makes snapshot meta.ID: fill copies the files into the directory
// it is given and returns what it copied and how long the sandbox was
// held.
func (s *snapStore) create(meta snapMeta, fill func(dir string) (copyStats, time.Duration, error)) (Snapshot, error) {
	if _, err := os.Lstat(s.path(meta.ID)); err == nil {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", ErrExists, meta.ID)
	}
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+meta.ID+"-")
	if err != nil {
		return Snapshot{}, err
	}
	st, took, err := fill(tmp)
	if err == nil {
		meta.Size, meta.Files, meta.Took, meta.Created = st.bytes, st.entries, took, time.Now().UTC()
		err = metaFile(tmp).Write(meta)
	}
	if err == nil {
		s.mu.Lock()
		if _, serr := os.Lstat(s.path(meta.ID)); serr == nil {
			err = fmt.Errorf("%w: snapshot %q", ErrExists, meta.ID)
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
		return Snapshot{}, errors.Join(err, os.RemoveAll(tmp))
	}
	return Snapshot{ID: meta.ID, Size: meta.Size, Files: meta.Files, Took: meta.Took}, nil
}

// open returns a snapshot's directory and meta, holding the store shared
// until release is called.
func (s *snapStore) open(id string) (dir string, meta snapMeta, release func(), err error) {
	s.mu.RLock()
	dir = s.path(id)
	meta, err = metaFile(dir).Read()
	if err != nil {
		s.mu.RUnlock()
		if errors.Is(err, fs.ErrNotExist) {
			return "", meta, nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, id)
		}
		return "", meta, nil, fmt.Errorf("snapshot %q: %w", id, err)
	}
	return dir, meta, s.mu.RUnlock, nil
}

// delete removes a snapshot; a missing one is not an error. It confirms
// the directory is gone.
func (s *snapStore) delete(id string) error {
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
		return fmt.Errorf("%w: snapshot %q: %w", ErrLeftover, id, err)
	}
	for _, p := range []string{s.path(id), del} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: snapshot %q: %s is still there", ErrLeftover, id, p)
		}
	}
	// Durable: a crash of the machine does not bring the snapshot back.
	return atomicfile.SyncDir(s.dir)
}

// list returns the ids of the complete snapshots, sorted.
func (s *snapStore) list() ([]string, error) {
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
func metaFile(dir string) atomicfile.JSON[snapMeta] {
	return atomicfile.JSON[snapMeta]{Path: filepath.Join(dir, "meta.json"), Perm: 0o600, Indent: true}
}
