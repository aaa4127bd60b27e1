package events

import (
	"encoding/json"
	"testing"
)

// benchAck is the ack every member sends at prepare in the coordination
// benchmark: a small header and no report.
func benchAck() PrepareAck {
	a := PrepareAck{AckHeader: testAck(1)}
	a.Counts = map[string]int{}
	return a
}

// BenchmarkMarshalAck measures building and encoding one prepare ack, the
// event each member publishes per phase. Baseline: BenchmarkJSONAck.
func BenchmarkMarshalAck(b *testing.B) {
	a := benchAck()
	for b.Loop() {
		if _, err := Marshal("agent.a0", a, WithID("run1.1.prepare.agent.a0")); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnmarshalAck measures parsing, decoding and checking one
// prepare ack, what the bridge does for every ack it gathers.
func BenchmarkUnmarshalAck(b *testing.B) {
	m, err := Marshal("agent.a0", benchAck(), WithID("run1.1.prepare.agent.a0"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := Unmarshal(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSONAck is the baseline of both: encoding/json alone, the
// payload marshalled and unmarshalled with no envelope and no checks.
func BenchmarkJSONAck(b *testing.B) {
	a := benchAck()
	for b.Loop() {
		body, err := json.Marshal(a)
		if err != nil {
			b.Fatal(err)
		}
		var back PrepareAck
		if err := json.Unmarshal(body, &back); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnmarshalPhase measures parsing, decoding and checking the live
// copy of one prepare that addresses the sandbox daemons by roster, what
// every sandbox daemon does for every phase it hears. Baseline:
// BenchmarkJSONPhase.
func BenchmarkUnmarshalPhase(b *testing.B) {
	m, err := Marshal(testBridge, Prepare{PhaseHeader: testRosterPhase(3)}, WithID("run1.3.prepare"))
	if err != nil {
		b.Fatal(err)
	}
	m = LiveCopy(m, 41, 2)
	m.Subject = m.Header.Get("Nats-Subject") // as a daemon reads it
	for b.Loop() {
		if _, _, err := Unmarshal(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSONPhase is the baseline of BenchmarkUnmarshalPhase: the
// payload unmarshalled with encoding/json alone, no headers, no checks.
func BenchmarkJSONPhase(b *testing.B) {
	body, err := json.Marshal(Prepare{PhaseHeader: testRosterPhase(3)})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var back Prepare
		if err := json.Unmarshal(body, &back); err != nil {
			b.Fatal(err)
		}
	}
}
