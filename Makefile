# ichor-policy. `make demo` runs the story on an embedded control plane;
# `make test` runs the whole suite. Both set up what they need themselves.

SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := build

# The same toolchain and flags everywhere, so the build cache is reused
# between runs, CI and the demo. They are the flags the image and the release
# compile with (deploy/image.Compile: -trimpath, no cgo), so the
# tests, the ichor they run and the image share one compile of each package:
# with cgo on, net and os/user (and all that import them) differ, and
# -trimpath changes every package's compile. The project's compile is about
# 19 CPU-minutes cold on two cores; a second one with other flags costs as
# much again (README, "What the suite costs").
export GOTOOLCHAIN := local
export GOFLAGS := -buildvcs=false -trimpath
export CGO_ENABLED := 0

# The version stamped into ichor (ichor version, ichor_build_info, the
# decision log's labels.ichor_version) and the image's tag; the image build
# passes the same LDFLAGS. Outside a git work tree it is devel.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS ?= -X github.com/ichor-dev/ichor-policy/internal/version.Version=$(VERSION) \
  -X github.com/ichor-dev/ichor-policy/internal/version.Revision=$(REVISION)

# `make image` (deploy/image): no container daemon and no registry needed.
# BASE_IMAGE empty is the empty base (a user, /tmp, CA_BUNDLE); else an OCI
# image layout directory or NAME@sha256:DIGEST, never a tag.
IMAGE_REPOSITORY ?= ghcr.io/ichor-dev/ichor-policy
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
BASE_IMAGE ?=
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
# The commit's time is the image's, so the same commit gives the same digest.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

# Control-plane binaries (kube-apiserver, etcd, and csrsigner: kube-controller-
# manager's CSR signing controller alone, all the tests run of it) are built
# from tools/envtest once and cached outside the repository; a binary missing
# from the cache, or not stamped as what this tree builds (tools/envtest/
# build.sh: its module's pins, csrsigner's sources, Go, the flags, and its
# own digest), is built on the next run.
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ichor-policy
ENVTEST_K8S_VERSION := v1.37.2
ENVTEST_ASSETS ?= $(CACHE_DIR)/envtest/$(ENVTEST_K8S_VERSION)
export KUBEBUILDER_ASSETS := $(ENVTEST_ASSETS)

# The tools are built from source with the suite's own flags (GOFLAGS,
# CGO_ENABLED) into bin/tools, where an up-to-date binary is not linked again.
# OPA is the one the binary embeds (a tool line in go.mod); the linters, Helm
# and promtool are pinned in their own tool modules, whose libraries shared
# with the project (Kubernetes' client libraries, x/net, protobuf...) are held
# at the project's versions. With one set of flags and one version, each such
# package is compiled once for the project and every tool; `go tool` would
# take none of GOFLAGS' build flags (-trimpath, -tags) and compile the
# standard library and every shared library a second time.
# $(call tool_build,MODULE_DIR,PACKAGE,NAME[,GO_BUILD_FLAGS]) prints the path.
GO_BUILD := GOTOOLCHAIN=$(GOTOOLCHAIN) GOFLAGS="$(GOFLAGS)" CGO_ENABLED=$(CGO_ENABLED) go build
tool_build = $(shell cd $(1) && $(GO_BUILD) $(4) -o "$(CURDIR)/bin/tools/$(3)" $(2) && echo "$(CURDIR)/bin/tools/$(3)")
# Each is resolved (built or found up to date) once a run.
OPA = $(eval OPA := $$(call tool_build,.,github.com/open-policy-agent/opa,opa))$(OPA)
REGAL = $(eval REGAL := $$(call tool_build,tools/regal,github.com/open-policy-agent/regal,regal))$(REGAL)
GOLANGCI_LINT = $(eval GOLANGCI_LINT := $$(call tool_build,tools/golangci-lint,github.com/golangci/golangci-lint/v2/cmd/golangci-lint,golangci-lint))$(GOLANGCI_LINT)
HELM = $(eval HELM := $$(call tool_build,tools/helm,helm.sh/helm/v4/cmd/helm,helm))$(HELM)
# promtool leaves out Prometheus's optional service discoveries (its documented
# remove_all_sd build tag): checking and testing rules never reach them, and
# they (the AWS, Azure, GCE, OCI... SDKs) are over half of promtool's source,
# more than kube-apiserver's.
PROMTOOL = $(eval PROMTOOL := $$(call tool_build,tools/promtool,github.com/prometheus/prometheus/cmd/promtool,promtool,-tags remove_all_sd))$(PROMTOOL)

