//! `plvm`: the VM power-loss lane's tools (tests/powerloss/vm/README.md).
//!
//! - `plvm list LOG`: every entry of a dm-log-writes log (index, kind, sector, sectors, mark).
//! - `plvm replay LOG DEV STATES HOOK`: replays the log onto DEV (a copy of the data device as
//!   it was when logging began) entry by entry and, at crash points, runs `sh -c HOOK` with DEV
//!   holding exactly what the log had up to there: after each flush, FUA write and mark that
//!   follows a write (the same disk is one state, however many flushes name it). At most STATES
//!   points are visited (0: all), evenly spread, every mark among them. The hook sees
//!   `PL_INDEX`, `PL_KIND`, `PL_MARK` (the last mark logged at or before the point) and must exit
//!   0, or the replay stops.
//! - `plvm gen DIR ROOT ARCHIVE1 ARCHIVE2 [FILES]`: the workloads' declarations (`cold.json`,
//!   `change.json`, and `again.json` for the failpoint workload) over ROOT, FILES files (1,000
//!   by default) in FILES/10 directories, and `edits.txt`, the files the daemon workload edits
//!   by hand.
//! - `plvm manifest ROOT OUT`: what ROOT holds (path, kind, mode, owner, sha256 of content).
//! - `plvm check ROOT BEFORE AFTER DONE [IGNORE]`: every path of either manifest holds its
//!   BEFORE or its AFTER entry whole (content, mode and owner together; absent is an entry);
//!   with DONE=1 (the agent had reported the change) the AFTER one. Prints `torn=T lost=L`.
//! - `plvm ahead STATUS_JSON ROOT AFTER STORE [IGNORE]`: records of `mesh-host status --json`
//!   whose machine does not hold what they say (`ahead`), but (`behind`) when STORE is `before`
//!   (the crash state's store is the one from before the workload: its work not yet recorded)
//!   or for an orphan's record whose file is already gone (the removal not yet recorded).
//!   Prints `ahead=A behind=B`.
//! - `plvm drift APPLY_JSON [IGNORE]`: outcomes of `mesh-host apply --json` counted as drift
//!   (`corrected`) or failed. Prints `drift=D failed=F`.
//! - `plvm temps ROOT`: the host's temporary files left under ROOT. Prints `temps=N`.
//! - `plvm journal JOURNAL ROOT`: whether the journal of intent a crash left (if any) is
//!   coherent: every whole line a directory or an intent as the agent writes them (a path
//!   under ROOT; an intent's digest, mode and owner well-formed), only the last line torn (cut
//!   short, or zeros where the data never reached the disk). Prints `journal=N`, the lines that
//!   are not.
//!
//! IGNORE is a file of paths (one a line) left out: the daemon workload's hand-edited files.

// A test tool run in the guest, not the agent: the agent's rules on opening files and running
// commands (clippy.toml: its hardened helpers) are for what runs on a node.
#![allow(clippy::disallowed_methods)]

mod logwrites;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{exit, Command};

use sha2::{Digest, Sha256};

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("plvm: {msg}");
    exit(2)
}

