//go:build linux

package dir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/boxes"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/copytree"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/inroot"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/snapstore"
)

// tagEnv is set in the environment of every process a dir sandbox starts,
// to the sandbox's directory, so that Stop also finds the processes that
// left its process group.
const tagEnv = "STILLPOINT_SANDBOX"

// Provider runs each sandbox as a plain directory, <state>/sandboxes/<id>/root,
// with Init and every Exec working in it. It needs no privileges and
// isolates nothing: the processes see the host's file system, processes
// and network. Snapshot and Fork copy the directory (reflinked where the
// file system can); they do not pause the sandbox, so a snapshot is
// consistent when the sandbox is quiet, which a checkpoint's prepare
// phase ensures by pausing the launch. Its methods are safe for concurrent
// use.
type Provider struct {
	state   string
	timeout time.Duration
	snaps   *snapstore.Store
	boxes   *boxes.Registry[*dirBox]
}

// dirBox is one sandbox; its env includes the tag.
type dirBox struct {
	boxes.State
	tag string
}

// New returns a dir provider keeping its sandboxes and snapshots under
// stateDir (created if missing). Half-made snapshots an earlier process
// left are removed.
func New(stateDir string) (*Provider, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, provider.InvalidField("stateDir", "%q is not absolute", stateDir)
	}
	if err := os.MkdirAll(filepath.Join(stateDir, "sandboxes"), 0o700); err != nil {
		return nil, err
	}
	snaps, err := snapstore.New(filepath.Join(stateDir, "snapshots"))
	if err != nil {
		return nil, err
	}
	return &Provider{
		state:   stateDir,
		timeout: provider.DefaultStopTimeout,
		snaps:   snaps,
		boxes:   boxes.NewRegistry[*dirBox](stateDir),
	}, nil
}

// Name returns "dir".
func (d *Provider) Name() string { return "dir" }

// Caps reports snapshots of files, not of processes.
func (d *Provider) Caps() provider.Caps { return provider.Caps{Snapshot: true} }

func (d *Provider) dir(id string) string { return d.boxes.Dir(id) }

// newBox returns the box of sandbox id, tagged.
func (d *Provider) newBox(id string) func() *dirBox {
	return func() *dirBox { return &dirBox{tag: tagEnv + "=" + d.dir(id)} }
}

// Start creates the directory, writes spec's files and starts Init (by
// default "sleep infinity") in its own process group. A spec with an
// image is refused (ErrInvalid): the dir provider has no root to swap.
func (d *Provider) Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error) {
	return d.start(ctx, spec, "")
}

// Fork starts spec.ID with its directory copied from the snapshot.
func (d *Provider) Fork(ctx context.Context, snapshotID string, spec provider.Spec) (*provider.Sandbox, error) {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return nil, err
	}
	return d.start(ctx, spec, snapshotID)
}

func (d *Provider) start(ctx context.Context, spec provider.Spec, snapshotID string) (*provider.Sandbox, error) {
	if spec.Image != nil || spec.ImageRef != "" {
		return nil, provider.InvalidField("spec.Image", "the dir provider cannot start from an image; use overlay or microvm")
	}
	return d.boxes.Start(spec, d.newBox(spec.ID), nil,
		func(box *dirBox) error { return d.create(ctx, box, spec, snapshotID) }, d.teardown)
}

func (d *Provider) create(ctx context.Context, box *dirBox, spec provider.Spec, snapshotID string) error {
	dir := d.dir(spec.ID)
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if snapshotID == "" {
		if err := os.Mkdir(root, 0o755); err != nil {
			return err
		}
	} else if err := d.copyFromSnapshot(ctx, snapshotID, root); err != nil {
		return err
	}
	if err := inroot.Populate(root, spec, false); err != nil {
		return err
	}
	workdir := root
	if spec.Workdir != "" {
		wd, _ := provider.CleanAbs("", spec.Workdir)
		workdir = filepath.Join(root, wd)
	}
	box.Env = append(provider.WithDefaults(spec.Env, "PATH="+os.Getenv("PATH"), "HOME="+root), box.tag, provider.RootEnv+"="+root)
	box.Sandbox = provider.Sandbox{ID: spec.ID, Root: root, Workdir: workdir, ProcRoot: root}
	argv := slices.Clone(spec.Init)
	if len(argv) == 0 {
		argv = []string{"sleep", "infinity"}
	}
	// An absolute program inside the sandbox (a file Files, CopyIn or
	// Binds put there) runs from there.
	argv[0] = inRootProgram(root, argv[0])
	var cmd *exec.Cmd
	err := procs.WhileTextBusy(func() error {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Dir, cmd.Env = workdir, box.Env
		cmd.Stdout, cmd.Stderr = spec.Output, spec.Output
		// An Output that is no file is copied from a pipe, which a
		// process the init left behind may hold open: its exit is what
		// the teardown waits for, not the pipe's end.
		cmd.WaitDelay = time.Second
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd.Start()
	})
	if err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	box.Sandbox.InitPID = cmd.Process.Pid
	box.Done = make(chan struct{})
	go func() { // stopped by the teardown, which kills the process and waits for done
		_ = cmd.Wait()
		close(box.Done)
	}()
	return nil
}

