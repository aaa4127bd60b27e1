package trajectory

import "fmt"

// Report is what Check finds in a rollout's calls.
type Report struct {
	// Calls counts every record; Answered those with a reply; Tokens those
	// with token ids; Roots the answered calls with no parent; Replaced
	// the calls a later one sent again before anything continued them
	// (Whole.ReplacedBy); Failed the calls the upstream answered with an
	// error.
	Calls    int `json:"calls"`
	Answered int `json:"answered"`
	Tokens   int `json:"tokens"`
	Roots    int `json:"roots"`
	Replaced int `json:"replaced"`
	Failed   int `json:"failed"`
	// Other counts the calls that are no model call the capture reads (a
	// request that does not parse, a path of no known API): forwarded and
	// recorded, on no chain.
	Other int `json:"other,omitempty"`
	// Dangling counts calls whose parent is not among the calls; Branches
	// the calls that share a parent with an earlier one; TokenBreaks the
	// links by messages whose token ids do not chain; Duplicates the calls
	// whose request an earlier answered call already sent; Masked the
	// ambiguous calls, which mask the rollout (MaskedWhy says why).
	Dangling    int    `json:"dangling"`
	Branches    int    `json:"branches"`
	TokenBreaks int    `json:"token_breaks"`
	Duplicates  int    `json:"duplicates"`
	Masked      int    `json:"masked"`
	MaskedWhy   string `json:"masked_why,omitempty"`
	// Problems says, a line each, which calls the counts above count.
	Problems []string `json:"problems,omitempty"`
}

// OK tells whether the report has nothing a trainer must not be given:
// no dangling parent, no branch, no duplicate, nothing masked. Token
// breaks are counted, not refused.
func (r Report) OK() bool {
	return r.Dangling == 0 && r.Branches == 0 && r.Duplicates == 0 && r.Masked == 0
}

// String summarises the report on one line.
func (r Report) String() string {
	return fmt.Sprintf("%d calls (%d with tokens, %d roots, %d replaced, %d failed): %d dangling, %d branches, %d token breaks, %d duplicates, %d masked",
		r.Calls, r.Tokens, r.Roots, r.Replaced, r.Failed, r.Dangling, r.Branches, r.TokenBreaks, r.Duplicates, r.Masked)
}

// Check counts what calls (a rollout's, in the order recorded, as
// Index.Calls returns them) hold that a trainer must not be given
// silently. A replaced call and a failed one
// are on no chain: they are counted, and neither branch nor duplicate.
func Check(calls []Whole) Report {
	var r Report
	seen := map[string]bool{}
	children := map[string]string{} // parent -> its first child on a chain
	requests := map[uint64]string{} // request hash -> the first call that sent it
	for _, c := range calls {
		r.Calls++
		if !c.ModelCall() {
			r.Other++
			seen[c.ID] = true
			continue
		}
		onChain := c.ReplacedBy == "" && c.Error == "" && c.Status == 200
		switch {
		case c.ReplacedBy != "":
			r.Replaced++
		case !onChain:
			r.Failed++
		}
		if c.Tokens {
			r.Tokens++
		}
		if c.Error == "" && c.Status == 200 {
			r.Answered++
		}
		if c.Parent != "" && !seen[c.Parent] {
			r.Dangling++
			r.Problems = append(r.Problems, fmt.Sprintf("%s: parent %s is not among the calls before it", c.ID, c.Parent))
		}
		seen[c.ID] = true
		switch c.Link {
		case LinkAmbiguous:
			r.Masked++
			if r.MaskedWhy == "" {
				r.MaskedWhy = fmt.Sprintf("%s: %s", c.ID, c.LinkWhy)
			}
			r.Problems = append(r.Problems, fmt.Sprintf("%s: ambiguous parent: %s", c.ID, c.LinkWhy))
		case LinkTokenBreak:
			r.TokenBreaks++
			r.Problems = append(r.Problems, fmt.Sprintf("%s: token break: %s", c.ID, c.LinkWhy))
		case LinkRoot:
			if onChain {
				r.Roots++
			}
		}
		if !onChain {
			continue
		}
		if c.Parent != "" {
			if first, ok := children[c.Parent]; ok {
				r.Branches++
				r.Problems = append(r.Problems, fmt.Sprintf("%s: a branch: %s continues %s too", c.ID, first, c.Parent))
			} else {
				children[c.Parent] = c.ID
			}
		}
		if first, ok := requests[c.request]; ok {
			r.Duplicates++
			r.Problems = append(r.Problems, fmt.Sprintf("%s: a duplicate of %s (the same request)", c.ID, first))
		} else {
			requests[c.request] = c.ID
		}
	}
	return r
}

