package jetstream_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// BenchmarkPublishPhase measures what the bridge does for every phase: build
// and encode the CloudEvent, publish it synchronously with Nats-Msg-Id
// deduplication to the file-backed STILLPOINT stream, and decode it as a
// member would. Its baseline, in the same process against the same server,
// is raw: a synchronous JetStream publish of a plain nats.Msg carrying the
// same bytes with no headers. docs/BENCHMARKS.md records the ratio.
func BenchmarkPublishPhase(b *testing.B) {
	env := jstest.Start(b)
	ctx := context.Background()
	members := make([]events.Member, 32)
	for i := range members {
		members[i] = events.Member("agent.a" + strconv.Itoa(i))
	}
	phase := func(seq uint64) events.Prepare {
		return events.Prepare{PhaseHeader: events.PhaseHeader{Run: "bench", CheckpointID: "ckpt-" + strconv.FormatUint(seq, 10),
			Seq: seq, Deadline: time.Now().Add(time.Minute).UTC(), Members: members}}
	}
	sample, err := events.Marshal("bridge.main", phase(1))
	if err != nil {
		b.Fatal(err)
	}

	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(sample.Data)))
		for i := 0; b.Loop(); i++ {
			m := &nats.Msg{Subject: "sp.bench.raw", Data: sample.Data}
			if _, err := env.JS.PublishMsg(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-with-headers", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(sample.Data)))
		for i := 0; b.Loop(); i++ {
			m := &nats.Msg{Subject: sample.Subject, Header: nats.Header{}, Data: sample.Data}
			for k, v := range sample.Header {
				m.Header[k] = v
			}
			m.Header.Set(nats.MsgIdHdr, "raw."+strconv.Itoa(i))
			if _, err := env.JS.PublishMsg(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("codec-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := events.Marshal("bridge.main", phase(7))
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := events.Unmarshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	var seq uint64 = 1
	b.Run("phase", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(sample.Data)))
		for b.Loop() {
			seq++
			p := phase(seq)
			m, err := events.Marshal("bridge.main", p, events.WithID("bench."+p.CheckpointID+".prepare"))
			if err != nil {
				b.Fatal(err)
			}
			ack, err := jetstream.PublishDedup(ctx, env.JS, m)
			if err != nil || ack.Duplicate {
				b.Fatalf("publish: %v (ack %+v)", err, ack)
			}
			if _, _, err := events.Unmarshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPublishOnceConcurrent measures what a host's members do when a
// phase arrives: 1,000 goroutines on one connection each publish one
// once-only ack and wait for the server's answer. One op is the whole burst.
// "sync" is the baseline, a synchronous nats.go publish per goroutine (a
// request round trip each); "once" is PublishOnce, which pipelines the
// goroutines' publishes on the connection's one async reply subscription.
func BenchmarkPublishOnceConcurrent(b *testing.B) {
	const burst = 1000
	env := jstest.Start(b)
	ctx := context.Background()
	body := []byte(`{"run":"bench","ok":true}`)
	round := 0
	run := func(b *testing.B, publish func(m *nats.Msg) error) {
		for b.Loop() {
			round++
			errs := make(chan error, burst)
			for i := range burst {
				go func() {
					m := &nats.Msg{Subject: "sp.bench.ack." + strconv.Itoa(round) + ".prepare.agent.a" + strconv.Itoa(i), Data: body}
					errs <- publish(m)
				}()
			}
			for range burst {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("sync", func(b *testing.B) {
		run(b, func(m *nats.Msg) error {
			_, err := env.JS.PublishMsg(ctx, m, natsjs.WithExpectLastSequencePerSubject(0))
			return err
		})
	})
	b.Run("once", func(b *testing.B) {
		run(b, func(m *nats.Msg) error {
			_, err := jetstream.PublishOnce(ctx, env.JS, m)
			return err
		})
	})
}
