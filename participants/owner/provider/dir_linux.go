//go:build linux

package provider

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

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// tagEnv is set in the environment of every process a Dir sandbox starts,
// to the sandbox's directory, so that Stop also finds the processes that
// left its process group.
const tagEnv = "STILLPOINT_SANDBOX"

// Dir runs each sandbox as a plain directory, <state>/sandboxes/<id>/root,
// with Init and every Exec working in it. It needs no privileges and
// isolates nothing: the processes see the host's file system, processes
// and network. Snapshot and Fork copy the directory (reflinked where the
// file system can); they do not pause the sandbox, so a snapshot is
// consistent when the sandbox is quiet, which a checkpoint's prepare
// phase ensures by pausing the launch. Its methods are safe for concurrent
// use.
type Dir struct {
	state   string
	timeout time.Duration
	snaps   *snapStore
	reason  string
	boxes   *registry[*dirBox]
}

// dirBox is one sandbox; its env includes the tag.
type dirBox struct {
	boxState
	tag string
}

// NewDir returns a Dir provider keeping its sandboxes and snapshots under
// stateDir (created if missing). Half-made snapshots an earlier process
// left are removed.
func NewDir(stateDir string) (*Dir, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, invalid("stateDir", "%q is not absolute", stateDir)
	}
	if err := os.MkdirAll(filepath.Join(stateDir, "sandboxes"), 0o700); err != nil {
		return nil, err
	}
	snaps, err := newSnapStore(filepath.Join(stateDir, "snapshots"))
	if err != nil {
		return nil, err
	}
	return &Dir{
		state:   stateDir,
		timeout: DefaultStopTimeout,
		snaps:   snaps,
		reason:  "constructed directly",
		boxes:   newRegistry[*dirBox](stateDir),
	}, nil
}

// Name returns "dir".
func (d *Dir) Name() string { return "dir" }

// Caps reports snapshots of files, not of processes.
func (d *Dir) Caps() Caps { return Caps{Snapshot: true} }

// Reason says why Default chose this provider.
func (d *Dir) Reason() string { return d.reason }

func (d *Dir) dir(id string) string { return d.boxes.dir(id) }

// newBox returns the box of sandbox id, tagged.
func (d *Dir) newBox(id string) func() *dirBox {
	return func() *dirBox { return &dirBox{tag: tagEnv + "=" + d.dir(id)} }
}

// Start creates the directory, writes spec's files and starts Init (by
// default "sleep infinity") in its own process group.
func (d *Dir) Start(ctx context.Context, spec Spec) (*Sandbox, error) {
	return d.start(ctx, spec, "")
}

// Fork starts spec.ID with its directory copied from the snapshot.
func (d *Dir) Fork(ctx context.Context, snapshotID string, spec Spec) (*Sandbox, error) {
	if err := ValidateID("snapshotID", snapshotID); err != nil {
		return nil, err
	}
	return d.start(ctx, spec, snapshotID)
}

func (d *Dir) start(ctx context.Context, spec Spec, snapshotID string) (*Sandbox, error) {
	return d.boxes.start(spec, d.newBox(spec.ID), nil,
		func(box *dirBox) error { return d.create(ctx, box, spec, snapshotID) }, d.teardown)
}

