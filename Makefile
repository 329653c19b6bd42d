# prewarm — make help lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

# Test binaries (kube-apiserver, etcd, ...) are cached outside the work tree; see hack/testbin.sh.
GO_TEST_FLAGS ?= -race -count=1 -timeout=40m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/... paths=./internal/keda/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs into config/crd/bases and the RBAC roles into config/rbac.
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths=./api/... output:crd:artifacts:config=config/crd/bases
	go run ./hack/crdversions $(addprefix config/crd/bases/inference.sagemaker.aws.amazon.com_,inferenceendpointconfigs.yaml jumpstartmodels.yaml sagemakerendpointregistrations.yaml)
	$(CONTROLLER_GEN) rbac:roleName=prewarm-controller paths=./internal/controller/... output:rbac:artifacts:config=config/rbac/controller
	$(CONTROLLER_GEN) rbac:roleName=prewarm-agent paths=./internal/agent/... output:rbac:artifacts:config=config/rbac/agent
	go run ./hack/chart charts/prewarm

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: verify
verify: $(CONTROLLER_GEN) ## Fail if generated files or go.mod are stale (regenerating them), or Go code is not gofmt'ed.
	@state() { git status --porcelain -- api config charts internal/version go.mod go.sum; git diff -- api config charts internal/version go.mod go.sum | sha256sum; }; \
	before="$$(state)"; \
	$(MAKE) -s generate manifests >/dev/null; go mod tidy; \
	test "$$before" = "$$(state)" || { echo "generated files or go.mod were stale; they are regenerated now: review and commit them"; git status --short -- api config charts internal/version go.mod go.sum; exit 1; }
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed on:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: testbin
testbin: ## Build the test binaries (kube-apiserver, etcd, kwok, versitygw, ...) if missing.
	bash hack/testbin.sh >/dev/null

# The test suites: the end-to-end tests (kwok nodes, agents as processes, S3 on loopback), the
# real-node tests (real kubelets and containers), and every other package (unit tests, and
# tests against a real kube-apiserver and etcd).
E2E_PKGS := ./test/e2e
REALNODE_PKGS := ./test/realnode
INTEGRATION_PKGS = $(shell go list ./... | grep -v -e '/test/e2e$$' -e '/test/realnode$$')

.PHONY: test-unit
test-unit: ## Unit tests only (go test -short): no test binaries needed, about a minute.
	go test -short -count=1 ./...

.PHONY: test-integration
test-integration: testbin ## Every package but the end-to-end and real-node suites: unit tests and tests against a real kube-apiserver, etcd and S3.
	go test $(GO_TEST_FLAGS) $(INTEGRATION_PKGS)

.PHONY: test-e2e
test-e2e: testbin ## The end-to-end suite: kwok nodes, the controller and agents as processes, S3 on loopback.
	go test $(GO_TEST_FLAGS) $(E2E_PKGS)

.PHONY: test-realnode
test-realnode: testbin ## The real-node suite: real kubelets, containerd and the chart (root on Debian; skips elsewhere, saying why).
	go test $(GO_TEST_FLAGS) $(REALNODE_PKGS)

# The API-level suites that also run against the oldest Kubernetes prewarm supports
# (K8S_OLDEST_VERSION in hack/testbin.sh): the CRDs, their CEL rules and the admission policies
# (test/integration), HyperPod's manifests (test/compat), the chart's objects (test/chart), and
# the seed's flow through the controller and agents onto kwok nodes (one test of test/e2e).
OLDEST_PKGS := ./test/integration ./test/compat ./test/chart
OLDEST_E2E_RUN := ^TestWeightsCacheEndToEnd$$
OLDEST_DIR = $(shell bash hack/testbin.sh --print-oldest)

.PHONY: test-oldest
test-oldest: testbin ## The API-level suites (CRDs, CEL rules, admission policies, chart, the seed's flow on kwok nodes) against the oldest supported Kubernetes's control plane.
	$(OLDEST_DIR)/kube-apiserver --version
	PREWARM_K8S_BIN_DIR=$(OLDEST_DIR) go test $(GO_TEST_FLAGS) $(OLDEST_PKGS)
	PREWARM_K8S_BIN_DIR=$(OLDEST_DIR) go test $(GO_TEST_FLAGS) -run '$(OLDEST_E2E_RUN)' $(E2E_PKGS)

