// Package guest is sandboxd as the init of a microVM sandbox (`sandboxd
// init`, PID 1 of the guest): it boots the guest into its root disk, then
// serves the control channel (package vmctl) to the owner's microvm
// provider: it tells its state, takes its identity (reseeding the kernel
// RNG, setting the clock, writing the sandbox's files and starting
// sandboxd member, or a plain init), re-identifies a fork in place, runs
// commands, keeps the lease, and syncs before a snapshot. docs/MICROVM.md
// is the long form.
//
// # Boot
//
// Boot (Linux) mounts /proc, /sys and /dev in the initramfs, loads the
// modules it lists (busybox modprobe), brings up eth0 on slirp's fixed
// address, mounts the root disk (the sandbox's qcow2 overlay on the host)
// and the read-only binaries disk, switches root into the disk (MS_MOVE
// and chroot, as switch_root) and mounts cgroup2, /dev/pts, /dev/shm,
// /tmp and /run there. ParseCmdline reads its sp.* kernel parameters.
//
// # Serving
//
// Server reads the host's requests, one line each, and answers each in a
// goroutine of its own (an exec does not hold up a lease renewal); it owns
// the state (template, then identified) and serialises identify and
// reidentify. What an op does to the machine is its Guest: System on
// Linux, whose Members (the init's, over daemon.Resident) starts and
// re-identifies the bus member. Port is the virtio port, whose reads wait
// through the times the host is not connected (before it connects, after
// a restore until it connects again).
//
// # Randomness
//
// Forks of one snapshot share the kernel's random state and every id a
// process drew. Reseed adds the host's entropy with RNDADDENTROPY and
// reseeds the CRNG with RNDRESEEDCRNG before anything of a new identity
// is drawn; the member then draws every id from crypto/rand again (see
// daemon.Resident).
//
// # Lease
//
// Lease powers the guest off (sync, reboot(POWER_OFF): QEMU runs with
// -no-reboot and exits) when the host stops renewing it.
package guest
