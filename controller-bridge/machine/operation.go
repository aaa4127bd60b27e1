package machine

import (
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// kind is what an operation is.
type kind uint8

const (
	opCheckpoint kind = iota
	opRestore
	opRetire
	opForget
	opRelease
	opBranch
)

// operation is the one operation open in the run: what it was asked, its
// phases so far, and what the stream and KV said about it.
type operation struct {
	kind kind
	id   string
	// replayed: rebuilt from the stream by Recover, not asked of this
	// machine; its results go to no one.
	replayed bool

	// The operation's phases, as published or read back.
	prepare *events.Prepare
	commit  *events.Commit
	restore *events.Restore
	branch  *events.Branch
	retire  *events.Retire // of a failed restore or branch
	resume  *events.Resume
	phase   events.PhaseEvent // a retire, forget or release of its own

	// A checkpoint: the request, each phase's deadline length, when it
	// started, the prepare's tally and the timings.
	req         bridgeapi.CheckpointRequest
	timeout     time.Duration
	started     time.Time
	prepTally   *Tally
	commitTally *Tally
	// built is the checkpoint manifest the commit builds, created once its
	// member list is written.
	built       *events.CheckpointManifest
	prepMS      int64
	commitStart time.Time
	commitMS    int64
	// prev is the committed checkpoint before this one (LATEST when it
	// was asked), which the commit carries forward from.
	prev *events.CheckpointManifest
	// instances are the members' process instances the ask's view held
	// (a branch.completed names its agents').
	instances map[events.Member]string
	// prepAt is when the prepare was published, as a replay read it.
	prepAt time.Time
	// members are those the outcome, the result and the resume name;
	// manifest is the checkpoint key once created or found; failure why
	// the checkpoint is aborted.
	members  []events.Member
	manifest *events.CheckpointManifest
	failure  *bridgeapi.Failure

	// What a replay read: whether the checkpoint key was read, and each
	// outcome type read (nil data: none on the stream).
	manifestRead bool
	outcomes     map[events.Type]events.Data
	// retireGathered: the retire of a failed restore has been gathered.
	retireGathered bool

	rres *bridgeapi.RestoreResult
	ores *bridgeapi.OpResult
	bres *bridgeapi.BranchResult
	// epochMembers are the live members of the epoch a failed branch
	// retires its branches on.
	epochMembers []events.Member
}

// result is a finished checkpoint's result: committed with what its
// manifest names, or failed with its failure.
func (o *operation) result() *bridgeapi.CheckpointResult {
	m := o.manifest
	if m.Aborted {
		return &bridgeapi.CheckpointResult{Run: m.Run, CheckpointID: m.CheckpointID, Status: bridgeapi.StatusFailed, Epoch: m.Epoch,
			Members: o.members, PrepareMS: m.PrepareMS, Failure: o.failure}
	}
	res := bridgeapi.ResultOf(m)
	res.Members = o.members
	return res
}

// withSandboxes returns ms with the sandbox daemons that prepared added
// (those of the prepare's tally, or of the prepare when no tally is
// known): the members a checkpoint's outcome, result and resume name,
// since its commit addresses sandbox daemons only to stop them.
func (o *operation) withSandboxes(ms []events.Member) []events.Member {
	var prepared []events.Member
	switch {
	case o.prepTally != nil:
		prepared = o.prepTally.Members()
	case o.prepare != nil:
		prepared = expected(o.prepare.PhaseHeader)
	}
	out := slices.Clone(ms)
	for _, m := range prepared {
		if m.Kind() == events.KindSandbox {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// resumed returns the members a checkpoint's resume addresses: its
// members and, when no sandbox daemon is left among them (each was left
// out of the prepare) though the prepare addressed the daemons, those the
// prepare listed. Every daemon takes a phase with a roster, listed or not
// (one that joined after the listing, one found silent that was only
// slow), and one that paused on the prepare must hear a resume: a resume
// without a roster would leave it paused until its lease runs out.
func (o *operation) resumed() []events.Member {
	if o.prepare == nil || o.prepare.Sandboxes == nil ||
		slices.ContainsFunc(o.members, func(m events.Member) bool { return m.Kind() == events.KindSandbox }) {
		return o.members
	}
	out := slices.Clone(o.members)
	for _, m := range expected(o.prepare.PhaseHeader) {
		if m.Kind() == events.KindSandbox {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// seen reports whether a replay found outcome t of the operation.
func (o *operation) seen(t events.Type) bool { return o.outcomes[t] != nil }

// read reports whether a replay read outcome t.
func (o *operation) read(t events.Type) bool {
	_, ok := o.outcomes[t]
	return ok
}
