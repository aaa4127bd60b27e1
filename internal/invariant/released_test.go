package invariant

import (
	"testing"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/events"
)

// A manifest found missing counts as released only when a release
// completed after its checkpoint committed.
func TestReleasedAfter(t *testing.T) {
	entry := func(typ events.Type, id string) bridge.TimelineEntry {
		return bridge.TimelineEntry{Type: typ, CheckpointID: id}
	}
	tl := []bridge.TimelineEntry{
		entry(events.TypeReleaseCompleted, "release-1"),
		entry(events.TypeCheckpointCommitted, "c1"),
		entry(events.TypeReleaseCompleted, "release-3"),
		entry(events.TypeCheckpointCommitted, "c2"),
		entry(events.TypeReleaseFailed, "release-5"),
	}
	for id, want := range map[string]bool{"c1": true, "c2": false, "c3": false} {
		if got := releasedAfter(tl, id); got != want {
			t.Errorf("releasedAfter(%s) = %v, want %v", id, got, want)
		}
	}
}
