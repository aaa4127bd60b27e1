package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/daemon"
	"github.com/stillpoint/stillpoint/sandboxd/guest"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// shutdownWait bounds a clean leave of the member before a power-off.
const shutdownWait = 5 * time.Second

// initCmd is `sandboxd init`: PID 1 of a microVM sandbox (package guest).
// It boots into the root disk, then serves the control channel until the
// lease runs out, and powers off. It never returns in a VM.
func initCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	noBoot := fs.Bool("no-boot", false, "do not boot (mounts, modules, network, root switch): the root is already the sandbox's")
	port := fs.String("port", "", "the control port's device (default: the virtio port named by sp.ctl); unix:PATH, for a test, a socket whose end ends the init")
	level := fs.String("log-level", "info", "log level (logs go to the console)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd:", err)
		return 2
	}
	if os.Getpid() != 1 && !*noBoot {
		fmt.Fprintln(stderr, "sandboxd init: not PID 1; it is the init of a microVM (--no-boot to serve without booting)")
		return 2
	}
	ctx := context.Background()
	console := os.Stderr
	if !*noBoot {
		if err := guest.EarlyMounts(); err != nil {
			return fatal(stderr, err)
		}
		if c, err := openConsole(); err == nil {
			console, stdout, stderr = c, c, c
		}
	}
	// Each part names itself in its logs (component); the init's own lines
	// say "init".
	base := zerolog.New(console).Level(lvl).With().Timestamp().Logger()
	log := base.With().Str("component", "init").Logger()
	cmdline, _ := os.ReadFile("/proc/cmdline")
	boot, err := guest.ParseCmdline(string(cmdline))
	if err != nil {
		return fatal(console, err)
	}
	if !*noBoot {
		start := time.Now()
		if err := guest.Boot(ctx, boot, log); err != nil {
			return fatal(console, err)
		}
		log.Info().Dur("took", time.Since(start)).Msg("booted")
	}
	release, err := sandboxd.HoldReaper()
	if err != nil {
		return fatal(console, err)
	}
	defer release()

	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	defer wg.Wait()
	members := &vmMembers{ctx: runCtx, wg: &wg, log: base, stderr: console}
	sys := guest.NewSystem(guest.SystemConfig{Members: members, Console: console, Hostname: !*noBoot, SetEnv: !*noBoot, Logger: base})
	defer sys.Close()
	lease := guest.NewLease(boot.Lease)
	srv, err := guest.NewServer(guest.ServerConfig{Guest: sys, Lease: lease, Logger: base})
	if err != nil {
		return fatal(console, err)
	}
	members.notice = srv.Notify
	sys.SetNotify(srv.Notify)

	conn, closeConn, ends, path, err := openControl(runCtx, *port, boot.Port)
	if err != nil {
		return fatal(console, err)
	}
	defer closeConn()
	log.Info().Str("port", path).Dur("lease", boot.Lease).Msg("serving the control channel")

	expired := make(chan struct{})
	wg.Go(func() {
		if lease.Run(runCtx, func() {}) {
			close(expired)
		}
	})
	served := make(chan struct{})
	// The port is read until the machine powers off, so this goroutine is
	// not waited for (its Read ends only with the process); a test's
	// socket ends it.
	go func() {
		defer close(served)
		_ = poll.Until(runCtx, poll.Every(100*time.Millisecond), func() (bool, error) {
			if runCtx.Err() != nil {
				return true, nil
			}
			err := srv.Serve(runCtx, conn)
			if runCtx.Err() != nil || ends {
				return true, nil
			}
			log.Warn().Err(err).Msg("control channel; serving again")
			return false, nil
		})
	}()
	select {
	case <-expired:
	case <-served:
		// A test's socket closed: stop as a lease would, without powering
		// off.
		members.stop(shutdownWait)
		return 0
	}
	log.Warn().Msg("the lease ran out: powering off")
	notified := make(chan struct{})
	go func() { // a host that is gone leaves the write blocked
		srv.Notify(vmctl.Notice{Event: vmctl.EventPowerOff, Why: "lease expired"})
		close(notified)
	}()
	select {
	case <-notified:
	case <-time.After(time.Second):
	}
	members.stop(shutdownWait)
	if *noBoot {
		return 0
	}
	if err := guest.PowerOff(); err != nil {
		return fatal(console, err)
	}
	return 0
}

