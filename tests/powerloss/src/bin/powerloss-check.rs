//! The checks of a crash state, for a lane that makes its own (the VM lane):
//!
//! - `powerloss-check snapshot --root R --name NAME [--hand-edits]`: prints what `R/m` holds as
//!   a phase (JSON), to be taken when the agent reported the phase done; `--hand-edits` notes
//!   the daemon workload's hand-edits as the harness's own content.
//! - `powerloss-check check --root R --phases FILE --done K`: checks the tree at `R` (a crash
//!   state, mounted) taken after phase K of FILE (a JSON array of phases) was reported done and
//!   while K+1 was in flight. Prints the findings as JSON and one line
//!   `powerloss-check: torn=T lost=L ahead=A other=O`; exits 1 if anything was found.
//!
//! `R` is the root the workload was declared with (`powerloss-workload declare --root R`):
//! the store's records name paths below it.

#![allow(clippy::disallowed_methods, reason = "a test tool: it reads the trees the agent is checked on")]

use std::path::PathBuf;

use mesh_host_powerloss::check::{self, Found, Phase};
use mesh_host_powerloss::workload;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> std::io::Result<String> {
        let at = args
            .iter()
            .position(|a| a == name)
            .ok_or_else(|| std::io::Error::other(format!("{name} is needed")))?;
        args.get(at + 1).cloned().ok_or_else(|| std::io::Error::other(format!("{name} needs a value")))
    };
    let root = PathBuf::from(value("--root")?);
    match args.first().map(String::as_str) {
        Some("snapshot") => {
            let hand_edits = if args.iter().any(|a| a == "--hand-edits") {
                workload::hand_edits().iter().map(|(_, b)| check::sum(b)).collect()
            } else {
                Default::default()
            };
            let phase =
                Phase { name: value("--name")?, managed: check::snapshot_dir(&root.join("m"))?, hand_edits };
            println!("{}", serde_json::to_string(&phase).map_err(std::io::Error::other)?);
            Ok(())
        }
        Some("check") => {
            let phases: Vec<Phase> =
                serde_json::from_slice(&std::fs::read(value("--phases")?)?).map_err(std::io::Error::other)?;
            let done: usize = value("--done")?.parse().map_err(std::io::Error::other)?;
            let before =
                phases.get(done).ok_or_else(|| std::io::Error::other("--done is past the phases"))?;
            let after = phases.get(done + 1).unwrap_or(before);
            let snap = check::snapshot_dir(&root.join("m"))?;
            let read = |rel: &str| std::fs::read(root.join(rel)).ok();
            let mut found = Found::default();
            let root_text = root.to_string_lossy();
            check::check_managed(&snap, &phases[..done], before, after, &mut found);
            check::check_store(
                read(workload::STORE).as_deref(),
                &snap,
                &root_text,
                before,
                after,
                &mut found,
            );
            check::check_journal(
                read(&format!("{}.journal", workload::STORE)).as_deref(),
                &root_text,
                &mut found,
            );
            println!("{}", serde_json::to_string(&found).map_err(std::io::Error::other)?);
            println!(
                "powerloss-check: torn={} lost={} ahead={} other={}",
                found.torn.len(),
                found.lost.len(),
                found.ahead.len(),
                found.other.len()
            );
            std::process::exit(if found.clean() { 0 } else { 1 })
        }
        _ => Err(std::io::Error::other("usage: powerloss-check snapshot|check --root R ...")),
    }
}
