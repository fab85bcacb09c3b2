# The spur-operator image: the release binary, exactly the shared libraries it loads, the CA
# bundle and a nonroot user, on an empty base (no shell, no package manager at run time).
#
#   docker build -t spur-operator:0.1.0 .
#
# Offline, with no registry, ci/image.sh builds the same `runtime` stage with buildah from a
# root filesystem made on the host by the same script (deploy/image/rootfs.sh), handing it in
# as the `build` stage (buildah build --build-context build=DIR --target runtime).
#
# The build stage runs on Debian bookworm, as the CI machines do, so the copied libraries are
# the glibc the binary was linked against. protox compiles the protobuf schema in Rust: no
# protoc is needed.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The caches keep crates.io downloads and compiled dependencies between builds; the binary
# is copied out of the cache mount so the next stage can take it. RUSTFLAGS set (empty)
# replaces .cargo/config.toml's `--cfg tokio_unstable`: only the simulation needs it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS='' cargo build --release --locked -p spur-operator \
    && install -D -m 0755 target/release/spur-operator /out/spur-operator \
    && sh deploy/image/rootfs.sh /out/spur-operator /rootfs

# spur-sim, for seed sweeps across a cluster (deploy/sim-sweep/): docker build --target sim
FROM build AS sim-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spur-sim \
    && install -D -m 0755 target/release/spur-sim /out/spur-sim \
    && sh deploy/image/rootfs.sh /out/spur-sim /rootfs-sim

FROM scratch AS sim
COPY --from=sim-build /rootfs-sim/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/spur-sim"]

# The operator: the default target, so it stays last.
FROM scratch AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /rootfs/ /
# The nonroot user of /etc/passwd; deploy/deployment.yaml runs as the same uid.
USER 65532:65532
EXPOSE 6818 8080
ENTRYPOINT ["/usr/local/bin/spur-operator"]
CMD ["run"]
LABEL org.opencontainers.image.title="spur-operator" \
      org.opencontainers.image.description="Kubernetes operator for the Spur workload manager" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
