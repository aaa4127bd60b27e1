package modelserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// TaskHeader names the task of a request.
const TaskHeader = "X-Stillpoint-Task"

// SavedHeader carries when the sender saved the reply to its previous
// request (RFC 3339): the ledger then knows whether a snapshot could hold it.
const SavedHeader = "X-Stillpoint-Saved"

// EpisodeHeader names the episode (rollout attempt) that sends a request;
// the ledger keeps it, so that a call one attempt abandoned in a crash and
// the next attempt re-issued tells apart from a repeat.
const EpisodeHeader = "X-Stillpoint-Episode"

// ToolCall is a tool call in a scripted reply (OpenAI shape).
type ToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Turn is one scripted assistant reply: text, tool calls, or both.
// Branches, when set, are what a branch's request answers instead
// (branch.go): the entry of its label, else the AnyBranch one ("*"), else
// the turn itself; BranchPlaceholder in the content and the tool calls'
// arguments becomes the label.
type Turn struct {
	Content   string          `json:"content,omitempty"`
	ToolCalls []ToolCall      `json:"tool_calls,omitempty"`
	Branches  map[string]Turn `json:"branches,omitempty"`
}

// Script maps a task id to its turns, in order.
type Script map[string][]Turn

// Message is a chat message as the server reads it.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// Request is the part of a chat-completions request the server reads.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Stream   bool      `json:"stream,omitempty"`
	User     string    `json:"user,omitempty"`
	// Tools are the tools the caller offers (OpenCode offers its own;
	// the scripted harness none). A request with tools gets OpenCode's
	// turn numbering, and its scripted tool calls are checked against
	// them (opencode.go).
	Tools json.RawMessage `json:"tools,omitempty"`
	// StreamOptions asks for a usage chunk at the end of a stream.
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	// ReturnTokenIDs asks for the token ids, as vLLM gives them: the
	// prompt's at the top level (prompt_token_ids, in a stream's first
	// chunk) and the completion's per choice (token_ids, in a stream each
	// chunk's own).
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
	// Logprobs asks for the completion tokens' logprobs (per choice,
	// logprobs.content[]); TopLogprobs must then be 0 or absent, never
	// null; ReturnTokensAsTokenIDs writes each token as "token_id:<n>".
	Logprobs               bool            `json:"logprobs,omitempty"`
	TopLogprobs            json.RawMessage `json:"top_logprobs,omitempty"`
	ReturnTokensAsTokenIDs bool            `json:"return_tokens_as_token_ids,omitempty"`
}

// StreamOptions are a streamed request's options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// APIChat, APIMessages, APIResponses name the wire API of a ledger entry.
const (
	APIChat      = "chat"
	APIMessages  = "messages"
	APIResponses = "responses"
)

// Entry is one request in the ledger.
type Entry struct {
	// API is the wire API of the request: APIChat, APIMessages or
	// APIResponses.
	API  string `json:"api,omitempty"`
	Task string `json:"task"`
	// Episode is the sender's EpisodeHeader.
	Episode string `json:"episode,omitempty"`
	// Branch and Seed are the branch label and seed the request carried
	// (sandboxapi.BranchHeader, SeedHeader): "" and 0 for no branch. The
	// same conversation from two branches is two calls, never a repeat.
	Branch string `json:"branch,omitempty"`
	Seed   uint64 `json:"seed,omitempty"`
	// Digest is the sha256 of the request's messages (canonical JSON).
	Digest string `json:"digest"`
	// PrevSaved is when the sender saved its previous reply (SavedHeader),
	// zero when it did not say.
	PrevSaved time.Time `json:"prev_saved,omitzero"`
	// Messages is how many messages the request carried: the conversation
	// only grows, so a later request of the episode with more messages
	// means this reply was saved.
	Messages int `json:"messages"`
	// Turn is the script turn answered; UserTurns counts user messages
	// with content a user typed or a CLI added (a message of tool results
	// only is none).
	Turn      int  `json:"turn"`
	UserTurns int  `json:"user_turns"`
	Stream    bool `json:"stream"`
	// Cut tells a streamed reply stopped early on purpose.
	Cut bool `json:"cut,omitempty"`
	// Title marks OpenCode's title call: not a turn of the script.
	Title bool `json:"title,omitempty"`
	// Retried tells the turn was answered again because the tool calls of
	// its earlier answer were interrupted (an OpenCode session continued
	// after a crash mid-tool): a new request, not a repeat.
	Retried bool `json:"retried,omitempty"`
	// Chunks counts the chunks of a streamed reply written so far.
	Chunks int `json:"chunks,omitempty"`
	// PromptTokenIDs and TokenIDs are the request's prompt and its whole
	// reply in the server's tokenizer (tokens.go), whether or not the
	// request asked for them; Sent is how many of TokenIDs were written
	// (fewer for a stream cut or left).
	PromptTokenIDs []int     `json:"prompt_token_ids"`
	TokenIDs       []int     `json:"token_ids"`
	Sent           int       `json:"sent"`
	Time           time.Time `json:"time"`
	// Delivered is when the whole reply was written; zero for a reply the
	// caller never got (it went away while the reply was held).
	Delivered time.Time `json:"delivered,omitzero"`
}

