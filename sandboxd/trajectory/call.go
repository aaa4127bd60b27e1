package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Version is the version of the capture format a Call carries (V). A
// reader refuses any other.
const Version = 1

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
	// Episode and Launch are the first two parts of ID.
	Episode string `json:"episode"`
	Launch  string `json:"launch"`
	// Parent is the ID of the call this one continues ("" for a root or
	// an ambiguous call); Link says how it was found, LinkWhy why a root
	// or an ambiguous call is one.
	Parent  string `json:"parent,omitempty"`
	Link    Link   `json:"link"`
	LinkWhy string `json:"link_why,omitempty"`

	// Method and Path are the request's; Model the model it asked for;
	// Params the request's other fields, without its messages (compact
	// JSON, as the harness sent them: not the capture fields the relay
	// added upstream).
	Method string          `json:"method"`
	Path   string          `json:"path"`
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
}

// IDHeader carries a call's ID upstream, so that a gateway can tell a
// call sent again (the same ID) from a new one.
const IDHeader = "X-Stillpoint-Call"

// PolicyHeader is the reply header an upstream names its policy version
// in (Call.PolicyVersion).
const PolicyHeader = "X-Stillpoint-Policy-Version"

// idPart is what an episode id may be: no dot (the ID's first
// separator), nothing path-like.
var idPart = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// launchPart is what a launch id may be: idPart's words joined by single
// dots (a relaunch's id, "l2.x1", names the launch it replaces), so that
// the episode is the ID's first word and the call number its last.
var launchPart = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// ErrBadCall is wrapped by every error that refuses a capture record.
var ErrBadCall = errors.New("trajectory: bad call record")

// CallID returns the ID of call n of launch in episode, or an error naming
// the part that cannot be one.
func CallID(episode, launch string, n int) (string, error) {
	if !idPart.MatchString(episode) {
		return "", fmt.Errorf("%w: episode %q is not an id ([A-Za-z0-9_-], 1 to 128)", ErrBadCall, episode)
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
	case c.V != Version:
		return fmt.Errorf("%w: version %d (this reader knows %d)", ErrBadCall, c.V, Version)
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

// appendJSON appends c as one JSON object, as json.Marshal writes it but
// for the HTML escapes (a reader decodes both the same): the record's
// encoder, without reflection over its id and logprob arrays. A value
// json.Marshal refuses (a logprob that is not finite, a raw field that is
// not JSON, a time it cannot write) is refused too.
func (c *Call) appendJSON(b []byte) ([]byte, error) {
	var err error
	str := func(key, v string, omit bool) {
		if omit && v == "" {
			return
		}
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		b = appendString(b, v)
	}
	num := func(key string, v int64, omit bool) {
		if omit && v == 0 {
			return
		}
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		b = strconv.AppendInt(b, v, 10)
	}
	raw := func(key string, v json.RawMessage, omit bool) {
		if omit && len(v) == 0 {
			return
		}
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		if len(v) == 0 {
			b = append(b, "null"...)
			return
		}
		var e error
		if b, e = appendCompact(b, v); e != nil && err == nil {
			err = fmt.Errorf("trajectory: call %s: %s: %w", c.ID, key, e)
		}
	}
	flt := func(key string, v float64) {
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		var e error
		if b, e = appendFloat(b, v); e != nil && err == nil {
			err = fmt.Errorf("trajectory: call %s: %s: %w", c.ID, key, e)
		}
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(c.V), 10)
	str("id", c.ID, false)
	str("episode", c.Episode, false)
	str("launch", c.Launch, false)
	str("parent", c.Parent, true)
	str("link", string(c.Link), false)
	str("link_why", c.LinkWhy, true)
	str("method", c.Method, false)
	str("path", c.Path, false)
	str("model", c.Model, true)
	raw("params", c.Params, true)
	num("keep", int64(c.Keep), false)
	if c.Echo {
		b = append(b, `,"echo":true`...)
	}
	b = append(b, `,"messages":`...)
	if c.Messages == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, m := range c.Messages {
			if i > 0 {
				b = append(b, ',')
			}
			var e error
			if b, e = appendCompact(b, m); e != nil && err == nil {
				err = fmt.Errorf("trajectory: call %s: message %d: %w", c.ID, i, e)
			}
		}
		b = append(b, ']')
	}
	num("status", int64(c.Status), false)
	raw("reply", c.Reply, true)
	str("finish_reason", c.FinishReason, true)
	raw("usage", c.Usage, true)
	str("error", c.Error, true)
	str("policy_version", c.PolicyVersion, true)
	if c.Tokens {
		b = append(b, `,"tokens":true`...)
	}
	num("prompt_keep", int64(c.PromptKeep), true)
	ints := func(key string, v []int) {
		if len(v) == 0 {
			return
		}
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':', '[')
		for i, id := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(id), 10)
		}
		b = append(b, ']')
	}
	ints("prompt_ids", c.PromptIDs)
	ints("completion_ids", c.CompletionIDs)
	if len(c.Logprobs) > 0 {
		b = append(b, `,"logprobs":[`...)
		for i, lp := range c.Logprobs {
			if i > 0 {
				b = append(b, ',')
			}
			var e error
			if b, e = appendFloat(b, lp); e != nil && err == nil {
				err = fmt.Errorf("trajectory: call %s: logprob %d: %w", c.ID, i, e)
			}
		}
		b = append(b, ']')
	}
	t, e := c.Started.MarshalJSON()
	if e != nil && err == nil {
		err = fmt.Errorf("trajectory: call %s: started: %w", c.ID, e)
	}
	b = append(b, `,"started":`...)
	b = append(b, t...)
	flt("first_byte_ms", c.FirstByteMS)
	flt("duration_ms", c.DurationMS)
	if c.Generation != 0 {
		b = append(b, `,"generation":`...)
		b = strconv.AppendUint(b, c.Generation, 10)
	}
	num("resends", int64(c.Resends), true)
	return append(b, '}'), err
}

// appendString appends s as a JSON string: as it is when it is printable
// ASCII with nothing to escape, else as json.Marshal writes it but for
// the HTML escapes.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(b, marshalPlain(s)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendCompact appends the JSON value v without its insignificant white
// space, or fails if v is not JSON.
func appendCompact(b []byte, v []byte) ([]byte, error) {
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, v); err != nil {
		return b, err
	}
	return buf.Bytes(), nil
}

// appendFloat appends f as json.Marshal writes a float64.
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, fmt.Errorf("unsupported value: %v", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 to e-9, as json.Marshal writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

// marshalPlain is json.Marshal without its HTML escapes (<, > and & as
// \u003c and the like): a capture stores what a harness and a model wrote,
// in their bytes, not six for one. It returns nil for what json.Marshal
// refuses.
func marshalPlain(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return nil
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
