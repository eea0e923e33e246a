#!/usr/bin/env bash
# Creates the cluster's PKI in the given directory: one CA, the API server's serving certificate,
# client certificates for each component, and the service-account signing key pair.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=${1:?usage: pki.sh DIR}
mkdir -p "$dir"; cd "$dir"

openssl genrsa -out ca.key 2048 2>/dev/null
openssl req -x509 -new -nodes -key ca.key -subj "/CN=sandboxrun-local-ca" -days 3650 -out ca.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

cert() { # name subject [sans]
  local name=$1 subject=$2 sans=${3:-}
  openssl genrsa -out "$name.key" 2048 2>/dev/null
  openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n $sans ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
first_service_ip="${SERVICE_CIDR%.*}.1"
cert apiserver "/CN=kube-apiserver" \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$NODE_IP,IP:$first_service_ip,IP:127.0.0.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert admin "/O=system:masters/CN=kubernetes-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kube-proxy "/CN=system:kube-proxy"
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
# The kubelet's own serving certificate, signed by the cluster CA so the API server can verify it
# when it proxies logs and exec.
cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" "DNS:$NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
chmod 600 ./*.key
