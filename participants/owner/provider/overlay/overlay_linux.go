//go:build linux

package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/boxes"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/copytree"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/inroot"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/snapstore"
)

// Defaults of Config.
const (
	// DefaultCgroupParentName is the directory under the cgroup v2 mount
	// that holds one cgroup per sandbox.
	DefaultCgroupParentName = "stillpoint-sandboxes"
	// DefaultFreezeTimeout bounds how long Snapshot waits for the sandbox's
	// cgroup to report frozen.
	DefaultFreezeTimeout = 10 * time.Second
	// DefaultStartTimeout bounds how long Start waits for the first process
	// to be set up and exec'd.
	DefaultStartTimeout = 30 * time.Second
)

// overlayOptions are fixed so that an upper directory is self-contained
// and can be copied to another sandbox over the same base: no index (it
// would tie the upper to this work dir), no redirects (renaming a base
// directory copies it up instead), no metacopy (copy-up copies data).
const overlayOptions = "index=off,redirect_dir=off,metacopy=off"

// Config configures the overlay provider.
type Config struct {
	// StateDir holds sandboxes/<id>/{upper,work,merged} and
	// snapshots/<id>/upper. Required; created if missing. Must be on a
	// file system that can be an overlay upper layer (not overlay itself).
	StateDir string
	// BaseDir is the read-only image every sandbox starts from, the
	// overlay's lower directory. Default "/", the host's root file system
	// (without the file systems mounted on it).
	BaseDir string
	// CgroupParent is the cgroup v2 directory under which each sandbox
	// gets <CgroupParent>/<id>. Default <cgroup v2 mount>/stillpoint-sandboxes/<h>,
	// h naming StateDir (8 hex digits of its sha256), so that owners with
	// different state directories never share a cgroup name; the default
	// one is made when a sandbox needs it, marked with the owner's process
	// identity, and removed when no sandbox is left in it, and an empty
	// one whose owner is gone is removed by the next provider beside it
	// (cgroup_linux.go).
	CgroupParent string
	// FreezeTimeout: default DefaultFreezeTimeout.
	FreezeTimeout time.Duration
	// StopTimeout: default DefaultStopTimeout.
	StopTimeout time.Duration
	// StartTimeout: default DefaultStartTimeout.
	StartTimeout time.Duration
	// Images is the image cache: a fork of a snapshot taken on an image
	// finds the image there, and each sandbox and snapshot on an image
	// holds it there. nil: a sandbox may still start from spec.Image, but
	// nothing holds it, and a fork of a snapshot on an image fails.
	Images ImageFinder
}

func (c *Config) setDefaults(cgMount string) {
	if c.BaseDir == "" {
		c.BaseDir = "/"
	}
	if c.CgroupParent == "" {
		// One parent per state directory: two owners on a host (two runs,
		// two tests) may use the same sandbox ids.
		c.CgroupParent = filepath.Join(cgMount, DefaultCgroupParentName, stateHash(c.StateDir))
	}
	if c.FreezeTimeout == 0 {
		c.FreezeTimeout = DefaultFreezeTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = provider.DefaultStopTimeout
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
}

// Validate checks the config; the errors, joined, wrap ErrInvalid and name
// the field.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"StateDir", c.StateDir}, {"BaseDir", c.BaseDir}, {"CgroupParent", c.CgroupParent}} {
		switch {
		case f.v == "" && f.name == "StateDir":
			errs = append(errs, provider.InvalidField(f.name, "missing"))
		case f.v != "" && !filepath.IsAbs(f.v):
			errs = append(errs, provider.InvalidField(f.name, "%q is not absolute", f.v))
		case strings.ContainsAny(f.v, ",:\\\n"):
			errs = append(errs, provider.InvalidField(f.name, "%q has a character overlay options cannot hold (, : \\ newline)", f.v))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FreezeTimeout", c.FreezeTimeout}, {"StopTimeout", c.StopTimeout}, {"StartTimeout", c.StartTimeout}} {
		if d.v < 0 {
			errs = append(errs, provider.InvalidField(d.name, "negative"))
		}
	}
	return errors.Join(errs...)
}