POLICY := policy
# opa test's per-test timeout: OPA's default (5 s) was hit by one test on a
# loaded two-core machine; a test that takes a minute is broken, not slow.
OPA_TEST_TIMEOUT ?= 60s
# Data the policy tests read beside the rules: the shipped roles, checked
# against the purposes table (policy/ichor/credentials/roles_test.rego).
POLICY_TEST_DATA := shipped_roles:deploy/rbac/roles.yaml

GO_TEST_FLAGS ?= -count=1 -timeout 30m
# The test binaries (and the ichor the tests run) are linked without DWARF:
# nobody debugs them in a run, and the link is most of what a test binary
# costs once its packages are compiled: 40 of them took 239-245 CPU-seconds
# to link instead of 303-309 (2026-12-02). Panics and stack traces keep
# their symbols. It changes no package's compile, so the cache is shared.
GO_TEST_LINK := -ldflags=-w

.PHONY: demo
demo: build envtest-assets ## Run: the rules at work on an embedded control plane (Ctrl-C to stop)
	go run ./test/demo/cmd/demo --ichor bin/ichor $(DEMO_FLAGS)

.PHONY: build
build: ## Build bin/ichor, its version stamped (VERSION=... to choose it)
	go build -ldflags "$(LDFLAGS)" -o bin/ichor ./cmd/ichor

.PHONY: image
image: ## The manager image, without a container daemon: an OCI image layout in dist/image and its archive dist/image.tar (IMAGE_PLATFORMS, BASE_IMAGE; docs/install.md)
	@mkdir -p dist
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) go run ./deploy/image/cmd/build -o dist/image -archive dist/image.tar \
	  -version "$(VERSION)" -revision "$(REVISION)" -ldflags "$(LDFLAGS)" -repository "$(IMAGE_REPOSITORY)" \
	  -platforms "$(IMAGE_PLATFORMS)" -base "$(BASE_IMAGE)" -ca-bundle "$(CA_BUNDLE)"

# `make release VERSION=vX.Y.Z`: the files of a release in dist/ (docs/install.md,
# deploy/release): the chart package pinning the image by digest, the image as
# an OCI archive, the kubectl plugin's archives and krew manifest, a CycloneDX
# SBOM, SHA256SUMS. Each platform's binary is compiled once, for the image and
# the plugin alike.
PLUGIN_PLATFORMS ?= linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64

.PHONY: release
release: SBOM_TOOL = $(call tool_build,tools/cyclonedx-gomod,github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod,cyclonedx-gomod)
release: ## The release files in dist/ (VERSION=vX.Y.Z; IMAGE_PLATFORMS, PLUGIN_PLATFORMS, BASE_IMAGE, SIGNING_KEY; docs/install.md)
	@mkdir -p dist
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) GOWORK=off go run ./deploy/release/cmd/release -o dist \
	  -version "$(VERSION)" -revision "$(REVISION)" -ldflags "$(LDFLAGS)" -repository "$(IMAGE_REPOSITORY)" \
	  -image-platforms "$(IMAGE_PLATFORMS)" -plugin-platforms "$(PLUGIN_PLATFORMS)" -base "$(BASE_IMAGE)" -ca-bundle "$(CA_BUNDLE)" \
	  -helm "$(HELM)" -sbom-tool "$(SBOM_TOOL)" $(if $(filter 1,$(REHEARSAL)),-rehearsal) $(if $(SIGNING_KEY),-signing-key "$(SIGNING_KEY)")

