// Package attack is what a hostile workload does with the credentials it
// can read in its sandbox (or an agent's or an owner's, taken from their
// hosts): its attacks on the bus, each tried and reported as the
// server answered it. The attack suite runs them against live runs and
// checks that each is refused or harmless (docs/PERMISSIONS.md); `stillpoint
// attack` runs them in a loop beside a demo.
package attack
