//go:build linux

package microvm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/boxes"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/snapstore"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// Defaults of Config.
const (
	// DefaultMemMiB is a guest's RAM.
	DefaultMemMiB = 256
	// DefaultSandboxLease is how long a guest runs on without a renewal
	// from its owner before it powers itself off.
	DefaultSandboxLease = 60 * time.Second
	// DefaultBaseSize is the size of the guest root image (sparse).
	DefaultBaseSize = 1 << 30
	// DefaultVMStartTimeout bounds a boot (of a template) and a fork.
	DefaultVMStartTimeout = 3 * time.Minute
)

// DefaultHostTools are the host programs the default root tree holds
// beside busybox: util-linux's setsid, whose -w (wait for the program) the
// harnesses' tools use and busybox's lacks, and dash as /bin/sh, since
// busybox's shell runs its own applets before any program on PATH.
var DefaultHostTools = []string{"setsid", "/bin/sh=dash"}

// Config configures the microvm provider.
type Config struct {
	// StateDir holds sandboxes/, snapshots/ and layers/ (the qcow2 images
	// of the sandboxes' disks). Required.
	StateDir string
	// CacheDir holds what providers may share and keep: the initramfs,
	// the root and harness images, the warm templates, the accelerator
	// probe's answer. Default <StateDir>/cache.
	CacheDir string
	// PruneCache makes New remove what the cache no longer needs
	// (pruneCache: templates beyond the PruneKeep most recently used and
	// unused for PruneUnused, the images only they needed). The default
	// cache is always pruned; a shared one only when set. What the
	// sandboxes and snapshots of any state directory that used the cache
	// (and still exists) stand on is kept.
	PruneCache bool
	// Sandboxd is the host path of the static sandboxd, the guests' init.
	// Required to start sandboxes (a provider without it only stops what
	// an earlier process left).
	Sandboxd string
	// AssetsDir holds the guest kernel (make microvm-assets); default: the
	// cache directories qemu.FindAssets looks in.
	AssetsDir string
	// BaseDir is the directory the guests' root image is built from (once,
	// cached by content); default: a minimal tree of busybox applets and
	// HostTools.
	BaseDir string
	// Images makes the merged tree of a Spec.Image, whose root disk the
	// provider builds once per digest: the owner's image cache. Nil
	// refuses a spec with an Image.
	Images RootfsMaker
	// HostTools are host programs (looked up on PATH) copied into the
	// default root tree, with the shared libraries they load, over
	// busybox's applets: "PROG" at its host path, "PATH=PROG" at PATH.
	// Default DefaultHostTools.
	HostTools []string
	// HostLibraries are host programs whose shared libraries (not the
	// programs) go into the default root tree at their host paths: for a
	// program a bind shows on the harness disk, such as OpenCode.
	HostLibraries []string
	// BaseSize is the root image's size in bytes; default DefaultBaseSize.
	BaseSize int64
	// MemMiB is each guest's RAM; default DefaultMemMiB.
	MemMiB int
	// CPU is the guests' CPU model under TCG (default qemu64; "max" for
	// binaries that need newer instructions, such as OpenCode's).
	CPU string
	// Accel is "auto" (the default: KVM when a probe guest runs at speed
	// under it, else TCG), "kvm" or "tcg".
	Accel string
	// Lease is how long a guest runs without a renewal from this process
	// (renewed every third of it); default DefaultSandboxLease.
	Lease time.Duration
	// Upstream, when set, is the host address (host:port) of the model
	// upstream that guests reach at qemu.GuestUpstream.
	Upstream string
	// StartTimeout bounds a template's boot and a fork; default
	// DefaultVMStartTimeout.
	StartTimeout time.Duration
	// StopTimeout bounds each wait of a teardown; default DefaultStopTimeout.
	StopTimeout time.Duration
	// FullCopy keeps a snapshot's RAM in its state file, which a fork
	// reads in full before it runs (the design before RAM files, kept for
	// comparison: BenchmarkMicroVM's pause/pause-before). By default a
	// snapshot's RAM goes to a RAM file of its own that its forks map
	// copy-on-write, reading a page only when they touch it.
	FullCopy bool
	// Logger receives the provider's and the guests' log lines.
	Logger zerolog.Logger
}

