package invariant

import (
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
)

// A manifest found missing counts as released only when a release that
// deleted it completed after its checkpoint committed.
func TestReleasedAfter(t *testing.T) {
	entry := func(typ events.Type, id string) timeline.Entry {
		return timeline.Entry{Type: typ, CheckpointID: id}
	}
	released := func(id string, deleted ...string) timeline.Entry {
		return timeline.Entry{Type: events.TypeReleaseCompleted, CheckpointID: id, Data: events.ReleaseCompleted{Deleted: deleted}}
	}
	tl := []timeline.Entry{
		released("release-1", "c1"), // before c1 committed
		entry(events.TypeCheckpointCommitted, "c1"),
		entry(events.TypeCheckpointCommitted, "c4"),
		released("release-3", "c1"),
		entry(events.TypeCheckpointCommitted, "c2"),
		entry(events.TypeReleaseFailed, "release-5"),
	}
	// c4 committed before a release, which kept it.
	for id, want := range map[string]bool{"c1": true, "c2": false, "c3": false, "c4": false} {
		if got := releasedAfter(tl, id); got != want {
			t.Errorf("releasedAfter(%s) = %v, want %v", id, got, want)
		}
	}
}
