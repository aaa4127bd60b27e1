package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
)

// boundedDir is a dir provider with bounds whose starts each wait for a
// token on release, counting how many run at once.
type boundedDir struct {
	*dir.Provider
	bounds  provider.Bounds
	release chan struct{}

	mu            sync.Mutex
	now, most, in int
}

func (b *boundedDir) Bounds() provider.Bounds { return b.bounds }

func (b *boundedDir) Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error) {
	b.mu.Lock()
	b.now, b.in = b.now+1, b.in+1
	b.most = max(b.most, b.now)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.now--
		b.mu.Unlock()
	}()
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.Provider.Start(ctx, spec)
}

func (b *boundedDir) entered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.in
}

// The owner never starts more sandboxes at once than its provider bears,
// nor holds more live: the starts beyond wait their turn, and none fails.
func TestStartsWaitTheirTurn(t *testing.T) {
	env := jstest.Start(t)
	p := &boundedDir{Provider: newDir(t), bounds: provider.Bounds{Starting: 1, Live: 2}, release: make(chan struct{})}
	o := newOwner(t, baseConfig(t, env, p, "o1"))
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := o.StartSession(t.Context(), fmt.Sprintf("r%d", i), ep(fmt.Sprintf("r%d", i), 0), provider.Spec{})
			errs <- err
		}()
	}
	for want := 1; want <= 2; want++ {
		poll.Wait(t, 10*time.Second, fmt.Sprintf("start %d under way", want), func() bool { return p.entered() == want })
		p.release <- struct{}{}
		if err := <-errs; err != nil {
			t.Fatalf("start %d: %v", want, err)
		}
	}
	// Two live: the third waits for one of them to end, and starts then.
	select {
	case <-time.After(2 * turnLook):
	case err := <-errs:
		t.Fatalf("a third sandbox started beside the two live ones its provider bears: %v", err)
	}
	if n := p.entered(); n != 2 {
		t.Fatalf("%d starts under way with 2 live, want the third waiting", n)
	}
	o.mu.Lock()
	var first string
	for id := range o.sessions {
		first = id
		break
	}
	o.mu.Unlock()
	if err := o.EndSession(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the third start under way", func() bool { return p.entered() == 3 })
	p.release <- struct{}{}
	if err := <-errs; err != nil {
		t.Fatalf("the third start: %v", err)
	}
	if p.most != 1 {
		t.Errorf("%d starts ran at once, its provider bears 1", p.most)
	}
	o.mu.Lock()
	var ids []string
	for id := range o.sessions {
		ids = append(ids, id)
	}
	o.mu.Unlock()
	for _, id := range ids {
		if err := o.EndSession(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
}

// A seed waiting its turn when a checkpoint closes admission is refused
// admission_closed, as one that comes then: the checkpoint does not wait
// for the queue, and the agent asks again after the resume.
func TestWaitingSeedRefusedAtPrepare(t *testing.T) {
	env := jstest.Start(t)
	p := &boundedDir{Provider: newDir(t), bounds: provider.Bounds{Starting: 1}, release: make(chan struct{})}
	o := newOwner(t, baseConfig(t, env, p, "o1"))
	first := make(chan error, 1)
	go func() {
		_, err := o.StartSession(t.Context(), "r0", ep("r0", 0), provider.Spec{})
		first <- err
	}()
	poll.Wait(t, 10*time.Second, "the first start under way", func() bool { return p.entered() == 1 })
	seeded := make(chan error, 1)
	go func() {
		_, err := o.SeedSession(context.WithValue(t.Context(), noHoldKey{}, true), "r1", ep("r1", 0), nil)
		seeded <- err
	}()
	select {
	case err := <-seeded:
		t.Fatalf("a seed beyond the provider's bound: %v, want it waiting", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := o.Prepare(t.Context(), member.Checkpoint{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := <-seeded; !errors.Is(err, ErrAdmissionClosed) {
		t.Fatalf("the waiting seed at prepare: %v, want ErrAdmissionClosed", err)
	}
	if err := o.Resume(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
	p.release <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := o.EndSession(t.Context(), "r0"); err != nil {
		t.Fatal(err)
	}
}

// A seed asked again (its request or its answer lost on the bus) gets the
// session the first made: a repeat that comes while the first is starting
// waits for it, one after it is answered at once, and neither starts a
// second sandbox; a seed of another episode of the session is refused.
func TestSeedAskedAgainGetsTheSameSession(t *testing.T) {
	env := jstest.Start(t)
	p := &boundedDir{Provider: newDir(t), release: make(chan struct{})}
	o := newOwner(t, baseConfig(t, env, p, "o1"))
	ctx := context.WithValue(t.Context(), noHoldKey{}, true)
	type seeded struct {
		s   *Session
		err error
	}
	first, repeat := make(chan seeded, 1), make(chan seeded, 1)
	go func() {
		s, err := o.SeedSession(ctx, "r1", ep("r1", 0), nil)
		first <- seeded{s, err}
	}()
	poll.Wait(t, 10*time.Second, "the first start under way", func() bool { return p.entered() == 1 })
	go func() {
		s, err := o.SeedSession(ctx, "r1", ep("r1", 0), nil)
		repeat <- seeded{s, err}
	}()
	select {
	case got := <-repeat:
		t.Fatalf("a repeat while the first starts: %+v, want it waiting for the first", got)
	case <-time.After(200 * time.Millisecond):
	}
	p.release <- struct{}{}
	a, b := <-first, <-repeat
	if a.err != nil || b.err != nil {
		t.Fatalf("the seed and its repeat: %v, %v", a.err, b.err)
	}
	if a.s.Sandbox.ID != b.s.Sandbox.ID {
		t.Errorf("the repeat got sandbox %s, the first %s", b.s.Sandbox.ID, a.s.Sandbox.ID)
	}
	again, err := o.SeedSession(ctx, "r1", ep("r1", 0), nil)
	if err != nil || again.Sandbox.ID != a.s.Sandbox.ID {
		t.Errorf("a repeat after the answer: %v, %v; want sandbox %s", again, err, a.s.Sandbox.ID)
	}
	if n := p.entered(); n != 1 {
		t.Errorf("%d sandboxes started for one seed asked three times, want 1", n)
	}
	if _, err := o.SeedSession(ctx, "r1", ep("r1", 1), nil); !errors.Is(err, ErrSessionExists) {
		t.Errorf("a seed of another episode of the session: %v, want ErrSessionExists", err)
	}
	if err := o.EndSession(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
}