fn arg(args: &[String], i: usize, what: &str) -> String {
    args.get(i)
        .cloned()
        .unwrap_or_else(|| die(format!("missing {what} (see the comment at the top of main.rs)")))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cmd = arg(&args, 1, "command");
    let r = match cmd.as_str() {
        "list" => list(&arg(&args, 2, "LOG")),
        "replay" => replay(
            &arg(&args, 2, "LOG"),
            &arg(&args, 3, "DEV"),
            &arg(&args, 4, "STATES"),
            &arg(&args, 5, "HOOK"),
        ),
        "gen" => gen(
            &arg(&args, 2, "DIR"),
            &arg(&args, 3, "ROOT"),
            &arg(&args, 4, "ARCHIVE1"),
            &arg(&args, 5, "ARCHIVE2"),
            args.get(6)
                .map_or(1000, |n| n.parse().unwrap_or_else(|_| die(format!("FILES {n}: not a number")))),
        ),
        "manifest" => manifest(&arg(&args, 2, "ROOT"), &arg(&args, 3, "OUT")),
        "check" => check(
            &arg(&args, 2, "ROOT"),
            &arg(&args, 3, "BEFORE"),
            &arg(&args, 4, "AFTER"),
            &arg(&args, 5, "DONE"),
            args.get(6),
        ),
        "ahead" => ahead(
            &arg(&args, 2, "STATUS_JSON"),
            &arg(&args, 3, "ROOT"),
            &arg(&args, 4, "AFTER"),
            &arg(&args, 5, "STORE"),
            args.get(6),
        ),
        "drift" => drift(&arg(&args, 2, "APPLY_JSON"), args.get(3)),
        "temps" => temps(&arg(&args, 2, "ROOT")),
        "journal" => journal(&arg(&args, 2, "JOURNAL"), &arg(&args, 3, "ROOT")),
        other => die(format!("unknown command {other}")),
    };
    if let Err(e) = r {
        die(e)
    }
}

