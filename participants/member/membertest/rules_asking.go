package membertest

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// AskerSuite is what an asker of sandbox daemons supplies to run the rules
// of asking (RunAsker): a participant that waits for daemons' acks, which
// travel on core NATS and may be lost on the way (PROTOCOL §3, acks): the
// bridge, and an agent waiting for its sandbox's prepare ack.
type AskerSuite struct {
	// AwaitPrepareAck makes the asker wait, on env, for the prepare ack
	// of daemon, a sandbox daemon of run whose heartbeat is in the
	// daemons' bucket: for a prepare the asker publishes, or one it
	// publishes with NewBridge. It returns nil once the asker has the
	// daemon's ack ok and ready, an error saying what it has otherwise.
	AwaitPrepareAck func(t *testing.T, env *jstest.Env, run string, daemon events.Member) error
}

// RunAsker runs the rules every asker of sandbox daemons passes, each
// against a real embedded NATS server of its own:
//
//   - a silent daemon is asked, and says its ack again (PROTOCOL §3, acks
//     and Liveness): a daemon whose prepare ack the asker did not hear is
//     asked on its alive subject with the prepare named, says the ack
//     again and answers with it, and the asker has it. The daemon here
//     never sends its ack unasked (one lost on the way), so an asker that
//     does not ask never has it.
func RunAsker(t *testing.T, s AskerSuite) {
	if s.AwaitPrepareAck == nil {
		t.Fatal("membertest: AskerSuite.AwaitPrepareAck is required")
	}
	t.Run("§3 acks: a silent daemon is asked, and says its ack again", func(t *testing.T) {
		t.Parallel()
		env := jstest.Start(t)
		d := StartSilentDaemon(t, env, "run1", "quiet")
		if err := s.AwaitPrepareAck(t, env, "run1", d.Name); err != nil {
			t.Fatalf("the silent daemon's prepare ack: %v", err)
		}
		if d.Said() == 0 {
			t.Fatal("the asker has an ack the silent daemon never said")
		}
	})
}

// SilentDaemon is a sandbox daemon whose acks are lost on the way: it keeps
// its heartbeat and answers on its alive subject as a daemon's runtime
// does, but acks no phase unasked. Asked with a prepare named
// (events.AliveQuery), it says its ack of that prepare: it publishes the ack
// on its ack subject again and answers with it, on the asker's inbox, as
// a daemon's runtime says an ack it sent.
type SilentDaemon struct {
	// Name is the daemon's member name, sandbox.<name>.
	Name events.Member

	said atomic.Int32
}

// StartSilentDaemon starts a silent daemon sandbox.<name> of run on env,
// until the test ends.
func StartSilentDaemon(t testing.TB, env *jstest.Env, run, name string) *SilentDaemon {
	t.Helper()
	m, err := events.NewMember(events.KindSandbox, name)
	if err != nil {
		t.Fatalf("membertest: %v", err)
	}
	d := &SilentDaemon{Name: m}
	now := time.Now().UTC()
	info, _ := json.Marshal(events.MemberInfo{Run: run, Member: m, Instance: "silent", Started: now, Heartbeat: now})
	if _, err := env.Bus.Daemons.Put(t.Context(), events.MemberKey(run, m), info); err != nil {
		t.Fatalf("membertest: the silent daemon's heartbeat: %v", err)
	}
	nc, _ := env.Connect(t)
	if _, err := nc.Subscribe(events.AliveSubject(run, m), func(msg *nats.Msg) {
		if ack := d.ackOf(env, run, msg.Data); ack != nil {
			d.said.Add(1)
			_ = nc.PublishMsg(ack)
			_ = msg.RespondMsg(&nats.Msg{Header: ack.Header, Data: ack.Data})
			return
		}
		_ = msg.Respond([]byte("silent"))
	}); err != nil {
		t.Fatalf("membertest: the silent daemon's alive subject: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("membertest: the silent daemon's alive subject: %v", err)
	}
	return d
}

// Said returns how many times the daemon said an ack, asked.
func (d *SilentDaemon) Said() int { return int(d.said.Load()) }

// ackOf returns the daemon's prepare ack of the prepare that body
// (events.AliveQuery) names, if it names the run's newest prepare; nil
// otherwise.
func (d *SilentDaemon) ackOf(env *jstest.Env, run string, body []byte) *nats.Msg {
	var q events.AliveQuery
	if len(body) == 0 || json.Unmarshal(body, &q) != nil || q.Phase != events.PhasePrepare || q.Seq == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := env.Bus.Stream.GetLastMsgForSubject(ctx, events.PhaseSubject(run, events.PhasePrepare))
	if err != nil {
		return nil
	}
	_, data, err := events.Unmarshal(rawMsg(raw))
	p, ok := data.(events.Prepare)
	if err != nil || !ok || p.Seq != q.Seq {
		return nil
	}
	a := events.PrepareAck{AckHeader: events.AckHeader{Run: run, Member: d.Name, Seq: p.Seq, CheckpointID: p.CheckpointID,
		Epoch: p.Epoch, OK: true, State: events.StatePrepared}, Ready: true}
	msg, err := events.Marshal(d.Name, a)
	if err != nil {
		return nil
	}
	return msg
}
