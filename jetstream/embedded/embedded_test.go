package embedded_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStartRandomPortAndShutdownTwice(t *testing.T) {
	ctx := testContext(t)
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), ServerName: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		t.Fatalf("ClientURL %q: %v", s.ClientURL(), err)
	}
	if p := u.Port(); p == "" || p == "0" || p == "4222" {
		t.Errorf("ClientURL %q: port %q, want a random port (not 0, not 4222)", s.ClientURL(), p)
	}
	if u.Hostname() != embedded.DefaultHost {
		t.Errorf("ClientURL %q: host %q, want %q", s.ClientURL(), u.Hostname(), embedded.DefaultHost)
	}
	if s.Name() != "solo" || s.NATS().Name() != "solo" {
		t.Errorf("Name() = %q, NATS().Name() = %q, want solo", s.Name(), s.NATS().Name())
	}
	if !s.NATS().JetStreamEnabled() {
		t.Error("JetStream not enabled after Start")
	}

	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	s.Shutdown()
	if s.NATS().Running() {
		t.Error("server still running after Shutdown")
	}
}

func TestTokenAuth(t *testing.T) {
	ctx := testContext(t)
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)

	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL()}); err == nil {
		nc.Close()
		t.Fatal("connect without token: got nil error, want authorization failure")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("connect without token: %v, want an authorization error", err)
	}
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), Token: "wrong"}); err == nil {
		nc.Close()
		t.Fatal("connect with wrong token: got nil error, want authorization failure")
	}
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), Token: "s3cret"})
	if err != nil {
		t.Fatalf("connect with token: %v", err)
	}
	nc.Close()
}

func TestConfigValidate(t *testing.T) {
	ctx := testContext(t)
	_, err := embedded.Start(ctx, embedded.Config{Port: -1})
	if !errors.Is(err, embedded.ErrInvalidConfig) {
		t.Fatalf("Start without Dir: %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Config.Dir", "Config.Port"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	_, err = embedded.StartCluster(ctx, embedded.ClusterConfig{Nodes: -1})
	if !errors.Is(err, embedded.ErrInvalidConfig) {
		t.Fatalf("StartCluster without Dir: %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"ClusterConfig.Dir", "ClusterConfig.Nodes"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}

// TestFatalIsReturned starts a server whose store dir cannot be created: nats-server reports
// "Can't start JetStream" as fatal, which must come back as an error, not exit the test binary.
func TestFatalIsReturned(t *testing.T) {
	ctx := testContext(t)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(file, "store")})
	if err == nil {
		s.Shutdown()
		t.Fatal("Start with an unusable store dir: got nil error")
	}
	if !errors.Is(err, embedded.ErrFatal) {
		t.Errorf("Start with an unusable store dir: %v, want ErrFatal", err)
	}
	t.Logf("Start with an unusable store dir: %v", err)
}

func TestLoggerAdapter(t *testing.T) {
	ctx := testContext(t)
	var out jstest.Buffer
	log := zerolog.New(&out).Level(zerolog.InfoLevel)
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), ServerName: "logged", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	got := out.String()
	for _, want := range []string{
		`"level":"info"`, `"server":"logged"`, `Starting nats-server`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log output lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(got, `"level":"debug"`) {
		t.Errorf("log output has debug lines although the logger is at info:\n%s", got)
	}
}

func TestStartCluster(t *testing.T) {
	ctx := testContext(t)
	c, err := embedded.StartCluster(ctx, embedded.ClusterConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)

	if c.Len() != 3 {
		t.Fatalf("Len() = %d, want 3", c.Len())
	}
	urls := c.ClientURLs()
	if got := strings.Join(urls, ","); c.URL() != got {
		t.Errorf("URL() = %q, want %q", c.URL(), got)
	}
	leaders := 0
	for i, u := range urls {
		n := c.Node(i)
		if want := "n" + string(rune('0'+i)); n.Name() != want {
			t.Errorf("node %d is named %q, want %q", i, n.Name(), want)
		}
		if u != n.ClientURL() {
			t.Errorf("ClientURLs()[%d] = %q, Node(%d).ClientURL() = %q", i, u, i, n.ClientURL())
		}
		if n.NATS().JetStreamIsLeader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d meta leaders after StartCluster, want 1", leaders)
	}

	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: c.URL(), Name: "cluster-test"})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	c.Shutdown()
	c.Shutdown()
	for i := range c.Len() {
		if c.Node(i).NATS().Running() {
			t.Errorf("node %d still running after Shutdown", i)
		}
	}
}
