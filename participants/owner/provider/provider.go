package provider

import (
	"context"
	"errors"
	"io"
	"time"
)

// Provider is the whole contract every provider keeps (package doc): the
// contract suite (providertest) runs its checks on this shape. The sandbox
// owner declares the smaller interfaces it calls (participants/owner:
// Provider, Snapshotter, Lister, Execer).
type Provider interface {
	Name() string
	Caps() Caps
	Start(ctx context.Context, spec Spec) (*Sandbox, error)
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error)
	Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error)
	Fork(ctx context.Context, snapshotID string, spec Spec) (*Sandbox, error)
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	Sandboxes() []string
	Snapshots() ([]string, error)
}

// Sentinel errors. Errors for bad input wrap ErrInvalid and name the field.
var (
	// ErrInvalid is returned (wrapped, naming the field) for an id, path,
	// argv or config value that the provider refuses.
	ErrInvalid = errors.New("provider: invalid argument")

	// ErrNotFound is returned (wrapped) by Snapshot, Fork and Exec for a
	// sandbox or snapshot that this provider does not hold.
	ErrNotFound = errors.New("provider: not found")

	// ErrExists is returned (wrapped) by Start, Fork and Snapshot when the
	// sandbox or snapshot id is already in use, on disk or in memory.
	ErrExists = errors.New("provider: already exists")

	// ErrExited is returned (wrapped) by Exec when the sandbox's first
	// process has exited: its namespaces are gone. Stop it.
	ErrExited = errors.New("provider: sandbox init exited")

	// ErrNoSnapshot is returned by Snapshot and Fork of a provider whose
	// Caps().Snapshot is false. The owner then runs restart_only.
	ErrNoSnapshot = errors.New("provider: snapshots not supported")

	// ErrFreeze is returned (wrapped) by Snapshot when the sandbox's cgroup
	// did not report frozen in time; the sandbox was thawed again and no
	// snapshot was kept.
	ErrFreeze = errors.New("provider: sandbox did not freeze")

	// ErrLeftover is returned (wrapped) by Stop and DeleteSnapshot when,
	// after the teardown, something of the sandbox or snapshot is still
	// there: a process, a mount, a cgroup or a directory. The error says
	// what.
	ErrLeftover = errors.New("provider: teardown left something behind")
)

// Caps says what a provider can do.
type Caps struct {
	// Snapshot is true when Snapshot and Fork work. When false the owner
	// runs restart_only (PROTOCOL §6).
	Snapshot bool `json:"snapshot"`
	// KeepsProcesses is true when a snapshot holds the sandbox's running
	// processes and a fork resumes them (a VM or CRIU snapshot), so that
	// a restore can adopt the paused launch instead of relaunching it
	// (PROTOCOL §6, keeps_processes). Local providers here keep files only.
	KeepsProcesses bool `json:"keeps_processes"`
	// Clock is how a fork's clocks run (ClockContinuous: on from the
	// snapshot's instant, the downtime unseen); "" when a fork's processes
	// start anew and read the host's clock.
	Clock string `json:"clock,omitempty"`
	// SetsClock is true when the provider can set a fork's wall clock to
	// the host's (issue 15's host clock policy).
	SetsClock bool `json:"sets_clock,omitempty"`
}

// Bounds say how many sandboxes a provider can bear (0: no bound): the
// owner never has more than Starting of them starting (or forking) at
// once, nor more than Live live; a request beyond waits its turn.
type Bounds struct {
	Starting int `json:"starting,omitempty"`
	Live     int `json:"live,omitempty"`
}

// DefaultStopTimeout is the providers' default bound of each wait of a
// teardown (Stop): processes dying, a cgroup emptying, a busy mount
// letting go, a VM's QEMU exiting.
const DefaultStopTimeout = 10 * time.Second

// ClockContinuous is Caps.Clock of a provider whose forks' clocks continue
// from the snapshot's instant: a sandbox restored an hour later reads a
// wall clock an hour behind the host's until it is set.
const ClockContinuous = "continuous"