.PHONY: test
test: ## In layers, stopping at the first that fails (hack/layer.sh prints each one's time): (1) verify generated files and formatting, lint, and the unit tests (-short, no test binaries); (2) build the test binaries but the oldest Kubernetes'; (3) test-integration; (4) test-e2e and test-realnode as one go test, so they share the cores, and beside them the oldest Kubernetes' binaries and test-oldest, then the engine's tests on tmpfs and ramfs.
	@bash hack/layer.sh "1/4 checks" $(MAKE) -s verify lint
	@bash hack/layer.sh "1/4 unit" go test -short $(GO_TEST_FLAGS) ./...
	@bash hack/layer.sh "2/4 test binaries" $(MAKE) -s testbin-but-oldest
	@bash hack/layer.sh "3/4 integration" --say "go test $(GO_TEST_FLAGS) on every package but $(E2E_PKGS) and $(REALNODE_PKGS)" go test $(GO_TEST_FLAGS) $(INTEGRATION_PKGS)
	@bash hack/layer.sh "4/4 end-to-end and real nodes; beside them the oldest Kubernetes and the filesystems" \
		--say "go test $(GO_TEST_FLAGS) $(E2E_PKGS) $(REALNODE_PKGS), beside it make test-oldest (building its binaries first) and hack/test-filesystems.sh" \
		bash hack/beside.sh '$(MAKE) -s test-oldest && GO_TEST_FLAGS="$(GO_TEST_FLAGS)" bash hack/test-filesystems.sh' \
		go test $(GO_TEST_FLAGS) $(E2E_PKGS) $(REALNODE_PKGS)

.PHONY: testbin-but-oldest
testbin-but-oldest: ## What layer 2 of make test builds: every test binary but the oldest Kubernetes' control plane, which layer 4 builds beside the suites that leave cores idle.
	bash hack/testbin.sh runtime k8s etcd kwok versitygw helm keda prometheus >/dev/null

##@ Release

# One version (the VERSION file) is the images' tag (v$(VERSION)), the chart's version and
# appVersion, and the default images the chart and config/ name (make manifests writes them).
CHART_VERSION := $(shell cat VERSION)
VERSION ?= v$(CHART_VERSION)
PLATFORMS ?= linux/amd64
REGISTRY ?=
# Where a release is published (.github/workflows/release.yaml runs make release).
RELEASE_REGISTRY ?= ghcr.io/prewarm
RELEASE_PLATFORMS ?= linux/amd64,linux/arm64
# E.g. --plain-http for a registry without TLS.
HELM_PUSH_FLAGS ?=
HELM = $(shell bash hack/testbin.sh --print)/helm-$(shell sed -n 's/^HELM_VERSION=\([^ ]*\).*/\1/p' hack/testbin.sh)

# The OCI layout the images are written to (hack/images empties it first: two builds at once
# need two folders).
IMAGES_OUT ?= bin/images

.PHONY: images
images: ## Build the controller and agent images, without a Docker daemon, into the OCI layout IMAGES_OUT (bin/images; VERSION, PLATFORMS).
	go run ./hack/images --out $(IMAGES_OUT) --version $(VERSION) --platforms $(PLATFORMS)

.PHONY: push
push: ## Build the images and push them to REGISTRY as REGISTRY/{controller,agent}:VERSION, the tags the chart pulls (e.g. make push REGISTRY=registry.example.com/prewarm); credentials from ~/.docker/config.json.
	@test -n "$(REGISTRY)" || { echo "set REGISTRY, e.g. make push REGISTRY=registry.example.com/prewarm"; exit 2; }
	go run ./hack/images --out $(IMAGES_OUT) --version $(VERSION) --platforms $(PLATFORMS) --push $(REGISTRY)

.PHONY: chart
chart: ## Package the Helm chart into bin/chart/prewarm-CHART_VERSION.tgz.
	bash hack/testbin.sh helm >/dev/null
	$(HELM) package charts/prewarm --destination bin/chart

.PHONY: chart-push
chart-push: chart ## Push the packaged chart to oci://REGISTRY/charts (HELM_PUSH_FLAGS, e.g. --plain-http).
	@test -n "$(REGISTRY)" || { echo "set REGISTRY, e.g. make chart-push REGISTRY=registry.example.com/prewarm"; exit 2; }
	$(HELM) push bin/chart/prewarm-$(CHART_VERSION).tgz oci://$(REGISTRY)/charts $(HELM_PUSH_FLAGS)

.PHONY: release
release: ## Publish the release: multi-arch images and the chart, to RELEASE_REGISTRY (ghcr.io/prewarm).
	@test "$(VERSION)" = "v$(CHART_VERSION)" || { echo "a release is tagged v$(CHART_VERSION) (the VERSION file), not $(VERSION)"; exit 2; }
	$(MAKE) push REGISTRY=$(RELEASE_REGISTRY) PLATFORMS=$(RELEASE_PLATFORMS)
	$(MAKE) chart-push REGISTRY=$(RELEASE_REGISTRY)

