package bridge_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// benchSizes are the member counts of the coordination benchmarks.
var benchSizes = []int{1, 100, 1000, 2048}

// benchConns is how many NATS connections the raw subscribers share: one,
// as the members of BenchmarkCheckpointCycle share their host's one
// connection, so that both pay the same connection layout.
const benchConns = 1

// reportLatencies adds p50 and p99 of per-operation times to b.
func reportLatencies(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
}

// BenchmarkRawFanout is the floor the checkpoint cycle is measured
// against: three rounds of a core-NATS request broadcast to N subscribers
// that each answer once, gathered until all N answers are in. No JetStream,
// no CloudEvents, no state.
func BenchmarkRawFanout(b *testing.B) {
	for _, n := range benchSizes {
		b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
			env := jstest.Start(b, jstest.WithoutProvision())
			conns := make([]*nats.Conn, benchConns)
			for i := range conns {
				conns[i], _ = env.Connect(b)
			}
			for i := 0; i < n; i++ {
				nc := conns[i%benchConns]
				if _, err := nc.Subscribe("raw.phase", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
					b.Fatal(err)
				}
			}
			for _, nc := range conns {
				if err := nc.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			ctl := env.Conn
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				for range 3 {
					if err := fanout(ctl, n); err != nil {
						b.Fatal(err)
					}
				}
				lat = append(lat, time.Since(start))
			}
			reportLatencies(b, lat)
		})
	}
}

// fanout publishes one request and waits for n replies.
func fanout(nc *nats.Conn, n int) error {
	inbox := nats.NewInbox()
	var got atomic.Int64
	done := make(chan struct{})
	sub, err := nc.Subscribe(inbox, func(*nats.Msg) {
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("raw.phase", inbox, []byte("prepare")); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d replies", got.Load(), n)
	}
}

// BenchmarkCheckpointCycle measures one full checkpoint — prepare, commit
// (an empty export and a manifest per member), checkpoint manifest,
// LATEST, outcome, resume — with N in-process members that do no work,
// sharing the process's one consumer (member.Host), on an embedded server.
// Compare with BenchmarkRawFanout of the same N.
func BenchmarkCheckpointCycle(b *testing.B) {
	for _, n := range benchSizes {
		b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
			env := jstest.Start(b)
			quiet := zerolog.Nop()
			// One process hosts every member: one consumer, one decode per
			// event (PROTOCOL §3).
			host := membertest.StartHost(b, env, run, "bench")
			membertest.StartMembers(b, env, run, n, membertest.Options{Logger: &quiet, Host: host})
			br := startBridgeQuiet(b, env)
			var lat, prep, commit []time.Duration
			i := 0
			for b.Loop() {
				i++
				start := time.Now()
				res, err := br.Checkpoint(b.Context(), bridge.CheckpointRequest{ID: "b" + strconv.Itoa(i), TimeoutMS: 60000})
				if err != nil || res.Status != bridge.StatusCommitted {
					if res != nil && res.Failure != nil {
						b.Fatalf("checkpoint: %+v", *res.Failure)
					}
					b.Fatalf("checkpoint: %v %+v", err, res)
				}
				lat = append(lat, time.Since(start))
				prep = append(prep, time.Duration(res.PrepareMS)*time.Millisecond)
				commit = append(commit, time.Duration(res.CommitMS)*time.Millisecond)
			}
			reportLatencies(b, lat)
			b.ReportMetric(median(prep), "prepare-p50-ms")
			b.ReportMetric(median(commit), "commit-p50-ms")
		})
	}
}

func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2].Microseconds()) / 1000
}

func startBridgeQuiet(b *testing.B, env *jstest.Env) *bridge.Bridge {
	nc, js := env.Connect(b)
	bus, err := jetstream.Open(b.Context(), js)
	if err != nil {
		b.Fatal(err)
	}
	br, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: bus, Logger: zerolog.Nop(), PhaseTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(b.Context()))
	done := make(chan error, 1)
	go func() { done <- br.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	return br
}
