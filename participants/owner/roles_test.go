package owner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// TestUnderRoles runs the owner connected with the owner role of `stillpoint
// server --auth-dir`, called by an agent connected with the agent role: a
// session is seeded, snapshotted at a checkpoint (records, manifest, the
// snapshot index), closed (the daemon's heartbeat deleted) and released.
// jstest fails the test on any permissions violation.
func TestUnderRoles(t *testing.T) {
	env := jstest.Start(t, jstest.WithRoles())
	d := newDir(t)
	_, ojs := env.As(embedded.RoleOwner).Connect(t)
	bus, err := jetstream.Open(t.Context(), ojs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, env, d, "o1")
	cfg.JS, cfg.Bus = ojs, bus
	o := newOwner(t, cfg)
	runOwner(t, env, o)

	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() {
		done <- o.Serve(ctx, ojs.Conn())
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	anc, _ := env.As(embedded.RoleAgent).Connect(t)
	c, err := ownerapi.NewClient(anc, testRun, "o1")
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer ccancel()
	var info ownerapi.SessionInfo
	// Until the service's subscriptions are in, a seed finds no responder.
	poll.Wait(t, 30*time.Second, "a seed as an agent", func() bool {
		info, err = c.SeedSession(cctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "r1"})
		return err == nil && info.SandboxID != ""
	})

	m := o.Member().Name()
	br := membertest.NewBridge(t, env, testRun) // admin: the bridge role's own test is the CLI's
	if pa := br.Ack(br.Publish(events.Prepare{PhaseHeader: br.Header("c1", 10*time.Second, m)}), events.PhasePrepare, m).(events.PrepareAck); !pa.Ready {
		t.Fatalf("prepare ack %+v", pa)
	}
	ca := br.Ack(br.Publish(events.Commit{PhaseHeader: br.Header("c1", 10*time.Second, m), Scope: []events.Episode{ep("r1", 0)}}), events.PhaseCommit, m).(events.CommitAck)
	if !ca.OK || ca.Manifest == nil || ca.Manifest.Count != 1 {
		t.Fatalf("commit ack %+v", ca)
	}
	br.Ack(br.Publish(events.Resume{PhaseHeader: br.Header("c1", 10*time.Second, m)}), events.PhaseResume, m)
	if keys := indexKeys(t, env); len(keys) != 1 {
		t.Errorf("snapshot index %v, want the one snapshot", keys)
	}
	if err := c.CloseSession(cctx, "s1"); err != nil {
		t.Fatal(err)
	}
	ra := br.Ack(br.Publish(events.Release{PhaseHeader: br.Header("op1", 10*time.Second, m), Final: true}), events.PhaseRelease, m).(events.ReleaseAck)
	if !ra.OK || !slices.Equal(ra.Deleted, []string{"c1-s1"}) {
		t.Fatalf("release ack %+v", ra)
	}
	if keys := indexKeys(t, env); len(keys) != 0 {
		t.Errorf("snapshot index after the final release: %v", keys)
	}
}
