// Package boxes is the registry of a provider's sandboxes: each one's
// State (its lock, its provider.Sandbox, its environment) keyed by id, and
// the life cycle every provider runs through it the same way (reserve,
// create or tear down, forget), including a sandbox an earlier process
// left on disk.
package boxes