##@ Benchmarks

BENCH_FLAGS ?=

.PHONY: bench
bench: ## Benchmark the download engine against rclone, the AWS CLI and transfermanager; writes docs/benchmarks.md.
	bash hack/testbin.sh versitygw rclone >/dev/null
	@command -v aws >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq awscli >/dev/null; } || \
	  { echo "make bench needs the AWS CLI: apt-get install awscli"; exit 1; }
	go run ./test/bench/s3bench $(BENCH_FLAGS)

.PHONY: bench-nodes
bench-nodes: testbin ## On real kubelet nodes: pod start warm vs cold, image cached vs not; writes the real-node section of docs/benchmarks.md.
	PREWARM_REALNODE_REPORT=$(CURDIR)/docs/benchmarks.md go test ./test/realnode -run TestSeedOnRealNodes -count=1 -v -timeout 30m

.PHONY: bench-scaleout
bench-scaleout: testbin ## On six real kubelet nodes with KEDA and Prometheus: the seed's scale-out (1 to 3 replicas on a queue spike), caches warm against cold, each new pod's steps; writes the scale-out section of docs/benchmarks.md. Root.
	PREWARM_SCALEOUT_REPORT=$(CURDIR)/docs/benchmarks.md go test ./test/realnode -run TestScaleOut -count=1 -v -timeout 40m

BENCH_SCALE_FLAGS ?=

.PHONY: bench-fanout
bench-fanout: testbin ## N = 1, 2, 4, 8 nodes as network namespaces (tbf-shaped links, a capped origin) sharing one model, 8 with one agent stopped for 60 s mid-download, 8 with one node's link 4× slower, 8 made targets one by one 2 s apart, then 1 and 8 on links slow enough that the CPUs are not the limit; writes the fan-out section of docs/benchmarks.md. Root.
	go run ./test/bench/fanout $(BENCH_FANOUT_FLAGS)

.PHONY: bench-capacity
bench-capacity: testbin ## One agent on a disk smaller than its caches: the disk's used share over a run that asks past capacity and deletes; writes the capacity section of docs/benchmarks.md. Root.
	PREWARM_CAPACITY_REPORT=$(CURDIR)/docs/benchmarks.md go test ./test/bench/capacity -run TestDiskUseOverARun -count=1 -v

.PHONY: bench-scale
bench-scale: testbin ## The control plane on 500 to 5,000 kwok nodes with simulated agents, 1 to 50 caches, then 10 minutes of steady state per fleet (about 2 hours on 2 CPUs); writes the scale section of docs/benchmarks.md.
	go run ./test/bench/scale $(BENCH_SCALE_FLAGS)

.PHONY: bench-server
bench-server: testbin ## 1,000 kwok nodes × 50 caches on an API server allowed 0.5 CPU, 1 CPU, then the whole machine (a cgroup's CPU quota): whether the time to converge follows kwok's own time; writes its section of docs/benchmarks.md. Root.
	go run ./test/bench/scale --nodes 1000 --caches 50 --steady 0s --server-cpus 0.5,1,0

.PHONY: bench-apf
bench-apf: testbin ## 1,000 kwok nodes × 50 caches without, then with, the agents' FlowSchema, and another client's latency meanwhile; writes the API priority section of docs/benchmarks.md.
	go run ./test/bench/scale --nodes 1000 --caches 50 --steady 0s --api-priority both

.PHONY: bench-writecost
bench-writecost: testbin ## 1,000 kwok nodes × 50 caches, then 2,000 writes of each kind prewarm makes: the API server's CPU per write, and what the rollout's writes cost at that price (a larger fleet keeps this machine's API server too busy to price a write); writes its section of docs/benchmarks.md.
	go run ./test/bench/scale --nodes 1000 --caches 50 --steady 0s --write-costs 2000

##@ Build

.PHONY: build
build: ## Build every binary into bin/.
	go build -o $(LOCALBIN)/ ./cmd/...

MODEL_SIZE ?= 2GiB
SANDBOX_FLAGS ?=

.PHONY: run
run: build testbin ## Run the whole of prewarm on this machine (prewarm-sandbox up); MODEL_SIZE, SANDBOX_FLAGS.
	$(LOCALBIN)/prewarm-sandbox up --model-size $(MODEL_SIZE) $(SANDBOX_FLAGS)

##@ Tools

$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv -f $(LOCALBIN)/controller-gen $@

$(GOLANGCI_LINT):
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv -f $(LOCALBIN)/golangci-lint $@
