package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// TestStaticMemberBinary builds sandboxd as the static binary that goes
// into sandboxes (CGO_ENABLED=0), runs `sandboxd member` as its own process
// against an embedded server, and drives a launch through a checkpoint:
// the prepare ack carries the pause, the resume ack the continue. With
// roles, the daemon connects with the sandbox role's nkey (--nkey) and the
// agent calls it with the agent role's.
func TestStaticMemberBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sandboxd")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Run("open", func(t *testing.T) { memberBinary(t, bin, jstest.Start(t), nil) })
	t.Run("roles", func(t *testing.T) {
		env := jstest.Start(t, jstest.WithRoles())
		memberBinary(t, bin, env.As(embedded.RoleAgent), []string{"--nkey", env.As(embedded.RoleSandbox).ConnConfig("").NKeyFile})
	})
}

// memberBinary runs the binary with more args, its client on a connection
// of env's.
func memberBinary(t *testing.T, bin string, env *jstest.Env, more []string) {
	args := append([]string{"member", "--nats-url", env.URL, "--run", "run1", "--id", "sb1", "--state", t.TempDir(), "--grace", "1s"}, more...)
	cmd := exec.Command(bin, args...)
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sandboxd member exited: %v\n%s", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("sandboxd member did not stop on SIGINT\n%s", stderr.String())
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, `"member":"sandbox.sb1"`) {
		t.Fatalf("first line %q, %v\n%s", line, err, stderr.String())
	}
	name := events.Member("sandbox.sb1")
	membertest.WaitRegistered(t, env, "run1", name, nil)
	nc, _ := env.Connect(t)
	c, err := sandboxapi.NewClient(nc, "run1", "sb1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	launch := "l1-" + strconv.Itoa(os.Getpid()) // unique on the host: cgroups are shared
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: launch, Episode: "r1", Command: "sleep 30"}); err != nil {
		t.Fatal(err)
	}
	bridge := membertest.NewBridge(t, env, "run1")
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	pa := bridge.Ack(seq, events.PhasePrepare, name).(events.PrepareAck)
	if !pa.Ready || pa.Pause == nil || pa.Pause.PIDCount < 1 {
		t.Fatalf("prepare ack %+v\n%s", pa, stderr.String())
	}
	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	if ra := bridge.Ack(seq, events.PhaseResume, name).(events.ResumeAck); ra.Pause == nil || ra.Pause.PauseSeq != 1 {
		t.Fatalf("resume ack %+v", ra)
	}
	if rc, err := c.Stop(ctx, launch, true); err != nil || rc.Outcome.String() != "interrupted" {
		t.Fatalf("stop: %+v %v", rc, err)
	}
}
