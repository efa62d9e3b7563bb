//! Compiles etcd's v3 protos (proto/, vendored from etcd) to Rust for `system::etcd`: protox, a
//! protobuf compiler written in Rust, parses them into descriptors, and tonic-prost-build
//! generates the messages and the gRPC clients from those, so the build needs no `protoc`
//! (ARCHITECTURE.md, "etcd over gRPC").

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["etcd/api/etcdserverpb/rpc.proto", "etcd/api/mvccpb/kv.proto", "etcd/api/authpb/auth.proto"];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_server(false).compile_fds(descriptors)?;
    Ok(())
}