// Server is the scripted model server. Its methods are safe for concurrent
// use.
type Server struct {
	script Script

	mu      sync.Mutex
	ledger  []Entry
	hold    chan struct{} // closed on Release; nil when not holding
	from    int           // the first turn a hold holds
	last    bool          // the hold holds each task's last turn only (HoldLast)
	spare   int           // how many tasks HoldLast lets through
	passed  map[string]bool
	held    int
	cutNext int           // chunks after which the next stream stops; 0: no cut
	slow    time.Duration // the wait between the chunks of the next stream
}

// New returns a server answering from script.
func New(script Script) *Server { return &Server{script: script} }

// Hold makes every reply wait until Release.
func (s *Server) Hold() { s.HoldFrom(0) }

// HoldFrom makes the replies to turn and later turns of every task wait
// until Release, so that a test can catch a caller at a given turn
// without racing it there; OpenCode's title calls are not held.
func (s *Server) HoldFrom(turn int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hold == nil {
		s.hold = make(chan struct{})
	}
	s.from, s.last = turn, false
}

// HoldLast makes the reply to each task's last script turn wait until
// Release, except for the first spare tasks to get there: a test or the
// demo then knows that those finish while every other rollout waits inside
// its launch, however the tasks' pace differs.
func (s *Server) HoldLast(spare int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hold == nil {
		s.hold = make(chan struct{})
	}
	s.from, s.last, s.spare, s.passed = 0, true, spare, map[string]bool{}
}

// holds tells whether the hold in force holds entry's reply; s.mu is held.
func (s *Server) holds(entry Entry) bool {
	if s.hold == nil || entry.Title || entry.Turn < s.from {
		return false
	}
	if !s.last {
		return true
	}
	if turns, ok := s.script[entry.Task]; !ok || entry.Turn != len(turns)-1 || s.passed[entry.Task] {
		return false
	}
	if len(s.passed) < s.spare {
		s.passed[entry.Task] = true
		return false
	}
	return true
}

// Release lets held replies go.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hold != nil {
		close(s.hold)
		s.hold = nil
	}
}

// Held returns how many replies wait now.
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// CutNext makes the next streamed reply stop after chunks chunks, without
// its final [DONE].
func (s *Server) CutNext(chunks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cutNext = chunks
}

// SlowNext makes the next streamed reply wait d before each of its chunks
// after the first, so that a test can catch its caller mid-stream (the
// ledger entry's Chunks says how far it got).
func (s *Server) SlowNext(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slow = d
}

// Ledger returns a copy of every request so far.
func (s *Server) Ledger() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Entry(nil), s.ledger...)
}

