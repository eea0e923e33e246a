# localhost/sandboxrun/sandbox-python-data:dev for machines with a Docker engine;
# the equivalent of `images/build.sh sandbox-python-data` (not tested here: no engine).
#   docker build -f images/sandbox-python-data.Dockerfile -t localhost/sandboxrun/sandbox-python-data:dev images
FROM debian:bookworm-slim

RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends python3 python3-numpy python3-pandas \
        python3-matplotlib python3-scipy fonts-dejavu-core; \
    sed -i 's/^backend *:.*/backend: Agg/' /etc/matplotlibrc; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* \
        /usr/share/man /usr/share/info /usr/share/lintian; \
    find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete; \
    find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +; \
    echo 'sandbox:x:65532:65532:sandbox:/tmp:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'sandbox:x:65532:' >> /etc/group

ENV PATH=/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
USER 65532:65532
CMD ["python3"]
