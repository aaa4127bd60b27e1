package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/freeport"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
)

// The scale benchmark's programs: the member host and the NATS server.
const (
	scaleHost = "./e2e/internal/scalehost"
	scaleNode = "./e2e/internal/scalenode"
)

// The scale benchmark's knobs (go test -bench Scale ./e2e/ -scale.hosts 10).
var (
	scaleHosts     = flag.Int("scale.hosts", 20, "BenchmarkScale: member-host processes (members split evenly)")
	scaleHostProcs = flag.Int("scale.host-procs", 0, "BenchmarkScale: GOMAXPROCS of each member host (0: Go's default, the machine's CPUs)")
	scaleHostEnv   = flag.String("scale.host-env", "", "BenchmarkScale: environment entries added to each member host's, comma-separated (GOGC=400,...)")
	scaleConns     = flag.String("scale.conns", "member", "BenchmarkScale: one NATS connection per member (member) or per host process (host)")
	// The servers' default limit of consumers per stream: nats-server's
	// own (1,000 in 2.15) unless set; -1 lifts it. A protocol that keeps a
	// consumer per sandbox daemon (v1) needs it lifted past ~990 members.
	scaleMaxConsumers = flag.Int("scale.max-consumers", 0, "BenchmarkScale: the servers' default consumers per stream (0: nats-server's 1,000; -1: no limit)")
	scaleLogs         = flag.String("scale.logs", "", "BenchmarkScale: keep every server's and member host's output in this directory")
	scaleProfiles     = flag.String("scale.profiles", "", "BenchmarkScale: write each member host's CPU profile to this directory")
	// The floor alone: the hosts start no member, and each op is one floor
	// cycle: the least the protocol can pay at sizes its members cannot
	// reach on this machine.
	scaleFloorOnly = flag.Bool("scale.floor-only", false, "BenchmarkScale: measure the bus floor alone, no members, no bridge")
)

// The scale benchmark's sizes (docs/SCALE.md); under -short (make test)
// 200 members on R1.
var (
	scaleReplicas = []int{1, 3}
	scaleMembers  = []int{1000, 2048, 5000, 10000}
)

const (
	// scaleRun is the run the members serve, scaleFloorRun the one the
	// floor's acks are written under (so that they never meet a phase).
	scaleRun      = "scale"
	scaleFloorRun = "scalefloor"
	// scaleFloorSubject is the core-NATS subject of the floor's rounds.
	scaleFloorSubject = "scale.floor"
	// scaleClockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's
	// CPU times: 100 on every Linux this runs on.
	scaleClockTicks = 100
)

// BenchmarkScale measures one checkpoint cycle of N members in separate
// processes against nats-server child processes: one (replicas=1, stream
// R1) or a 3-node cluster on loopback (replicas=3, every stream R3). The
// bridge runs in this process; the members run in -scale.hosts scalehost
// processes (e2e/internal/scalehost), each member a real member.Member of
// kind sandbox with its own feed, state file and acks, as sandboxd runs
// it. Each op is one Checkpoint call, prepare publish to resume publish.
//
// After the cycles the same processes run the bus floor of the protocol:
// the prepare's and the resume's rounds, a core-NATS message every member
// hears on its own subscription and acks on core NATS as a sandbox daemon
// does (floorRounds), and as many persisted writes as a cycle made, of the
// same sizes (floorPlan). x-floor is the cycle over the floor, x-live-floor
// over its rounds alone; docs/SCALE.md explains every metric.
//
// A size takes minutes to set up: run one at a time, with a small count.
// -scale.floor-only measures the floor alone:
//
//	go test -run '^$' -bench 'Scale/replicas=1/members=1000$' -benchtime 3x ./e2e/
//	go test -run '^$' -bench 'Scale/replicas=3/members=10000$' -benchtime 1x -timeout 60m ./e2e/
func BenchmarkScale(b *testing.B) {
	for _, r := range tier.Sizes(scaleReplicas...) {
		b.Run("replicas="+strconv.Itoa(r), func(b *testing.B) {
			for _, n := range tier.Pick(scaleMembers, []int{200}) {
				b.Run("members="+strconv.Itoa(n), func(b *testing.B) {
					cfg := scaleConfig{replicas: r, members: n, hosts: *scaleHosts, conns: *scaleConns, maxConsumers: *scaleMaxConsumers,
						floorOnly: *scaleFloorOnly}
					w := startScale(b, cfg)
					if cfg.floorOnly {
						w.floorOnly(b)
						return
					}
					w.warmUp(b)
					var cycles []scaleCycle
					w.begin(b)
					i := 0
					for b.Loop() {
						i++
						cycles = append(cycles, w.cycle(b, "c"+strconv.Itoa(i)))
					}
					f := w.end(b, cycles, max(len(cycles), 3))
					f.report(b)
					b.Logf("scale %s", f)
				})
			}
		})
	}
}

