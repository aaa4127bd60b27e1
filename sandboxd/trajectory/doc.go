// Package trajectory is the capture of a rollout's model calls, as a
// trainer reads them: one record per call (Call), appended by the
// sandbox's model relay to a file inside the sandbox, so that a snapshot
// holds exactly the calls whose effects it holds and a fork continues the
// same file. docs/TRAJECTORIES.md is the long form.
//
//   - Assembler builds the reply of a call from the bytes the upstream
//     sent, a stream event by event: the assistant message, the finish
//     reason, usage and, where the upstream returns them, the prompt's and
//     the completion's token ids and the logprobs.
//   - Index links each call to its parent, the earlier call whose prompt
//     and completion are the longest prefix of its prompt (by token ids
//     where both carry them, else by messages), and stores the call's
//     messages and prompt ids as a delta against that parent: a file grows
//     with the conversation, not with the sum of its prompts.
//   - Check counts what a trainer must not be given silently: dangling
//     parents, branches, token breaks, duplicates and ambiguous (masked)
//     calls; Chain merges a rollout's calls into the token arrays a trainer
//     reads.
package trajectory