func (c *Config) setDefaults() {
	if c.BaseSize == 0 {
		c.BaseSize = DefaultBaseSize
	}
	if c.CacheDir == "" && c.StateDir != "" {
		c.CacheDir = filepath.Join(c.StateDir, "cache")
	}
	if c.MemMiB == 0 {
		c.MemMiB = DefaultMemMiB
	}
	if c.HostTools == nil {
		c.HostTools = DefaultHostTools
	}
	if c.Accel == "" {
		c.Accel = "auto"
	}
	if c.Lease == 0 {
		c.Lease = DefaultSandboxLease
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultVMStartTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = provider.DefaultStopTimeout
	}
}

// Validate checks the config; the errors, joined, wrap ErrInvalid and name
// the field.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"StateDir", c.StateDir}, {"Sandboxd", c.Sandboxd}, {"BaseDir", c.BaseDir}, {"AssetsDir", c.AssetsDir}, {"CacheDir", c.CacheDir}} {
		switch {
		case f.v == "" && f.name == "StateDir":
			errs = append(errs, provider.InvalidField(f.name, "missing"))
		case f.v != "" && !filepath.IsAbs(f.v):
			errs = append(errs, provider.InvalidField(f.name, "%q is not absolute", f.v))
		case strings.ContainsAny(f.v, ", \n"):
			errs = append(errs, provider.InvalidField(f.name, "%q holds a comma, space or newline (QEMU's option syntax)", f.v))
		}
	}
	if !slices.Contains([]string{"auto", "kvm", "tcg"}, c.Accel) {
		errs = append(errs, provider.InvalidField("Accel", "%q: want auto, kvm or tcg", c.Accel))
	}
	if c.MemMiB < 64 {
		errs = append(errs, provider.InvalidField("MemMiB", "%d: at least 64", c.MemMiB))
	}
	if c.Lease < 3*time.Second {
		errs = append(errs, provider.InvalidField("Lease", "%s: at least 3s", c.Lease))
	}
	if c.Upstream != "" {
		if err := checkHostPort(c.Upstream); err != nil {
			errs = append(errs, provider.InvalidField("Upstream", "%q: %v", c.Upstream, err))
		}
	}
	if c.BaseSize < 16<<20 {
		errs = append(errs, provider.InvalidField("BaseSize", "%d: at least 16 MiB", c.BaseSize))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"StartTimeout", c.StartTimeout}, {"StopTimeout", c.StopTimeout}} {
		if d.v < 0 {
			errs = append(errs, provider.InvalidField(d.name, "negative"))
		}
	}
	return errors.Join(errs...)
}

// Provider runs each sandbox as a QEMU microVM whose snapshots keep its
// processes: RAM, devices and disk at one instant (docs/MICROVM.md). A
// sandbox starts as a fork of a warm template (booted once per root and
// harness image), is told its identity over the control channel, and
// renews a lease there so that it powers itself off when this process is
// gone. Its methods are safe for concurrent use.
type Provider struct {
	cfg    Config
	bounds provider.Bounds
	assets qemu.Assets
	accel  string
	tscKHz int64
	reason string
	log    zerolog.Logger

	snaps  *snapstore.Store
	boxes  *boxes.Registry[*vmBox]
	layers string // <state>/layers
	cache  string // <state>/cache
	socks  string // the sockets' directory (short: unix socket paths are limited)
	// cgroups holds a cgroup for each QEMU of this state directory
	// (vmCgroup); "" where there is no cgroup v2 to make them in.
	cgroups cgroup.Dir
	// sockMu is held shared from making the sockets' directory until a
	// QEMU has made its sockets in it, and exclusively to remove the
	// directory once empty.
	sockMu sync.RWMutex
	// ramUsers counts the QEMUs of this process that map each snapshot's
	// RAM file (DeleteSnapshot's advice is for those alone).
	ramMu    sync.Mutex
	ramUsers map[string]int

	initrdKey string

	imgMu  sync.Mutex
	base   string            // the root image, once built
	staged map[string]string // harness images of staged files, by what they hold

	gcMu      sync.Mutex
	tmplMu    sync.Mutex
	templates map[string]*template
}

