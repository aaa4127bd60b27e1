package trajectory

// decodePayload reads one reply or stream chunk into p as json.Unmarshal
// would, in one pass and without reflection, since a capture decodes every
// chunk of every call: the same values, into the same nil or empty slices,
// from keys matched the same way (exactly, else case-insensitively), an
// error where encoding/json gives one (bad syntax, a value of the wrong
// type, an int that is not one, nesting over maxDepth). As encoding/json,
// it decodes a key given twice into what the first left (scalars replaced,
// objects and arrays' elements merged), and leaves a string or number
// given null as it was. The raw values (usage, error, content) are slices of data.
// FuzzDecodePayload holds it to json.Unmarshal.
func decodePayload(data []byte, p *payload) error {
	d := decoder{data: data}
	d.ws()
	var err error
	switch d.peek() {
	case '{':
		err = d.payload(p)
	case 'n':
		err = d.null()
	default:
		err = d.mismatch("a reply object")
	}
	if err != nil {
		return err
	}
	d.ws()
	if d.i < len(d.data) {
		return d.syntax("after the top-level value")
	}
	return nil
}

// The members each object of a payload decodes, in the order of the cases
// that decode them; any other member is skipped.
var (
	payloadFields  = []string{"model", "prompt_token_ids", "usage", "error", "choices"}
	choiceFields   = []string{"index", "finish_reason", "token_ids", "prompt_token_ids", "logprobs", "message", "delta"}
	logprobsFields = []string{"content"}
	logprobFields  = []string{"token", "logprob"}
	deltaFields    = []string{"role", "content", "reasoning_content", "reasoning", "tool_calls"}
	callFields     = []string{"index", "id", "type", "function"}
	functionFields = []string{"name", "arguments"}
)

// payload decodes the top-level object into p.
func (d *decoder) payload(p *payload) error {
	if err := d.open(1); err != nil {
		return err
	}
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, payloadFields) {
		case 0:
			err = d.str(&p.Model, 1)
		case 1:
			err = d.ints(&p.PromptTokenIDs, 1)
		case 2:
			err = d.raw(&p.Usage, 1)
		case 3:
			err = d.raw(&p.Error, 1)
		case 4:
			err = d.choices(&p.Choices, 1)
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
}

