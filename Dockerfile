# jobserver container image.
#   docker build -t jobserver .
#   docker run -p 8080:8080 -v jobserver-data:/data jobserver
#
# Build stage: the official Swift image plus the three -dev packages. The Swift
# runtime (stdlib, Foundation, Dispatch) is linked statically, so the runtime
# stage needs only the C libraries the binary links dynamically: glibc,
# libstdc++/libgcc_s (pulled in by the static Swift runtime), libcurl,
# libsqlite3 and libpq (the PostgreSQL client library). scripts/check-ldd.sh verifies that against the runtime package
# list below, both here at build time and on any release binary.
FROM swift:6.3-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcurl4-openssl-dev libsqlite3-dev libpq-dev
WORKDIR /src
# The whole package: the manifest names the test targets too, and the server
# may embed openapi.yaml.
COPY . .
RUN swift build -c release --static-swift-stdlib --product jobserver \
 && bin="$(swift build -c release --static-swift-stdlib --show-bin-path)" \
 && install -D -m 0755 "$bin/jobserver" /out/jobserver \
 && for r in "$bin"/*.resources; do if [ -e "$r" ]; then cp -R "$r" /out/; fi; done
# Fails the build if the binary needs a library the runtime stage won't have.
RUN scripts/check-ldd.sh /out/jobserver

# Runtime stage. libstdc++6 is already in bookworm-slim (apt depends on it),
# but the binary needs it, so it is named here rather than assumed. curl is
# only for the HEALTHCHECK (libcurl4 does not ship the curl program).
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcurl4 libsqlite3-0 libpq5 ca-certificates libstdc++6 curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 jobserver \
 && useradd --system --uid 10001 --gid jobserver --home-dir /data --no-create-home --shell /usr/sbin/nologin jobserver \
 && install -d -o jobserver -g jobserver -m 0750 /data
COPY --from=build /out/ /usr/local/bin/
# Docker's default stop timeout is 10 s before SIGKILL: the grace period stays
# below it so that in-flight responses and state are written out. Raise both
# together (`docker stop -t`, compose `stop_grace_period`).
ENV JOBSERVER_DB=/data/jobserver.sqlite \
    JOBSERVER_HOST=0.0.0.0 \
    JOBSERVER_PORT=8080 \
    JOBSERVER_SHUTDOWN_GRACE=8s
VOLUME ["/data"]
WORKDIR /data
USER jobserver
EXPOSE 8080
# /healthz is open even with a token, and answers 503 once shutdown begins.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:${JOBSERVER_PORT}/healthz" || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/jobserver"]
CMD ["serve"]
