# nexjob-aws. `make help` lists the targets.
# Everything runs against the default emulator (moto, pinned, installed into
# .cache/venv and started on 127.0.0.1 by localstack/with-emulator.sh) unless
# AWS_ENDPOINT_URL is set (LocalStack) or NEXJOB_REAL_AWS=1.

SHELL := /bin/bash
GO ?= go
EMU := ./localstack/with-emulator.sh
# An execution count, not a duration: Go 1.26's fuzz coordinator can fail a
# target with a bare "context deadline exceeded" when a duration ends under
# load (golang/go#75804, fixed in Go 1.27; a fresh-clone CI hit it on
# FuzzChangeFromImages, no input written). A count has no deadline to race.
FUZZTIME ?= 20000x
# package:FuzzTarget pairs; `make test` runs each briefly, `make fuzz FUZZTIME=5m` for real (a duration then: see above).
FUZZ_TARGETS := ./enqueue:FuzzDecodeMessage ./ledger:FuzzKeyAndID ./ledger:FuzzCursor ./ledger:FuzzStepKey ./handler/guard:FuzzChangeFromImages

LAMBDAS := worker deadletter guard dashboard recurring

.PHONY: help run test check sizes timings browser redis dashboard orders fuzz bench soak vet lint emulator lambdas synth up down clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

run: ## the demo: start the emulator, provision, run the worker, enqueue the seed's jobs, print the tables
	$(EMU) $(GO) run ./cmd/nexjob demo

test: vet lint browser redis ## golangci-lint, then every test against the default emulator (started and stopped here), the browser, Redis and CDK tests, a short fuzz run
	NEXJOB_WITH_AWSCLI=1 $(EMU) $(GO) test -count=1 -timeout 20m ./...
	@# One iteration of each comparison: their like-for-like checks hold (no timings judged here);
	@# the timings go to a file, and only a failure is shown.
	@log=$$(mktemp) && $(EMU) $(GO) test -count=1 -run '^$$' -bench Ratio -benchtime 1x ./enqueue/ ./handler/ >$$log 2>&1 \
		|| { grep -v 'ns/op' $$log | tail -40; rm -f $$log; exit 1; }; rm -f $$log
	cd infra && $(GO) test -count=1 -timeout 20m ./...
	@# The example app, a module of its own: its tests start their own emulator (nexjobtest.Main);
	@# its stack's test builds its binaries and synthesises the stack.
	cd examples/orders && NEXJOB_MOTO_PYTHON=$(CURDIR)/.cache/venv/bin/python $(GO) test -count=1 -timeout 10m ./...
	cd examples/orders/deploy && $(GO) test -count=1 -timeout 10m ./...
	@$(MAKE) --no-print-directory fuzz

# The fast loop: what changed since BASE is linted, and the tests that
# need no emulator run (NEXJOB_NO_EMULATOR=1: the others skip, and the
# runnable examples, which need one, are left out; make test runs them
# all, and under CI=true a skip is a failure).
BASE ?= $(shell git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD)
check: ## the fast loop, under two minutes warm: gofmt, go vet, golangci-lint on the change since BASE, the durable-code analyzer, the tests that need no emulator
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(GOLANGCI_LINT) run --allow-parallel-runners --new-from-rev=$(BASE) ./...
	@mkdir -p build && $(GO) build -o build/nexjob-vet ./cmd/nexjob-vet
	./build/nexjob-vet -test=false ./...
	cd examples/orders && $(GO) vet -vettool=$(CURDIR)/build/nexjob-vet ./...
	NEXJOB_NO_EMULATOR=1 AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=check AWS_SECRET_ACCESS_KEY=check $(GO) test -count=1 -run '^(Test|Fuzz)' ./...

# The dashboard's browser tests drive headless Chromium: Debian's package,
# installed here where missing (as root, or through sudo).
browser: ## install Debian's chromium for the browser tests, if missing
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "installing Debian's chromium for the dashboard's browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q chromium >/dev/null || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; }; }
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null

# The newcomer's path, timed (issue 41 item 8): the quick start's first
# go test on a fresh machine and warm, make run and make check cold and
# warm, each in a clone of this checkout with empty caches (minutes: every
# module and wheel is downloaded). README's figures are its output.
timings: ## time the quick start, make run and make check, cold and warm (BenchmarkFirstWeek)
	$(GO) test -run '^$$' -bench BenchmarkFirstWeek -benchtime 1x -timeout 60m ./internal/proof/docs/

