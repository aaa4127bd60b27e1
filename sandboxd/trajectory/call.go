package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Version is the version of the capture format a Call carries (V). A
// reader takes this one and the earlier ones, and refuses any other:
// version 1 wrote a call's episode, launch, method and path always,
// version 2 its parent, token flag and usage always.
const Version = 3

// DefaultMethod and DefaultPath are a call's method and path where its
// record leaves them out: a chat completion's.
const (
	DefaultMethod = "POST"
	DefaultPath   = "/v1/chat/completions"
)

// Link is how a call's parent was resolved.
type Link string

// The links.
const (
	// LinkRoot: no earlier call's prompt and completion begin this call's
	// prompt. The first call of a rollout is a root; a later root is a
	// history the harness compacted or rewrote (LinkWhy says which).
	LinkRoot Link = "root"
	// LinkResolved: the parent's prompt and completion are the longest
	// prefix of this call's prompt, by token ids where both carry them,
	// else by messages.
	LinkResolved Link = "resolved"
	// LinkTokenBreak: the messages chain to the parent but the token ids
	// do not (the harness re-rendered what the model said, or the server's
	// template renders a history differently from how it generated it).
	LinkTokenBreak Link = "token_break"
	// LinkAmbiguous: two or more earlier calls chain equally far, and
	// differ; the call is not attributed, and the rollout is masked.
	LinkAmbiguous Link = "ambiguous"
)

// Call is one model call as the relay captured it: a line of a capture
// file. Its request is stored as a delta against its parent, so a file
// grows with the conversation, not with the sum of its prompts (Index
// rebuilds each call whole).
type Call struct {
	// V is the format's Version.
	V int `json:"v"`
	// ID is "<episode>.<launch>.<n>": the rollout attempt, the launch of
	// the harness in it, and the call's number in that launch from 1. The
	// relay sends it upstream in the IDHeader.
	ID string `json:"id"`
	// Episode and Launch are the first two parts of ID; a record
	// leaves them out (version 1 wrote them).
	Episode string `json:"episode,omitempty"`
	Launch  string `json:"launch,omitempty"`
	// Parent is the ID of the call this one continues ("" for a root or
	// an ambiguous call); Link says how it was found, LinkWhy why a root
	// or an ambiguous call is one.
	Parent  string `json:"parent,omitempty"`
	Link    Link   `json:"link"`
	LinkWhy string `json:"link_why,omitempty"`

	// API is the wire API the call spoke, left out for APIChat: a
	// Messages or a Responses call's messages and reply are in the
	// trajectory's form (chat completions'), its params the request's own
	// fields but those (docs/TRAJECTORIES.md); APIOther is no model call.
	API API `json:"api,omitempty"`
	// Via is the API the upstream spoke when the relay translated the
	// call (APIChat), "" when it went as the harness sent it: its reply,
	// token ids and logprobs are then the chat completion's.
	Via API `json:"via,omitempty"`
	// RequestError says why the request did not parse (not JSON, or not
	// the shape of its API): it was forwarded all the same. Such a call
	// is on no chain.
	RequestError string `json:"request_error,omitempty"`
	// RawRequest is the body of a request that did not parse, as it came
	// (with RequestError).
	RawRequest []byte `json:"raw_request,omitempty"`

	// Method and Path are the request's; Model the model it asked for;
	// Params the request's other fields, without its messages (compact
	// JSON, as the harness sent them: not the capture fields the relay
	// added upstream).
	// A record leaves Method and Path out at DefaultMethod and
	// DefaultPath.
	Method string          `json:"method,omitempty"`
	Path   string          `json:"path,omitempty"`
	Model  string          `json:"model,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	// The request's messages: the first Keep of the parent's, then (Echo)
	// the parent's reply message as recorded, then Messages.
	Keep     int               `json:"keep"`
	Echo     bool              `json:"echo,omitempty"`
	Messages []json.RawMessage `json:"messages"`

	// Status is the upstream's HTTP status. Reply is the assistant message
	// (a stream assembled), FinishReason and Usage as the upstream gave
	// them; Error the body of a reply that is no completion (a status
	// other than 200, or a body that does not parse).
	Status       int             `json:"status"`
	Reply        json.RawMessage `json:"reply,omitempty"`
	FinishReason string          `json:"finish_reason,omitempty"`
	Usage        json.RawMessage `json:"usage,omitempty"`
	Error        string          `json:"error,omitempty"`
	// PolicyVersion is the policy (weights) version the upstream named in
	// its PolicyHeader, "" if none.
	PolicyVersion string `json:"policy_version,omitempty"`

	// Tokens is true when the upstream returned the prompt's and the
	// completion's token ids. The prompt ids are the first PromptKeep of
	// the parent's prompt and completion ids, then PromptIDs.
	Tokens        bool      `json:"tokens,omitempty"`
	PromptKeep    int       `json:"prompt_keep,omitempty"`
	PromptIDs     []int     `json:"prompt_ids,omitempty"`
	CompletionIDs []int     `json:"completion_ids,omitempty"`
	Logprobs      []float64 `json:"logprobs,omitempty"`

	// Started is when the relay took the call; FirstByteMS and DurationMS
	// when the first byte of the reply (of the attempt that delivered) and
	// its end came, after Started.
	Started     time.Time `json:"started"`
	FirstByteMS float64   `json:"first_byte_ms"`
	DurationMS  float64   `json:"duration_ms"`
	// Generation is the upstream generation that answered; Resends how
	// many times the call was sent again (a snapshot cut it).
	Generation uint64 `json:"generation,omitempty"`
	Resends    int    `json:"resends,omitempty"`
	// Edits are the relay edits of the call's launch that removed
	// something from its request (or failed), in the order applied, then
	// the branch's seed (BranchSeedEdit) when the relay added one: the
	// request above is the edited one, what the model saw.
	Edits []Edit `json:"edits,omitempty"`
	// Branch and Seed are the branch label ("b<k>") and seed the relay
	// sent the call upstream with (its attempt that answered), "" and 0
	// for a call of no branch.
	Branch string `json:"branch,omitempty"`
	Seed   uint64 `json:"seed,omitempty"`
}

// Edit is what one relay edit did to a call's request: the parts it
// removed or added, each as JSON, or the error that left the request as
// it was.
type Edit struct {
	Name    string            `json:"name"`
	Removed []json.RawMessage `json:"removed,omitempty"`
	Added   []json.RawMessage `json:"added,omitempty"`
	Error   string            `json:"error,omitempty"`
}

// BranchSeedEdit names the edit the relay makes to a branch's chat
// completions or Responses request that sets no "seed": it adds the
// branch's seed, {"seed": <seed>} in Edit.Added.
const BranchSeedEdit = "branch-seed"

// ModelCall tells whether c is a model call the capture reads: a request
// of a known API that parsed. Any other is recorded, on no chain.
func (c *Call) ModelCall() bool {
	return c.RequestError == "" && c.API != APIOther
}

// notModelWhy says why c is no model call.
func (c *Call) notModelWhy() string {
	if c.RequestError != "" {
		return "the request does not parse: " + c.RequestError
	}
	return "the path " + c.Path + " speaks no API the capture reads"
}

// IDHeader carries a call's ID upstream, so that a gateway can tell a
// call sent again (the same ID) from a new one.
const IDHeader = "X-Stillpoint-Call"

// PolicyHeader is the reply header an upstream names its policy version
// in (Call.PolicyVersion).
const PolicyHeader = "X-Stillpoint-Policy-Version"

// idPart is what an episode id may be: a capture key (a rollout id, which
// may hold dots, and its attempt), with no empty word between dots,
// nothing path-like. An ID whose episode holds a dot cannot be split back
// into its parts: its record keeps them (record).
var idPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$`)

