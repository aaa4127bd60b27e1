// Package tier marks the tests that only the full tiers run, and picks
// the sizes benchmarks run at in make test (Sizes, Pick). The
// Makefile runs the suite in five:
//
//   - make test-short: go test -race -short ./..., the unit and
//     conformance tests, in under a minute on two cores. A test marked
//     E2E or Long skips itself there: testing.Short is the one reason a
//     test of the project may skip.
//   - make e2e: the end-to-end tests: the e2e package, and the tests of
//     other packages marked E2E (real processes, built binaries, kill -9),
//     which the Makefile's E2E_RUN names.
//   - make test: everything (go test -race ./...) but the heavy tests,
//     the README's test command and what .ci/run calls first.
//   - make test-heavy: the few end-to-end tests whose CPU would crowd the
//     rest of make test off a 2-core machine (the Makefile's HEAVY_RUN),
//     on their own; .ci/run runs them after make test.
//   - make test-loaded: make test with a CPU hog on every core beside it:
//     the suite must not depend on an idle machine.
//
// E2E marks an end-to-end test, Long a unit test that takes seconds. Both
// skip under -short, saying which tier runs them.
package tier
