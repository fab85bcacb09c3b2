//! Compiles `proto/slurm.proto` with protox, a protobuf compiler written in Rust, so a
//! fresh machine needs no system `protoc` to build the workspace.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let proto_file = proto_dir.join("slurm.proto");
    println!("cargo:rerun-if-changed={}", proto_file.display());

    let descriptors = protox::compile([&proto_file], [&proto_dir])?;
    tonic_prost_build::configure()
        // Maps as BTreeMap: their encoding order must not depend on a hasher's seed, or
        // the same message would give different bytes (and trace hashes) run to run.
        .btree_map(".")
        // Servers that answer only part of a service (the model controller, the tests'
        // agents) leave the rest UNIMPLEMENTED, as a peer without that RPC would.
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}
