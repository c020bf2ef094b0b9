#!/usr/bin/env bash
# Build the Go programs the Kubernetes tests run, each set into a cache folder keyed by its version, so only
# the first run on a machine pays:
#   ~/.cache/nstance/kube/<kubernetes version>/  etcd, kube-apiserver, kube-controller-manager
#                                                (tools/kube/etcd and tools/kube/apiserver: k8s.io/kubernetes)
#   ~/.cache/nstance/capi/<cluster-api version>/ controller-gen, clusterctl (tools/capi)
# A set whose binaries and STAMP (the versions it was built from) are there is not rebuilt.
#
#   scripts/build_kube.sh              build what is missing; print the kube folder on the last line
#   scripts/build_kube.sh --print      print the kube folder if built (exit 1 otherwise), build nothing
#   scripts/build_kube.sh --print-capi the same for the capi folder
#
# NSTANCE_KUBE_CACHE overrides ~/.cache/nstance; GOFLAGS defaults to -p=2 (the CPU is shared).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/tools"
CACHE="${NSTANCE_KUBE_CACHE:-$HOME/.cache/nstance}"

mod_version() { # module path, go.mod file -> the version it requires
    awk -v m="$1" '$1 == "require" && $2 == m { print $3 } $1 == m && $0 !~ /=>/ { print $2 }' "$2" | head -n1
}
KUBE_VERSION="$(mod_version k8s.io/kubernetes "$TOOLS/kube/apiserver/go.mod")"
ETCD_VERSION="$(mod_version go.etcd.io/etcd/server/v3 "$TOOLS/kube/etcd/go.mod")"
CAPI_VERSION="$(mod_version sigs.k8s.io/cluster-api "$TOOLS/capi/go.mod")"
GEN_VERSION="$(mod_version sigs.k8s.io/controller-tools "$TOOLS/capi/go.mod")"
KUBE_OUT="$CACHE/kube/$KUBE_VERSION"
CAPI_OUT="$CACHE/capi/$CAPI_VERSION"
KUBE_STAMP="kube-apiserver kube-controller-manager $KUBE_VERSION etcd $ETCD_VERSION"
CAPI_STAMP="clusterctl $CAPI_VERSION controller-gen $GEN_VERSION"

ready() { # folder, stamp, programs...
    local dir="$1" stamp="$2"
    shift 2
    for program in "$@"; do [[ -x "$dir/$program" ]] || return 1; done
    [[ "$(cat "$dir/STAMP" 2>/dev/null)" == "$stamp" ]]
}
kube_ready() { ready "$KUBE_OUT" "$KUBE_STAMP" etcd kube-apiserver kube-controller-manager; }
capi_ready() { ready "$CAPI_OUT" "$CAPI_STAMP" controller-gen clusterctl; }

case "${1:-}" in
    --print) kube_ready && { echo "$KUBE_OUT"; exit 0; }; exit 1 ;;
    --print-capi) capi_ready && { echo "$CAPI_OUT"; exit 0; }; exit 1 ;;
    "") ;;
    *) echo "build_kube: unknown argument ${1} (expected --print or --print-capi)" >&2; exit 2 ;;
esac
if kube_ready && capi_ready; then
    echo "$KUBE_OUT"
    exit 0
fi
command -v go >/dev/null || { echo "build_kube: the go toolchain is not on PATH" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--p=2} -mod=readonly -trimpath"

# build FOLDER STAMP MODULE_DIR LDFLAGS NAME=PACKAGE...: build into a scratch folder, then move in place.
build() {
    local out="$1" stamp="$2" module="$3" ldflags="$4" tmp start=$SECONDS
    shift 4
    mkdir -p "$out"
    tmp="$(mktemp -d "$out/.build.XXXXXX")"
    for pair in "$@"; do
        echo "build_kube: building ${pair%%=*} (minutes on a cold Go cache)" >&2
        (cd "$module" && go build -ldflags "$ldflags" -o "$tmp/${pair%%=*}" "${pair#*=}") || { rm -rf "$tmp"; return 1; }
    done
    for pair in "$@"; do mv "$tmp/${pair%%=*}" "$out/"; done
    rm -rf "$tmp"
    echo "$stamp" > "$out/STAMP"
    echo "build_kube: built $* in $((SECONDS - start)) s" >&2
}

if ! kube_ready; then
    minor="${KUBE_VERSION#v1.}"
    minor="${minor%%.*}"
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    build "$KUBE_OUT" "" "$TOOLS/kube/apiserver" "$ldflags" \
        kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
        kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
    build "$KUBE_OUT" "$KUBE_STAMP" "$TOOLS/kube/etcd" "-s -w" etcd=go.etcd.io/etcd/server/v3
fi
if ! capi_ready; then
    ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION"
    ldflags+=" -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
    build "$CAPI_OUT" "$CAPI_STAMP" "$TOOLS/capi" "$ldflags" \
        controller-gen=sigs.k8s.io/controller-tools/cmd/controller-gen \
        clusterctl=sigs.k8s.io/cluster-api/cmd/clusterctl
fi
echo "$KUBE_OUT"
