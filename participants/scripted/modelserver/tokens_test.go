package modelserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// The tokenizer's pieces join to the text they came from, every id is in
// the vocabulary and above the special tokens, and the same text gives the
// same ids.
func TestPiecesJoinToTheText(t *testing.T) {
	for _, text := range []string{"", "hello world", "  two  spaces\n\tand tabs", `{"command":"echo hi > a.txt"}`, "ünïcödé — dash", "a_b1 c2_"} {
		var b strings.Builder
		for _, p := range modelserver.Pieces(text) {
			b.WriteString(p.Text)
			if p.ID < 256 || p.ID >= modelserver.VocabSize {
				t.Errorf("%q: piece %q has id %d, outside [256, %d)", text, p.Text, p.ID, modelserver.VocabSize)
			}
		}
		if b.String() != text {
			t.Errorf("pieces of %q join to %q", text, b.String())
		}
		if !slices.Equal(modelserver.Tokenize(text), modelserver.Tokenize(text)) {
			t.Errorf("%q tokenizes two ways", text)
		}
	}
	if got := modelserver.Pieces("ab  cd!?"); len(got) != 5 {
		t.Errorf(`"ab  cd!?" has pieces %+v, want ab, "  ", cd, !, ?`, got)
	}
}

// tokenReply is what the tests read of a reply's tokens.
type tokenReply struct {
	PromptTokenIDs []int `json:"prompt_token_ids"`
	Choices        []struct {
		TokenIDs []int `json:"token_ids"`
		Logprobs *struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				Bytes       []int   `json:"bytes"`
				TopLogprobs []any   `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		Delta struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Message struct {
			Content   string                 `json:"content"`
			ToolCalls []modelserver.ToolCall `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// ask posts a request (body) for task t1 and returns the replies read: one
// for a plain reply, one per chunk for a stream.
func ask(t *testing.T, url string, body map[string]any) (int, []tokenReply, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set(modelserver.TaskHeader, "t1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp.StatusCode, nil, raw
	}
	var out []tokenReply
	if body["stream"] != true {
		var r tokenReply
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("reply %s: %v", raw, err)
		}
		return 200, []tokenReply{r}, raw
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var r tokenReply
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("chunk %s: %v", line, err)
		}
		out = append(out, r)
	}
	return 200, out, raw
}

// A request that asks for token ids and logprobs gets them in vLLM's
// shapes, plain and streamed alike: the prompt's ids at the top level (a
// stream's first chunk), the completion's per choice (each chunk its
// own), a logprob per completion token, and usage counted in the same
// tokens; the ledger holds the same ids.
func TestTokenIDsAndLogprobs(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	msgs := []modelserver.Message{user("write a.txt")}
	wantPrompt := modelserver.PromptTokens(modelserver.Request{Messages: msgs})
	wantCompletion := modelserver.CompletionTokens(script["t1"][0])
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			body := map[string]any{"model": "m", "messages": msgs, "stream": stream, "return_token_ids": true, "logprobs": true, "top_logprobs": 0,
				"stream_options": map[string]any{"include_usage": true}}
			code, replies, raw := ask(t, srv.URL, body)
			if code != 200 {
				t.Fatalf("%d %s", code, raw)
			}
			if !slices.Equal(replies[0].PromptTokenIDs, wantPrompt) {
				t.Errorf("prompt_token_ids %v, want %v", replies[0].PromptTokenIDs, wantPrompt)
			}
			var got []int
			var args string
			pos := 0
			for _, r := range replies {
				if len(r.Choices) == 0 {
					continue
				}
				c := r.Choices[0]
				got = append(got, c.TokenIDs...)
				for _, tc := range c.Delta.ToolCalls {
					args += tc.Function.Arguments
				}
				for _, tc := range c.Message.ToolCalls {
					args += tc.Function.Arguments
				}
				if c.Logprobs == nil || len(c.Logprobs.Content) != len(c.TokenIDs) {
					t.Fatalf("a choice with %d token ids has logprobs %+v", len(c.TokenIDs), c.Logprobs)
				}
				for i, lp := range c.Logprobs.Content {
					if want := modelserver.Logprob(c.TokenIDs[i], pos); lp.Logprob != want || lp.Logprob > 0 || lp.TopLogprobs == nil {
						t.Errorf("token %d (id %d): logprob %v top %v, want %v and []", pos, c.TokenIDs[i], lp.Logprob, lp.TopLogprobs, want)
					}
					if string(bytesOf(lp.Bytes)) != lp.Token {
						t.Errorf("token %q has bytes %v", lp.Token, lp.Bytes)
					}
					pos++
				}
			}
			if !slices.Equal(got, wantCompletion) {
				t.Errorf("completion token ids %v, want %v", got, wantCompletion)
			}
			if args != script["t1"][0].ToolCalls[0].Function.Arguments {
				t.Errorf("arguments %q", args)
			}
			u := replies[len(replies)-1].Usage
			if u == nil || u.PromptTokens != len(wantPrompt) || u.CompletionTokens != len(wantCompletion) {
				t.Errorf("usage %+v, want %d and %d", u, len(wantPrompt), len(wantCompletion))
			}
			l := s.Ledger()
			e := l[len(l)-1]
			if !slices.Equal(e.PromptTokenIDs, wantPrompt) || !slices.Equal(e.TokenIDs, wantCompletion) || e.Sent != len(wantCompletion) {
				t.Errorf("ledger entry prompt %v completion %v sent %d", e.PromptTokenIDs, e.TokenIDs, e.Sent)
			}
		})
	}
}

