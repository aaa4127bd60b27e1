package trajectory

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"
)

// Exchange is one model call whole, as the relay saw it, before it is
// recorded.
type Exchange struct {
	// Episode and Launch name the rollout attempt and the launch that
	// made the call; N is its number in the launch (Call.ID), given when
	// the call was taken (0: the next after the launch's highest).
	Episode, Launch string
	N               int
	// Method, Path and Body are the request as forwarded: the harness's,
	// after the relay edits of its launch (Edits).
	Method, Path string
	Body         []byte
	// Status is the upstream's HTTP status and Reply what it answered.
	Status int
	Reply  Reply
	// PolicyVersion is the upstream's PolicyHeader.
	PolicyVersion string
	// Started, FirstByte and Duration time the call (Call.Started and its
	// milliseconds).
	Started             time.Time
	FirstByte, Duration time.Duration
	// Generation and Resends are the relay's (Call.Generation, Resends).
	Generation uint64
	Resends    int
	// Edits are the relay edits that changed Body (Call.Edits).
	Edits []Edit
	// Branch and Seed are the branch label and seed the call went
	// upstream with (Call.Branch, Seed).
	Branch string
	Seed   uint64
	// Via is the API the upstream spoke when the relay translated the
	// call (Call.Via); Reply is then of that API.
	Via API
	// Request, when set, is Body split already (PrepareRequest): the
	// relay splits a request while the upstream answers it, not after.
	Request *Request
}

// Request is a request body split into its model, its other fields and
// its messages, each compact: the part of recording a call that needs
// only the request.
type Request struct {
	api    API
	model  string
	params json.RawMessage
	msgs   []json.RawMessage
	err    error
}

// PrepareRequest splits a chat completion's body for a later Add
// (Exchange.Request): PrepareRequestAt of DefaultPath.
func PrepareRequest(body []byte) *Request { return PrepareRequestAt(DefaultPath, body) }

// PrepareRequestAt splits body, a request to path, for a later Add
// (Exchange.Request): its model, its other fields and its messages in the
// trajectory's form, by the API the path speaks (APIOf). A body that does
// not split is recorded as it came (Call.RawRequest), with why.
func PrepareRequestAt(path string, body []byte) *Request {
	api := APIOf(path)
	model, params, msgs, err := splitAPI(api, body)
	return &Request{api: api, model: model, params: params, msgs: msgs, err: err}
}

// Index is the calls of one capture file, each rebuilt whole: what the
// relay needs to record the next call (its parent, its delta) and what a
// reader needs to rebuild a trajectory. It is not safe for concurrent use.
type Index struct {
	seed      maphash.Seed
	calls     []*whole
	byID      map[string]*whole
	perLaunch map[string]int    // "<episode>.<launch>" -> its highest call number
	byReq     map[uint64]*whole // request hash -> its latest call
	canon     map[uint64]uint64 // a message's bytes' hash -> its key
	// The answered calls by the hash of their messages, and by the hash
	// of their prompt and completion ids; the lengths of the latter,
	// sorted: a parent is found by lookups, not by a scan of every call.
	byMsgs    map[uint64][]*whole
	byChain   map[uint64][]*whole
	chainLens []int
}

// whole is a call and what its delta leaves out.
type whole struct {
	c        *Call
	msgs     []json.RawMessage // every message of the request
	keys     []uint64          // each message's key (its canonical JSON's hash)
	msgsHash uint64            // the hash of keys
	params   json.RawMessage   // the request's other fields, whole
	prompt   []int             // every prompt id
	chain    uint64            // the hash of prompt and completion ids
	echo     string            // the reply message normalized ("" if none)
	replyKey uint64            // the reply message's key
	req      uint64            // the hash of method, path, params and messages: the request
	children int
	kids     []*whole // the calls that continue this one, in order
	replaced string   // the ID of a later call that replaced this one
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{seed: maphash.MakeSeed(), byID: map[string]*whole{}, perLaunch: map[string]int{}, byReq: map[uint64]*whole{}, canon: map[uint64]uint64{},
		byMsgs: map[uint64][]*whole{}, byChain: map[uint64][]*whole{}}
}

// Len returns how many calls the index holds.
func (x *Index) Len() int { return len(x.calls) }