// choice decodes one of the choices into c; null leaves it as it was.
func (d *decoder) choice(c *choice, depth int) error {
	if ok, err := d.object(depth, "a choice"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, choiceFields) {
		case 0:
			err = d.integer(&c.Index, depth)
		case 1:
			err = d.strPtr(&c.FinishReason, depth)
		case 2:
			err = d.ints(&c.TokenIDs, depth)
		case 3:
			err = d.ints(&c.PromptTokenIDs, depth)
		case 4:
			err = d.logprobsPtr(&c.Logprobs, depth)
		case 5:
			err = d.deltaPtr(&c.Message, depth)
		case 6:
			err = d.deltaPtr(&c.Delta, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// logprobs decodes a choice's logprobs into l.
func (d *decoder) logprobs(l *choiceLogprobs, depth int) error {
	if ok, err := d.object(depth, "logprobs"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, logprobsFields) {
		case 0:
			err = d.logprobContent(&l.Content, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// logprob decodes one token's logprob into t (its top_logprobs skipped).
func (d *decoder) logprob(t *tokenLogprob, depth int) error {
	if ok, err := d.object(depth, "a token's logprob"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, logprobFields) {
		case 0:
			err = d.str(&t.Token, depth)
		case 1:
			err = d.float(&t.Logprob, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// delta decodes a choice's message or delta into m.
func (d *decoder) delta(m *delta, depth int) error {
	if ok, err := d.object(depth, "a message"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, deltaFields) {
		case 0:
			err = d.str(&m.Role, depth)
		case 1:
			err = d.raw(&m.Content, depth)
		case 2:
			err = d.strPtr(&m.ReasoningContent, depth)
		case 3:
			err = d.strPtr(&m.Reasoning, depth)
		case 4:
			err = d.toolCalls(&m.ToolCalls, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// toolCall decodes one of a message's tool calls into t.
func (d *decoder) toolCall(t *toolCallDelta, depth int) error {
	if ok, err := d.object(depth, "a tool call"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, callFields) {
		case 0:
			err = d.intPtr(&t.Index, depth)
		case 1:
			err = d.str(&t.ID, depth)
		case 2:
			err = d.str(&t.Type, depth)
		case 3:
			err = d.function(&t.Function, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// function decodes a tool call's function into f.
func (d *decoder) function(f *functionDelta, depth int) error {
	if ok, err := d.object(depth, "a function"); !ok {
		return err
	}
	depth++
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil || end {
			return err
		}
		switch field(name, fl, functionFields) {
		case 0:
			err = d.str(&f.Name, depth)
		case 1:
			err = d.str(&f.Arguments, depth)
		default:
			err = d.skip(depth)
		}
		if err != nil {
			return err
		}
	}
}

// strPtr decodes a string into a pointer as encoding/json does: null
// makes it nil, a string goes where it points, new if it was nil.
func (d *decoder) strPtr(dst **string, depth int) error {
	if d.peek() == 'n' {
		*dst = nil
		return d.null()
	}
	return d.str(target(dst), depth)
}

// intPtr decodes an int into a pointer, as strPtr a string.
func (d *decoder) intPtr(dst **int, depth int) error {
	if d.peek() == 'n' {
		*dst = nil
		return d.null()
	}
	return d.integer(target(dst), depth)
}

// logprobsPtr decodes a choice's logprobs into a pointer, as strPtr a string.
func (d *decoder) logprobsPtr(dst **choiceLogprobs, depth int) error {
	if d.peek() == 'n' {
		*dst = nil
		return d.null()
	}
	return d.logprobs(target(dst), depth)
}

// deltaPtr decodes a message or delta into a pointer, as strPtr a string.
func (d *decoder) deltaPtr(dst **delta, depth int) error {
	if d.peek() == 'n' {
		*dst = nil
		return d.null()
	}
	return d.delta(target(dst), depth)
}

// target returns what *dst points to, new if it was nil.
func target[T any](dst **T) *T {
	if *dst == nil {
		*dst = new(T)
	}
	return *dst
}

// choices decodes the choices into *dst as encoding/json decodes an array
// into a slice: each element into the slice's own in place (the slice
// grown as needed, then cut to the array's length); an empty array gives
// an empty slice, null a nil one. It and the other decoders of arrays
// are written out, not one generic function taking the element's decoder:
// a call through a function value would move the decoder to the heap.
func (d *decoder) choices(dst *[]choice, depth int) error {
	if ok, err := d.array(depth, "choices"); !ok {
		if err == nil {
			*dst = nil
		}
		return err
	}
	s, i := *dst, 0
	for ; ; i++ {
		end, err := d.elem(i == 0)
		if err != nil {
			return err
		}
		if end {
			break
		}
		s = grow(s, i)
		if err := d.choice(&s[i], depth+1); err != nil {
			return err
		}
	}
	*dst = cut(s, i)
	return nil
}

// toolCalls decodes a message's tool calls into *dst, as choices the choices.
func (d *decoder) toolCalls(dst *[]toolCallDelta, depth int) error {
	if ok, err := d.array(depth, "tool calls"); !ok {
		if err == nil {
			*dst = nil
		}
		return err
	}
	s, i := *dst, 0
	for ; ; i++ {
		end, err := d.elem(i == 0)
		if err != nil {
			return err
		}
		if end {
			break
		}
		s = grow(s, i)
		if err := d.toolCall(&s[i], depth+1); err != nil {
			return err
		}
	}
	*dst = cut(s, i)
	return nil
}

// logprobContent decodes a choice's logprobs, one per token, into *dst as
// choices the choices; into a buffer on the stack first when the slice is
// empty (the usual case), then copied out: one allocation, not one per
// doubling.
func (d *decoder) logprobContent(dst *[]tokenLogprob, depth int) error {
	if ok, err := d.array(depth, "logprobs' content"); !ok {
		if err == nil {
			*dst = nil
		}
		return err
	}
	if len(*dst) > 0 {
		s, err := d.logprobElems(*dst, depth)
		*dst = s
		return err
	}
	var buf [32]tokenLogprob
	s, err := d.logprobElems(buf[:0], depth)
	if err != nil {
		return err
	}
	*dst = append(make([]tokenLogprob, 0, len(s)), s...)
	return nil
}

// logprobElems decodes the elements of an array whose bracket was read
// into s, in place, and returns it. It returns s, not stores it, so that
// a buffer on the stack stays there.
func (d *decoder) logprobElems(s []tokenLogprob, depth int) ([]tokenLogprob, error) {
	i := 0
	for ; ; i++ {
		end, err := d.elem(i == 0)
		if err != nil {
			return s, err
		}
		if end {
			break
		}
		s = grow(s, i)
		if err := d.logprob(&s[i], depth+1); err != nil {
			return s, err
		}
	}
	return cut(s, i), nil
}

// ints decodes an array of ints into *dst as logprobContent its logprobs.
func (d *decoder) ints(dst *[]int, depth int) error {
	if ok, err := d.array(depth, "an int array"); !ok {
		if err == nil {
			*dst = nil
		}
		return err
	}
	if len(*dst) > 0 {
		s, err := d.intElems(*dst, depth)
		*dst = s
		return err
	}
	var buf [64]int
	s, err := d.intElems(buf[:0], depth)
	if err != nil {
		return err
	}
	*dst = append(make([]int, 0, len(s)), s...)
	return nil
}

// intElems is logprobElems for ints.
func (d *decoder) intElems(s []int, depth int) ([]int, error) {
	i := 0
	for ; ; i++ {
		end, err := d.elem(i == 0)
		if err != nil {
			return s, err
		}
		if end {
			break
		}
		s = grow(s, i)
		if err := d.integer(&s[i], depth+1); err != nil {
			return s, err
		}
	}
	return cut(s, i), nil
}

// grow makes s hold element i, the next, as encoding/json grows a slice
// it decodes into: within its capacity, where the element keeps what it
// held, else by one.
func grow[T any](s []T, i int) []T {
	switch {
	case i < len(s):
		return s
	case i < cap(s):
		return s[:i+1]
	}
	var zero T
	return append(s, zero)
}

// cut ends a slice that took i elements: s cut to them, or none an empty
// slice, as encoding/json leaves one.
func cut[T any](s []T, i int) []T {
	if i == 0 {
		return []T{}
	}
	return s[:i]
}
