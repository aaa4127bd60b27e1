package tier

import (
	"os"
	"testing"
)

// Var names the environment variable that chooses the tier a test run is
// of: unset or empty, every test but the heavy and soak ones (make test,
// and a plain go test); "heavy", only the heavy ones (make test-heavy);
// "all", every test but the soak ones (make e2e, make flakes' long tier);
// "soak", only the soak ones (make test-soak). -short skips every marked
// test, whatever the tier.
const Var = "STILLPOINT_TIER"

// The values of Var besides the empty one.
const (
	heavy = "heavy"
	all   = "all"
	soak  = "soak"
)

// chosen returns Var's value, failing t on one it does not know.
func chosen(t testing.TB) string {
	t.Helper()
	v := os.Getenv(Var)
	switch v {
	case "", heavy, all, soak:
		return v
	}
	t.Fatalf("%s=%q: want it unset (every test but the heavy and soak ones), %q, %q or %q", Var, v, heavy, all, soak)
	return ""
}

// E2E marks t as an end-to-end test: real processes, built binaries,
// sandboxes, crashes. It skips t under -short and in the heavy tier;
// make e2e and make test run it. It is the first statement of its test
// (internal/tier's test checks): make e2e finds the end-to-end tests
// outside the e2e tree by it.
func E2E(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: skipped under -short (make test-short); make e2e and make test run it")
	}
	switch chosen(t) {
	case heavy:
		t.Skip("end-to-end: skipped in the heavy tier (" + Var + "=heavy, make test-heavy); make e2e and make test run it")
	case soak:
		t.Skip("end-to-end: skipped in the soak tier (" + Var + "=soak, make test-soak); make e2e and make test run it")
	}
}

// Heavy marks t as a heavy end-to-end test of package e2e, one whose CPU
// would crowd the rest of make test off a 2-core machine. It runs only in
// the heavy tier and in all (make test-heavy, make e2e, make flakes' long
// tier), never under -short. It is the first statement of a test of
// package e2e, and every other test of that package calls E2E first
// (internal/tier's test checks): so make test-heavy, which runs package
// e2e in the heavy tier, runs exactly the heavy tests.
func Heavy(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("heavy: skipped under -short (make test-short); make test-heavy runs it")
	}
	if v := chosen(t); v == "" || v == soak {
		t.Skip("heavy: runs only with " + Var + "=heavy (make test-heavy) or " + Var + "=all (make e2e)")
	}
}

// Soak marks t as a soak test of package e2e: an end-to-end test that
// takes tens of minutes on a 2-core machine (OpenCode in several guests
// under TCG), too long for CI's budget. It runs only in the soak tier
// (make test-soak), never under -short. It is the first statement of its
// test, as Heavy is.
func Soak(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("soak: skipped under -short (make test-short); make test-soak runs it")
	}
	if chosen(t) != soak {
		t.Skip("soak: runs only with " + Var + "=soak (make test-soak)")
	}
}

// Long marks t as a unit test that takes seconds. It skips t under -short
// and in the heavy tier; make test runs it.
func Long(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("long: skipped under -short (make test-short); make test runs it")
	}
	if v := chosen(t); v == heavy || v == soak {
		t.Skip("long: skipped in the " + v + " tier (" + Var + "=" + v + "); make test runs it")
	}
}

// Sizes returns a benchmark's sizes, smallest first: all of them, or under
// -short only the first. make test runs every benchmark so, once each
// (bench-once: -short -benchtime 1x), so that one that no longer runs fails
// the suite.
func Sizes[T any](sizes ...T) []T {
	if testing.Short() && len(sizes) > 0 {
		return sizes[:1]
	}
	return sizes
}

// Pick returns full, or small under -short: the shape of a benchmark whose
// size is more than one number (make test runs it small, once).
func Pick[T any](full, small T) T {
	if testing.Short() {
		return small
	}
	return full
}