.PHONY: test
test: go-lint policy-test envtest-assets go-test chart-lint ## The whole suite: gofmt, golangci-lint (go vet's checks among them), opa check/fmt/test (100% coverage), Regal, go test, the chart

.PHONY: policy-test
policy-test: ## Rego: strict check, format, tests (the shipped roles of deploy/rbac/roles.yaml as data) with 100% coverage, Regal
	$(OPA) check --strict $(POLICY)
	$(OPA) fmt --fail --list $(POLICY)
	$(OPA) test --timeout $(OPA_TEST_TIMEOUT) $(POLICY) $(POLICY_TEST_DATA)
	@cov="$$(mktemp)"; trap 'rm -f "$$cov"' EXIT; \
	  if ! $(OPA) test --timeout $(OPA_TEST_TIMEOUT) $(POLICY) $(POLICY_TEST_DATA) --coverage --threshold 100 > "$$cov"; then \
	    echo "policy coverage is below 100%; lines not covered:"; grep -A12 '"not_covered"' "$$cov"; exit 1; fi; \
	  echo "policy coverage: 100%"
	$(REGAL) lint $(POLICY)

# ICHOR_TEST_BINARY: cmd/ichor built once, for every test that runs it as a
# process (test/harness.BuildIchor); in bin/, so a warm run does not relink it.
# HELM and PROMTOOL: the chart's and the release's tests, the alerts' included.
# -vet=off: go vet's checks run once, in go-lint: golangci-lint's govet is
# every analyzer go vet runs (and inline), over the same packages and their
# tests. A vet pass type-checks every dependency too (for its facts), each
# configuration apart: go vet ./... and go test's own vet each cost about 5
# CPU-minutes cold on top of golangci-lint's (README, "What the suite costs").
ICHOR_TEST_BINARY := $(CURDIR)/bin/test/ichor

.PHONY: go-test
go-test: envtest-assets ## Go tests, integration tests against the real API server, the chart's alerts through promtool and the release included; a failure ends with a summary of the failed tests and their messages
	@[[ -x "$(HELM)" && -x "$(PROMTOOL)" ]] || { echo "go-test: helm or promtool did not build (HELM=$(HELM) PROMTOOL=$(PROMTOOL))"; exit 1; }
	go build $(GO_TEST_LINK) -o "$(ICHOR_TEST_BINARY)" ./cmd/ichor
	@log="$$(mktemp)"; trap 'rm -f "$$log"' EXIT; \
	  if ! ICHOR_TEST_BINARY="$(ICHOR_TEST_BINARY)" HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" go test -vet=off $(GO_TEST_LINK) $(GO_TEST_FLAGS) ./... 2>&1 | tee "$$log"; then \
	    echo; echo "==== failed tests, each with the lines it logged (at most 40 a test) ===="; \
	    grep -E -A40 -- '^\s*--- FAIL|^panic:' "$$log" | grep -v -E -- '^\s*--- (PASS|SKIP)' | head -400; \
	    echo "==== failed packages ===="; grep -E '^(FAIL|ok )\s' "$$log" | grep '^FAIL'; exit 1; fi

# make test runs chart-lint; its go-test runs deploy/chart's tests with the rest.
.PHONY: chart-test
chart-test: chart-lint envtest-assets ## The Helm chart: helm lint and template (default, cert-manager, monitoring), the values schema, the RBAC invariant over the render, the alerts' metrics, install and upgrade (CRDs included) on a real API server
	HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" go test $(GO_TEST_LINK) $(GO_TEST_FLAGS) ./deploy/chart/

