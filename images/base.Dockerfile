# localhost/sandboxrun/base:dev for machines with a Docker engine; the
# equivalent of `images/build.sh base` (not tested here: no engine).
#   docker build -f images/base.Dockerfile -t localhost/sandboxrun/base:dev images
# An app image is then three lines on top of it:
#   FROM localhost/sandboxrun/base:dev
#   COPY --chmod=0755 sandboxrun-operator /usr/local/bin/sandboxrun-operator
#   ENTRYPOINT ["/usr/local/bin/sandboxrun-operator"]
FROM debian:bookworm-slim

RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* \
        /usr/share/man /usr/share/info /usr/share/lintian; \
    find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete; \
    find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +; \
    echo 'sandbox:x:65532:65532:sandbox:/tmp:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'sandbox:x:65532:' >> /etc/group

ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
CMD ["/bin/sh"]
