package bridge

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// branchHistory reads every branch phase the run has published: the
// branch rollouts they named, each with the highest attempt named, and
// their operation ids. A branch rollout is made once (again only at a
// later attempt, after the first was lost), and an id names one
// operation: a failed operation retires what it named, which must never
// be another operation's branches.
func (b *Bridge) branchHistory(ctx context.Context) (machine.BranchHistory, error) {
	h := machine.BranchHistory{Rollouts: map[string]int{}, Ops: map[string]bool{}}
	last, ok, err := b.lastPhase(ctx, events.PhaseBranch)
	if err != nil || !ok {
		return h, err
	}
	cons, err := b.cfg.JS.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.PhaseSubject(b.cfg.Run, events.PhaseBranch)}, DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return h, fmt.Errorf("bridge: read the run's branch phases: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return h, fmt.Errorf("bridge: read the run's branch phases: %w", err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(natsjs.NextContext(ctx))
		if err != nil {
			return h, fmt.Errorf("bridge: read the run's branch phases: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			return h, fmt.Errorf("bridge: read the run's branch phases: %w", err)
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		if br, isBranch := d.(events.Branch); err == nil && isBranch {
			h.Ops[br.CheckpointID] = true
			for _, s := range br.Branches {
				h.Rollouts[s.Episode.Rollout] = max(h.Rollouts[s.Episode.Rollout], s.Episode.Attempt)
			}
		}
		if md.Sequence.Stream >= last.StreamSeq {
			return h, nil
		}
	}
}
