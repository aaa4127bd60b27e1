package embedded_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// A client that stops answering without closing its connection (cut off
// by a partition) is closed by the server once MaxPingsOut pings go
// unanswered, its subscriptions with it: a request to its subject, which
// went unanswered while the server still held it, then answers "no
// responders", and its member is left out instead of holding a phase.
func TestSilentClientIsClosedAndItsSubjectHasNoResponders(t *testing.T) {
	ctx := testContext(t)
	const ping = 500 * time.Millisecond
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), PingInterval: ping})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	// The asker first: the silent client is closed within a second.
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The silent client speaks the protocol by hand: it connects,
	// subscribes, and then reads nothing and answers no PING.
	raw, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	br := bufio.NewReader(raw)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("greeting %q, %v", line, err)
	}
	fmt.Fprint(raw, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1}\r\nSUB alive.silent 1\r\nPING\r\n")
	if line, err := br.ReadString('\n'); err != nil || line != "PONG\r\n" {
		t.Fatalf("after SUB: %q, %v", line, err)
	}

	// While the server holds the silent client, a request times out: it
	// proves nothing.
	if _, err := nc.Request("alive.silent", nil, ping/2); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("request to the silent client: %v, want a timeout", err)
	}
	// Closed by the pings: nats-server's own (2 minutes, 2 unanswered)
	// would outlast the wait.
	poll.Wait(t, 20*time.Second, "the server to close the silent client", func() bool {
		_, err := nc.Request("alive.silent", nil, ping)
		return errors.Is(err, nats.ErrNoResponders)
	})
}
