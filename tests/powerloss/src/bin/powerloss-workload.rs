//! The workloads for a lane that runs the agent itself (the VM lane):
//!
//! - `powerloss-workload setup --root R`: makes `R/m`, `R/state` and the file the `into` edit
//!   sets a key in, each synced (what a machine holds before the agent).
//! - `powerloss-workload declare --root R --out DIR`: writes `DIR/cold.json` and
//!   `DIR/change.json`, naming paths below `R`.
//! - `powerloss-workload hand-edit --root R`: makes the daemon workload's hand-edits, synced.
//!
//! See tests/powerloss/README.md for the order of the steps and the marks between them.

#![allow(clippy::disallowed_methods, reason = "a test tool: it makes the trees the agent is checked on")]

use std::io::Write as _;
use std::path::{Path, PathBuf};

use mesh_host_powerloss::workload;

fn synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> std::io::Result<PathBuf> {
        let at = args
            .iter()
            .position(|a| a == name)
            .ok_or_else(|| std::io::Error::other(format!("{name} is needed")))?;
        args.get(at + 1)
            .map(PathBuf::from)
            .ok_or_else(|| std::io::Error::other(format!("{name} needs a value")))
    };
    let root = value("--root")?;
    match args.first().map(String::as_str) {
        Some("setup") => {
            for d in ["m", "state"] {
                std::fs::create_dir_all(root.join(d))?;
            }
            std::fs::File::open(&root)?.sync_all()?;
            synced(&root.join(workload::INTO_FILE), workload::INTO_BEFORE)
        }
        Some("declare") => workload::write_declarations(&root.to_string_lossy(), &value("--out")?),
        Some("hand-edit") => {
            for (path, bytes) in workload::hand_edits() {
                mesh_host_powerloss::lane::replace_synced(&root.join(path), &bytes)?;
            }
            Ok(())
        }
        _ => Err(std::io::Error::other(
            "usage: powerloss-workload setup|declare|hand-edit --root R [--out DIR]",
        )),
    }
}
