// Package dir is the dir sandbox provider (no privileges): a directory
// per sandbox, its processes tagged in their environment so that Stop
// finds every one; a snapshot copies the directory. It isolates nothing.
// It keeps the contract of package provider; docs/PROVIDERS.md says how.
package dir