// vmBox is one sandbox.
type vmBox struct {
	boxes.State
	vm *machine // nil for a sandbox an earlier process left
}

func newVMBox() *vmBox { return &vmBox{} }

// New checks the config and what the provider needs (QEMU, qemu-img,
// busybox-static, mkfs.ext4, the guest kernel of make microvm-assets),
// picks the accelerator, and creates the state directories. Errors name
// the package or make target that provides what is missing.
func New(cfg Config) (*Provider, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(cfg.Sandboxd); cfg.Sandboxd != "" && (err != nil || !fi.Mode().IsRegular()) {
		return nil, provider.InvalidField("Sandboxd", "%s is not a file (build it: CGO_ENABLED=0 go build ./cmd/sandboxd)", cfg.Sandboxd)
	}
	assets, err := qemu.FindAssets(cfg.AssetsDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errors.ErrUnsupported, err)
	}
	khz, err := qemu.HostTSCKHz()
	if err != nil {
		return nil, err
	}
	m := &Provider{cfg: cfg, bounds: microvmBounds(cfg.MemMiB), assets: assets, tscKHz: khz, log: cfg.Logger, ramUsers: map[string]int{},
		layers: filepath.Join(cfg.StateDir, "layers"), cache: cfg.CacheDir,
		boxes: boxes.NewRegistry[*vmBox](cfg.StateDir), templates: map[string]*template{}, staged: map[string]string{}}
	for _, d := range []string{filepath.Join(cfg.StateDir, "sandboxes"), m.layers, m.cache} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	m.socks = socketDir(cfg.StateDir)
	if mnt, err := cgroup.Mount(); err == nil {
		m.cgroups = cgroup.Dir(mnt).Child("stillpoint-vms").Child(shortHash(filepath.Clean(cfg.StateDir)))
	} else {
		m.log.Warn().Err(err).Msg("microvm: no cgroup v2: a guestfwd relay (in a session of its own) may outlive its QEMU")
	}
	if m.snaps, err = snapstore.New(filepath.Join(cfg.StateDir, "snapshots")); err != nil {
		return nil, err
	}
	if err := m.registerCacheUser(); err != nil {
		return nil, err
	}
	if err := m.reapTemplateLeftovers(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StartTimeout)
	defer cancel()
	if cfg.Sandboxd == "" {
		// It only stops what an earlier process left: no guest to boot.
		m.accel, m.reason = "none", "no sandboxd: stops what an earlier process left, starts nothing"
		return m, nil
	}
	if err := m.buildInitrd(ctx); err != nil {
		return nil, err
	}
	if cfg.PruneCache || filepath.Clean(cfg.CacheDir) == filepath.Join(cfg.StateDir, "cache") {
		if err := m.pruneCache(); err != nil {
			m.log.Warn().Err(err).Str("cache", m.cache).Msg("microvm: pruning the cache")
		}
	}
	m.accel, m.reason, err = qemu.PickAccel(ctx, assets, cfg.Accel, m.cache, khz)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// socketDir returns a directory for the VMs' unix sockets: <state>/s when
// its paths leave room under the 108 bytes of a socket address, else one
// under /tmp named for the state directory. It is made when a VM starts
// and removed when its last socket goes.
func socketDir(state string) string {
	d := filepath.Join(state, "s")
	if len(d) > 60 {
		d = filepath.Join(os.TempDir(), "stillpoint-vm-"+shortHash(filepath.Clean(state)))
	}
	return d
}

