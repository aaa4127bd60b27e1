//go:build linux

package microvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// memberInit is the Init of owner.SandboxdSpec (which this package cannot
// import): sandboxd member sandbox.<id> of run run1.
func memberInit(url, id string) []string {
	return []string{"/opt/stillpoint/bin/sandboxd", "member", "--nats-url", url, "--run", "run1", "--id", id,
		"--state", "/var/lib/stillpoint-sandboxd"}
}

// The bus side of the acceptance test: a VM's sandboxd joins as
// sandbox.<id>; a launch it supervises keeps its pid through a snapshot
// and two concurrent forks, whose daemons are re-identified in place as
// new members of the restore's epoch, with instances of their own, and
// answer requests on the bus, as the original still does.
func TestMicroVMMemberForks(t *testing.T) {
	tier.Long(t)
	env := jstest.Start(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	providertest.Start(t, m, provider.Spec{ID: "m1", Init: memberInit(env.URL, "m1"), Workdir: "/work"})
	orig := membertest.WaitRegistered(t, env, "run1", events.Member("sandbox.m1"), nil)
	nc, _ := env.Connect(t)
	client := func(id string) *sandboxclient.Client {
		c, err := sandboxclient.New(nc, "run1", id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rec, err := client("m1").Launch(ctx, sandboxapi.LaunchRequest{LaunchID: "l1", Episode: "r1",
		Command: `i=0; while :; do i=$((i+1)); echo $i >> /work/count; sleep 0.2; done`})
	if err != nil {
		t.Fatal(err)
	}
	waitCounterFile(t, m, "m1", 3)
	providertest.Snapshot(t, m, "m1", "s1")

	forks := []string{"f1", "f2"}
	var wg sync.WaitGroup
	errs := make([]error, len(forks))
	for i, id := range forks {
		wg.Go(func() {
			_, errs[i] = m.Fork(ctx, "s1", provider.Spec{ID: id, Init: memberInit(env.URL, id), Workdir: "/work", Epoch: 2})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	instances := map[string]string{orig.Instance: "m1"}
	for _, id := range forks {
		info := membertest.WaitRegistered(t, env, "run1", events.Member("sandbox."+id), nil)
		if other, dup := instances[info.Instance]; dup {
			t.Errorf("sandbox.%s has the instance %q of sandbox.%s: the fork's ids were not drawn again", id, info.Instance, other)
		}
		instances[info.Instance] = id
		if info.Epoch != 2 {
			t.Errorf("sandbox.%s serves epoch %d, want the restore's 2", id, info.Epoch)
		}
		// The launch runs on in the fork, the same process, supervised by
		// the re-identified daemon, which answers on the bus.
		got, err := client(id).Status(ctx, "l1")
		if err != nil {
			t.Fatalf("status of l1 in %s: %v", id, err)
		}
		if got.PID != rec.PID || got.PIDStart != rec.PIDStart || got.State != sandboxapi.StateRunning {
			t.Errorf("%s: launch l1 is %+v, want pid %d running", id, got, rec.PID)
		}
		last := waitCounterFile(t, m, id, 1)
		waitCounterFile(t, m, id, last+2)
	}
	if _, err := client("m1").Status(ctx, "l1"); err != nil {
		t.Errorf("the original daemon stopped answering: %v", err)
	}
	if info := membertest.WaitRegistered(t, env, "run1", events.Member("sandbox.m1"), nil); info.Instance != orig.Instance {
		t.Errorf("sandbox.m1's heartbeat is now instance %q, was %q: a fork spoke as the original", info.Instance, orig.Instance)
	}
}

// waitCounterFile waits until /work/count in sandbox id reaches atLeast
// and returns its last value.
func waitCounterFile(t testing.TB, p provider.Provider, id string, atLeast int) int {
	t.Helper()
	var last int
	poll.Wait(t, time.Minute, fmt.Sprintf("/work/count of %s at %d", id, atLeast), func() bool {
		out := strings.TrimSpace(providertest.Sh(t, p, id, "tail -n1 /work/count 2>/dev/null || echo 0"))
		last, _ = strconv.Atoi(out)
		return last >= atLeast
	})
	return last
}
