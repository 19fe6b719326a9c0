# A container image of ackgate (docs/operations.md, "Container image"). Not built on the project's
# machines, which run no container engine: linted with hadolint (tests/api/packaging.rs).
#
#   docker build -t ackgate .
#   docker run -p 8080:8080 -v ackgate-data:/var/lib/ackgate ackgate

FROM rust:1.95-bookworm AS build
# RocksDB's bindings need libclang; the bundled librdkafka needs cmake and the OpenSSL and curl
# headers (scripts/prereqs installs the same on a Debian machine). Versions are bookworm's: a
# pinned version disappears from the archive with the next security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libclang-dev cmake libssl-dev libcurl4-openssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin ackgate \
    && cp target/release/ackgate /usr/local/bin/ackgate

FROM debian:bookworm-slim
# libssl and libcurl: librdkafka's runtime libraries; curl: the health check.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/ackgate --create-home ackgate
COPY --from=build /usr/local/bin/ackgate /usr/local/bin/ackgate
# Listens on every address inside the container: auth.admin_token and auth.jwt_secret must be
# set (ACKGATE_AUTH__ADMIN_TOKEN, ACKGATE_AUTH__JWT_SECRET), or the start is refused
# (README, "Before you expose it").
ENV ACKGATE_SERVER__LISTEN=0.0.0.0:8080 \
    ACKGATE_STORAGE__DATA_DIR=/var/lib/ackgate
USER ackgate
WORKDIR /var/lib/ackgate
VOLUME ["/var/lib/ackgate"]
EXPOSE 8080
# Liveness; an orchestrator's readiness probe is GET /readyz (503 while draining or while the
# store or the backend does not answer).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s CMD ["curl", "-fsS", "http://127.0.0.1:8080/healthz"]
# SIGTERM drains the sessions over server.drain_ms: give `docker stop` more than that (-t 30).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ackgate"]
