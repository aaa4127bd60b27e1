package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/tier"
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

// cpuTime returns the CPU time this process (benchmark, members, bridge
// and embedded server alike) has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds the process's CPU milliseconds per op since start: less
// at the mercy of other jobs on a shared machine than wall time.
func reportCPU(b *testing.B, start time.Duration, ops int) {
	if ops > 0 {
		b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/1000/float64(ops), "cpu-ms/op")
	}
}

// BenchmarkRawFanout is the floor the checkpoint cycle is measured
// against: three rounds of a core-NATS request broadcast to N subscribers
// that each answer once, gathered until all N answers are in. No JetStream,
// no CloudEvents, no state.
func BenchmarkRawFanout(b *testing.B) {
	for _, n := range tier.Sizes(benchSizes...) {
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
			cpu := cpuTime(b)
			for b.Loop() {
				start := time.Now()
				for range 3 {
					if err := fanout(ctl, n); err != nil {
						b.Fatal(err)
					}
				}
				lat = append(lat, time.Since(start))
			}
			reportCPU(b, cpu, len(lat))
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
// sharing the process's one consumer (membertest.Host), on an embedded server.
// Compare with BenchmarkRawFanout of the same N.
func BenchmarkCheckpointCycle(b *testing.B) {
	for _, n := range tier.Sizes(benchSizes...) {
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
			cpu := cpuTime(b)
			for b.Loop() {
				i++
				start := time.Now()
				res, err := br.Checkpoint(b.Context(), bridgeapi.CheckpointRequest{ID: "b" + strconv.Itoa(i), TimeoutMS: 60000})
				if err != nil || res.Status != bridgeapi.StatusCommitted {
					if res != nil && res.Failure != nil {
						b.Fatalf("checkpoint: %+v", *res.Failure)
					}
					b.Fatalf("checkpoint: %v %+v", err, res)
				}
				lat = append(lat, time.Since(start))
				prep = append(prep, time.Duration(res.PrepareMS)*time.Millisecond)
				commit = append(commit, time.Duration(res.CommitMS)*time.Millisecond)
			}
			reportCPU(b, cpu, len(lat))
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

// BenchmarkBusFloor is the least any implementation of PROTOCOL §3 pays
// for one cycle, the writes the protocol mandates and nothing else: three
// rounds, each a core-NATS phase broadcast to the process followed by one
// once-only JetStream ack per member (expected-last-subject-sequence 0, a
// real ack's headers and body; at the commit round a commit ack carrying
// its member manifest, the manifest's one record), all pipelined from one
// goroutine; the round ends when an ordered consumer has read all N acks.
// No CloudEvents encoding or decoding, no member state, no heartbeats, no
// checkpoint manifest, no verification. BenchmarkCheckpointCycle of the
// same N cannot beat it; BenchmarkRawFanout is what it costs without
// JetStream.
func BenchmarkBusFloor(b *testing.B) {
	for _, n := range tier.Sizes(benchSizes...) {
		b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
			env := jstest.Start(b)
			nc, _ := env.Connect(b)
			// Room for every future of a commit round (two per member).
			js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(4*n+16))
			if err != nil {
				b.Fatal(err)
			}
			template, err := events.Marshal("agent.m0", events.PrepareAck{AckHeader: events.AckHeader{Run: run, Member: "agent.m0",
				Seq: 1, CheckpointID: "b1", Epoch: 1, OK: true, State: events.StatePrepared}})
			if err != nil {
				b.Fatal(err)
			}
			// The commit ack carries the member manifest, its one record
			// (PROTOCOL §5, commit): no other write.
			sha := strings.Repeat("0", 64)
			commitAck, err := events.Marshal("agent.m0", events.CommitAck{AckHeader: events.AckHeader{Run: run, Member: "agent.m0",
				Seq: 2, CheckpointID: "b1", Epoch: 1, OK: true, State: events.StateCommitted},
				Manifest: &events.MemberManifest{Schema: events.ManifestSchema, Run: run, CheckpointID: "b1", Member: "agent.m0",
					Object: events.RecordsObject(run, "b1", "agent.m0", sha), SHA256: sha, Count: 1, Size: 100, Episodes: []string{"r0"}}})
			if err != nil {
				b.Fatal(err)
			}
			members := make([]string, n)
			for i := range members {
				members[i] = "agent.m" + strconv.Itoa(i)
			}
			// The process's members: answer each phase with every member's
			// writes, pipelined, and report the first failure.
			failed := make(chan error, 1)
			finished := make(chan struct{}, 1) // a round's writes all answered
			fail := func(err error) {
				select {
				case failed <- err:
				default:
				}
			}
			var answering sync.WaitGroup
			sub, err := nc.Subscribe("floor.phase", func(m *nats.Msg) {
				round, commit := string(m.Data), m.Header.Get("commit") == "1"
				answering.Go(func() {
					futures := make([]natsjs.PubAckFuture, 0, n)
					tmpl, phase := template, "prepare"
					if commit {
						tmpl, phase = commitAck, "commit"
					}
					for _, member := range members {
						// Its id as a member's: the key and a random part
						// (PROTOCOL §4, Message ids).
						id := run + "." + round + "." + phase + "." + member + "." + events.NewID()
						h := nats.Header{}
						for k, v := range tmpl.Header {
							h[k] = v
						}
						h.Set(events.HeaderMsgID, id)
						h.Set(events.HeaderPrefix+"id", id)
						ack := &nats.Msg{Subject: "sp." + run + ".ack." + round + "." + phase + "." + member, Header: h, Data: tmpl.Data}
						f, err := js.PublishMsgAsync(ack, natsjs.WithExpectLastSequencePerSubject(0))
						if err != nil {
							fail(err)
							return
						}
						futures = append(futures, f)
					}
					deadline := time.After(30 * time.Second)
					for _, f := range futures {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							fail(err)
							return
						case <-deadline:
							fail(errors.New("no answer to an async publish in 30 s"))
							return
						}
					}
					finished <- struct{}{}
				})
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				_ = sub.Unsubscribe()
				answering.Wait()
			})
			if err := nc.Flush(); err != nil {
				b.Fatal(err)
			}
			var lat []time.Duration
			round := 0
			cpu := cpuTime(b)
			for b.Loop() {
				start := time.Now()
				for phase := range 3 {
					round++
					if err := floorRound(env, round, phase == 1, n, failed, finished); err != nil {
						b.Fatal(err)
					}
				}
				lat = append(lat, time.Since(start))
			}
			reportCPU(b, cpu, len(lat))
			reportLatencies(b, lat)
		})
	}
}

// floorRound broadcasts one phase and waits until the stream holds an ack
// from each of the n members, read back by an ordered consumer, and every
// write of the round has its server ack.
func floorRound(env *jstest.Env, round int, commit bool, n int, failed <-chan error, finished <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := strconv.Itoa(round)
	cons, err := env.JS.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.AckFilter(run, uint64(round))}})
	if err != nil {
		return err
	}
	var got atomic.Int64
	done := make(chan struct{})
	cc, err := cons.Consume(func(m natsjs.Msg) {
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	phase := &nats.Msg{Subject: "floor.phase", Header: nats.Header{}, Data: []byte(r)}
	if commit {
		phase.Header.Set("commit", "1")
	}
	if err := env.Conn.PublishMsg(phase); err != nil {
		return err
	}
	for _, ch := range []<-chan struct{}{done, finished} {
		select {
		case <-ch:
		case err := <-failed:
			return err
		case <-ctx.Done():
			return fmt.Errorf("round %d: %d of %d acks", round, got.Load(), n)
		}
	}
	return nil
}
