# rld — build, run and test. `make run` starts the daemon on rld.toml;
# `make test` runs every test (installing what the tests need).

GO        ?= go
BIN       ?= bin/rld
FUZZTIME  ?= 60s
BENCHTIME ?= 1s
# As root the daemon uses the configured /run/rld/rld.sock; an ordinary
# user, who cannot write /run, gets ./run/rld.sock instead.
RUN_SOCKET ?= $(shell if [ -w /run ]; then echo /run/rld/rld.sock; else echo $(CURDIR)/run/rld.sock; fi)
# RUN_HTTP, when set, replaces server.http for make run ("off" disables
# HTTP): make run RUN_SOCKET=/tmp/rld.sock RUN_HTTP=127.0.0.1:9465
RUN_HTTP  ?=

# build stamps the version (git describe --tags --always --dirty without
# the tag's "v": 0.3.0 at the tag v0.3.0; without git, a VERSION file or
# "dev") and the commit into a static binary.
VERSION     ?= $(shell scripts/version.sh version)
COMMIT      ?= $(shell scripts/version.sh commit)
DEB_VERSION ?= $(shell scripts/version.sh deb $(VERSION))
DEB_OUT     ?= bin
# grpcnotrace leaves out gRPC's golang.org/x/net/trace, whose html/template
# makes the linker keep every exported method of the binary (30.7 MB
# instead of 14.2 MB).
# daemontest.BuildFlags repeats these flags, so that the tests' builds
# of cmd/rld share the build cache with this one.
TAGS        ?= grpcnotrace
LDFLAGS     := -s -w -X github.com/rld/rld/buildinfo.Version=$(VERSION) -X github.com/rld/rld/buildinfo.Commit=$(COMMIT)

.PHONY: all build deb image release run test deps bench bench-go fuzz soak lint clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rld

# deb builds the Debian package $(DEB_OUT)/rld_<version>_<arch>.deb with
# dpkg-deb (packaging/mkdeb.sh); install it with dpkg -i (docs/operations.md).
deb: build
	@packaging/mkdeb.sh $(BIN) $(DEB_VERSION) $(DEB_OUT)

# image builds the container image $(IMAGE):$(IMAGE_TAG) with podman from
# packaging/image/Containerfile: the binary `make build` stamped, on
# scratch, as uid 65532, labelled with the version and commit. Every
# timestamp is the last commit's (SOURCE_DATE_EPOCH), so one commit gives
# one image ID; the ID is written to $(IMAGE_IIDFILE).
IMAGE             ?= localhost/rld
IMAGE_TAG         ?= $(VERSION)
IMAGE_CONTEXT     ?= bin/image
IMAGE_IIDFILE     ?= bin/image.id
PODMAN            ?= podman
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image: build
	@command -v $(PODMAN) >/dev/null || { echo "make image needs podman (apt-get install podman)" >&2; exit 1; }
	@rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT) && cp $(BIN) $(IMAGE_CONTEXT)/rld
	$(PODMAN) build -q --timestamp $(SOURCE_DATE_EPOCH) --iidfile $(IMAGE_IIDFILE) \
	  --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
	  --build-arg CREATED=$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ) \
	  -f packaging/image/Containerfile -t $(IMAGE):$(IMAGE_TAG) $(IMAGE_CONTEXT)

# release builds a release from a tag at HEAD (git tag v0.3.0): the
# binary stamped with its version (bin/rld: `rld version` says 0.3.0), the
# package bin/rld_0.3.0-1_<arch>.deb, and bin/SHA256SUMS of both. It
# refuses a HEAD that is not a release tag and a tree with uncommitted
# changes. Write the release's entry in CHANGELOG.md before tagging.
release:
	@v=$$(scripts/version.sh release) || exit 1; \
	  grep -q "^## \[$$v\]" CHANGELOG.md || { echo "make release: CHANGELOG.md has no \"## [$$v]\" entry" >&2; exit 1; }; \
	  $(MAKE) --no-print-directory deb VERSION=$$v BIN=bin/rld DEB_OUT=bin && \
	  cd bin && sha256sum rld rld_$$(../scripts/version.sh deb $$v)_*.deb >SHA256SUMS && cat SHA256SUMS

