// Package atomicfile replaces a small file so that a reader, or a process
// started after a crash of the machine, sees either the old content or the
// new one, never a torn mix or an empty file.
//
// Write puts the bytes in a temporary file beside the target, fsyncs it,
// renames it over the target and fsyncs the directory, so that the rename
// itself is durable. Replace is the same without the fsyncs.
//
// JSON[T] is a state file holding one JSON value of type T: its path, mode
// and layout, with Read, Write and Replace. Read refuses content that is
// not one whole value (empty, torn, trailing data) with an error naming
// the file; DecodeJSON is that check on bytes, for a reader that checks
// more (a version, ids) and is fuzzed. Every JSON state file of the
// project is written through one: the member runtime's position file,
// sandboxd's launch records and episode map (these three read with
// DecodeJSON), the owner provider's snapshot and VM metadata, the scripted
// harness's and the OpenCode driver's sessions, the authority's limits.
//
// The module's top-level internal/ holds code that more than one component
// needs and none of them owns; nothing outside the module can import it.
package atomicfile