func bytesOf(v []int) []byte {
	b := make([]byte, len(v))
	for i, c := range v {
		b[i] = byte(c)
	}
	return b
}

// A request that asks for nothing gets no token ids and logprobs null, as
// from vLLM; return_tokens_as_token_ids names each token by its id.
func TestTokenOptions(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	msgs := []modelserver.Message{user("write a.txt")}
	_, replies, raw := ask(t, srv.URL, map[string]any{"model": "m", "messages": msgs})
	if replies[0].PromptTokenIDs != nil || replies[0].Choices[0].TokenIDs != nil || replies[0].Choices[0].Logprobs != nil {
		t.Errorf("a request asking for no tokens got %s", raw)
	}
	if !bytes.Contains(raw, []byte(`"logprobs":null`)) {
		t.Errorf("logprobs not null: %s", raw)
	}
	_, replies, _ = ask(t, srv.URL, map[string]any{"model": "m", "messages": msgs, "stream": true, "return_token_ids": true, "logprobs": true, "return_tokens_as_token_ids": true})
	n := 0
	for _, r := range replies {
		for _, c := range r.Choices {
			for i, lp := range c.Logprobs.Content {
				if want := fmt.Sprintf("token_id:%d", c.TokenIDs[i]); lp.Token != want {
					t.Errorf("token %q, want %q", lp.Token, want)
				}
				n++
			}
		}
	}
	if n != len(modelserver.CompletionTokens(script["t1"][0])) {
		t.Errorf("%d tokens named", n)
	}
	for _, tc := range []struct{ top any }{{nil}, {2}, {"x"}} {
		code, _, raw := ask(t, srv.URL, map[string]any{"model": "m", "messages": msgs, "logprobs": true, "top_logprobs": tc.top})
		if code != http.StatusBadRequest || !bytes.Contains(raw, []byte("top_logprobs")) {
			t.Errorf("top_logprobs %v: %d %s, want 400 naming top_logprobs", tc.top, code, raw)
		}
	}
}

// A prompt and its completion are a prefix of the next prompt when the
// harness sends the reply back as it came (the tool call's arguments may
// be re-spaced: they render as compact JSON), and a cut stream's ledger
// entry says how many tokens were sent.
func TestTokensChainFromCallToCall(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	msgs := []modelserver.Message{user("write a.txt")}
	_, r1, _ := ask(t, srv.URL, map[string]any{"model": "m", "messages": msgs, "return_token_ids": true})
	echo := script["t1"][0].ToolCalls[0]
	echo.Function.Arguments = `{ "command": "echo hi > a.txt" }`
	calls, _ := json.Marshal([]modelserver.ToolCall{echo})
	msgs = append(msgs, modelserver.Message{Role: "assistant", Content: json.RawMessage(`""`), ToolCalls: calls},
		modelserver.Message{Role: "tool", ToolCallID: "call-1", Content: json.RawMessage(`"ok"`)})
	s.CutNext(1)
	_, r2, _ := ask(t, srv.URL, map[string]any{"model": "m", "messages": msgs, "stream": true, "return_token_ids": true})
	chain := append(slices.Clone(r1[0].PromptTokenIDs), r1[0].Choices[0].TokenIDs...)
	next := r2[0].PromptTokenIDs
	if len(next) <= len(chain) || !slices.Equal(next[:len(chain)], chain) {
		t.Fatalf("prompt 1 + completion 1 = %v is not a prefix of prompt 2 = %v", chain, next)
	}
	l := s.Ledger()
	if e := l[len(l)-1]; !e.Cut || e.Sent == 0 || e.Sent >= len(e.TokenIDs) {
		t.Errorf("cut stream's entry: cut %v sent %d of %d tokens", e.Cut, e.Sent, len(e.TokenIDs))
	}
}
