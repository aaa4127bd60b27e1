// Package agentapi is the wire contract of an agent (PROTOCOL §6): what a
// controller sends an agent and gets back, and the bookmark the agent
// records for each rollout, which a checkpoint keeps and a restore hands
// back. It imports only events, jetstream and the standard library, so a
// controller or a test reads an agent's answers and records without
// building the agent.
//
//  1. The run endpoint. An agent serves events.ServiceSubject(run,
//     agent.<name>) + "." + EndpointRun, spsvc.<run>.agent.<name>.run: the
//     body is a Request, the answer its Result once the rollout is verified.
//     Client is the caller's side. A request asked again for the same
//     attempt joins the run in flight or gets the answer the agent kept.
//  2. Errors. A refusal is a jetstream.ServiceError whose Code is one of
//     the Code constants; a controller decides on the code (retire the
//     attempt, send it again, restore), never on the detail text.
//  3. Bookmarks. Bookmark v1 is a rollout's position, recorded before each
//     stage: seed, then the launch stage (on the wire "harness": launches
//     of the harness, the CLI agent program, until one finishes), verify,
//     return. DecodeBookmark refuses an unknown version or a bookmark its
//     stage cannot run from (ErrBadBookmark). The launch log, LaunchRecord,
//     is in the bookmark and in the Result.
package agentapi
