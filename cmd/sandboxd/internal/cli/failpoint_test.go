package cli

import (
	"io"
	"testing"
)

// --failpoint takes identity=<prefix> and relay-down[=<prefix>],
// repeatedly, and refuses anything else.
func TestFailpointFlags(t *testing.T) {
	o, err := parseMemberFlags([]string{"--failpoint", "identity=l-", "--failpoint", "relay-down"}, io.Discard)
	if err != nil || o.failpoints != (failpoints{identityPrefix: "l-", relayDown: true}) {
		t.Fatalf("parse: %+v, %v", o.failpoints, err)
	}
	o, err = parseMemberFlags([]string{"--failpoint", "relay-down=r2.l"}, io.Discard)
	if err != nil || o.failpoints != (failpoints{relayDown: true, relayDownPrefix: "r2.l"}) {
		t.Fatalf("parse relay-down=r2.l: %+v, %v", o.failpoints, err)
	}
	for _, bad := range []string{"identity=", "identity", "sideways"} {
		if _, err := parseMemberFlags([]string{"--failpoint", bad}, io.Discard); err == nil {
			t.Errorf("--failpoint %s accepted", bad)
		}
	}
	if o, err := parseMemberFlags(nil, io.Discard); err != nil || o.failpoints != (failpoints{}) || o.relay != "" {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
}
