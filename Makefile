# Stillpoint's build and test targets. `make test` is the test command the
# README and CI use; everything it needs is fetched by the go command.
# `make help` lists the targets.
#
# The tests come in tiers, each test's by its mark (internal/tier: E2E,
# Heavy, Long) and its place; the Makefile names no test:
#   make test-short   unit and conformance tests (-short: every marked test
#                     skips), under a minute
#   make e2e          the end-to-end tests: the e2e tree, and the tests
#                     marked tier.E2E elsewhere (E2E_TESTS below)
#   make test         every test but the heavy ones: the two above and the
#                     long unit tests, then every benchmark once, small
#                     (bench-once)
#   make test-heavy   the heavy end-to-end tests (tier.Heavy, package e2e
#                     only), which .ci/run runs after make test
#   make test-loaded  make test with a CPU hog on every core beside it
#   make flakes       the tiers again and again, shuffled and loaded
# STILLPOINT_TIER picks the tier a run is of: unset, every test but the
# heavy ones (make test, and a plain go test); heavy, only the heavy ones;
# all, every test. Each target sets it; one in make's environment is not
# passed on.

GO        ?= go
# An execution count, not a duration: Go 1.26's fuzz coordinator can report
# "context deadline exceeded" as a failure when a duration runs out under
# load (go.dev/issue/75804, fixed in 1.27).
FUZZTIME  ?= 100000x
# Extra flags for each fuzz run; .ci/run gives -parallel=1 (one worker).
FUZZFLAGS ?=
# Every package but the fault matrix (e2e/faults), which runs on its own:
# make faults. The longest first: go test starts the packages' test runs
# in this order, TESTP at a time; the e2e package takes most of make test's
# time, and these unit packages the most after it.
PKGS      ?= $(shell $(GO) list ./e2e ./participants/owner/provider/microvm ./participants/opencode/driver ./controller-bridge ./sandboxd/guest ./participants/agent ./participants/owner/provider/overlay ./... | grep -v '/e2e/faults$$' | awk '!seen[$$0]++')
# How many packages' tests run at once (go test -p; its default is the
# number of cores): most unit packages wait on processes, servers and
# timers, so that on 2 cores with the e2e package in one slot the rest
# would otherwise run one at a time, 20 minutes of mostly idle waiting.
# More would crowd the e2e package's tests off the CPU their scheduler
# counts on.
TESTP     ?= 3
# The packages with benchmarks, which bench-once runs: go test -bench runs
# its packages one at a time, and each without a benchmark would only cost
# its start.
BENCH_PKGS = $(shell grep -rl --include='*_test.go' '^func Benchmark' . | xargs -n1 dirname | sort -u)
# A binary built with the race detector sleeps a second as it exits, to
# let other goroutines run into a race still: every test binary and every
# process a test starts from one. The tests end after their checks: that
# second, per binary and per graceful exit of a child, is only waiting.
export GORACE ?= atexit_sleep_ms=0
# The tier of each run is set per target (STILLPOINT_TIER=... in the
# recipe), never inherited.
unexport STILLPOINT_TIER
# The end-to-end tests outside the e2e tree, found in the source as the
# fuzz targets are, so that a new one is never left out: each func Test*
# whose first statement is tier.E2E(t) (internal/tier's test checks that
# every such mark is written so), as path:name. Then their packages and a
# -run pattern of their names, for make e2e.
E2E_TESTS = $(shell grep -rl --include='*_test.go' 'tier\.E2E(.*)' . | grep -v '^\./e2e/' | sort | \
	xargs -r awk '/^func / { n = "" } /^func Test[^a-z]/ { n = $$2; sub(/[^A-Za-z0-9_].*/, "", n) } /^\ttier\.E2E\(.*\)/ && n != "" { print FILENAME ":" n }')
E2E_PKGS  = $(sort $(dir $(E2E_TESTS)))
E2E_RUN   = ^($(shell printf '%s\n' $(E2E_TESTS) | sed 's/.*://' | paste -sd'|'))$$
# The CPU hogs of test-loaded and flakes: one per core.
HOGS      ?= $(shell nproc 2>/dev/null || echo 2)
# make flakes: how many times the short tier runs; LONG=0 skips the long.
ROUNDS    ?= 3
LONG      ?= 1

# The fault kinds of `make chaos` and `make soak` (the chaos injector's
# --faults): every kind but those docs/RELIABILITY.md lists as open.
CHAOS_FAULTS ?= bridge,agent,owner,fleet,node,preempt,sandboxd,harness,stall,collector,nats
CHAOS_SEED   ?= 1