// TestScaleHarness runs the scale benchmark's harness once, small (200
// members in 4 processes, R1), and checks that its figures are those of a
// cycle that happened: every member in every cycle, writes and bytes per
// member in the range the protocol allows, a server that worked, a floor
// below the cycle.
func TestScaleHarness(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 5*time.Second)
	const n = 200
	w := startScale(t, scaleConfig{replicas: 1, members: n, hosts: 4, conns: "member"})
	w.warmUp(t)
	w.begin(t)
	var cycles []scaleCycle
	for i := range 3 {
		cycles = append(cycles, w.cycle(t, "c"+strconv.Itoa(i+1)))
	}
	f := w.end(t, cycles, 3)
	t.Logf("scale %s", f)
	// Per member and cycle: a sandbox daemon stores nothing (its prepare
	// and resume acks travel on core NATS, and it is sent no commit), so
	// what is written is the bridge's: its phases, roster, records,
	// outcome and manifest, a few messages in all (PROTOCOL §3).
	if f.writes <= 0 || f.writes > 0.2 {
		t.Errorf("%.3f persisted writes per member per cycle, want the bridge's few over %d members (0 to 0.2)", f.writes, n)
	}
	if f.bytes < 5 || f.bytes > 2000 {
		t.Errorf("%.0f bytes per member per cycle, want 5 to 2,000 (the roster's name and the outcome's)", f.bytes)
	}
	if f.serverCPU <= 0 || f.hostsCPU <= 0 || f.selfCPU <= 0 {
		t.Errorf("server CPU %.1f ms, hosts CPU %.1f ms, bridge process CPU %.1f ms per cycle: a cycle costs CPU", f.serverCPU, f.hostsCPU, f.selfCPU)
	}
	if f.consumers < 1 || f.consumers > n+16 {
		t.Errorf("%d consumers on the stream, want 1 to %d", f.consumers, n+16)
	}
	// The floor's CPU is a part of the cycle's; its wall time is only
	// positive, since on a busy machine the two swing past each other.
	if f.floor <= 0 || f.floorCPU <= 0 || f.floorCPU > f.cpu() {
		t.Errorf("floor p50 %.1f ms and %.1f ms of CPU, cycle %.1f ms of CPU: the floor is a positive part of the cycle", f.floor, f.floorCPU, f.cpu())
	}
	if f.outMsgs < 1 || f.outKB <= 0 || f.prepareSize <= 0 || f.outcomeSize <= 0 {
		t.Errorf("servers sent %.1f messages, %.1f KB per member and cycle; prepare event %.0f B, outcome %.0f B: none can be 0",
			f.outMsgs, f.outKB, f.prepareSize, f.outcomeSize)
	}
	if f.prepare <= 0 || f.prepare+f.commit > f.p99+1 {
		t.Errorf("prepare %.1f ms + commit %.1f ms against a cycle p99 %.1f ms", f.prepare, f.commit, f.p99)
	}
}

// scaleConfig is one size of the benchmark.
type scaleConfig struct {
	replicas, members, hosts int
	conns                    string
	maxConsumers             int
	floorOnly                bool
}

// scaleWorld is the servers, member hosts and bridge of one size.
type scaleWorld struct {
	cfg     scaleConfig
	servers []*child.Process
	// monitors are the servers' monitoring URLs, as servers.
	monitors []string
	hosts    []*child.Process
	nc       *nats.Conn
	js       natsjs.JetStream
	bus      *jetstream.Bus
	br       *bridge.Bridge
	// consumers is the stream's consumer count once every member runs.
	consumers int
	// before is the bus and CPU at the start of the measured cycles.
	before scaleState
	// floorAddress is the members and roster the floor's phases address.
	floorAddress events.PhaseHeader
}

// startScale starts the servers, the member hosts and the bridge of cfg,
// and returns once every member has joined.
func startScale(tb testing.TB, cfg scaleConfig) *scaleWorld {
	tb.Helper()
	cfg.hosts = max(1, min(cfg.hosts, cfg.members))
	began := time.Now()
	bins := build.StaticForTest(tb, scaleNode, scaleHost)
	w := &scaleWorld{cfg: cfg}
	if *scaleProfiles != "" {
		// The servers and hosts write their profiles there: a missing
		// directory would stop them before they start.
		if err := os.MkdirAll(*scaleProfiles, 0o755); err != nil {
			tb.Fatalf("-scale.profiles: %v", err)
		}
	}
	dir := tb.TempDir()
	url := w.startServers(tb, bins[scaleNode], dir, logDir(tb, dir))
	tb.Logf("scale: %d server process(es) at %s (R%d), %.1f s", len(w.servers), url, cfg.replicas, time.Since(began).Seconds())

	ctx, cancel := context.WithTimeout(tb.Context(), 2*time.Minute)
	defer cancel()
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, Name: "scale-bench"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	if w.js, err = jetstream.New(nc); err != nil {
		tb.Fatal(err)
	}
	w.nc = nc
	w.provision(tb, ctx)
	if w.bus, err = jetstream.Open(ctx, w.js); err != nil {
		tb.Fatal(err)
	}

	w.startHosts(tb, bins[scaleHost], url)
	if cfg.floorOnly {
		tb.Logf("scale: %d floor members in %d processes, %.1f s", cfg.members, cfg.hosts, time.Since(began).Seconds())
		return w
	}
	tb.Logf("scale: %d members joined in %d processes, %.1f s", cfg.members, cfg.hosts, time.Since(began).Seconds())
	w.waitHeartbeats(tb)

	// The phases' live copies on a connection of their own, as `stillpoint
	// bridge` sends them.
	lnc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, Name: "scale-bench-live"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(lnc.Close)
	br, err := bridge.New(bridge.Config{Run: scaleRun, Conn: nc, LiveConn: lnc, JS: w.js, Bus: w.bus, PhaseTimeout: 2 * time.Minute,
		Logger: zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.WarnLevel)})
	if err != nil {
		tb.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(tb.Context()))
	done := make(chan error, 1)
	go func() { done <- br.Run(rctx) }()
	tb.Cleanup(func() {
		rcancel()
		if err := <-done; err != nil {
			tb.Errorf("bridge: %v", err)
		}
	})
	w.br = br
	return w
}

