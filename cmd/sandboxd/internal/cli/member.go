package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/signals"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/daemon"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// errFlags wraps a flag parse error, which the flag package has printed.
var errFlags = errors.New("sandboxd: bad flags")

// memberOpts are the flags of `sandboxd member`; the guest init parses an
// identify's args with them too.
type memberOpts struct {
	conn  jetstream.ConnConfig
	run   string
	id    string
	state string
	mode  sandboxapi.Mode
	grace time.Duration
	root  string
	noCg  bool
	lease time.Duration
	level zerolog.Level
	// relay and relayUpstream configure the model relay (none without
	// relay).
	relay         string
	relayUpstream string
	// capture is the relay's capture file ("": <state>/trajectory.jsonl;
	// "none": no capture); captureTokens asks the upstream for token ids.
	capture       string
	captureTokens bool
	// translate is the API the relay translates Messages and Responses
	// calls to upstream ("chat"), "" for none.
	translate string
	// launchUser is who launches run as ("": as the daemon); launchUserFile
	// names a file that holds it when launchUser is "" (missing: none).
	launchUser     string
	launchUserFile string
	// failpoints are the --failpoint flags (see parseFailpoints).
	failpoints failpoints
}

// failpoints are the faults the --failpoint flags ask for, for the
// end-to-end tests: identity=<prefix> (daemon.Failpoints.IdentityPrefix)
// and relay-down[=<prefix>] (at a reidentify in a microVM, the model relay
// stops serving: a fork whose relay is gone; with a prefix, only in a
// fork that has a launch whose id starts with it).
type failpoints struct {
	identityPrefix  string
	relayDown       bool
	relayDownPrefix string
}

// set parses one --failpoint value.
func (f *failpoints) set(v string) error {
	switch name, arg, _ := strings.Cut(v, "="); name {
	case "identity":
		if arg == "" {
			return errors.New("--failpoint identity=<launch id prefix>: the prefix is empty")
		}
		f.identityPrefix = arg
	case "relay-down":
		f.relayDown, f.relayDownPrefix = true, arg
	default:
		return fmt.Errorf("unknown --failpoint %q (want identity=<prefix> or relay-down[=<prefix>])", v)
	}
	return nil
}

