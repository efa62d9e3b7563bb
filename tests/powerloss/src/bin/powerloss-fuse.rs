//! The FUSE lane (tests/powerloss/README.md): `powerloss-fuse --agent BIN [--served N]
//! [--boundaries N] [--seed N]`. Root; mounts at a scratch directory. Prints one line per
//! workload and the findings; exits 0 whatever it found (the caller decides).

#![allow(
    clippy::disallowed_methods,
    reason = "a test tool: it makes and removes its own scratch directories"
)]

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut agent = None;
    let mut served = 4;
    let mut boundaries = 60;
    let mut seed = 1;
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| std::io::Error::other(format!("{a} needs a value")));
        match a.as_str() {
            "--agent" => agent = Some(PathBuf::from(value()?)),
            "--served" => served = value()?.parse().map_err(std::io::Error::other)?,
            "--boundaries" => boundaries = value()?.parse().map_err(std::io::Error::other)?,
            "--seed" => seed = value()?.parse().map_err(std::io::Error::other)?,
            _ => return Err(std::io::Error::other(format!("unknown argument {a}"))),
        }
    }
    let agent = agent.ok_or_else(|| std::io::Error::other("--agent BIN: the mesh-host binary to run"))?;
    let scratch = std::env::temp_dir().join(format!("powerloss-fuse-{}", std::process::id()));
    let (mount, work) = (scratch.join("mnt"), scratch.join("work"));
    std::fs::create_dir_all(&mount)?;
    std::fs::create_dir_all(&work)?;
    let cfg = mesh_host_powerloss::lane::Config { agent, mount, work, served, boundaries, seed };
    let tallies = mesh_host_powerloss::lane::run(&cfg)?;
    for t in &tallies {
        for e in &t.examples {
            println!("  {}: {e}", t.workload);
        }
        println!("{} served={} other={}", t.line(), t.served, t.other);
    }
    std::fs::remove_dir_all(&scratch)
}
