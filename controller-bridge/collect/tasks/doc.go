// Package tasks holds the bundled task sets of the end-to-end tests, the
// demo and `stillpoint tasks`, each with the model script that drives it
// through the scripted harness.
//
// Set is the scripted set (participants/scripted): small coding tasks
// whose tool calls write files, run commands (one mid-tool long enough for
// a checkpoint to catch it) and start a process in a session of its own,
// each with the check its grade runs.
//
// Repos is the repository set, of the command kind
// (participants/owner/commandkind): small repositories with a failing
// test each (Python's unittest, shell, Go), kept as plain files under
// testdata/repos and written out at run time (one as a tarball, one as a
// git repository at a commit). The script applies each known fix with a
// tool call; the verify runs the repository's own tests, against the
// test files setup pinned; a control task's script fixes nothing.
//
// SWE is the SWE-style set, of the swe kind (participants/owner/swekind):
// five small Python libraries with an issue each, kept as plain files
// under testdata/swe (the repository at its base commit, and the test
// files as the test patch leaves them), written out as git repositories
// whose test patches and gold patches git makes, and turned into images
// (package sweimage: a debootstrap base cached once, the repository at
// /testbed) in one OCI layout, which the instances' image fields name.
//
// Write writes a set as a tasks file whose lines carry their model turns
// (modelserver.TaskLine).
package tasks
