# flashgate — `make test` is what CI runs (see .ci/run).
GO       ?= go
# The packages, as patterns in each module of MODULES: narrow both (make race MODULES=./ PKGS=./window/...).
PKGS     ?= ./...
# The modules: the sidecar's (the root), and the checks of the chart, the manifests and the monitoring kit,
# each a module of its own so that their toolkits (Helm, k8s.io, Prometheus) stay out of the sidecar's.
MODULES  ?= $(sort $(dir $(shell git ls-files --cached --others --exclude-standard go.mod '*/go.mod' 2>/dev/null || find . -name go.mod)))
# An execution count, not a duration: with a duration Go 1.26's fuzz coordinator can fail a target at the
# deadline with "context deadline exceeded" and no failing input on a loaded machine (go.dev/issue/75804,
# fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 30000x
# What `flashgate version` prints, stamped by build and image (the image's build context has no .git).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS   = -X main.stampedVersion=$(VERSION) -X main.stampedCommit=$(COMMIT)

.PHONY: test tools vet race fuzz bench build image fmt

## test: vet, then the whole suite under the race detector (Redis tests included), then short fuzz runs,
## in every module of $(MODULES).
## It installs nothing: `make tools` stops first and says what is missing (.ci/run installs it on CI).
test: tools vet race fuzz

## tools: check that the programs the tests start are on PATH; name each missing one and its Debian package.
tools:
	@missing=""; \
	for p in redis-server:redis-server redis-cli:redis-tools nginx:nginx caddy:caddy promtool:prometheus; do \
	  cmd=$${p%%:*}; pkg=$${p#*:}; \
	  command -v $$cmd >/dev/null 2>&1 || { echo "make test: $$cmd not found (Debian package $$pkg)"; missing="$$missing $$pkg"; }; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make test installs nothing: install them, then run it again. On Debian, as root, .ci/run installs"; \
	  echo "them (keeping their system services from starting) and runs make test; or by hand:"; \
	  echo "  apt-get install -y --no-install-recommends$$missing"; \
	  exit 1; \
	fi

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@for m in $(MODULES); do echo "$(GO) -C $$m vet $(PKGS)"; $(GO) -C $$m vet $(PKGS) || exit 1; done

## race: each module's packages under the race detector; the end-to-end suite (timing-sensitive fault
## tests of real serve and redis-server processes) then runs alone, not starved of CPU by other packages' tests.
race:
	@e2e=""; \
	for m in $(MODULES); do \
	  all="$$($(GO) -C $$m list $(PKGS))" || exit 1; \
	  if echo "$$all" | grep -q '/e2e$$'; then e2e="$$m"; fi; \
	  pkgs="$$(echo "$$all" | grep -v '/e2e$$' || true)"; \
	  if [ -n "$$pkgs" ]; then \
	    echo "$(GO) -C $$m test -race -count=1 -timeout 12m <$(PKGS) but e2e>"; \
	    $(GO) -C $$m test -race -count=1 -timeout 12m $$pkgs || exit 1; \
	  fi; \
	done; \
	if [ -n "$$e2e" ]; then \
	  echo "$(GO) -C $$e2e test -race -count=1 -timeout 12m ./e2e/"; \
	  $(GO) -C $$e2e test -race -count=1 -timeout 12m ./e2e/; \
	fi

## fuzz: a short run of each fuzz target, in the module its package belongs to (longer: make fuzz
## FUZZTIME=1000000x, or a duration such as 5m).
fuzz:
	@for spec in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
	  dir=$$(dirname $$spec); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$spec | sed 's/^func //'); do \
	    echo "fuzz $$dir $$f ($(FUZZTIME))"; \
	    $(GO) -C $$dir test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) . || exit 1; \
	  done; \
	done

## bench: the micro-benchmarks of BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./window/... ./extauthz/

## build: the sidecar (bin/flashgate) and the load generator with its reference server (bin/flashgate-bench).
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/flashgate ./cmd/flashgate
	$(GO) build -o bin/flashgate-bench ./cmd/flashgate-bench

## image: the container image flashgate:$(VERSION), stamped with VERSION and COMMIT.
image:
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t flashgate:$(or $(VERSION),dev) .

fmt:
	gofmt -w $$(git ls-files '*.go')
