// Package copytree copies a directory tree exactly, as a snapshot or a
// fork needs it: data (reflinked where the file system can), modes,
// owners, times, extended attributes (overlay's whiteouts and opaque
// marks among them), hard links, symbolic links and special files.
package copytree
