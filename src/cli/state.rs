//! `status`, `generations`, `rollback` and `drift`: what the state store says of this host.

use super::*;

/// `mesh-host generations`.
pub(super) fn generations(json: bool, state: &Path) -> anyhow::Result<Ended> {
    let gens = crate::generations::Generations::of(state);
    let all = gens.list()?;
    let in_force = gens.in_force();
    let hold = gens.hold()?;
    if json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|m| {
                let mut row = serde_json::to_value(m).unwrap_or_default();
                row["in-force"] = (Some(m.number) == in_force).into();
                row["held"] = hold.as_ref().is_some_and(|h| h.generation == m.number).into();
                row
            })
            .collect();
        let all = serde_json::json!({"directory": gens.dir(), "in-force": in_force, "hold": hold, "generations": rows});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(Ended::Converged);
    }
    println!("{:>4}  {:<20}  {:<14}  {:<16}  SOURCE", "GEN", "ACCEPTED", "FIRST PASS", "DIGEST");
    for m in &all {
        let mark = match (Some(m.number) == in_force, hold.as_ref().is_some_and(|h| h.generation == m.number))
        {
            (_, true) => "held",
            (true, false) => "in force",
            (false, false) => "",
        };
        println!(
            "{:>4}  {:<20}  {:<14}  {:<16}  {}{}",
            m.number,
            crate::controller::drift::utc(m.accepted_at * 1000),
            m.first_pass.map_or_else(|| "-".to_owned(), |f| f.to_string()),
            &m.digest[..m.digest.len().min(16)],
            escape(&m.source),
            if mark.is_empty() { String::new() } else { format!("  <- {mark}") }
        );
    }
    println!("{} generations kept in {}", all.len(), gens.dir().display());
    if let Some(h) = &hold {
        println!("{}", escape(&h.describe(&crate::controller::drift::utc(h.since * 1000))));
    }
    Ok(Ended::Converged)
}

/// What `mesh-host rollback` was asked.
pub(super) struct Rollback {
    pub(super) generation: Option<u64>,
    pub(super) release: bool,
    pub(super) reason: Option<String>,
    pub(super) json: bool,
}

/// `mesh-host rollback`: the hold written, then the generation applied at once when no daemon
/// holds the store, or left to the daemon, which watches the hold (docs/decisions.md,
/// "Generations and rollback").
pub(super) fn rollback(asked: Rollback, state: &Path, reach: Reach) -> anyhow::Result<Ended> {
    use crate::generations::{Generations, Hold};
    let gens = Generations::of(state);
    let usage = |e: crate::generations::Error| Usage(format!("mesh-host: rollback: {e}"));
    if asked.release {
        match gens.hold()? {
            Some(h) => {
                gens.release()?;
                println!(
                    "released the hold at generation {}: a daemon applies its source's declaration again",
                    h.generation
                );
            }
            None => println!("no hold to release: the node follows its source"),
        }
        return Ok(Ended::Converged);
    }
    let n = match asked.generation {
        Some(n) => gens.kept(n).map_err(usage)?.number,
        None => gens.previous().map_err(usage)?,
    };
    let files: Vec<(String, Vec<u8>)> =
        gens.files(n)?.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
    // Refused as any declaration would be, before the hold is written: a generation this
    // version cannot read is not one to hold the node at.
    let d = Declaration::parse_sources(&files)?;
    drop(files);
    let hold = Hold {
        generation: n,
        since: crate::system::unix_secs(),
        by: crate::generations::operator(),
        reason: asked.reason,
        reverted: None,
    };
    let said = hold.describe(&crate::controller::drift::utc(hold.since * 1000));
    match Store::read_only(state)?.lock() {
        Err(crate::store::Error::Locked { .. }) => {
            gens.set_hold(&hold)?;
            println!(
                "{said}\nthe daemon running on {} applies it now; `mesh-host status` shows it",
                state.display()
            );
            Ok(Ended::Converged)
        }
        Err(e) => Err(e.into()),
        Ok(mut store) => {
            gens.set_hold(&hold)?;
            gens.set_in_force(n)?;
            let shown = Shown { json: asked.json, verbose: false };
            let ended = one_pass(&d, None, &mut store, Origin::Declared, shown, state, reach, None)?;
            eprintln!("{said}");
            Ok(ended)
        }
    }
}

/// One correction in a line: `2026-12-01T23:50:01Z corrected app.conf (/etc/app.conf):
/// content; by vim (pid 7, ...); put back in 1.2 ms`, then the hand-edit's diff, indented, or
/// why there is none.
pub(super) fn drift_line(c: &crate::controller::drift::Correction) -> String {
    let when = crate::controller::drift::utc(c.at_ms);
    // Everything in a correction but its time was written by someone else: the path and the
    // diff by whoever edited the file, the writer's name by that process.
    let changed = if c.changed.is_empty() { String::new() } else { format!(": {}", escape(&c.changed)) };
    let took = c.put_back_ms.map(|ms| format!("; put back in {ms:.1} ms")).unwrap_or_default();
    let mut line = format!(
        "{when} corrected {} ({}){changed}; by {}{took}",
        escape(&c.id),
        escape(&c.target),
        escape(&c.who.describe())
    );
    if let Some(why) = &c.diff_omitted {
        line.push_str(&format!("; diff omitted: {}", escape(why)));
    }
    // The hand-edit's diff under its line, indented, so that lines stay one correction each
    // where the diff is absent and a reader's eye finds the next correction where it is not.
    for l in c.diff.iter().flat_map(|d| d.lines()) {
        line.push_str("\n    ");
        line.push_str(&escape_lines(l));
    }
    line
}

