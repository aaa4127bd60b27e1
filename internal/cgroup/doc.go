// Package cgroup drives cgroup v2 directories: it finds the hierarchy and
// this process's place in it, makes and removes child cgroups, moves
// processes in, freezes and thaws with a confirmation from the kernel,
// kills everything inside, and lists what is inside. It sets no resource
// limits and enables no controllers: freeze and kill are core files of
// every cgroup v2 directory, and nothing in the project limits a sandbox
// yet.
//
// # Where the hierarchy is
//
// Mount returns where cgroup2 is mounted: /sys/fs/cgroup on a unified
// host, /sys/fs/cgroup/unified on a hybrid one (cgroup v1 controllers
// beside it). Self joins the "0::" line of /proc/self/cgroup to the mount
// whose root holds it, so that it also works inside a cgroup namespace.
// The cgroup v1 freezer is never used.
//
// # A cgroup is a directory
//
// Dir is the path of one cgroup directory. Create makes it (its parent must
// be a cgroup), Remove removes it and every cgroup below it, deepest first,
// retrying while the kernel still counts a dying process (EBUSY). A
// process is born in a cgroup with clone3's CLONE_INTO_CGROUP and the
// descriptor of OpenFD (syscall.SysProcAttr.UseCgroupFD), or moved in
// later with Add.
//
// # Freezing
//
// Writing 1 to cgroup.freeze asks the kernel to freeze every task; the
// freeze has taken hold only once cgroup.events says "frozen 1". WaitEvents
// waits for such a condition in ppoll(POLLPRI), which the kernel wakes when
// cgroup.events changes, and also re-reads the file every 50 µs doubling
// to 1 ms, since the kernel notifies at most once per 10 ms per file.
// Freeze and Thaw write and wait; SetFreeze only writes.
//
// # Killing
//
// Kill writes cgroup.kill (Linux 5.14), which SIGKILLs every process of the
// cgroup and its descendants, frozen or not; on older kernels it signals
// each process listed in the cgroup.procs files. The cgroup is empty once
// cgroup.events says "populated 0" (Events, WaitEvents).
//
// Everything here needs Linux; elsewhere the functions return
// errors.ErrUnsupported.
package cgroup
