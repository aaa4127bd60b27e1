package cli

import (
	"io"
	"testing"

	"github.com/rs/zerolog"
)

// --relay-translate takes chat or nothing, and needs --relay.
func TestRelayTranslateFlag(t *testing.T) {
	o, err := parseMemberFlags([]string{"--relay", "127.0.0.1:0", "--relay-translate", "chat", "--capture", "none"}, io.Discard)
	if err != nil || o.translate != "chat" {
		t.Fatalf("%+v %v", o, err)
	}
	if rl, err := o.newRelay(zerolog.Nop()); err != nil || rl == nil {
		t.Fatalf("relay: %v", err)
	}
	if _, err := parseMemberFlags([]string{"--relay-translate", "messages"}, io.Discard); err == nil {
		t.Error("--relay-translate messages accepted")
	}
	o, _ = parseMemberFlags([]string{"--relay-translate", "chat"}, io.Discard)
	if _, err := o.newRelay(zerolog.Nop()); err == nil {
		t.Error("--relay-translate without --relay accepted")
	}
}
