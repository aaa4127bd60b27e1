package trajectory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Reply is what a capture keeps of an upstream's reply: the assistant
// message whole, a stream assembled.
type Reply struct {
	// Message is the assistant message: role, content, tool calls (in
	// index order, their arguments joined), and reasoning content where
	// the upstream sends it.
	Message json.RawMessage
	// FinishReason, Usage and Model are the upstream's.
	FinishReason string
	Usage        json.RawMessage
	Model        string
	// Tokens is true when the reply carried the prompt's and the
	// completion's token ids (vLLM's prompt_token_ids and token_ids,
	// SGLang's per choice); Logprobs holds one logprob per completion id
	// where the reply carried them.
	Tokens        bool
	PromptIDs     []int
	CompletionIDs []int
	Logprobs      []float64
	// Error is set when the reply is no completion: why.
	Error string
}

// maxAssembled bounds the bytes an Assembler keeps of a reply that is not
// a stream (it must parse it whole) and of one unfinished stream line.
const maxAssembled = 64 << 20

// Assembler builds a Reply from a reply's body as it is read: a stream
// (server-sent events) event by event, a plain reply whole at the end. It
// keeps only the message being assembled, the token arrays and one
// unfinished line.
type Assembler struct {
	stream bool
	api    API    // "" or APIChat: chat completions
	native native // a Messages or a Responses reply's (api_reply.go)
	buf    []byte // a plain body; or a stream's unfinished line
	err    string
	done   bool // a stream's [DONE] came

	role, content, reasoning strings.Builder
	calls                    []*toolCall
	finish, model            string
	usage                    json.RawMessage
	prompt, completion       []int
	logprobs                 []float64
	hasPrompt, hasIDs        bool
	lpIDs                    []int // ids read from "token_id:<n>" logprob tokens
	lpNamed                  bool  // every logprob token so far was a token_id:<n>
}

type toolCall struct {
	id, typ, name string
	args          strings.Builder
}

// NewAssembler returns an assembler of a stream (stream true) or a plain
// reply.
func NewAssembler(stream bool) *Assembler { return &Assembler{stream: stream, lpNamed: true} }

// Write feeds the next bytes of the body. It never fails: what does not
// parse is kept as the Reply's Error.
func (a *Assembler) Write(p []byte) (int, error) {
	if !a.stream {
		if len(a.buf)+len(p) > maxAssembled {
			a.fail(fmt.Sprintf("reply over %d bytes", maxAssembled))
			return len(p), nil
		}
		a.buf = append(a.buf, p...)
		return len(p), nil
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(a.buf)+len(p) > maxAssembled {
				a.fail(fmt.Sprintf("a stream line over %d bytes", maxAssembled))
				a.buf = a.buf[:0]
				return n, nil
			}
			a.buf = append(a.buf, p...)
			break
		}
		line := p[:i]
		if len(a.buf) > 0 {
			line = append(a.buf, line...)
			a.buf = a.buf[:0]
		}
		a.line(bytes.TrimRight(line, "\r"))
		p = p[i+1:]
	}
	return n, nil
}

// Done tells whether a stream's [DONE] came: the reply is whole though the
// connection may not have ended.
func (a *Assembler) Done() bool { return a.done }

// Finished tells whether the reply said it is complete: a finish reason
// or a stream's [DONE] came. What follows (usage, [DONE]) adds nothing a
// harness acts on.
func (a *Assembler) Finished() bool {
	switch a.api {
	case APIMessages, APIResponses:
		return a.nativeFinished()
	case APIOther:
		return false
	}
	return a.done || a.finish != ""
}

func (a *Assembler) fail(why string) {
	if a.err == "" {
		a.err = why
	}
}

// line takes one line of a stream.
func (a *Assembler) line(l []byte) {
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok {
		return // an event name, an id, a comment, the blank line between events
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		a.done = true
		return
	}
	if len(data) == 0 {
		return
	}
	switch a.api {
	case APIMessages, APIResponses:
		a.nativeEvent(data)
	case APIOther:
	default:
		a.chunk(data)
	}
}

// payload is what a reply (or a stream's chunk) says that a capture keeps.
// decodePayload reads it; the tags say what from, as json.Unmarshal would.
type payload struct {
	Model          string          `json:"model"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
	Usage          json.RawMessage `json:"usage"`
	Error          json.RawMessage `json:"error"`
	Choices        []choice        `json:"choices"`
}

// choice is one of a payload's choices.
type choice struct {
	Index        int     `json:"index"`
	FinishReason *string `json:"finish_reason"`
	// vLLM's completion ids; SGLang names the prompt's per choice.
	TokenIDs       []int           `json:"token_ids"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
	Logprobs       *choiceLogprobs `json:"logprobs"`
	Message        *delta          `json:"message"`
	Delta          *delta          `json:"delta"`
}

// choiceLogprobs is a choice's logprobs: one per completion token.
type choiceLogprobs struct {
	Content []tokenLogprob `json:"content"`
}

// tokenLogprob is one completion token's logprob.
type tokenLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// delta is a choice's message, or a stream chunk's part of it.
type delta struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
	ToolCalls        []toolCallDelta `json:"tool_calls"`
}

// toolCallDelta is a message's tool call, or a stream chunk's part of one.
type toolCallDelta struct {
	Index    *int          `json:"index"`
	ID       string        `json:"id"`
	Type     string        `json:"type"`
	Function functionDelta `json:"function"`
}

