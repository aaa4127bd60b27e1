package feed

import (
	"sync"
	"time"
)

// redeliverer delivers again, locally, the events of the core feed that
// the loop gave back: the server never redelivers them. It stops with
// the feed, and then the next process of the member resumes from the saved
// position instead.
type redeliverer struct {
	inbox    chan<- Delivery
	stopping chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
}

// after hands d to the loop again after delay, unless the feed stops
// first. It is called from the loop, and from the consumer's handler only
// once stop has begun (it then does nothing), never alongside stop.
func (r *redeliverer) after(d Delivery, delay time.Duration) {
	select {
	case <-r.stopping:
		return
	default:
	}
	r.wg.Go(func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.stopping:
			return
		}
		select {
		case r.inbox <- d:
		case <-r.stopping:
		}
	})
}

// stop ends every pending redelivery and waits for them.
func (r *redeliverer) stop() {
	r.once.Do(func() { close(r.stopping) })
	r.wg.Wait()
}
