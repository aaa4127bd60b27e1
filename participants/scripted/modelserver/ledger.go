package modelserver

import "time"

// This file reads the ledger: the calls an episode repeated, and those a
// later episode re-issued.

// Repeat is a call an episode sent again after it had saved the reply:
// a later request of the same task, episode and branch carried more
// messages. A branch is a conversation of its own: the calls it shares
// with its parent, or another branch, are no repeats.
type Repeat struct {
	Task    string `json:"task"`
	Episode string `json:"episode,omitempty"`
	Branch  string `json:"branch,omitempty"`
	Digest  string `json:"digest"`
	// Delivered is when the first reply was written; Saved when the reply
	// was saved (what the sender says, else its next request's time, an
	// upper bound); Again when the call came again.
	Delivered time.Time `json:"delivered"`
	Saved     time.Time `json:"saved"`
	Again     time.Time `json:"again"`
}

// RepeatList returns the calls sent again after their reply was saved, in
// the order of their first send. A call whose reply was cut or never
// delivered is no repeat: its caller never had the reply.
func (s *Server) RepeatList() []Repeat {
	l := s.Ledger()
	var out []Repeat
	for i, e := range l {
		if e.Cut || e.Delivered.IsZero() {
			continue
		}
		var saved time.Time
		for _, f := range l[i+1:] {
			if f.Task != e.Task || f.Episode != e.Episode || f.Branch != e.Branch {
				continue
			}
			if f.Messages > e.Messages && saved.IsZero() {
				saved = savedBy(f)
			}
			if !saved.IsZero() && f.Digest == e.Digest {
				out = append(out, Repeat{Task: e.Task, Episode: e.Episode, Branch: e.Branch, Digest: e.Digest, Delivered: e.Delivered, Saved: saved, Again: f.Time})
				break
			}
		}
	}
	return out
}

// savedBy returns when the sender of f, the request after a reply, had
// saved that reply: what it says, else f's own time, an upper bound.
func savedBy(f Entry) time.Time {
	if f.PrevSaved.IsZero() || f.PrevSaved.After(f.Time) {
		return f.Time
	}
	return f.PrevSaved
}

// Repeats returns, per task, the digests of RepeatList.
func (s *Server) Repeats() map[string][]string {
	out := map[string][]string{}
	for _, r := range s.RepeatList() {
		out[r.Task] = append(out[r.Task], r.Digest)
	}
	return out
}

// Reissue is a call that a later episode of a task sent again after an
// earlier episode had its reply: the next attempt re-issuing what a crash
// abandoned. Both are of one branch (or of none): a branch that sends
// what its parent sent is a conversation of its own.
type Reissue struct {
	Task   string `json:"task"`
	Branch string `json:"branch,omitempty"`
	Digest string `json:"digest"`
	// Earlier is the earlier episode and Delivered when it got the reply;
	// Saved when it had saved it (as its next request says, or that
	// request's time; zero if it never sent one); Later the episode that
	// sent it again.
	Earlier   string    `json:"earlier"`
	Delivered time.Time `json:"delivered"`
	Saved     time.Time `json:"saved,omitzero"`
	Later     string    `json:"later"`
}

// Reissued returns the calls that a later episode sent again. A re-issue
// is legitimate when the earlier episode saved the reply only after the
// checkpoint the later one was restored from (or never): the snapshot did
// not hold it.
func (s *Server) Reissued() []Reissue {
	l := s.Ledger()
	var out []Reissue
	seen := map[string]bool{}
	for i, e := range l {
		key := e.Task + "/" + e.Episode + "/" + e.Branch + "/" + e.Digest
		if e.Cut || e.Delivered.IsZero() || seen[key] {
			continue
		}
		seen[key] = true
		var saved time.Time
		for _, f := range l[i+1:] {
			if f.Task != e.Task || f.Branch != e.Branch {
				continue
			}
			if f.Episode == e.Episode && f.Messages > e.Messages && saved.IsZero() {
				saved = savedBy(f)
			}
			if f.Episode != e.Episode && f.Digest == e.Digest {
				out = append(out, Reissue{Task: e.Task, Branch: e.Branch, Digest: e.Digest, Earlier: e.Episode, Delivered: e.Delivered, Saved: saved, Later: f.Episode})
				break
			}
		}
	}
	return out
}
