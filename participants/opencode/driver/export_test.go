package driver

import "io"

// SummariseForTest copies events from r to w and summarises them, as run
// does with OpenCode's output.
func SummariseForTest(r io.Reader, w io.Writer) (Summary, error) {
	return copyEvents(r, w, func(string) {})
}

// AnsweredForTest tells whether Continue would take msgs as answered.
func AnsweredForTest(msgs []Message) bool { return answered(msgs) }