// launchPart is what a launch id may be: words of [A-Za-z0-9_-] joined by single
// dots (a relaunch's id, "l2.x1", names the launch it replaces), so that
// the episode is the ID's first word and the call number its last.
var launchPart = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// ErrBadCall is wrapped by every error that refuses a capture record.
var ErrBadCall = errors.New("trajectory: bad call record")

// CallID returns the ID of call n of launch in episode, or an error naming
// the part that cannot be one.
func CallID(episode, launch string, n int) (string, error) {
	if len(episode) > 128 || !idPart.MatchString(episode) {
		return "", fmt.Errorf("%w: episode %q is not an id (words of [A-Za-z0-9_-] joined by dots, 1 to 128)", ErrBadCall, episode)
	}
	if len(launch) > 128 || !launchPart.MatchString(launch) {
		return "", fmt.Errorf("%w: launch %q is not an id (words of [A-Za-z0-9_-] joined by dots, 1 to 128)", ErrBadCall, launch)
	}
	if n < 1 {
		return "", fmt.Errorf("%w: call number %d (from 1)", ErrBadCall, n)
	}
	return fmt.Sprintf("%s.%s.%d", episode, launch, n), nil
}

// check reports the first thing that makes c no record a reader may use
// on its own (the index checks its links).
func (c *Call) check() error {
	switch {
	case c.V < 1 || c.V > Version:
		return fmt.Errorf("%w: version %d (this reader knows 1 to %d)", ErrBadCall, c.V, Version)
	case c.Keep < 0 || c.PromptKeep < 0:
		return fmt.Errorf("%w: %s keeps %d messages and %d prompt ids", ErrBadCall, c.ID, c.Keep, c.PromptKeep)
	case len(c.Logprobs) != 0 && len(c.Logprobs) != len(c.CompletionIDs):
		return fmt.Errorf("%w: %s has %d logprobs for %d completion ids", ErrBadCall, c.ID, len(c.Logprobs), len(c.CompletionIDs))
	}
	switch c.Link {
	case LinkRoot, LinkAmbiguous:
		if c.Parent != "" || c.Keep != 0 || c.Echo || c.PromptKeep != 0 {
			return fmt.Errorf("%w: %s is a %s but names a parent or keeps from one", ErrBadCall, c.ID, c.Link)
		}
	case LinkResolved, LinkTokenBreak:
		if c.Parent == "" {
			return fmt.Errorf("%w: %s is %s without a parent", ErrBadCall, c.ID, c.Link)
		}
	default:
		return fmt.Errorf("%w: %s has link %q", ErrBadCall, c.ID, c.Link)
	}
	if _, err := CallID(c.Episode, c.Launch, 1); err != nil {
		return fmt.Errorf("%s: %w", c.ID, err)
	}
	if c.number() == 0 {
		return fmt.Errorf("%w: id %q is not <episode>.<launch>.<n> of episode %q launch %q", ErrBadCall, c.ID, c.Episode, c.Launch)
	}
	return nil
}

