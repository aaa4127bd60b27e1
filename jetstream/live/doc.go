// Package live is how a participant talks with members that answer on core
// NATS, where a message is delivered at most once and a member may be away
// for a moment (reconnecting) or for good (PROTOCOL §3, acks and Liveness).
// It has three parts, each used wherever its concept appears:
//
//   - Inboxes: what listens for a phase's answers, opened before the phase
//     is published and filed by the phase's sequence, so that no answer
//     comes before its inbox (Listen subscribes and returns once the
//     server has the subscription). Inboxes that nothing took are bounded.
//   - Prober and Silence: asking a member whether it is there, on its alive
//     subject (events.AliveSubject), with a phase named (events.AliveQuery)
//     when the asker waits for its ack, and the silence rule: requests that
//     find no responder for events.AliveUnanswered find the member gone.
//     A request that times out proves nothing.
//   - Retry: a request asked again while nobody answers it (no responders:
//     the request reached no one, so asking again is safe), with a backoff
//     from internal/poll, for a bounded time or until ctx ends.
//
// The package imports nats.go, events and internal/poll, never package
// jetstream, which uses it.
package live
