// Package build builds the module's programs as the static binaries the
// tests and the demo run: stillpoint, and sandboxd and the scripted
// harness, which go into sandboxes and so must not need a C library
// (CGO_ENABLED=0).
//
// Static builds main packages given by their directory under the module
// root (Stillpoint, Sandboxd, ScriptedHarness, or a test's own program
// such as ./sandboxd/testdata/threads) with the go command, and returns
// where each binary is:
//
//	bins, err := build.Static(ctx, build.Sandboxd, build.ScriptedHarness)
//	sandboxd := bins[build.Sandboxd]
//
// StaticForTest does the same for a test and fails it if the build fails.
//
// The module root is the one of the working directory (`go env GOMOD`):
// a package's directory for its tests, the checkout for the demo, which
// is why the demo is run from there.
//
// A program is built once per process. Across processes (the test
// binaries of `go test ./...` run side by side, the demo after them) the
// builds share a directory in the user's cache directory, one per
// checkout: the go command's own up-to-date check skips a link whose
// sources did not change, so a second package's build costs a second or
// less instead of a link of every binary. A file lock serializes the
// processes' builds. A binary handed out is never changed in place: it is
// copied, under a name made of its content's hash, into a directory of
// its own, so that a later build, even of changed sources, cannot touch a
// binary that a test or a sandbox of another process is running. Copies
// unused for a day are removed.
package build
