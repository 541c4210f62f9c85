# syntax=docker/dockerfile:1
# agentrt controller image: a static (musl) binary on a distroless, non-root base.
# `scripts/image` builds the same layout without Docker (a static glibc binary, an OCI archive):
# /usr/local/bin/agentrt and kubectl-agentrt, a CA bundle, user 65532, no shell; entrypoint
# `agentrt controller`. Keep the two alike.

FROM rust:1.89-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY crds ./crds
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin agentrt \
 && cp target/x86_64-unknown-linux-musl/release/agentrt /agentrt

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /agentrt /usr/local/bin/agentrt
COPY --from=build /agentrt /usr/local/bin/kubectl-agentrt
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/agentrt"]
CMD ["controller"]