var (
	scaleNodeReady = regexp.MustCompile(`scalenode \S+ ready at (\S+) monitor (\S+)`)
	scaleHostReady = regexp.MustCompile(`scalehost \S+: floor on`)
)

// startServers starts one scalenode (R1) or three routed to each other
// (R3) and returns the URL.
func (w *scaleWorld) startServers(tb testing.TB, scalenode, dir, logs string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 2*time.Minute)
	defer cancel()
	limit := strconv.Itoa(w.cfg.maxConsumers)
	var urls []string
	switch w.cfg.replicas {
	case 1:
		w.servers = []*child.Process{child.StartForTest(tb, child.Spec{Name: "nats", Path: scalenode, LogFile: filepath.Join(logs, "nats.log"),
			Args: append([]string{"-name", "n0", "-dir", filepath.Join(dir, "nats"), "-max-consumers", limit}, w.nodeProfile("n0")...)})}
	case 3:
		// Every node's routes name the others' ports before they bind
		// them: ports no outgoing connection can take meanwhile.
		ps, err := freeport.Reserve("127.0.0.1", 6)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(ps.Release)
		addrs := make([]string, 6)
		for i := range addrs {
			addrs[i] = ps.Addr("127.0.0.1", i)
		}
		var routes []string
		for i := range 3 {
			routes = append(routes, "nats-route://"+addrs[2*i+1])
		}
		for i := range 3 {
			name := "n" + strconv.Itoa(i)
			w.servers = append(w.servers, child.StartForTest(tb, child.Spec{Name: "nats-" + name, Path: scalenode,
				LogFile: filepath.Join(logs, "nats-"+name+".log"),
				Args: append([]string{"-name", name, "-dir", filepath.Join(dir, "nats", name), "-max-consumers", limit,
					"-listen", addrs[2*i], "-cluster-listen", addrs[2*i+1], "-routes", strings.Join(routes, ",")}, w.nodeProfile(name)...)}))
		}
	default:
		tb.Fatalf("replicas %d: the benchmark runs 1 or 3", w.cfg.replicas)
	}
	for _, p := range w.servers {
		m, err := p.WaitOutput(ctx, scaleNodeReady)
		if err != nil {
			tb.Fatalf("%s did not come up: %v", p.Name(), err)
		}
		urls = append(urls, m[1])
		w.monitors = append(w.monitors, m[2])
	}
	return strings.Join(urls, ",")
}

// nodeProfile is the flag that writes server name's CPU profile under
// -scale.profiles, if it is set.
func (w *scaleWorld) nodeProfile(name string) []string {
	if *scaleProfiles == "" {
		return nil
	}
	return []string{"-cpuprofile", filepath.Join(*scaleProfiles, fmt.Sprintf("R%d-N%d-nats-%s.pprof", w.cfg.replicas, w.cfg.members, name))}
}

// logDir is where the processes' output files go: under -scale.logs, one
// directory per size, or else dir (the servers' logs in the size's
// temporary directory; a failed run's log gets the end of every output).
func logDir(tb testing.TB, dir string) string {
	if *scaleLogs == "" {
		return dir
	}
	return filepath.Join(*scaleLogs, strings.ReplaceAll(strings.TrimPrefix(tb.Name(), "BenchmarkScale/"), "/", "-"))
}

// provision makes the bus at the cluster's replicas once a JetStream meta
// leader is elected.
func (w *scaleWorld) provision(tb testing.TB, ctx context.Context) {
	tb.Helper()
	var last error
	err := poll.Until(ctx, poll.Every(250*time.Millisecond), func() (bool, error) {
		once, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, last = jetstream.Provision(once, w.js, jetstream.Topology{Replicas: w.cfg.replicas})
		return last == nil, nil
	})
	if err != nil {
		tb.Fatalf("provision at R%d: %v (last: %v)", w.cfg.replicas, err, last)
	}
}

// startHosts starts the member hosts, the members split evenly, and waits
// until each says all its members joined.
func (w *scaleWorld) startHosts(tb testing.TB, scalehost, url string) {
	tb.Helper()
	// The members' state files go to memory when it can: on one disk,
	// 10,000 daemons' fsyncs would measure the disk, not the bus (each
	// sandbox has a disk of its own).
	state, err := os.MkdirTemp("/dev/shm", "stillpoint-scale-")
	if err != nil {
		state = tb.TempDir()
	} else {
		tb.Cleanup(func() { _ = os.RemoveAll(state) })
	}
	n, h := w.cfg.members, w.cfg.hosts
	for i := range h {
		k := n / h
		if i < n%h {
			k++
		}
		name := fmt.Sprintf("h%02d", i)
		args := []string{"-url", url, "-run", scaleRun, "-name", name, "-members", strconv.Itoa(k),
			"-state-dir", filepath.Join(state, name), "-conns", w.cfg.conns,
			"-floor-subject", scaleFloorSubject, "-floor-run", scaleFloorRun}
		if w.cfg.floorOnly {
			args = append(args, "-floor-only")
		}
		if *scaleProfiles != "" {
			args = append(args, "-cpuprofile", filepath.Join(*scaleProfiles, fmt.Sprintf("R%d-N%d-%s.pprof", w.cfg.replicas, n, name)))
		}
		spec := child.Spec{Name: "scalehost-" + name, Path: scalehost, Args: args}
		if *scaleHostProcs > 0 {
			spec.Env = []string{"GOMAXPROCS=" + strconv.Itoa(*scaleHostProcs)}
		}
		if *scaleHostEnv != "" {
			spec.Env = append(spec.Env, strings.Split(*scaleHostEnv, ",")...)
		}
		if *scaleLogs != "" {
			spec.LogFile = filepath.Join(logDir(tb, ""), spec.Name+".log")
		}
		w.hosts = append(w.hosts, child.StartForTest(tb, spec))
	}
	// Generous: 10,000 members on a busy 2-core machine take minutes.
	within := 3*time.Minute + time.Duration(n)*40*time.Millisecond
	ctx, cancel := context.WithTimeout(tb.Context(), within)
	defer cancel()
	for i, p := range w.hosts {
		if _, err := p.WaitOutput(ctx, scaleHostReady); err != nil {
			tb.Fatalf("%s: its members did not all join within %s: %v%s", p.Name(), within, err, consumerLimitHint(p.Output()))
		}
		if (i+1)%5 == 0 || i+1 == len(w.hosts) {
			tb.Logf("scale: %d of %d member hosts ready", i+1, len(w.hosts))
		}
	}
}

