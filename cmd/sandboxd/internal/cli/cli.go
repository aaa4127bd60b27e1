package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/signals"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Version is the release version, set at build time with
// -ldflags "-X github.com/stillpoint/stillpoint/cmd/sandboxd/internal/cli.Version=v0.1.0".
var Version = ""

const usage = `usage:
  sandboxd modes [--cgroup-root DIR] [--no-cgroup]
  sandboxd version
  sandboxd run --state DIR [--id ID] [--mode freeze|stop|hold] [--grace D]
               [--timeout D] [--cgroup-root DIR] [--no-cgroup] [--log-level L]
               -- command [args...]
  sandboxd member --state DIR --run RUN --id SANDBOX [--nats-url URL] [--creds F | --nkey F]
               [--mode M] [--grace D] [--lease-grace D] [--cgroup-root DIR] [--no-cgroup]
  sandboxd init [--no-boot] [--port DEV] [--log-level L]

init: PID 1 of a microVM sandbox: boots into the root disk and serves the
owner's control channel (a virtio-serial port); see docs/MICROVM.md. As
/init of an initramfs (argv[0] "/init", PID 1) it runs without arguments.

member: the daemon on the bus, member sandbox.<SANDBOX> of RUN: it pauses its
launches at every checkpoint's prepare and continues them at resume, and
serves the agent's launch, status, pause, continue, stop and receipt requests
on spsvc.<RUN>.sandbox.<SANDBOX>.<endpoint>. SIGINT/SIGTERM stops it.

run: SIGUSR1 pauses the launch, SIGUSR2 continues it, SIGINT/SIGTERM stops
it (a second one kills it at once). Events are JSON lines on stdout.
`

// Main runs the command line args and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "modes":
		return modes(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, versionString())
		return 0
	case "run":
		return run(args[1:], stdout, stderr)
	case "member":
		return memberCmd(args[1:], stdout, stderr)
	case "init":
		return initCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sandboxd: unknown command %q\n%s", args[0], usage)
	return 2
}

func versionString() string {
	v, rev := Version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	return fmt.Sprintf("sandboxd %s%s %s %s/%s", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func modes(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("modes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("cgroup-root", "", "cgroup v2 directory for launch cgroups (default: <own cgroup>/"+sandboxd.CgroupSubtree+")")
	noCg := fs.Bool("no-cgroup", false, "never use cgroups")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ms, err := sandboxd.DetectModes(sandboxd.Config{CgroupRoot: *root, NoCgroup: *noCg})
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 1
	}
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.String()
	}
	fmt.Fprintln(stdout, strings.Join(names, " "))
	return 0
}

// printer writes one JSON object per line.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) print(event string, v any, err error) {
	m := map[string]any{"event": event, "data": v}
	if err != nil {
		m["error"] = err.Error()
	}
	b, _ := json.Marshal(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s\n", b)
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "state directory (required)")
	id := fs.String("id", "", "launch id (default run-<unix ms>)")
	modeName := fs.String("mode", "", "pause mode: freeze, stop or hold (default: the host's best)")
	grace := fs.Duration("grace", sandboxd.DefaultGrace, "wait between SIGINT and SIGKILL on stop")
	timeout := fs.Duration("timeout", 0, "the launch's time budget, paused time excluded (0: none)")
	root := fs.String("cgroup-root", "", "cgroup v2 directory for launch cgroups")
	noCg := fs.Bool("no-cgroup", false, "never use cgroups (freeze unavailable)")
	level := fs.String("log-level", "info", "log level (logs go to stderr)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *state == "" || fs.NArg() == 0 {
		fmt.Fprint(stderr, "sandboxd run: --state and a command are required\n"+usage)
		return 2
	}
	mode, lvl, err := parseModeAndLevel(*modeName, *level)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	if *id == "" {
		*id = "run-" + strconv.FormatInt(time.Now().UnixMilli(), 10)
	}
	sup, err := sandboxd.New(sandboxd.Config{
		StateDir: *state, Mode: mode, Grace: *grace, CgroupRoot: *root, NoCgroup: *noCg,
		Logger: zerolog.New(stderr).Level(lvl).With().Timestamp().Logger(),
	})
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 1
	}
	return serve(sup, sandboxd.Spec{ID: *id, Argv: fs.Args(), Timeout: *timeout, Mode: mode}, &printer{w: stdout})
}

// serve runs the supervisor, launches spec and handles signals until the
// launch has ended; every goroutine it starts ends before it returns.
func serve(sup *sandboxd.Supervisor, spec sandboxd.Spec, out *printer) int {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	// The signals reach the loop below one at a time, in the order they
	// came: the first SIGINT or SIGTERM (stopAsked) stops the launch, a
	// later one cancels it; SIGUSR1 pauses it, SIGUSR2 continues it.
	sigs := make(chan os.Signal, 4)
	forward := func(sig os.Signal) {
		select {
		case sigs <- sig:
		default:
		}
	}
	stopAsked, handler := signals.Notify(context.Background(), forward)
	defer handler.Stop()
	defer signals.On(syscall.SIGUSR1, func() { forward(syscall.SIGUSR1) })()
	defer signals.On(syscall.SIGUSR2, func() { forward(syscall.SIGUSR2) })()
	stop := stopAsked.Done()

	runErr := make(chan error, 1)
	wg.Go(func() { runErr <- sup.Run(ctx) })

	rec, err := sup.Launch(ctx, spec)
	if err != nil {
		out.print("launched", nil, err)
		return 1
	}
	out.print("launched", rec, nil)
	ended := make(chan sandboxapi.Receipt, 1)
	wg.Go(func() {
		r, err := sup.Wait(ctx, spec.ID)
		if err != nil && !errors.Is(err, sandboxd.ErrKillUnconfirmed) {
			r = sandboxapi.Receipt{ID: spec.ID, ExitCode: -1, Error: err.Error()}
		}
		ended <- r
	})
	for {
		select {
		case r := <-ended:
			out.print("ended", r, nil)
			switch {
			case r.ExitCode >= 0:
				return r.ExitCode
			case r.Signal != "":
				if n := signalNumber(r.Signal); n > 0 {
					return 128 + n
				}
			}
			return 1
		case err := <-runErr:
			out.print("supervisor", nil, err)
			return 1
		case <-stop:
			stop = nil
			wg.Go(func() { _, _ = sup.Stop(ctx, spec.ID) })
		case sig := <-sigs:
			switch sig {
			case syscall.SIGUSR1:
				rep, err := sup.Pause(ctx, spec.ID, sandboxapi.ModeDefault)
				out.print("pause", rep, err)
			case syscall.SIGUSR2:
				rep, err := sup.Continue(ctx, spec.ID)
				out.print("continue", rep, err)
			default:
				wg.Go(func() { _, _ = sup.Cancel(ctx, spec.ID) })
			}
		}
	}
}

func signalNumber(name string) int { return int(unix.SignalNum(name)) }

// parseModeAndLevel reads the --mode and --log-level flags every command
// that runs a supervisor takes.
func parseModeAndLevel(mode, level string) (sandboxapi.Mode, zerolog.Level, error) {
	m, err := sandboxapi.ParseMode(mode)
	if err != nil {
		return 0, 0, err
	}
	lvl, err := zerolog.ParseLevel(level)
	return m, lvl, err
}