// key returns a message's key: the hash of its canonical JSON (keys
// sorted, no white space), so that two renderings of one message have
// one key. A message is made canonical once: later ones are found by the
// hash of their bytes.
func (x *Index) key(m []byte) uint64 {
	raw := maphash.Bytes(x.seed, m)
	if k, ok := x.canon[raw]; ok {
		return k
	}
	k := raw
	d := json.NewDecoder(bytes.NewReader(m))
	d.UseNumber()
	var v any
	if d.Decode(&v) == nil {
		if b, err := json.Marshal(v); err == nil {
			k = maphash.Bytes(x.seed, b)
		}
	}
	x.canon[raw] = k
	return k
}

// keys returns the key of each message.
func (x *Index) keys(msgs []json.RawMessage) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = x.key(m)
	}
	return out
}

// seqHash hashes a sequence of message keys.
func (x *Index) seqHash(keys []uint64) uint64 {
	var h maphash.Hash
	h.SetSeed(x.seed)
	var b [8]byte
	for _, k := range keys {
		binary.LittleEndian.PutUint64(b[:], k)
		h.Write(b[:])
	}
	return h.Sum64()
}

// idsBytes writes ids as 4 bytes each.
func idsBytes(dst []byte, ids ...[]int) []byte {
	for _, s := range ids {
		for _, id := range s {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(id))
		}
	}
	return dst
}

