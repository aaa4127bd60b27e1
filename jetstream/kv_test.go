package jetstream_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// A watcher stopped while updates keep coming (a busy bucket, more than
// its 256-update buffer unread) leaves no goroutine behind: Stop alone
// leaves nats.go's handler blocked in a send nobody receives (found by the
// scale benchmark's leak check at 1,000 members' heartbeats).
func TestStopWatchLeavesNoSender(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	kv, err := env.JS.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: "stopwatch"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, ">")
	if err != nil {
		t.Fatal(err)
	}
	if e := <-w.Updates(); e != nil {
		t.Fatalf("first update %v, want the end of the initial values", e)
	}
	for i := range 600 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	// The buffer is full and its sender blocked before the stop.
	poll.Wait(t, 10*time.Second, "the watcher's sender to block", func() bool { return senders() > 0 })
	if err := jetstream.StopWatch(w); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "no watcher sender left", func() bool { return senders() == 0 })
}

// senders counts the goroutines in nats.go's KV watch handler.
func senders() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*kvs).WatchFiltered.func1")
}
