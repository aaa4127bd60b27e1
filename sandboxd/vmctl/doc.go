// Package vmctl is the wire contract of a microVM sandbox's control
// channel: what the owner's microvm provider (the host) and `sandboxd
// init` (the guest's PID 1) say to each other over the virtio-serial port
// PortName. It imports only the standard library, so both sides build it
// alone. docs/MICROVM.md is the long form.
//
//  1. Transport. One virtio-serial port named PortName: the guest opens
//     GuestPath, the host QEMU's chardev unix socket. Newline-delimited
//     JSON, one object a line, at most MaxLine bytes. The guest keeps its
//     descriptor across a snapshot and a restore; the host connects again
//     to the restored VM's socket and starts with OpHello.
//  2. Requests. Every host line is a Request with an ID (uint64, chosen by
//     the host, unique per connection) and an Op; the fields of that op
//     are set, the others left out. The guest answers each with one
//     Response of the same ID: OK, or not OK with Error. Answers may come
//     out of order (an exec runs while a lease is renewed).
//  3. Events. The guest also writes lines of its own, Events: EventReady
//     once it waits for its identity (StateTemplate: the instant the host
//     snapshots as the warm template), EventPowerOff before a lease that
//     ran out powers it off, EventLog for what the owner should log. A
//     line is an Event when it has "event"; DecodeGuestLine tells them
//     apart.
//  4. Identity. OpIdentify gives a template its sandbox id, run, bus
//     address, credentials, files and fresh entropy; OpReidentify gives a
//     fork (a VM restored from a snapshot of an identified sandbox) a new
//     identity and the restore's epoch: the running sandboxd re-identifies
//     in place (same process, its launches keep running) and joins as the
//     new member with ids drawn again from the reseeded kernel RNG. Both
//     answer once the member joined.
//  5. Lease. OpLease (and Identify's LeaseMS) sets when the guest powers
//     itself off unless renewed, so that a dead owner never leaks a
//     running VM.
package vmctl
