// Package registry opens a sandbox provider by name (Open: auto, overlay,
// dir or microvm) and picks the default one (Default: overlay when the
// process is root on Linux and a trial run works, else dir), each with
// the reason it was chosen.
package registry