# run serves until Ctrl-C (SIGINT) or SIGTERM, which drain: answers to
# requests already read are written before the daemon exits.
run: build
	@echo "rld: socket $(RUN_SOCKET); try: RLD_SOCKET=$(RUN_SOCKET) $(BIN) check endpoint=/v1/login ip=192.0.2.1; Ctrl-C stops"
	$(BIN) serve -config rld.toml -socket $(RUN_SOCKET)$(if $(RUN_HTTP), -http $(RUN_HTTP))

# deps installs the programs the tests start (redis-server, redis-cli, ...)
# with apt-get when they are missing (root only); scripts/deps.sh lists them.
deps:
	@scripts/deps.sh

# test also runs contrib/kubernetes, a module of its own (its Kubernetes
# API dependencies stay out of rld's go.mod). It uses rld's module in
# place (a replace of ../..), so a new dependency of rld's reaches it
# through -mod=mod; `cd contrib/kubernetes && go mod tidy` records it.
#
# Two test binaries run at once (-p 2): the tests mostly wait on
# processes they started, so a second package halves the wall time on
# two cores. TEST_FIRST names the longest packages, which start first
# so that none is left running alone at the end.
TEST_FIRST ?= ./daemon ./packaging ./redisx ./clients/python ./cmd/rld ./region ./shardcache ./admin ./algo
# go vet runs in lint (CI runs lint, then test), contrib/kubernetes's
# too: a cold vet compiles the whole tree a second time, without -race. test builds bin/rld first:
# the tests that run the binary build it with the same flags
# (daemontest.BuildFlags), and then find it compiled instead of
# compiling it each at once.
test: deps build
	$(GO) test -race -count=1 -p 2 -timeout 14m $(TEST_FIRST) ./...
	cd contrib/kubernetes && $(GO) test -mod=mod -race -count=1 -timeout 5m ./...

# bench measures check latency as a user's client sees it (rld-bench,
# docs/performance.md): it starts the echo server, redis-server and rld
# itself, puts the same open-loop load on each, prints echo / redis / rld
# side by side, then again with rld on Redis, and plots every curve to
# bin/bench.svg. About 80 s; needs only redis-server (make deps).
BENCH_RATE     ?= 10000
BENCH_DURATION ?= 10s
BENCH_FLAGS    ?=
bench: deps build
	$(GO) build -o bin/rld-bench ./bench
	bin/rld-bench -spawn -rld $(BIN) -targets echo,redis,rld -store embedded,redis \
	  -rate $(BENCH_RATE) -duration $(BENCH_DURATION) -plot bin/bench.svg $(BENCH_FLAGS)

# bench-go runs the Go benchmarks of the packages (not bench/'s
# BenchmarkCluster, which starts Redis Clusters: docs/performance.md).
bench-go:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) ./wire ./algo ./memstore ./policy ./daemon \
		./redisx ./deadline ./shardcache ./breaker ./coalesce ./header ./topk ./derive

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./wire
	$(GO) test -run='^$$' -fuzz='^FuzzParseLease$$' -fuzztime=$(FUZZTIME) ./policy
	$(GO) test -run='^$$' -fuzz='^FuzzParseRecall$$' -fuzztime=$(FUZZTIME) ./redisx
	$(GO) test -run='^$$' -fuzz='^FuzzPath$$' -fuzztime=$(FUZZTIME) ./derive
	$(GO) test -run='^$$' -fuzz='^FuzzDerive$$' -fuzztime=$(FUZZTIME) ./derive

# soak is a chaos run, not part of test: minutes of mixed load while Redis
# is killed, paused and restarted at random (RLD_SOAK=10m for longer).
# Its output ends with the run's one-line summary.
soak: deps
	@mkdir -p bin
	@cd daemon && RLD_SOAK=$${RLD_SOAK:-3m} $(GO) test -tags soak -run '^TestSoak$$' -count=1 -timeout 30m >../bin/soak.log 2>&1; \
	  st=$$?; grep -v '^soak:' ../bin/soak.log; grep '^soak:' ../bin/soak.log; exit $$st
	@# The multi-region checks with 60 s phases (docs/regions.md).
	RLD_REGIONS_SOAK=1 $(GO) test -race -run 'TestHammer|TestDemandShift|TestPartitioned|TestGlobalStore' -count=1 -v -timeout 30m ./region

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd contrib/kubernetes && $(GO) vet -mod=mod ./...

clean:
	rm -rf bin run
	rm -f rld-bench
