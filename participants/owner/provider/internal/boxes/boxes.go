package boxes

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// State is what every provider keeps of one sandbox. Mu serializes
// Start, Snapshot and Stop of it. started and gone change with both Mu and
// the registry's mu held, so Exec reads them (and then Sandbox and Env,
// set before started) under the registry's mu alone.
type State struct {
	Mu      sync.Mutex
	Sandbox provider.Sandbox
	Env     []string
	Done    chan struct{} // closed once the init was reaped; nil if this process did not start it
	started bool          // Start finished
	gone    bool          // Stop ran
}

func (s *State) state() *State { return s }

// Box is a provider's record of one sandbox: a State, embedded, and its
// own fields.
type Box interface{ state() *State }

// Registry holds a provider's sandboxes, keyed by id, and knows their
// directories under <state>/sandboxes; the life cycle of a sandbox
// (reserve, create or tear down, forget) runs through it the same way for
// every provider.
type Registry[B Box] struct {
	root  string // <state>/sandboxes
	mu    sync.Mutex
	boxes map[string]B
}

// NewRegistry returns the registry of the sandboxes under
// <stateDir>/sandboxes.
func NewRegistry[B Box](stateDir string) *Registry[B] {
	return &Registry[B]{root: filepath.Join(stateDir, "sandboxes"), boxes: make(map[string]B)}
}

// Dir is the directory of sandbox id.
func (r *Registry[B]) Dir(id string) string { return filepath.Join(r.root, id) }

// Start reserves spec.ID (refusing one in use here or left on disk, and
// what free says is not free), runs create on the new box and marks it
// started; if create fails it tears down what was made and forgets the
// box, unless the teardown failed too (then Stop can retry it).
func (r *Registry[B]) Start(spec provider.Spec, newBox func() B, free func() error,
	create func(B) error, teardown func(string, B) error) (*provider.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	b, err := r.Reserve(spec.ID, newBox, free)
	if err != nil {
		return nil, err
	}
	s := b.state()
	defer s.Mu.Unlock()
	if err := create(b); err != nil {
		terr := teardown(spec.ID, b)
		if terr == nil {
			r.forget(spec.ID, b)
		}
		return nil, errors.Join(fmt.Errorf("start %s: %w", spec.ID, err), terr)
	}
	r.mu.Lock()
	s.started = true
	r.mu.Unlock()
	sb := s.Sandbox
	return &sb, nil
}

// Reserve claims id and returns its new box locked.
func (r *Registry[B]) Reserve(id string, newBox func() B, free func() error) (B, error) {
	var zero B
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.boxes[id]; ok {
		return zero, fmt.Errorf("%w: sandbox %q", provider.ErrExists, id)
	}
	if _, err := os.Lstat(r.Dir(id)); err == nil {
		return zero, fmt.Errorf("%w: sandbox %q is on disk from an earlier process; Stop it first", provider.ErrExists, id)
	}
	if free != nil {
		if err := free(); err != nil {
			return zero, err
		}
	}
	b := newBox()
	b.state().Mu.Lock()
	r.boxes[id] = b
	return b, nil
}

// Stop tears sandbox id down, also one that an earlier process left on
// disk (newBox stands for it), and forgets it once nothing is left.
func (r *Registry[B]) Stop(id string, newBox func() B, teardown func(string, B) error) error {
	if err := provider.ValidateID("id", id); err != nil {
		return err
	}
	r.mu.Lock()
	b, ok := r.boxes[id]
	if !ok {
		b = newBox()
		r.boxes[id] = b
	}
	r.mu.Unlock()
	s := b.state()
	s.Mu.Lock()
	defer s.Mu.Unlock()
	r.mu.Lock()
	s.gone = true
	r.mu.Unlock()
	if err := teardown(id, b); err != nil {
		return err
	}
	r.forget(id, b)
	return nil
}

// forget drops id's box if it is still b.
func (r *Registry[B]) forget(id string, b B) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.boxes[id]; ok && cur.state() == b.state() {
		delete(r.boxes, id)
	}
}

// Get returns id's box, or provider.ErrNotFound.
func (r *Registry[B]) Get(id string) (B, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok {
		var zero B
		return zero, fmt.Errorf("%w: sandbox %q", provider.ErrNotFound, id)
	}
	return b, nil
}

// LockLive returns id's box locked, or provider.ErrNotFound if it is not
// started or stopped; the caller unlocks it.
func (r *Registry[B]) LockLive(id string) (B, error) {
	b, err := r.Get(id)
	if err != nil {
		return b, err
	}
	s := b.state()
	s.Mu.Lock()
	if s.gone || !s.started {
		s.Mu.Unlock()
		var zero B
		return zero, fmt.Errorf("%w: sandbox %q", provider.ErrNotFound, id)
	}
	return b, nil
}

// Ready returns id's box with its sandbox and environment, if it is
// started and not stopped; it does not wait for a Start, Snapshot or Stop
// of it.
func (r *Registry[B]) Ready(id string) (B, provider.Sandbox, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok || !b.state().started || b.state().gone {
		var zero B
		return zero, provider.Sandbox{}, nil, fmt.Errorf("%w: sandbox %q", provider.ErrNotFound, id)
	}
	return b, b.state().Sandbox, b.state().Env, nil
}

// Empty reports whether no sandbox is held.
func (r *Registry[B]) Empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.boxes) == 0
}

// IDs lists the sandboxes held and those on disk, sorted and without
// duplicates.
func (r *Registry[B]) IDs() []string {
	r.mu.Lock()
	ids := slices.Collect(maps.Keys(r.boxes))
	r.mu.Unlock()
	return withOnDisk(ids, r.root)
}

// withOnDisk adds the directory names under dir to ids, sorted and
// without duplicates.
func withOnDisk(ids []string, dir string) []string {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}
