package main

import (
	"context"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// daemonLike is a participant with a sandbox daemon's abilities and no
// more: it prepares, continues and retires (sandboxd's daemon.Daemon is a
// member.Participant, Continuer and Retirer), and neither exports nor
// parks. What the runtime gives a member depends on them (a participant
// that parks also reads the committed outcomes), so the hosted members ask
// the bus for what sandboxd asks. The work is membertest's participant's,
// which holds no live episode: a sandbox with no launch.
type daemonLike struct {
	p *membertest.Participant
}

var (
	_ member.Participant = daemonLike{}
	_ member.Continuer   = daemonLike{}
	_ member.Retirer     = daemonLike{}
)

func (d daemonLike) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	return d.p.Prepare(ctx, cp)
}

// Continue reopens admission; with no launch there is nothing to report.
func (d daemonLike) Continue(ctx context.Context, checkpointID string) (*events.PauseReport, error) {
	return nil, d.p.Resume(ctx, checkpointID)
}

func (d daemonLike) Retire(ctx context.Context, eps []events.Episode) error {
	return d.p.Retire(ctx, eps)
}
