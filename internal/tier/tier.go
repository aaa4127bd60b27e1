package tier

import "testing"

// E2E marks t as an end-to-end test: real processes, built binaries,
// sandboxes, crashes. It skips t under -short; make e2e and make test run
// it. A test outside package e2e that calls E2E must be named by the
// Makefile's E2E_RUN (TestMakefileNamesTheE2ETests checks).
func E2E(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: skipped under -short (make test-short); make e2e and make test run it")
	}
}

// Long marks t as a unit test that takes seconds. It skips t under
// -short; make test runs it.
func Long(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("long: skipped under -short (make test-short); make test runs it")
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
