#!/usr/bin/env bash
# Builds, from the Go module proxy, the pinned binaries that prewarm's tests run for real:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd, kwok (with its "fast"
# stages), versitygw and helm; the control plane of the oldest Kubernetes prewarm supports
# (kube-apiserver, kube-controller-manager and kube-scheduler at $K8S_OLDEST_VERSION, for
# make test-oldest); and, as root on Debian, the container runtime the real-node tests
# run their kubelets on (containerd, runc and the CNI plugins, from Debian's packages). Everything lands in one cache folder outside the work tree, keyed by version,
# so a second run (and every CI run on the same machine) only checks that the files are there.
#
#   hack/testbin.sh            build what is missing, print the folder
#   hack/testbin.sh etcd kwok  build only these (k8s, oldest, etcd, kwok, versitygw, helm, runtime,
#                              keda, prometheus, rclone) if missing;
#                              rclone, for make bench only, is built only when named
#   hack/testbin.sh --print    print the folder without building
#   hack/testbin.sh --print-oldest
#                              print the folder of the oldest supported control plane (its
#                              kube-apiserver, kube-controller-manager and kube-scheduler; the
#                              tests take them from there when PREWARM_K8S_BIN_DIR names it, and
#                              everything else from the folder above)
#
# The folder is $PREWARM_TESTBIN if set, else ${XDG_CACHE_HOME:-$HOME/.cache}/prewarm/testbin.
set -euo pipefail

K8S_VERSION=v1.37.2          # k8s.io/kubernetes; staging modules at v0.${K8S_VERSION#v1.}
ETCD_VERSION=v3.7.0          # the etcd server that kubernetes $K8S_VERSION is built against
KWOK_VERSION=v0.8.0
VERSITYGW_VERSION=v1.8.0
RCLONE_VERSION=v1.76.0        # only for make bench: hack/testbin.sh rclone
# Autoscaling as HyperPod's chart installs it (KEDA) and the metrics server its triggers query
# (Prometheus): the real-node autoscaling test.
KEDA_VERSION=v2.21.0
PROMETHEUS_VERSION=v0.316.0   # Prometheus 3.16.0
HELM_VERSION=v3.22.0          # the chart's tests: helm lint, helm template
# The lowest Kubernetes prewarm supports (README, docs/operations.md "Requirements"): make
# test-oldest runs the API-level suites against its control plane. Its kube-apiserver talks to
# the etcd above (etcd's v3 API; the 3.5 client of Kubernetes 1.31 works with a 3.7 server).
K8S_OLDEST_VERSION=v1.31.14
# Staging modules of $K8S_OLDEST_VERSION that the Go module proxy does not serve at
# v0.${K8S_OLDEST_VERSION#v1.}: the same minor's nearest patch that it does (kube-controller-manager's
# and kube-scheduler's configuration types, the EndpointSlice helpers).
K8S_OLDEST_STAGING_PINS="k8s.io/endpointslice@v0.31.13 k8s.io/kube-controller-manager@v0.31.13 k8s.io/kube-scheduler@v0.31.13"

root="${PREWARM_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/prewarm/testbin}"
dir="$root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-versitygw-$VERSITYGW_VERSION"
oldest_dir="$root/k8s-$K8S_OLDEST_VERSION"

case "${1:-}" in
--print) echo "$dir" && exit 0 ;;
--print-oldest) echo "$oldest_dir" && exit 0 ;;
esac

want() { # want COMPONENT: true when no components were named, or this one was
  [[ -z "$only" || " $only " == *" $1 "* ]]
}
only="$*"

mkdir -p "$dir" "$oldest_dir"
export GOFLAGS="${GOFLAGS:-} -mod=mod -trimpath"
export CGO_ENABLED=0
log() { printf 'testbin: %s\n' "$*" >&2; }

