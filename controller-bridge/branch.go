package bridge

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Branch forks rollouts of a committed checkpoint (LATEST by default)
// into N branches each, which continue beside the fleet (PROTOCOL §5,
// Branch): no restore, no new epoch. The branch phase goes to the live
// members that hold the parents there; if any fails, every branch
// episode is retired on every member of the epoch and the result is
// failed. A seed of 0 draws a base seed at random.
func (b *Bridge) Branch(ctx context.Context, req bridgeapi.BranchRequest) (*bridgeapi.BranchResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Seed == 0 {
		var buf [8]byte
		if _, err := rand.Read(buf[:]); err != nil {
			return nil, fmt.Errorf("bridge: draw a seed: %w", err)
		}
		req.Seed = max(binary.BigEndian.Uint64(buf[:])&math.MaxInt64, 1)
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.unlock()
	m, st, err := b.begin(ctx)
	if err != nil {
		return nil, err
	}
	v := st.view()
	if m.State() == machine.StateIdle {
		if v.Latest, _, err = b.latest(ctx); err != nil {
			return nil, err
		}
		source := req.Source
		if source == "" && v.Latest != nil {
			source = v.Latest.CheckpointID
		}
		if source != "" {
			if v.Manifest, _, err = b.manifest(ctx, source); err != nil {
				return nil, err
			}
		}
		if v.Manifest != nil {
			if v.Sources, err = b.carrySources(ctx, v.Manifest); err != nil {
				return nil, err
			}
		}
		var infos []events.MemberInfo
		if v.Members, infos, err = b.liveMembers(ctx, st.epoch, false); err != nil {
			return nil, err
		}
		v.Instances = make(map[events.Member]string, len(infos))
		for _, info := range infos {
			v.Instances[info.Member] = info.Instance
		}
		if v.StreamMaxAge, err = b.streamMaxAge(ctx); err != nil {
			return nil, err
		}
	}
	hist, err := b.branchHistory(ctx)
	if err != nil {
		return nil, err
	}
	fin, err := b.ask(ctx, m, machine.BranchAsked{Request: req, View: v, History: hist})
	if err != nil {
		return nil, err
	}
	r := fin.Branch
	ev := b.log.Info()
	if r.Status == bridgeapi.StatusFailed {
		ev = b.log.Warn()
		if r.Failure != nil {
			ev = ev.Str("reason", r.Failure.Reason).Int("failed_members", len(r.Failure.Errors))
		}
	}
	ev.Str("branch", r.OpID).Str("source", r.Source).Str("status", r.Status).Int("branches", len(r.Branches)).
		Int("retired", len(r.Retired)).Msg("branch " + r.Status)
	return r, nil
}
