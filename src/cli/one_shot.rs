//! `check`, `plan` and `apply`: one pass over a declaration, then exit; and how a report is
//! shown.

use super::*;

/// How `apply` shows what it did.
#[derive(Clone, Copy)]
pub(super) struct Shown {
    pub(super) json: bool,
    pub(super) verbose: bool,
}

/// Progress on standard error while a pass runs, for a person at a terminal: how many
/// resources are done, of how many, and the one being applied, on one line rewritten at most
/// ten times a second (a terminal redrawn for each of 10,000 files costs more than the files).
/// `None` when stderr is not a terminal, so logs and pipes never see it (docs/decisions.md, "The
/// command line").
pub(super) fn terminal_progress() -> Option<apply::Progress> {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return None;
    }
    let last = std::sync::Mutex::new(None::<std::time::Instant>);
    Some(apply::Progress(std::sync::Arc::new(move |done, total, id| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(100)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        // Ids are `[a-z0-9._-]`: nothing in one can move the cursor.
        eprint!("\r\x1b[2K[{done}/{total}] {id}");
    })))
}

/// Clears the progress line, if one was drawn.
pub(super) fn clear_progress(progress: &Option<apply::Progress>) {
    if progress.is_some() {
        eprint!("\r\x1b[2K");
    }
}

