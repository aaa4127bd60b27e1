# Stillpoint's build and test targets. `make test` is the test command the
# README and CI use; everything it needs is fetched by the go command.

GO        ?= go
# An execution count, not a duration: Go 1.26's fuzz coordinator can report
# "context deadline exceeded" as a failure when a duration runs out under
# load (go.dev/issue/75804, fixed in 1.27). 400,000 runs take about 15 s here.
FUZZTIME  ?= 400000x
PKGS      ?= ./...

.PHONY: all build test lint fuzz bench ci clean

all: build

build:
	$(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) build -o bin/stillpoint ./cmd/stillpoint

## test: every test, with the race detector (the README's test command).
test:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## lint: gofmt must have nothing to say, go vet must pass, and the docs'
## checks (a doc.go per package, a doc comment per exported name, every
## file and function ARCHITECTURE.md names, every § reference) must pass.
lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) test -count=1 ./docs

## fuzz: a short run of every fuzz target (FUZZTIME each).
fuzz:
	$(GO) test ./events -run '^$$' -fuzz '^FuzzUnmarshal$$' -fuzztime $(FUZZTIME)

## bench: the benchmarks recorded in docs/BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench 'Ack' -benchmem -count 3 ./events/
	$(GO) test -run '^$$' -bench PublishPhase -benchtime 3s -count 3 ./jetstream/
	$(GO) test -run '^$$' -bench PublishOnceConcurrent -benchtime 20x -count 3 ./jetstream/
	$(GO) test -run '^$$' -bench 'RawFanout|CheckpointCycle|BusFloor' -benchtime 10x -timeout 30m ./controller-bridge/
	$(GO) test -run '^$$' -bench 'Pause|RawFreeze' -benchtime 10x -count 3 -timeout 30m ./sandboxd/
	$(GO) test -run '^$$' -bench Checkpoint64LiveRollouts -benchtime 1x -count 1 -timeout 30m ./e2e/

## ci: what .ci/run does.
ci: lint test fuzz

clean:
	rm -rf bin .stillpoint