pub(super) fn drift(
    json: bool,
    since: Option<std::time::Duration>,
    id: Option<&str>,
    state: &Path,
) -> anyhow::Result<Ended> {
    let all = crate::controller::drift::read(state)
        .with_context(|| format!("cannot read {}", crate::controller::drift::path(state).display()))?;
    let from = since.map(|d| crate::system::unix_millis().saturating_sub(d.as_millis() as u64));
    let shown =
        all.iter().filter(|c| from.is_none_or(|f| c.at_ms >= f)).filter(|c| id.is_none_or(|i| c.id == i));
    for c in shown {
        if json {
            println!("{}", serde_json::to_string(c)?);
        } else {
            println!("{}", drift_line(c));
        }
    }
    Ok(Ended::Converged)
}

/// The originals kept under `kept_dir`, each as `status --json` lists it: a copy, or, for a
/// file too large to keep, the note of its size, mode and owner.
fn kept_originals(kept_dir: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(crate::system::fs::files_under(kept_dir)
        .with_context(|| format!("cannot list the kept originals under {}", kept_dir.display()))?
        .into_iter()
        .filter_map(|copy| {
            let original = Path::new("/").join(copy.strip_prefix(kept_dir).ok()?);
            let text = original.to_string_lossy();
            Some(match text.strip_suffix(apply::NOT_KEPT) {
                Some(path) => serde_json::json!({"path": path, "copy": null, "kept": false, "note": copy}),
                None => serde_json::json!({"path": original, "copy": copy, "kept": true}),
            })
        })
        .collect())
}

pub(super) fn status(json: bool, state: &Path, key: &Path, keep_max_bytes: u64) -> anyhow::Result<Ended> {
    let store = Store::read_only(state)?;
    let mut looker = apply::status::Looker::with_key(key, keep_max_bytes);
    let mut rows = Vec::new();
    let mut drifted = 0;
    for (id, rec) in store.records() {
        let holds = looker.holds(rec).map(apply::status::Holds::as_str);
        if holds.is_some_and(|h| h != "holds") {
            drifted += 1;
        }
        rows.push(serde_json::json!({
            "id": id, "type": rec.kind, "target": rec.target, "origin": rec.origin,
            "applied-at": rec.applied_at, "machine": holds,
        }));
    }
    // The machine's own files the host copied before it first wrote over them: kept for ever, so
    // a person can compare or put one back (docs/decisions.md, "A file found with no record").
    let kept_dir = crate::store::originals_dir(state);
    let kept = kept_originals(&kept_dir)?;
    // What an adopted node holds as found: never applied, so not among the records.
    let held: Vec<serde_json::Value> = store
        .holds()
        .map(|(id, h)| serde_json::json!({"id": id, "type": h.kind, "target": h.target, "origin": h.origin}))
        .collect();
    // The last correction the daemon made, and who made the change it put back.
    let last = crate::controller::drift::read(state).ok().and_then(|mut all| all.pop());
    // The generation in force, and the rollback's hold: the first thing to know at 3 a.m.
    let gens = crate::generations::Generations::of(state);
    let generation = gens.in_force();
    let hold = gens.hold()?;
    let hold_said = hold.as_ref().map(|h| h.describe(&crate::controller::drift::utc(h.since * 1000)));
    if json {
        let hold = hold.as_ref().map(|h| {
            serde_json::json!({"generation": h.generation, "since": h.since, "by": h.by, "reason": h.reason, "reverted": h.reverted, "said": hold_said})
        });
        let all = serde_json::json!({
            "state": state, "generation": generation, "hold": hold,
            "records": rows, "kept": kept, "held": held, "last-correction": last,
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for r in &rows {
            println!(
                "{:>10} {} {} ({})",
                r["machine"].as_str().unwrap_or("-"),
                r["type"].as_str().unwrap_or(""),
                escape(r["id"].as_str().unwrap_or("")),
                escape(r["target"].as_str().unwrap_or(""))
            );
        }
        println!("{} records in {}; {drifted} no longer as the host left them", rows.len(), state.display());
        for k in &kept {
            match k["note"].as_str() {
                Some(note) => println!(
                    "{:>10} {} (the machine's original was too large to keep: its size, mode and owner are at {})",
                    "not kept",
                    escape(k["path"].as_str().unwrap_or("")),
                    escape(note)
                ),
                None => println!(
                    "{:>10} {} (the machine's original, at {})",
                    "kept",
                    escape(k["path"].as_str().unwrap_or("")),
                    escape(k["copy"].as_str().unwrap_or(""))
                ),
            }
        }
        if !kept.is_empty() {
            println!(
                "kept originals: {} under {}, from before the host first wrote over them",
                kept.len(),
                kept_dir.display()
            );
        }
        for h in &held {
            println!(
                "{:>10} {} {} ({})",
                "held",
                h["type"].as_str().unwrap_or(""),
                escape(h["id"].as_str().unwrap_or("")),
                escape(h["target"].as_str().unwrap_or(""))
            );
        }
        if !held.is_empty() {
            println!("held as found: {}, until their modules are taken", held.len());
        }
        if let Some(c) = &last {
            println!("last correction: {}", drift_line(c));
        }
        match (generation, &hold_said) {
            (_, Some(said)) => println!("generation: {}", escape(said)),
            (Some(n), None) => println!("generation: {n} in force (`mesh-host generations` lists them)"),
            (None, None) => {}
        }
    }
    Ok(Ended::Converged)
}
