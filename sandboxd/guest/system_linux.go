package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// DefaultPath is the PATH of the commands the guest starts when their
// environment sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// CredsPath is where an identify's creds are written (and used with
// --creds).
const CredsPath = "/etc/stillpoint/nats.creds"

// outputWait bounds how long an exec waits, once its command has exited,
// for the rest of its output: a process it left in the background may
// hold the pipes open.
const outputWait = 2 * time.Second

// Members starts sandboxd member in the guest, and re-identifies it after a
// fork; the init of cmd/sandboxd provides it (over daemon.Resident). Each
// returns the member's name once it joined.
type Members interface {
	// Join starts the member of an identify.
	Join(ctx context.Context, req vmctl.Request) (member string, err error)
	// Rejoin re-identifies the running member in place: a new identity,
	// fresh ids, the restore's epoch (req.Epoch).
	Rejoin(ctx context.Context, req vmctl.Request) (member string, err error)
}

// SystemConfig configures a System.
type SystemConfig struct {
	// Members starts sandboxd member; required for an identify with Run.
	Members Members
	// Root is where files are written (default "/": the guest's root).
	Root string
	// Console receives a plain init's output (default: discarded).
	Console *os.File
	// Hostname sets the hostname to the sandbox id at each identify.
	Hostname bool
	// SetEnv makes an identify's Env (with PATH and HOME defaults) the
	// process's environment, which sandboxd member's launches inherit: a
	// kernel starts its init with next to none.
	SetEnv bool
	// Logger receives the system's logs.
	Logger zerolog.Logger
}

// System is the Guest of a Linux microVM whose PID 1 is sandboxd init: it
// reseeds the kernel RNG, sets the clock, writes files, starts the member
// (or a plain init) and runs commands through the process's reap loop,
// which must be running (sandboxd.HoldReaper).
type System struct {
	cfg SystemConfig
	log zerolog.Logger

	mu      sync.Mutex
	sandbox string
	run     string
	member  string
	epoch   uint64
	workdir string
	init    *sandboxd.Child
	// initExit is closed once the plain init exited.
	initExit chan struct{}
	closing  bool // Close kills the init: its exit is not news
	notify   func(vmctl.Notice)
}

// SetNotify gives the function that sends notices to the host (the
// Server's Notify): the exit of the plain init is one (vmctl.EventInit).
func (s *System) SetNotify(notify func(vmctl.Notice)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify = notify
}

// NewSystem returns the guest's System.
func NewSystem(cfg SystemConfig) *System {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	return &System{cfg: cfg, log: cfg.Logger.With().Str("component", "guest").Logger()}
}

// Hello implements Guest.
func (s *System) Hello() vmctl.Hello {
	s.mu.Lock()
	h := vmctl.Hello{Sandbox: s.sandbox, Run: s.run, Member: s.member, Epoch: s.epoch}
	if s.init != nil {
		h.InitPID = s.init.PID()
		select {
		case <-s.initExit:
			h.InitExited = true
		default:
		}
	}
	s.mu.Unlock()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.BootID = strings.TrimSpace(string(b))
	}
	if id, err := sandboxd.IdentityOf(os.Getpid()); err == nil {
		h.Identity = vmctl.Identity{PID: id.PID, Start: id.Start}
	}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) == nil {
		h.Uptime = float64(ts.Sec) + float64(ts.Nsec)/1e9
	}
	h.Wall = time.Now().UTC()
	return h
}

