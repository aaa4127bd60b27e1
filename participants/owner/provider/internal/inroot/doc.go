// Package inroot writes a spec's files into a sandbox's root from the
// host (Populate), resolving every path with openat2(RESOLVE_IN_ROOT): a
// symbolic link in the sandbox, even an absolute one, resolves inside it,
// never to the host. Resolve names the directory a path of the sandbox
// lands in, its symbolic links followed the same way.
package inroot