// Add records ex as the next call and returns its record: its ID, parent
// and link, and its request and prompt as deltas against the parent. A
// call that asks again what an earlier call that nothing continued asked
// replaces that call (see Whole.ReplacedBy).
func (x *Index) Add(ex Exchange) (*Call, error) {
	n := ex.N
	if n == 0 {
		n = x.Next(ex.Episode, ex.Launch)
	}
	id, err := CallID(ex.Episode, ex.Launch, n)
	if err != nil {
		return nil, err
	}
	if _, dup := x.byID[id]; dup {
		return nil, fmt.Errorf("%w: call %s recorded twice", ErrBadCall, id)
	}
	req := ex.Request
	if req == nil {
		req = PrepareRequestAt(ex.Path, ex.Body)
	}
	model, params, msgs := req.model, req.params, req.msgs
	c := &Call{V: Version, ID: id, Episode: ex.Episode, Launch: ex.Launch, Method: ex.Method, Path: ex.Path, Model: model,
		Status: ex.Status, PolicyVersion: ex.PolicyVersion, Started: ex.Started.UTC(),
		FirstByteMS: ms(ex.FirstByte), DurationMS: ms(ex.Duration), Generation: ex.Generation, Resends: ex.Resends, Edits: ex.Edits, Via: ex.Via,
		Branch: ex.Branch, Seed: ex.Seed}
	if req.api != APIChat {
		c.API = req.api
	}
	if req.err != nil {
		// Forwarded all the same: recorded as it came, on no chain.
		c.RequestError, c.RawRequest, params, msgs = req.err.Error(), ex.Body, nil, nil
	}
	r := ex.Reply
	if ex.Status == 200 && r.Error == "" {
		c.Reply, c.FinishReason, c.Usage = r.Message, r.FinishReason, r.Usage
		if r.Model != "" {
			c.Model = r.Model
		}
		if r.Tokens {
			c.Tokens, c.CompletionIDs, c.Logprobs = true, r.CompletionIDs, r.Logprobs
		}
	} else {
		c.Error = r.Error
		if c.Error == "" {
			c.Error = fmt.Sprintf("status %d", ex.Status)
		}
	}
	w := &whole{c: c, msgs: msgs, params: params, prompt: r.PromptIDs}
	if !c.Tokens {
		w.prompt = nil
	}
	if !c.ModelCall() {
		// Not a model call the capture reads (a body that does not parse,
		// another path): no lineage, and nothing continues it.
		c.Reply, c.Tokens, c.CompletionIDs, c.Logprobs, w.prompt = nil, false, nil, nil, nil
		c.Link, c.LinkWhy = LinkRoot, "not a model call: "+c.notModelWhy()
		c.Params = w.params
		c.Messages = w.msgs
		x.insert(w)
		return c, nil
	}
	x.link(w)
	x.delta(w)
	x.insert(w)
	return c, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// link finds w's parent: the earlier call whose prompt and completion are
// the longest prefix of w's prompt, by token ids where both carry them,
// else by messages (the parent's messages, then its reply as the next).
func (x *Index) link(w *whole) {
	c := w.c
	w.keys = x.keys(w.msgs)
	byMsgs, msgsTie := x.byMessages(w)
	var byToks, toksTie *whole
	if c.Tokens {
		byToks, toksTie = x.byTokens(w)
	}
	switch {
	case byToks != nil && byMsgs != nil && msgsTie == nil && len(byMsgs.msgs) > len(byToks.msgs):
		// The messages continue a later call than the tokens do: the
		// parent is that call, whose ids this prompt does not carry on.
		c.Link, c.Parent = LinkTokenBreak, byMsgs.c.ID
		c.LinkWhy = fmt.Sprintf("the messages continue %s but its prompt and completion ids are not a prefix of this prompt (the ids continue %s)", byMsgs.c.ID, byToks.c.ID)
	case byToks != nil && toksTie != nil:
		c.Link, c.LinkWhy = LinkAmbiguous, fmt.Sprintf("calls %s and %s both chain %d prompt tokens", byToks.c.ID, toksTie.c.ID, len(byToks.prompt)+len(byToks.c.CompletionIDs))
	case byToks != nil:
		c.Link, c.Parent = LinkResolved, byToks.c.ID
	case byMsgs != nil && msgsTie != nil:
		c.Link, c.LinkWhy = LinkAmbiguous, fmt.Sprintf("calls %s and %s both chain %d messages", byMsgs.c.ID, msgsTie.c.ID, len(byMsgs.msgs)+1)
	case byMsgs != nil && c.Tokens && byMsgs.c.Tokens:
		c.Link, c.Parent = LinkTokenBreak, byMsgs.c.ID
		c.LinkWhy = fmt.Sprintf("the messages continue %s but its prompt and completion ids are not a prefix of this prompt", byMsgs.c.ID)
	case byMsgs != nil:
		c.Link, c.Parent = LinkResolved, byMsgs.c.ID
	default:
		c.Link = LinkRoot
		switch {
		case len(x.calls) == 0:
			c.LinkWhy = "the first call"
		case len(w.msgs) <= 1:
			c.LinkWhy = "a new conversation"
		default:
			c.LinkWhy = "the history does not continue any earlier call: compacted or rewritten"
		}
	}
}

// chainIDs returns w's prompt and completion ids, in a new slice.
func (w *whole) chainIDs() []int { return append(slices.Clip(w.prompt), w.c.CompletionIDs...) }

// answered tells whether p can be a parent: it has a reply.
func answered(p *whole) bool { return p.c.Error == "" && p.c.Status == 200 && len(p.c.Reply) > 0 }

// byMessages returns the earlier call w continues by messages, the
// longest, and a second one as long that differs (a tie), if any.
func (x *Index) byMessages(w *whole) (best, tie *whole) {
	var h maphash.Hash
	h.SetSeed(x.seed)
	var b [8]byte
	for n := range w.msgs {
		// The calls with n messages, all of them w's first n.
		if n > 0 {
			binary.LittleEndian.PutUint64(b[:], w.keys[n-1])
			h.Write(b[:])
		}
		cands := x.byMsgs[h.Sum64()]
		if len(cands) == 0 {
			continue
		}
		next := normalize(w.msgs[n])
		for _, p := range cands {
			if len(p.msgs) != n || next != p.echo {
				continue
			}
			if best == nil || n > len(best.msgs) {
				best, tie = p, nil
			} else {
				best, tie = rank(best, tie, p)
			}
		}
	}
	return best, tie
}

// byTokens returns the earlier call whose prompt and completion ids are
// the longest prefix of w's prompt ids, and a second one as long that
// differs, if any.
func (x *Index) byTokens(w *whole) (best, tie *whole) {
	if len(x.chainLens) == 0 {
		return nil, nil
	}
	buf := idsBytes(nil, w.prompt)
	var h maphash.Hash
	h.SetSeed(x.seed)
	at := 0
	for _, n := range x.chainLens {
		if n > len(w.prompt) {
			break
		}
		h.Write(buf[at*4 : n*4])
		at = n
		for _, p := range x.byChain[h.Sum64()] {
			if len(p.prompt)+len(p.c.CompletionIDs) != n {
				continue
			}
			if !slices.Equal(w.prompt[:len(p.prompt)], p.prompt) || !slices.Equal(w.prompt[len(p.prompt):n], p.c.CompletionIDs) {
				continue // a hash collision
			}
			if best == nil || n > len(best.prompt)+len(best.c.CompletionIDs) {
				best, tie = p, nil
			} else {
				best, tie = rank(best, tie, p)
			}
		}
	}
	return best, tie
}

// rank weighs p, a later candidate parent that chains as far as best,
// against best and tie. A replaced call is on no chain (its harness asked
// again and went on from the later call), so a call as long that is not
// replaced wins over it, whatever its request: a relaunch that renders
// the re-issued request anew (other fields) leaves two calls with one
// prompt and reply, and its next call continues its own. Else the same
// request again is the later call, and another request is a tie.
func rank(best, tie, p *whole) (*whole, *whole) {
	switch {
	case p.replaced != "" && best.replaced == "":
		return best, tie
	case best.replaced != "" && p.replaced == "":
		return p, nil
	case p.req != best.req:
		return best, p
	default:
		return p, tie
	}
}

// delta stores w's request and prompt as what its parent leaves out.
func (x *Index) delta(w *whole) {
	c := w.c
	var p *whole
	if c.Parent != "" {
		p = x.byID[c.Parent]
	}
	c.Keep, c.Echo, c.PromptKeep = 0, false, 0
	if p != nil {
		for c.Keep < len(p.msgs) && c.Keep < len(w.msgs) && p.keys[c.Keep] == w.keys[c.Keep] {
			c.Keep++
		}
		if c.Keep == len(p.msgs) && c.Keep < len(w.msgs) && len(p.c.Reply) > 0 && w.keys[c.Keep] == p.replyKey {
			c.Echo = true
		}
		if c.Tokens && p.c.Tokens {
			chain := p.chainIDs()
			for c.PromptKeep < len(chain) && c.PromptKeep < len(w.prompt) && chain[c.PromptKeep] == w.prompt[c.PromptKeep] {
				c.PromptKeep++
			}
		}
		if bytes.Equal(p.params, w.params) {
			c.Params = nil
		} else {
			c.Params = w.params
		}
	} else {
		c.Params = w.params
	}
	from := c.Keep
	if c.Echo {
		from++
	}
	c.Messages = w.msgs[from:]
	if c.Tokens {
		c.PromptIDs = w.prompt[c.PromptKeep:]
	}
}

// insert adds w, whole, to the index.
func (x *Index) insert(w *whole) {
	c := w.c
	if w.keys == nil {
		w.keys = x.keys(w.msgs)
	}
	w.msgsHash = x.seqHash(w.keys)
	if len(c.Reply) > 0 {
		w.echo, w.replyKey = normalize(c.Reply), x.key(c.Reply)
	}
	if c.Tokens {
		w.chain = maphash.Bytes(x.seed, idsBytes(nil, w.prompt, c.CompletionIDs))
	}
	var h maphash.Hash
	h.SetSeed(x.seed)
	h.WriteString(c.Method + " " + c.Path + "\x00")
	h.Write(w.params)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], w.msgsHash)
	h.Write(b[:])
	w.req = h.Sum64()
	// The request's latest call is replaced unless something continued
	// it; every earlier one is replaced or continued already.
	if e := x.byReq[w.req]; e != nil && e.children == 0 && e.replaced == "" && e != w && c.ModelCall() {
		e.replaced = c.ID
	}
	if p := x.byID[c.Parent]; p != nil {
		// A later launch that continues p where an earlier launch's call
		// already did, a call nothing continued, re-issues that call: its
		// reply reached the capture but not the harness's saved session
		// (the snapshot took the call, the harness had not saved its
		// reply), and the relaunch asked again from the session. A
		// harness may render the request anew (other ids, other fields),
		// so the request need not be the same; within one launch two
		// calls that continue one are a branch, never replaced.
		for _, e := range p.kids {
			if e.children == 0 && e.replaced == "" && answered(e) && (e.c.Episode != c.Episode || e.c.Launch != c.Launch) {
				e.replaced = c.ID
			}
		}
		p.children++
		p.kids = append(p.kids, w)
	}
	if answered(w) {
		// An earlier call of the same request and the same reply is never
		// a parent over w (the later one wins), so it leaves the lists:
		// they grow with the distinct calls, not with a request sent
		// again and again.
		if w.echo != "" {
			x.byMsgs[w.msgsHash] = append(slices.DeleteFunc(x.byMsgs[w.msgsHash], func(e *whole) bool {
				return e.req == w.req && e.echo == w.echo
			}), w)
		}
		if c.Tokens {
			x.byChain[w.chain] = append(slices.DeleteFunc(x.byChain[w.chain], func(e *whole) bool {
				return e.req == w.req && slices.Equal(e.prompt, w.prompt) && slices.Equal(e.c.CompletionIDs, c.CompletionIDs)
			}), w)
			n := len(w.prompt) + len(c.CompletionIDs)
			if i, found := slices.BinarySearch(x.chainLens, n); !found {
				x.chainLens = slices.Insert(x.chainLens, i, n)
			}
		}
	}
	x.calls = append(x.calls, w)
	x.byID[c.ID] = w
	x.byReq[w.req] = w
	lk := c.Episode + "." + c.Launch
	x.perLaunch[lk] = max(x.perLaunch[lk], c.number())
}