pub(super) fn check(file: &Path, json: bool, verify: &sign::Verify) -> anyhow::Result<Ended> {
    let d = load_for(file, json, verify)?;
    let mut by_kind: Vec<(Kind, usize)> = Kind::ALL
        .into_iter()
        .map(|k| (k, d.resources.iter().filter(|r| r.kind() == k).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_kind.sort_by_key(|k| std::cmp::Reverse(k.1));
    let mut modules: Vec<&str> = d.resources.iter().map(|r| r.id.module()).collect();
    modules.sort();
    modules.dedup();
    if json {
        let types: serde_json::Map<String, serde_json::Value> =
            by_kind.iter().map(|(k, n)| (k.to_string(), (*n).into())).collect();
        let summary = serde_json::json!({
            "declaration": file, "resources": d.resources.len(), "types": types, "modules": modules,
            "adoption": d.adoption.as_ref().map(|a| serde_json::json!({"taken": a.taken})),
        });
        println!("{summary:#}");
        return Ok(Ended::Converged);
    }
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{}: valid, {} resources ({}) in {} modules",
        if file == Path::new("-") {
            "standard input".into()
        } else {
            escape(&file.display().to_string()).into_owned()
        },
        d.resources.len(),
        if kinds.is_empty() { "none".to_owned() } else { kinds.join(", ") },
        modules.len()
    );
    if let Some(a) = &d.adoption {
        println!(
            "adoption: modules taken: {}",
            if a.taken.is_empty() { "none".into() } else { a.taken.join(", ") }
        );
    }
    Ok(Ended::Converged)
}

/// How `plan` is asked for: its output, and whether it may run actions' `verify`.
#[derive(Clone, Copy)]
pub(super) struct Planned {
    pub(super) json: bool,
    pub(super) run_verify: bool,
}

pub(super) fn plan(
    file: &Path,
    origin: Origin,
    asked: Planned,
    state: &Path,
    reach: Reach,
    verify: &sign::Verify,
) -> anyhow::Result<Ended> {
    let json = asked.json;
    let d = load_for(file, json, verify)?;
    let mut store = Store::read_only(state)?;
    let mut opts = options(origin, state, true, reach);
    opts.run_verify = asked.run_verify;
    let (report, diffs) = apply::apply(&d, &mut store, &opts);
    let ended = if report.error.is_some() { Ended::Failed } else { Ended::Converged };
    if json {
        // The report apply would print (each action the one apply would report), and the diffs.
        let mut shown = serde_json::to_value(&report)?;
        let diffs: Vec<serde_json::Value> =
            diffs.0.iter().map(|(path, diff)| serde_json::json!({"path": path, "diff": diff})).collect();
        shown["diffs"] = diffs.into();
        println!("{shown:#}");
        return Ok(ended);
    }
    let mut out = String::new();
    for o in report.outcomes.iter().filter(|o| o.action != Verb::Unchanged) {
        line(&mut out, o.action.planned(), &o.id, &o.target, o.detail.as_deref());
    }
    for (_, diff) in &diffs.0 {
        // A diff is lines by design, of content anyone who could write the file chose.
        out.push_str(&escape_lines(diff));
    }
    if let Some(e) = &report.error {
        for f in &e.failures {
            line(&mut out, "would fail", &f.id, &f.target, Some(&f.message));
        }
    }
    let moving = report.outcomes.iter().filter(|o| o.action.moved()).count();
    let undecided = report.outcomes.iter().filter(|o| o.action == Verb::Undecided).count();
    let _ = write!(out, "plan: {moving} of {} resources would change", d.resources.len());
    if undecided > 0 {
        let _ = write!(out, ", {undecided} would run verify to decide (`--run-verify` runs it)");
    }
    let ran = if asked.run_verify { "only actions' verify was run" } else { "nothing was run" };
    let _ = writeln!(out, "; nothing was written, {ran}");
    print!("{out}");
    Ok(ended)
}

pub(super) fn apply_cmd(
    file: &Path,
    origin: Origin,
    shown: Shown,
    state: &Path,
    reach: Reach,
    verify: &sign::Verify,
) -> anyhow::Result<Ended> {
    let json = shown.json;
    // The store is read while the declaration is parsed: two independent reads of about 20 and
    // 30 ms at 10,000 resources. A refused declaration is still the error reported, as if the
    // store had never been looked at.
    let t = std::time::Instant::now();
    let (d, store) = std::thread::scope(|scope| {
        let store = scope.spawn(|| {
            let t = std::time::Instant::now();
            let store = Store::read_only(state);
            tracing::debug!(elapsed_ms = t.elapsed().as_secs_f64() * 1e3, "state store opened");
            store
        });
        // The bodies go to a content file as they are parsed: at 100,000 files of 1 KiB they
        // are 102 MB, which in memory beside the declaration's text made the peak of the whole
        // apply (docs/memory.md, "The peak of a start").
        let d = load_files_for(file, json, content_dir(state), verify);
        (d, store.join().expect("opening the store does not panic"))
    });
    let (d, files, kept) = d?;
    // Locked only once the declaration is accepted: a refused one touches nothing.
    let mut store = store?.lock()?;
    let keep = reach.keep;
    let source = if file == Path::new("-") {
        "apply standard input".into()
    } else {
        format!("apply {}", file.display())
    };
    let generation = accept_generation(state, &source, &files, keep);
    drop(files);
    tracing::debug!(
        elapsed_ms = t.elapsed().as_secs_f64() * 1e3,
        resources = d.resources.len(),
        "declaration and store loaded"
    );
    one_pass(&d, kept, &mut store, origin, shown, state, reach, generation)
}

/// One pass of `d` with the store locked, as `apply` and `rollback` run it: the report
/// printed, the store written, and the generation's first pass noted. `contents` holds the
/// declared bytes where they were moved out of `d` (`load_files`).
#[allow(clippy::too_many_arguments, reason = "each is one of the pass's inputs, named at its two callers")]
pub(super) fn one_pass(
    d: &Declaration,
    contents: Kept,
    store: &mut crate::store::Writer,
    origin: Origin,
    shown: Shown,
    state: &Path,
    reach: Reach,
    generation: Option<u64>,
) -> anyhow::Result<Ended> {
    let json = shown.json;
    let t = std::time::Instant::now();
    let mut opts = options(origin, state, false, reach);
    opts.contents = contents;
    opts.progress = if json { None } else { terminal_progress() };
    let (mut report, _) = apply::apply(d, store, &opts);
    clear_progress(&opts.progress);
    tracing::debug!(elapsed_ms = t.elapsed().as_secs_f64() * 1e3, "pass finished");
    if let Some(n) = generation {
        note_first_pass(state, n, &report);
    }
    // What worked is recorded even when something else failed: the record follows each fact.
    if let Err(e) = store.save() {
        report.store_error = Some(format!("{e}; what this apply did is on the machine but not recorded"));
    }
    for o in &report.outcomes {
        if o.action != Verb::Unchanged {
            // The report on stdout already says this to the person at the terminal; the log
            // line is for journald when apply runs from a timer or a script.
            tracing::debug!(id = %o.id, kind = %o.kind, target = %o.target, action = %o.action, detail = o.detail.as_deref().unwrap_or(""), "resource changed");
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report, d.resources.len(), shown.verbose));
    }
    Ok(if report.failed() { Ended::Failed } else { Ended::Converged })
}

