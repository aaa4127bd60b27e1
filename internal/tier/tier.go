package tier

import (
	"flag"
	"testing"
)

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

// Sizes returns a benchmark's sizes, smallest first: all of them, or only
// the first in a smoke run (Smoke). make test runs every benchmark so,
// once each (-benchtime 1x), so that one that no longer runs fails the
// suite.
func Sizes[T any](sizes ...T) []T {
	if Smoke() && len(sizes) > 0 {
		return sizes[:1]
	}
	return sizes
}

// Pick returns full, or small in a smoke run (Smoke): the shape of a
// benchmark whose size is more than one number.
func Pick[T any](full, small T) T {
	if Smoke() {
		return small
	}
	return full
}

// Smoke reports whether the benchmarks run to show that they run, not for
// their figures: under -short, or once each (-benchtime 1x), which gives
// no figure worth the largest sizes.
func Smoke() bool {
	if testing.Short() {
		return true
	}
	f := flag.Lookup("test.benchtime")
	return f != nil && f.Value.String() == "1x"
}
