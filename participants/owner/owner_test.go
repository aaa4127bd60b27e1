package owner

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/nosnapshot"
)

// The mode is decided at startup (PROTOCOL §6, sandbox owner).
func TestModeDecision(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	for _, tc := range []struct {
		name    string
		change  func(c *Config)
		want    Mode
		wantErr string
	}{
		{"off", func(c *Config) { c.Checkpointing = false; c.StateDir = ""; c.Workers = 8; c.JS = nil; c.Bus = nil }, ModeOff, ""},
		{"lends no sandboxes", func(c *Config) { c.LendsSandboxes = false; c.StateDir = ""; c.Workers = 8 }, ModeRestartOnly, ""},
		{"exported", func(*Config) {}, ModeExported, ""},
		{"exported without state dir", func(c *Config) { c.StateDir = "" }, 0, "Config.StateDir"},
		{"exported with two workers", func(c *Config) { c.Workers = 2 }, 0, "Config.Workers"},
		{"relative state dir", func(c *Config) { c.StateDir = "state" }, 0, "Config.StateDir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t, env, d, "o1")
			tc.change(&cfg)
			o, err := New(cfg)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New: %v, want an ErrInvalidConfig naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if o.Mode() != tc.want {
				t.Fatalf("mode %s, want %s", o.Mode(), tc.want)
			}
			if (o.Member() == nil) != (tc.want == ModeOff) {
				t.Errorf("member %v in mode %s", o.Member(), o.Mode())
			}
		})
	}

	t.Run("provider without snapshots", func(t *testing.T) {
		var logs jstest.Buffer
		cfg := baseConfig(t, env, nosnapshot.New(d), "o1")
		cfg.StateDir, cfg.Workers = "", 2 // restart_only needs neither
		cfg.Logger = zerolog.New(&logs)
		o := newOwner(t, cfg)
		if o.Mode() != ModeRestartOnly {
			t.Fatalf("mode %s", o.Mode())
		}
		var warnings []string
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, `"level":"warn"`) {
				warnings = append(warnings, line)
			}
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], `'nosnapshot'`) && !strings.Contains(warnings[0], `\"nosnapshot\"`) {
			t.Fatalf("want one warning naming the provider, got %q", warnings)
		}

		// A prepare reports the session's episode as a restart and is
		// ready; a commit exports nothing.
		start(t, o, "s1", ep("r1", 0))
		rep, err := o.Prepare(t.Context(), member.Checkpoint{Run: testRun, ID: "c1"})
		if err != nil || !rep.Ready || !slices.Equal(rep.Restarts, []string{"r1"}) {
			t.Fatalf("Prepare: %+v, %v", rep, err)
		}
		recs, err := membertest.Drain(o.Export(t.Context(), events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1"}}))
		if err != nil || len(recs) != 0 {
			t.Fatalf("Export: %v, %v", recs, err)
		}
		if err := o.Resume(t.Context(), "c1"); err != nil {
			t.Fatal(err)
		}
		if err := o.EndSession(t.Context(), "s1"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("validate names fields", func(t *testing.T) {
		_, err := New(Config{Name: "bad.name", Workers: -1, Checkpointing: true})
		for _, f := range []string{"Config.Run", "Config.Name", "Config.JS", "Config.Bus", "Config.Provider", "Config.Workers"} {
			if !strings.Contains(errString(err), f) {
				t.Errorf("error does not name %s: %v", f, err)
			}
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A session is tracked only after its setup succeeded with a JSON object
// or nothing; otherwise its sandbox is stopped.
func TestSetupFailureTracksNothing(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		for _, tc := range []struct {
			name  string
			setup SetupFunc
		}{
			{"error", func(context.Context, Execer, *Session, json.RawMessage) (json.RawMessage, error) {
				return nil, errors.New("boom")
			}},
			{"array", func(context.Context, Execer, *Session, json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`[1]`), nil
			}},
			{"string", func(context.Context, Execer, *Session, json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`"x"`), nil
			}},
			{"invalid", func(context.Context, Execer, *Session, json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`{"a":`), nil
			}},
			{"relative workdir", func(_ context.Context, _ Execer, s *Session, _ json.RawMessage) (json.RawMessage, error) {
				s.Workdir = "work"
				return nil, nil
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := baseConfig(t, env, d, "o1")
				cfg.TaskKind = TaskFuncs{SetupFn: tc.setup}
				o := newOwner(t, cfg)
				_, err := o.StartSession(t.Context(), "s1", ep("r1", 0), provider.Spec{})
				if !errors.Is(err, ErrSetup) {
					t.Fatalf("StartSession: %v, want ErrSetup", err)
				}
				if _, ok := o.Session("s1"); ok {
					t.Error("a failed session is tracked")
				}
				if _, err := o.RequireSandbox("s1"); !errors.Is(err, ErrNoSandbox) {
					t.Errorf("RequireSandbox: %v, want ErrNoSandbox", err)
				}
				if sbs := d.Sandboxes(); len(sbs) != 0 {
					t.Errorf("sandboxes left: %v", sbs)
				}
				if recs := checkpoint(t, o, "c1"); len(recs) != 0 {
					t.Errorf("exported %v", recs)
				}
			})
		}

		t.Run("close", func(t *testing.T) {
			o := newOwner(t, baseConfig(t, env, d, "o1"))
			start(t, o, "s1", ep("r1", 0))
			if _, err := o.StartSession(t.Context(), "s1", ep("r1", 0), provider.Spec{}); !errors.Is(err, ErrSessionExists) {
				t.Errorf("second start: %v", err)
			}
			for range 2 {
				if err := o.CloseSession(t.Context(), "s1"); err != nil {
					t.Fatalf("CloseSession: %v", err)
				}
			}
			if recs := checkpoint(t, o, "c-close"); len(recs) != 0 {
				t.Errorf("a closed session was exported: %v", recs)
			}
			if err := o.EndSession(t.Context(), "s1"); !errors.Is(err, ErrNoSandbox) {
				t.Errorf("EndSession of a closed session: %v", err)
			}
		})
	})
}

// While a checkpoint is open new requests wait for the resume; a request
// in flight blocks the prepare until it finishes.
func TestAdmission(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	entered, release := make(chan struct{}), make(chan struct{})
	cfg := baseConfig(t, env, d, "o1")
	cfg.TaskKind = TaskFuncs{SetupFn: func(_ context.Context, _ Execer, s *Session, _ json.RawMessage) (json.RawMessage, error) {
		if s.ID == "slow" {
			close(entered)
			<-release
		}
		return nil, nil
	}}
	o := newOwner(t, cfg)
	ctx := t.Context()

	slowErr := make(chan error, 1)
	go func() {
		_, err := o.StartSession(ctx, "slow", ep("r1", 0), provider.Spec{})
		slowErr <- err
	}()
	<-entered
	rep, err := o.Prepare(ctx, member.Checkpoint{Run: testRun, ID: "c1"})
	if err != nil || rep.Ready || !slices.Equal(rep.Blockers, []string{"slow"}) {
		t.Fatalf("Prepare with a request in flight: %+v, %v", rep, err)
	}

	// A new request waits: with a done ctx it gives up.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := o.StartSession(done, "s2", ep("r2", 0), provider.Spec{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("StartSession while closed: %v", err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := o.StartSession(ctx, "s2", ep("r2", 0), provider.Spec{})
		waiting <- err
	}()

	close(release)
	if err := <-slowErr; err != nil {
		t.Fatalf("slow start: %v", err)
	}
	rep, err = o.Prepare(ctx, member.Checkpoint{Run: testRun, ID: "c1"})
	if err != nil || !rep.Ready || rep.Counts["sessions"] != 1 {
		t.Fatalf("Prepare after the request finished: %+v, %v", rep, err)
	}
	if err := o.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("waiting start: %v", err)
	}
	for _, id := range []string{"slow", "s2"} {
		if err := o.EndSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