// consumerLimitHint says what to do when what failed is the servers'
// limit of consumers per stream.
func consumerLimitHint(what string) string {
	if !strings.Contains(what, "maximum consumers limit reached") {
		return ""
	}
	return fmt.Sprintf(" (the stream's consumers hit the servers' limit, -scale.max-consumers=%d: a protocol with a consumer per "+
		"sandbox daemon needs it lifted, -scale.max-consumers=-1; docs/SCALE.md)", *scaleMaxConsumers)
}

// waitHeartbeats waits until sp_daemons holds a heartbeat of every
// member (each a sandbox daemon). It counts the keys by the bucket's stream (one subject a key),
// not by a key lister, whose watcher can be left blocked by the updates
// that thousands of heartbeats send it meanwhile.
func (w *scaleWorld) waitHeartbeats(tb testing.TB) {
	tb.Helper()
	var have int
	poll.Wait(tb, 2*time.Minute, fmt.Sprintf("%d heartbeats in %s", w.cfg.members, jetstream.BucketDaemons), func() bool {
		ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
		defer cancel()
		s, err := w.js.Stream(ctx, "KV_"+jetstream.BucketDaemons)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, natsjs.WithSubjectFilter("$KV."+jetstream.BucketDaemons+"."+scaleRun+".>"))
		if err != nil {
			return false
		}
		have = len(info.State.Subjects)
		return have == w.cfg.members
	})
}

// scaleCycle is one checkpoint's times.
type scaleCycle struct {
	total, prepare, commit time.Duration
}

// cycle takes checkpoint id and fails unless every member committed it.
func (w *scaleWorld) cycle(tb testing.TB, id string) scaleCycle {
	tb.Helper()
	start := time.Now()
	res, err := w.br.Checkpoint(tb.Context(), bridgeapi.CheckpointRequest{ID: id, TimeoutMS: 120000})
	took := time.Since(start)
	if err != nil {
		tb.Fatalf("checkpoint %s: %v%s", id, err, consumerLimitHint(err.Error()))
	}
	if res.Status != bridgeapi.StatusCommitted {
		if res.Failure != nil {
			tb.Fatalf("checkpoint %s: %s: %+v%s", id, res.Status, *res.Failure, consumerLimitHint(fmt.Sprint(*res.Failure)))
		}
		tb.Fatalf("checkpoint %s: %s", id, res.Status)
	}
	if len(res.Members) != w.cfg.members {
		tb.Fatalf("checkpoint %s committed with %d members, want all %d", id, len(res.Members), w.cfg.members)
	}
	return scaleCycle{total: took, prepare: time.Duration(res.PrepareMS) * time.Millisecond, commit: time.Duration(res.CommitMS) * time.Millisecond}
}

// warmUp takes one checkpoint that is not measured (the first makes the
// consumers' and the bridge's state), waits for its resume acks, and
// counts the stream's consumers.
func (w *scaleWorld) warmUp(tb testing.TB) {
	tb.Helper()
	c := w.cycle(tb, "warm")
	w.waitResumeAcks(tb)
	st := w.state(tb)
	w.consumers = st.consumers
	tb.Logf("scale: warm-up checkpoint %.0f ms; %d consumers on %s", ms(c.total), w.consumers, jetstream.StreamName)
}

// begin marks the start of the measured cycles.
func (w *scaleWorld) begin(tb testing.TB) {
	tb.Helper()
	w.before = w.state(tb)
}