func (d *Dir) create(ctx context.Context, box *dirBox, spec Spec, snapshotID string) error {
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
	if err := populate(root, spec, false); err != nil {
		return err
	}
	workdir := root
	if spec.Workdir != "" {
		wd, _ := cleanAbs("", spec.Workdir)
		workdir = filepath.Join(root, wd)
	}
	box.env = append(withDefaults(spec.Env, "PATH="+os.Getenv("PATH"), "HOME="+root), box.tag, RootEnv+"="+root)
	box.sb = Sandbox{ID: spec.ID, Root: root, Workdir: workdir, ProcRoot: root}
	argv := slices.Clone(spec.Init)
	if len(argv) == 0 {
		argv = []string{"sleep", "infinity"}
	}
	// An absolute program inside the sandbox (a file Files, CopyIn or
	// Binds put there) runs from there.
	argv[0] = inRootProgram(root, argv[0])
	var cmd *exec.Cmd
	err := whileTextBusy(func() error {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Dir, cmd.Env = workdir, box.env
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
	box.sb.InitPID = cmd.Process.Pid
	box.done = make(chan struct{})
	go func() { // stopped by the teardown, which kills the process and waits for done
		_ = cmd.Wait()
		close(box.done)
	}()
	return nil
}

func (d *Dir) copyFromSnapshot(ctx context.Context, snapshotID, root string) error {
	sdir, meta, release, err := d.snaps.open(snapshotID)
	if err != nil {
		return err
	}
	defer release()
	if meta.Provider != d.Name() {
		return fmt.Errorf("%w: snapshotID %q was taken by provider %q, not %q", ErrInvalid, snapshotID, meta.Provider, d.Name())
	}
	_, err = copyTree(ctx, filepath.Join(sdir, "root"), root)
	return err
}

// Stop kills the init's process group and every process carrying the
// sandbox's tag, waits for the init, removes the directory and checks
// that no tagged process and no directory is left.
func (d *Dir) Stop(ctx context.Context, id string) error {
	return d.boxes.stop(id, d.newBox(id), d.teardown)
}

func (d *Dir) teardown(id string, box *dirBox) error {
	var errs []error
	if box.sb.InitPID > 0 {
		_ = syscall.Kill(-box.sb.InitPID, syscall.SIGKILL)
	}
	// A killed process stops showing its environment (the tag) as it
	// begins to exit, before it is dead: what was killed is waited for
	// by pid and start time, and so is every process of init's group
	// (which the group kill above may have caught before any was seen
	// tagged), so that Stop returns once all of it is dead.
	killed := map[int]uint64{}
	err := pollWithin(context.Background(), d.timeout, func() (bool, error) {
		pids := tagged(box.tag)
		if box.sb.InitPID > 0 {
			pids = append(pids, inGroup(box.sb.InitPID)...)
		}
		for _, p := range pids {
			if st, _, err := procfs.ReadStat(p, nil); err == nil {
				killed[p] = st.Start
			}
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		for p, start := range killed {
			if !running(p, start) {
				delete(killed, p)
			}
		}
		return len(pids) == 0 && len(killed) == 0, nil
	})
	if err != nil {
		left := append(tagged(box.tag), slices.Sorted(maps.Keys(killed))...)
		errs = append(errs, fmt.Errorf("%w: processes of %s: %v", ErrLeftover, id, left))
	}
	if box.done != nil {
		t := time.NewTimer(d.timeout)
		select {
		case <-box.done:
		case <-t.C:
			errs = append(errs, fmt.Errorf("%w: init %d of %s did not exit", ErrLeftover, box.sb.InitPID, id))
		}
		t.Stop()
	}
	dir := d.dir(id)
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: directory %s", ErrLeftover, dir))
	}
	return errors.Join(errs...)
}

// Snapshot copies the sandbox's directory to snapshots/<snapshotID>/root
// without pausing it.
func (d *Dir) Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error) {
	if err := errors.Join(ValidateID("id", id), ValidateID("snapshotID", snapshotID)); err != nil {
		return Snapshot{}, err
	}
	box, err := d.boxes.lockLive(id)
	if err != nil {
		return Snapshot{}, err
	}
	defer box.mu.Unlock()
	meta := snapMeta{ID: snapshotID, Provider: d.Name(), Sandbox: id}
	return d.snaps.create(meta, func(dst string) (copyStats, time.Duration, error) {
		t0 := time.Now()
		st, err := copyLiveTree(ctx, box.sb.Root, filepath.Join(dst, "root"))
		return st, time.Since(t0), err
	})
}

// DeleteSnapshot removes snapshots/<snapshotID>.
func (d *Dir) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := ValidateID("snapshotID", snapshotID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.snaps.delete(snapshotID)
}

// Exec runs argv (looked up in the host's PATH) with the working directory
// opts.Dir or the sandbox's Workdir, in its own process group; when ctx
// ends the group is killed.
func (d *Dir) Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error) {
	if err := errors.Join(ValidateID("id", id), validateExec(argv, opts)); err != nil {
		return ExecResult{}, err
	}
	_, sb, env, err := d.boxes.ready(id)
	if err != nil {
		return ExecResult{}, err
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
	return execResult(ctx, cmd, err, &stdout, &stderr)
}

// Sandboxes lists the sandboxes this provider started and those on disk.
func (d *Dir) Sandboxes() []string { return d.boxes.ids() }

// InitExited tells whether the init of sandbox id, started by this
// process, has exited (a sandbox it does not know: false).
func (d *Dir) InitExited(id string) bool {
	box, err := d.boxes.get(id)
	if err != nil || box.done == nil {
		return false
	}
	select {
	case <-box.done:
		return true
	default:
		return false
	}
}

// Snapshots lists the complete snapshots in the store.
func (d *Dir) Snapshots() ([]string, error) { return d.snaps.list() }

// withOnDisk adds the directory names under dir to ids, sorted and
// without duplicates.
func withOnDisk(ids []string, dir string) []string {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

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