// Provider runs each sandbox as an overlay over a read-only base, with its
// own cgroup and PID, mount, UTS and cgroup namespaces. It needs root on
// Linux, cgroup v2 and util-linux's nsenter. Its methods are safe for
// concurrent use.
type Provider struct {
	cfg     Config
	cgMount string // where cgroup v2 is mounted; the same path inside
	nsenter string
	mask    string // StateDir as seen inside, when the base shows it; hidden
	snaps   *snapstore.Store

	// defaultParent tells a CgroupParent the provider chose, which it
	// removes once empty.
	defaultParent bool

	boxes *boxes.Registry[*overlayBox]
}

// overlayBox is one sandbox; its done is closed once proc was reaped.
type overlayBox struct {
	boxes.State
	proc *os.Process // the init, if this process started it
	// image is what the sandbox's root is made of; nil: the base (or a
	// sandbox an earlier process left, which is only stopped).
	image *provider.Image
	// reap is held shared by each Exec while nsenter enters the sandbox by
	// the init's pid, and exclusively to reap the init: until then the pid
	// cannot name another process. exited is set once the init has exited.
	reap   sync.RWMutex
	exited atomic.Bool
	// died is closed as soon as the init has exited, before it is reaped:
	// an Exec that holds reap learns through it that the init died under
	// its command.
	died chan struct{}
}

func newOverlayBox() *overlayBox { return &overlayBox{} }

// New checks the config and what the provider needs (root, cgroup
// v2, nsenter), creates the state directories, removes half-made
// snapshots an earlier process left and mends its image holds
// (reconcileHolds). It does not mount anything; Probe
// does a trial run.
func New(cfg Config) (*Provider, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the overlay provider needs root (euid %d)", errors.ErrUnsupported, os.Geteuid())
	}
	cgMount, err := cgroup.Mount()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errors.ErrUnsupported, err)
	}
	defaultParent := cfg.CgroupParent == ""
	cfg.setDefaults(cgMount)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("%w: nsenter not found; install util-linux (apt-get install util-linux): %w", errors.ErrUnsupported, err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "sandboxes"), 0o700); err != nil {
		return nil, err
	}
	mask, err := stateMask(cfg.BaseDir, cfg.StateDir)
	if err != nil {
		return nil, err
	}
	snaps, err := snapstore.New(filepath.Join(cfg.StateDir, "snapshots"))
	if err != nil {
		return nil, err
	}
	o := &Provider{
		cfg:     cfg,
		cgMount: cgMount,
		nsenter: nsenter,
		mask:    mask,
		snaps:   snaps,
		boxes:   boxes.NewRegistry[*overlayBox](cfg.StateDir),

		defaultParent: defaultParent,
	}
	if err := o.reconcileHolds(); err != nil {
		return nil, err
	}
	return o, nil
}

// stateMask returns the state directory's path inside a sandbox when the
// base shows it (it lies in the base's file system), so that the sandbox
// init covers it: otherwise every sandbox could read every other
// sandbox's upper layer and every snapshot through the read-only base.
func stateMask(base, state string) (string, error) {
	realBase, err := filepath.EvalSymlinks(base)
	if err != nil {
		return "", err
	}
	realState, err := filepath.EvalSymlinks(state)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(realBase, realState)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", nil // outside the base
	}
	if rel == "." {
		return "", provider.InvalidField("StateDir", "%q is the base directory itself", state)
	}
	var sb, ss unix.Stat_t
	if err := unix.Stat(realBase, &sb); err != nil {
		return "", err
	}
	if err := unix.Stat(realState, &ss); err != nil {
		return "", err
	}
	if sb.Dev != ss.Dev {
		return "", nil // another file system: the overlay shows only its mount point
	}
	return "/" + rel, nil
}

// Name returns "overlay".
func (o *Provider) Name() string { return "overlay" }

// Caps reports snapshots of files (the upper layer), not of processes.
func (o *Provider) Caps() provider.Caps { return provider.Caps{Snapshot: true} }

// Config returns the config with its defaults filled in.
func (o *Provider) Config() Config { return o.cfg }

func (o *Provider) dir(id string) string        { return o.boxes.Dir(id) }
func (o *Provider) cgroup(id string) cgroup.Dir { return cgroup.Dir(o.cfg.CgroupParent).Child(id) }

// Start mounts a fresh overlay over the base, or over spec.Image's layers,
// and starts spec.Init in it.
func (o *Provider) Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error) {
	return o.start(ctx, spec, "")
}

