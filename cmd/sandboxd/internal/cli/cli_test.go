package cli

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestMain checks that a command run in-process leaves no goroutine
// behind once Main returned (the supervisor's, the daemon's, the bus's).
func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }

func TestUsageAndVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "sandboxd ") {
		t.Errorf("version: exit %d, %q", code, out.String())
	}
	for _, args := range [][]string{nil, {"no-such-command"}, {"run"}, {"member", "--run", "r1"}} {
		out.Reset()
		errb.Reset()
		if code := Main(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage:") {
			t.Errorf("%q: exit %d, stderr %q; want 2 and the usage", args, code, errb.String())
		}
	}
}

// `sandboxd run` runs a supervisor in this process, launches the command
// and returns its exit status once it ended, every goroutine it started
// ended too (TestMain checks).
func TestRunReturnsTheLaunchsExit(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"run", "--state", t.TempDir(), "--no-cgroup", "--grace", "1s", "--", "sh", "-c", "exit 3"}, &out, &errb)
	if code != 3 {
		t.Fatalf("exit %d, want the launch's 3\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{`"event":"launched"`, `"event":"ended"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %s:\n%s", want, out.String())
		}
	}
}

// `sandboxd run` takes its signals as commands to the launch: SIGUSR1
// pauses it, SIGUSR2 continues it, SIGTERM stops it, and the command
// returns the launch's status (SIGINT's, the stop's signal) once it ended.
func TestRunTakesSignals(t *testing.T) {
	stdout, stderr := &jstest.Buffer{}, &jstest.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"run", "--state", t.TempDir(), "--no-cgroup", "--mode", "stop", "--grace", "5s", "--",
			"sleep", "1000"}, stdout, stderr)
	}()
	// Each signal goes once the line before it is out: the launched line
	// comes after serve handles the signals itself.
	for _, step := range []struct {
		line string
		sig  syscall.Signal
	}{{`"event":"launched"`, syscall.SIGUSR1}, {`"event":"pause"`, syscall.SIGUSR2}, {`"event":"continue"`, syscall.SIGTERM}} {
		poll.Wait(t, 30*time.Second, step.line, func() bool {
			select {
			case code := <-done:
				t.Fatalf("run exited %d early\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			default:
			}
			return strings.Contains(stdout.String(), step.line)
		})
		if err := syscall.Kill(os.Getpid(), step.sig); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case code := <-done:
		if code != 128+int(syscall.SIGINT) {
			t.Errorf("run exited %d, want %d (the launch's SIGINT)\nstdout:\n%s", code, 128+int(syscall.SIGINT), stdout.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not end on SIGTERM\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	for line := range strings.Lines(stdout.String()) {
		if strings.Contains(line, `"error"`) {
			t.Errorf("a step failed: %s", line)
		}
	}
}

// `sandboxd member` in process: it registers on the bus and stops, with
// status 0, on SIGTERM.
func TestMemberStopsOnSIGTERM(t *testing.T) {
	env := jstest.Start(t)
	stdout, stderr := &jstest.Buffer{}, &jstest.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"member", "--nats-url", env.URL, "--run", "run1", "--id", "sbcli", "--state", t.TempDir(),
			"--no-cgroup", "--log-level", "warn"}, stdout, stderr)
	}()
	// The line comes once it handles SIGTERM itself, so that the signal
	// below stops the command, not the test.
	poll.Wait(t, 30*time.Second, "the member line", func() bool {
		select {
		case code := <-done:
			t.Fatalf("member exited %d early\n%s", code, stderr.String())
		default:
		}
		return strings.Contains(stdout.String(), `"event":"member"`)
	})
	membertest.WaitRegistered(t, env, "run1", "sandbox.sbcli", nil)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("member exited %d on SIGTERM\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("member did not stop on SIGTERM\n%s", stderr.String())
	}
}

// `sandboxd member` with a user of the sandbox's own (PROTOCOL §3,
// Consumers; docs/PERMISSIONS.md): it opens no bus and makes no consumer,
// registers, answers a prepare on its core feed and stops on SIGTERM, and
// logs nothing above info (a permissions violation would show as a failed
// read).
func TestMemberAsItsOwnUser(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority("run1"))
	creds := env.MemberCreds(t, "run1", "sandbox.sbown")
	args := []string{"member", "--nats-url", env.URL, "--creds", creds, "--run", "run1", "--id", "sbown",
		"--no-cgroup", "--log-level", "warn"}
	stdout, stderr := &jstest.Buffer{}, &jstest.Buffer{}
	done := make(chan int, 1)
	go func() { done <- Main(append(args, "--state", t.TempDir()), stdout, stderr) }()
	poll.Wait(t, 30*time.Second, "the member line", func() bool {
		select {
		case code := <-done:
			t.Fatalf("member exited %d early\n%s", code, stderr.String())
		default:
		}
		return strings.Contains(stdout.String(), `"event":"member"`)
	})
	name := events.Member("sandbox.sbown")
	membertest.WaitRegistered(t, env, "run1", name, nil)
	bridge := membertest.NewBridge(t, env, "run1")
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	if a := bridge.Ack(seq, events.PhasePrepare, name); !a.Header().OK {
		t.Errorf("prepare ack %+v", a)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("member exited %d on SIGTERM\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("member did not stop on SIGTERM\n%s", stderr.String())
	}
	if s := stderr.String(); strings.Contains(s, `"level":"warn"`) || strings.Contains(s, `"level":"error"`) {
		t.Errorf("the member logged warnings:\n%s", s)
	}
}