// Identify implements Guest: reseed, the clock, the files and the working
// directory (created if missing), then the member
// (Members.Join or Rejoin) or, with no run, the plain init of an
// identify.
func (s *System) Identify(ctx context.Context, req vmctl.Request) (vmctl.Hello, error) {
	if err := Reseed(req.Entropy); err != nil {
		return vmctl.Hello{}, err
	}
	if req.SetClock {
		if err := s.SetClock(req.Wall); err != nil {
			return vmctl.Hello{}, err
		}
	}
	if len(req.Creds) > 0 {
		req.Files = append(req.Files, vmctl.File{Path: CredsPath, Mode: 0o600, Data: req.Creds})
		req.Args = append(req.Args, "--creds", CredsPath)
	}
	if err := s.writeFiles(req.Files); err != nil {
		return vmctl.Hello{}, err
	}
	if req.Workdir != "" {
		if err := os.MkdirAll(s.dir(req.Workdir), 0o755); err != nil {
			return vmctl.Hello{}, fmt.Errorf("guest: workdir: %w", err)
		}
	}
	if s.cfg.SetEnv && req.Op == vmctl.OpIdentify {
		os.Clearenv()
		for _, kv := range Env(req.Env) {
			k, v, _ := strings.Cut(kv, "=")
			if err := os.Setenv(k, v); err != nil {
				return vmctl.Hello{}, fmt.Errorf("guest: env %s: %w", k, err)
			}
		}
	}
	if s.cfg.Hostname {
		if err := unix.Sethostname([]byte(req.Sandbox)); err != nil {
			return vmctl.Hello{}, fmt.Errorf("guest: sethostname: %w", err)
		}
	}
	var member string
	var err error
	switch {
	case req.Run != "" && s.cfg.Members == nil:
		err = errors.New("guest: this guest runs no sandboxd member")
	case req.Run != "" && req.Op == vmctl.OpIdentify:
		member, err = s.cfg.Members.Join(ctx, req)
	case req.Run != "":
		member, err = s.cfg.Members.Rejoin(ctx, req)
	case req.Op == vmctl.OpIdentify:
		err = s.startInit(req)
	}
	if err != nil {
		return vmctl.Hello{}, err
	}
	s.mu.Lock()
	s.sandbox, s.run, s.member = req.Sandbox, req.Run, member
	if req.Workdir != "" {
		s.workdir = req.Workdir
	}
	if req.Op == vmctl.OpReidentify && req.Run != "" {
		s.epoch = req.Epoch
	}
	s.mu.Unlock()
	s.log.Info().Str("op", string(req.Op)).Str("sandbox", req.Sandbox).Str("run", req.Run).Str("member", member).Msg("identified")
	return s.Hello(), nil
}

// startInit starts an identify's plain init; its exit is logged and
// reported to the host (vmctl.EventInit, Hello.InitExited).
func (s *System) startInit(req vmctl.Request) error {
	c, err := sandboxd.StartChild(sandboxd.ChildSpec{Argv: req.Init, Dir: s.dir(req.Workdir), Env: Env(req.Env),
		Files: [3]*os.File{nil, s.cfg.Console, s.cfg.Console}, Setsid: true})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.init, s.initExit = c, make(chan struct{})
	s.mu.Unlock()
	s.log.Info().Int("pid", c.PID()).Strs("argv", req.Init).Msg("init started")
	exited := s.initExit
	// This goroutine ends once the init exited (Close kills it and waits
	// for that) and the notice is written; the write waits while no host
	// is connected, so Close does not wait for it: it ends with the next
	// connection of a host, or with the machine.
	go func() {
		code, sig, _ := c.Wait(context.Background())
		why := fmt.Sprintf("exit %d", code)
		if sig != "" {
			why = "signal " + sig
		}
		s.mu.Lock()
		close(exited)
		notify := s.notify
		if s.closing {
			notify = nil
		}
		s.mu.Unlock()
		s.log.Info().Int("pid", c.PID()).Str("why", why).Msg("init exited")
		if notify != nil {
			notify(vmctl.Notice{Event: vmctl.EventInit, Why: why})
		}
	}()
	return nil
}

// Close kills the plain init, if one runs, and waits for it.
func (s *System) Close() {
	s.mu.Lock()
	c, exited := s.init, s.initExit
	s.closing = true
	s.mu.Unlock()
	if c != nil {
		c.Kill()
		<-exited
	}
}

func (s *System) dir(d string) string {
	if d == "" {
		return s.cfg.Root
	}
	return filepath.Join(s.cfg.Root, d)
}