# The idempotency utility's Redis store is tested against a real server:
# Debian's redis-server, installed here where missing; its tests start
# their own on a free loopback port (or use REDIS_ADDR).
redis: ## install Debian's redis-server for the Redis store's tests, if missing
	@command -v redis-server >/dev/null || command -v valkey-server >/dev/null || { \
	  echo "installing Debian's redis-server for the idempotency Redis store's tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q redis-server >/dev/null || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q redis-server >/dev/null; }; }
	@command -v redis-server >/dev/null || command -v valkey-server >/dev/null

dashboard: ## the demo, then its jobs in the web dashboard on http://127.0.0.1:8080/ (WRITE=1: actions on)
	$(EMU) $(GO) run ./cmd/nexjob demo --dashboard 127.0.0.1:8080 $(if $(WRITE),--write)

fuzz: ## run each fuzz target for FUZZTIME executions (seed corpora in testdata/fuzz)
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

# The Ratio benchmarks compare ours with the bare SDK calls they make and
# print "ratio NAME time X, allocations Y" (ours / bare); README's cost
# section copies them. The rest measure enqueues on the emulator.
bench: ## ours vs the bare SDK (the four ratios), then the emulator benchmarks
	@mkdir -p build
	@# In memory: 35 rounds of 150 ms a side (benchcmp.InMemoryRounds); on the emulator: 7 of 1 s.
	set -o pipefail; $(GO) test -run '^$$' -bench 'Ratio(EnqueueCPU|Handle)$$' -benchtime 150ms -benchmem ./enqueue/ ./handler/ | tee build/bench.txt
	set -o pipefail; $(EMU) $(GO) test -run '^$$' -bench 'RatioEnqueue(Throughput|Many)$$' -benchtime 1s -benchmem ./enqueue/ | tee -a build/bench.txt
	@echo; echo "ours / bare SDK, per operation:"; grep -E '^ratio|jobs/s' build/bench.txt
	$(EMU) $(GO) test -run '^$$' -bench 'Enqueue$$' -benchtime 200x ./enqueue/
	$(EMU) $(GO) test -run '^$$' -bench 'StepVsPutItem' -benchtime 300x ./handler/
	$(EMU) $(GO) test -run '^$$' -bench 'DurableJobSteps' -benchtime 1x -timeout 60m ./handler/

# The long chaos soak (internal/proof/soak): JOBS jobs under every fault at once,
# a fresh seed unless SEED= replays one. make test runs the short soak
# (TestShortSoak: three fixed seeds, 200 jobs each).
SEED ?=
JOBS ?= 10000
soak: ## the long chaos soak: JOBS (10000) jobs, faults, kills and duplicates at once; SEED=... replays a seed; run logs kept in .cache/soak
	set -o pipefail; NEXJOB_SOAK_DIR=$(CURDIR)/.cache/soak NEXJOB_SOAK_SEED=$(SEED) NEXJOB_SOAK_JOBS=$(JOBS) $(EMU) $(GO) test -tags soak -count=1 -timeout 180m -run '^TestSoak$$' -v ./internal/proof/soak/ | grep -vE '^=== (RUN|PAUSE|CONT)'

vet: ## no tracked file over 1 MB, gofmt check, go vet, and the durable-code analyzer (cmd/nexjob-vet) on our code and the orders example
	@./.ci/check-sizes
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	cd infra && $(GO) vet ./...
	cd examples/orders && $(GO) vet ./...
	cd examples/orders/deploy && $(GO) vet ./...
	@mkdir -p build
	$(GO) build -o build/nexjob-vet ./cmd/nexjob-vet
	./build/nexjob-vet -test=false ./...
	cd examples/orders && $(GO) vet -vettool=$(CURDIR)/build/nexjob-vet ./...

GOLANGCI_LINT := github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

lint: ## golangci-lint (pinned; config and reasons in .golangci.yml) on every module: ours, infra and the example app's two
	$(GO) run $(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd infra && $(GO) run $(GOLANGCI_LINT) run --allow-parallel-runners --config ../.golangci.yml ./...
	cd examples/orders && $(GO) run $(GOLANGCI_LINT) run --allow-parallel-runners --config ../../.golangci.yml ./...
	cd examples/orders/deploy && $(GO) run $(GOLANGCI_LINT) run --allow-parallel-runners --config ../../../.golangci.yml ./...

emulator: ## run the default emulator in the foreground; prints the export lines for another shell
	$(EMU) bash -c 'for v in AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY; do echo "export $$v=$${!v}"; done; sleep infinity'

lambdas: ## build each Lambda's bootstrap (linux/arm64) into build/lambda/NAME/
	@for f in $(LAMBDAS); do mkdir -p build/lambda/$$f; \
	  GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags=-s -o build/lambda/$$f/bootstrap ./lambda/$$f || exit 1; done

# The bare worker (internal/proof/bareworker) makes our worker's common calls
# with the bare SDK and nothing of ours: what the SDK and the runtime weigh alone.
SIZES := worker:./lambda/worker serve:./lambda/serve bare:./internal/proof/bareworker

sizes: ## the seed worker's bootstrap against Serve's (one binary, every role) and a bare SDK worker's: bytes (linux/arm64, -s) and package init time (GODEBUG=inittrace=1, native, 5 runs)
	@mkdir -p build/sizes
	@for fp in $(SIZES); do f=$${fp%%:*}; pkg=$${fp#*:}; \
	  GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags=-s -o build/sizes/$$f-arm64 $$pkg || exit 1; \
	  CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags=-s -o build/sizes/$$f $$pkg || exit 1; \
	  inits=$$(for i in 1 2 3 4 5; do NEXJOB_ROLE=worker GODEBUG=inittrace=1 build/sizes/$$f 2>&1 >/dev/null | \
	    awk '/^init /{ms+=$$5; kb+=$$8} END{printf "%.2f ms %.0f KB\n", ms, kb/1024}'; done | sort -n | tr '\n' ';'); \
	  printf '%-7s %s bytes; package init (5 runs, sorted): %s\n' $$f "$$(stat -c %s build/sizes/$$f-arm64 | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')" "$$inits"; done

orders: ## build the example app's bootstraps and synthesise its stack into examples/orders/deploy/cdk.out
	@for f in worker producer payments; do mkdir -p examples/orders/build/$$f; \
	  (cd examples/orders && GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags=-s -o build/$$f/bootstrap ./cmd/$$f) || exit 1; done
	cd examples/orders/deploy && $(GO) run ./app

synth: lambdas ## write the CloudFormation template to infra/cdk.out (no CDK CLI needed)
	cd infra && $(GO) run ./app
	@ls infra/cdk.out/*.template.json

up: ## start LocalStack with docker compose (needs a Docker engine)
	docker compose up -d --wait

down: ## stop LocalStack
	docker compose down

clean: ## remove the emulator's virtualenv and build output
	rm -rf .cache build