// end waits for the last cycle's resume acks, reads the bus and the CPU,
// runs floorCycles cycles of the bus floor and returns the figures.
func (w *scaleWorld) end(tb testing.TB, cycles []scaleCycle, floorCycles int) scaleFigures {
	tb.Helper()
	if len(cycles) == 0 {
		tb.Fatal("no cycle measured")
	}
	w.waitResumeAcks(tb)
	after := w.state(tb)
	n := float64(len(cycles) * w.cfg.members)
	d := func(names ...string) (msgs, bytes float64) {
		for name, a := range after.streams {
			for _, want := range names {
				if name == want || strings.HasSuffix(want, "*") && strings.HasPrefix(name, strings.TrimSuffix(want, "*")) {
					bf := w.before.streams[name]
					msgs += float64(a.LastSeq - bf.LastSeq)
					bytes += float64(int64(a.Bytes) - int64(bf.Bytes))
				}
			}
		}
		return msgs / n, bytes / n
	}
	f := scaleFigures{cfg: w.cfg, cycles: len(cycles), consumers: w.consumers}
	var mb, kb, ob float64
	f.streamWrites, mb = d(jetstream.StreamName)
	f.kvWrites, kb = d("KV_" + jetstream.BucketManifests)
	f.objWrites, ob = d("OBJ_*")
	f.writes, f.bytes = f.streamWrites+f.kvWrites+f.objWrites, mb+kb+ob
	f.heartbeats, _ = d("KV_" + jetstream.BucketMembers)
	f.outMsgs = float64(after.traffic.OutMsgs-w.before.traffic.OutMsgs) / n
	f.outKB = float64(after.traffic.OutBytes-w.before.traffic.OutBytes) / n / 1000
	f.inMsgs = float64(after.traffic.InMsgs-w.before.traffic.InMsgs) / n
	f.prepareSize = w.eventSize(tb, events.PhaseSubject(scaleRun, events.PhasePrepare))
	f.manifestSize = w.manifestSize(tb, "c"+strconv.Itoa(len(cycles)))
	f.outcomeSize = w.eventSize(tb, events.OutcomeSubject(scaleRun, events.TypeCheckpointCommitted))
	per := func(now, before time.Duration) float64 { return ms(now-before) / float64(len(cycles)) }
	f.serverCPU = per(after.cpu.servers, w.before.cpu.servers)
	f.hostsCPU = per(after.cpu.hosts, w.before.cpu.hosts)
	f.selfCPU = per(after.cpu.self, w.before.cpu.self)
	var total, prep, commit []time.Duration
	for _, c := range cycles {
		total, prep, commit = append(total, c.total), append(prep, c.prepare), append(commit, c.commit)
	}
	f.p50, f.p99 = quantile(total, 0.5), quantile(total, 0.99)
	f.prepare, f.commit = quantile(prep, 0.5), quantile(commit, 0.5)

	perCycle := float64(w.cfg.members)
	plan := floorPlan(f.streamWrites*perCycle, mb*perCycle, f.kvWrites*perCycle, kb*perCycle, f.objWrites*perCycle, ob*perCycle)
	var floor, live []time.Duration
	cpu := w.cpu(tb)
	for i := range floorCycles {
		all, rounds := w.floorCycle(tb, uint64(len(floorRounds)*i), plan)
		floor, live = append(floor, all), append(live, rounds)
	}
	f.floorServerCPU, f.floorCPU = w.cpu(tb).since(cpu, floorCycles)
	f.floor, f.liveFloor = quantile(floor, 0.5), quantile(live, 0.5)
	f.floorWrites = len(plan)
	return f
}

// floorWrite is one persisted write of the floor: a publish to subject,
// awaited, of size bytes.
type floorWrite struct {
	subject string
	size    int
}

// floorPlan returns the persisted writes a cycle made, as the streams
// counted them (messages and stored bytes per cycle, into STILLPOINT, the
// manifests' KV and the object stores): the floor makes as many, of the
// same sizes, on subjects of its own run in the same streams. They are
// the bridge's (phases, roster, records, outcome, manifest, LATEST, HEAD,
// member list): the protocol's own writes, which a cycle cannot do
// without.
func floorPlan(stream, streamB, kv, kvB, obj, objB float64) []floorWrite {
	var out []floorWrite
	add := func(n, bytes float64, subject func(k int) string) {
		count := int(n + 0.5)
		for k := range count {
			// Stored bytes are the payload and a record of ~30 bytes and the subject.
			size := max(int(bytes/float64(count))-30-len(subject(k)), 0)
			out = append(out, floorWrite{subject: subject(k), size: size})
		}
	}
	add(stream, streamB, func(k int) string { return fmt.Sprintf("sp.%s.floor.w%d", scaleFloorRun, k) })
	add(kv, kvB, func(k int) string { return fmt.Sprintf("$KV.%s.%s.w%d", jetstream.BucketManifests, scaleFloorRun, k) })
	add(obj, objB, func(k int) string {
		return fmt.Sprintf("$O.%s.C.%s-w%d", jetstream.BucketCheckpoints, scaleFloorRun, k)
	})
	return out
}

// floorOnly measures the bus floor alone, one floor cycle per op.
func (w *scaleWorld) floorOnly(b *testing.B) {
	var floor []time.Duration
	cpu := w.cpu(b)
	i := 0
	for b.Loop() {
		all, _ := w.floorCycle(b, uint64(len(floorRounds)*i), nil)
		floor = append(floor, all)
		i++
	}
	serverCPU, allCPU := w.cpu(b).since(cpu, len(floor))
	b.ReportMetric(quantile(floor, 0.5), "floor-p50-ms")
	b.ReportMetric(quantile(floor, 0.99), "floor-p99-ms")
	b.ReportMetric(serverCPU, "floor-server-cpu-ms/op")
	b.ReportMetric(allCPU, "floor-cpu-ms/op")
	b.Logf("scale floor alone R%d N=%d (%d hosts), %d cycles: p50 %.0f ms, p99 %.0f ms, server CPU %.0f ms, all processes' %.0f ms per cycle",
		w.cfg.replicas, w.cfg.members, w.cfg.hosts, len(floor), quantile(floor, 0.5), quantile(floor, 0.99), serverCPU, allCPU)
}

// scaleCPU is the CPU time the servers, the hosts and this process (the
// bridge's in a cycle, the reading of the acks in a floor round) had used
// at one moment.
type scaleCPU struct{ servers, hosts, self time.Duration }

func (w *scaleWorld) cpu(tb testing.TB) scaleCPU {
	tb.Helper()
	return scaleCPU{servers: cpuOf(tb, w.servers), hosts: cpuOf(tb, w.hosts), self: selfCPU(tb)}
}