// Fork starts spec.ID with its upper layer copied from the snapshot, over
// what the snapshot stands on: the base, or the image its meta records,
// found in Config.Images (whose Env goes before spec.Env, as the owner
// did for the sandbox the snapshot was taken of).
func (o *Provider) Fork(ctx context.Context, snapshotID string, spec provider.Spec) (*provider.Sandbox, error) {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return nil, err
	}
	return o.start(ctx, spec, snapshotID)
}

func (o *Provider) start(ctx context.Context, spec provider.Spec, snapshotID string) (*provider.Sandbox, error) {
	free := func() error {
		if _, err := os.Lstat(string(o.cgroup(spec.ID))); err == nil {
			return fmt.Errorf("%w: cgroup %s exists; Stop %q first", provider.ErrExists, o.cgroup(spec.ID), spec.ID)
		}
		return nil
	}
	return o.boxes.Start(spec, newOverlayBox, free,
		func(box *overlayBox) error { return o.create(ctx, box, spec, snapshotID) }, o.teardown)
}

func (o *Provider) create(ctx context.Context, box *overlayBox, spec provider.Spec, snapshotID string) error {
	dir := o.dir(spec.ID)
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	if spec.Image != nil {
		if err := o.checkImage(spec.Image); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	img, mask := spec.Image, o.mask
	switch {
	case snapshotID != "":
		var err error
		if img, err = o.copyFromSnapshot(ctx, snapshotID, upper, spec.Image); err != nil {
			return err
		}
		spec.Env = withImageEnv(img, spec.Env)
	case img != nil:
		// An image's working directory holds what the image put there
		// (a task's repository): it is not emptied.
		if err := os.Mkdir(upper, 0o755); err != nil {
			return err
		}
	default:
		if err := os.Mkdir(upper, 0o755); err != nil {
			return err
		}
		if err := o.emptyWorkdir(upper, spec.Workdir); err != nil {
			return err
		}
	}
	if img != nil {
		// The layers are the cache's, never the state directory's
		// (checkImage): nothing to cover.
		mask = ""
		if err := o.holdImage(spec.ID, img); err != nil {
			return err
		}
		box.image = img
	}
	for _, d := range []string{work, merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := mountOverlay(o.lowerDirs(img), upper, work, merged); err != nil {
		return err
	}
	workdir := spec.Workdir
	if workdir == "" {
		workdir = "/"
	}
	workdir, _ = provider.CleanAbs("", workdir)
	if err := inroot.Populate(merged, spec, true); err != nil {
		return err
	}
	cg := o.cgroup(spec.ID)
	if err := o.createCgroup(cg); err != nil {
		return err
	}
	box.Env = provider.WithDefaults(spec.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root")
	box.Sandbox = provider.Sandbox{ID: spec.ID, Root: merged, Workdir: workdir, ProcRoot: "/", Cgroup: string(cg)}
	return o.startInit(ctx, box, spec, initConfig{
		Root:        merged,
		Hostname:    spec.ID,
		Cgroup:      string(cg),
		CgroupMount: o.cgMount,
		Workdir:     workdir,
		Mask:        mask,
		Argv:        spec.Init,
		Env:         box.Env,
		Binds:       initBinds(spec.Binds),
	})
}

func initBinds(bs []provider.Bind) []initBind {
	out := make([]initBind, 0, len(bs))
	for _, b := range bs {
		rel, _ := provider.CleanRel("", b.SandboxDir)
		out = append(out, initBind{Host: b.HostDir, Inside: "/" + rel})
	}
	return out
}

// copyFromSnapshot copies the snapshot's upper layer to upper and returns
// the image it stands on (nil: the base).
func (o *Provider) copyFromSnapshot(ctx context.Context, snapshotID, upper string, want *provider.Image) (*provider.Image, error) {
	sdir, meta, release, err := o.snaps.Open(snapshotID)
	if err != nil {
		return nil, err
	}
	defer release()
	if meta.Provider != o.Name() || (meta.Image == "" && meta.Base != o.cfg.BaseDir) {
		return nil, fmt.Errorf("%w: snapshotID %q was taken by provider %q over base %q, not %q over %q",
			provider.ErrInvalid, snapshotID, meta.Provider, meta.Base, o.Name(), o.cfg.BaseDir)
	}
	img, err := o.imageOf(snapshotID, meta.Image, want)
	if err != nil {
		return nil, err
	}
	if img != nil {
		if err := o.checkImage(img); err != nil {
			return nil, fmt.Errorf("snapshot %s stands on image %s: %w", snapshotID, meta.Image, err)
		}
	}
	_, err = copytree.Copy(ctx, filepath.Join(sdir, "upper"), upper)
	return img, err
}

// startInit starts the helper (see init_linux.go) in new PID, mount and
// UTS namespaces, born in the sandbox's cgroup, and waits until it has
// exec'd Init or failed.
func (o *Provider) startInit(ctx context.Context, box *overlayBox, spec provider.Spec, c initConfig) error {
	js, err := json.Marshal(c)
	if err != nil {
		return err
	}
	cgfd, err := unix.Open(c.Cgroup, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: c.Cgroup, Err: err}
	}
	defer unix.Close(cgfd)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   []string{initArg0},
		Env:    []string{initEnv + "=" + string(js)},
		Stdout: spec.Output,
		Stderr: spec.Output,
		// An Output that is no file is copied from a pipe; the init's
		// end closes when its namespace dies, and this bounds the wait
		// for what was left in it.
		WaitDelay:  time.Second,
		ExtraFiles: []*os.File{w}, // fd 3 = initStatusFD
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
			UseCgroupFD: true,
			CgroupFD:    cgfd,
		},
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("start sandbox init: %w", err)
	}
	box.Sandbox.InitPID = cmd.Process.Pid
	box.proc = cmd.Process
	box.Done, box.died = make(chan struct{}), make(chan struct{})
	go func() { // stopped by the teardown, which kills the process and waits for done
		defer close(box.Done)
		procs.WaitExit(cmd.Process.Pid)
		close(box.died)
		box.reap.Lock()
		defer box.reap.Unlock()
		box.exited.Store(true)
		_ = cmd.Wait()
	}()
	msg, err := readStatus(ctx, r, o.cfg.StartTimeout)
	if err != nil {
		return fmt.Errorf("wait for sandbox init: %w", err)
	}
	if len(msg) > 0 {
		return errors.New(string(msg))
	}
	return nil
}