// Spec describes a sandbox to start.
type Spec struct {
	// ID names the sandbox. It must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$
	// (it becomes a directory and a cgroup name, and may become a subject
	// token).
	ID string
	// Init is the sandbox's first process (argv; argv[0] is looked up in
	// the sandbox's PATH). Empty means a minimal idle init that only reaps
	// children.
	Init []string
	// Env is the environment of Init and of every Exec. PATH and HOME get
	// defaults when missing.
	Env []string
	// Workdir is the working directory of Init and the default of Exec, as
	// an absolute path inside the sandbox; it is created if missing.
	// Default "/". (The dir provider maps it under the sandbox's root.)
	Workdir string
	// Files are written into the sandbox before Init starts, keyed by path
	// relative to the sandbox's root, mode 0644, parents 0755. Absolute
	// paths and ".." are refused; symbolic links are resolved inside the
	// sandbox.
	Files map[string][]byte
	// CopyIn copies host files (regular files only) into the sandbox
	// before Init starts, after Files.
	CopyIn []CopyIn
	// Binds show host directories read-only inside the sandbox (binaries
	// the sandbox runs, the same for every sandbox). They are not the
	// sandbox's files: a snapshot does not copy them, and a fork gets them
	// from its own Spec. The overlay provider bind-mounts them; the dir
	// provider, which has no mount namespace, copies their regular files in.
	Binds []Bind
	// Output receives Init's stdout and stderr; nil discards them.
	Output io.Writer
	// Epoch is the restore's (or a branch's) epoch, given to Fork: a
	// provider whose forks keep their processes (Caps.KeepsProcesses)
	// moves the fork's running sandboxd to it (PROTOCOL §5, an adopted
	// sandboxd). Zero for a Start, and for a branch in the run's first
	// epoch: the fork's sandboxd then takes its epoch from the phases, as
	// a fresh member does, which is the same epoch.
	Epoch uint64
	// ImageRef is the container image a task names for its sandbox's root
	// (an OCI layout, a docker save archive or a registry reference; see
	// package image). A task kind sets it; the owner resolves it into
	// Image before the provider sees the spec. "" uses the provider's base.
	ImageRef string
	// Image is the resolved, unpacked image the sandbox's root file system
	// is made of; nil uses the provider's base. The owner sets it from
	// ImageRef, and has already applied the image's config to Env and
	// Workdir. A provider that cannot start from an image refuses a spec
	// with one (ErrInvalid).
	Image *Image
}

// Image is a container image resolved and unpacked on the owner's host:
// what a provider needs to make a sandbox's root of it.
type Image struct {
	// Ref is the reference the task named.
	Ref string `json:"ref"`
	// Digest is the image manifest's digest ("sha256:<hex>"): what a
	// snapshot records and a restore finds its image by.
	Digest string `json:"digest"`
	// Layers are the host directories of the unpacked layers, bottom
	// first, each with its whiteouts in overlayfs form (a 0/0 character
	// device; trusted.overlay.opaque=y on an opaque directory), so that
	// they stack as overlay lowerdirs (top first) with no copy.
	Layers []string `json:"layers"`
	// Env, WorkingDir and User are the image config's.
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// RootEnv is set in the environment of a sandbox's processes by a provider
// whose processes see the host's paths (dir): the sandbox's root, so that a
// program that knows paths inside the sandbox (sandboxd's state directory)
// can find them.
const RootEnv = "STILLPOINT_SANDBOX_ROOT"

// Bind is one host directory shown read-only in a sandbox.
type Bind struct {
	// HostDir is the directory on the host (absolute).
	HostDir string
	// SandboxDir is where it shows, relative to the sandbox's root, as for
	// Spec.Files.
	SandboxDir string
}

// CopyIn is one host file to copy into a sandbox.
type CopyIn struct {
	// HostPath is the file on the host (absolute).
	HostPath string
	// SandboxPath is where it goes, relative to the sandbox's root, as for
	// Spec.Files.
	SandboxPath string
	// Mode is the permission bits of the copy; 0 keeps the host file's.
	Mode uint32
}

// Sandbox is a started sandbox.
type Sandbox struct {
	// ID is Spec.ID.
	ID string `json:"id"`
	// Root is the host path where the sandbox's file system is visible
	// (the overlay's merged directory, or the dir provider's directory).
	Root string `json:"root"`
	// Workdir is the working directory as the sandbox's processes see it.
	Workdir string `json:"workdir"`
	// ProcRoot is the sandbox's root as its own processes see it: "/" when
	// the provider gives them a mount namespace (overlay), Root when they
	// see the host's paths (dir). A path inside the sandbox, p, is
	// path.Join(ProcRoot, p) to them.
	ProcRoot string `json:"proc_root"`
	// InitPID is the host pid of the first process.
	InitPID int `json:"init_pid"`
	// Cgroup is the host path of the sandbox's cgroup v2 directory, or ""
	// when the provider gives it none.
	Cgroup string `json:"cgroup,omitempty"`
}

// Snapshot describes a snapshot that was taken.
type Snapshot struct {
	// ID is the snapshot id.
	ID string `json:"id"`
	// Size is the number of bytes of file data copied (each inode once).
	Size int64 `json:"size"`
	// Files is the number of entries copied: files, directories, links,
	// devices (whiteouts) and the like, not counting the top directory.
	Files int `json:"files"`
	// Took is how long the sandbox was held (frozen) for the copy.
	Took time.Duration `json:"took"`
}

// ExecOptions are the optional parts of an Exec.
type ExecOptions struct {
	// Dir is the working directory as the sandbox sees it; "" means the
	// sandbox's Workdir.
	Dir string
	// Env is added to the sandbox's environment (a later entry wins).
	Env []string
	// Stdin is the command's standard input; nil means empty.
	Stdin io.Reader
}

// ExecResult is what a command run by Exec left.
type ExecResult struct {
	// Stdout and Stderr are everything the command wrote.
	Stdout []byte
	Stderr []byte
	// ExitCode is the exit status, or 128+n when signal n killed it.
	ExitCode int
}
