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
