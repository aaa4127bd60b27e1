package membertest

import (
	"context"
	"iter"
	"sync"

	"github.com/stillpoint/stillpoint/events"
)

// Pacer implements Subject.PaceWrites for a participant package's
// subject to embed: the subject's Export wraps its participant's records
// in Pace.
type Pacer struct {
	mu   sync.Mutex
	pace func(ctx context.Context, index int)
}

// PaceWrites implements Subject.
func (p *Pacer) PaceWrites(before func(ctx context.Context, index int)) {
	p.mu.Lock()
	p.pace = before
	p.mu.Unlock()
}

// Pace yields records, calling the pacing function (if any) before each
// and stopping with ctx's error once ctx is done.
func (p *Pacer) Pace(ctx context.Context, records iter.Seq2[events.Record, error]) iter.Seq2[events.Record, error] {
	p.mu.Lock()
	pace := p.pace
	p.mu.Unlock()
	return func(yield func(events.Record, error) bool) {
		i := 0
		for r, err := range records {
			if err == nil && pace != nil {
				pace(ctx, i)
			}
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			if !yield(r, err) || err != nil {
				return
			}
			i++
		}
	}
}