.PHONY: all help build test test-heavy test-soak bench-once test-short e2e test-loaded flakes lint fuzz bench chaos soak chaos-netns soak-netns faults ci clean microvm-assets swe-base timeline-png

all: build

build:
	$(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) build -o bin/stillpoint ./cmd/stillpoint

## help: list the targets.
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## test: every test but the heavy ones (tier.Heavy: make test-heavy), with
## the race detector, then every benchmark once at its smallest size
## (bench-once: apart, since go test -bench runs the packages one at a
## time). The README's test command. The packages
## are compiled first, so that on a cold cache the compiler does not take
## the CPU from the end-to-end tests that started first: with the race
## detector for the tests, and static (as internal/build and the README
## build the commands) for the binaries the end-to-end tests run.
test:
	$(GO) build -race $(PKGS)
	CGO_ENABLED=0 $(GO) build ./cmd/...
	$(GO) test -race -count=1 -p $(TESTP) -parallel 32 -timeout 40m $(PKGS)
	$(MAKE) --no-print-directory bench-once

## test-heavy: the heavy end-to-end tests, in parallel, with the race
## detector: about 5 minutes on 2 cores. Each keeps a core or more busy for
## minutes (OpenCode in a guest under TCG; the ten repository tasks in
## OpenCode; four OpenCode pauses, one of two minutes): a third of the
## suite's CPU between them. They are the tests of package e2e marked
## tier.Heavy, which skip unless STILLPOINT_TIER is heavy (here: every
## other test of the package skips) or all (make e2e, make flakes' long
## tier).
test-heavy:
	CGO_ENABLED=0 $(GO) build ./cmd/...
	STILLPOINT_TIER=heavy $(GO) test -race -count=1 -parallel 32 -timeout 30m ./e2e

## test-soak: the soak end-to-end tests, each tens of minutes on 2 cores
## (the SWE set through OpenCode in five guests under TCG): the tests of
## package e2e marked tier.Soak, which run only with STILLPOINT_TIER=soak.
## Too long for CI's budget; run before a release and after a change to
## the microvm provider or the image cache.
test-soak:
	CGO_ENABLED=0 $(GO) build ./cmd/...
	STILLPOINT_TIER=soak $(GO) test -race -count=1 -parallel 32 -timeout 90m ./e2e

## bench-once: every benchmark once (-benchtime 1x), at the smallest size
## internal/tier gives a smoke run, without the tests: what make test
## checks of the benchmarks; the figures are not the point (make bench).
bench-once:
	$(GO) test -race -short -count=1 -run '^$$' -bench . -benchtime 1x -timeout 20m $(BENCH_PKGS)

## flakes: look for flaky tests: the short tier ROUNDS times (default 3)
## and then the long tier (every test, heavy ones included) once, all with
## -shuffle=on beside a CPU hog per core; prints each test that failed with
## its package and seed (.ci/flakes). LONG=0 leaves the long tier out.
flakes:
	GO=$(GO) HOGS=$(HOGS) ROUNDS=$(ROUNDS) LONG=$(LONG) TESTP=$(TESTP) PKGS="$(PKGS)" .ci/flakes

## test-short: the unit and conformance tests (-race -short): the end-to-end
## and long tests skip themselves. Under a minute on 2 cores.
test-short:
	$(GO) test -race -short -count=1 -timeout 10m $(PKGS)

## e2e: the end-to-end tests: the e2e tree, heavy tests included, and the
## tests marked tier.E2E elsewhere (E2E_TESTS: the bridge's crash and
## process tests, the static sandboxd, the demo in-process, the OpenCode
## driver against the real OpenCode).
e2e:
	STILLPOINT_TIER=all $(GO) test -race -count=1 -parallel 32 -timeout 40m ./e2e/...
	$(GO) test -race -count=1 -timeout 20m -run '$(E2E_RUN)' $(E2E_PKGS)

## test-loaded: make test with HOGS CPU hogs (sha256sum /dev/zero, one per
## core) beside it, killed when the tests end, whatever their result.
test-loaded:
	@hogs=""; for i in $$(seq $(HOGS)); do sha256sum /dev/zero & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null; wait $$hogs 2>/dev/null' EXIT INT TERM; \
	echo "== make test beside $(HOGS) CPU hogs (pids$$hogs)"; \
	$(MAKE) --no-print-directory test

## lint: gofmt must have nothing to say, go vet must pass, and the docs'
## checks (a doc.go per package, a doc comment per exported name, every
## file and function ARCHITECTURE.md names, every § reference) must pass.
## vet and the docs' test build as make test does (-race), so that a cold
## build cache compiles the packages once for both.
lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet -race $(PKGS)
	$(GO) test -race -count=1 ./docs

