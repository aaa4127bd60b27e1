package cli

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "stillpoint ") || !strings.Contains(out.String(), "protocol v1") {
		t.Errorf("version printed %q", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"no-such-command"}, {"server", "--no-such-flag"}, {"server", "--listen", "nowhere"}, {"--log-level", "loud", "server"}} {
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, ExitUsage, errb.String())
		}
		if !strings.Contains(errb.String(), "stillpoint:") {
			t.Errorf("%v: stderr %q does not say what is wrong", args, errb.String())
		}
	}
}

func TestHelpDescribesServer(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"server", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--dir", "--listen", "--cluster", "sp_records", "idempotent"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("server --help lacks %q", want)
		}
	}
}

var readyRE = regexp.MustCompile(`NATS ready at (\S+)`)

// TestServerRunsAndProvisions runs `stillpoint server` on a random port,
// checks the bus from a client, then cancels it as a signal would.
func TestServerRunsAndProvisions(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		name := "single"
		if cluster {
			name = "cluster"
		}
		t.Run(name, func(t *testing.T) {
			stdout, stderr := &jstest.Buffer{}, &jstest.Buffer{}
			g := &globals{stdout: stdout, stderr: stderr, logLevel: "warn", logFormat: "json"}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- runServer(ctx, g, serverFlags{dir: t.TempDir(), listen: "127.0.0.1:0", cluster: cluster})
			}()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("--- server stderr:\n%s", stderr.String())
				}
			})
			var url string
			poll.Wait(t, 30*time.Second, "the server to be ready", func() bool {
				if m := readyRE.FindStringSubmatch(stdout.String()); m != nil {
					url = m[1]
					return true
				}
				select {
				case err := <-done:
					t.Fatalf("server exited early: %v\n%s", err, stderr.String())
				default:
				}
				return false
			})
			nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			js, _ := natsjs.New(nc)
			bus, err := jetstream.Open(ctx, js)
			if err != nil {
				t.Fatalf("bus not provisioned: %v", err)
			}
			info, err := bus.Stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantReplicas := 1
			if cluster {
				wantReplicas = 3
			}
			if info.Config.Replicas != wantReplicas {
				t.Errorf("stream replicas %d, want %d", info.Config.Replicas, wantReplicas)
			}
			nc.Close()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("server returned %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("server did not shut down")
			}
		})
	}
}

// --model-api-translate asks the sandboxes' relays to translate, which
// --direct-model leaves out: the pair is a usage error, not a no-op.
func TestOwnerTranslateWithoutRelay(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"owner", "--run", "r1", "--direct-model", "--model-api-translate", "--sandboxd", "/bin/sh", "--harness", "/bin/sh"}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "--model-api-translate and --direct-model") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

// The owner takes its task kind by name; an unknown one is a usage error
// naming the kinds there are, and the help lists them.
func TestOwnerTaskKind(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"owner", "--run", "r1", "--task-kind", "nope", "--sandboxd", "/bin/sh", "--harness", "/bin/sh"}, &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), `--task-kind "nope": want one of command, scripted, swe`) {
		t.Errorf("unknown task kind: exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := Main([]string{"owner", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("owner --help: exit %d", code)
	}
	if !strings.Contains(out.String(), "--task-kind") || !strings.Contains(out.String(), "scripted") || !strings.Contains(out.String(), "command ") {
		t.Errorf("owner --help does not describe --task-kind:\n%s", out.String())
	}
}
