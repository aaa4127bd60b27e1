package relay

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// Hold holds the relay: new calls wait before they are forwarded, and no
// reply reaches the harness until Release. Holding twice is holding.
func (r *Relay) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		r.holding = true
		r.log.Info().Int("open", len(r.open)).Msg("holding model calls")
	}
}

// Durable tells whether every call captured so far is durable (true
// without a capture). A checkpoint's prepare waits for it after the hold:
// a snapshot never holds a call the disk does not.
func (r *Relay) Durable() bool { return r.cfg.Capture == nil || r.cfg.Capture.Durable() }

// Flush waits until every call captured so far is durable, and returns
// the error that stopped the capture, if any.
func (r *Relay) Flush() error {
	if r.cfg.Capture == nil {
		return nil
	}
	return r.cfg.Capture.Flush()
}

// CapturePath returns the capture file's path, "" without a capture.
func (r *Relay) CapturePath() string {
	if r.cfg.Capture == nil {
		return ""
	}
	return r.cfg.Capture.Path()
}

// Release ends the hold: held calls go upstream, kept replies reach the
// harness. Releasing a relay that does not hold does nothing.
func (r *Relay) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		return
	}
	r.holding = false
	r.broadcastLocked()
	r.log.Info().Int("open", len(r.open)).Msg("releasing model calls")
	// A kept-alive upstream connection may not have outlived the hold (a
	// restored VM's old forward): calls from now on dial afresh.
	r.client.CloseIdleConnections()
	for _, c := range r.open {
		c.signal()
	}
}

// Drop ends the hold as Release does, but first fails every call the relay
// holds or has in flight (each harness still connected gets a 503
// call_abandoned): what a restore kept of a launch its agent abandoned
// (killed, not continued) must not reach the next model server, where the
// relaunched harness makes its own calls. Dropping a relay that does not
// hold does nothing.
func (r *Relay) Drop(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		return
	}
	r.holding = false
	r.broadcastLocked()
	r.log.Warn().Int("open", len(r.open)).Str("why", why).Msg("dropping the held model calls")
	r.client.CloseIdleConnections()
	for _, c := range r.open {
		c.dropped = why
		if a := c.att; a != nil {
			a.cancel()
		}
		c.signal()
	}
}

// Holding reports whether the relay holds.
func (r *Relay) Holding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holding
}

// Repoint makes upstream, at generation gen, the relay's upstream. gen
// must be higher than the current generation (else ErrStaleGeneration).
// Every call of an older generation whose reply has not ended upstream has
// its attempt cut and is sent again to the new upstream: at once if the
// relay does not hold, else at the Release (never if a Drop comes first).
func (r *Relay) Repoint(upstream string, gen uint64) (sandboxapi.RelayStatus, error) {
	return r.RepointBranch(upstream, gen, nil)
}

// RepointBranch is Repoint that, with branch set, also makes branch the
// label in force, in the same step: the calls it cuts are sent again with
// it (branch.go). A nil branch leaves the label as it is. An invalid
// label is an error wrapping sandboxapi.ErrBadBranch, and nothing is
// changed.
func (r *Relay) RepointBranch(upstream string, gen uint64, branch *sandboxapi.BranchLabel) (sandboxapi.RelayStatus, error) {
	if err := checkUpstream(upstream); err != nil {
		return r.Status(), err
	}
	if branch != nil {
		if err := branch.Validate(); err != nil {
			return r.Status(), fmt.Errorf("relay: repoint: %w", err)
		}
		b := *branch
		branch = &b
	}
	r.mu.Lock()
	if gen <= r.gen {
		cur := r.gen
		r.mu.Unlock()
		return r.Status(), fmt.Errorf("%w: %d is not above %d", ErrStaleGeneration, gen, cur)
	}
	old := r.upstream
	r.upstream, r.gen = strings.TrimRight(upstream, "/"), gen
	if branch != nil {
		r.branch = branch
		r.relabel(branch.Episode)
	}
	// Idle connections to the old upstream (after a restore: to a forward
	// the new VM does not have, where a request could wait forever) are
	// never used again, even for the same address.
	r.client.CloseIdleConnections()
	cut := 0
	for _, c := range r.open {
		if a := c.att; a != nil && !a.ended && a.err == nil && a.gen < gen {
			a.repointed = true
			a.cancel()
			cut++
		}
		if a := c.att; a != nil && a.unsent {
			// Waiting to dial an upstream it could not reach: the new
			// one is dialed at once, with a window of its own.
			a.notBefore = time.Time{}
			c.unreachable, c.redials = time.Time{}, 0
		}
		c.signal()
	}
	r.mu.Unlock()
	r.log.Warn().Str("from", old).Str("to", upstream).Uint64("generation", gen).Int("cut", cut).Msg("relay re-pointed")
	return r.Status(), nil
}

// relabel records the calls taken from now on under episode (a branch's,
// whose fork continues the parent's launch in place), and gives the calls
// still open, which the re-point sends again and none has recorded yet,
// IDs of episode, in the order they came: so that no call of the branch
// has the ID of its parent's or a sibling's call. An episode that makes
// no call ID leaves the labels as they are. r.mu is held.
func (r *Relay) relabel(episode string) {
	if episode == "" || r.cfg.Capture == nil || r.episode == "" || episode == r.episode {
		return
	}
	if _, err := trajectory.CallID(episode, r.launch, 1); err != nil {
		r.log.Error().Err(err).Str("episode", episode).Msg("relay: a branch's episode makes no call id; its calls keep the launch's")
		return
	}
	r.episode = episode
	k := r.episode + "." + r.launch
	if _, ok := r.nums[k]; !ok {
		r.nums[k] = r.cfg.Capture.Next(r.episode, r.launch) - 1
	}
	seqs := make([]uint64, 0, len(r.open))
	for s, c := range r.open {
		if c.id != "" {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	for _, s := range seqs {
		c := r.open[s]
		r.nums[k]++
		c.episode, c.n = episode, r.nums[k]
		c.id, _ = trajectory.CallID(c.episode, c.launch, c.n)
	}
}

func checkUpstream(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%w %q: %w", ErrBadUpstream, s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w %q (want http(s)://host[:port][/path])", ErrBadUpstream, s)
	}
	return nil
}
