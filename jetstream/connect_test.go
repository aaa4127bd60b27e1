package jetstream_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestConnConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  jetstream.ConnConfig
		want string // "" = valid
	}{
		{"one url", jetstream.ConnConfig{URL: "nats://127.0.0.1:4222"}, ""},
		{"cluster", jetstream.ConnConfig{URL: "nats://a:1, nats://b:2,tls://c:3"}, ""},
		{"host port", jetstream.ConnConfig{URL: "127.0.0.1:4222", Token: "t"}, ""},
		{"no url", jetstream.ConnConfig{}, "ConnConfig.URL: required"},
		{"empty entry", jetstream.ConnConfig{URL: "nats://a:1,,nats://b:2"}, "ConnConfig.URL entry 2: empty"},
		{"bad scheme", jetstream.ConnConfig{URL: "http://a:1"}, `scheme "http"`},
		{"two auth", jetstream.ConnConfig{URL: "nats://a:1", CredsFile: "x.creds", Token: "t"}, "ConnConfig.CredsFile, Token: set at most one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, jetstream.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig containing %q", err, tc.want)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)

	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: env.URL, Name: "agent.a1"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Opts.Name != "agent.a1" || nc.Opts.MaxReconnect != -1 {
		t.Errorf("connection name %q, max reconnects %d; want agent.a1, -1", nc.Opts.Name, nc.Opts.MaxReconnect)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}

	missing := filepath.Join(t.TempDir(), "missing.creds")
	if _, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: env.URL, CredsFile: missing}); err == nil ||
		!strings.Contains(err.Error(), "creds file") || !strings.Contains(err.Error(), missing) {
		t.Errorf("Connect with a missing creds file: %v, want an error naming the file", err)
	}
	seed := filepath.Join(t.TempDir(), "missing.nk")
	if _, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: env.URL, NKeyFile: seed}); err == nil ||
		!strings.Contains(err.Error(), "nkey seed file") || !strings.Contains(err.Error(), seed) {
		t.Errorf("Connect with a missing nkey seed file: %v, want an error naming the file", err)
	}

	// Credentials in a URL never reach an error message.
	_, err = jetstream.Connect(ctx, jetstream.ConnConfig{URL: "nats://user:hunter2@127.0.0.1:1"})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Connect to a closed port: %v, want an error naming the server without its password", err)
	}
}

// A server slower to greet than one dial's timeout (a loaded machine, a
// guest behind emulation): Connect dials again, waiting longer, and
// connects, where one dial failed and the process exited. A refused
// connection is not tried again.
func TestConnectToASlowServer(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Each connection reaches the server only after the first dial's
	// timeout, as a slow server's greeting does.
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after the listener's close, below
	t.Cleanup(func() { ln.Close() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				time.Sleep(jetstream.ConnectTimeout + 500*time.Millisecond)
				s, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c); s.Close() }()
				_, _ = io.Copy(c, s)
			})
		}
	})
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: "nats://" + ln.Addr().String()})
	if err != nil {
		t.Fatalf("Connect to a server slower than one dial: %v", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	// Refused: at once, not for SlowConnectFor.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	closed.Close()
	began := time.Now()
	if _, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: "nats://" + addr}); err == nil {
		t.Fatal("Connect to a closed port succeeded")
	} else if took := time.Since(began); took >= jetstream.SlowConnectFor {
		t.Errorf("Connect to a closed port failed after %s, tried again as if the server were slow: %v", took, err)
	}
}

func TestIsNKeySeedFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	acct, _ := nkeys.CreateAccount()
	aseed, _ := acct.Seed()
	creds := "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.sig\n------END NATS USER JWT------\n\n" +
		"-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	for _, tc := range []struct {
		name, content string
		seed          bool
		err           string
	}{
		{"user.nk", string(seed) + "\n", true, ""},
		{"user.creds", creds, false, ""},
		{"account.nk", string(aseed), false, "not a user's"},
		{"junk", "hello\n", false, "neither a .creds file nor an nkey seed"},
	} {
		got, err := jetstream.IsNKeySeedFile(write(tc.name, tc.content))
		if got != tc.seed || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, %v; want %v, error containing %q", tc.name, got, err, tc.seed, tc.err)
		}
	}
	if _, err := jetstream.IsNKeySeedFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

// unreachableDialer fails its first fail dials as a node whose link is
// down does (no route, said at once), then dials.
type unreachableDialer struct {
	mu    sync.Mutex
	fail  int
	dials int
}

func (d *unreachableDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dials++
	n := d.dials
	d.mu.Unlock()
	if n <= d.fail {
		return nil, &net.OpError{Op: "dial", Net: network, Err: &os.SyscallError{Syscall: "connect", Err: syscall.ENETUNREACH}}
	}
	return net.Dial(network, address)
}

// A network that cannot be reached when a member starts (its node's link
// down) is waited for as a server that does not answer is, a dial's
// timeout apart, not taken for a refusal: a member that exits takes its
// sandbox with it.
func TestConnectWhileTheNetworkIsUnreachable(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)
	d := &unreachableDialer{fail: 2}
	began := time.Now()
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: env.URL}, nats.SetCustomDialer(d))
	if err != nil {
		t.Fatalf("Connect while the network is unreachable for two dials: %v", err)
	}
	defer nc.Close()
	if took := time.Since(began); took < 2*jetstream.ConnectTimeout {
		t.Fatalf("connected after %s: the two unreachable dials were not a dial's timeout apart (%s, then twice that)", took, jetstream.ConnectTimeout)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dials != 3 {
		t.Fatalf("%d dials, want 3: two unreachable, one that connected", d.dials)
	}
}