// parseMemberFlags parses the member flags; explicit values in args win
// over the environment's.
func parseMemberFlags(args []string, stderr io.Writer) (memberOpts, error) {
	fs := flag.NewFlagSet("member", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("nats-url", envOr("STILLPOINT_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL(s) (env STILLPOINT_NATS_URL)")
	creds := fs.String("creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	nkey := fs.String("nkey", os.Getenv("NATS_NKEY"), "NATS nkey seed file, e.g. the sandbox role's (env NATS_NKEY)")
	token := fs.String("token", "", "NATS token (prefer env NATS_TOKEN)")
	run := fs.String("run", os.Getenv("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	id := fs.String("id", os.Getenv("STILLPOINT_SANDBOX"), "sandbox id: the member is sandbox.<id> (env STILLPOINT_SANDBOX)")
	state := fs.String("state", "", "state directory (required)")
	modeName := fs.String("mode", "", "default pause mode: freeze, stop or hold (default: the host's best)")
	grace := fs.Duration("grace", sandboxd.DefaultGrace, "wait between SIGINT and SIGKILL on stop")
	root := fs.String("cgroup-root", "", "cgroup v2 directory for launch cgroups")
	noCg := fs.Bool("no-cgroup", false, "never use cgroups (freeze unavailable)")
	lease := fs.Duration("lease-grace", member.DefaultGrace, "lease grace after a phase's deadline")
	level := fs.String("log-level", "info", "log level (logs go to stderr)")
	relayAddr := fs.String("relay", "", "serve the model relay on this address, e.g. 127.0.0.1:"+fmt.Sprint(sandboxapi.DefaultRelayPort)+" (default: no relay)")
	launchUser := fs.String("launch-user", "", "run every launch as this user: user, uid, user:group or uid:gid, resolved in /etc/passwd and /etc/group (default: as the daemon)")
	launchUserFile := fs.String("launch-user-file", "", "a file whose first line is --launch-user's value, read when that flag is not given; a missing file names none (the owner writes it in a sandbox on an image with a user)")
	var fps failpoints
	fs.Func("failpoint", "inject a fault, for the end-to-end tests: identity=<launch id prefix> or relay-down[=<launch id prefix>] (repeatable)", fps.set)
	relayUp := fs.String("relay-upstream", "", "the relay's first upstream URL, e.g. http://10.0.2.90:8080 (default: none until a relay_repoint)")
	capture := fs.String("capture", "", "the relay's capture file of model calls (default <state>/"+trajectory.FileName+"; none: capture nothing)")
	captureTokens := fs.Bool("capture-tokens", true, "ask the model server for token ids and logprobs (return_token_ids, logprobs) and keep them in the capture")
	translate := fs.String("relay-translate", "", "chat: the relay sends Anthropic Messages and OpenAI Responses calls upstream as chat completions, and their replies back in the harness's API, so that the capture gets token ids (default: each call as it came)")
	if err := fs.Parse(args); err != nil {
		return memberOpts{}, fmt.Errorf("%w: %w", errFlags, err) // the flag package has said why
	}
	if *translate != "" && *translate != "chat" {
		return memberOpts{}, fmt.Errorf("%w: --relay-translate %q: want chat (or nothing)", errFlags, *translate)
	}
	if *token == "" {
		*token = os.Getenv("NATS_TOKEN")
	}
	mode, lvl, err := parseModeAndLevel(*modeName, *level)
	if err != nil {
		return memberOpts{}, err
	}
	return memberOpts{conn: jetstream.ConnConfig{URL: *url, CredsFile: *creds, NKeyFile: *nkey, Token: *token, Name: "sandboxd-" + *id},
		run: *run, id: *id, state: *state, mode: mode, grace: *grace, root: *root, noCg: *noCg, lease: *lease, level: lvl,
		relay: *relayAddr, relayUpstream: *relayUp, capture: *capture, captureTokens: *captureTokens, translate: *translate, failpoints: fps,
		launchUser: *launchUser, launchUserFile: *launchUserFile}, nil
}

// member runs the daemon on the bus: member sandbox.<id> of a run, serving
// the agent's launch requests, until SIGINT or SIGTERM.
func memberCmd(args []string, stdout, stderr io.Writer) int {
	o, err := parseMemberFlags(args, stderr)
	if errors.Is(err, errFlags) {
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	if o.state == "" || o.run == "" || o.id == "" {
		fmt.Fprint(stderr, "sandboxd member: --state, --run and --id are required\n"+usage)
		return 2
	}
	// In a sandbox whose processes see the host's paths (the dir provider
	// sets STILLPOINT_SANDBOX_ROOT, provider.RootEnv), the paths given are
	// inside the sandbox: under its root. Such sandboxes share their
	// owner's cgroup, and so the parent of their supervisors' cgroups, in
	// which each supervisor has one of its own.
	if r := os.Getenv("STILLPOINT_SANDBOX_ROOT"); r != "" {
		for _, p := range []*string{&o.state, &o.conn.CredsFile, &o.conn.NKeyFile, &o.launchUserFile} {
			if filepath.IsAbs(*p) {
				*p = filepath.Join(r, *p)
			}
		}
	}
	log := zerolog.New(stderr).Level(o.level).With().Timestamp().Logger()
	ctx, sigs := signals.Notify(context.Background(), nil)
	defer sigs.Stop()
	nc, err := jetstream.Connect(ctx, o.conn)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 1
	}
	// A user of its own (its creds name its member) makes no consumer,
	// reads no stream info and direct-gets only by its run's subjects: the
	// daemon's feed then catches up within those, and it opens no bus
	// (daemon.Config.NoPull).
	var own bool
	if o.conn.CredsFile != "" {
		prefix, err := jetstream.CredsInboxPrefix(o.conn.CredsFile)
		if err != nil {
			fmt.Fprintln(stderr, "sandboxd:", err)
			return 1
		}
		own = prefix != ""
	}
	var bus *jetstream.Bus
	if !own {
		if bus, err = jetstream.Open(ctx, js); err != nil {
			fmt.Fprintln(stderr, "sandboxd:", err)
			return 1
		}
	}
	supCfg := o.supervisorConfig(log)
	if supCfg.LaunchUser, err = o.resolveLaunchUser(); err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	sup, err := sandboxd.New(supCfg)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 1
	}
	rl, err := o.newRelay(log)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	// The relay listens before the daemon joins, so that relay_status
	// finds it up from the daemon's first answer.
	var ln net.Listener
	if rl != nil {
		if ln, err = rl.Listen(ctx); err != nil {
			fmt.Fprintln(stderr, "sandboxd:", err)
			return 2
		}
	}
	cfg := daemon.Config{Run: o.run, SandboxID: o.id, JS: js, Bus: bus, Supervisor: sup, Grace: o.lease, Logger: log, NoPull: own,
		Failpoints: daemon.Failpoints{IdentityPrefix: o.failpoints.identityPrefix}}
	if rl != nil {
		cfg.Relay = rl
	}
	d, err := daemon.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	var modes []string
	for _, m := range sup.Modes() {
		modes = append(modes, m.String())
	}
	line, _ := json.Marshal(map[string]any{"event": "member", "member": d.Name(), "modes": modes, "service": events.ServiceSubject(o.run, d.Name())})
	fmt.Fprintf(stdout, "%s\n", line)
	run := d.Run
	if rl != nil {
		run = func(ctx context.Context) error {
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error { return rl.Serve(gctx, ln) })
			g.Go(func() error { return d.Run(gctx) })
			return g.Wait()
		}
	}
	if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "sandboxd:", err)
		if errors.Is(err, member.ErrSuperseded) || errors.Is(err, member.ErrReplaced) {
			return 0
		}
		return 1
	}
	return 0
}

// newRelay returns the model relay the flags ask for, or nil.
func (o memberOpts) newRelay(log zerolog.Logger) (*relay.Relay, error) {
	if o.relay == "" {
		if o.relayUpstream != "" {
			return nil, errors.New("--relay-upstream needs --relay")
		}
		if o.translate != "" {
			return nil, errors.New("--relay-translate needs --relay")
		}
		return nil, nil
	}
	cfg := relay.Config{Listen: o.relay, Upstream: o.relayUpstream, Translate: o.translate == "chat", Logger: log}
	if o.capture != "none" {
		path := o.capture
		if path == "" {
			path = filepath.Join(o.state, trajectory.FileName)
		} else if r := os.Getenv("STILLPOINT_SANDBOX_ROOT"); r != "" && filepath.IsAbs(path) {
			path = filepath.Join(r, path)
		}
		rec, err := trajectory.OpenRecorder(path)
		if err != nil {
			return nil, err
		}
		cfg.Capture, cfg.Tokens = rec, o.captureTokens
	}
	rl, err := relay.New(cfg)
	if err != nil && cfg.Capture != nil {
		cfg.Capture.Close()
	}
	return rl, err
}

// supervisorConfig is the supervisor the member flags ask for.
func (o memberOpts) supervisorConfig(log zerolog.Logger) sandboxd.Config {
	return sandboxd.Config{StateDir: o.state, Mode: o.mode, Grace: o.grace, CgroupRoot: o.root, NoCgroup: o.noCg, Logger: log}
}

// resolveLaunchUser resolves --launch-user (or --launch-user-file's) in
// the sandbox's /etc/passwd and /etc/group; nil when none is named.
func (o memberOpts) resolveLaunchUser() (*sandboxd.User, error) {
	spec := o.launchUser
	if spec == "" && o.launchUserFile != "" {
		var err error
		if spec, err = sandboxd.ReadLaunchUser(o.launchUserFile); err != nil {
			return nil, fmt.Errorf("--launch-user-file: %w", err)
		}
	}
	if spec == "" {
		return nil, nil
	}
	root := "/"
	if r := os.Getenv("STILLPOINT_SANDBOX_ROOT"); r != "" {
		root = r
	}
	u, err := sandboxd.ResolveUser(spec, root)
	if err != nil {
		return nil, fmt.Errorf("--launch-user: %w", err)
	}
	return &u, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