// removeSockets removes sandbox id's sockets, and their directory once it
// is empty.
func (m *Provider) removeSockets(id string) error {
	m.sockMu.Lock()
	defer m.sockMu.Unlock()
	var errs []error
	for _, s := range []string{m.sock(id, "q"), m.sock(id, "c"), m.sock(id, "m")} {
		if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(m.socks); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Name returns "microvm".
func (m *Provider) Name() string { return "microvm" }

// Bounds are what the machine bears: a guest booting (a template's RAM
// restored, sandboxd connecting) keeps a core busy under TCG, so one start
// per core; and the guests' RAM, with QEMU's own, within three quarters
// of the memory available when the provider was made.
func (m *Provider) Bounds() provider.Bounds { return m.bounds }

// microvmBounds computes Bounds for guests of memMiB each.
func microvmBounds(memMiB int) provider.Bounds {
	b := provider.Bounds{Starting: max(1, runtime.NumCPU())}
	if avail := memAvailableMiB(); avail > 0 {
		b.Live = max(1, avail*3/4/(memMiB+microvmOverheadMiB))
	}
	return b
}

// microvmOverheadMiB is what a guest's QEMU process holds beside the
// guest's RAM (its own code, the device models, the TCG code cache).
const microvmOverheadMiB = 96

// memAvailableMiB reads MemAvailable from /proc/meminfo (0 if it cannot).
func memAvailableMiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}

// Caps reports snapshots that keep the sandbox's processes; after a fork
// the guest's clocks continue from the snapshot's instant, and the
// provider can set the guest's wall clock to the host's.
func (m *Provider) Caps() provider.Caps {
	return provider.Caps{Snapshot: true, KeepsProcesses: true, Clock: provider.ClockContinuous, SetsClock: true}
}

// Reason says which accelerator the provider uses and why.
func (m *Provider) Reason() string { return m.reason }

// Config returns the config with its defaults filled in.
func (m *Provider) Config() Config { return m.cfg }

// Accel returns the accelerator in use: "kvm" or "tcg".
func (m *Provider) Accel() string { return m.accel }

// Start starts spec.ID as a fork of the warm template of its images and
// identifies it: its sandboxd member joins the run.
func (m *Provider) Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error) {
	return m.start(ctx, spec, "")
}

// Fork starts spec.ID from snapshotID: the snapshot's RAM, devices and
// disk, its processes running on; the guest's sandboxd is re-identified as
// spec.ID and moves to spec.Epoch.
func (m *Provider) Fork(ctx context.Context, snapshotID string, spec provider.Spec) (*provider.Sandbox, error) {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return nil, err
	}
	return m.start(ctx, spec, snapshotID)
}

func (m *Provider) start(ctx context.Context, spec provider.Spec, snapshotID string) (*provider.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if m.cfg.Sandboxd == "" {
		return nil, provider.InvalidField("Sandboxd", "missing: the provider cannot start guests without the static sandboxd")
	}
	id, err := m.identity(spec)
	if err != nil {
		return nil, err
	}
	return m.boxes.Start(spec, newVMBox, nil, func(box *vmBox) error {
		ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
		defer cancel()
		vm, err := m.launch(ctx, spec, id, snapshotID)
		if vm != nil {
			box.vm = vm
		}
		if err != nil {
			return err
		}
		box.Env = id.Env
		box.Sandbox = provider.Sandbox{ID: spec.ID, Workdir: id.Workdir, ProcRoot: "/", InitPID: vm.pid}
		return nil
	}, m.teardownAfterStart)
}

