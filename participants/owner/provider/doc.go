// Package provider is the contract of the sandbox providers the sandbox
// owner uses (PROTOCOL.md §6, "Sandbox owner"): something that starts a
// sandbox for a session, runs commands in it, snapshots it at a
// checkpoint's commit, forks the snapshot at a restore, deletes snapshots
// at a release, and stops the sandbox so that nothing of it is left. It
// holds the shape (Provider), what a sandbox is made from and of (Spec,
// Sandbox, Snapshot, Caps, Bounds), the errors, and the checks every
// provider applies to its input; no provider.
//
// # The contract
//
// Every provider has the methods of Provider. The sandbox owner declares
// the few it calls (participants/owner: Provider, Snapshotter, Lister,
// Execer), and the contract suite (providertest.Run, which each provider's
// TestContract runs) checks every provider against the whole shape. The
// rules each method keeps:
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
//     true means a fork resumes the snapshot's processes (MicroVM; see
//     docs/PROVIDERS.md, "Process-keeping providers").
//  6. Exec runs a command inside (the setup and grading hooks use it): its
//     exit code is in the result, not an error; when ctx ends, the command
//     and what it started are killed.
//
// # The providers
//
// Each is a package below this one:
//
//   - overlay (root, Linux): a read-only base (the host's root file
//     system by default) under an overlay per sandbox, the first process
//     in new PID, mount and UTS namespaces and a cgroup v2 of its own; a
//     snapshot copies the upper directory with the sandbox frozen.
//   - dir (no privileges): a directory per sandbox, its processes tagged
//     in their environment; a snapshot copies the directory.
//   - nosnapshot wraps a provider and cannot snapshot: the owner's
//     restart_only mode.
//   - microvm (root, Linux, QEMU): a QEMU microVM per sandbox, forked
//     from a warm template; a snapshot is the VM's RAM, devices and disk
//     at one instant, a fork resumes its processes and re-identifies its
//     sandboxd (docs/MICROVM.md). Its qemu subpackage runs one QEMU.
//
// Package registry opens one by name and picks the default (overlay when
// the process is root on Linux and a trial run works, else dir), saying
// why. What several providers share is under internal/. docs/PROVIDERS.md
// says how each provider keeps the contract, and what a remote provider
// (an API's sandboxes and snapshots, a microVM's memory snapshot) would
// do.
package provider
