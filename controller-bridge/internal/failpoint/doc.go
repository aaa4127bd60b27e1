// Package failpoint kills the process at named points when the environment
// asks for it, so that crash tests can stop a real process exactly where
// they mean to, without timing. STILLPOINT_FAILPOINTS is a comma-separated
// list of names; a process that reaches a listed point sends itself SIGKILL.
//
// The bridge's points are named after the effect they follow:
// bridge/after-prepare, -commit, -restore, -release and -branch right after
// that phase is published; bridge/after-prepare-acks, -commit-acks,
// -restore-acks and -branch-acks once the phase is decided; bridge/after-member-list (the
// checkpoint's member list written, its manifest not yet), after-manifest,
// bridge/after-abort-marker, bridge/after-latest, bridge/after-outcome
// (checkpoint.committed), bridge/after-restore-retire and
// bridge/after-branch-retire (the retire of a failed restore or branch,
// published). A release has one after each of its writes: bridge/after-release
// (the phase published), bridge/after-release-mark (a checkpoint marked
// released), bridge/after-release-records (a member's records object
// deleted), bridge/after-release-member-list (a checkpoint's member list
// deleted), bridge/mid-release (a checkpoint's objects all deleted, its
// keys not yet), bridge/after-release-manifest (a checkpoint's key
// purged), bridge/after-release-latest (LATEST purged) and
// bridge/after-release-outcome (release.completed or release.failed).
package failpoint
