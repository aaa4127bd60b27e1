package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// TestStaticMemberBinary builds sandboxd as the static binary that goes
// into sandboxes (CGO_ENABLED=0), runs `sandboxd member` as its own process
// against an embedded server, and drives a launch through a checkpoint:
// the prepare ack carries the pause, the resume ack the continue. With
// roles, the daemon connects with the sandbox role's nkey (--nkey) and the
// agent calls it with the agent role's.
func TestStaticMemberBinary(t *testing.T) {
	tier.E2E(t)
	bin := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	t.Run("open", func(t *testing.T) { memberBinary(t, bin, jstest.Start(t), nil) })
	t.Run("output unread", func(t *testing.T) { outputUnread(t, bin, jstest.Start(t)) })
	t.Run("roles", func(t *testing.T) {
		env := jstest.Start(t, jstest.WithRoles())
		memberBinary(t, bin, env.As(embedded.RoleAgent), []string{"--nkey", env.As(embedded.RoleSandbox).ConnConfig("").NKeyFile})
	})
}

// memberBinary runs the binary with more args, its client on a connection
// of env's.
func memberBinary(t *testing.T, bin string, env *jstest.Env, more []string) {
	args := append([]string{"member", "--nats-url", env.URL, "--run", "run1", "--id", "sb1", "--state", t.TempDir(), "--grace", "1s"}, more...)
	p := child.StartForTest(t, child.Spec{Name: "sandboxd member", Path: bin, Args: args, StopSignal: syscall.SIGINT, Grace: 15 * time.Second})
	t.Cleanup(func() { // before StartForTest's: it stops on SIGINT, cleanly
		if exit := p.Stop(); !exit.Success() {
			t.Errorf("sandboxd member stopped on SIGINT with %s", exit)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	line, err := p.WaitOutput(ctx, regexp.MustCompile(`(?m)^\{"event":"member",.*$`))
	if err != nil || !strings.Contains(line[0], `"member":"sandbox.sb1"`) {
		t.Fatalf("member line %q, %v", line, err)
	}
	name := events.Member("sandbox.sb1")
	membertest.WaitRegistered(t, env, "run1", name, nil)
	nc, _ := env.Connect(t)
	c, err := sandboxclient.New(nc, "run1", "sb1")
	if err != nil {
		t.Fatal(err)
	}
	launch := "l1-" + strconv.Itoa(os.Getpid()) // unique on the host: cgroups are shared
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: launch, Episode: "r1", Command: "sleep 30"}); err != nil {
		t.Fatal(err)
	}
	bridge := membertest.NewBridge(t, env, "run1")
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	pa := bridge.Ack(seq, events.PhasePrepare, name).(events.PrepareAck)
	if !pa.Ready || pa.Pause == nil || pa.Pause.PIDCount < 1 {
		t.Fatalf("prepare ack %+v", pa)
	}
	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	if ra := bridge.Ack(seq, events.PhaseResume, name).(events.ResumeAck); ra.Pause == nil || ra.Pause.PauseSeq != 1 {
		t.Fatalf("resume ack %+v", ra)
	}
	if rc, err := c.Stop(ctx, launch, true); err != nil || rc.Outcome.String() != "interrupted" {
		t.Fatalf("stop: %+v %v", rc, err)
	}
}

// outputUnread runs the binary with its output a pipe, as the owner runs
// it, and closes the pipe's reading end, as an owner that died does: the
// daemon goes on, and stops on SIGINT cleanly, its last words lost,
// rather than dying of SIGPIPE at its next log line.
func outputUnread(t *testing.T, bin string, env *jstest.Env) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "member", "--nats-url", env.URL, "--run", "run1", "--id", "sb2", "--state", t.TempDir(), "--grace", "1s")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.Contains(line, `"member":"sandbox.sb2"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	r.Close()
	membertest.WaitRegistered(t, env, "run1", events.Member("sandbox.sb2"), nil)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("sandboxd with its output unread stopped on SIGINT with %v, want a clean exit", waitErr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("sandboxd did not stop within 15 s of SIGINT")
	}
}
