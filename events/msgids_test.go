package events_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestMsgIDs: an id is its key, a dot and a random part; the same key
// gives the same id for as long as it is kept, another process (another
// MsgIDs) another id, and a key dropped past MsgIDsKept a new one.
func TestMsgIDs(t *testing.T) {
	var a, b events.MsgIDs
	const key = "run1.7.commit.c1"
	id := a.For(key)
	rest, ok := strings.CutPrefix(id, key+".")
	if !ok || len(rest) != events.IDLength {
		t.Fatalf("id %q: want %q, a dot and %d random characters", id, key, events.IDLength)
	}
	if again := a.For(key); again != id {
		t.Fatalf("the same key gave %q, then %q", id, again)
	}
	if other := b.For(key); other == id {
		t.Fatalf("two processes drew the same id %q for one key", id)
	}
	if other := a.For(key + "x"); strings.HasSuffix(other, rest) {
		t.Fatalf("another key reused the random part: %q, %q", id, other)
	}
	for i := range events.MsgIDsKept {
		a.For(fmt.Sprint("k", i))
	}
	if later := a.For(key); later == id {
		t.Fatalf("a key dropped %d keys ago kept its id %q", events.MsgIDsKept, id)
	}

	// Safe for concurrent use: one id per key whoever asks.
	var c events.MsgIDs
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Go(func() { got[i] = c.For(key) })
	}
	wg.Wait()
	for _, g := range got {
		if g != got[0] {
			t.Fatalf("concurrent callers got %q", got)
		}
	}
}

// TestMsgIDsRepeatIsADuplicate: PROTOCOL §4 — a publish made again with
// its id from MsgIDs is a duplicate of the first to the server, even
// built again (another ce-time), and the same logical publish of another
// process is not.
func TestMsgIDsRepeatIsADuplicate(t *testing.T) {
	env := jstest.Start(t)
	var ids, restarted events.MsgIDs
	d := events.MemberJoined{Run: "run1", Member: "agent.a", Epoch: 1}
	key := "run1.joined.agent.a"
	publish := func(ids *events.MsgIDs) (seq uint64, dup bool) {
		t.Helper()
		msg, err := events.Marshal("agent.a", d, events.WithID(ids.For(key)))
		if err != nil {
			t.Fatal(err)
		}
		ack, err := jetstream.PublishDedup(t.Context(), env.JS, msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence, ack.Duplicate
	}
	first, dup := publish(&ids)
	if dup {
		t.Fatal("the first publish is a duplicate")
	}
	if again, dup := publish(&ids); !dup || again != first {
		t.Fatalf("the publish made again: sequence %d, duplicate %v; want a duplicate of %d", again, dup, first)
	}
	if other, dup := publish(&restarted); dup || other == first {
		t.Fatalf("another process's publish: sequence %d, duplicate %v; want stored", other, dup)
	}
}
