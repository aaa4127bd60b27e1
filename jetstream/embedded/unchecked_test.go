package embedded_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
)

// TestWhatTheServerDoesNotCheck pins down, within one run, each thing
// docs/PERMISSIONS.md ("What NATS cannot enforce") says nats-server does not
// check for an agent's or an owner's own user, so that the page changes the
// day the server starts to: each case fails once the server refuses it.
// A sandbox's user can do none of them (TestMembersOnTheBus).
func TestWhatTheServerDoesNotCheck(t *testing.T) {
	ctx := testContext(t)
	auth, _, s, bus := operatorServer(t)
	ag, _, _ := connectCreds(t, s, memberCreds(t, auth, "agent.a1"))
	ow, _, _ := connectCreds(t, s, memberCreds(t, auth, "owner.o1"))

	// A push consumer's deliver subject: the agent's own durable, made on
	// its one create subject with its one filter, delivers the run's phases
	// onto the owner's service subject, which the server never checks
	// against the agent's publish permissions.
	service := "spsvc.r.owner.o1.deliver"
	got, err := ow.SubscribeSync(service)
	if err != nil {
		t.Fatal(err)
	}
	if err := ow.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := member.DurableConfig("r", "sp_r_agent_a1", "a1")
	cfg.DeliverSubject = service
	body, _ := json.Marshal(map[string]any{"stream_name": jetstream.StreamName, "config": cfg})
	r, err := ag.Request("$JS.API.CONSUMER.CREATE.STILLPOINT.sp_r_agent_a1.sp.r.phase.>", body, 5*time.Second)
	if err != nil {
		t.Fatalf("the agent's push durable: %v", err)
	}
	var resp struct {
		Error *struct{ Description string } `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &resp); err != nil || resp.Error != nil {
		t.Fatalf("the agent's durable delivering onto %s: %s; the server now checks a deliver subject: docs/PERMISSIONS.md must say so", service, r.Data)
	}
	if _, err := bus.JS.Publish(ctx, "sp.r.phase.7.prepare", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if m, err := got.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("nothing delivered onto %s: %v; the server now checks a deliver subject: docs/PERMISSIONS.md must say so", service, err)
	} else {
		t.Logf("delivered onto the owner's service subject, to be acked on %s", m.Reply)
	}

	// Any inbox: the agent publishes into the owner's inbox, whose
	// requests' replies carry a random token the agent does not know.
	inbox := jetstream.MemberInboxPrefix("r", string(events.KindOwner), "o1") + ".known"
	in, err := ow.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := ow.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := ag.Publish(inbox, []byte("not yours")); err != nil {
		t.Fatal(err)
	}
	if _, err := in.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("the agent's publish into the owner's inbox: %v; the server now refuses it: docs/PERMISSIONS.md must say so", err)
	}

	// Discovery within a kind: another agent answers for a1's micro service
	// id, which no permission can name apart.
	a2, _, a2errs := connectCreds(t, s, memberCreds(t, auth, "agent.a2"))
	if _, err := a2.Subscribe("$SRV.INFO."+events.ServiceName(events.KindAgent)+".a1id", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := a2.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a2errs:
		t.Fatalf("agent a2 subscribing to another agent's discovery id: %v; the server now refuses it: docs/PERMISSIONS.md must say so", err)
	case <-time.After(500 * time.Millisecond):
	}
}
