package bridge_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// The test binary re-executes itself as a bridge or a member process, so
// that crash tests kill real processes.
const (
	roleEnv     = "STILLPOINT_TEST_ROLE"
	natsEnv     = "STILLPOINT_TEST_NATS"
	nameEnv     = "STILLPOINT_TEST_NAME"
	episodesEnv = "STILLPOINT_TEST_EPISODES"
	testToken   = "test-token"
)

func processContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
}

// bridgeProcess runs a bridge of run and its HTTP API on a random port,
// printing "listening <addr>" once it serves.
func bridgeProcess() int {
	ctx, stop := processContext()
	defer stop()
	log := zerolog.New(os.Stderr).With().Timestamp().Str("who", "bridge-process").Logger()
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: os.Getenv(natsEnv), Name: "test-bridge"})
	if err != nil {
		log.Error().Err(err).Msg("connect")
		return 1
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		log.Error().Err(err).Msg("open bus")
		return 1
	}
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: bus, Logger: log, PhaseTimeout: 3 * time.Second})
	if err != nil {
		log.Error().Err(err).Msg("new")
		return 1
	}
	if err := b.Recover(ctx); err != nil {
		log.Error().Err(err).Msg("recover")
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 1
	}
	srv := &http.Server{Handler: b.Handler(testToken)}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	<-ctx.Done()
	_ = srv.Close()
	return 0
}

// memberProcess runs one test-participant member holding n episodes.
func memberProcess() int {
	ctx, stop := processContext()
	defer stop()
	name := events.Member(os.Getenv(nameEnv))
	log := zerolog.New(os.Stderr).With().Timestamp().Str("who", string(name)).Logger()
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: os.Getenv(natsEnv), Name: string(name)})
	if err != nil {
		log.Error().Err(err).Msg("connect")
		return 1
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv(episodesEnv))
	p := membertest.NewParticipant(name.Name())
	for j := range n {
		p.Add(events.Episode{Rollout: fmt.Sprintf("%s-r%d", name.Name(), j)})
	}
	m, err := member.New(member.Config{Run: run, Member: name, JS: js, Bus: bus, Participant: p, Logger: log,
		Grace: 10 * time.Second, PollEvery: 100 * time.Millisecond})
	if err != nil {
		log.Error().Err(err).Msg("new member")
		return 1
	}
	p.Bind(m)
	if err := m.Run(ctx); err != nil {
		log.Error().Err(err).Msg("run")
		return 1
	}
	return 0
}

// spawn re-executes the test binary in a role. Its output goes to the
// test log on failure; the test's cleanup stops and reaps it (SIGTERM,
// then SIGKILL to its group after 10 s).
func spawn(t *testing.T, env *jstest.Env, role string, extra ...string) *child.Process {
	t.Helper()
	return child.StartForTest(t, child.Spec{Name: role, Path: os.Args[0], Args: []string{"-test.run=^$"},
		Env: append([]string{roleEnv + "=" + role, natsEnv + "=" + env.URL}, extra...), Grace: 10 * time.Second})
}

// exited waits up to within for p to exit (a failpoint's kill).
func exited(t *testing.T, p *child.Process, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