/// Records what `apply` accepted as a generation (`generations`), and releases a rollback's
/// hold when it is one never seen before, as a daemon would. A record, not a gate: what cannot
/// be recorded is said, and the declaration applied all the same.
pub(super) fn accept_generation(
    state: &Path,
    source: &str,
    files: &[(String, Vec<u8>)],
    keep: usize,
) -> Option<u64> {
    let gens = crate::generations::Generations::of(state);
    let accepted = match gens.accept(source, files, keep) {
        Ok(accepted) => accepted,
        Err(e) => {
            eprintln!(
                "mesh-host: cannot record the declaration as a generation ({e}); it is applied all the same"
            );
            return None;
        }
    };
    if accepted.new {
        match gens.hold() {
            Ok(Some(h)) if gens.release().is_ok() => eprintln!(
                "released the hold at generation {}: this declaration is new (generation {})",
                h.generation, accepted.number
            ),
            _ => {}
        }
    }
    accepted.new.then_some(accepted.number)
}

/// Notes how a new generation's first pass ended.
pub(super) fn note_first_pass(state: &Path, n: u64, report: &Report) {
    let failed = report.error.as_ref().map(|e| e.failures.len());
    let outcome = crate::generations::FirstPass::of(failed, report.error.as_ref().is_some_and(|e| e.refused));
    if let Err(e) = crate::generations::Generations::of(state).first_pass(n, outcome) {
        eprintln!("mesh-host: cannot note how generation {n}'s first pass ended: {e}");
    }
}

pub(super) fn line(out: &mut String, word: &str, id: &str, target: &str, detail: Option<&str>) {
    let _ = write!(out, "{word:>13} {} ({})", escape(id), escape(target));
    if let Some(d) = detail {
        // A detail may hold a command's output or a found file's words: one line, escaped.
        let _ = write!(out, ": {}", escape(d));
    }
    out.push('\n');
}

/// The report for a person: the count of each outcome per type, one line per resource that
/// changed in a way worth reading (all that changed with `verbose`; otherwise not `created`, so
/// a first apply of 10,000 files is a few lines, not 10,000), each failure, a summary.
pub fn human(report: &Report, declared: usize, verbose: bool) -> String {
    let mut out = String::new();
    let mut by_kind: Vec<(Kind, Vec<String>)> = Vec::new();
    for kind in Kind::ALL {
        let counts: Vec<String> = Verb::ALL
            .into_iter()
            .map(|a| (a, report.outcomes.iter().filter(|o| o.kind == kind && o.action == a).count()))
            .filter(|(_, n)| *n > 0)
            .map(|(a, n)| format!("{n} {a}"))
            .collect();
        if !counts.is_empty() {
            by_kind.push((kind, counts));
        }
    }
    // A table only where it says more than the last line: more than one type. Only what a
    // person needs to read is listed (docs/decisions.md, "The command line").
    if by_kind.len() > 1 {
        for (kind, counts) in &by_kind {
            let _ = writeln!(out, "{:>13} {}", kind.as_str(), counts.join(", "));
        }
    }
    let shown = |a: Verb| a != Verb::Unchanged && (verbose || a != Verb::Created);
    for o in report.outcomes.iter().filter(|o| shown(o.action)) {
        line(&mut out, o.action.as_str(), &o.id, &o.target, o.detail.as_deref());
    }
    let counts: Vec<String> = report.counts().iter().map(|(a, n)| format!("{n} {a}")).collect();
    let counts = if counts.is_empty() { "nothing to do".to_owned() } else { counts.join(", ") };
    match &report.error {
        None if report.store_error.is_none() => {
            let _ = writeln!(out, "converged: {declared} resources declared; {counts}");
        }
        None => {}
        Some(e) => {
            for f in &e.failures {
                line(&mut out, "failed", &f.id, &f.target, Some(&f.message));
            }
            let _ = writeln!(out, "apply failed: {}", escape_lines(&e.to_string()));
            if !report.outcomes.is_empty() {
                let _ = writeln!(out, "  of the rest: {counts}");
            }
            if !e.gated {
                out.push_str("  everything else was attempted; what is not listed as failed was done\n");
            }
        }
    }
    if let Some(why) = &report.store_error {
        let _ = writeln!(out, "apply failed to record: {}", escape(why));
        if report.error.is_none() {
            let _ = writeln!(out, "  every resource was applied: {counts}");
        }
    }
    out
}
