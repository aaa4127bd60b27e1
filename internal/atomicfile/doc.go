// Package atomicfile replaces a small file so that a reader, or a process
// started after a crash of the machine, sees either the old content or the
// new one, never a torn mix or an empty file.
//
// Write puts the bytes in a temporary file beside the target, fsyncs it,
// renames it over the target and fsyncs the directory, so that the rename
// itself is durable. Every state file of the project goes through it: the
// member runtime's position file, sandboxd's launch records and episode
// map, the owner provider's snapshot metadata, the scripted harness's
// session.
//
// The module's top-level internal/ holds code that more than one component
// needs and none of them owns; nothing outside the module can import it.
package atomicfile
