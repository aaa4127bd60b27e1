package machine

import (
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// TestAcksKept: PROTOCOL §5, restore: the restore tells members the
// source's commit acks are all kept only while the stream keeps them for
// an hour (or ten timeouts) more, counted from the commit's start; never
// for a commit of unknown start or a stream with other limits.
func TestAcksKept(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	man := &events.CheckpointManifest{CommitSeq: 7, Created: created, CommitMS: 60_000} // started a minute before
	day := 24 * time.Hour
	for _, c := range []struct {
		name    string
		now     time.Time
		maxAge  time.Duration
		timeout time.Duration
		man     *events.CheckpointManifest
		want    bool
	}{
		{"a fresh checkpoint", created.Add(time.Hour), 7 * day, 10 * time.Second, man, true},
		{"just over an hour left, from the commit's start", created.Add(7*day - time.Hour - 2*time.Minute), 7 * day, 10 * time.Second, man, true},
		{"less than an hour left, from the commit's start", created.Add(7*day - time.Hour - 30*time.Second), 7 * day, 10 * time.Second, man, false},
		{"ten timeouts left", created.Add(7*day - 3*time.Hour), 7 * day, 20 * time.Minute, man, false},
		{"another limit on the stream", created.Add(time.Hour), 0, 10 * time.Second, man, false},
		{"a commit of unknown start", created.Add(time.Hour), 7 * day, 10 * time.Second,
			&events.CheckpointManifest{CommitSeq: 7, Created: created}, false},
		{"no commit sequence", created.Add(time.Hour), 7 * day, 10 * time.Second,
			&events.CheckpointManifest{Created: created, CommitMS: 5}, false},
	} {
		if got := acksKept(c.now, c.man, c.maxAge, c.timeout); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
