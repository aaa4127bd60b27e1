// Package qemu runs one QEMU microVM for the microvm sandbox provider
// (its parent package): it finds the guest assets (FindAssets: the kernel
// and modules `make microvm-assets` extracts, QEMU, busybox), builds a
// guest's initramfs (Initramfs, with a cpio writer of its own) and ext4
// disk images (Ext4Image), starts QEMU with the command line of
// docs/MICROVM.md (Machine), speaks QMP to it (QMP) and the control
// channel to the guest's init (Control, the wire format of
// sandboxd/vmctl), and probes which accelerator runs at speed (Probe, PickAccel).
// It knows nothing of sandboxes or snapshots: the provider does.
package qemu
