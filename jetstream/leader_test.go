package jetstream_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestLeaderLastMsg reads the last message of a filter from the stream's leader, on a 3-node
// cluster, as the bridge does: headers, data, sequence and time as stored, ErrMsgNotFound when
// nothing matches, and an error that says so for a stream that is not there. A direct get may be
// answered by a replica that has not applied the last publish; the leader's read has it.
func TestLeaderLastMsg(t *testing.T) {
	env := jstest.StartCluster(t, jstest.WithRoles())
	nc, js := env.As(embedded.RoleBridge).Connect(t)
	ctx := testContext(t)
	const filter = "sp.run1.phase.>"
	if _, err := jetstream.LeaderLastMsg(ctx, nc, jetstream.StreamName, filter); !errors.Is(err, natsjs.ErrMsgNotFound) {
		t.Fatalf("an empty run: %v, want ErrMsgNotFound", err)
	}
	var last *natsjs.PubAck
	for _, subject := range []string{"sp.run1.phase.prepare", "sp.run1.phase.commit", "sp.run1.phase.resume"} {
		msg := nats.NewMsg(subject)
		msg.Header.Set("Ce-Id", subject)
		msg.Data = []byte(subject)
		var err error
		if last, err = js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := jetstream.LeaderLastMsg(ctx, nc, jetstream.StreamName, filter)
	if err != nil {
		t.Fatal(err)
	}
	// The copy to compare with comes by a direct get, which any replica may answer, one still
	// applying the publish too: it is not found there until that replica has it.
	var direct *natsjs.RawStreamMsg
	poll.Wait(t, 10*time.Second, "a direct get of the last phase", func() bool {
		direct, err = env.Bus.Stream.GetMsg(ctx, last.Sequence)
		if err != nil && !errors.Is(err, natsjs.ErrMsgNotFound) {
			t.Fatal(err)
		}
		return err == nil
	})
	if raw.Sequence != last.Sequence || raw.Subject != direct.Subject || !bytes.Equal(raw.Data, direct.Data) || !raw.Time.Equal(direct.Time) {
		t.Fatalf("leader's last: seq %d %s %v, want seq %d %s %v", raw.Sequence, raw.Subject, raw.Time, last.Sequence, direct.Subject, direct.Time)
	}
	if raw.Subject != "sp.run1.phase.resume" || raw.Header.Get("Ce-Id") != "sp.run1.phase.resume" {
		t.Fatalf("leader's last: %s with Ce-Id %q, want the resume's", raw.Subject, raw.Header.Get("Ce-Id"))
	}
	if _, err := jetstream.LeaderLastMsg(ctx, nc, "NO_SUCH_STREAM", "x"); err == nil || errors.Is(err, natsjs.ErrMsgNotFound) {
		t.Fatalf("a stream that is not there: %v, want an error that says so", err)
	}
}

// TestKVLeaderValues reads a replicated bucket's keys under a filter from the stream's leader:
// current values only, deleted and purged keys left out, keys outside the filter too; and
// KVLeaderLast, which keeps the removed keys' markers.
func TestKVLeaderValues(t *testing.T) {
	env := jstest.StartCluster(t)
	ctx := testContext(t)
	kv := env.Bus.Manifests
	for _, k := range []string{"run1.c1", "run1.c2", "run1.c3", "run1.c4", "run1.c1.agent.a", "run2.c1"} {
		if _, err := kv.Put(ctx, k, []byte("v1 "+k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "run1.c1", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "run1.c2"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "run1.c3"); err != nil {
		t.Fatal(err)
	}
	vals, err := jetstream.KVLeaderValues(ctx, env.JS, kv.Bucket(), "run1.*")
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 2 || string(vals["run1.c1"]) != "v2" || string(vals["run1.c4"]) != "v1 run1.c4" {
		t.Fatalf("leader's values of run1.*: %q, want run1.c1=v2 and run1.c4", vals)
	}
	// KVLeaderLast keeps the removed keys, as their markers.
	last, err := jetstream.KVLeaderLast(ctx, env.JS, kv.Bucket(), "run1.*")
	if err != nil {
		t.Fatal(err)
	}
	if len(last) != 4 || last["run1.c3"] == nil || last["run1.c3"].Header.Get("KV-Operation") != "PURGE" ||
		last["run1.c2"] == nil || last["run1.c2"].Header.Get("KV-Operation") != "DEL" || string(last["run1.c1"].Data) != "v2" {
		t.Fatalf("leader's last messages of run1.*: %v, want c1..c4 with c2 deleted and c3 purged", last)
	}
	if vals, err := jetstream.KVLeaderValues(ctx, env.JS, kv.Bucket(), "run3.*"); err != nil || len(vals) != 0 {
		t.Fatalf("an empty filter: %q, %v", vals, err)
	}
}
