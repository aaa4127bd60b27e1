// Package hostbin finds a harness CLI's program on the host and shows host
// programs read-only in every sandbox, for the adapters of OpenCode,
// Claude Code and Codex: NPM.Find resolves a program from an environment
// variable or an npm install in a cache directory, checking its version;
// Stage puts programs in one host directory (hard links, else copies) and
// returns the bind that shows it in the sandboxes.
package hostbin
