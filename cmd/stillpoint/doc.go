// Command stillpoint runs every part of Stillpoint: the embedded NATS
// server, the bridge, the agents and owners, the collector, the demo, the
// bundled task sets and their scripted model (tasks, modelserver), and the
// controller's commands (checkpoint, restore, status, ...). The command
// line is package cli; see `stillpoint --help`.
package main
