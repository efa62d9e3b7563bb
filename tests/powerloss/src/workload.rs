//! The workloads' declarations, for a tree rooted anywhere: the FUSE lane's mount, the VM
//! lane's filesystem. Managed files live below `ROOT/m`, the store at `ROOT/state/state.json`.

use std::io::Write as _;
use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};

/// How many directories the cold apply makes.
pub const DIRS: usize = 100;
/// How many files in each.
pub const FILES: usize = 10;

/// The file that an `into` edit sets a key in, made by the harness before the agent runs.
pub const INTO_FILE: &str = "m/app.env";
/// What it holds before.
pub const INTO_BEFORE: &[u8] = b"A=1\nB=kept\n";

/// The store's path below the root.
pub const STORE: &str = "state/state.json";

fn decl(resources: Vec<Value>) -> Value {
    json!({"version": 1, "resources": resources})
}

fn file_path(root: &str, d: usize, f: usize) -> String {
    format!("{root}/m/d{d:03}/f{f:02}")
}

/// The cold apply: `DIRS` directories of `FILES` files each. One directory in four is 0775,
/// which the umask takes from `mkdir`: its mode is the agent's chmod after it, which must be
/// durable with the directory (`Fs::make_dirs`), and the changing apply puts it back to 0755 in
/// place.
pub fn cold(root: &str) -> Value {
    let mut r = Vec::new();
    for d in 0..DIRS {
        let mode = if d % 4 == 1 { "0775" } else { "0755" };
        r.push(json!({"type": "directory", "id": format!("d{d}"), "path": format!("{root}/m/d{d:03}"), "mode": mode}));
        if d == 0 {
            // Empty, so no file's rename syncs it: only `Fs::make_durable` makes its mode durable.
            r.push(json!({"type": "directory", "id": "empty", "path": format!("{root}/m/empty"), "mode": "0775"}));
        }
        for f in 0..FILES {
            r.push(json!({"type": "file", "id": format!("d{d}.f{f}"), "path": file_path(root, d, f),
                "content": format!("cold {d} {f}\n{}", "x".repeat((d * 7 + f * 13) % 200)), "mode": "0644"}));
        }
    }
    decl(r)
}

/// A small gzipped tar of three files, base64, for the archive resource.
fn archive() -> String {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, body) in
        [("bin/tool", "#!/bin/sh\necho tool\n"), ("share/a.txt", "a\n"), ("share/b.txt", "bb\n")]
    {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, body.as_bytes()).expect("a tar in memory");
    }
    let bytes = tar.into_inner().expect("a tar in memory");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The changing apply: a third of the contents changed, a third of the modes, every seventh
/// owner; the last ten directories dropped (their files and themselves removed as orphans); an
/// archive unpacked; a key set `into` a file the harness made.
pub fn change(root: &str) -> Value {
    let mut r = Vec::new();
    for d in 0..DIRS - 10 {
        r.push(json!({"type": "directory", "id": format!("d{d}"), "path": format!("{root}/m/d{d:03}"), "mode": "0755"}));
        if d == 0 {
            r.push(json!({"type": "directory", "id": "empty", "path": format!("{root}/m/empty"), "mode": "0775"}));
        }
        for f in 0..FILES {
            let i = d * FILES + f;
            let content = if i % 3 == 0 {
                format!("changed {d} {f}\n{}", "y".repeat((d * 11 + f * 5) % 300))
            } else {
                format!("cold {d} {f}\n{}", "x".repeat((d * 7 + f * 13) % 200))
            };
            let mut res = json!({"type": "file", "id": format!("d{d}.f{f}"), "path": file_path(root, d, f),
                "content": content, "mode": if i % 3 == 1 { "0600" } else { "0644" }});
            if i % 7 == 0 {
                res["owner"] = json!("nobody:nogroup");
            }
            r.push(res);
        }
    }
    r.push(json!({"type": "archive", "id": "tool", "path": format!("{root}/m/tool"), "bytes": archive()}));
    r.push(json!({"type": "file", "id": "app.env", "path": format!("{root}/{INTO_FILE}"), "into": "env", "content": "A=2\n"}));
    decl(r)
}

/// The files the daemon workload edits by hand, below the root, and what it writes.
pub fn hand_edits() -> Vec<(String, Vec<u8>)> {
    (0..5).map(|d| (format!("m/d{:03}/f01", d * 17), format!("edited by hand {d}\n").into_bytes())).collect()
}

/// Writes the declarations for `root` into `out`: `cold.json`, `change.json`.
pub fn write_declarations(root: &str, out: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    for (name, d) in [("cold.json", cold(root)), ("change.json", change(root))] {
        let mut f = std::fs::File::create(out.join(name))?;
        f.write_all(&serde_json::to_vec_pretty(&d).expect("JSON"))?;
    }
    Ok(())
}