// identity turns a spec into the guest's identify request. A spec whose
// Init is `sandboxd member ...` (owner.SandboxdSpec) gives the member's
// flags: the guest runs its sandboxd as that member. Any other Init is
// the sandbox's first process (default: one that sleeps).
func (m *Provider) identity(spec provider.Spec) (vmctl.Request, error) {
	var r vmctl.Request
	r.Sandbox = spec.ID
	if len(spec.Init) >= 2 && path.Base(spec.Init[0]) == "sandboxd" && spec.Init[1] == "member" {
		r.Args = slices.Clone(spec.Init[2:])
		for i := 0; i+1 < len(r.Args); i++ {
			switch r.Args[i] {
			case "--run":
				r.Run = r.Args[i+1]
			case "--nats-url":
				r.NATSURL = r.Args[i+1]
			}
		}
		if r.Run == "" || r.NATSURL == "" {
			return r, provider.InvalidField("spec.Init", "%q: --run and --nats-url are required", spec.Init)
		}
	} else {
		r.Init = slices.Clone(spec.Init)
		if len(r.Init) == 0 {
			r.Init = []string{"sleep", "2147483647"}
		}
	}
	r.Workdir = "/"
	if spec.Workdir != "" {
		r.Workdir, _ = provider.CleanAbs("", spec.Workdir)
	}
	r.Env = provider.WithDefaults(spec.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:"+BinDirInGuest, "HOME=/root")
	for _, p := range slices.Sorted(maps.Keys(spec.Files)) {
		rel, _ := provider.CleanRel("", p)
		r.Files = append(r.Files, vmctl.File{Path: "/" + rel, Mode: 0o644, Data: spec.Files[p]})
	}
	for i, c := range spec.CopyIn {
		root := BinDirInGuest
		if harnessMount(spec.Binds) != "" {
			root = HarnessRootInGuest
		}
		if rel, _ := provider.CleanRel("", c.SandboxPath); strings.HasPrefix("/"+rel+"/", root+"/") {
			continue // on the harness disk (harnessImage)
		}
		b, err := os.ReadFile(c.HostPath)
		if err != nil {
			return r, provider.InvalidField(fmt.Sprintf("spec.CopyIn[%d].HostPath", i), "%v", err)
		}
		mode := c.Mode
		if mode == 0 {
			if fi, err := os.Stat(c.HostPath); err == nil {
				mode = uint32(fi.Mode().Perm())
			}
		}
		rel, _ := provider.CleanRel("", c.SandboxPath)
		r.Files = append(r.Files, vmctl.File{Path: "/" + rel, Mode: mode, Data: b})
	}
	seen := map[string]bool{}
	for i, b := range spec.Binds {
		rel, _ := provider.CleanRel("", b.SandboxDir)
		if !strings.HasPrefix("/"+rel+"/", HarnessRootInGuest+"/") || "/"+rel == HarnessRootInGuest {
			return r, provider.InvalidField(fmt.Sprintf("spec.Binds[%d]", i), "%s: a microVM shows host directories only below %s (its read-only harness disk)", b.SandboxDir, HarnessRootInGuest)
		}
		for p := range seen {
			if strings.HasPrefix("/"+rel+"/", p+"/") || strings.HasPrefix(p+"/", "/"+rel+"/") {
				return r, provider.InvalidField(fmt.Sprintf("spec.Binds[%d]", i), "%s overlaps %s", "/"+rel, p)
			}
		}
		seen["/"+rel] = true
	}
	return r, nil
}

// BinDirInGuest is where a microVM shows its read-only harness disk, the
// one host directory of Spec.Binds (owner.BinDir).
const BinDirInGuest = "/opt/stillpoint/bin"

// HarnessRootInGuest is where a microVM mounts its harness disk when Spec.Binds
// names directories other than BinDirInGuest (OpenCode's beside it): the disk
// then holds each bound directory at its place below this root.
const HarnessRootInGuest = "/opt/stillpoint"

// Stop kills the sandbox's VM (SIGKILL: the guest's disk is a qcow2 layer
// only this sandbox writes, so nothing of it needs a clean shutdown),
// reaps QEMU, removes its disk layers no snapshot holds, its sockets and
// directory, and checks that none of it is left. It also stops a VM an
// earlier process left in the state directory. Nothing is removed before
// QEMU is confirmed gone, so a Stop that fails (ErrLeftover: QEMU did not
// exit within StopTimeout or before ctx ended) may be called again.
func (m *Provider) Stop(ctx context.Context, id string) error {
	return m.boxes.Stop(id, newVMBox, func(id string, box *vmBox) error { return m.teardown(ctx, id, box) })
}

// teardownAfterStart is the teardown of a start that failed.
func (m *Provider) teardownAfterStart(id string, box *vmBox) error {
	return m.teardown(context.Background(), id, box)
}

// teardown stops the sandbox's QEMU and, once it is gone, removes the
// rest: while a QEMU may still run, its vm.json is the only record of it,
// so it stays.
func (m *Provider) teardown(ctx context.Context, id string, box *vmBox) error {
	dir := m.boxes.Dir(id)
	if box.vm != nil {
		if err := box.vm.stop(ctx, m.cfg.StopTimeout); err != nil {
			return err
		}
	} else if meta, err := vmFile(dir).Read(); err == nil {
		if err := killLeftover(meta, m.cfg.StopTimeout); err != nil {
			return err
		}
	}
	if err := m.clearVMCgroup(ctx, id); err != nil {
		return err
	}
	var errs []error
	errs = append(errs, m.removeSockets(id))
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, m.gc())
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: directory %s", provider.ErrLeftover, dir))
	}
	return errors.Join(errs...)
}