// writeFiles writes each file under Root, parents created.
func (s *System) writeFiles(files []vmctl.File) error {
	for _, f := range files {
		p := filepath.Clean("/" + f.Path)
		if p == "/" || strings.Contains(f.Path, "\x00") {
			return fmt.Errorf("guest: file %q: not a file path", f.Path)
		}
		full := filepath.Join(s.cfg.Root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("guest: file %s: %w", p, err)
		}
		mode := os.FileMode(f.Mode & 0o7777)
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(full, f.Data, mode); err != nil {
			return fmt.Errorf("guest: file %s: %w", p, err)
		}
		if err := os.Chmod(full, mode); err != nil { // past the umask
			return fmt.Errorf("guest: file %s: %w", p, err)
		}
	}
	return nil
}

// Env returns env with PATH and HOME added where it sets none.
func Env(env []string) []string {
	out := append([]string(nil), env...)
	for _, d := range []string{"PATH=" + DefaultPath, "HOME=/root"} {
		k, _, _ := strings.Cut(d, "=")
		has := false
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				has = true
			}
		}
		if !has {
			out = append(out, d)
		}
	}
	return out
}

// Exec implements Guest: the command runs in a session of its own, in
// req.Dir (default: the identity's Workdir, else /), its output captured;
// a timeout (or the end of ctx) kills its process group.
func (s *System) Exec(ctx context.Context, req vmctl.Request) (vmctl.ExecResult, error) {
	if req.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return vmctl.ExecResult{}, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return vmctl.ExecResult{}, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return vmctl.ExecResult{}, err
	}
	s.mu.Lock()
	dir := s.workdir
	s.mu.Unlock()
	if req.Dir != "" {
		dir = req.Dir
	}
	if dir == "" {
		dir = "/"
	}
	c, err := sandboxd.StartChild(sandboxd.ChildSpec{Argv: req.Argv, Dir: s.dir(dir), Env: Env(req.Env),
		Files: [3]*os.File{inR, outW, errW}, Setsid: true})
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return vmctl.ExecResult{}, err
	}
	var wg sync.WaitGroup
	stdout, stderr := &capped{max: vmctl.MaxOutput}, &capped{max: vmctl.MaxOutput}
	wg.Go(func() {
		_, _ = inW.Write(req.Stdin)
		inW.Close()
	})
	wg.Go(func() { _, _ = io.Copy(stdout, outR) })
	wg.Go(func() { _, _ = io.Copy(stderr, errR) })
	code, sig, werr := c.Wait(ctx)
	timedOut := false
	if werr != nil {
		c.Kill()
		timedOut = errors.Is(werr, context.DeadlineExceeded)
		code, sig, _ = c.Wait(context.Background())
	}
	// The output ends when every holder of the pipes has exited; one that
	// stays in the background is not waited for past outputWait.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(outputWait):
		_ = outR.SetReadDeadline(time.Now())
		_ = errR.SetReadDeadline(time.Now())
		_ = inW.SetWriteDeadline(time.Now())
		<-done
	}
	outR.Close()
	errR.Close()
	if werr != nil && !timedOut {
		return vmctl.ExecResult{}, werr
	}
	return vmctl.ExecResult{Exit: code, Signal: sig, TimedOut: timedOut, Stdout: stdout.b.Bytes(), Stderr: stderr.b.Bytes(),
		Truncated: stdout.cut || stderr.cut}, nil
}

// capped keeps the first max bytes written to it and drops the rest, so
// that a command's output never outgrows the answer's line while the
// command, whose pipe is still read, runs to its end.
type capped struct {
	b   bytes.Buffer
	max int
	cut bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); room < len(p) {
		c.b.Write(p[:max(room, 0)])
		c.cut = true
		return len(p), nil
	}
	return c.b.Write(p)
}

// SetClock implements Guest: CLOCK_REALTIME to wall.
func (s *System) SetClock(wall time.Time) error {
	ts := unix.NsecToTimespec(wall.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("guest: set the clock: %w", err)
	}
	return nil
}

// Sync implements Guest.
func (s *System) Sync() error {
	unix.Sync()
	return nil
}
