# syntax=docker/dockerfile:1
# The MCP frontend (sandboxrun-mcp) for clusters that pull from a registry. CI does not use this
# file: it builds the same image without a Docker engine (images/build.sh app mcp BINARY).
# Context: the repository root (the binary is built from the whole workspace).
#
#   docker build -f images/mcp.Dockerfile -t REGISTRY/sandboxrun/mcp:0.1.0 .
#   docker push REGISTRY/sandboxrun/mcp:0.1.0
#   helm install ... --set frontend.image.repository=REGISTRY/sandboxrun/mcp --set frontend.image.tag=0.1.0
#
# Not built here (no engine on the CI machines); the stages mirror install.sh's cargo build and
# build.sh's base image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sandboxrun-mcp \
    && cp target/release/sandboxrun-mcp /sandboxrun-mcp

# Same as images/base.Dockerfile: Debian 12 (the binary links glibc 2.36) with CA certificates.
FROM debian:bookworm-slim
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*; \
    echo 'sandbox:x:65532:65532:sandbox:/tmp:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'sandbox:x:65532:' >> /etc/group
COPY --from=build --chmod=0755 /sandboxrun-mcp /usr/local/bin/sandboxrun-mcp
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sandboxrun-mcp"]
