package trajectory

import (
	"encoding/json"
	"fmt"
	"maps"
)

// This file is the capture's three wire APIs on the reply side: an
// Assembler of a Messages or a Responses reply, streamed or plain, builds
// the assistant message in the trajectory's form (chat completions'), as
// the request side (api.go) makes the same message of it when the harness
// sends it back, so that lineage links the next call to this one. vLLM
// returns no token ids on these paths: a native reply carries none, and
// the capture records none.

// NewAPIAssembler returns an assembler of a reply of api: a stream
// (stream true) or a plain reply. An APIOther reply is not assembled: its
// Reply holds no message, and a stream of it never finishes before its
// end.
func NewAPIAssembler(api API, stream bool) *Assembler {
	a := NewAssembler(stream)
	a.api = api
	return a
}

// native is an Assembler's state for a Messages or a Responses reply.
type native struct {
	blocks  map[int]*nativeBlock // Messages: content block index -> its block
	order   []*nativeBlock       // Messages: in order of their start
	usage   map[string]json.RawMessage
	items   []block // Responses: the output items done
	stopped bool    // Messages: message_stop came
}

// nativeBlock is a Messages content block being assembled.
type nativeBlock struct {
	typ, id, name string
	start         json.RawMessage // a tool_use's input at its start
	text          []byte          // text, thinking, or a tool_use's input JSON
}

// nativeEvent takes one stream event's data (or a plain reply, whole).
func (a *Assembler) nativeEvent(data []byte) {
	var ev struct {
		Type         string          `json:"type"`
		Index        int             `json:"index"`
		Message      json.RawMessage `json:"message"`
		ContentBlock *block          `json:"content_block"`
		Delta        struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Thinking    string `json:"thinking"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage    map[string]json.RawMessage `json:"usage"`
		Item     *block                     `json:"item"`
		Response json.RawMessage            `json:"response"`
		Error    json.RawMessage            `json:"error"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		a.fail(fmt.Sprintf("a chunk that is not JSON: %v", err))
		return
	}
	n := &a.native
	if n.blocks == nil {
		n.blocks = map[int]*nativeBlock{}
	}
	if ev.Type == "error" || len(ev.Error) > 0 && string(ev.Error) != "null" && a.api == APIMessages {
		a.fail("the upstream sent an error: " + string(data))
		return
	}
	if a.api == APIResponses {
		a.responsesEvent(ev.Type, ev.Item, ev.Response, data)
		return
	}
	switch ev.Type {
	case "message":
		a.messagesWhole(data) // a plain reply
	case "message_start":
		a.messagesWhole(ev.Message)
	case "content_block_start":
		if ev.ContentBlock != nil {
			b := &nativeBlock{typ: ev.ContentBlock.Type, id: ev.ContentBlock.ID, name: ev.ContentBlock.Name, start: ev.ContentBlock.Input}
			b.text = append(b.text, ev.ContentBlock.Text...)
			b.text = append(b.text, ev.ContentBlock.Thinking...)
			n.blocks[ev.Index] = b
			n.order = append(n.order, b)
		}
	case "content_block_delta":
		b := n.blocks[ev.Index]
		if b == nil {
			a.fail(fmt.Sprintf("a delta of content block %d, which did not start", ev.Index))
			return
		}
		b.text = append(b.text, ev.Delta.Text...)
		b.text = append(b.text, ev.Delta.Thinking...)
		b.text = append(b.text, ev.Delta.PartialJSON...)
	case "message_delta":
		if ev.Delta.StopReason != "" {
			a.finish = ev.Delta.StopReason
		}
		a.mergeUsage(ev.Usage)
	case "message_stop":
		n.stopped = true
	}
}

