// Command scalenode runs one nats-server with JetStream as a process of its
// own, for the scale benchmark (e2e/scale_test.go, docs/SCALE.md): alone
// (the R1 server) or as one node of a cluster routed to the others (the
// R3 cluster on loopback), so that the benchmark reads each server's CPU
// from /proc and no server shares a process with the bridge or the
// members.
//
// Every server option is nats-server's default but those its flags set:
// the name, the store, the addresses, the routes, and -max-consumers, the
// server's default limit of consumers per stream (nats-server 2.15 has one
// of 1,000; -1 lifts it, 0 keeps it), and -monitor, the HTTP monitoring
// address whose /varz the benchmark reads for the messages and bytes the
// server received and sent. Once it serves it prints
//
//	scalenode <name> ready at <url> monitor <monitoring url>
//
// and it stops on SIGTERM or SIGINT.
package main