// readStatus reads the status pipe to its end, bounded by ctx and timeout.
func readStatus(ctx context.Context, r *os.File, timeout time.Duration) ([]byte, error) {
	if err := r.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = r.SetReadDeadline(time.Now()) })
	defer stop()
	msg, err := io.ReadAll(r)
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return msg, err
}

// Stop tears the sandbox down: kill its cgroup, reap the init, remove the
// cgroups, unmount, remove the directory, and check that none of it is
// left. It also stops a sandbox that an earlier process left in the state
// directory.
func (o *Provider) Stop(ctx context.Context, id string) error {
	if err := o.boxes.Stop(id, newOverlayBox, o.teardown); err != nil {
		return err
	}
	if o.boxes.Empty() {
		o.dropParent()
	}
	return nil
}

// Snapshot freezes the sandbox's cgroup, copies its upper layer (its
// changes to the base, not the base) to snapshots/<snapshotID>/upper, and
// thaws it again on every path.
func (o *Provider) Snapshot(ctx context.Context, id, snapshotID string) (provider.Snapshot, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateID("snapshotID", snapshotID)); err != nil {
		return provider.Snapshot{}, err
	}
	box, err := o.boxes.LockLive(id)
	if err != nil {
		return provider.Snapshot{}, err
	}
	defer box.Mu.Unlock()
	meta := snapstore.Meta{ID: snapshotID, Provider: o.Name(), Base: o.cfg.BaseDir, Sandbox: id}
	if box.image != nil {
		meta.Base, meta.Image = "", box.image.Digest
		if err := o.holdForSnapshot(snapshotID, box.image); err != nil {
			return provider.Snapshot{}, err
		}
	}
	snap, err := o.snaps.Create(meta, func(dst string) (snap provider.Snapshot, err error) {
		cg := cgroup.Dir(box.Sandbox.Cgroup)
		t0 := time.Now()
		// A freeze the kernel does not confirm in FreezeTimeout is undone.
		if err := cg.Freeze(ctx, t0.Add(o.cfg.FreezeTimeout)); err != nil {
			return snap, fmt.Errorf("%w: %s: %w", provider.ErrFreeze, cg, err)
		}
		defer func() {
			snap.Took = time.Since(t0)
			if terr := cg.SetFreeze(false); terr != nil {
				err = errors.Join(err, fmt.Errorf("thaw %s: %w", cg, terr))
			}
		}()
		st, err := copytree.Copy(ctx, filepath.Join(o.dir(id), "upper"), filepath.Join(dst, "upper"))
		return provider.Snapshot{Size: st.Bytes, Files: st.Entries}, err
	})
	if err != nil && meta.Image != "" && !errors.Is(err, provider.ErrExists) {
		err = errors.Join(err, o.release(o.snapshotHolder(snapshotID)))
	}
	return snap, err
}

