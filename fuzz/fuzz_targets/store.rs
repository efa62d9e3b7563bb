//! The store loader: any bytes in the state file are loaded or refused. Never a panic, and
//! nothing written (a read-only store takes no lock).
#![no_main]
#![allow(clippy::disallowed_methods, reason = "the target writes the state file it then loads")]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mesh_host::store::Store;

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::Builder::new().prefix("mesh-host-fuzz-store-").tempdir().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let path = dir().path().join("state.json");
    std::fs::write(&path, data).unwrap();
    if let Ok(store) = Store::read_only(&path) {
        for (id, record) in store.records() {
            let _ = (id.len(), record.kind);
        }
    }
    let names: Vec<_> = std::fs::read_dir(dir().path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["state.json"], "loading the store left something beside it");
});
