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
// published) and bridge/mid-release (a released
// checkpoint's records deleted, its manifest not yet).
package failpoint
