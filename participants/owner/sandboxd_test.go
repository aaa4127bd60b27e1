package owner

import (
	"slices"
	"testing"

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
