package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// ctlHost is the test's end of a `sandboxd init` control channel.
type ctlHost struct {
	t     *testing.T
	conn  net.Conn
	lines *bufio.Reader
	id    uint64
}

func (h *ctlHost) next() (*vmctl.Response, *vmctl.Notice) {
	h.t.Helper()
	_ = h.conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	line, err := h.lines.ReadBytes('\n')
	if err != nil {
		h.t.Fatalf("control channel: %v", err)
	}
	r, n, err := vmctl.DecodeGuestLine(line)
	if err != nil {
		h.t.Fatalf("%s: %v", line, err)
	}
	return r, n
}

func (h *ctlHost) call(req vmctl.Request) *vmctl.Response {
	h.t.Helper()
	h.id++
	req.ID = h.id
	line, err := vmctl.Encode(req)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.conn.Write(line); err != nil {
		h.t.Fatal(err)
	}
	for {
		r, n := h.next()
		if n != nil {
			h.t.Logf("notice %+v", *n)
			continue
		}
		if r.ID != req.ID {
			h.t.Fatalf("answer %d to request %d", r.ID, req.ID)
		}
		if !r.OK {
			h.t.Fatalf("%s: %s", req.Op, r.Error)
		}
		return r
	}
}

func entropy(t *testing.T) []byte {
	b := make([]byte, vmctl.EntropyBytes)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInitServesTheControlChannel runs the static binary's `sandboxd init`
// outside a VM (--no-boot, the control channel on a unix socket) against
// an embedded server, as the microvm provider drives it: the ready notice,
// identify as a member, a launch, reidentify as a fork's member in the
// restore's epoch (the launch goes on with its pid, under the new name;
// the old member's key is left as it was), exec, and a lease that runs
// out: the member leaves and the init ends. The QEMU tests of the provider
// run the same binary as the guest's PID 1.
func TestInitServesTheControlChannel(t *testing.T) {
	tier.E2E(t)
	if os.Geteuid() != 0 {
		t.Fatal("TestInitServesTheControlChannel needs root (the reseed ioctls): run the tests as root, as CI does")
	}
	bin := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	env := jstest.Start(t)
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := child.StartForTest(t, child.Spec{Name: "sandboxd init", Path: bin, Args: []string{"init", "--no-boot", "--port", "unix:" + sock}, Grace: 15 * time.Second})
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := &ctlHost{t: t, conn: conn, lines: bufio.NewReader(conn)}
	if _, n := h.next(); n == nil || n.Event != vmctl.EventReady || n.State != vmctl.StateTemplate {
		t.Fatalf("first line: want the ready notice, got %+v", n)
	}
	state := t.TempDir()
	args := []string{"--state", state, "--grace", "1s"}
	r := h.call(vmctl.Request{Op: vmctl.OpIdentify, Sandbox: "sb1", Run: "run1", NATSURL: env.URL, Entropy: entropy(t), Args: args, LeaseMS: 60000})
	if r.Member != "sandbox.sb1" || r.State != vmctl.StateIdentified || r.Identity.PID != p.Pid() {
		t.Fatalf("identify: %+v (init pid %d)", r.Hello, p.Pid())
	}
	old, err := env.Bus.Daemons.Get(t.Context(), events.MemberKey("run1", "sandbox.sb1"))
	if err != nil {
		t.Fatal(err)
	}
	c1, err := sandboxclient.New(env.Conn, "run1", "sb1")
	if err != nil {
		t.Fatal(err)
	}
	launch := "l1-" + strconv.Itoa(os.Getpid())
	rec, err := c1.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: launch, Episode: "r1", Command: "sleep 60"})
	if err != nil {
		t.Fatal(err)
	}

	r = h.call(vmctl.Request{Op: vmctl.OpReidentify, Sandbox: "sb2", Run: "run1", NATSURL: env.URL, Entropy: entropy(t), Args: args, Epoch: 1, LeaseMS: 60000})
	if r.Member != "sandbox.sb2" || r.Epoch != 1 || r.Identity.PID != p.Pid() {
		t.Fatalf("reidentify: %+v", r.Hello)
	}
	e, err := env.Bus.Daemons.Get(t.Context(), events.MemberKey("run1", "sandbox.sb2"))
	if err != nil {
		t.Fatal(err)
	}
	var info events.MemberInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil || info.Epoch != 1 || !info.Served {
		t.Fatalf("the fork's member: %s %v", e.Value(), err)
	}
	if now, err := env.Bus.Daemons.Get(t.Context(), events.MemberKey("run1", "sandbox.sb1")); err != nil || now.Revision() != old.Revision() {
		t.Fatalf("the old member's key was touched by the re-identification: %v %v", now, err)
	}
	c2, err := sandboxclient.New(env.Conn, "run1", "sb2")
	if err != nil {
		t.Fatal(err)
	}
	st, err := c2.Status(t.Context(), launch)
	if err != nil || st.PID != rec.PID || st.State != sandboxapi.StateRunning {
		t.Fatalf("the launch after the re-identification: %+v %v, want pid %d running", st, err, rec.PID)
	}
	bridge := membertest.NewBridge(t, env, "run1")
	bridge.Epoch = 1
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, "sandbox.sb2")})
	if pa := bridge.Ack(seq, events.PhasePrepare, "sandbox.sb2").(events.PrepareAck); !pa.Ready || pa.Epoch != 1 || pa.Pause == nil {
		t.Fatalf("prepare of the fork's member: %+v", pa)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, "sandbox.sb2")}), events.PhaseResume, "sandbox.sb2")

	r = h.call(vmctl.Request{Op: vmctl.OpExec, Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if r.Exit != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
		t.Fatalf("exec: %+v", r.ExecResult)
	}

	h.call(vmctl.Request{Op: vmctl.OpLease, UntilMS: 200})
	for {
		r, n := h.next()
		if r != nil {
			t.Fatalf("unexpected answer %+v", r)
		}
		if n.Event == vmctl.EventPowerOff {
			break
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	exit, err := p.Wait(ctx)
	if err != nil || !exit.Success() {
		t.Fatalf("sandboxd init after its lease: %v %v", exit, err)
	}
	if _, err := env.Bus.Daemons.Get(t.Context(), events.MemberKey("run1", "sandbox.sb2")); err == nil {
		t.Error("the fork's member did not leave when the lease ran out")
	}
}
