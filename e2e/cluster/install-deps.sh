#!/usr/bin/env bash
# Installs the Debian packages the local cluster needs, when missing. Go comes with the machine.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

packages=(runc bubblewrap containernetworking-plugins iptables conntrack iproute2 openssl curl
  debootstrap gcc libc6-dev ethtool socat nftables
  # The release test's registry and its pushes (e2e/registry/start.sh would install them late in a
  # run, beside other suites; here they wait on the network beside the rest).
  docker-registry skopeo)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v go >/dev/null || die "Go is required to build the Kubernetes components (it ships with this machine)"
