package owner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// runOwner runs o until the test ends, and waits until it has registered.
func runOwner(t *testing.T, env *jstest.Env, o *Owner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = o.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	membertest.WaitRegistered(t, env, testRun, o.Member().Name(), done)
}

// A checkpoint through the bus (PROTOCOL §5): the owner answers prepare
// ready, commits one record per session, reopens admission on resume, and
// a final release deletes the snapshots it took.
func TestCheckpointThroughBus(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		o := newOwner(t, baseConfig(t, env, d, "o1"))
		runOwner(t, env, o)
		m := o.Member().Name()
		br := membertest.NewBridge(t, env, testRun)
		ctx := t.Context()

		s := start(t, o, "s1", ep("r1", 0))
		sh(t, d, s.Sandbox.ID, "echo hi > hi.txt")

		pa := br.Ack(br.Publish(events.Prepare{PhaseHeader: br.Header("c1", 10*time.Second, m)}), events.PhasePrepare, m).(events.PrepareAck)
		if !pa.OK || !pa.Ready {
			t.Fatalf("prepare ack %+v", pa)
		}
		ca := br.Ack(br.Publish(events.Commit{PhaseHeader: br.Header("c1", 10*time.Second, m), Scope: []events.Episode{ep("r1", 0)}}), events.PhaseCommit, m).(events.CommitAck)
		if !ca.OK || ca.Manifest == nil || ca.Manifest.Count != 1 {
			t.Fatalf("commit ack %+v", ca)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c1-s1"}) {
			t.Errorf("snapshots %v", got)
		}
		br.Ack(br.Publish(events.Resume{PhaseHeader: br.Header("c1", 10*time.Second, m)}), events.PhaseResume, m)

		// Admission is open again.
		start(t, o, "s2", ep("r2", 0))
		for _, id := range []string{"s1", "s2"} {
			if err := o.CloseSession(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		ra := br.Ack(br.Publish(events.Release{PhaseHeader: br.Header("op1", 10*time.Second, m), Final: true}), events.PhaseRelease, m).(events.ReleaseAck)
		if !ra.OK || !slices.Equal(ra.Deleted, []string{"c1-s1"}) {
			t.Fatalf("release ack %+v", ra)
		}
	})
}