// Sequence is a run of calls merged into the token arrays a trainer reads:
// the first call's prompt, then everything after it, each token marked 1
// where the model generated it (with its logprob) and 0 where it came
// from elsewhere (a tool's result, a user's turn, the template; logprob 0).
type Sequence struct {
	// Calls are the merged calls' IDs, in order.
	Calls            []string  `json:"calls"`
	PromptIDs        []int     `json:"prompt_ids"`
	ResponseIDs      []int     `json:"response_ids"`
	ResponseMask     []int     `json:"response_mask"`
	ResponseLogprobs []float64 `json:"response_logprobs"`
}

// Chains merges calls into sequences: one per chain of calls with token
// ids from a root (or a token break, which no merge can cross) to a call
// nothing continues, in the order of their last calls. Replaced and
// failed calls are on none.
func Chains(calls []Whole) []Sequence {
	byID := map[string]*Whole{}
	continued := map[string]bool{}
	for i := range calls {
		c := &calls[i]
		if c.ReplacedBy != "" || c.Error != "" || c.Status != 200 || !c.Tokens {
			continue
		}
		byID[c.ID] = c
		if c.Parent != "" && c.Link == LinkResolved {
			continued[c.Parent] = true
		}
	}
	var out []Sequence
	for i := range calls {
		leaf := &calls[i]
		if byID[leaf.ID] == nil || continued[leaf.ID] {
			continue
		}
		var path []*Whole
		for c := leaf; c != nil; {
			path = append(path, c)
			if c.Link != LinkResolved {
				break
			}
			c = byID[c.Parent]
		}
		var s Sequence
		for k := len(path) - 1; k >= 0; k-- {
			c := path[k]
			s.Calls = append(s.Calls, c.ID)
			if k == len(path)-1 {
				s.PromptIDs = append([]int(nil), c.AllPromptIDs...)
			} else {
				// What the prompt adds after the sequence so far: not the
				// model's.
				have := len(s.PromptIDs) + len(s.ResponseIDs)
				for _, id := range c.AllPromptIDs[min(have, len(c.AllPromptIDs)):] {
					s.ResponseIDs = append(s.ResponseIDs, id)
					s.ResponseMask = append(s.ResponseMask, 0)
					s.ResponseLogprobs = append(s.ResponseLogprobs, 0)
				}
			}
			for j, id := range c.CompletionIDs {
				s.ResponseIDs = append(s.ResponseIDs, id)
				s.ResponseMask = append(s.ResponseMask, 1)
				lp := 0.0
				if j < len(c.Logprobs) {
					lp = c.Logprobs[j]
				}
				s.ResponseLogprobs = append(s.ResponseLogprobs, lp)
			}
		}
		out = append(out, s)
	}
	return out
}

// ConversationBytes is what a rollout's last chain holds once, as a
// trainer would keep it without a capture: the last call's request whole
// (its messages and other fields) and reply, and the chain's merged token
// arrays (prompt and response ids, the response mask and a logprob per
// response id) as JSON.
// A capture file's size against it is the capture's overhead: each call
// stores only its delta against its parent, so the ratio stays near 1 as
// the conversation grows (docs/BENCHMARKS.md). Calls without a chain
// give 0.
func ConversationBytes(calls []Whole, seqs []Sequence) int64 {
	if len(seqs) == 0 {
		return 0
	}
	last := seqs[len(seqs)-1]
	var c *Whole
	for i := range calls {
		if calls[i].ID == last.Calls[len(last.Calls)-1] {
			c = &calls[i]
		}
	}
	if c == nil {
		return 0
	}
	req := marshalPlain(map[string]any{"params": c.AllParams, "messages": c.AllMessages})
	ids := marshalPlain([]any{last.PromptIDs, last.ResponseIDs, last.ResponseMask, last.ResponseLogprobs})
	return int64(len(req) + len(c.Reply) + len(ids))
}
