// Package provider holds the sandbox providers the sandbox owner uses
// (PROTOCOL.md §6, "Sandbox owner"): something that starts a sandbox for a
// session, runs commands in it, snapshots it at a checkpoint's commit,
// forks the snapshot at a restore, deletes snapshots at a release, and
// stops the sandbox so that nothing of it is left.
//
// # The contract
//
// The package holds concrete providers (Overlay, Dir, NoSnapshot); it
// declares no interface for them. Each has the same methods: Name and
// Caps; Start, Stop and Exec; Snapshot, Fork and DeleteSnapshot;
// Sandboxes and Snapshots. The sandbox owner declares the few it calls
// (participants/owner: Provider, Snapshotter, Lister, Execer), and the
// tests check every provider against the whole shape. The rules each
// method keeps:
//
//  1. Ids. Sandbox and snapshot ids match ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$
//     (PROTOCOL §2 tokens); they become directory and cgroup names.
//     Anything else, and any file path that is absolute or holds "..", is
//     refused with an error that wraps ErrInvalid and names the field
//     (spec.ID, spec.Files["../x"], snapshotID, ...), before anything is
//     made.
//  2. Start writes Spec.Files and Spec.CopyIn into the sandbox (paths
//     relative to its root; symbolic links resolve inside it, never to the
//     host), then starts Spec.Init and returns when it runs. A failed
//     Start leaves nothing. An id in use, here or on disk, is ErrExists.
//  3. Stop is idempotent and thorough: it kills every process of the
//     sandbox (including daemons that left its process tree), unmounts,
//     removes its directory and cgroup, then checks that none of that is
//     left and returns ErrLeftover naming what is. It also stops a sandbox
//     that an earlier process left in the same state directory, which
//     Sandboxes lists.
//  4. Snapshot copies what the sandbox changed, not its image, so its cost
//     follows the sandbox's changes; Fork starts a new sandbox whose files
//     start as the snapshot's; DeleteSnapshot is idempotent and confirms.
//     A snapshot is complete or absent: it is built under a temporary name
//     and renamed into place.
//  5. Caps.Snapshot false means Snapshot and Fork return ErrNoSnapshot and
//     the owner runs restart_only, with one warning. Caps.KeepsProcesses
//     true means a fork resumes the snapshot's processes (see "Remote
//     providers").
//  6. Exec runs a command inside (the setup and grading hooks use it): its
//     exit code is in the result, not an error; when ctx ends, the command
//     and what it started are killed.
//
// # overlay (root, Linux)
//
// The base image is read-only, by default the host's root file system
// (only that file system: /proc, /sys, /dev and /tmp are mounted fresh
// inside). Per sandbox:
//
//	<state>/sandboxes/<id>/{upper,work,merged}   overlay: lowerdir=<base>, upperdir, workdir
//	<cgroup v2>/stillpoint-sandboxes/<h>/<id>     its cgroup (CgroupParent; h names StateDir)
//
// The overlay is mounted with index=off,redirect_dir=off,metacopy=off, so
// that an upper directory holds complete files and plain whiteouts and
// can be copied to another sandbox over the same base.
// When the base shows the state directory (it lies on the base's file
// system, as with the host root), an empty read-only tmpfs covers it
// inside every sandbox: no sandbox reads another's upper layer or a
// snapshot through the base.
//
// The first process is started by running the owner's own executable
// again (/proc/self/exe, argv[0] "stillpoint-sandbox-init", setup in the
// STILLPOINT_SANDBOX_INIT environment variable), which this package's init
// function handles before main runs. It is cloned with CLONE_NEWPID,
// CLONE_NEWNS and CLONE_NEWUTS straight into the sandbox's cgroup
// (clone3 with CLONE_INTO_CGROUP, so no process of the sandbox is ever
// outside it). As pid 1 of the new namespace it unshares a cgroup
// namespace, makes every mount private, mounts proc on /proc, a tmpfs on
// /tmp, a tmpfs /dev with null, zero, full, random, urandom, tty, a devpts
// and /dev/shm, sysfs read-only on /sys, and bind-mounts the sandbox's
// cgroup where cgroup v2 is mounted on the host (on a hybrid host, a tmpfs
// on /sys/fs/cgroup holds /sys/fs/cgroup/unified): inside, the sandbox's
// cgroup is the root of the v2 hierarchy, /proc/self/cgroup reads 0::/,
// and sandboxd can make child cgroups, move its launch into one, freeze
// and kill it. It sets the hostname to the id, pivot_roots into merged and
// detaches the host's mounts (a chroot would keep every other sandbox's
// overlay referenced), changes to Spec.Workdir and execs Spec.Init, or
// stays as a minimal init that reaps orphans. A close-on-exec pipe tells
// Start whether that exec happened; Start returns once it did. This is
// the re-exec pattern of runc and Docker: a Go process cannot enter or set
// up namespaces for itself once its threads run, but a child born in them
// only has per-process work left. The network namespace is the host's, so
// sandboxd reaches NATS on loopback.
//
// Exec runs util-linux's nsenter (--target <init> --mount --pid --uts
// --cgroup --root --wdns <dir>), itself born in the sandbox's cgroup, so
// that a snapshot freezes it and Stop kills it.
//
// Snapshot writes cgroup.freeze=1 on the sandbox's cgroup, waits for
// cgroup.events to say frozen 1 (FreezeTimeout, else ErrFreeze), copies
// upper to <state>/snapshots/<snapshot>/upper and thaws on every path.
// Child cgroups that sandboxd froze stay frozen. The copy keeps modes,
// owners, times, hard links, symbolic links, xattrs in every namespace
// (trusted.overlay.opaque marks a directory that replaced an image one),
// and device nodes (a whiteout is a character device 0/0); it reflinks
// where the file system can. Fork copies the snapshot's upper into the new
// sandbox's upper and starts it as Start does.
//
// Stop thaws the cgroup, kills the init (the kernel then kills its PID
// namespace, and nsenter reaps what it forked into it), writes
// cgroup.kill, waits until cgroup.events says populated 0, removes child
// cgroups deepest first and the cgroup, unmounts what is mounted under the
// sandbox's directory (a mount still busy after half of StopTimeout is
// detached), removes the directory, and checks /proc/self/mountinfo, the
// cgroup and the directory.
//
// Needs: root, Linux 5.7 or later (clone3 into a cgroup; openat2 needs
// 5.6, cgroup.kill 5.14 with a fallback), cgroup v2 mounted somewhere
// (found in /proc/self/mountinfo), overlayfs, nsenter. The overlay is an
// isolation of files, processes and cgroups, not a security boundary:
// root inside is root outside, and the network is shared.
//
// # dir (no privileges)
//
// A sandbox is <state>/sandboxes/<id>/root. Init (default sleep infinity)
// runs there in its own process group; Exec runs there too (or in
// opts.Dir); every process carries STILLPOINT_SANDBOX=<its directory> in
// its environment, and Stop kills the group and every process with that
// tag, so a daemon that called setsid is found too. Snapshot and Fork
// copy the directory (reflink first, else a copy; never hard links, which
// an in-place write would change in both) without pausing the sandbox: a
// snapshot is consistent when the sandbox is quiet, as it is after a
// checkpoint's prepare paused its launch.
//
// # nosnapshot
//
// NewNoSnapshot wraps a provider (Start, Stop, Exec and Sandboxes pass
// through), reports Caps{} and returns ErrNoSnapshot from Snapshot and
// Fork: the stand-in for docker, apptainer or enroot in tests of the
// owner's restart_only mode.
//
// # Choosing
//
// Default(stateDir) returns the overlay provider when the process is root
// on Linux and a trial run works (an overlay mount of an empty directory,
// a cgroup with cgroup.freeze and cgroup.kill), else the dir provider: one
// of its two results is set. Both have a Reason method saying which and
// why, for the owner's startup log.
//
// # Remote providers
//
// A provider backed by a remote API (OpenSandbox, E2B-style services) has
// the same methods:
//
//   - Start creates a sandbox from an image with Spec.Env, uploads
//     Spec.Files and Spec.CopyIn, starts Spec.Init, and waits until the
//     API says it runs. Sandbox.Root and Cgroup are "" and InitPID is 0:
//     nothing of it is on this host. Stop deletes it (a 404 is success)
//     and then lists to confirm it is gone.
//   - Exec uses the API's command endpoint.
//   - Snapshot, Fork and DeleteSnapshot map to the API's snapshot, create
//     from snapshot and delete snapshot calls; Sandboxes and Snapshots list
//     by a label the provider sets on what it creates (run and owner), so
//     leak checks see only its own.
//   - Caps: Snapshot false when the API has no snapshots (the owner runs
//     restart_only). KeepsProcesses true when the API's snapshot is a
//     memory snapshot (a microVM) whose fork resumes the processes: then
//     a restored sandboxd may still hold its paused launch, and the owner
//     reports keeps_processes so the agent tries to adopt it (PROTOCOL §6,
//     "Restore of a process-keeping snapshot") instead of relaunching.
//     Files-only snapshots (every provider in this package) report false.
//   - Leases: a remote sandbox that expires unless renewed needs a renewal
//     loop; the provider owns that goroutine and has a Close method that
//     stops it and waits, which the owner calls through io.Closer.
//
// # Files
//
// provider.go (errors and the types of the contract), spec.go (validation), overlay_linux.go,
// init_linux.go (the sandbox's first process), dir_linux.go,
// nosnapshot.go, default_linux.go, copy_linux.go (the tree copier),
// inroot_linux.go (writing files inside a root), cgroup_linux.go,
// procs_linux.go, store_linux.go (the snapshot store) and
// provider_other.go (errors.ErrUnsupported elsewhere).
package provider
