// Package feed is where a member's events come from: the run's phases
// (PROTOCOL §3) and the committed outcomes a stop commit parks on, handed
// to the member's loop as Deliveries, each to be answered once (Ack, Nak
// or Term). The member runtime (package member) opens one Feed per Run,
// before it registers, starts it once registered, and stops it when its
// loop has returned.
//
// There are three:
//
//   - Durable: the member's one durable consumer (an agent's, an owner's),
//     state in memory, made again from the first event not handled when
//     the server loses it; the committed outcomes come on a core
//     subscription beside it.
//   - Core: no consumer at all (a sandbox daemon's): a core-NATS
//     subscription of the phases the stream republishes, with catch-up
//     from the stream by direct get at start, after a reconnect and at a
//     gap in the phase sequence, and a position kept in a state file.
//     For a user whose direct gets must name their subject, the catch-up
//     reads the newest phase of each kind, and a Missed notice tells the
//     loop what it could not read again.
//   - Shared: a member's part of a Source that a process shares among its
//     members (membertest.Host).
//
// The package imports events and internal/atomicfile of this module; the
// member's configuration (member.DurableConfig, member.Config.StateFile)
// comes in through DurableOptions and CoreOptions.
package feed
