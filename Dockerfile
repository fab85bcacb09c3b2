# The spur-operator image: built from this repository, run as a non-root user from a
# distroless base (no shell, no package manager at run time).
#
#   docker build -t spur-operator:0.1.0 .
#
# The build stage runs on the same Debian release as the runtime base, so the binary's
# glibc matches. protox compiles the protobuf schema in Rust: no protoc is needed.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The caches keep crates.io downloads and compiled dependencies between builds; the binary
# is copied out of the cache mount so the next stage can take it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spur-operator \
    && install -D -m 0755 target/release/spur-operator /out/spur-operator

# spur-sim, for seed sweeps across a cluster (deploy/sim-sweep/): docker build --target sim
FROM build AS sim-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spur-sim \
    && install -D -m 0755 target/release/spur-sim /out/spur-sim

FROM gcr.io/distroless/cc-debian12:nonroot AS sim
COPY --from=sim-build /out/spur-sim /usr/local/bin/spur-sim
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/spur-sim"]

# The operator: the default target, so it stays last.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/spur-operator /usr/local/bin/spur-operator
# distroless's nonroot user; deploy/deployment.yaml runs as the same uid.
USER 65532:65532
EXPOSE 6818 8080
ENTRYPOINT ["/usr/local/bin/spur-operator"]
CMD ["run"]
