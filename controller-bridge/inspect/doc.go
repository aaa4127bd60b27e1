// Package inspect reads what a run keeps on the bus, as an operator asks
// for it with `stillpoint inspect --run R`: the checkpoints whose
// manifests are kept, each member manifest checked against the records
// object it names (its size and sha256 recomputed from the bytes in
// sp_records, or in the member's own store that its manifest names), the
// run's LATEST and HEAD records, the snapshots the owner's index
// (sp_snapshots) holds for the run and which checkpoints name them, and
// the live members (sp_members, and sp_daemons for the sandbox daemons)
// with their instances and epochs.
//
// It only reads: nothing is created or provisioned. A bus that lacks one
// of the buckets is refused with ErrNoBucket naming it; a run id that is
// not a valid token with ErrBadRun. What a finished run leaves after its
// final release (the manifests deleted) is on the stream instead: see
// docs/POSTMORTEM.md.
package inspect
