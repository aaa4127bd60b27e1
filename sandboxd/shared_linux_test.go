package sandboxd

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// These tests run several supervisors on one host at once, as a host
// does that runs many sandboxes: dir sandboxes share the host's PID
// namespace, and sandboxes of every kind share a cgroup parent.

// uniqueArg is a sleep argument no other process on the host has: the
// test finds its processes by their command line.
func uniqueArg(n int) string { return fmt.Sprintf("%d.%06d", n, os.Getpid()%1000000) }

// withArg returns the live processes whose command line has arg.
func withArg(arg string) []sandboxapi.Identity {
	pids, _ := procfs.PIDs()
	var out []sandboxapi.Identity
	for _, pid := range pids {
		b, err := os.ReadFile(procfs.Path(pid, "/cmdline"))
		if err != nil || !bytes.Contains(b, []byte("\x00"+arg+"\x00")) {
			continue
		}
		if st, _, err := procfs.ReadStat(pid, nil); err == nil && st.State != 'Z' {
			out = append(out, sandboxapi.Identity{PID: pid, Start: st.Start})
		}
	}
	return out
}

// untouched fails the test unless every process of ids is alive and not
// stopped.
func untouched(t *testing.T, what string, ids []sandboxapi.Identity) {
	t.Helper()
	for _, id := range ids {
		if st := stateOf(id.PID); !Alive(id) || st == 'Z' || st == 'T' || st == 't' {
			t.Errorf("%s: pid %d (%s) alive %v, state %q", what, id.PID, commOf(id.PID), Alive(id), st)
		}
	}
}

// Two supervisors in one process (as in tests, or a daemon that serves
// two state directories): the harness of one is a child of the process
// like the harness of the other, but nothing names it as the other's (not
// its tree, cgroup, session or tag). Pausing in stop mode and stopping the
// one launch of the first supervisor leaves the second's alone.
func TestStopLeavesAnotherSupervisorsLaunch(t *testing.T) {
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			if !cfg.NoCgroup {
				cfg.CgroupRoot = testCgroupRoot(t) // shared by both
			}
			a, b := startSupervisor(t, cfg), startSupervisor(t, cfg)
			idA, idB := launchID(t, "a"), launchID(t, "b")
			harnessA, harnessB := uniqueArg(3011), uniqueArg(3012)
			mustLaunch(t, a, Spec{ID: idA, Command: `exec sleep ` + harnessA})
			recB := mustLaunch(t, b, Spec{ID: idB, Command: `exec sleep ` + harnessB})
			var theirs []sandboxapi.Identity
			waitFor(t, 5*time.Second, "both harnesses", func() bool {
				theirs = withArg(harnessB)
				return len(withArg(harnessA)) == 1 && len(theirs) == 1
			})
			if theirs[0].PID != recB.PID {
				t.Fatalf("harness b is pid %d, its record says %d", theirs[0].PID, recB.PID)
			}
			res, err := a.Pause(ctxT(t), idA, sandboxapi.ModeStop)
			if err != nil || res.PIDCount != 1 {
				t.Fatalf("pause a: %+v, %v", res, err)
			}
			untouched(t, "b's harness while a is paused", theirs)
			if _, err := a.Continue(ctxT(t), idA); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Stop(ctxT(t), idA); err != nil {
				t.Fatal(err)
			}
			untouched(t, "b's harness after a's stop", theirs)
			if rec, _ := b.Status(idB); rec.State != sandboxapi.StateRunning {
				t.Fatalf("launch b is %s", rec.State)
			}
			if rc, err := b.Stop(ctxT(t), idB); err != nil || rc.Signal != "SIGINT" {
				t.Fatalf("stop b: %+v, %v", rc, err)
			}
		})
	}
}
