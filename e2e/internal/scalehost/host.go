package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// The values of -conns.
const (
	connsMember = "member"
	connsHost   = "host"
)

// hostConfig is the process's flags.
type hostConfig struct {
	url, run, name, stateDir, conns string
	floorSubject, floorRun          string
	members, starting               int
	// floorOnly starts no member: the process answers the floor alone.
	floorOnly bool
}

func (c hostConfig) validate() error {
	var errs []error
	if c.url == "" || c.run == "" || c.name == "" || c.stateDir == "" {
		errs = append(errs, errors.New("-url, -run, -name and -state-dir are required"))
	}
	if c.members < 1 {
		errs = append(errs, fmt.Errorf("-members %d: at least 1", c.members))
	}
	if c.starting < 1 {
		errs = append(errs, fmt.Errorf("-starting %d: at least 1", c.starting))
	}
	if c.conns != connsMember && c.conns != connsHost {
		errs = append(errs, fmt.Errorf("-conns %q: %s or %s", c.conns, connsMember, connsHost))
	}
	if c.floorOnly && c.floorSubject == "" {
		errs = append(errs, errors.New("-floor-only needs -floor-subject"))
	}
	if (c.floorSubject == "") != (c.floorRun == "") {
		errs = append(errs, errors.New("-floor-subject and -floor-run go together"))
	}
	return errors.Join(errs...)
}

// hosted is one member of the process and the connection it uses.
type hosted struct {
	name  events.Member
	nc    *nats.Conn
	js    natsjs.JetStream // the member's, jetstream.New
	floor natsjs.JetStream // the floor's, with room for every future of a round
	m     *member.Member
	done  chan error
	// ack is the template of the member's floor acks: a real ack's
	// headers and body, made once so that a round pays only the publish.
	ack *nats.Msg
}

// callTimeout bounds one connect or bus open.
const callTimeout = 30 * time.Second

// run starts cfg.members members, prints the ready line to out once all
// have joined, answers the floor, and stops them all when ctx ends.
func run(ctx context.Context, cfg hostConfig, out io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	log := zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Str("host", cfg.name).Logger()
	if err := os.MkdirAll(cfg.stateDir, 0o755); err != nil {
		return err
	}

	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	connect := func(name string) (*nats.Conn, error) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		nc, err := jetstream.Connect(cctx, jetstream.ConnConfig{URL: cfg.url, Name: name})
		if err != nil {
			return nil, err
		}
		conns = append(conns, nc)
		return nc, nil
	}

	members := make([]*hosted, cfg.members)
	var shared *nats.Conn
	for i := range members {
		name, err := events.NewMember(events.KindSandbox, cfg.name+"-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		nc := shared
		if nc == nil {
			if nc, err = connect(string(name)); err != nil {
				return err
			}
			if cfg.conns == connsHost {
				shared = nc
			}
		}
		members[i] = &hosted{name: name, nc: nc, done: make(chan error, 1)}
	}
	// One JetStream context, bus handle and floor context per connection.
	type connState struct {
		js, floor natsjs.JetStream
		bus       *jetstream.Bus
	}
	byConn := map[*nats.Conn]*connState{}
	for _, h := range members {
		st := byConn[h.nc]
		if st == nil {
			js, err := jetstream.New(h.nc)
			if err != nil {
				return err
			}
			octx, cancel := context.WithTimeout(ctx, callTimeout)
			bus, err := jetstream.Open(octx, js)
			cancel()
			if err != nil {
				return err
			}
			floor, err := natsjs.New(h.nc, natsjs.WithPublishAsyncMaxPending(4*cfg.members+16), natsjs.WithPublishAsyncTimeout(time.Minute))
			if err != nil {
				return err
			}
			st = &connState{js: js, floor: floor, bus: bus}
			byConn[h.nc] = st
		}
		h.js, h.floor = st.js, st.floor
		ack, err := events.Marshal(h.name, events.PrepareAck{AckHeader: events.AckHeader{Run: cfg.run, Member: h.name,
			Seq: 1, CheckpointID: "ckpt1", Epoch: 1, OK: true, State: events.StatePrepared}})
		if err != nil {
			return err
		}
		h.ack = ack
		if cfg.floorOnly {
			continue
		}
		p := membertest.NewParticipant(h.name.Name())
		mcfg := member.Config{Run: cfg.run, Member: h.name, JS: st.js, Bus: st.bus,
			Participant: daemonLike{p: p}, Logger: log.With().Str("member", string(h.name)).Logger(),
			StateFile: filepath.Join(cfg.stateDir, h.name.Name()+".json")}
		sandboxFeed(&mcfg)
		m, err := member.New(mcfg)
		if err != nil {
			return err
		}
		h.m = m
		p.Bind(m)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var running sync.WaitGroup
	defer func() {
		cancel()
		running.Wait()
	}()
	start := time.Now()
	if !cfg.floorOnly {
		if err := startMembers(ctx, runCtx, &running, cfg, members); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	fmt.Fprintf(out, "scalehost %s: ready %d members (%.1f s)\n", cfg.name, len(members), time.Since(start).Seconds())

	if cfg.floorSubject != "" {
		sub, err := members[0].nc.Subscribe(cfg.floorSubject, func(m *nats.Msg) { answerFloor(runCtx, cfg, members, m) })
		if err != nil {
			return err
		}
		defer func() { _ = sub.Drain() }()
		if err := members[0].nc.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "scalehost %s: floor on %q\n", cfg.name, cfg.floorSubject)

	if cfg.floorOnly {
		<-ctx.Done()
		return nil
	}
	// Run until told to stop; a member that stops on its own fails the
	// process (the benchmark then fails on the member missing from a phase).
	stopped := make(chan error, 1)
	for _, h := range members {
		running.Go(func() {
			select {
			case err := <-h.done:
				h.done <- err
				select {
				case stopped <- fmt.Errorf("member %s stopped: %v", h.name, err):
				default:
				}
			case <-runCtx.Done():
			}
		})
	}
	select {
	case <-ctx.Done():
	case err := <-stopped:
		return err
	}
	cancel()
	var errs []error
	for _, h := range members {
		if err := <-h.done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("member %s: %w", h.name, err))
		}
	}
	return errors.Join(errs...)
}

