package driver

import "io"

// SummariseForTest copies events from r to w and summarises them, as run
// does with OpenCode's output.
func SummariseForTest(r io.Reader, w io.Writer) (Summary, error) {
	return copyEvents(r, w, func(string) {})
}

// AnsweredForTest tells whether Continue would take msgs as answered.
func AnsweredForTest(msgs []Message) bool {
	_, ok := answer(msgs)
	return ok
}

// AnswerForTest returns the summary Continue gives a session msgs that
// already answered, and whether it did.
func AnswerForTest(msgs []Message) (Summary, bool) { return answer(msgs) }