func (d *Provider) copyFromSnapshot(ctx context.Context, snapshotID, root string) error {
	sdir, meta, release, err := d.snaps.Open(snapshotID)
	if err != nil {
		return err
	}
	defer release()
	if meta.Provider != d.Name() {
		return fmt.Errorf("%w: snapshotID %q was taken by provider %q, not %q", provider.ErrInvalid, snapshotID, meta.Provider, d.Name())
	}
	_, err = copytree.Copy(ctx, filepath.Join(sdir, "root"), root)
	return err
}

// Stop kills the init's process group and every process carrying the
// sandbox's tag, waits for the init, removes the directory and checks
// that no tagged process and no directory is left.
func (d *Provider) Stop(ctx context.Context, id string) error {
	return d.boxes.Stop(id, d.newBox(id), d.teardown)
}

func (d *Provider) teardown(id string, box *dirBox) error {
	var errs []error
	if box.Sandbox.InitPID > 0 {
		_ = syscall.Kill(-box.Sandbox.InitPID, syscall.SIGKILL)
	}
	// A killed process stops showing its environment (the tag) as it
	// begins to exit, before it is dead: what was killed is waited for
	// by pid and start time, and so is every process of init's group
	// (which the group kill above may have caught before any was seen
	// tagged), so that Stop returns once all of it is dead.
	killed := map[int]uint64{}
	ctx, cancel := context.WithTimeoutCause(context.Background(), d.timeout, os.ErrDeadlineExceeded)
	defer cancel()
	err := poll.Until(ctx, poll.Backoff(100*time.Microsecond, 20*time.Millisecond), func() (bool, error) {
		pids := tagged(box.tag)
		if box.Sandbox.InitPID > 0 {
			pids = append(pids, inGroup(box.Sandbox.InitPID)...)
		}
		for _, p := range pids {
			if st, _, err := procfs.ReadStat(p, nil); err == nil {
				killed[p] = st.Start
			}
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		for p, start := range killed {
			if !procs.Running(p, start) {
				delete(killed, p)
			}
		}
		return len(pids) == 0 && len(killed) == 0, nil
	})
	if err != nil {
		left := append(tagged(box.tag), slices.Sorted(maps.Keys(killed))...)
		errs = append(errs, fmt.Errorf("%w: processes of %s: %v", provider.ErrLeftover, id, left))
	}
	if box.Done != nil {
		t := time.NewTimer(d.timeout)
		select {
		case <-box.Done:
		case <-t.C:
			errs = append(errs, fmt.Errorf("%w: init %d of %s did not exit", provider.ErrLeftover, box.Sandbox.InitPID, id))
		}
		t.Stop()
	}
	dir := d.dir(id)
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: directory %s", provider.ErrLeftover, dir))
	}
	return errors.Join(errs...)
}

// Snapshot copies the sandbox's directory to snapshots/<snapshotID>/root
// without pausing it.
func (d *Provider) Snapshot(ctx context.Context, id, snapshotID string) (provider.Snapshot, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateID("snapshotID", snapshotID)); err != nil {
		return provider.Snapshot{}, err
	}
	box, err := d.boxes.LockLive(id)
	if err != nil {
		return provider.Snapshot{}, err
	}
	defer box.Mu.Unlock()
	meta := snapstore.Meta{ID: snapshotID, Provider: d.Name(), Sandbox: id}
	return d.snaps.Create(meta, func(dst string) (provider.Snapshot, error) {
		t0 := time.Now()
		st, err := copytree.CopyLive(ctx, box.Sandbox.Root, filepath.Join(dst, "root"))
		return provider.Snapshot{Size: st.Bytes, Files: st.Entries, Took: time.Since(t0)}, err
	})
}

// DeleteSnapshot removes snapshots/<snapshotID>.
func (d *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := provider.ValidateID("snapshotID", snapshotID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.snaps.Delete(snapshotID)
}

// Exec runs argv (looked up in the host's PATH) with the working directory
// opts.Dir or the sandbox's Workdir, in its own process group; when ctx
// ends the group is killed.
func (d *Provider) Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error) {
	if err := errors.Join(provider.ValidateID("id", id), provider.ValidateExec(argv, opts)); err != nil {
		return provider.ExecResult{}, err
	}
	_, sb, env, err := d.boxes.Ready(id)
	if err != nil {
		return provider.ExecResult{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, inRootProgram(sb.Root, argv[0]), argv[1:]...)
	cmd.Dir = opts.Dir
	if cmd.Dir == "" {
		cmd.Dir = sb.Workdir
	}
	cmd.Env = append(slices.Clone(env), opts.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	return procs.ExecResult(ctx, cmd, err, &stdout, &stderr)
}

// Sandboxes lists the sandboxes this provider started and those on disk.
func (d *Provider) Sandboxes() []string { return d.boxes.IDs() }

// InitExited tells whether the init of sandbox id, started by this
// process, has exited (a sandbox it does not know: false).
func (d *Provider) InitExited(id string) bool {
	box, err := d.boxes.Get(id)
	if err != nil || box.Done == nil {
		return false
	}
	select {
	case <-box.Done:
		return true
	default:
		return false
	}
}

// Snapshots lists the complete snapshots in the store.
func (d *Provider) Snapshots() ([]string, error) { return d.snaps.List() }

// inRootProgram returns root+prog for an absolute prog that exists under
// root, and prog otherwise (a host program such as sh).
func inRootProgram(root, prog string) string {
	if !filepath.IsAbs(prog) {
		return prog
	}
	if p := filepath.Join(root, prog); fileIsRegular(p) {
		return p
	}
	return prog
}

func fileIsRegular(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
