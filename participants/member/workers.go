package member

import "context"

// worker is a handler running outside the loop: a prepare's wait, a
// commit's write, a restore's install, a park. The loop starts it, and
// cancels it and waits for it when its checkpoint reopens or Run ends; it
// hands its result to the loop (post), which drops a result that comes
// too late.
type worker struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}
}

// spawn runs fn in a worker goroutine for checkpoint id, with a context
// of the loop's ctx; Reopen of id or the end of Run cancels it and waits
// for it.
func (m *Member) spawn(ctx context.Context, op uint64, id string, fn func(ctx context.Context)) {
	for k, w := range m.workers {
		select {
		case <-w.done:
			delete(m.workers, k)
		default:
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &worker{id: id, cancel: cancel, done: make(chan struct{})}
	m.workers[op] = w
	m.wg.Go(func() {
		defer close(w.done)
		defer cancel()
		fn(wctx)
	})
}

// post hands a worker's result to the loop, unless the worker was
// cancelled.
func (m *Member) post(ctx context.Context, in Input) {
	select {
	case m.results <- in:
	case <-ctx.Done():
	}
}

// cancelWorkers cancels every worker of checkpoint id and waits for each.
func (m *Member) cancelWorkers(id string) {
	for k, w := range m.workers {
		if w.id == id {
			w.cancel()
			<-w.done
			delete(m.workers, k)
		}
	}
}

// stopWorkers cancels every worker and waits for all.
func (m *Member) stopWorkers() {
	for _, w := range m.workers {
		w.cancel()
	}
	m.wg.Wait()
	clear(m.workers)
}