// record returns the line that stores c, without what a reader can tell
// from the rest of it (fill puts it back), so that a short call's record
// is mostly its conversation: its episode and launch (the parts of its
// ID, unless the episode holds a dot); a method and a path at their defaults; its parent where that is
// the call before it in its launch; the token flag where it carries
// token ids; the usage where it only counts those ids.
func (c *Call) record() ([]byte, error) {
	w := *c
	w.V = Version
	if !strings.Contains(c.Episode, ".") {
		w.Episode, w.Launch = "", "" // the ID's first word and the rest
	}
	if w.Method == DefaultMethod {
		w.Method = ""
	}
	if w.Path == DefaultPath {
		w.Path = ""
	}
	if w.Parent != "" && w.Parent == c.previous() {
		w.Parent = ""
	}
	if w.Tokens && w.carriesTokens() {
		w.Tokens = false
		switch {
		case w.Usage == nil:
			w.Usage = json.RawMessage("null") // none: the reader must not make one up
		case sameUsage(w.Usage, c.countedUsage()):
			w.Usage = nil
		}
	}
	return encodePlain(&w)
}

// fill restores what a record read from a file leaves out (record): the
// episode and the launch from the ID (checked against the fields a
// version 1 record wrote), the default method and path, and from
// version 3 the parent, the token flag and the usage.
func (c *Call) fill() error {
	first, last := strings.IndexByte(c.ID, '.'), strings.LastIndexByte(c.ID, '.')
	if first < 0 || last <= first {
		return fmt.Errorf("%w: id %q is not <episode>.<launch>.<n>", ErrBadCall, c.ID)
	}
	ep, launch := c.ID[:first], c.ID[first+1:last]
	if c.Episode == "" && c.Launch == "" {
		c.Episode, c.Launch = ep, launch
	}
	if c.Method == "" {
		c.Method = DefaultMethod
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.V < 3 {
		return nil
	}
	if c.Parent == "" && (c.Link == LinkResolved || c.Link == LinkTokenBreak) {
		c.Parent = c.previous() // "" for a first call: check refuses it
	}
	if c.carriesTokens() {
		c.Tokens = true
		switch {
		case string(c.Usage) == "null":
			c.Usage = nil
		case c.Usage == nil:
			c.Usage = c.countedUsage()
		}
	}
	return nil
}

// previous returns the ID of the call before c in its launch, "" for the
// first or an ID that is no call's.
func (c *Call) previous() string {
	i := strings.LastIndexByte(c.ID, '.')
	n, err := strconv.Atoi(c.ID[i+1:])
	if i < 0 || err != nil || n < 2 {
		return ""
	}
	return c.ID[:i+1] + strconv.Itoa(n-1)
}

// carriesTokens reports whether c holds token ids: every call the
// upstream gave them for does, as its prompt has one at least.
func (c *Call) carriesTokens() bool {
	return c.PromptKeep > 0 || len(c.PromptIDs) > 0 || len(c.CompletionIDs) > 0
}

// usage is the part of an upstream's usage a record can leave out.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// countedUsage returns the usage that counts c's token ids and nothing
// else, as a reader restores one a record left out.
func (c *Call) countedUsage() json.RawMessage {
	p, n := c.PromptKeep+len(c.PromptIDs), len(c.CompletionIDs)
	return marshalPlain(usage{PromptTokens: p, CompletionTokens: n, TotalTokens: p + n})
}

// sameUsage reports whether the usages a and b hold the same fields with
// the same whole numbers, in whatever order.
func sameUsage(a, b json.RawMessage) bool {
	var fa, fb map[string]int
	return json.Unmarshal(a, &fa) == nil && json.Unmarshal(b, &fb) == nil && maps.Equal(fa, fb)
}

// number returns n of the call's id, <episode>.<launch>.<n>, or 0 when
// the id is not one of its episode and launch.
func (c *Call) number() int {
	rest, ok := strings.CutPrefix(c.ID, c.Episode+"."+c.Launch+".")
	n, err := strconv.Atoi(rest)
	if !ok || err != nil || n < 1 || strconv.Itoa(n) != rest {
		return 0
	}
	return n
}

// marshalPlain is json.Marshal without its HTML escapes (<, > and & as
// \u003c and the like): a capture stores what a harness and a model wrote,
// in their bytes, not six for one. It returns nil for what json.Marshal
// refuses.
func marshalPlain(v any) []byte {
	b, _ := encodePlain(v)
	return b
}

// encodePlain is marshalPlain with json.Marshal's error.
func encodePlain(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