// startMembers starts the members, cfg.starting at a time (each creates
// its feed and writes its heartbeat, and 10,000 of them at once would time
// out), on runCtx, and returns once all have joined.
func startMembers(ctx, runCtx context.Context, running *sync.WaitGroup, cfg hostConfig, members []*hosted) error {
	slots := make(chan struct{}, cfg.starting)
	for _, h := range members {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		running.Go(func() { h.done <- h.m.Run(runCtx) })
		running.Go(func() {
			defer func() { <-slots }()
			select {
			case <-h.m.Joined():
			case err := <-h.done:
				h.done <- err
			case <-runCtx.Done():
			}
		})
	}
	for _, h := range members {
		select {
		case <-h.m.Joined():
		case err := <-h.done:
			return fmt.Errorf("member %s stopped before it joined: %w", h.name, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// floorRequest is one floor round, as BenchmarkScale sends it.
type floorRequest struct {
	Round uint64 `json:"round"`
	Phase string `json:"phase"`
	// Manifest asks each member for a member manifest created once in
	// sp_manifests too (the protocol's commit writes one per member).
	Manifest bool `json:"manifest"`
}

// answerFloor publishes every member's ack of one floor round, pipelined,
// waits for the server's answer to each, and replies "ok" or the first
// error.
func answerFloor(ctx context.Context, cfg hostConfig, members []*hosted, m *nats.Msg) {
	var req floorRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		_ = m.Respond([]byte("error: " + err.Error()))
		return
	}
	err := floorRound(ctx, cfg, members, req)
	if err != nil {
		_ = m.Respond([]byte("error: " + err.Error()))
		return
	}
	_ = m.Respond([]byte("ok"))
}

func floorRound(ctx context.Context, cfg hostConfig, members []*hosted, req floorRequest) error {
	phase := events.Phase(req.Phase)
	futures := make([]natsjs.PubAckFuture, 0, 2*len(members))
	for _, h := range members {
		f, err := h.floor.PublishMsgAsync(floorAck(h, cfg.floorRun, req.Round, phase), natsjs.WithExpectLastSequencePerSubject(0))
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if req.Manifest {
			key, err := floorManifest(cfg.floorRun, req.Round, h.name)
			if err != nil {
				return err
			}
			f, err := h.floor.PublishMsgAsync(key, natsjs.WithExpectLastSequencePerSubject(0))
			if err != nil {
				return err
			}
			futures = append(futures, f)
		}
	}
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("%s: %w", f.Msg().Subject, err)
		case <-deadline.C:
			return errors.New("no answer to an ack in a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// floorAck is one member's ack of a floor round: its template's headers
// and body on the round's ack subject, with the round's ids.
func floorAck(h *hosted, run string, round uint64, p events.Phase) *nats.Msg {
	hdr := make(nats.Header, len(h.ack.Header))
	for k, v := range h.ack.Header {
		hdr[k] = v
	}
	id := strings.Join([]string{run, strconv.FormatUint(round, 10), string(p), string(h.name)}, ".")
	hdr.Set(events.HeaderMsgID, id)
	hdr.Set(events.HeaderPrefix+"id", id)
	return &nats.Msg{Subject: events.AckSubject(run, round, p, h.name), Header: hdr, Data: h.ack.Data}
}

// floorManifest is one member's manifest of a floor round, created once.
func floorManifest(run string, round uint64, name events.Member) (*nats.Msg, error) {
	id := "ckpt" + strconv.FormatUint(round, 10)
	b, err := json.Marshal(events.MemberManifest{Schema: events.ManifestSchema, Run: run, CheckpointID: id, Member: name,
		Object: run + "/" + id + "/" + string(name) + ".jsonl", SHA256: strings.Repeat("0", 64)})
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: "$KV." + jetstream.BucketManifests + "." + run + "." + id + "." + string(name), Data: b}, nil
}