// InitExited tells whether the init of sandbox id (in the guest, or its
// VM) has exited; a sandbox this process did not start: false.
func (m *Provider) InitExited(id string) bool {
	box, err := m.boxes.Get(id)
	if err != nil || box.vm == nil {
		return false
	}
	return box.vm.initExited.Load() || box.vm.gone()
}

// Exec runs argv in the guest through the control channel and waits for
// it; when ctx has a deadline, the guest kills the command at it. Output
// beyond vmctl.MaxOutput bytes a stream is cut: the result comes with an
// error wrapping qemu.ErrOutputTruncated.
func (m *Provider) Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateExec(argv, opts)); err != nil {
		return provider.ExecResult{}, err
	}
	box, sb, env, err := m.boxes.Ready(id)
	if err != nil {
		return provider.ExecResult{}, err
	}
	if opts.Dir == "" {
		opts.Dir = sb.Workdir
	}
	vm := box.vm
	if vm == nil {
		return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q was left by an earlier process", provider.ErrNotFound, id)
	}
	if vm.initExited.Load() {
		return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q: its init exited in the guest", provider.ErrExited, id)
	}
	req := vmctl.Request{Op: vmctl.OpExec, Argv: argv, Dir: opts.Dir, Env: append(slices.Clone(env), opts.Env...)}
	if opts.Stdin != nil {
		if req.Stdin, err = io.ReadAll(opts.Stdin); err != nil {
			return provider.ExecResult{}, err
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMS = max(time.Until(dl).Milliseconds(), 1)
	}
	resp, err := vm.call(ctx, req)
	if err != nil {
		if vm.gone() {
			return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q: its VM exited", provider.ErrExited, id)
		}
		return provider.ExecResult{}, err
	}
	if resp.ExecResult == nil {
		return provider.ExecResult{}, fmt.Errorf("%w: exec: no result in the answer", qemu.ErrGuest)
	}
	res := provider.ExecResult{Stdout: resp.Stdout, Stderr: resp.Stderr, ExitCode: resp.Exit}
	if resp.Signal != "" || resp.Exit < 0 {
		res.ExitCode = 128 + int(signalNum(resp.Signal))
	}
	if resp.Truncated {
		return res, fmt.Errorf("%w: %s: more than %d bytes of stdout or stderr", qemu.ErrOutputTruncated, id, vmctl.MaxOutput)
	}
	return res, nil
}

// SetClock sets the guest's wall clock to wall, or to the host's time
// when wall is zero (a fork's clocks continue from its snapshot's instant:
// Caps.Clock; the agent's host clock policy asks for the host's time). It
// sets the guest's clock only, never the host's.
func (m *Provider) SetClock(ctx context.Context, id string, wall time.Time) error {
	if err := provider.ValidateID("id", id); err != nil {
		return err
	}
	box, _, _, err := m.boxes.Ready(id)
	if err != nil {
		return err
	}
	if box.vm == nil {
		return fmt.Errorf("%w: sandbox %q was left by an earlier process", provider.ErrNotFound, id)
	}
	if wall.IsZero() {
		wall = time.Now()
	}
	_, err = box.vm.call(ctx, vmctl.Request{Op: vmctl.OpClock, Wall: wall.UTC()})
	return err
}

func signalNum(name string) unix.Signal {
	if name == "" {
		return unix.SIGKILL
	}
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + strings.ToUpper(name)
	}
	if s := unix.SignalNum(name); s != 0 {
		return s
	}
	return unix.SIGKILL
}

// Sandboxes lists the sandboxes this provider started and those on disk.
func (m *Provider) Sandboxes() []string { return m.boxes.IDs() }

// Snapshots lists the complete snapshots in the store.
func (m *Provider) Snapshots() ([]string, error) { return m.snaps.List() }

func (m *Provider) sock(id, kind string) string {
	return filepath.Join(m.socks, shortHash(id)+"."+kind)
}

// entropy returns fresh random bytes for a guest's CRNG.
func entropy() []byte {
	b := make([]byte, vmctl.EntropyBytes)
	_, _ = rand.Read(b)
	return b
}
