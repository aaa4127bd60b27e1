package relay

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// successors lists the legal call transitions: held -> forwarding |
// failed; forwarding -> forwarding (a re-send of a reply cut before it
// ended upstream) | replied | failed; replied -> delivered | failed (a
// reply that ended upstream is kept whole and never sent again).
var successors = map[sandboxapi.CallState][]sandboxapi.CallState{
	sandboxapi.CallHeld:       {sandboxapi.CallForwarding, sandboxapi.CallFailed},
	sandboxapi.CallForwarding: {sandboxapi.CallForwarding, sandboxapi.CallReplied, sandboxapi.CallFailed},
	sandboxapi.CallReplied:    {sandboxapi.CallDelivered, sandboxapi.CallFailed},
}

// checkTransition returns nil if from -> to is legal, else an error
// wrapping ErrTransition that names both states.
func checkTransition(from, to sandboxapi.CallState) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w from %s to %s", ErrTransition, from, to)
}

// call is one model call: the request as the harness sent it (the bytes
// every attempt sends), and where it stands. Its fields after the request
// are guarded by Relay.mu.
type call struct {
	seq    uint64
	digest string
	method string
	uri    string // path and query, appended to the upstream URL
	header http.Header
	body   []byte
	stream bool
	api    trajectory.API // the wire API its path speaks
	wake   chan struct{}  // capacity 1: something changed for this call

	// The capture's: the call's launch and number in it (its id, sent
	// upstream), when it was taken, the body sent upstream when the relay
	// asks for tokens (nil: body), and what the harness asked for itself.
	episode, launch, id string
	n                   int
	started             time.Time
	upBody              []byte
	asked               asked
	augmented           bool              // upBody asks for token fields the harness did not
	upURI               string            // the path upstream when translated ("": uri)
	via                 trajectory.API    // the API upstream when translated (APIChat), "" if none
	edits               []trajectory.Edit // what the relay's edits did: launchEdits, then the seed's
	launchEdits         []trajectory.Edit // what the launch's relay edits removed
	// branch is the label body was made for (branch.go), nil for none;
	// base, when set, is body without the seed the label added.
	branch *sandboxapi.BranchLabel
	base   []byte
	// prep is the body split for the record, which a goroutine does
	// while the upstream answers (nil without a capture).
	prep *prepared

	state   sandboxapi.CallState
	gen     uint64
	resends int
	status  int
	err     string
	att     *attempt // the current attempt, nil before the first
	dropped string   // set by Drop: why the call is failed
	// unreachable is when an attempt first found the upstream
	// unreachable (zero: none did); redials counts the dials since.
	unreachable time.Time
	redials     int
}

// attempt is one sending of a call to one upstream. Its reader goroutine
// fills it; Relay.mu guards it.
type attempt struct {
	gen    uint64
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader has returned

	status    int
	header    http.Header
	buf       []byte // the reply's body read and not yet consumed by serve
	kept      int    // bytes its shaper keeps, counted in the budget
	off       int64  // the offset in the reply's body of buf[0]
	released  bool   // replaced, or its call ended: it keeps no more bytes
	ended     bool   // the whole reply was read
	err       error  // the attempt failed
	repointed bool   // a Repoint cut it
	cut       bool   // it failed in a way that a re-send repairs
	// unsent: it failed before any connection was made, and is dialed
	// again from notBefore on (a cut too).
	unsent    bool
	notBefore time.Time

	firstByte time.Time // when the reply's first byte came
	shape     *shaper   // the capture's, nil without one
}

func (c *call) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *call) snapshot() sandboxapi.CallStatus {
	st := sandboxapi.CallStatus{Seq: c.seq, Digest: c.digest, Generation: c.gen, State: c.state,
		Stream: c.stream, Resends: c.resends, Status: c.status, Error: c.err}
	if c.att != nil && c.att.err != nil {
		st.AttemptError = c.att.err.Error()
	}
	return st
}