// Next returns the number of the next call of launch in episode: one past
// the highest recorded.
func (x *Index) Next(episode, launch string) int { return x.perLaunch[episode+"."+launch] + 1 }

// Load adds a record read from a capture file: it rebuilds the call whole
// from its parent, which must be in the index already.
func (x *Index) Load(c *Call) error {
	if err := c.fill(); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	if _, dup := x.byID[c.ID]; dup {
		return fmt.Errorf("%w: call %s recorded twice", ErrBadCall, c.ID)
	}
	w := &whole{c: c}
	var p *whole
	if c.Parent != "" {
		if p = x.byID[c.Parent]; p == nil {
			return fmt.Errorf("%w: call %s names parent %s, not recorded before it", ErrBadCall, c.ID, c.Parent)
		}
	}
	var kept []json.RawMessage
	var keptIDs []int
	params := c.Params
	if p != nil {
		if c.Keep > len(p.msgs) {
			return fmt.Errorf("%w: call %s keeps %d messages of %s, which has %d", ErrBadCall, c.ID, c.Keep, p.c.ID, len(p.msgs))
		}
		kept = p.msgs[:c.Keep]
		if c.Echo {
			if len(p.c.Reply) == 0 {
				return fmt.Errorf("%w: call %s echoes the reply of %s, which has none", ErrBadCall, c.ID, p.c.ID)
			}
			kept = append(slices.Clip(kept), p.c.Reply)
		}
		chain := p.chainIDs()
		if c.PromptKeep > len(chain) {
			return fmt.Errorf("%w: call %s keeps %d prompt ids of %s, which chains %d", ErrBadCall, c.ID, c.PromptKeep, p.c.ID, len(chain))
		}
		keptIDs = chain[:c.PromptKeep]
		if params == nil {
			params = p.params
		}
	}
	w.msgs = append(slices.Clip(kept), c.Messages...)
	w.params = params
	if c.Tokens {
		w.prompt = append(slices.Clip(keptIDs), c.PromptIDs...)
	}
	x.insert(w)
	return nil
}

