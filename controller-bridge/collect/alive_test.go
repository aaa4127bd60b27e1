package collect

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// statusController is a bridge whose status lists fixed members.
type statusController struct {
	noController
	members []events.MemberInfo
}

func (s statusController) Status(context.Context) (*bridgeapi.Status, error) {
	return &bridgeapi.Status{Members: s.members}, nil
}

// serveMember serves a member's service as the agent and the owner do:
// name is the service's (stillpoint-agent, stillpoint-owner), its
// metadata the run, the member's name under its kind and its instance.
// stop stops it, as its process's death does, and returns once the server
// has dropped its subscriptions: svc.Stop only queues the unsubscribes on
// the service's connection, and a ping sent on another connection could
// otherwise reach the server first and be answered by the dead service.
func serveMember(t *testing.T, env *jstest.Env, run string, m events.Member, instance string) (stop func()) {
	t.Helper()
	nc, _ := env.Connect(t)
	svc, err := micro.AddService(nc, micro.Config{Name: "stillpoint-" + string(m.Kind()), Version: "1.0.0",
		Metadata: map[string]string{"run": run, string(m.Kind()): m.Name(), "instance": instance}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			if err := svc.Stop(); err != nil {
				t.Errorf("stop the service of %s: %v", m, err)
			}
			if err := nc.Flush(); err != nil {
				t.Errorf("flush the unsubscribes of %s's service: %v", m, err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// After one agent restarted, a recovery (with no LATEST: every agent is
// waited for) decides as soon as that agent's
// new instance is up and every other member answers as the process that
// served: it does not wait out RecoverGrace for a restore that cannot
// come. A member that shows served but does not answer (its process died,
// its heartbeat not yet expired) is waited for, up to the grace.
func TestPartialLossDecidedWithoutTheGrace(t *testing.T) {
	const run = "partial"
	env := jstest.Start(t)
	members := []events.MemberInfo{
		{Run: run, Member: "agent.a1", Instance: "a1-new"},
		{Run: run, Member: "agent.a2", Instance: "a2-old", Served: true},
		{Run: run, Member: "owner.o1", Instance: "o1-old", Served: true},
	}
	serveMember(t, env, run, "agent.a1", "a1-new")
	a2Dies := serveMember(t, env, run, "agent.a2", "a2-old")
	serveMember(t, env, run, "owner.o1", "o1-old")
	// Another run's agent of the same name and instance answers too: not
	// one of this run.
	serveMember(t, env, "other", "agent.a2", "a2-old")
	collector := func(grace time.Duration) *Collector {
		nc, js := env.Connect(t)
		c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}},
			Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1", "a2"}, Conn: nc, JS: js, Bus: env.Bus,
			Controller: statusController{members: members}, RecoverGrace: grace, Logger: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	began := time.Now()
	if _, _, err := collector(10 * time.Minute).waitFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Minute {
		t.Fatalf("the partial loss was decided after %s, want well before the grace (10 min)", took)
	}

	a2Dies()
	const grace = 3 * time.Second
	began = time.Now()
	if _, _, err := collector(grace).waitFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < grace {
		t.Fatalf("decided after %s with a2's process gone and its heartbeat still there, want the grace (%s) waited out", took, grace)
	}
}

// No agent restarted yet, but an owner did, and the agents' processes
// died with it (a fleet killed at once, their heartbeats not yet
// expired): a recovery does not take the agents' stale heartbeats for
// processes that run. It waits for them (here out to the grace, as none
// comes back), then, as they answer, decides at once.
func TestServedMembersThatDoNotAnswerAreWaitedFor(t *testing.T) {
	const run = "stale"
	env := jstest.Start(t)
	members := []events.MemberInfo{
		{Run: run, Member: "agent.a1", Instance: "a1-old", Served: true},
		{Run: run, Member: "agent.a2", Instance: "a2-old", Served: true},
		{Run: run, Member: "owner.o1", Instance: "o1-new"},
	}
	serveMember(t, env, run, "owner.o1", "o1-new")
	collector := func(grace time.Duration) *Collector {
		nc, js := env.Connect(t)
		c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}},
			Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1", "a2"}, Conn: nc, JS: js, Bus: env.Bus,
			Controller: statusController{members: members}, RecoverGrace: grace, Logger: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const grace = 3 * time.Second
	began := time.Now()
	if _, _, err := collector(grace).waitFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < grace {
		t.Fatalf("decided after %s with the agents' processes gone and their heartbeats still there, want the grace (%s) waited out", took, grace)
	}

	// The agents' processes answer as the instances their heartbeats
	// show: nothing of theirs restarted, the owner's loss is known.
	serveMember(t, env, run, "agent.a1", "a1-old")
	serveMember(t, env, run, "agent.a2", "a2-old")
	began = time.Now()
	if _, _, err := collector(10 * time.Minute).waitFleet(t.Context()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Minute {
		t.Fatalf("decided after %s with every served member answering, want well before the grace (10 min)", took)
	}
}