# build_in MODULE_DIR "OUTPUT..." "PACKAGE..." [LDFLAGS] [FOLDER]: go build inside a scratch
# module, atomically into FOLDER (default $dir): each PACKAGE (a main package) as the OUTPUT of
# the same place in the list. Several packages of one module build in one go build, which
# compiles what they share once and links them in parallel.
build_in() {
  local mod=$1 ldflags=${4:-} into=${5:-$dir}
  local -a outs pkgs
  read -r -a outs <<<"$2"
  read -r -a pkgs <<<"$3"
  local start=$SECONDS tmp i
  log "building ${outs[*]} from ${pkgs[*]}"
  tmp=$(mktemp -d "$into/.build.XXXXXX")
  (cd "$mod" && go build -ldflags="-s -w $ldflags" -o "$tmp/" "${pkgs[@]}") || {
    rm -rf "$tmp"
    return 1
  }
  for i in "${!pkgs[@]}"; do
    # go build names a binary after its package path's last element, or the one before a
    # major version suffix (go.etcd.io/etcd/server/v3 is "server").
    local name=${pkgs[i]##*/}
    [[ "$name" =~ ^v[0-9]+$ ]] && name=$(basename "$(dirname "${pkgs[i]}")")
    mv -f "$tmp/$name" "$into/${outs[i]}"
  done
  rmdir "$tmp"
  log "built ${outs[*]} in $((SECONDS - start))s"
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# --- Kubernetes ----------------------------------------------------------------------------------
# build_k8s VERSION FOLDER PINS BINARY...: the named binaries of k8s.io/kubernetes VERSION, into
# FOLDER, those not there yet at that version; PINS ("module@version ...", may be empty) overrides
# the version of some staging modules.
build_k8s() {
  local version=$1 into=$2 pins=$3
  shift 3
  local need=() b
  for b in "$@"; do
    # Built without its version (older caches), a binary reports v0.0.0-master, which charts'
    # kubeVersion checks refuse: rebuild it.
    local version_args=(--version)
    [[ "$b" == kubectl ]] && version_args=(version --client)
    # grep reads all of it (not -q): a writer cut off by SIGPIPE fails the pipeline (pipefail).
    [[ -x "$into/$b" ]] && "$into/$b" "${version_args[@]}" 2>/dev/null | grep -F "$version" >/dev/null || need+=("$b")
  done
  ((${#need[@]})) || return 0
  local m="$scratch/k8s-$version" staging="v0.${version#v1.}" minor=${version#v1.}
  minor=${minor%%.*}
  mkdir -p "$m"
  (
    cd "$m"
    go mod init prewarm.local/testbin-k8s >/dev/null 2>&1
    # k8s.io/kubernetes points its staging modules at ./staging with replace lines that do not
    # apply to a dependent module; point each at its published version instead.
    modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    sed -n '/^replace (/,/^)/p' "$modfile" | awk '$2 == "=>" {print $1}' | while read -r staged; do
      go mod edit -replace "$staged=$staged@$staging"
    done
    for pin in $pins; do
      go mod edit -replace "${pin%@*}=$pin"
    done
    go mod edit -require "k8s.io/kubernetes@$version"
  )
  # One go build for every binary: they share their packages, and their links run in parallel.
  # The version a node reports (kubectl get nodes) is the kubelet's; the API server's is what
  # helm checks a chart's kubeVersion against.
  local pkgs=()
  for b in "${need[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  build_in "$m" "${need[*]}" "${pkgs[*]}" "-X k8s.io/component-base/version.gitVersion=$version \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" "$into"
}

part_k8s() {
  if want k8s; then
    build_k8s "$K8S_VERSION" "$dir" "" kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
  fi
}
# The oldest supported control plane: the API server the API-level suites run against, and the
# controller-manager and scheduler of their kwok clusters (never newer than their API server, as
# Kubernetes' version skew policy asks). The kubelets of the real-node tests stay at $K8S_VERSION.
part_oldest() {
  if want oldest; then
    build_k8s "$K8S_OLDEST_VERSION" "$oldest_dir" "$K8S_OLDEST_STAGING_PINS" kube-apiserver kube-controller-manager kube-scheduler
  fi
}

# --- etcd ----------------------------------------------------------------------------------------
part_etcd() {
  if want etcd && [[ ! -x "$dir/etcd" ]]; then
    m="$scratch/etcd"
    mkdir -p "$m"
    (
      cd "$m"
      go mod init prewarm.local/testbin-etcd >/dev/null 2>&1
      go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
      for sib in api/v3 client/pkg/v3 client/v3 pkg/v3; do
        go mod edit -replace "go.etcd.io/etcd/$sib=go.etcd.io/etcd/$sib@$ETCD_VERSION"
      done
    )
    build_in "$m" etcd go.etcd.io/etcd/server/v3
  fi
}

# --- kwok and its stages -------------------------------------------------------------------------
part_kwok() {
  if want kwok && [[ ! -x "$dir/kwok" || ! -f "$dir/kwok-stages.yaml" ]]; then
    m="$scratch/kwok"
    mkdir -p "$m"
    (cd "$m" && go mod init prewarm.local/testbin-kwok >/dev/null 2>&1 && go mod edit -require "sigs.k8s.io/kwok@$KWOK_VERSION")
    build_in "$m" kwok sigs.k8s.io/kwok/cmd/kwok
    src=$(cd "$m" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    # One multi-document file: every "fast" node and pod stage, passed to kwok with --config.
    : >"$dir/.kwok-stages.tmp"
    for f in "$src"/kustomize/stage/node/fast/*.yaml "$src"/kustomize/stage/pod/fast/*.yaml; do
      grep -q '^kind: Stage$' "$f" || continue # skip kustomization.yaml
      printf -- '---\n' >>"$dir/.kwok-stages.tmp"
      grep -v '^---$' "$f" >>"$dir/.kwok-stages.tmp"
    done
    mv -f "$dir/.kwok-stages.tmp" "$dir/kwok-stages.yaml"
  fi
}

# --- versitygw (S3 server) -----------------------------------------------------------------------
part_versitygw() {
  if want versitygw && [[ ! -x "$dir/versitygw" ]]; then
    m="$scratch/versitygw"
    mkdir -p "$m"
    (cd "$m" && go mod init prewarm.local/testbin-versitygw >/dev/null 2>&1 && go mod edit -require "github.com/versity/versitygw@$VERSITYGW_VERSION")
    build_in "$m" versitygw github.com/versity/versitygw/cmd/versitygw
  fi
}

# --- helm (the chart's tests) ---------------------------------------------------------------------
part_helm() {
  if want helm && [[ ! -x "$dir/helm-$HELM_VERSION" ]]; then
    m="$scratch/helm"
    mkdir -p "$m"
    (cd "$m" && go mod init prewarm.local/testbin-helm >/dev/null 2>&1 && go mod edit -require "helm.sh/helm/v3@$HELM_VERSION")
    build_in "$m" "helm-$HELM_VERSION" helm.sh/helm/v3/cmd/helm
  fi
}

# --- the container runtime of the real-node tests (Debian packages) ------------------------------
# containerd, runc and the CNI plugins (bridge, host-local, loopback in /usr/lib/cni), and what
# makes the nodes' disks (mkfs.ext4, losetup). Installed
# only as root on a machine with apt-get; elsewhere the real-node tests skip, saying why.
part_runtime() {
  if want runtime; then
    missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || missing+=(containernetworking-plugins)
    command -v iptables >/dev/null || missing+=(iptables)
    # The nodes' disks: ext4 filesystems on loop devices.
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v losetup >/dev/null || missing+=(mount)
    if ((${#missing[@]})) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      log "installing ${missing[*]} (Debian packages) for the real-node tests"
      start=$SECONDS
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
      log "installed in $((SECONDS - start))s"
    elif ((${#missing[@]})); then
      log "not installing ${missing[*]} (needs root and apt-get): the real-node tests will skip"
    fi
  fi
}

# --- rclone (benchmark comparison only) -----------------------------------------------------------
part_rclone() {
  if [[ " $only " == *" rclone "* && ! -x "$dir/rclone-$RCLONE_VERSION" ]]; then
    m="$scratch/rclone"
    mkdir -p "$m"
    (cd "$m" && go mod init prewarm.local/testbin-rclone >/dev/null 2>&1 && go mod edit -require "github.com/rclone/rclone@$RCLONE_VERSION")
    build_in "$m" "rclone-$RCLONE_VERSION" github.com/rclone/rclone
  fi
}

# --- KEDA and Prometheus (the real-node autoscaling test) -----------------------------------------
# KEDA's operator and its metrics adapter (the external.metrics.k8s.io API the HPA reads), one
# scratch module for both: they share nearly every package. KEDA's own go.mod replaces one module
# for its licence and excludes one it never imports; the replace is kept here, as a dependent
# module does not inherit it.
part_keda() {
  if want keda && [[ ! -x "$dir/keda-operator-$KEDA_VERSION" || ! -x "$dir/keda-adapter-$KEDA_VERSION" ]]; then
    m="$scratch/keda"
    mkdir -p "$m"
    (
      cd "$m"
      go mod init prewarm.local/testbin-keda >/dev/null 2>&1
      go mod edit -require "github.com/kedacore/keda/v2@$KEDA_VERSION"
      modfile=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
      awk '$1 == "replace" && $4 == "=>" {print $2 "@" $3 "=" $5 "@" $6}' "$modfile" | while read -r r; do
        go mod edit -replace "${r%%=*}=${r#*=}"
      done
    )
    build_in "$m" "keda-operator-$KEDA_VERSION keda-adapter-$KEDA_VERSION" \
      "github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter" \
      "-X github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION"
    # The CRDs the operator watches: it stops when one of them is not served.
    src=$(cd "$m" && go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    mkdir -p "$dir/keda-crds-$KEDA_VERSION"
    cp "$src"/config/crd/bases/*.yaml "$dir/keda-crds-$KEDA_VERSION/"
    chmod -R u+w "$dir/keda-crds-$KEDA_VERSION"
  fi
}

# The Prometheus server without its cloud service discovery (static and file targets remain) and
# without the web UI's assets, which its module does not carry (the HTTP API is whole).
part_prometheus() {
  if want prometheus && [[ ! -x "$dir/prometheus-$PROMETHEUS_VERSION" ]]; then
    m="$scratch/prometheus"
    mkdir -p "$m"
    (cd "$m" && go mod init prewarm.local/testbin-prometheus >/dev/null 2>&1 && go mod edit -require "github.com/prometheus/prometheus@$PROMETHEUS_VERSION")
    GOFLAGS="$GOFLAGS -tags=netgo,remove_all_sd" build_in "$m" "prometheus-$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus
  fi
}

# The container runtime first (Debian's packages: the network, not the CPUs), then two lanes of
# builds side by side, of about the same length on a fresh machine (2026-12-07, with the other
# lane beside: Kubernetes 1.37 762 s, then helm 125 s and Prometheus 98 s; etcd 78 s, kwok 132 s,
# versitygw 106 s, then KEDA 769 s). A go build keeps the cores busy only while it compiles;
# beside it, the other lane's module downloads and links (single-threaded, the longest steps of
# the big binaries) fill the gaps. The oldest Kubernetes comes last in its lane: make test builds
# it apart, beside the real-node suite. Each lane stops at its first failure; the script fails if
# either did.
part_runtime
(part_k8s; part_helm; part_prometheus; part_oldest) &
k8s_lane=$!
(part_etcd; part_kwok; part_versitygw; part_keda; part_rclone) &
other_lane=$!
failed=0
wait "$k8s_lane" || failed=1
wait "$other_lane" || failed=1
((failed == 0)) || {
  log "a build failed (its output is above)"
  exit 1
}
echo "$dir"