// Whole is a call rebuilt: its record and its request's messages and
// prompt ids in full.
type Whole struct {
	*Call
	// AllMessages is every message of the request, AllParams its other
	// fields; AllPromptIDs every prompt id (nil without Tokens).
	AllMessages  []json.RawMessage
	AllParams    json.RawMessage
	AllPromptIDs []int
	// Children counts the calls that continue this one; ReplacedBy names
	// the later call that asked it again when nothing had continued this
	// one: the same request, or a later launch's call with the same
	// parent (a reply a snapshot held but the harness had not saved,
	// asked again by the relaunch). Such a call is not on the rollout's
	// chain.
	Children   int
	ReplacedBy string
	// request is the index's hash of the call's request (method, path,
	// params, messages): what Check counts duplicates by.
	request uint64
}

// Calls returns every call, whole, in the order recorded.
func (x *Index) Calls() []Whole {
	out := make([]Whole, len(x.calls))
	for i, w := range x.calls {
		out[i] = Whole{Call: w.c, AllMessages: w.msgs, AllParams: w.params, AllPromptIDs: w.prompt, Children: w.children, ReplacedBy: w.replaced, request: w.req}
	}
	return out
}

// normalize returns the form of a message that two renderings of one
// message share: its role, its text (a string, or the text parts of an
// array), its tool calls' ids, names and arguments (compact JSON); not its
// reasoning, its null or empty fields, or the order of its keys. It is the
// test of Call.Echo.
func normalize(m json.RawMessage) string {
	var v struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if json.Unmarshal(m, &v) != nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(v.Role)
	b.WriteByte(0)
	b.WriteString(MessageText(v.Content))
	for _, c := range v.ToolCalls {
		args := c.Function.Arguments
		var cb bytes.Buffer
		if json.Compact(&cb, []byte(args)) == nil {
			args = cb.String()
		}
		fmt.Fprintf(&b, "\x00%s\x00%s\x00%s", c.ID, c.Function.Name, args)
	}
	return b.String()
}

// MessageText returns the text of a message's content: a string, or the
// text parts of an array of parts joined ("" for anything else).
func MessageText(c json.RawMessage) string {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(c, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return ""
}
