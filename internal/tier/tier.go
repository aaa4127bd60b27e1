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