// messagesWhole takes a Messages message object: a plain reply, or a
// stream's message_start (its blocks empty).
func (a *Assembler) messagesWhole(m json.RawMessage) {
	var msg struct {
		Model      string                     `json:"model"`
		Role       string                     `json:"role"`
		Content    []json.RawMessage          `json:"content"`
		StopReason string                     `json:"stop_reason"`
		Usage      map[string]json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal(m, &msg); err != nil {
		a.fail(fmt.Sprintf("a message that does not parse: %v", err))
		return
	}
	if msg.Model != "" {
		a.model = msg.Model
	}
	if msg.StopReason != "" {
		a.finish = msg.StopReason
	}
	a.mergeUsage(msg.Usage)
	for _, raw := range msg.Content {
		var b block
		if json.Unmarshal(raw, &b) != nil {
			continue
		}
		nb := &nativeBlock{typ: b.Type, id: b.ID, name: b.Name, start: b.Input}
		nb.text = append(nb.text, b.Text...)
		nb.text = append(nb.text, b.Thinking...)
		a.native.order = append(a.native.order, nb)
	}
}

// mergeUsage lays u over the usage so far (Messages gives the input's in
// message_start, the output's in message_delta).
func (a *Assembler) mergeUsage(u map[string]json.RawMessage) {
	if len(u) == 0 {
		return
	}
	if a.native.usage == nil {
		a.native.usage = map[string]json.RawMessage{}
	}
	maps.Copy(a.native.usage, u)
}

// responsesEvent takes one Responses stream event, or a plain reply (the
// response object, whose type is "response").
func (a *Assembler) responsesEvent(typ string, item *block, response json.RawMessage, data []byte) {
	switch typ {
	case "response.output_item.done":
		if item != nil {
			a.native.items = append(a.native.items, *item)
		}
	case "response.completed", "response.incomplete", "response.failed":
		a.responseWhole(response, len(a.native.items) == 0)
		if a.finish == "" {
			a.finish = "completed"
		}
		if typ == "response.failed" {
			a.fail("the response failed: " + truncate(response, 4096))
		}
	case "response":
		a.responseWhole(data, true)
	}
}

// responseWhole takes a Responses response object: its model, usage,
// status and, with items, its output items.
func (a *Assembler) responseWhole(r json.RawMessage, items bool) {
	if len(r) == 0 {
		return
	}
	var resp struct {
		Model  string                     `json:"model"`
		Status string                     `json:"status"`
		Output []block                    `json:"output"`
		Usage  map[string]json.RawMessage `json:"usage"`
		Error  json.RawMessage            `json:"error"`
	}
	if err := json.Unmarshal(r, &resp); err != nil {
		a.fail(fmt.Sprintf("a response that does not parse: %v", err))
		return
	}
	if resp.Model != "" {
		a.model = resp.Model
	}
	if resp.Status != "" {
		a.finish = resp.Status
	}
	a.mergeUsage(resp.Usage)
	if len(resp.Error) > 0 && string(resp.Error) != "null" {
		a.fail("the upstream sent an error: " + string(resp.Error))
	}
	if items {
		a.native.items = append(a.native.items, resp.Output...)
	}
}

// nativeFinished tells whether a Messages or a Responses reply said it is
// complete: a message_delta with a stop reason (Claude Code takes a stream
// that ends there) or message_stop; response.completed (or its failed and
// incomplete peers).
func (a *Assembler) nativeFinished() bool {
	if a.api == APIMessages {
		return a.finish != "" || a.native.stopped
	}
	return a.finish != ""
}

// nativeMessage returns the assistant message of a Messages or a
// Responses reply, in the trajectory's form.
func (a *Assembler) nativeMessage() json.RawMessage {
	if a.api == APIResponses {
		run := &responseRun{}
		for _, it := range a.native.items {
			run.add(it)
		}
		return marshalPlain(run.message())
	}
	raws := make([]json.RawMessage, 0, len(a.native.order))
	for _, b := range a.native.order {
		blk := map[string]any{"type": b.typ}
		switch b.typ {
		case "text":
			blk["text"] = string(b.text)
		case "thinking":
			blk["thinking"] = string(b.text)
		case "tool_use", "server_tool_use":
			in := json.RawMessage(b.text)
			if len(in) == 0 {
				in = b.start
			}
			if len(in) == 0 || !json.Valid(in) {
				a.fail(fmt.Sprintf("tool_use %s: its input is not JSON: %q", b.id, in))
				in = json.RawMessage("{}")
			}
			blk["id"], blk["name"], blk["input"] = b.id, b.name, in
		}
		raws = append(raws, marshalPlain(blk))
	}
	return marshalPlain(assistantOf(raws))
}