// since returns the servers' CPU, and every process's together, per
// cycle of n since before, in ms.
func (c scaleCPU) since(before scaleCPU, n int) (servers, all float64) {
	servers = ms(c.servers-before.servers) / float64(n)
	all = ms(c.servers+c.hosts+c.self-before.servers-before.hosts-before.self) / float64(n)
	return servers, all
}

// selfCPU is the user and system CPU time of this process.
func selfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// floorRounds are the rounds of one floor cycle, as a cycle's phases of
// sandbox daemons (PROTOCOL §3, §5): the prepare and the resume, each
// heard by every member and answered on core NATS (events.LiveAck). The
// commit addresses no sandbox daemon, and no daemon hears it.
var floorRounds = []struct {
	phase events.Phase
	ack   string
}{{events.PhasePrepare, "core"}, {events.PhaseResume, "core"}}

// floorCycle runs one floor cycle, rounds base+1 on, with the persisted
// writes of plan: the first before the first round (the prepare's own
// publish comes before its live copy), the others between the rounds, one
// after another, each awaited, as the bridge makes them. It returns the
// cycle's time and the rounds' alone.
func (w *scaleWorld) floorCycle(tb testing.TB, base uint64, plan []floorWrite) (all, rounds time.Duration) {
	tb.Helper()
	for i, r := range floorRounds {
		if len(plan) > 0 {
			n := 1
			if i == len(floorRounds)-1 {
				n = len(plan)
			}
			all += w.floorWrites(tb, plan[:n])
			plan = plan[n:]
		}
		took := w.floorRound(tb, base+uint64(i)+1, r.phase, r.ack)
		all, rounds = all+took, rounds+took
	}
	return all, rounds
}

// floorWrites makes the writes, each awaited, and returns their time.
func (w *scaleWorld) floorWrites(tb testing.TB, writes []floorWrite) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	for _, fw := range writes {
		if _, err := w.js.Publish(ctx, fw.subject, make([]byte, fw.size)); err != nil {
			tb.Fatalf("floor write %s (%d B): %v", fw.subject, fw.size, err)
		}
	}
	return time.Since(start)
}

// floorRound runs one floor round and returns its time: from its
// publish, which every member hears on its own subscription, until every
// host says each of its members heard it (and its persisted acks have
// their server acks), and every member's ack, persisted or core, is read
// back.
func (w *scaleWorld) floorRound(tb testing.TB, round uint64, p events.Phase, ack string) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 2*time.Minute)
	defer cancel()
	var got atomic.Int64
	acked := make(chan struct{})
	count := func() {
		if got.Add(1) == int64(w.cfg.members) {
			close(acked)
		}
	}
	msg := w.floorPhase(tb, round, p)
	msg.Header.Set(scalehostFloorRound, strconv.FormatUint(round, 10))
	msg.Header.Set(scalehostFloorAck, ack)
	switch ack {
	case "persist":
		cons, err := w.js.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
			FilterSubjects: []string{events.AckFilter(scaleFloorRun, round)}})
		if err != nil {
			tb.Fatal(err)
		}
		cc, err := cons.Consume(func(natsjs.Msg) { count() })
		if err != nil {
			tb.Fatal(err)
		}
		defer cc.Stop()
	case "core":
		subject := nats.NewInbox()
		sub, err := w.nc.Subscribe(subject, func(*nats.Msg) { count() })
		if err != nil {
			tb.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		defer func() { _ = sub.Unsubscribe() }()
		msg.Header.Set(scalehostFloorAckSubject, subject)
	default:
		close(acked)
	}
	inbox := nats.NewInbox()
	answers := make(chan string, len(w.hosts))
	sub, err := w.nc.Subscribe(inbox, func(m *nats.Msg) { answers <- string(m.Data) })
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := w.nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	msg.Subject, msg.Reply = scaleFloorSubject, inbox
	start := time.Now()
	if err := w.nc.PublishMsg(msg); err != nil {
		tb.Fatal(err)
	}
	for range w.hosts {
		select {
		case a := <-answers:
			if a != "ok" {
				tb.Fatalf("floor round %d (%s): a host answered %s", round, p, a)
			}
		case <-ctx.Done():
			tb.Fatalf("floor round %d (%s): the hosts did not all answer: %v", round, p, ctx.Err())
		}
	}
	select {
	case <-acked:
	case <-ctx.Done():
		tb.Fatalf("floor round %d (%s): %d of %d acks read back", round, p, got.Load(), w.cfg.members)
	}
	return time.Since(start)
}

// The floor round's own headers on the phase's live copy, as scalehost
// reads them (e2e/internal/scalehost, floorRequest).
const (
	scalehostFloorRound      = "Sp-Floor-Round"
	scalehostFloorAck        = "Sp-Floor-Ack"
	scalehostFloorAckSubject = "Sp-Floor-Ack-Subject"
)

