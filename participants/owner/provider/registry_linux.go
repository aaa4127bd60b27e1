package provider

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// boxState is what every provider keeps of one sandbox. mu serializes
// Start, Snapshot and Stop of it. started and gone change with both mu and
// the registry's mu held, so Exec reads them (and then sb and env, set
// before started) under the registry's mu alone.
type boxState struct {
	mu      sync.Mutex
	sb      Sandbox
	env     []string
	done    chan struct{} // closed once the init was reaped; nil if this process did not start it
	started bool          // Start finished
	gone    bool          // Stop ran
}

func (s *boxState) state() *boxState { return s }

// box is a provider's record of one sandbox: a boxState and its own fields.
type box interface{ state() *boxState }

// registry holds a provider's sandboxes, keyed by id, and knows their
// directories under <state>/sandboxes; the life cycle of a sandbox
// (reserve, create or tear down, forget) runs through it the same way for
// every provider.
type registry[B box] struct {
	root  string // <state>/sandboxes
	mu    sync.Mutex
	boxes map[string]B
}

func newRegistry[B box](stateDir string) *registry[B] {
	return &registry[B]{root: filepath.Join(stateDir, "sandboxes"), boxes: make(map[string]B)}
}

// dir is the directory of sandbox id.
func (r *registry[B]) dir(id string) string { return filepath.Join(r.root, id) }

// start reserves spec.ID (refusing one in use here or left on disk, and
// what free says is not free), runs create on the new box and marks it
// started; if create fails it tears down what was made and forgets the
// box, unless the teardown failed too (then Stop can retry it).
func (r *registry[B]) start(spec Spec, newBox func() B, free func() error,
	create func(B) error, teardown func(string, B) error) (*Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	b, err := r.reserve(spec.ID, newBox, free)
	if err != nil {
		return nil, err
	}
	s := b.state()
	defer s.mu.Unlock()
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
	sb := s.sb
	return &sb, nil
}

// reserve claims id and returns its new box locked.
func (r *registry[B]) reserve(id string, newBox func() B, free func() error) (B, error) {
	var zero B
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.boxes[id]; ok {
		return zero, fmt.Errorf("%w: sandbox %q", ErrExists, id)
	}
	if _, err := os.Lstat(r.dir(id)); err == nil {
		return zero, fmt.Errorf("%w: sandbox %q is on disk from an earlier process; Stop it first", ErrExists, id)
	}
	if free != nil {
		if err := free(); err != nil {
			return zero, err
		}
	}
	b := newBox()
	b.state().mu.Lock()
	r.boxes[id] = b
	return b, nil
}

// stop tears sandbox id down, also one that an earlier process left on
// disk (newBox stands for it), and forgets it once nothing is left.
func (r *registry[B]) stop(id string, newBox func() B, teardown func(string, B) error) error {
	if err := ValidateID("id", id); err != nil {
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
	s.mu.Lock()
	defer s.mu.Unlock()
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
func (r *registry[B]) forget(id string, b B) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.boxes[id]; ok && cur.state() == b.state() {
		delete(r.boxes, id)
	}
}

// get returns id's box, or ErrNotFound.
func (r *registry[B]) get(id string) (B, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok {
		var zero B
		return zero, fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	return b, nil
}

// lockLive returns id's box locked, or ErrNotFound if it is not started
// or stopped; the caller unlocks it.
func (r *registry[B]) lockLive(id string) (B, error) {
	b, err := r.get(id)
	if err != nil {
		return b, err
	}
	s := b.state()
	s.mu.Lock()
	if s.gone || !s.started {
		s.mu.Unlock()
		var zero B
		return zero, fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	return b, nil
}

// ready returns id's box with its sandbox and environment, if it is
// started and not stopped; it does not wait for a Start, Snapshot or Stop
// of it.
func (r *registry[B]) ready(id string) (B, Sandbox, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.boxes[id]
	if !ok || !b.state().started || b.state().gone {
		var zero B
		return zero, Sandbox{}, nil, fmt.Errorf("%w: sandbox %q", ErrNotFound, id)
	}
	return b, b.state().sb, b.state().env, nil
}

// empty reports whether no sandbox is held.
func (r *registry[B]) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.boxes) == 0
}

// ids lists the sandboxes held and those on disk, sorted and without
// duplicates.
func (r *registry[B]) ids() []string {
	r.mu.Lock()
	ids := slices.Collect(maps.Keys(r.boxes))
	r.mu.Unlock()
	return withOnDisk(ids, r.root)
}
