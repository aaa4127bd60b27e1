package main

import (
	"context"
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
		// The state file puts the member on the core feed of the stream's
		// republished phases, as sandboxd's daemon.New does for a daemon
		// without a user of its own (PROTOCOL §3, Consumers): the benchmark
		// measures the feed sandboxd runs.
		mcfg := member.Config{Run: cfg.run, Member: h.name, JS: st.js, Bus: st.bus,
			Participant: daemonLike{p: p}, Logger: log.With().Str("member", string(h.name)).Logger(),
			StateFile: filepath.Join(cfg.stateDir, h.name.Name()+".json")}
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
		// Every member hears the floor's rounds on its own subscription (its
		// own connection), as it hears a phase.
		f := &floor{ctx: runCtx, cfg: cfg, members: len(members), rounds: map[uint64]*floorRound{}, nc: members[0].nc}
		for _, h := range members {
			sub, err := h.nc.Subscribe(cfg.floorSubject, func(m *nats.Msg) { f.heard(h, m) })
			if err != nil {
				return err
			}
			_ = sub.SetPendingLimits(-1, -1)
			defer func() { _ = sub.Unsubscribe() }()
		}
		for _, nc := range conns {
			if err := nc.Flush(); err != nil {
				return err
			}
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

// floorRequest is one floor round, as BenchmarkScale sends it: the live
// copy of a real phase event, which no member decodes, with the round's
// own headers.
type floorRequest struct {
	Round uint64
	Phase events.Phase
	// Ack is what each member answers: "persist", its once-only ack in the
	// stream; "core", an ack published on core NATS to CoreSubject; "none",
	// nothing (a phase that does not address it, which it still hears).
	Ack         string
	CoreSubject string
}

// The round's own headers.
const (
	headerFloorRound      = "Sp-Floor-Round"
	headerFloorAck        = "Sp-Floor-Ack"
	headerFloorAckSubject = "Sp-Floor-Ack-Subject"
)

// readFloorRequest reads a round's headers: its number, its ack, and the
// phase from the stored subject the live copy names (Nats-Subject,
// sp.<run>.phase.<phase>).
func readFloorRequest(m *nats.Msg) (floorRequest, error) {
	round, err := strconv.ParseUint(m.Header.Get(headerFloorRound), 10, 64)
	if err != nil {
		return floorRequest{}, fmt.Errorf("floor round: %s: %w", headerFloorRound, err)
	}
	stored := m.Header.Get("Nats-Subject")
	return floorRequest{Round: round, Phase: events.Phase(stored[strings.LastIndexByte(stored, '.')+1:]),
		Ack: m.Header.Get(headerFloorAck), CoreSubject: m.Header.Get(headerFloorAckSubject)}, nil
}

// floor answers the bus floor's rounds: each member answers the round it
// hears on its own connection, and once every member of the process heard
// it (and every persisted ack has its server ack) the process replies "ok",
// or the first error, to the round's reply subject.
type floor struct {
	ctx     context.Context
	cfg     hostConfig
	members int
	nc      *nats.Conn // the replies'
	mu      sync.Mutex
	rounds  map[uint64]*floorRound
}

// floorRound is one round as the process answers it.
type floorRound struct {
	heard   int
	futures []natsjs.PubAckFuture
	err     error
}

// heard takes one member's delivery of a round and answers it.
func (f *floor) heard(h *hosted, m *nats.Msg) {
	req, err := readFloorRequest(m)
	phase := req.Phase
	var fut natsjs.PubAckFuture
	if err == nil {
		switch req.Ack {
		case "persist":
			fut, err = h.floor.PublishMsgAsync(floorAck(h, f.cfg.floorRun, req.Round, phase), natsjs.WithExpectLastSequencePerSubject(0))
		case "core":
			ack := floorAck(h, f.cfg.floorRun, req.Round, phase)
			ack.Subject = req.CoreSubject
			err = h.nc.PublishMsg(ack)
		case "none":
		default:
			err = fmt.Errorf("floor round %d: ack %q: want persist, core or none", req.Round, req.Ack)
		}
	}
	f.mu.Lock()
	r := f.rounds[req.Round]
	if r == nil {
		r = &floorRound{}
		f.rounds[req.Round] = r
	}
	r.heard++
	if fut != nil {
		r.futures = append(r.futures, fut)
	}
	if err != nil && r.err == nil {
		r.err = err
	}
	last := r.heard == f.members
	if last {
		delete(f.rounds, req.Round)
	}
	f.mu.Unlock()
	if last {
		go f.reply(r, m.Reply)
	}
}

// reply waits for a round's server acks and replies for the process.
func (f *floor) reply(r *floorRound, to string) {
	err := r.err
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for _, fut := range r.futures {
		if err != nil {
			break
		}
		select {
		case <-fut.Ok():
		case e := <-fut.Err():
			err = fmt.Errorf("%s: %w", fut.Msg().Subject, e)
		case <-deadline.C:
			err = errors.New("no answer to an ack in a minute")
		case <-f.ctx.Done():
			err = f.ctx.Err()
		}
	}
	answer := []byte("ok")
	if err != nil {
		answer = []byte("error: " + err.Error())
	}
	_ = f.nc.Publish(to, answer)
}

// floorAck is one member's ack of a floor round: its template's headers
// and body on the round's ack subject, with the round's ids.
func floorAck(h *hosted, run string, round uint64, p events.Phase) *nats.Msg {
	hdr := make(nats.Header, len(h.ack.Header))
	for k, v := range h.ack.Header {
		hdr[k] = v
	}
	// Its id as a member's: the key and a random part (PROTOCOL §4,
	// Message ids).
	id := strings.Join([]string{run, strconv.FormatUint(round, 10), string(p), string(h.name), events.NewID()}, ".")
	hdr.Set(events.HeaderMsgID, id)
	hdr.Set(events.HeaderPrefix+"id", id)
	return &nats.Msg{Subject: events.AckSubject(run, round, p, h.name), Header: hdr, Data: h.ack.Data}
}
