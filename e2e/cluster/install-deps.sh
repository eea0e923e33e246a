#!/usr/bin/env bash
# Installs the Debian packages the local cluster needs, when missing. Go comes with the machine.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

packages=(runc bubblewrap containernetworking-plugins iptables conntrack iproute2 openssl curl
  debootstrap gcc libc6-dev ethtool socat nftables)
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
