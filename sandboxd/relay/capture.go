package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// This file is the relay's capture (docs/TRAJECTORIES.md): with
// Config.Capture set, every call the upstream answered is recorded, once,
// in the sandbox's capture file before the end of its reply reaches the
// harness; with Config.Tokens, the upstream is asked for token ids and
// logprobs, and the harness gets the reply it would have had without
// them.

// asked is what of the token fields the harness asked for itself.
type asked struct {
	ids, logprobs bool
}

// augment returns the body to send upstream: the harness's, with
// return_token_ids true and, unless the harness asked for logprobs
// itself, logprobs true and top_logprobs 0 (never null). A body that is
// not a JSON object is sent as it is (nil).
func augment(body []byte) ([]byte, asked) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, asked{}
	}
	if !bytes.Contains(body, []byte(`"return_token_ids"`)) && !bytes.Contains(body, []byte(`"logprobs"`)) &&
		!bytes.Contains(body, []byte(`"top_logprobs"`)) {
		// None of the fields is there (as a key or as any string): they
		// go in first, the rest as the harness wrote it.
		const fields = `"return_token_ids":true,"logprobs":true,"top_logprobs":0`
		rest := bytes.TrimLeft(t[1:], " \t\r\n")
		out := make([]byte, 0, len(body)+len(fields)+1)
		out = append(out, '{')
		out = append(out, fields...)
		if len(rest) > 0 && rest[0] != '}' {
			out = append(out, ',')
		}
		return append(out, rest...), asked{}
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m == nil {
		return nil, asked{}
	}
	var a asked
	_ = json.Unmarshal(m["return_token_ids"], &a.ids)
	_ = json.Unmarshal(m["logprobs"], &a.logprobs)
	if a.ids && a.logprobs {
		return nil, a
	}
	m["return_token_ids"] = json.RawMessage("true")
	if !a.logprobs {
		m["logprobs"], m["top_logprobs"] = json.RawMessage("true"), json.RawMessage("0")
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, a
	}
	return out, a
}

// strip removes from one reply object (a plain reply, or a stream's
// chunk) what the relay asked for and the harness did not: every member
// named prompt_token_ids or token_ids, and the value of every member named
// logprobs (null, as an upstream gives it unasked). It is one pass over
// the bytes, the rest kept as the upstream wrote it; an object that does
// not scan is left as it is.
func strip(obj []byte, a asked) []byte {
	if a.ids && a.logprobs {
		return obj
	}
	out, ok := stripMembers(obj, a)
	if !ok {
		return obj
	}
	return out
}

// stripMembers is strip's scan: a JSON value, strings skipped whole, each
// object member's name read and the member dropped, nulled or kept.
func stripMembers(b []byte, a asked) ([]byte, bool) {
	out := make([]byte, 0, len(b))
	i := 0
	// stack of open containers: '{' or '['; expectKey after '{' or ','
	// inside an object.
	var stack []byte
	expectKey := false
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			end, ok := stringEnd(b, i)
			if !ok {
				return nil, false
			}
			if expectKey {
				name := b[i+1 : end-1]
				j := skipSpace(b, end)
				if j >= len(b) || b[j] != ':' {
					return nil, false
				}
				vstart := skipSpace(b, j+1)
				vend, ok := valueEnd(b, vstart)
				if !ok {
					return nil, false
				}
				drop := !a.ids && (string(name) == "token_ids" || string(name) == "prompt_token_ids")
				null := !a.logprobs && string(name) == "logprobs"
				switch {
				case drop:
					// Drop the member and the comma that joins it.
					k := skipSpace(b, vend)
					if k < len(b) && b[k] == ',' {
						i = skipSpace(b, k+1)
						continue // the next member's name follows
					}
					// The last member: drop the comma before it, if any.
					out = bytes.TrimRight(out, " \t\r\n")
					out = bytes.TrimSuffix(out, []byte(","))
					i = vend
					expectKey = false
					continue
				case null:
					out = append(out, b[i:vstart]...)
					out = append(out, "null"...)
					i = vend
					expectKey = false
					continue
				}
				out = append(out, b[i:end]...)
				i = end
				expectKey = false
				continue
			}
			out = append(out, b[i:end]...)
			i = end
			continue
		case c == '{':
			stack = append(stack, '{')
			expectKey = true
		case c == '[':
			stack = append(stack, '[')
		case c == '}' || c == ']':
			if len(stack) == 0 {
				return nil, false
			}
			stack = stack[:len(stack)-1]
			expectKey = false
		case c == ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1] == '{'
		}
		out = append(out, c)
		i++
	}
	return out, len(stack) == 0
}

// stringEnd returns the index just past the string starting at b[i].
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// valueEnd returns the index just past the JSON value starting at b[i].
func valueEnd(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, ok := stringEnd(b, j)
				if !ok {
					return 0, false
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\r' && b[j] != '\t' {
		j++
	}
	return j, j > i
}

