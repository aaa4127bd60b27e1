// Package tier marks the tests that only some tiers of the suite run, and
// picks the sizes benchmarks run at in make test (Sizes, Pick). A test's
// tier is its mark and its place, never a list of names: the Makefile
// runs the suite in five:
//
//   - make test-short: go test -race -short ./..., the unit and
//     conformance tests, in under a minute on two cores. A test marked
//     E2E, Heavy or Long skips itself there: testing.Short is the one
//     reason a test of the project may skip.
//   - make e2e: the end-to-end tests: the e2e tree, heavy tests included
//     (STILLPOINT_TIER=all), and the tests of other packages marked E2E
//     (real processes, built binaries, kill -9), which the Makefile finds
//     in the source by their mark.
//   - make test: every test but the heavy ones (go test -race ./..., with
//     STILLPOINT_TIER unset), the README's test command and what .ci/run
//     calls first.
//   - make test-heavy: package e2e with STILLPOINT_TIER=heavy, where
//     every test but those marked Heavy skips itself: the few end-to-end
//     tests whose CPU would crowd the rest of make test off a 2-core
//     machine, on their own; .ci/run runs them after make test.
//   - make test-loaded: make test with a CPU hog on every core beside it:
//     the suite must not depend on an idle machine.
//
// E2E marks an end-to-end test, Heavy a heavy one (package e2e only),
// Long a unit test that takes seconds. Each skips, saying which tier runs
// it. The package's test keeps marks and places in step: every test of
// package e2e begins with E2E or Heavy, Heavy is used nowhere else, and
// E2E elsewhere is the first statement of a Test function, where the
// Makefile finds it.
package tier
