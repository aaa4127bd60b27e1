// Command sandboxd is the in-sandbox daemon: it supervises the launches
// of its sandbox (the agent's harness, and the short commands the agent
// runs), pauses and continues them, and stops them; `sandboxd member` puts
// it on the bus. The command line is package cli; see `sandboxd help`.
package main