// DeleteSnapshot removes snapshots/<snapshotID> and then its hold on its
// image.
func (o *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := o.snaps.Delete(snapshotID); err != nil {
		return err
	}
	return o.release(o.snapshotHolder(snapshotID))
}

// Exec runs argv in the sandbox's namespaces and root through nsenter,
// with the process born in the sandbox's cgroup (so a snapshot freezes it
// and Stop kills it). When ctx ends, everything nsenter started is killed.
// nsenter's own failures, such as an opts.Dir missing inside, show as
// exit code 1 with its message on Stderr.
func (o *Provider) Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateExec(argv, opts)); err != nil {
		return provider.ExecResult{}, err
	}
	box, sb, env, err := o.boxes.Ready(id)
	if err != nil {
		return provider.ExecResult{}, err
	}
	box.reap.RLock()
	defer box.reap.RUnlock()
	if box.exited.Load() {
		return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q", provider.ErrExited, id)
	}
	dir := opts.Dir
	if dir == "" {
		dir = sb.Workdir
	}
	cgfd, err := unix.Open(sb.Cgroup, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q: %w", provider.ErrNotFound, id, err)
	}
	defer unix.Close(cgfd)
	args := append([]string{
		"--target=" + strconv.Itoa(sb.InitPID),
		"--mount", "--pid", "--uts", "--cgroup", "--root", "--wdns=" + dir, "--",
	}, argv...)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, o.nsenter, args...)
	cmd.Env = append(slices.Clone(env), opts.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
	cmd.Cancel = func() error { killInside(cmd.Process.Pid); return nil }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	res, err := procs.ExecResult(ctx, cmd, err, &stdout, &stderr)
	if err == nil && res.ExitCode != 0 && box.diedUnder(res) {
		// The init died while the command ran (or before nsenter entered):
		// the namespace's teardown killed the command, or nsenter found
		// nothing to enter. That is no answer of the command's, and must
		// not read as one (a grade would score its empty output).
		return provider.ExecResult{}, fmt.Errorf("%w: sandbox %q: its init exited while %q ran", provider.ErrExited, id, argv[0])
	}
	return res, err
}

// initDeathWait bounds how long an Exec whose command the kernel killed
// waits to see the init's exit: the init becomes waitable only once the
// namespace's last process (the command, reaped by nsenter) is gone.
const initDeathWait = 2 * time.Second

// initGone tells whether the init has exited: died, when this process
// started it, else exited.
func (box *overlayBox) initGone() bool {
	if box.died != nil {
		select {
		case <-box.died:
			return true
		default:
		}
	}
	return box.exited.Load()
}

// diedUnder tells whether the init has exited, for a command that failed
// with res. One killed by SIGKILL (what the teardown of a PID namespace
// sends) or one that nsenter could not run waits up to initDeathWait for
// the exit to show; any other failure is the command's own unless the init
// is gone already.
func (box *overlayBox) diedUnder(res provider.ExecResult) bool {
	if box.initGone() {
		return true
	}
	if box.died == nil { // not started by this process: nothing to wait for
		return false
	}
	if res.ExitCode != 128+int(syscall.SIGKILL) && !bytes.HasPrefix(res.Stderr, []byte("nsenter: ")) {
		return false
	}
	select {
	case <-box.died:
		return true
	case <-time.After(initDeathWait):
		return false
	}
}

// InitExited tells whether the init of sandbox id, started by this
// process, has exited (a sandbox it does not know: false).
func (o *Provider) InitExited(id string) bool {
	box, err := o.boxes.Get(id)
	return err == nil && box.initGone()
}

// Sandboxes lists the sandboxes this provider started and those on disk.
func (o *Provider) Sandboxes() []string { return o.boxes.IDs() }

// Snapshots lists the complete snapshots in the store.
func (o *Provider) Snapshots() ([]string, error) { return o.snaps.List() }