// functionDelta is a tool call's function, or a stream chunk's part of it.
type functionDelta struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// chunk takes one stream chunk (or a plain reply, whole).
func (a *Assembler) chunk(data []byte) {
	var p payload
	if err := decodePayload(data, &p); err != nil {
		a.fail(fmt.Sprintf("a chunk that is not JSON: %v", err))
		return
	}
	if len(p.Error) > 0 && string(p.Error) != "null" {
		a.fail("the upstream sent an error: " + string(p.Error))
	}
	if p.Model != "" {
		a.model = p.Model
	}
	if len(p.Usage) > 0 && string(p.Usage) != "null" {
		a.usage = append(json.RawMessage(nil), p.Usage...)
	}
	if p.PromptTokenIDs != nil {
		a.prompt, a.hasPrompt = p.PromptTokenIDs, true
	}
	for _, c := range p.Choices {
		if c.Index != 0 {
			a.fail(fmt.Sprintf("choice %d: a capture keeps one choice", c.Index))
			continue
		}
		if c.PromptTokenIDs != nil {
			a.prompt, a.hasPrompt = c.PromptTokenIDs, true
		}
		if c.TokenIDs != nil {
			a.completion, a.hasIDs = append(a.completion, c.TokenIDs...), true
		}
		if c.Logprobs != nil {
			for _, t := range c.Logprobs.Content {
				a.logprobs = append(a.logprobs, t.Logprob)
				if id, ok := strings.CutPrefix(t.Token, "token_id:"); ok && a.lpNamed {
					if n, err := strconv.Atoi(id); err == nil {
						a.lpIDs = append(a.lpIDs, n)
						continue
					}
				}
				a.lpNamed = false
			}
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			a.finish = *c.FinishReason
		}
		d := c.Delta
		if d == nil {
			d = c.Message
		}
		if d != nil {
			a.delta(d)
		}
	}
}

func (a *Assembler) delta(d *delta) {
	if d.Role != "" && a.role.Len() == 0 {
		a.role.WriteString(d.Role)
	}
	if c := d.Content; len(c) > 0 && c[0] == '"' {
		unquote(&a.content, c[1:len(c)-1]) // a string; null or another kind adds nothing
	}
	if d.ReasoningContent != nil {
		a.reasoning.WriteString(*d.ReasoningContent)
	} else if d.Reasoning != nil {
		a.reasoning.WriteString(*d.Reasoning)
	}
	for k, tc := range d.ToolCalls {
		i := k
		if tc.Index != nil {
			i = *tc.Index
		}
		if i < 0 || i > 1024 {
			a.fail(fmt.Sprintf("tool call index %d", i))
			continue
		}
		for len(a.calls) <= i {
			a.calls = append(a.calls, &toolCall{})
		}
		c := a.calls[i]
		if tc.ID != "" {
			c.id = tc.ID
		}
		if tc.Type != "" {
			c.typ = tc.Type
		}
		if tc.Function.Name != "" {
			c.name += tc.Function.Name
		}
		c.args.WriteString(tc.Function.Arguments)
	}
}

// Reply returns the reply assembled from what was written. status is the
// upstream's HTTP status: a reply other than 200 is kept as its Error.
func (a *Assembler) Reply(status int) Reply {
	if !a.stream && status == 200 && a.err == "" {
		switch a.api {
		case APIMessages:
			a.messagesWhole(bytes.TrimSpace(a.buf))
		case APIResponses:
			a.responseWhole(bytes.TrimSpace(a.buf), true)
		case APIOther:
		default:
			a.chunk(bytes.TrimSpace(a.buf))
		}
	}
	if status != 200 {
		body := a.buf
		if a.stream {
			body = nil
		}
		return Reply{Error: fmt.Sprintf("status %d: %s", status, truncate(body, 4096))}
	}
	r := Reply{FinishReason: a.finish, Usage: a.usage, Model: a.model, Error: a.err}
	switch a.api {
	case APIOther:
		return Reply{Error: a.err}
	case APIMessages, APIResponses:
		r.Message = a.nativeMessage()
		r.Error = a.err // nativeMessage may have found one
		if a.native.usage != nil {
			r.Usage = marshalPlain(a.native.usage)
		}
		if a.stream && !a.nativeFinished() && r.Error == "" {
			r.Error = "the stream ended without its final event"
		}
		return r
	}
	role := a.role.String()
	if role == "" {
		role = "assistant"
	}
	msg := map[string]any{"role": role, "content": a.content.String()}
	if a.reasoning.Len() > 0 {
		msg["reasoning_content"] = a.reasoning.String()
	}
	if len(a.calls) > 0 {
		calls := make([]map[string]any, len(a.calls))
		for i, c := range a.calls {
			typ := c.typ
			if typ == "" {
				typ = "function"
			}
			calls[i] = map[string]any{"id": c.id, "type": typ, "function": map[string]string{"name": c.name, "arguments": c.args.String()}}
		}
		msg["tool_calls"] = calls
	}
	r.Message = marshalPlain(msg)
	completion := a.completion
	if !a.hasIDs && a.lpNamed && len(a.lpIDs) > 0 && len(a.lpIDs) == len(a.logprobs) {
		completion = a.lpIDs // return_tokens_as_token_ids without token_ids
	}
	if a.hasPrompt && completion != nil {
		r.Tokens, r.PromptIDs, r.CompletionIDs = true, a.prompt, completion
		if len(a.logprobs) == len(completion) {
			r.Logprobs = a.logprobs
		} else if len(a.logprobs) > 0 {
			r.Error = fmt.Sprintf("%d logprobs for %d completion ids", len(a.logprobs), len(completion))
		}
	}
	if a.stream && !a.done && r.FinishReason == "" && r.Error == "" {
		r.Error = "the stream ended without a finish reason or [DONE]"
	}
	return r
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