// openControl opens the control channel: the virtio port named name (or
// the device given), or, for a test outside a VM, a unix socket
// ("unix:PATH"), whose end also ends the init (ends); path is what was
// opened.
func openControl(ctx context.Context, given, name string) (conn io.ReadWriter, closeConn func(), ends bool, path string, err error) {
	if sock, ok := strings.CutPrefix(given, "unix:"); ok {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return nil, nil, false, "", fmt.Errorf("sandboxd init: control socket: %w", err)
		}
		return c, func() { _ = c.Close() }, true, given, nil
	}
	path = given
	if path == "" {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := poll.Until(pctx, poll.Backoff(time.Millisecond, 50*time.Millisecond), func() (bool, error) {
			p, err := guest.FindPort(name)
			path = p
			return err == nil, nil
		})
		cancel()
		if err != nil {
			return nil, nil, false, "", fmt.Errorf("sandboxd init: no control port %s", name)
		}
	}
	p, err := guest.OpenPort(ctx, path)
	if err != nil {
		return nil, nil, false, "", err
	}
	return p, func() { _ = p.Close() }, false, path, nil
}

// openConsole opens /dev/console as the init's stdin, stdout and stderr
// (an initramfs without a console node leaves them closed).
func openConsole() (*os.File, error) {
	f, err := os.OpenFile("/dev/console", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	for fd := 0; fd < 3; fd++ {
		_ = unix.Dup3(int(f.Fd()), fd, 0)
	}
	return f, nil
}

// fatal reports err and powers off: a PID 1 that exits panics the kernel
// (panic=-1 and QEMU's -no-reboot then end the VM too).
func fatal(w io.Writer, err error) int {
	fmt.Fprintln(w, "sandboxd init:", err)
	if os.Getpid() == 1 {
		_ = guest.PowerOff()
	}
	return 1
}

// vmMembers is the init's guest.Members: one daemon.Resident, made at the
// first identify with the supervisor its flags ask for, and re-identified
// by each reidentify.
type vmMembers struct {
	ctx    context.Context
	wg     *sync.WaitGroup
	log    zerolog.Logger
	stderr io.Writer
	notice func(vmctl.Notice)

	mu        sync.Mutex
	res       *daemon.Resident
	sup       *sandboxd.Supervisor
	state     string
	cancel    context.CancelFunc
	done      chan struct{}
	stopRelay context.CancelFunc // nil without a relay
	relayDone chan struct{}
}

// identity parses an identify's args as member flags, with its explicit
// fields winning.
func (v *vmMembers) identity(req vmctl.Request) (memberOpts, daemon.Identity, error) {
	o, err := parseMemberFlags(req.Args, v.stderr)
	if err != nil {
		return memberOpts{}, daemon.Identity{}, fmt.Errorf("sandboxd init: member args %q: %w", req.Args, err)
	}
	o.run, o.id, o.conn.URL, o.conn.Name = req.Run, req.Sandbox, req.NATSURL, "sandboxd-"+req.Sandbox
	if o.state == "" {
		o.state = "/var/lib/stillpoint-sandboxd"
	}
	return o, daemon.Identity{Run: o.run, SandboxID: o.id, Conn: o.conn, Grace: o.lease, AdoptEpoch: req.Epoch,
		Failpoints: daemon.Failpoints{IdentityPrefix: o.failpoints.identityPrefix}}, nil
}

// Join implements guest.Members: the supervisor and the Resident start
// here, and run until the init stops.
func (v *vmMembers) Join(ctx context.Context, req vmctl.Request) (string, error) {
	o, id, err := v.identity(req)
	if err != nil {
		return "", err
	}
	id.AdoptEpoch = 0
	v.mu.Lock()
	if v.res == nil {
		sup, err := sandboxd.New(o.supervisorConfig(v.log.Level(o.level)))
		if err != nil {
			v.mu.Unlock()
			return "", err
		}
		rl, err := o.newRelay(v.log.Level(o.level))
		if err != nil {
			v.mu.Unlock()
			return "", err
		}
		rcfg := daemon.ResidentConfig{Supervisor: sup, Logger: v.log.Level(o.level),
			Stopped: func(m events.Member, err error) {
				if v.notice != nil {
					v.notice(vmctl.Notice{Event: vmctl.EventMember, Why: fmt.Sprintf("%s stopped: %v", m, err)})
				}
			}}
		if rl != nil {
			rcfg.Relay = rl
		}
		res, err := daemon.NewResident(rcfg)
		if err != nil {
			v.mu.Unlock()
			return "", err
		}
		rctx, cancel := context.WithCancel(v.ctx)
		if rl != nil {
			// The relay lives as long as the Resident: every identity of
			// the guest (a fork's too) serves calls through it. It listens
			// before the daemon joins, so that relay_status finds it up
			// from the daemon's first answer.
			ln, err := rl.Listen(rctx)
			if err != nil {
				cancel()
				v.mu.Unlock()
				return "", err
			}
			relayCtx, stopRelay := context.WithCancel(rctx)
			relayDone := make(chan struct{})
			v.stopRelay, v.relayDone = stopRelay, relayDone
			v.wg.Go(func() {
				defer close(relayDone)
				if err := rl.Serve(relayCtx, ln); err != nil {
					v.log.Error().Err(err).Msg("the model relay stopped")
				}
			})
		}
		v.res, v.sup, v.state, v.cancel, v.done = res, sup, o.state, cancel, make(chan struct{})
		done := v.done
		v.wg.Go(func() {
			defer close(done)
			if err := res.Run(rctx); err != nil {
				v.log.Error().Err(err).Msg("the supervisor stopped")
			}
		})
	}
	res := v.res
	v.mu.Unlock()
	m, err := res.Join(ctx, id)
	return string(m), err
}

// Rejoin implements guest.Members: the running Resident takes the new
// identity in the restore's epoch.
func (v *vmMembers) Rejoin(ctx context.Context, req vmctl.Request) (string, error) {
	o, id, err := v.identity(req)
	if err != nil {
		return "", err
	}
	v.mu.Lock()
	res, sup, state := v.res, v.sup, v.state
	v.mu.Unlock()
	if res == nil {
		return "", errors.New("sandboxd init: reidentify of a guest that runs no sandboxd member")
	}
	if o.state != state {
		return "", fmt.Errorf("sandboxd init: reidentify with state %s, the supervisor's is %s", o.state, state)
	}
	if o.failpoints.relayDown && hasLaunch(sup, o.failpoints.relayDownPrefix) {
		v.mu.Lock()
		stop, done := v.stopRelay, v.relayDone
		v.mu.Unlock()
		if stop != nil {
			v.log.Warn().Msg("failpoint: the model relay stops at this reidentify")
			stop()
			<-done
		}
	}
	m, err := res.Join(ctx, id)
	return string(m), err
}

// hasLaunch tells whether sup has a launch whose id starts with prefix
// (any launch at all for "", or none at all).
func hasLaunch(sup *sandboxd.Supervisor, prefix string) bool {
	if prefix == "" {
		return true
	}
	for _, rec := range sup.List() {
		if strings.HasPrefix(rec.ID, prefix) {
			return true
		}
	}
	return false
}

// stop stops the Resident (its member leaves) and waits up to wait.
func (v *vmMembers) stop(wait time.Duration) {
	v.mu.Lock()
	cancel, done := v.cancel, v.done
	v.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case <-done:
	case <-time.After(wait):
		v.log.Warn().Msg("the member did not stop in time")
	}
}
