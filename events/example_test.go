package events_test

import (
	"fmt"
	"sort"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// A bridge builds a prepare phase and encodes it for NATS; a member decodes
// it back into the typed payload.
func ExampleMarshal() {
	prepare := events.Prepare{PhaseHeader: events.PhaseHeader{
		Run: "run1", CheckpointID: "ckpt-1", Seq: 1,
		Deadline: time.Date(2026, 11, 29, 8, 0, 30, 0, time.UTC),
		Members:  []events.Member{"agent.a0", "owner.o0"},
	}}
	msg, err := events.Marshal("bridge.main", prepare,
		events.WithID("run1.ckpt-1.prepare"), events.WithTime(time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(msg.Subject)
	var names []string
	for k := range msg.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("%s: %s\n", k, msg.Header.Get(k))
	}

	_, data, err := events.Unmarshal(msg)
	if err != nil {
		fmt.Println(err)
		return
	}
	p := data.(events.Prepare)
	fmt.Println(p.CheckpointID, p.Members)
	// Output:
	// sp.run1.phase.prepare
	// Nats-Msg-Id: run1.ckpt-1.prepare
	// ce-datacontenttype: application/json
	// ce-id: run1.ckpt-1.prepare
	// ce-source: /run1/bridge.main
	// ce-specversion: 1.0
	// ce-spepoch: 0
	// ce-sprun: run1
	// ce-spseq: 1
	// ce-subject: ckpt-1
	// ce-time: 2026-11-29T08:00:00Z
	// ce-type: dev.stillpoint.phase.prepare.v1
	// ckpt-1 [agent.a0 owner.o0]
}

// A member answers a phase with an ack on its own once-only subject.
func ExampleSubject() {
	ack := events.PrepareAck{AckHeader: events.AckHeader{
		Run: "run1", Member: "agent.a0", Seq: 1, CheckpointID: "ckpt-1", OK: true, State: events.StatePreparing,
	}}
	ack.SetBlockers([]string{"rollout-7"})
	fmt.Println(events.Subject(ack))
	fmt.Println(ack.Ready, ack.BlockerCount)
	// Output:
	// sp.run1.ack.1.prepare.agent.a0
	// false 1
}

// Capture keys name an attempt of a rollout; a restored episode continues
// as the next attempt.
func ExampleParseEpisode() {
	e, err := events.ParseEpisode("task-12-a2")
	fmt.Println(e.Rollout, e.Attempt, err)
	fmt.Println(e.Next())
	_, err = events.ParseEpisode("../etc/passwd")
	fmt.Println(err)
	// Output:
	// task-12 2 <nil>
	// task-12-a3
	// events: episode: invalid: "../etc/passwd" must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$
}

// Decode refuses an event version this build does not know, naming the
// type.
func ExampleDecodeAny() {
	msg, _ := events.Marshal("bridge.main", events.Resume{PhaseHeader: events.PhaseHeader{
		Run: "run1", CheckpointID: "ckpt-1", Seq: 4, Deadline: time.Unix(0, 0).UTC(),
	}})
	msg.Header["ce-type"] = []string{"dev.stillpoint.phase.resume.v2"}
	_, _, err := events.Unmarshal(msg)
	fmt.Println(err)
	// Output:
	// events: ce-type: unknown event version: "dev.stillpoint.phase.resume.v2": this build reads v1 only
}
