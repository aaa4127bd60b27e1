// Command chaos is the chaos injector (package e2e/chaos): rounds of
// collection on the demo's world while faults are injected, the
// invariants checked after each. Run it from the checkout:
//
//	go run ./e2e/cmd/chaos --seed 1 --duration 2m
//
// Its exit status is 0, 1 when an invariant failed in some round (the
// table says which), 2 for a wrong call; `chaos collect` exits 75 when a
// SIGTERM stopped it after a checkpoint, as `stillpoint collect` does.
package main