// Digest returns the ledger digest of messages.
func Digest(msgs []Message) string {
	b, _ := json.Marshal(msgs)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ServeHTTP answers /v1/chat/completions, /v1/messages (messages.go),
// /v1/responses (responses.go) and GET /ledger.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/ledger":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Ledger())
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		s.complete(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		s.responses(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages":
		s.messages(w, r)
	default:
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
	}
}

func apiError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": fmt.Sprintf(format, args...)}})
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		apiError(w, http.StatusBadRequest, "reading the body: %v", err)
		return
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		apiError(w, http.StatusBadRequest, "the body is not a chat-completions request: %v", err)
		return
	}
	if err := checkTokenOptions(req); err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	task := r.Header.Get(TaskHeader)
	if task == "" {
		task = req.User
	}
	turns, ok := s.script[task]
	if !ok {
		apiError(w, http.StatusNotFound, "no script for task %q", task)
		return
	}
	title := isTitleCall(r, req)
	branch, seed := requestBranch(r)
	turn, users, retries := 0, 0, 0
	for _, m := range req.Messages {
		switch m.Role {
		case "assistant":
			turn++
		case "user":
			users++
		}
	}
	if len(req.Tools) > 0 {
		turn, retries = openCodeTurn(req.Messages)
	}
	var t Turn
	switch {
	case title:
		t, turn, users = Turn{Content: TitleReply}, 0, users-1 // the title prompt is not the task's user turn
	case turn >= len(turns):
		apiError(w, http.StatusBadRequest, "task %q has %d turns; the request is at turn %d", task, len(turns), turn)
		return
	default:
		t = retry(turns[turn].ForBranch(branch), retries)
		if err := checkToolCalls(req.Tools, t.ToolCalls); err != nil {
			apiError(w, http.StatusBadRequest, "task %q turn %d: %v", task, turn, err)
			return
		}
	}
	prevSaved, _ := time.Parse(time.RFC3339Nano, r.Header.Get(SavedHeader))
	prompt, completion := PromptTokens(req), completionTokens(t)
	entry := Entry{API: APIChat, Task: task, Episode: r.Header.Get(EpisodeHeader), Branch: branch, Seed: seed, Messages: len(req.Messages), PrevSaved: prevSaved, Digest: Digest(req.Messages), Turn: turn, UserTurns: users, Stream: req.Stream, Title: title, Retried: retries > 0,
		PromptTokenIDs: prompt, TokenIDs: ids(completion), Time: time.Now()}
	index, o, ok := s.admit(r, entry)
	if !ok {
		return
	}
	id := fmt.Sprintf("chatcmpl-%s-%d", entry.Digest[:12], turn)
	var werr error
	tk := tokenReply{req: req, prompt: prompt}
	if !req.Stream {
		choice := map[string]any{"index": 0, "finish_reason": finish(t),
			"message": map[string]any{"role": "assistant", "content": t.Content, "tool_calls": t.ToolCalls}}
		tk.choice(choice, completion, 0)
		reply := map[string]any{"id": id, "object": "chat.completion", "model": req.Model, "choices": []any{choice}, "usage": usage(prompt, completion)}
		if req.ReturnTokenIDs {
			reply["prompt_token_ids"] = prompt
		}
		w.Header().Set("Content-Type", "application/json")
		werr = json.NewEncoder(w).Encode(reply)
		if werr == nil {
			s.progress(index, 0, len(completion))
		}
	} else {
		o.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		o.tokens = tk
		o.sent = func(n, tokens int) { s.progress(index, n, tokens) }
		s.stream(w, id, req.Model, t, o)
	}
	if werr == nil && r.Context().Err() == nil {
		s.mu.Lock()
		s.ledger[index].Delivered = time.Now()
		s.mu.Unlock()
	}
}