// floorPhase returns what a round sends every member: the live copy of a
// real phase event of the kind, built as the bridge builds it for N
// sandbox daemons (their roster's reference, its ce-* headers and JSON
// data, the live copy's stream sequence and previous phase), so that the
// floor moves the bytes a cycle moves and each member's client library
// parses the same headers. No member decodes it.
func (w *scaleWorld) floorPhase(tb testing.TB, round uint64, p events.Phase) *nats.Msg {
	tb.Helper()
	if w.floorAddress.Sandboxes == nil {
		var members []events.Member
		for i := range w.cfg.members {
			m, err := events.NewMember(events.KindSandbox, fmt.Sprintf("h%02d-%d", i%w.cfg.hosts, i/w.cfg.hosts))
			if err != nil {
				tb.Fatal(err)
			}
			members = append(members, m)
		}
		w.floorAddress = events.PhaseHeader{}.Address(members)
	}
	// The roster as a cycle's prepare names it: published with the phase,
	// at the stream sequence before it.
	ref := *w.floorAddress.Sandboxes
	ref.Seq, ref.StreamSeq = round, round
	h := events.PhaseHeader{Run: scaleFloorRun, CheckpointID: "f" + strconv.FormatUint(round, 10), Seq: round, Epoch: 1,
		Deadline: time.Now().Add(time.Minute), Members: w.floorAddress.Members, Sandboxes: &ref}
	var d events.PhaseEvent = events.Prepare{PhaseHeader: h}
	if p == events.PhaseResume {
		d = events.Resume{PhaseHeader: h}
	}
	src, _ := events.NewMember(events.KindBridge, "main")
	id := strings.Join([]string{scaleFloorRun, strconv.FormatUint(round, 10), string(p), h.CheckpointID, "floor"}, ".")
	msg, err := events.Marshal(src, d, events.WithID(id))
	if err != nil {
		tb.Fatalf("floor round %d: %v", round, err)
	}
	return events.LiveCopy(msg, round, round-1)
}

// waitResumeAcks waits until the bridge has recorded in the stream that
// every member acked the run's last resume (its acks travel on core NATS,
// and the bridge does not wait for them: PROTOCOL §3, §5), so that the
// next checkpoint does not pay for them and the stream's state counts
// whole cycles.
func (w *scaleWorld) waitResumeAcks(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 2*time.Minute)
	defer cancel()
	last, err := w.bus.Stream.GetLastMsgForSubject(ctx, events.PhaseSubject(scaleRun, events.PhaseResume))
	if err != nil {
		tb.Fatalf("the last resume: %v", err)
	}
	seq, err := strconv.ParseUint(last.Header.Get(events.HeaderPrefix+events.ExtSeq), 10, 64)
	if err != nil {
		tb.Fatalf("the last resume's %s: %v", events.ExtSeq, err)
	}
	var rec events.ResumeAcked
	err = poll.Until(ctx, poll.Every(100*time.Millisecond), func() (bool, error) {
		raw, err := w.bus.Stream.GetLastMsgForSubject(ctx, events.ResumeAckedSubject(scaleRun, seq))
		if err != nil {
			return false, nil
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			return false, err
		}
		rec = d.(events.ResumeAcked)
		return true, nil
	})
	if err != nil {
		tb.Fatalf("the record of resume %d's acks: %v", seq, err)
	}
	if rec.Answered != w.cfg.members || rec.ErrorCount != 0 {
		tb.Fatalf("resume %d: %d of %d members acked, %d errors (first silent: %v)", seq, rec.Answered, w.cfg.members, rec.ErrorCount, rec.Missing)
	}
}

// scaleState is what the bus holds and the processes used at one moment.
type scaleState struct {
	streams   map[string]natsjs.StreamState
	consumers int
	cpu       scaleCPU
	// traffic is the servers' /varz counters added up: every message and
	// byte they received and sent, clients and routes alike.
	traffic scaleTraffic
}

// scaleTraffic is what /varz counts of a server's messages and bytes.
type scaleTraffic struct {
	InMsgs   uint64 `json:"in_msgs"`
	OutMsgs  uint64 `json:"out_msgs"`
	InBytes  uint64 `json:"in_bytes"`
	OutBytes uint64 `json:"out_bytes"`
}

// state reads every stream's state and the CPU of the servers and hosts.
func (w *scaleWorld) state(tb testing.TB) scaleState {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	st := scaleState{streams: map[string]natsjs.StreamState{}}
	names := w.js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := w.js.Stream(ctx, name)
		if err != nil {
			tb.Fatalf("stream %s: %v", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			tb.Fatalf("stream %s: %v", name, err)
		}
		st.streams[name] = info.State
		if name == jetstream.StreamName {
			st.consumers = info.State.Consumers
		}
	}
	if err := names.Err(); err != nil {
		tb.Fatalf("stream names: %v", err)
	}
	st.cpu = w.cpu(tb)
	for _, m := range w.monitors {
		t := varz(tb, ctx, m)
		st.traffic.InMsgs += t.InMsgs
		st.traffic.OutMsgs += t.OutMsgs
		st.traffic.InBytes += t.InBytes
		st.traffic.OutBytes += t.OutBytes
	}
	return st
}

// varz reads a server's message and byte counters from its monitoring.
func varz(tb testing.TB, ctx context.Context, monitor string) scaleTraffic {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, monitor+"/varz", nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s/varz: %v", monitor, err)
	}
	defer resp.Body.Close()
	var t scaleTraffic
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		tb.Fatalf("%s/varz: %v", monitor, err)
	}
	return t
}

// eventSize returns the size, headers and data, of the last message on
// subject, 0 if there is none.
func (w *scaleWorld) eventSize(tb testing.TB, subject string) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	m, err := w.bus.Stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return 0
	}
	if err != nil {
		tb.Fatalf("the last message on %s: %v", subject, err)
	}
	size := len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	return float64(size)
}

// manifestSize returns the size of checkpoint id's manifest in
// sp_manifests (<run>.<id>), whatever its schema.
func (w *scaleWorld) manifestSize(tb testing.TB, id string) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), time.Minute)
	defer cancel()
	e, err := w.bus.Manifests.Get(ctx, scaleRun+"."+id)
	if err != nil {
		tb.Fatalf("the manifest of %s: %v", id, err)
	}
	return float64(len(e.Value()))
}

