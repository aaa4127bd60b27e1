// Package microvm is the microvm sandbox provider (root, Linux, QEMU): a
// QEMU microVM per sandbox, forked from a warm template; a snapshot is the
// VM's RAM, devices and disk at one instant, and a fork resumes its
// processes and re-identifies its sandboxd (docs/MICROVM.md). It keeps
// the contract of package provider with Caps.KeepsProcesses.
//
// The host side of the microVM feature is this package and its qemu
// subpackage (one QEMU: its command line, QMP, the control channel's
// client, the guest's images and initramfs, the accelerator probe). The
// guest side is sandboxd's: package sandboxd/guest (`sandboxd init`, PID 1
// of the guest), and sandboxd/vmctl, the control channel's wire format
// both sides speak.
package microvm