## fuzz: a short run of every fuzz target (FUZZTIME each): each func
## Fuzz* of every _test.go file, found there, so that a new target is
## never left out.
fuzz:
	@set -e; for f in $$(grep -rlE --include='*_test.go' '^func Fuzz[A-Z]' . | sort); do \
		pkg=./$$(dirname "$${f#./}"); \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$f"); do \
			echo "$(GO) test $$pkg -run '^\$$' -fuzz '^$$fn\$$' -fuzztime $(FUZZTIME) $(FUZZFLAGS)"; \
			$(GO) test "$$pkg" -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
		done; \
	done

## faults: the fault matrix of docs/RELIABILITY.md (e2e/faults, about 7 minutes).
faults:
	$(GO) test -race -count=1 -timeout 40m ./e2e/faults/

## chaos: a 2-minute run of the chaos injector, e2e/cmd/chaos (random
## faults in rounds of collection, every PROTOCOL §7 invariant checked
## after each round). It and soak build it static, as it builds stillpoint
## and as make test builds the commands, so that a cold build cache
## compiles the packages once for all.
chaos:
	CGO_ENABLED=0 $(GO) run ./e2e/cmd/chaos --seed $(CHAOS_SEED) --duration 2m --faults $(CHAOS_FAULTS)

## soak: the 10-minute chaos soak whose table docs/RELIABILITY.md records.
soak:
	CGO_ENABLED=0 $(GO) run ./e2e/cmd/chaos --seed $(CHAOS_SEED) --duration 10m --faults $(CHAOS_FAULTS)

## chaos-netns: chaos with each NATS node and each node of an agent and
## its owner in a network namespace of its own, the network faults
## (partitions, a split cluster, latency, loss) drawn with the others (as
## root; docs/RELIABILITY.md).
chaos-netns:
	CGO_ENABLED=0 $(GO) run ./e2e/cmd/chaos --netns --seed $(CHAOS_SEED) --duration 2m

## soak-netns: the 10-minute partition soak whose table docs/RELIABILITY.md
## records.
soak-netns:
	CGO_ENABLED=0 $(GO) run ./e2e/cmd/chaos --netns --seed $(CHAOS_SEED) --duration 10m

## bench: the benchmarks recorded in docs/BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench 'Ack' -benchmem -count 3 ./events/
	$(GO) test -run '^$$' -bench PublishPhase -benchtime 3s -count 3 ./jetstream/
	$(GO) test -run '^$$' -bench PublishOnceConcurrent -benchtime 20x -count 3 ./jetstream/
	$(GO) test -run '^$$' -bench 'RawFanout|CheckpointCycle|BusFloor' -benchtime 10x -timeout 30m ./controller-bridge/
	$(GO) test -run '^$$' -bench 'Pause|RawFreeze' -benchtime 10x -count 3 -timeout 30m ./sandboxd/
	$(GO) test -run '^$$' -bench Relay -benchtime 5000x -count 3 ./sandboxd/
	$(GO) test -run '^$$' -bench AckBookFlood -benchtime 20000x -count 3 ./participants/agent/
	$(GO) test -run '^$$' -bench Checkpoint64LiveRollouts -benchtime 1x -count 1 -timeout 30m ./e2e/
	$(GO) test -run '^$$' -bench 'Scale/replicas=./members=1000$$' -benchtime 3x -timeout 30m ./e2e/ -scale.max-consumers=-1
	$(GO) test -run '^$$' -bench 'MicroVM' -benchtime 1x -count 1 -timeout 30m ./participants/owner/provider/microvm/
	$(GO) test -run '^$$' -bench 'BenchmarkStartImage|BenchmarkStart$$' -count 3 ./participants/owner/provider/overlay/
	$(GO) test -run '^$$' -bench BenchmarkGet -count 3 ./participants/owner/provider/image/

## timeline-png: regenerate docs/timeline.png, the screenshot of a demo run's
## `stillpoint timeline --html` in headless Chromium (the e2e test that checks
## the page writes it, .ci/timeline-png; needs chromium: apt-get install
## chromium).
timeline-png:
	GO=$(GO) .ci/timeline-png

## microvm-assets: download the guest kernel of the microvm provider and
## extract its vmlinux and modules into the cache (.ci/microvm-assets).
microvm-assets:
	.ci/microvm-assets

## swe-base: build the Debian base of the SWE-style set's images into its
## cache with debootstrap (.ci/swe-base; once, a minute or two).
swe-base:
	.ci/swe-base

## ci: what .ci/run does after its installs.
ci: lint test test-heavy fuzz faults chaos

clean:
	rm -rf bin .stillpoint