fn list(log: &str) -> io::Result<()> {
    let log = logwrites::Log::open(log)?;
    println!("entries={} sectorsize={}", log.nr_entries, log.sectorsize);
    for e in log.entries()? {
        println!(
            "{} {} {} {} {}",
            e.index,
            e.kind(),
            e.sector,
            e.nr_sectors,
            e.mark.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

fn replay(log: &str, dev: &str, states: &str, hook: &str) -> io::Result<()> {
    let limit: usize = states.parse().unwrap_or_else(|_| die(format!("STATES {states}: not a number")));
    let log = logwrites::Log::open(log)?;
    let entries = log.entries()?;
    // Crash points: the first flush, FUA or mark after a write; every mark.
    let mut points: Vec<(usize, bool)> = Vec::new();
    let mut dirty = false;
    for (i, e) in entries.iter().enumerate() {
        if e.writes() {
            dirty = true;
        }
        let is_mark = e.flags & logwrites::MARK != 0;
        if is_mark || (dirty && e.flags & (logwrites::FLUSH | logwrites::FUA) != 0) {
            points.push((i, is_mark));
            dirty = false;
        }
    }
    let total = points.len();
    if limit > 0 && total > limit {
        let marks: Vec<_> = points.iter().filter(|p| p.1).cloned().collect();
        let room = limit.saturating_sub(marks.len()).max(1);
        let others: Vec<_> = points.iter().filter(|p| !p.1).cloned().collect();
        let step = others.len() as f64 / room as f64;
        let mut keep: BTreeSet<usize> = marks.iter().map(|p| p.0).collect();
        for k in 0..room.min(others.len()) {
            keep.insert(others[((k as f64 + 0.5) * step) as usize].0);
        }
        points = keep.into_iter().map(|i| (i, entries[i].flags & logwrites::MARK != 0)).collect();
    }
    eprintln!("plvm: {} entries, {} crash points, visiting {}", entries.len(), total, points.len());
    let devf = OpenOptions::new().write(true).open(dev)?;
    let mut next = 0usize;
    let mut mark = String::from("-");
    for (at, _) in points {
        while next <= at {
            let e = &entries[next];
            log.apply(e, &devf)?;
            if let Some(m) = &e.mark {
                mark.clone_from(m);
            }
            next += 1;
        }
        devf.sync_all()?;
        let st = Command::new("sh")
            .arg("-c")
            .arg(hook)
            .env("PL_INDEX", at.to_string())
            .env("PL_KIND", entries[at].kind())
            .env("PL_MARK", &mark)
            .status()?;
        if !st.success() {
            return Err(io::Error::other(format!("hook failed at entry {at}: {st}")));
        }
    }
    Ok(())
}

/// The cold workload's content of file `i`: sizes from 1 byte to about 40 KiB, so files of
/// one block and of many.
fn content(i: usize, gen: &str) -> String {
    let size = 1 + (i * 7919) % 40_000;
    let line = format!("{gen} file {i}\n");
    line.repeat(size / line.len() + 1)[..size].to_string()
}

fn gen(dir: &str, root: &str, arch1: &str, arch2: &str, files: usize) -> io::Result<()> {
    let dirs = (files / 10).max(1);
    use serde_json::json;
    let a1 = fs::read_to_string(arch1)?;
    let a2 = fs::read_to_string(arch2)?;
    let mut cold = Vec::new();
    let mut change = Vec::new();
    // The failpoint workload's declaration: the changing one with a third content for the files
    // whose content it changed, applied with the agent stopped at each of its failpoints.
    let mut again = Vec::new();
    for d in 0..dirs {
        let mut dir = json!({"type": "directory", "id": format!("d{d}"), "path": format!("{root}/srv/d{d}"), "mode": "0755"});
        cold.push(dir.clone());
        if d % 10 == 3 {
            dir["mode"] = json!("0750");
        }
        again.push(dir.clone());
        change.push(dir);
    }
    for i in 0..files {
        let path = format!("{root}/srv/d{}/f{i}", i % dirs);
        let f = json!({"type": "file", "id": format!("f{i}"), "path": path, "content": content(i, "cold"), "mode": "0644"});
        cold.push(f.clone());
        let mut g = f;
        match i % 10 {
            0 | 4 => g["content"] = json!(content(i + 3, "changed")),
            1 => g["mode"] = json!("0600"),
            2 => g["owner"] = json!("nobody:nogroup"),
            5 => {
                g["content"] = json!(content(i + 1, "changed"));
                g["mode"] = json!("0640");
            }
            9 => continue, // an orphan: removed by the changing apply
            _ => {}
        }
        let mut h = g.clone();
        if matches!(i % 10, 0 | 4) {
            h["content"] = json!(content(i + 5, "again"));
        }
        again.push(h);
        change.push(g);
    }
    let arch = |b64: &str| json!({"type": "archive", "id": "bundle", "path": format!("{root}/srv/bundle"), "bytes": b64.trim()});
    cold.push(arch(&a1));
    change.push(arch(&a2));
    again.push(arch(&a2));
    let into = |v: serde_json::Value| json!({"type": "file", "id": "conf", "path": format!("{root}/srv/conf.json"), "into": "json", "content": v.to_string()});
    cold.push(into(json!({"level": "info"})));
    change.push(into(json!({"level": "debug", "port": 8080})));
    again.push(into(json!({"level": "debug", "port": 8080})));
    for (name, res) in [("cold.json", cold), ("change.json", change), ("again.json", again)] {
        let doc = json!({"version": 1, "resources": res});
        fs::write(Path::new(dir).join(name), serde_json::to_vec_pretty(&doc)?)?;
    }
    let mut edits = String::new();
    for i in (3..files).step_by(files.div_ceil(10)) {
        edits.push_str(&format!("{root}/srv/d{}/f{i}\n", i % dirs));
    }
    fs::write(Path::new(dir).join("edits.txt"), edits)?;
    // The file `into` edits: someone else's, there before the host.
    fs::write(
        Path::new(dir).join("conf.json"),
        "{\n  \"owner\": \"someone else\",\n  \"level\": \"warn\"\n}\n",
    )?;
    Ok(())
}

type Manifest = BTreeMap<String, String>;

fn describe(p: &Path) -> io::Result<String> {
    let m = fs::symlink_metadata(p)?;
    let mode = m.permissions().mode() & 0o7777;
    let (kind, sum) = if m.file_type().is_file() {
        let mut h = Sha256::new();
        h.update(fs::read(p)?);
        ("f", format!("{:x}", h.finalize()))
    } else if m.file_type().is_dir() {
        ("d", "-".into())
    } else if m.file_type().is_symlink() {
        ("l", fs::read_link(p)?.display().to_string())
    } else {
        ("o", "-".into())
    };
    Ok(format!("{kind} {mode:o} {}:{} {sum}", m.uid(), m.gid()))
}

fn walk(root: &Path, rel: &str, out: &mut Manifest) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let name = e.file_name().to_string_lossy().into_owned();
        if rel.is_empty() && name == "lost+found" {
            continue;
        }
        let r = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        let d = describe(&root.join(&r))?;
        let is_dir = d.starts_with('d');
        out.insert(r.clone(), d);
        if is_dir {
            walk(root, &r, out)?;
        }
    }
    Ok(())
}

fn manifest(root: &str, out: &str) -> io::Result<()> {
    let mut m = Manifest::new();
    walk(Path::new(root), "", &mut m)?;
    let mut f = File::create(out)?;
    for (k, v) in &m {
        writeln!(f, "{k}\t{v}")?;
    }
    Ok(())
}

fn read_manifest(path: &str) -> io::Result<Manifest> {
    Ok(fs::read_to_string(path)?
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn read_ignore(path: Option<&String>) -> io::Result<BTreeSet<String>> {
    match path {
        None => Ok(BTreeSet::new()),
        Some(p) => Ok(fs::read_to_string(p)?.lines().map(str::to_string).collect()),
    }
}

fn is_temp(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(|n| n.starts_with('.') && n.contains(".mesh-host-"))
}

fn check(root: &str, before: &str, after: &str, done: &str, ignore: Option<&String>) -> io::Result<()> {
    let before = read_manifest(before)?;
    let after = read_manifest(after)?;
    let ignore = read_ignore(ignore)?;
    let done = done == "1";
    let absent = String::from("absent");
    let (mut torn, mut lost) = (0, 0);
    let paths: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for rel in paths {
        let full = format!("{}/{rel}", root.trim_end_matches('/'));
        if is_temp(rel) || ignore.contains(&full) {
            continue;
        }
        let now = match describe(Path::new(&full)) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => absent.clone(),
            Err(e) => return Err(e),
        };
        let b = before.get(rel).unwrap_or(&absent);
        let a = after.get(rel).unwrap_or(&absent);
        if &now == a {
            continue;
        }
        if &now == b {
            if done {
                lost += 1;
                eprintln!("lost: {rel}: holds {now}, the agent had reported {a}");
            }
            continue;
        }
        torn += 1;
        eprintln!("torn: {rel}: holds {now}; before {b}; after {a}");
    }
    println!("torn={torn} lost={lost}");
    Ok(())
}

fn load_json(path: &str) -> io::Result<serde_json::Value> {
    serde_json::from_slice(&fs::read(path)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

fn ahead(status: &str, root: &str, after: &str, store: &str, ignore: Option<&String>) -> io::Result<()> {
    let v = load_json(status)?;
    let ignore = read_ignore(ignore)?;
    let after = read_manifest(after)?;
    let records = v["records"].as_array().ok_or_else(|| io::Error::other(format!("{status}: no records")))?;
    let (mut n, mut behind) = (0, 0);
    for r in records {
        let target = r["target"].as_str().unwrap_or("");
        // `null`: a record whose hold status does not judge (an archive; the manifests do).
        if !r["machine"].is_string() || r["machine"] == "holds" || ignore.contains(target) {
            continue;
        }
        let rel = target.strip_prefix(root).unwrap_or(target).trim_start_matches('/');
        if store == "before" || (r["machine"] == "missing" && !after.contains_key(rel)) {
            // The store as it was before the pass (the pass's work not yet recorded), or an
            // orphan removed and its record not yet dropped (the record outlives the file, so
            // the next pass finishes the removal): the store behind, never ahead.
            behind += 1;
            continue;
        }
        n += 1;
        eprintln!("ahead: {} {target}: machine {}", r["id"], r["machine"]);
    }
    println!("ahead={n} behind={behind}");
    Ok(())
}

fn drift(report: &str, ignore: Option<&String>) -> io::Result<()> {
    let v = load_json(report)?;
    let ignore = read_ignore(ignore)?;
    let (mut d, mut f) = (0, 0);
    if !v["error"].is_null() {
        f += 1;
        eprintln!("failed: the apply: {}", v["error"]);
    }
    for o in v["outcomes"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let target = o["target"].as_str().unwrap_or("");
        match o["action"].as_str().unwrap_or("") {
            "corrected" if !ignore.contains(target) => {
                d += 1;
                eprintln!("drift: {} {target}: {}", o["id"], o["detail"]);
            }
            "failed" => {
                f += 1;
                eprintln!("failed: {} {target}: {}", o["id"], o["detail"]);
            }
            _ => {}
        }
    }
    println!("drift={d} failed={f}");
    Ok(())
}

fn temps(root: &str) -> io::Result<()> {
    let mut m = Manifest::new();
    walk(Path::new(root), "", &mut m)?;
    let n = m.keys().filter(|k| is_temp(k)).inspect(|k| eprintln!("temp left: {k}")).count();
    println!("temps={n}");
    Ok(())
}

/// One line of the journal of intent as the agent writes it (`src/system/journal.rs`): a
/// directory temporary files may be made in, or a file about to be renamed into place.
fn journal_line_ok(line: &[u8], root: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let under =
        |p: &serde_json::Value| p.as_str().is_some_and(|p| p.starts_with(root) && !p.contains("/../"));
    let obj = v.as_object().filter(|o| o.len() == 1).ok_or("not one tagged line")?;
    if let Some(dir) = obj.get("dir") {
        return if under(dir) { Ok(()) } else { Err(format!("a directory outside {root}: {dir}")) };
    }
    let i = obj.get("intent").and_then(|i| i.as_object()).ok_or("neither a directory nor an intent")?;
    let sum_ok = i.get("sum").and_then(|s| s.as_str()).is_some_and(|s| {
        // `sha256:` + hex, or `hmac-sha256:` + hex for a secret (src/declaration/digest.rs).
        let hex = s.strip_prefix("sha256:").or_else(|| s.strip_prefix("hmac-sha256:")).unwrap_or("");
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    let mode_ok = i.get("mode").and_then(|m| m.as_u64()).is_some_and(|m| m <= 0o7777);
    let owner_ok = match i.get("owner") {
        None | Some(serde_json::Value::Null) => true,
        Some(o) => o.as_array().is_some_and(|a| a.len() == 2 && a.iter().all(|x| x.as_u64().is_some())),
    };
    match (i.get("path").is_some_and(under), sum_ok, mode_ok, owner_ok) {
        (true, true, true, true) => Ok(()),
        _ => Err(format!("an intent not as the agent writes one: {}", serde_json::Value::Object(i.clone()))),
    }
}

fn journal(path: &str, root: &str) -> io::Result<()> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!("journal=0");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut bad = 0;
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let last = lines.len() - 1; // the text after the last newline: empty unless torn
    for (n, line) in lines.iter().enumerate() {
        if n == last || line.is_empty() {
            continue;
        }
        if let Err(why) = journal_line_ok(line, root) {
            eprintln!("journal line {}: {why}", n + 1);
            bad += 1;
        }
    }
    // The tail: a line cut short by the crash, or zeros, is what a power cut may leave; a whole
    // line there without its newline is judged as the others are.
    let tail = lines[last];
    if !tail.is_empty() && !tail.iter().all(|b| *b == 0) && journal_line_ok(tail, root).is_err() {
        let cut = serde_json::from_slice::<serde_json::Value>(tail).is_err();
        if !cut {
            eprintln!("journal's last line: not as the agent writes one");
            bad += 1;
        }
    }
    println!("journal={bad}");
    Ok(())
}
