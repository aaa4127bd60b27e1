package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// This file is the relay's branch label (PROTOCOL §5, Branch): a launch of
// a branch (LabelBranch) or a re-point of a fork that continues in place
// as one (RepointBranch) sets a label, "b<k>" and a seed, and every call
// is sent upstream with the label in force when it is sent: the
// sandboxapi.BranchHeader and SeedHeader headers, and, for a chat
// completions or a Responses request that sets no "seed", the seed added
// as its "seed" (trajectory.BranchSeedEdit, recorded as an edit). A
// Messages request has no such field: it gets the headers alone. A body
// that is no JSON object goes as it came, with the headers, and the
// record says why it got no seed. A call taken before the label changed
// and sent again after it (a snapshot cut it) is remade from its body
// without the seed the relay added before: what the upstream sees of it
// is the new label's.

// sameBranch tells whether a and b are the same label (nil for none).
func sameBranch(a, b *sandboxapi.BranchLabel) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// seedBody returns body as a call of api with label b goes upstream: with
// "seed": b.Seed added first when api is chat completions or Responses
// and body, a JSON object, sets no seed. edits is what the seed edit did
// (nothing when it had nothing to do), and base, when the body was
// changed, is body as it came: a call sent again under another label is
// remade from it.
func seedBody(api trajectory.API, body []byte, b *sandboxapi.BranchLabel) (out []byte, edits []trajectory.Edit, base []byte) {
	if b == nil || (api != trajectory.APIChat && api != trajectory.APIResponses) {
		return body, nil, nil
	}
	fail := func(err error) ([]byte, []trajectory.Edit, []byte) {
		return body, []trajectory.Edit{{Name: trajectory.BranchSeedEdit, Error: err.Error()}}, nil
	}
	if !json.Valid(body) {
		return fail(errors.New("the body is not JSON"))
	}
	start, _, err := topLevelValue(body, "seed")
	switch {
	case err != nil:
		return fail(err)
	case start >= 0:
		return body, nil, nil // the harness's own seed
	}
	field := `"seed":` + strconv.FormatUint(b.Seed, 10)
	t := bytes.TrimLeft(body, " \t\r\n") // '{', as topLevelValue found
	rest := bytes.TrimLeft(t[1:], " \t\r\n")
	out = make([]byte, 0, len(body)+len(field)+1)
	out = append(out, '{')
	out = append(out, field...)
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	out = append(out, rest...)
	return out, []trajectory.Edit{{Name: trajectory.BranchSeedEdit, Added: []json.RawMessage{json.RawMessage("{" + field + "}")}}}, body
}

// branchHeaders sets the headers of label b on an upstream request (b nil:
// none).
func branchHeaders(h http.Header, b *sandboxapi.BranchLabel) {
	if b == nil {
		return
	}
	h.Set(sandboxapi.BranchHeader, b.Label)
	h.Set(sandboxapi.SeedHeader, strconv.FormatUint(b.Seed, 10))
}

// rebranchLocked remakes c's body for the label in force when it differs
// from the one c's body was made for (r.mu held, no attempt of c
// running): the seed the relay added before comes out, the new label's
// goes in, and what the upstream is sent (translated, asked for tokens)
// and the record's request are made again from it. The call's digest is
// the one it was taken with.
func (r *Relay) rebranchLocked(c *call) {
	if sameBranch(c.branch, r.branch) {
		return
	}
	before := len(c.body) + len(c.upBody) + len(c.base)
	base := c.body
	if c.base != nil {
		base = c.base
	}
	c.body, c.edits, c.base = seedBody(c.api, base, r.branch)
	c.edits = append(append([]trajectory.Edit(nil), c.launchEdits...), c.edits...)
	c.branch = r.branch
	r.upstreamBody(c)
	r.used += int64(len(c.body) + len(c.upBody) + len(c.base) - before)
	if c.prep != nil {
		c.prep = prepare(c.uri, c.body)
	}
	r.log.Info().Uint64("call", c.seq).Str("branch", branchName(c.branch)).Msg("a call sent again under a new branch label")
}

// branchName is b's label, "" for none.
func branchName(b *sandboxapi.BranchLabel) string {
	if b == nil {
		return ""
	}
	return b.Label
}

// branchSeed is b's seed, 0 for none.
func branchSeed(b *sandboxapi.BranchLabel) uint64 {
	if b == nil {
		return 0
	}
	return b.Seed
}

// prepared is the record's split of a request body, made by a goroutine
// while the upstream answers: req is set once done is closed.
type prepared struct {
	done chan struct{}
	req  *trajectory.Request
}

// prepare starts splitting body, the request of uri, for the record.
func prepare(uri string, body []byte) *prepared {
	p := &prepared{done: make(chan struct{})}
	go func() {
		p.req = trajectory.PrepareRequestAt(uri, body)
		close(p.done)
	}()
	return p
}
