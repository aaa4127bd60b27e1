package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "bridge":
		os.Exit(bridgeProcess())
	case "member":
		os.Exit(memberProcess())
	}
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

const run = "run1"

// startBridge runs a bridge of run in-process until the test ends.
func startBridge(t testing.TB, env *jstest.Env, cfg bridge.Config) *bridge.Bridge {
	t.Helper()
	b := buildBridge(t, env, cfg)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	})
	return b
}

// newBridge is a bridge of run that does not run: no recovery of Run's
// races what the test does to the bus. The test's cleanup runs it with a
// context already ended, which stops what its operations left running
// (a held checkpoint's renewer, resume watchers) as the end of Run does.
func newBridge(t testing.TB, env *jstest.Env, cfg bridge.Config) *bridge.Bridge {
	t.Helper()
	b := buildBridge(t, env, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
		cancel()
		if err := b.Run(ctx); err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	})
	return b
}

func buildBridge(t testing.TB, env *jstest.Env, cfg bridge.Config) *bridge.Bridge {
	t.Helper()
	nc, js := env.Connect(t)
	cfg.Run, cfg.Conn, cfg.JS = run, nc, js
	if cfg.Bus == nil {
		bus, err := jetstream.Open(t.Context(), js)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Bus = bus
	}
	if cfg.PhaseTimeout == 0 {
		cfg.PhaseTimeout = 5 * time.Second
	}
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Str("who", "bridge").Logger()
	b, err := bridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fleet(t testing.TB, env *jstest.Env, n, episodes int) []*membertest.Handle {
	return membertest.StartMembers(t, env, run, n, membertest.Options{Episodes: episodes})
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// kvKeys lists the sp_manifests keys of the run, but its head record
// (events.HeadKey), which outlives every release by design.
func kvKeys(t testing.TB, env *jstest.Env) []string {
	t.Helper()
	l, err := env.Bus.Manifests.ListKeysFiltered(t.Context(), run+".>")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range l.Keys() {
		if k != events.HeadKey(run) {
			out = append(out, k)
		}
	}
	return out
}

func objects(t testing.TB, env *jstest.Env) []string {
	t.Helper()
	infos, err := env.Bus.Records.List(t.Context())
	if errors.Is(err, natsjs.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range infos {
		if strings.HasPrefix(o.Name, run+"/") {
			out = append(out, o.Name)
		}
	}
	return out
}

func manifestOf(t testing.TB, env *jstest.Env, id string) *events.CheckpointManifest {
	t.Helper()
	e, err := env.Bus.Manifests.Get(t.Context(), events.ManifestKey(run, id))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var m events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("manifest %s: %v", id, err)
	}
	// Schema 2: the member list, verified by its digest.
	if err := m.LoadMembers(func(o string) ([]byte, error) { return env.Bus.Checkpoints.GetBytes(t.Context(), o) }); err != nil {
		t.Fatalf("manifest %s: %v", id, err)
	}
	return &m
}

// memberLists returns the names of the member list objects of checkpoint
// id in sp_checkpoints.
func memberLists(t testing.TB, env *jstest.Env, id string) []string {
	t.Helper()
	infos, err := env.Bus.Checkpoints.List(t.Context())
	if errors.Is(err, natsjs.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range infos {
		if strings.HasPrefix(o.Name, events.MemberListPrefix(run, id)) {
			out = append(out, o.Name)
		}
	}
	return out
}

// allOpen reports whether every participant has admission open again.
func allOpen(hs []*membertest.Handle) bool {
	for _, h := range hs {
		if !h.Participant.AdmissionOpen() {
			return false
		}
	}
	return true
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
