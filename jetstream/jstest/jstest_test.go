package jstest_test

import (
	"errors"
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

func TestStart(t *testing.T) {
	env := jstest.Start(t)
	if env.Server == nil || env.Cluster != nil || env.URL != env.Server.ClientURL() {
		t.Fatalf("env: Server %v, Cluster %v, URL %q", env.Server, env.Cluster, env.URL)
	}
	if env.Bus == nil || env.Topology != (jetstream.Topology{}).WithDefaults() {
		t.Fatalf("env: Bus %v, Topology %+v; want the default topology provisioned", env.Bus, env.Topology)
	}

	nc, js := env.Connect(t)
	if nc == env.Conn {
		t.Fatal("Connect returned the Env's own connection")
	}
	if _, err := jetstream.Open(t.Context(), js); err != nil {
		t.Fatalf("Open through the extra connection: %v", err)
	}
}

func TestStartWithoutProvision(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	if env.Bus != nil {
		t.Fatalf("env.Bus = %v, want nil", env.Bus)
	}
	if _, err := jetstream.Open(t.Context(), env.JS); !errors.Is(err, jetstream.ErrNotProvisioned) {
		t.Fatalf("Open: %v, want ErrNotProvisioned", err)
	}
}

// TestStartWithAuthority: the server trusts the Env's authority, the Env's
// own connection is the admin's (it provisioned the bus), and a member's own
// creds connect with that member's permissions.
func TestStartWithAuthority(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority("r"))
	if env.Authority == nil || env.Bus == nil {
		t.Fatalf("env: Authority %v, Bus %v; want both", env.Authority, env.Bus)
	}
	nc, js := env.WithCreds(env.MemberCreds(t, "r", "sandbox.sb1")).Connect(t)
	if got, want := nc.Opts.InboxPrefix, jetstream.MemberInboxPrefix("r", "sandbox", "sb1"); got != want {
		t.Errorf("the member's inbox prefix %q, want %q", got, want)
	}
	// A sandbox publishes nothing into the stream: its heartbeat key is its one stored write.
	if _, err := js.Publish(t.Context(), "$KV.sp_daemons.r.sandbox.sb1", []byte("{}")); err != nil {
		t.Errorf("the member heartbeating as itself: %v", err)
	}
}
