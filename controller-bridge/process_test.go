package bridge_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/events"
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

// proc is a child process of the test.
type proc struct {
	cmd  *exec.Cmd
	out  chan string
	done chan struct{}
	mu   sync.Mutex
	logs strings.Builder
}

// spawn re-executes the test binary in a role. Its stderr goes to the
// test log on failure; the test's cleanup kills and reaps it.
func spawn(t *testing.T, env *jstest.Env, role string, extra ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role, natsEnv+"="+env.URL)
	cmd.Env = append(cmd.Env, extra...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: make(chan string, 16), done: make(chan struct{})}
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.logs.Write(b)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.out <- sc.Text():
			default:
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s process log:\n%s", role, p.logs.String())
			p.mu.Unlock()
		}
	})
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// line waits for a line of stdout that starts with prefix.
func (p *proc) line(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l := <-p.out:
			if strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
		case <-p.done:
			t.Fatalf("process exited before printing %q", prefix)
		case <-timer.C:
			t.Fatalf("no %q from the process within %s", prefix, within)
		}
	}
}

// wait waits for the process to exit (a failpoint kill) and returns its
// exit state.
func (p *proc) wait(t *testing.T, within time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-time.After(within):
		t.Fatalf("process still running after %s", within)
		return nil
	}
}
