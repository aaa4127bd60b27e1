// Package freeport hands out loopback TCP ports that a server binds later,
// and binds again after a restart: a node of a cluster whose routes name
// every node's port before it starts, a NATS server a fault restarts on its
// address.
//
// A port found by listening on port 0 and closing is in the kernel's
// ephemeral range, which it also gives to outgoing connections: one that a
// starting cluster's node (or any other process) makes meanwhile may take
// it, and the server then fails with "address already in use". Reserve
// takes ports below that range instead, which no outgoing connection gets,
// and holds each with a lock file, so that another process of this project
// does not hand out the same one.
package freeport