.PHONY: chart-lint
chart-lint: ## The Helm chart: helm lint and template (default, cert-manager, monitoring), the values schema refusing bad values
	$(HELM) lint --strict deploy/chart --namespace ichor-system
	$(HELM) lint --strict deploy/chart --namespace ichor-system --set webhook.certManager.enabled=true
	$(HELM) template ichor-policy deploy/chart --namespace ichor-system > /dev/null
	$(HELM) template ichor-policy deploy/chart --namespace ichor-system --set webhook.certManager.enabled=true > /dev/null
	$(HELM) template ichor-policy deploy/chart --namespace ichor-system --set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true \
	  --api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule > /dev/null
	@for bad in replicas=5 imagee.tag=x replicaCount=two manager.leaderElect=nope; do \
	  if $(HELM) lint --strict deploy/chart --namespace ichor-system --set "$$bad" > /dev/null 2>&1; then echo "helm lint accepted --set $$bad; the values schema should refuse it"; exit 1; fi; done

.PHONY: alerts-test
alerts-test: ## Only the chart's alerts with promtool (chart-test runs them too): check rules, and fire each from synthetic series (builds promtool once: minutes)
	HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" go test -count=1 -run '^TestAlert' -v ./deploy/chart/

.PHONY: go-lint
go-lint: ## Go: gofmt, golangci-lint (govet: go vet's checks; staticcheck, errcheck, errorlint, gosec, importas, funlen, dupl; .golangci.yml)
	@files="$$(git ls-files --cached --others --exclude-standard -- '*.go')"; if [[ -z "$$files" ]]; then echo "go-lint: no Go file found (not a git work tree?)"; exit 1; fi; \
	  out="$$(git ls-files -z --cached --others --exclude-standard -- '*.go' | xargs -0 gofmt -l)"; if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOLANGCI_LINT) run ./...

.PHONY: lint
lint: go-lint ## gofmt, golangci-lint (go vet's checks among them), opa fmt/check, Regal
	$(OPA) check --strict $(POLICY)
	$(OPA) fmt --fail --list $(POLICY)
	$(REGAL) lint $(POLICY)

.PHONY: bench
bench: BENCH_DIR ?= $(CACHE_DIR)/bench
bench: BENCH_FLAGS ?=
bench: envtest-assets ## Benchmarks: decisions beside hand-written Go, the policies alone, end to end (Ichor beside a rubber stamp at N machines, over one TalosCluster and over 10, growth to 5,000; 2 replicas with --shards beside one over 10), admission, memory; results in docs/performance.md (BENCH_FLAGS="-machines 2000" for more)
	@mkdir -p "$(BENCH_DIR)"
	go test -run '^$$' -bench . -benchmem ./engine/... ./test/bench/... | tee "$(BENCH_DIR)/gobench.txt"
	$(OPA) test --timeout $(OPA_TEST_TIMEOUT) $(POLICY) $(POLICY_TEST_DATA) --bench --format gobench | tee "$(BENCH_DIR)/opabench.txt"
	go build -o "$(BENCH_DIR)/benchmanager" ./test/bench/cmd/benchmanager
	go run ./test/bench/cmd/bench -manager "$(BENCH_DIR)/benchmanager" -dir "$(BENCH_DIR)" \
	  -gobench "$(BENCH_DIR)/gobench.txt" -opabench "$(BENCH_DIR)/opabench.txt" -doc docs/performance.md $(BENCH_FLAGS)

.PHONY: fuzz
fuzz: ## Fuzz the input builder and the decision (each worker compiles the bundle under coverage instrumentation first: about a minute)
	go test -run '^$$' -fuzz FuzzKubeletServingDecision -fuzztime 3m ./engine/

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and csrsigner (kube-controller-manager's CSR signer) into the cache, once
	@tools/envtest/build.sh "$(ENVTEST_ASSETS)"

.PHONY: bundle
bundle: ## Build the policy bundle into dist/bundle.tar.gz
	go run ./cmd/ichor bundle build --policy $(POLICY) --out dist/bundle.tar.gz

.PHONY: docs
docs: ## Regenerate docs/policy.md from the rules' METADATA
	go run ./cmd/ichor policy doc --policy $(POLICY) > docs/policy.md

.PHONY: generate
generate: ## Regenerate deepcopy code and CRDs from api/v1alpha1
	tools/controller-gen/generate.sh

.PHONY: help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "%-16s %s\n", $$1, $$2}'
