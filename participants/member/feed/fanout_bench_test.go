package feed_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// BenchmarkPhaseFanOut measures what one phase costs the bus to reach N
// sandbox daemons, by the feed they read it from (PROTOCOL §3, Consumers):
// an ordered consumer each (what daemons read before the core feed), or a
// core subscription each of the phase's live copy, which the bridge
// publishes once the stream took the phase (Core). One op is one phase published
// to the stream (and, for the core feed, its live copy) and received by
// all N; "consumers" is how many the stream holds meanwhile. The
// subscribers share one connection, as the fan-out, not the clients, is
// what is measured.
func BenchmarkPhaseFanOut(b *testing.B) {
	for _, feed := range []string{"ordered", "core"} {
		for _, n := range tier.Sizes(100, 1000) {
			b.Run(fmt.Sprintf("feed=%s/members=%d", feed, n), func(b *testing.B) { fanOut(b, feed, n) })
		}
	}
}

func fanOut(b *testing.B, feed string, n int) {
	env := jstest.Start(b)
	nc, js := env.Connect(b)
	ctx := context.Background()
	var left atomic.Int64
	all := make(chan struct{}, 1)
	got := func() {
		if left.Add(-1) == 0 {
			all <- struct{}{}
		}
	}
	subject := "sp.bench.phase.prepare"
	for range n {
		switch feed {
		case "ordered":
			cons, err := js.OrderedConsumer(ctx, "STILLPOINT", natsjs.OrderedConsumerConfig{FilterSubjects: []string{"sp.bench.phase.>"},
				DeliverPolicy: natsjs.DeliverNewPolicy})
			if err != nil {
				b.Fatal(err)
			}
			cc, err := cons.Consume(func(natsjs.Msg) { got() })
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(cc.Stop)
		case "core":
			sub, err := nc.Subscribe(events.LivePhaseFilter("bench"), func(*nats.Msg) { got() })
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = sub.Unsubscribe() })
		}
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	info, err := env.Bus.Stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	consumers := info.State.Consumers
	b.ResetTimer()
	for b.Loop() {
		left.Store(int64(n))
		msg := &nats.Msg{Subject: subject, Data: []byte(`{"phase":"prepare"}`)}
		ack, err := env.JS.PublishMsg(ctx, msg)
		if err != nil {
			b.Fatal(err)
		}
		if feed == "core" {
			if err := nc.PublishMsg(events.LiveCopy(msg, ack.Sequence, 0)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d members still waiting for the phase after a minute", left.Load(), n)
		}
	}
	b.ReportMetric(float64(consumers), "consumers")
}
