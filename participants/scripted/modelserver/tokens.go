package modelserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// The server's tokenizer: small, deterministic and the same in every
// process, so that a test can check a trajectory at the token level
// (docs/TRAJECTORIES.md). It is no model's tokenizer; it has the
// properties that matter to a trainer's capture:
//
//   - Text is cut into pieces: a run of letters, digits and underscores; a
//     run of white space; any other rune alone. The pieces joined give the
//     text back. A piece's id is 256 + FNV-1a(piece) mod (VocabSize-256);
//     ids below 256 are special tokens.
//   - A message renders as its role's token, its text, each tool call as
//     TokCall, the name, TokArgs and the arguments (compact JSON, keys in
//     their order, as a chat template re-renders parsed arguments), then
//     TokEnd. Text is a string content, or the text parts of a content
//     array; tool call ids are not rendered.
//   - A prompt is TokTools, the offered tools (compact JSON) and TokEnd if
//     the request offers tools, then every message rendered, then
//     TokAssistant: the generation prompt.
//   - A completion is the reply rendered as an assistant message, less its
//     first token. A prompt and its completion are therefore a prefix of
//     the next prompt of a harness that sends the reply back as it came.
//   - The logprob of a completion token is -(FNV-1a(id, position) mod 4000)
//     / 1000: deterministic, in (-4, 0].

// VocabSize is the tokenizer's vocabulary: every id is below it.
const VocabSize = 1 << 16

// Special tokens of the tokenizer.
const (
	TokSystem    = 1 // a system (or developer) message
	TokUser      = 2 // a user message
	TokAssistant = 3 // an assistant message; the generation prompt
	TokTool      = 4 // a tool result
	TokEnd       = 5 // the end of a message
	TokCall      = 6 // a tool call: its name follows
	TokArgs      = 7 // a tool call's arguments follow
	TokTools     = 8 // the tools a request offers follow
	TokOther     = 9 // a message of another role
)

var specialNames = map[int]string{TokSystem: "<|system|>", TokUser: "<|user|>", TokAssistant: "<|assistant|>", TokTool: "<|tool|>",
	TokEnd: "<|end|>", TokCall: "<|call|>", TokArgs: "<|args|>", TokTools: "<|tools|>", TokOther: "<|other|>"}

// Token is one token: its id and its text.
type Token struct {
	ID   int
	Text string
}

// Pieces cuts text into its tokens (see the tokenizer's rules above).
func Pieces(text string) []Token {
	var out []Token
	for len(text) > 0 {
		r, n := utf8.DecodeRuneInString(text)
		end := n
		if class := runeClass(r); class != 0 {
			for end < len(text) {
				r2, n2 := utf8.DecodeRuneInString(text[end:])
				if runeClass(r2) != class {
					break
				}
				end += n2
			}
		}
		out = append(out, Token{ID: pieceID(text[:end]), Text: text[:end]})
		text = text[end:]
	}
	return out
}

// runeClass is 1 for a word rune, 2 for white space, 0 for a rune that is
// a piece alone.
func runeClass(r rune) int {
	switch {
	case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
		return 1
	case unicode.IsSpace(r):
		return 2
	}
	return 0
}

func pieceID(p string) int {
	h := fnv.New32a()
	h.Write([]byte(p))
	return 256 + int(h.Sum32()%(VocabSize-256))
}

// TokenText returns the text of id: a special token's name, or "" for an
// id the tokenizer cannot name (a piece's id does not say its text).
func TokenText(id int) string { return specialNames[id] }

// Tokenize returns the ids of text's pieces.
func Tokenize(text string) []int { return ids(Pieces(text)) }

func ids(ts []Token) []int {
	out := make([]int, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

func special(id int) Token { return Token{ID: id, Text: specialNames[id]} }

// roleToken returns the token a message of role starts with.
func roleToken(role string) int {
	switch role {
	case "system", "developer":
		return TokSystem
	case "user":
		return TokUser
	case "assistant":
		return TokAssistant
	case "tool":
		return TokTool
	}
	return TokOther
}

// compactJSON returns s compacted if it is JSON, else s.
func compactJSON(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// callTokens renders one tool call.
func callTokens(name, args string) []Token {
	out := []Token{special(TokCall)}
	out = append(out, Pieces(name)...)
	out = append(out, special(TokArgs))
	return append(out, Pieces(compactJSON(args))...)
}

// renderMessage renders m: its role's token, text, tool calls, TokEnd.
func renderMessage(m Message) []Token {
	out := []Token{special(roleToken(m.Role))}
	out = append(out, Pieces(trajectory.MessageText(m.Content))...)
	var calls []ToolCall
	_ = json.Unmarshal(m.ToolCalls, &calls)
	for _, c := range calls {
		out = append(out, callTokens(c.Function.Name, c.Function.Arguments)...)
	}
	return append(out, special(TokEnd))
}

// PromptTokens returns the prompt the tokenizer makes of req: the tools
// offered, every message, the generation prompt.
func PromptTokens(req Request) []int {
	var out []Token
	if t := strings.TrimSpace(string(req.Tools)); t != "" && t != "null" && t != "[]" {
		out = append(out, special(TokTools))
		out = append(out, Pieces(compactJSON(t))...)
		out = append(out, special(TokEnd))
	}
	for _, m := range req.Messages {
		out = append(out, renderMessage(m)...)
	}
	return ids(append(out, special(TokAssistant)))
}

// completionTokens returns the tokens of a reply t: its text, its tool
// calls, TokEnd.
func completionTokens(t Turn) []Token {
	out := Pieces(t.Content)
	for _, c := range t.ToolCalls {
		out = append(out, callTokens(c.Function.Name, c.Function.Arguments)...)
	}
	return append(out, special(TokEnd))
}

// CompletionTokens returns the completion the tokenizer makes of a reply
// t.
func CompletionTokens(t Turn) []int { return ids(completionTokens(t)) }

// Logprob returns the logprob the server gives token id at position pos
// of a completion.
func Logprob(id, pos int) float64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d", id, pos)
	return -float64(h.Sum32()%4000) / 1000
}
