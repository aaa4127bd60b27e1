// Package timeline turns a run's events, as the STILLPOINT stream holds
// them, into the operator's view of `stillpoint timeline`: one Op per
// checkpoint or operation (restore, release, retire, forget), each phase
// with its publish time and every member's answer (the latency from the
// publish to the ack on the stream's clock, ok or the error code, a
// prepare's blockers and readiness), members that never answered named
// as missing, and the outcome.
//
// Builder is the pure core: Add folds events in stream order, Ops and Op
// return the model as of a time passed in (a deadline that passed by then
// turns a pending ack into a missing one), Done tells a live view when an
// operation is over. It reads no clock and does no I/O. The bus side is
// Read and Follow (read.go): they read a run's events off the stream as
// Entry values, each with its one-line Summarize, and Entry.Event feeds
// them to a Builder.
//
// The model renders three ways: WriteText (plain text, members slowest
// first), the JSON of Op itself (docs/TIMELINE.md documents the schema),
// and WriteHTML, one self-contained page with a Gantt-style picture: a row
// per member, a bar per phase from its publish to that member's ack.
//
// The model copes with what a real stream holds: an ack stored before its
// phase event (kept, marked before_phase), duplicate phases and acks (a
// bridge restarted past the duplicate window: counted, the first kept),
// acks from members a phase did not name (marked unexpected), acks after
// the deadline or the outcome (late), aborted checkpoints (the aborting
// resume is marked), and a restore's new epoch (each ack carries the
// epoch its member serves).
package timeline