// shaper is the capture's side of one attempt: it assembles the reply as
// it comes and says which bytes may go to the harness now. A stream's
// bytes pass line by line (rewritten if the relay asked for tokens), but
// from the line that finishes the reply on they wait for the record; a
// plain reply waits whole; a translated stream's error waits too. So a
// harness never holds a whole reply that the capture file does not.
type shaper struct {
	stream  bool
	rewrite bool // the relay asked for token fields: strip them
	asked   asked
	asm     *trajectory.Assembler
	line    []byte // a stream's unfinished line
	held    []byte // bytes that wait for the record
	over    bool   // a plain reply too large to keep: passed through
	maxKept int    // the largest plain reply kept whole (Config.MaxKeptReply)
	// tr, when set, translates the upstream's chat completion into the
	// API the harness spoke (translate_reply.go): the assembler reads the
	// chat bytes, the harness gets the translation.
	tr *replyTranslator
	// err, once set, fails the attempt: a translated reply the relay
	// cannot keep whole.
	err error
}

// kept is how many bytes the shaper keeps: counted in the open calls'
// byte budget as an attempt's buffer is.
func (s *shaper) kept() int { return len(s.held) + len(s.line) }

// holdsStatus tells whether the harness's status line waits for the reply
// too: a translated plain reply, which may yet fail whole (the harness is
// then told why, as a relay error).
func (s *shaper) holdsStatus() bool { return s.tr != nil && !s.stream }

func newShaper(stream, rewrite bool, a asked, api trajectory.API, maxKept int) *shaper {
	return &shaper{stream: stream, rewrite: rewrite, asked: a, asm: trajectory.NewAPIAssembler(api, stream), maxKept: maxKept}
}

// feed takes the next bytes read from the upstream and returns those the
// harness may have now.
func (s *shaper) feed(p []byte) []byte {
	if !s.stream {
		_, _ = s.asm.Write(p)
		if s.tr != nil && len(s.held)+len(p) > s.maxKept {
			// A translation needs the reply whole: over the bound the call
			// fails, its harness told why.
			s.err = fmt.Errorf("relay: translate: a plain reply over %d bytes (a translation cannot pass half a body)", s.maxKept)
			s.held = nil
			return nil
		}
		if s.tr == nil && (s.over || len(s.held)+len(p) > s.maxKept) {
			// Over the bound a plain reply passes as it comes (the capture
			// still assembles it, or records why it could not).
			s.over = true
			out := append(s.held, p...)
			s.held = nil
			return out
		}
		s.held = append(s.held, p...)
		return nil
	}
	var out []byte
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			break
		}
		line := append(s.line, p[:i+1]...)
		s.line = nil
		p = p[i+1:]
		_, _ = s.asm.Write(line)
		switch {
		case s.tr != nil:
			line = s.tr.line(line)
		case s.rewrite:
			line = s.rewriteLine(line)
		}
		if s.held != nil || s.asm.Finished() || s.tr != nil && s.tr.stopped {
			s.held = append(s.held, line...)
			continue
		}
		out = append(out, line...)
	}
	return out
}

// rewriteLine strips the token fields of a stream's data line.
func (s *shaper) rewriteLine(line []byte) []byte {
	body := bytes.TrimRight(line, "\r\n")
	data, ok := bytes.CutPrefix(body, []byte("data:"))
	if !ok {
		return line
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return line
	}
	out := append([]byte("data: "), strip(data, s.asked)...)
	return append(out, line[len(body):]...)
}

// end returns the bytes that waited for the record (and an unfinished
// last line), rewritten as the harness gets them.
func (s *shaper) end() []byte {
	if s.tr != nil {
		out := s.held
		if !s.stream {
			out = s.tr.plain(bytes.TrimSpace(s.held))
		} else {
			if len(s.line) > 0 {
				out = append(out, s.tr.line(s.line)...)
			}
			out = s.tr.finishStream(out)
		}
		s.held, s.line = nil, nil
		return out
	}
	out := append(s.held, s.line...)
	s.held, s.line = nil, nil
	if !s.stream && s.rewrite && !s.over {
		out = strip(bytes.TrimSpace(out), s.asked)
		out = append(out, '\n')
	}
	return out
}

// exchange is what the capture records of call c answered by attempt a,
// but the reply (Relay.mu held).
func exchange(c *call, a *attempt) trajectory.Exchange {
	now := time.Now()
	ex := trajectory.Exchange{Episode: c.episode, Launch: c.launch, N: c.n, Method: c.method, Path: c.uri, Body: c.body,
		Status: a.status, PolicyVersion: a.header.Get(trajectory.PolicyHeader), Started: c.started,
		Duration: now.Sub(c.started), Generation: a.gen, Resends: c.resends, Edits: c.edits, Via: c.via,
		Branch: branchName(c.branch), Seed: branchSeed(c.branch)}
	if !a.firstByte.IsZero() {
		ex.FirstByte = a.firstByte.Sub(c.started)
	}
	return ex
}

// idHeader sets the call's id on the upstream request.
func idHeader(h http.Header, id string) {
	if id != "" {
		h.Set(trajectory.IDHeader, id)
	}
}
