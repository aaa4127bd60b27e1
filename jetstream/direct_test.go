package jetstream_test

import (
	"errors"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestDirectGet reads the last message of a subject, and of a wildcard, by the subject form of a
// direct get: the stream's own sequence and headers, as natsjs.Stream's read gives them, and
// ErrMsgNotFound for a subject with no message.
func TestDirectGet(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	for _, subject := range []string{"sp.r.phase.prepare", "sp.r.phase.resume", "sp.r.phase.prepare"} {
		if _, err := env.JS.Publish(ctx, subject, []byte(subject)); err != nil {
			t.Fatal(err)
		}
	}
	d := jetstream.Direct{Conn: env.Conn, Stream: jetstream.StreamName}
	for _, tc := range []struct {
		subject, want string
		seq           uint64
	}{
		{"sp.r.phase.prepare", "sp.r.phase.prepare", 3},
		{"sp.r.phase.resume", "sp.r.phase.resume", 2},
		{"sp.r.phase.>", "sp.r.phase.prepare", 3},
	} {
		m, err := d.GetLastMsgForSubject(ctx, tc.subject)
		if err != nil {
			t.Fatalf("%s: %v", tc.subject, err)
		}
		want, err := env.Bus.Stream.GetLastMsgForSubject(ctx, tc.subject)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != tc.want || m.Sequence != tc.seq || string(m.Data) != tc.want || !m.Time.Equal(want.Time) {
			t.Errorf("%s: %s seq %d %q at %s, want %s seq %d at %s", tc.subject, m.Subject, m.Sequence, m.Data, m.Time, tc.want, tc.seq, want.Time)
		}
	}
	if _, err := d.GetLastMsgForSubject(ctx, "sp.r.phase.commit"); !errors.Is(err, natsjs.ErrMsgNotFound) {
		t.Errorf("a subject with no message: %v, want ErrMsgNotFound", err)
	}
}

// TestKVGetAndDelete reads and deletes a key as kv.Get and kv.Delete with a revision do, without the
// bucket's stream info: a removed key is not found, and a delete of a key written since its
// revision is refused.
func TestKVGetAndDelete(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	const bucket, key = jetstream.BucketMembers, "r.sandbox.sb1"
	if _, _, err := jetstream.KVGet(ctx, env.JS, bucket, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("a key never written: %v, want ErrKeyNotFound", err)
	}
	rev, err := env.Bus.Members.Put(ctx, key, []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	v, got, err := jetstream.KVGet(ctx, env.JS, bucket, key)
	if err != nil || string(v) != "v1" || got != rev {
		t.Fatalf("KVGet: %q revision %d, %v; want v1 at %d", v, got, err, rev)
	}
	if err := jetstream.KVDelete(ctx, env.JS, bucket, key, rev-1); !errors.Is(err, natsjs.ErrKeyExists) {
		t.Errorf("a delete at an old revision: %v, want ErrKeyExists", err)
	}
	if err := jetstream.KVDelete(ctx, env.JS, bucket, key, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Members.Get(ctx, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("kv.Get of the deleted key: %v, want ErrKeyNotFound", err)
	}
	if _, _, err := jetstream.KVGet(ctx, env.JS, bucket, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("KVGet of the deleted key: %v, want ErrKeyNotFound", err)
	}
}
