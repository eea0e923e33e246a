# localhost/sandboxrun/pause:3.10 for machines with a Docker engine; the
# equivalent of `images/build.sh pause` (not tested here: no engine).
#   docker build -f images/pause.Dockerfile -t localhost/sandboxrun/pause:3.10 images
FROM debian:bookworm-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev
COPY pause/pause.c /src/pause.c
RUN gcc -static -Os -s -Wall -Wextra -o /pause /src/pause.c

FROM scratch
COPY --from=build /pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