func finish(t Turn) string {
	if len(t.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

// admit enters entry in the ledger, takes the cut and slow settings for a
// stream, and waits while replies are held (a title call, a turn before
// HoldFrom's or one HoldLast lets through is not). It returns the entry's
// index and false when the caller went away while held.
func (s *Server) admit(r *http.Request, entry Entry) (int, streamOptions, bool) {
	s.mu.Lock()
	hold := s.hold
	if !s.holds(entry) {
		hold = nil
	}
	var o streamOptions
	if entry.Stream {
		o.cut, s.cutNext = s.cutNext, 0
		o.slow, s.slow = s.slow, 0
	}
	o.done = r.Context().Done()
	entry.Cut = o.cut > 0
	s.ledger = append(s.ledger, entry)
	index := len(s.ledger) - 1
	if hold != nil {
		s.held++
	}
	s.mu.Unlock()
	if hold == nil {
		return index, o, true
	}
	select {
	case <-hold:
	case <-r.Context().Done():
	}
	s.mu.Lock()
	s.held--
	s.mu.Unlock()
	return index, o, r.Context().Err() == nil
}

// progress records how far the reply of ledger entry index got.
func (s *Server) progress(index, chunks, tokens int) {
	s.mu.Lock()
	s.ledger[index].Chunks, s.ledger[index].Sent = chunks, tokens
	s.mu.Unlock()
}

// streamOptions shape one streamed reply.
type streamOptions struct {
	cut    int                 // stop after cut chunks (0: no cut)
	slow   time.Duration       // wait between chunks
	usage  bool                // a usage chunk before [DONE]
	sent   func(n, tokens int) // called after each chunk with the chunks and completion tokens so far
	done   <-chan struct{}     // the caller went away: no more waits
	tokens tokenReply          // what of the tokens the request asked for
}

// stream sends t as server-sent events: the content in a few chunks, each
// tool call in a few (its name, then its arguments in pieces), a final
// chunk with the finish reason, a usage chunk if asked, then [DONE]; with
// o.cut > 0 it stops after o.cut chunks, and with o.slow > 0 it waits that
// long before each chunk after the first.
func (s *Server) stream(w http.ResponseWriter, id, model string, t Turn, o streamOptions) {
	fl, ok := w.(http.Flusher)
	if !ok {
		apiError(w, http.StatusInternalServerError, "streaming unsupported")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	chunks := streamChunks(t)
	n, pos := 0, 0
	write := func(v map[string]any) {
		if n > 0 && o.slow > 0 {
			t := time.NewTimer(o.slow)
			select {
			case <-t.C:
			case <-o.done:
			}
			t.Stop()
		}
		v["id"], v["object"], v["model"] = id, "chat.completion.chunk", model
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
		n++
		if o.sent != nil {
			o.sent(n, pos)
		}
	}
	send := func(c chunk, reason any) {
		choice := map[string]any{"index": 0, "delta": c.delta, "finish_reason": reason}
		o.tokens.choice(choice, c.tokens, pos)
		pos += len(c.tokens)
		v := map[string]any{"choices": []any{choice}}
		if n == 0 && o.tokens.req.ReturnTokenIDs {
			v["prompt_token_ids"] = o.tokens.prompt
		}
		write(v)
	}
	send(chunk{delta: map[string]any{"role": "assistant"}}, nil)
	all := []Token{}
	for i, c := range chunks {
		if o.cut > 0 && i >= o.cut {
			return // cut mid-way: no finish, no [DONE]
		}
		send(c, nil)
		all = append(all, c.tokens...)
	}
	end := []Token{special(TokEnd)}
	send(chunk{delta: map[string]any{}, tokens: end}, finish(t))
	if o.usage {
		write(map[string]any{"choices": []any{}, "usage": usage(o.tokens.prompt, append(all, end...))})
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// chunk is one streamed delta and the completion tokens it carries.
type chunk struct {
	delta  map[string]any
	tokens []Token
}

// streamChunks cuts reply t into the deltas of a stream, at token
// boundaries: the content in up to three chunks, each tool call in up to
// three (its name with the first piece of its arguments, then the rest).
// Their tokens joined, and TokEnd, are the completion.
func streamChunks(t Turn) []chunk {
	var out []chunk
	for _, g := range group(Pieces(t.Content), 3) {
		out = append(out, chunk{delta: map[string]any{"content": joinText(g)}, tokens: g})
	}
	for i, tc := range t.ToolCalls {
		head := callTokens(tc.Function.Name, "")
		compact := compactJSON(tc.Function.Arguments)
		args := Pieces(compact)
		groups := group(args, 3)
		if compact != tc.Function.Arguments || len(groups) == 0 {
			// Arguments sent as they are, not as they tokenize: one piece.
			groups = [][]Token{args}
		}
		for k, g := range groups {
			text := joinText(g)
			if len(groups) == 1 {
				text = tc.Function.Arguments
			}
			call := map[string]any{"index": i, "function": map[string]string{"arguments": text}}
			toks := g
			if k == 0 {
				call["id"], call["type"] = tc.ID, "function"
				call["function"] = map[string]string{"name": tc.Function.Name, "arguments": text}
				toks = append(append([]Token(nil), head...), g...)
			}
			out = append(out, chunk{delta: map[string]any{"tool_calls": []any{call}}, tokens: toks})
		}
	}
	return out
}

// group cuts ts into at most n runs of about equal length.
func group(ts []Token, n int) [][]Token {
	if len(ts) == 0 {
		return nil
	}
	size := (len(ts) + n - 1) / n
	var out [][]Token
	for len(ts) > size {
		out = append(out, ts[:size])
		ts = ts[size:]
	}
	return append(out, ts)
}

func joinText(ts []Token) string {
	var b strings.Builder
	for _, t := range ts {
		b.WriteString(t.Text)
	}
	return b.String()
}

// usage is a reply's usage object, counted in the server's tokenizer.
func usage(prompt []int, completion []Token) map[string]int {
	return map[string]int{"prompt_tokens": len(prompt), "completion_tokens": len(completion), "total_tokens": len(prompt) + len(completion)}
}

// tokenReply adds to a reply what of the tokens its request asked for.
type tokenReply struct {
	req    Request
	prompt []int
}

// choice adds to choice the ids (token_ids) and logprobs
// (logprobs.content[]) of ts, the completion's tokens from position pos.
func (k tokenReply) choice(choice map[string]any, ts []Token, pos int) {
	if k.req.ReturnTokenIDs {
		choice["token_ids"] = ids(ts)
	}
	if !k.req.Logprobs {
		choice["logprobs"] = nil
		return
	}
	content := make([]map[string]any, len(ts))
	for i, t := range ts {
		text := t.Text
		if k.req.ReturnTokensAsTokenIDs {
			text = fmt.Sprintf("token_id:%d", t.ID)
		}
		b := []byte(text)
		bs := make([]int, len(b))
		for j, c := range b {
			bs[j] = int(c)
		}
		content[i] = map[string]any{"token": text, "logprob": Logprob(t.ID, pos+i), "bytes": bs, "top_logprobs": []any{}}
	}
	choice["logprobs"] = map[string]any{"content": content}
}

// checkTokenOptions refuses what the server does not serve of the token
// options: top_logprobs null (vLLM refuses it too) or above 0.
func checkTokenOptions(req Request) error {
	tl := strings.TrimSpace(string(req.TopLogprobs))
	if tl == "" {
		return nil
	}
	var n int
	if err := json.Unmarshal([]byte(tl), &n); err != nil || tl == "null" {
		return fmt.Errorf("top_logprobs must be an integer, not %s", tl)
	}
	if n != 0 {
		return fmt.Errorf("top_logprobs %d: the scripted server gives only the chosen token's logprob (0)", n)
	}
	return nil
}

// ErrNoScript is returned by LoadScript for a script file that does not
// decode.
var ErrNoScript = errors.New("modelserver: bad script")

// LoadScript reads a script from JSON: {"task": [{"content": ...}, ...]}.
func LoadScript(b []byte) (Script, error) {
	var s Script
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoScript, err)
	}
	for task, turns := range s {
		if strings.TrimSpace(task) == "" || len(turns) == 0 {
			return nil, fmt.Errorf("%w: task %q has no turns", ErrNoScript, task)
		}
	}
	return s, nil
}