// cpuOf adds up the user and system CPU time of ps.
func cpuOf(tb testing.TB, ps []*child.Process) time.Duration {
	tb.Helper()
	var ticks uint64
	for _, p := range ps {
		s, _, err := procfs.ReadStat(p.Pid(), nil)
		if err != nil {
			tb.Fatalf("%s: %v", p.Name(), err)
		}
		ticks += s.UTime + s.STime
	}
	return time.Duration(ticks) * time.Second / scaleClockTicks
}

// scaleFigures are one size's results.
type scaleFigures struct {
	cfg                       scaleConfig
	cycles, consumers         int
	p50, p99, prepare, commit float64 // ms
	streamWrites, kvWrites    float64 // per member and cycle
	objWrites, writes, bytes  float64
	heartbeats                float64
	inMsgs, outMsgs, outKB    float64 // the servers', per member and cycle
	prepareSize, outcomeSize  float64 // bytes of the last prepare and committed outcome
	manifestSize              float64 // bytes of the last checkpoint manifest in sp_manifests
	floorServerCPU            float64 // ms per floor cycle
	floorCPU                  float64 // ms per floor cycle, every process's
	serverCPU, hostsCPU       float64 // ms per cycle
	selfCPU                   float64 // ms per cycle: the bridge's process
	floor                     float64 // ms: the floor's rounds and persisted writes
	liveFloor                 float64 // ms: its rounds alone
	floorWrites               int     // the persisted writes of a floor cycle
}

func (f scaleFigures) report(b *testing.B) {
	b.ReportMetric(f.p50, "p50-ms")
	b.ReportMetric(f.p99, "p99-ms")
	b.ReportMetric(f.prepare, "prepare-p50-ms")
	b.ReportMetric(f.commit, "commit-p50-ms")
	b.ReportMetric(f.writes, "writes/member")
	b.ReportMetric(f.streamWrites, "stream-writes/member")
	b.ReportMetric(f.kvWrites, "kv-writes/member")
	b.ReportMetric(f.objWrites, "obj-writes/member")
	b.ReportMetric(f.bytes, "B/member")
	b.ReportMetric(f.inMsgs, "srv-in-msgs/member")
	b.ReportMetric(f.outMsgs, "srv-out-msgs/member")
	b.ReportMetric(f.outKB, "srv-out-KB/member")
	b.ReportMetric(f.prepareSize, "prepare-event-B")
	b.ReportMetric(f.outcomeSize, "committed-event-B")
	b.ReportMetric(f.manifestSize, "manifest-B")
	b.ReportMetric(f.serverCPU, "server-cpu-ms/op")
	b.ReportMetric(f.floorServerCPU, "floor-server-cpu-ms/op")
	b.ReportMetric(f.hostsCPU, "hosts-cpu-ms/op")
	b.ReportMetric(f.selfCPU, "bridge-cpu-ms/op")
	b.ReportMetric(f.floorCPU, "floor-cpu-ms/op")
	b.ReportMetric(f.cpu()/f.floorCPU, "cpu-x-floor")
	b.ReportMetric(float64(f.consumers), "consumers")
	b.ReportMetric(f.floor, "floor-p50-ms")
	b.ReportMetric(f.p50/f.floor, "x-floor")
	b.ReportMetric(f.liveFloor, "live-floor-p50-ms")
	b.ReportMetric(f.p50/f.liveFloor, "x-live-floor")
}

func (f scaleFigures) String() string {
	return fmt.Sprintf("R%d N=%d (%d hosts, conns per %s), %d cycles: p50 %.0f ms, p99 %.0f ms, prepare %.0f ms, commit %.0f ms; "+
		"per member and cycle %.2f writes (stream %.2f, kv %.2f, obj %.2f), %.0f B; heartbeats %.2f per member over the cycles; "+
		"servers in %.1f msgs, out %.1f msgs and %.1f KB per member and cycle; prepare event %.0f B, committed outcome %.0f B, "+
		"checkpoint manifest %.0f B; server CPU %.0f ms, hosts CPU %.0f ms, bridge process CPU %.0f ms per cycle; %d consumers; "+
		"floor p50 %.0f ms (%d persisted writes; its live rounds alone %.0f ms), its server CPU %.0f ms, all processes' %.0f ms; "+
		"cycle/floor %.2f, in CPU %.2f; cycle/live rounds %.2f",
		f.cfg.replicas, f.cfg.members, f.cfg.hosts, f.cfg.conns, f.cycles, f.p50, f.p99, f.prepare, f.commit,
		f.writes, f.streamWrites, f.kvWrites, f.objWrites, f.bytes, f.heartbeats,
		f.inMsgs, f.outMsgs, f.outKB, f.prepareSize, f.outcomeSize, f.manifestSize,
		f.serverCPU, f.hostsCPU, f.selfCPU, f.consumers, f.floor, f.floorWrites, f.liveFloor, f.floorServerCPU, f.floorCPU,
		f.p50/f.floor, f.cpu()/f.floorCPU, f.p50/f.liveFloor)
}

// cpu is every process's CPU per cycle, in ms.
func (f scaleFigures) cpu() float64 { return f.serverCPU + f.hostsCPU + f.selfCPU }

// quantile returns the q quantile of ds in milliseconds.
func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return ms(s[int(q*float64(len(s)-1)+0.5)])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
