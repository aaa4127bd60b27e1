package owner

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// TestSandboxdSpecCredentials: a .creds file goes in as --creds, an nkey
// seed (the sandbox role's) as --nkey, each copied in readable by root only.
func TestSandboxdSpecCredentials(t *testing.T) {
	for _, tc := range []struct {
		cfg        SandboxdConfig
		flag, path string
	}{
		{SandboxdConfig{CredsFile: "/host/sb.creds"}, "--creds", "etc/stillpoint/nats.creds"},
		{SandboxdConfig{NKeyFile: "/host/auth/sandbox.nk"}, "--nkey", "etc/stillpoint/nats.nk"},
	} {
		tc.cfg.Binary, tc.cfg.NATSURL, tc.cfg.Run = "/host/sandboxd", "nats://127.0.0.1:4222", "run1"
		spec := SandboxdSpec(provider.Spec{ID: "sb1"}, tc.cfg)
		i := slices.Index(spec.Init, tc.flag)
		if i < 0 || i+1 >= len(spec.Init) || spec.Init[i+1] != "/"+tc.path {
			t.Errorf("init %v: want %s /%s", spec.Init, tc.flag, tc.path)
		}
		host := tc.cfg.CredsFile + tc.cfg.NKeyFile
		if !slices.Contains(spec.CopyIn, provider.CopyIn{HostPath: host, SandboxPath: tc.path, Mode: 0o600}) {
			t.Errorf("copy-ins %+v lack %s at %s, mode 0600", spec.CopyIn, host, tc.path)
		}
	}
}

// TestSandboxdSpecBinds: the config's binds go into every spec, beside the
// bound binaries directory.
func TestSandboxdSpecBinds(t *testing.T) {
	oc := provider.Bind{HostDir: "/host/opencode", SandboxDir: "opt/stillpoint/opencode"}
	cfg := SandboxdConfig{Binary: "/host/bin/sandboxd", BinDir: "/host/bin", Run: "run1", Binds: []provider.Bind{oc}}
	spec := SandboxdSpec(provider.Spec{ID: "sb1"}, cfg)
	want := []provider.Bind{{HostDir: "/host/bin", SandboxDir: BinDir[1:]}, oc}
	if !slices.Equal(spec.Binds, want) {
		t.Fatalf("binds %+v, want %+v", spec.Binds, want)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestSandboxCredsOfTheirOwn: with SandboxCreds each sandbox (and each
// fork) gets a user of its own, named after it, with a short expiry, in a
// host directory shown read-only at /etc/stillpoint/creds; a renewal
// writes a later expiry (into the sandbox's copy too when the provider
// copies binds), and the credentials of a gone sandbox go once expired.
func TestSandboxCredsOfTheirOwn(t *testing.T) {
	auth, err := embedded.LoadAuthority(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.AddRun("run1"); err != nil {
		t.Fatal(err)
	}
	signerFile := filepath.Join(t.TempDir(), "sandbox-signer.json")
	if err := auth.WriteSigner("run1", events.KindSandbox, signerFile); err != nil {
		t.Fatal(err)
	}
	signer, err := embedded.LoadSigner(signerFile)
	if err != nil {
		t.Fatal(err)
	}
	c := &SandboxCreds{Minter: signer, Run: "run1", Dir: filepath.Join(t.TempDir(), "creds"), TTL: time.Minute}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if err := (&SandboxCreds{Minter: signer, Run: "Run1", Dir: c.Dir}).Check(); !errors.Is(err, embedded.ErrNotMember) {
		t.Errorf("an upper-case run: %v, want ErrNotMember", err)
	}
	claims := func(path string) *jwt.UserClaims {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		token, err := jwt.ParseDecoratedJWT(b)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil {
			t.Fatal(err)
		}
		return uc
	}
	spec := SandboxdSpec(provider.Spec{ID: "sb1"}, SandboxdConfig{Binary: "/host/sandboxd", NATSURL: "nats://127.0.0.1:4222", Run: "run1", Creds: c})
	if i := slices.Index(spec.Init, "--creds"); i < 0 || spec.Init[i+1] != "/etc/stillpoint/creds/nats.creds" {
		t.Errorf("init %v: want --creds /etc/stillpoint/creds/nats.creds", spec.Init)
	}
	host := filepath.Join(c.Dir, "sb1")
	if !slices.Contains(spec.Binds, provider.Bind{HostDir: host, SandboxDir: "etc/stillpoint/creds"}) {
		t.Errorf("binds %+v lack %s at etc/stillpoint/creds", spec.Binds, host)
	}
	first := claims(filepath.Join(host, "nats.creds"))
	if first.Name != "sb1" || first.Expires == 0 || time.Until(time.Unix(first.Expires, 0)) > time.Minute {
		t.Errorf("sandbox user %q expires %d: want sb1 within a minute", first.Name, first.Expires)
	}

	copied := t.TempDir() // a dir provider's sandbox root, with its copy of the bind
	if err := os.MkdirAll(filepath.Join(copied, "etc/stillpoint/creds"), 0o755); err != nil {
		t.Fatal(err)
	}
	SandboxdSpec(provider.Spec{ID: "sb2"}, SandboxdConfig{Binary: "/host/sandboxd", Run: "run1", Creds: c})
	SandboxdSpec(provider.Spec{ID: "gone"}, SandboxdConfig{Binary: "/host/sandboxd", Run: "run1", Creds: c})
	later := time.Now().Add(30 * time.Second)
	c.renewOnce(zerolog.Nop(), []*provider.Sandbox{{ID: "sb1", ProcRoot: "/"}, {ID: "sb2", Root: copied, ProcRoot: copied}}, later)
	if got := claims(filepath.Join(host, "nats.creds")); got.Expires <= first.Expires {
		t.Errorf("renewed expiry %d, want later than %d", got.Expires, first.Expires)
	}
	if got := claims(filepath.Join(copied, "etc/stillpoint/creds/nats.creds")); got.Name != "sb2" {
		t.Errorf("the copy in a dir sandbox names %q, want sb2", got.Name)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "gone")); err != nil {
		t.Errorf("credentials of a sandbox not yet listed were removed before they expired: %v", err)
	}
	c.renewOnce(zerolog.Nop(), []*provider.Sandbox{{ID: "sb1", ProcRoot: "/"}}, time.Now().Add(2*time.Minute))
	if _, err := os.Stat(filepath.Join(c.Dir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("credentials of a gone sandbox: %v, want removed once expired", err)
	}
}
