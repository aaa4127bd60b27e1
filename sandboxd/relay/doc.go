// Package relay is the model relay of a sandbox: an HTTP server on a
// sandbox port that a harness is given as its model URL, forwarding every
// request (chat completions, Anthropic Messages, OpenAI Responses, or any
// other path), streaming (SSE) or not, to the current upstream, so that a checkpoint can hold model calls still and a restore
// can send them on to another model server (PROTOCOL §6, Model relay).
//
//  1. Calls. Every request is one call, recorded once: a sequence number,
//     the hex SHA-256 of its method, path and body (the digest), the
//     generation of the upstream it went to, and its state (held,
//     forwarding, replied, delivered, failed: sandboxapi.CallState). A call
//     moves forward only, and a transition the table does not list is
//     refused. Finished calls are counted and forgotten; the open ones are
//     in Status.
//  2. Hold. Hold (a checkpoint's prepare) makes new calls wait, read whole,
//     before they are forwarded, and keeps the reply of every call in flight
//     from reaching the harness: the upstream's bytes are read and kept,
//     and nothing is written until Release (the continue). A harness
//     frozen or not sees only a slow model call. The relay runs inside
//     sandboxd, which must answer the bus while the launch is frozen, so it
//     is held rather than frozen: nothing times out while it holds, and
//     no call ends on the clock a restore moves (its one timer paces the
//     dials of an upstream it could not reach, which a dial count bounds
//     too, and runs only while it does not hold).
//  3. Re-send. Repoint(url, generation) accepts only a higher generation.
//     Every call of an older generation whose reply has not ended upstream
//     (the snapshot caught it in flight, or its connection died with the
//     old VM) has its attempt cut, and is sent again, the same bytes, to
//     the new upstream once the relay is released; so is a call whose
//     attempt failed while the relay was held. Drop, instead of Release,
//     fails every call the hold kept: those of a launch its agent abandoned
//     never reach the next model server. A reply already partly delivered
//     continues only if the new reply starts with the same bytes; otherwise
//     the harness's connection is cut, never spliced. What was delivered is
//     kept as its length and SHA-256, not a copy.
//  4. Limits. At most Config.MaxOpenCalls calls are open (one more is
//     refused at once, 503 too_many_calls, its body unread), and the open
//     calls keep at most Config.MaxOpenBytes of request bodies and reply
//     bytes not yet delivered: a request past it is refused (503
//     too_many_calls); a reply past it is read as the harness takes it,
//     one read at a time, and not at all while the relay holds. A reply's
//     buffer is trimmed as it is delivered. What the capture or the
//     translation keeps of a reply until its end counts too; a plain reply
//     is kept whole up to Config.MaxKeptReply (32 MiB), past which a native one passes as it
//     comes and a translated one fails (502: a translation cannot pass
//     half a body).
//  5. Refusals. A request over Config.MaxRequestBytes (413), no upstream
//     (503), an upstream still unreachable after Config.UnreachableFor
//     (dialed again meanwhile: the request never left, so nothing is
//     repeated) or one that breaks off while the relay is not held (502):
//     the harness gets a
//     JSON error object naming the cause ({"error": {"message", "type":
//     "relay_error", "code"}}), and the call is recorded once, as failed.
//     While the relay holds, no answer is written, an error no more than a
//     reply: a refusal waits for the release, and an attempt that failed is
//     sent again then. An upstream's own error status is a reply like any
//     other and passes through unchanged. A body the relay cannot parse
//     (not JSON, not its API's shape) is no refusal: it is forwarded as it
//     came and recorded, and the upstream judges it.
//  6. Capture. With Config.Capture, every call the upstream answered is
//     recorded once in the sandbox's capture file (package
//     sandboxd/trajectory), under the launch Label names, its id sent
//     upstream (trajectory.IDHeader): a call cut and sent again is
//     recorded with the reply of the attempt that ended. The record is
//     written before the end of the reply reaches the harness (a stream's
//     bytes from the line that finishes it on, a plain reply whole, wait
//     for it), and fsync'd right after; Hold returns once every record is
//     durable. The finishing line is each API's: a finish_reason or
//     [DONE] (chat completions), message_delta's stop_reason or
//     message_stop (Messages), response.completed (Responses). With
//     Config.Tokens a chat completion's upstream is asked for token ids
//     and logprobs, and the harness gets its reply without what it did not
//     ask for (capture.go); a Messages or a Responses call goes as it came.
//  7. Translation. With Config.Translate, a Messages or a Responses call
//     goes upstream as a chat completion (translate.go) and its reply
//     comes back in the harness's API (translate_reply.go); the capture
//     records the chat completion's reply and tokens.
//  8. Edits. Label names, with the launch, the relay edits (edits.go)
//     applied to each of its requests before anything else sees the body:
//     the digest, the bytes sent upstream (and sent again) and the record
//     are of the edited body, and the record lists what was removed.
//  9. Branch. LabelBranch (a launch of a branch) and RepointBranch (a fork
//     continuing in place as one) set a branch label: every call is sent
//     with the label in force when it is sent, a cut call sent again
//     included: the sandboxapi.BranchHeader and SeedHeader headers, and a
//     chat completions or Responses body that sets no seed gets the
//     label's, an edit the record lists (branch.go). The record names the
//     label and the seed.
//
// Run listens on Config.Listen and serves until its context ends, then
// closes every connection and waits for every handler and upstream read it
// started.
package relay
