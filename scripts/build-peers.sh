#!/usr/bin/env bash
# Builds the pinned peers of tests/peers (Kubernetes' control plane, etcd, kubectl, helm,
# metrics-server, prometheus-adapter) into tests/peers/bin, only when a go.mod/go.sum or the Go
# version changed since the last build. Without Go it says so and succeeds: the tests that need a
# peer are then skipped (and fail under CI=true).
set -euo pipefail
SELF="$(realpath "$0")"
cd "$(dirname "$0")/../tests/peers"
BIN=bin
if ! command -v go >/dev/null 2>&1; then
  echo "make peers: no Go toolchain on the PATH; the peers are not built." >&2
  echo "  Tests that need kube-apiserver, prometheus-adapter or metrics-server will be skipped." >&2
  echo "  Binaries built elsewhere can be given with METRICSCALE_PEERS=/dir (or KUBEBUILDER_ASSETS)." >&2
  exit 0
fi
# One build list per module: the main one, and metrics-server's and prometheus-adapter's own.
PEERS=(
  "etcd . go.etcd.io/etcd/server/v3"
  "kube-apiserver . k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager . k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler . k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl . k8s.io/kubernetes/cmd/kubectl"
  "metrics-server metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server"
  "helm . helm.sh/helm/v3/cmd/helm"
  "prometheus-adapter prometheus-adapter sigs.k8s.io/prometheus-adapter/cmd/adapter"
)
stamp="$( { go version; cat go.mod go.sum metrics-server/go.mod metrics-server/go.sum \
           prometheus-adapter/go.mod prometheus-adapter/go.sum "$SELF"; \
           printf '%s\n' "${PEERS[@]}"; } | sha256sum | cut -d' ' -f1)"
complete=1
for peer in "${PEERS[@]}"; do
  read -r name _ _ <<<"$peer"
  [ -x "$BIN/$name" ] || complete=0
done
if [ "$complete" = 1 ] && [ "$(cat "$BIN/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "make peers: up to date in tests/peers/$BIN ($(go version | cut -d' ' -f3))"
  exit 0
fi
mkdir -p "$BIN"
rm -f "$BIN/.stamp"
echo "make peers: building ${#PEERS[@]} programs with $(go version | cut -d' ' -f3) into tests/peers/$BIN"
echo "  (the first build from an empty Go cache takes several minutes and about 6 GB of cache)"
# Stamp the Kubernetes programs with their release, as upstream's release build does (kubectl
# version, helm's .Capabilities.KubeVersion and version-skew checks read it).
kube="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="$(echo "$kube" | cut -d. -f2)"
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean"
done
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)"
# As helm's own release build: the Kubernetes version it assumes without a cluster (helm
# template, helm lint) is its client-go's (v0.36 -> 1.36), not the v1.20 of a plain go build.
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done
# metrics-server's release build stamps client-go's version with its own tag (its --version).
metrics_server_ldflags="-X k8s.io/client-go/pkg/version.gitVersion=$(cd metrics-server && \
  go list -m -f '{{.Version}}' sigs.k8s.io/metrics-server)"
total_start=$SECONDS
for peer in "${PEERS[@]}"; do
  read -r name module package <<<"$peer"
  start=$SECONDS
  printf '  %-24s %s ... ' "$name" "$package"
  case "$package" in
    k8s.io/kubernetes/*) extra="$kube_ldflags" ;;
    helm.sh/*) extra="$helm_ldflags" ;;
    sigs.k8s.io/metrics-server/*) extra="$metrics_server_ldflags" ;;
    *) extra="" ;;
  esac
  (cd "$module" && go build -trimpath -ldflags="-s -w $extra" -o "$OLDPWD/$BIN/$name.new" "$package")
  mv "$BIN/$name.new" "$BIN/$name"
  echo "$((SECONDS - start)) s"
done
echo "$stamp" > "$BIN/.stamp"
echo "make peers: built in $((SECONDS - total_start)) s; $(du -sh "$BIN" | cut -f1) in tests/peers/$BIN"
