//! Tidy checks, in the spirit of rust-analyzer's: the invariants ARCHITECTURE.md states, checked
//! on the source text so that breaking one fails the suite instead of waiting for a reviewer.
//!
//! - The dependency arrows between the crate's modules, grouped imports (`use crate::{a, b}`)
//!   included: `declaration` and `system` depend on nothing else in the crate (so the model is
//!   pure and the machine layer knows no declaration type), no module reaches a later stage
//!   (`apply` never reaches the controller), and the table allows no arrow the code does not use.
//!   A `super::` chain that climbs to the crate's root is an arrow too.
//! - The controller knows nothing of etcd.
//! - The watchers crate knows nothing of the root crate.
//! - No catch-all arm (`_ =>`) in a match over `Spec`, `Kind` or `Verb`: a new resource type or
//!   outcome word must be decided at every place that tells them apart, by the compiler.
//! - Every `docs/` file a comment cites exists, and so does every section it names.
//! - The house's bounds (docs/testing.md, "The house's rules, held by tests"): no function over
//!   100 lines, no file of `src/` over 1,200 lines outside its tests, no sleep of a second or
//!   more in `tests/it`, each with an allow-list whose entries give their reason and must be
//!   needed; each check shown finding a planted breach.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each top-level module of `src/` names with `crate::`: exactly the arrows the code has
/// (`every_allowed_arrow_is_used`), so that a new one fails until it is added here on purpose.
/// Read top down, each names only modules above it.
const ALLOWED: &[(&str, &[&str])] = &[
    ("declaration", &[]),
    ("system", &[]),
    ("secrets", &[]),
    ("trust", &[]),
    ("cron", &["declaration"]),
    ("store", &["declaration", "system"]),
    ("generations", &["store", "system"]),
    ("telemetry", &["system"]),
    ("apply", &["declaration", "secrets", "store", "system"]),
    ("controller", &["apply", "cron", "declaration", "generations", "store", "system", "telemetry", "trust"]),
    ("fleet", &["controller", "declaration", "generations", "system", "telemetry", "trust"]),
    (
        "cli",
        &[
            "apply",
            "controller",
            "declaration",
            "fleet",
            "generations",
            "secrets",
            "store",
            "system",
            "telemetry",
            "trust",
        ],
    ),
    ("lib", &[]),
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The source with comments and the contents of string and char literals blanked (kept as
/// spaces, so positions and lines stay where they were).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            out.extend_from_slice(b"  ");
            i = (i + 2).min(b.len());
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // A raw string: r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            out.extend(std::iter::repeat_n(b' ', 2 + hashes));
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            out.extend(std::iter::repeat_n(b' ', close.len()));
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out.extend_from_slice(b"   ");
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let end = b[i + 2..].iter().position(|c| *c == b'\'').map_or(b.len(), |p| i + 3 + p);
            out.extend(std::iter::repeat_n(b' ', end - i));
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The module a file belongs to: `src/apply/file.rs` is `apply`, `src/store.rs` is `store`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `crate::name` in the code, and every name a grouped import takes from the crate:
/// `use crate::{a, b::{c, d}}` reaches `a` and `b`.
fn arrows(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "crate::".len()..];
        rest = after;
        if before.is_some_and(is_ident) {
            continue; // `my_crate::...`: another name that ends the same way
        }
        let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
        if !name.is_empty() {
            found.insert(name);
        } else if let Some(group) = after.trim_start().strip_prefix('{') {
            found.extend(group_heads(group).into_iter().filter(|n| n != "self"));
        }
    }
    found
}

/// The first name of each item of a `{...}` group, `text` starting just after its `{`: for
/// `a, b::{c, d}, e as f}` that is `a`, `b` and `e`. Nested groups are skipped whole.
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item = true;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && depth == 0 && is_ident(c) => {
                let name: String = text[i..].chars().take_while(|c| is_ident(*c)).collect();
                for _ in 1..name.len() {
                    chars.next();
                }
                heads.push(name);
                at_item = false;
            }
            _ => {}
        }
    }
    heads
}

/// How deep a file's module is below the crate: `src/store.rs` and `src/apply/mod.rs` are 1,
/// `src/apply/file.rs` 2, `src/lib.rs` 0.
fn depth_of(src: &Path, file: &Path) -> usize {
    let rel = file.strip_prefix(src).unwrap();
    let parts = rel.components().count();
    if rel.ends_with("mod.rs") || rel == Path::new("lib.rs") {
        parts - 1
    } else {
        parts
    }
}

/// The top-level modules a file reaches through `super::`: a chain of as many `super`s as the
/// module is deep (inline `mod x { .. }` blocks counted) is the crate's root, and the name after
/// it another module, `super::apply` from `src/store.rs` as surely as `crate::apply`.
fn through_super(code: &str, depth: usize) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut found = BTreeSet::new();
    // Whether each open brace opened an inline module.
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !is_ident(b[i - 1] as char);
        if b[i] == b'{' {
            let before = code[..i].trim_end();
            let name_start = before.trim_end_matches(|c: char| is_ident(c));
            braces.push(name_start.len() < before.len() && name_start.trim_end().ends_with("mod"));
        } else if b[i] == b'}' {
            braces.pop();
        } else if at_word && b[i..].starts_with(b"super::") {
            let mut k = 0;
            let mut j = i;
            while b[j..].starts_with(b"super::") {
                k += 1;
                j += "super::".len();
            }
            let inline = braces.iter().filter(|m| **m).count();
            let name: String = code[j..].chars().take_while(|c| is_ident(*c)).collect();
            if k >= depth + inline && !name.is_empty() {
                found.insert(name);
            } else if k >= depth + inline {
                if let Some(group) = code[j..].strip_prefix('{') {
                    found.extend(group_heads(group).into_iter().filter(|n| n != "self"));
                }
            }
            i = j;
            continue;
        }
        i += 1;
    }
    found
}

/// Every module's arrows: for each top-level module of `src/` (`main.rs` left out: the binary,
/// outside the library), the modules its files name, with the first file that names each.
fn used_arrows(src: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut used: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for file in rust_files(src) {
        let module = module_of(src, &file);
        if module == "main" {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let to = used.entry(module.clone()).or_default();
        let reached = arrows(&code).into_iter().chain(through_super(&code, depth_of(src, &file)));
        for name in reached.filter(|n| *n != module) {
            to.entry(name).or_insert_with(|| file.clone());
        }
    }
    used
}

#[test]
fn modules_depend_only_along_the_allowed_arrows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, to) in used_arrows(&src) {
        let Some(may) = allowed.get(module.as_str()) else {
            wrong.push(format!("module `{module}` is not in tests/tidy.rs's ALLOWED table"));
            continue;
        };
        for (name, file) in to {
            if !may.contains(&name.as_str()) {
                wrong.push(format!("{}: `{module}` reaches `crate::{name}`", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "forbidden arrows between modules (ARCHITECTURE.md, Invariants):\n{}",
        wrong.join("\n")
    );
}

/// ALLOWED is the code's picture, not a wish list: an arrow allowed and not used is taken out,
/// so that a new arrow is a change to this table, made on purpose and seen in review, rather
/// than one the table happened to let through.
#[test]
fn every_allowed_arrow_is_used() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let used = used_arrows(&src);
    let mut unused = Vec::new();
    for (module, may) in ALLOWED {
        for to in *may {
            if !used.get(*module).is_some_and(|u| u.contains_key(*to)) {
                unused.push(format!("`{module}` → `{to}`"));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "arrows ALLOWED in tests/tidy.rs that the code does not use; take them out:\n{}",
        unused.join("\n")
    );
}

/// The controller knows nothing of etcd (`src/fleet/mod.rs`, `src/controller/mod.rs`): the
/// fleet's tasks are started beside it by the face, and it reads a directory either way. The
/// module arrows keep it from `crate::fleet`; this keeps it from the etcd client in `system`,
/// which the arrow `controller → system` would otherwise let through, however it is named
/// (`crate::system::etcd`, `system::{etcd, ..}`, `use crate::system; system::etcd::...`).
#[test]
fn the_controller_knows_nothing_of_etcd() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&src.join("controller")) {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (n, line) in code.lines().enumerate() {
            if names_word(line, "etcd") || names_word(line, "Etcd") {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the controller names etcd (ARCHITECTURE.md, Invariants):\n{}",
        wrong.join("\n")
    );
}

/// Every sync the agent asks of the kernel goes through `system::durable`: the power-loss
/// lanes' mutant (`tests/powerloss/`) switches them all off there, and a sync made anywhere else
/// would be one the lanes could not show they see.
#[test]
fn every_sync_goes_through_durable() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&src) {
        if file.ends_with("system/durable.rs") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (n, line) in code.lines().enumerate() {
            let call = ["sync_all(", "sync_data(", "fsync(", "fdatasync(", "syncfs("].iter().any(|c| {
                line.match_indices(c).any(|(at, _)| {
                    !line[..at].ends_with("durable::")
                        && !line[..at].ends_with("fn ")
                        && !line[..at].ends_with("self.")
                })
            });
            if call {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(wrong.is_empty(), "a sync outside system::durable (docs/durability.md):\n{}", wrong.join("\n"));
}

/// Whether `line` has `word` as a whole identifier (not `etcd_x` nor `my_etcd`).
fn names_word(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(word)
        .any(|(at, _)| !line[..at].ends_with(ident) && !line[at + word.len()..].starts_with(ident))
}

#[test]
fn the_watchers_crate_knows_nothing_of_the_root_crate() {
    let watchers = Path::new(env!("CARGO_MANIFEST_DIR")).join("watchers");
    let manifest = std::fs::read_to_string(watchers.join("Cargo.toml")).unwrap();
    assert!(!manifest.contains("mesh-host ="), "watchers/Cargo.toml depends on mesh-host");
    for file in rust_files(&watchers.join("src")) {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        assert!(!code.contains("mesh_host::"), "{} names mesh_host", file.display());
    }
}

/// The arms of every `match` in `code`: for each, its line and its patterns' text.
fn matches(code: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = code[i..].find("match ") {
        let at = i + off;
        i = at + 6;
        let word_start = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        if !word_start {
            continue;
        }
        // The scrutinee ends at the first `{` outside brackets.
        let mut j = i;
        let mut depth = 0i32;
        while j < b.len() {
            match b[j] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b'{' if depth == 0 => break,
                b';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if j >= b.len() || b[j] != b'{' {
            continue;
        }
        // The arms: a pattern runs from an arm's start to its `=>` at the block's own depth.
        let line = code[..at].matches('\n').count() + 1;
        let mut arms = Vec::new();
        let mut depth = 0i32;
        let mut start = j + 1;
        let mut in_pattern = true;
        let mut k = j + 1;
        while k < b.len() {
            let c = b[k];
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' => depth -= 1,
                b'}' if depth == 0 => break,
                b'}' => {
                    depth -= 1;
                    if depth == 0 && !in_pattern {
                        // The end of a block body: the next arm may start without a comma.
                        in_pattern = true;
                        start = k + 1;
                    }
                }
                // A comma at the block's depth ends an arm (a pattern has none outside brackets),
                // also after a block body that was already taken for the arm's end.
                b',' if depth == 0 => {
                    in_pattern = true;
                    start = k + 1;
                }
                b'=' if depth == 0 && in_pattern && b.get(k + 1) == Some(&b'>') => {
                    arms.push(code[start..k].trim().to_owned());
                    in_pattern = false;
                    k += 1;
                }
                _ => {}
            }
            k += 1;
        }
        out.push((line, arms));
    }
    out
}

/// Whether a pattern names a variant of the enum `name` (`Spec::File(..)`, `Kind::File`), not
/// of another type that ends the same way (`FsKind::File`).
fn names_enum(pattern: &str, name: &str) -> bool {
    let needle = format!("{name}::");
    pattern.match_indices(&needle).any(|(at, _)| {
        let before = pattern[..at].chars().next_back();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    })
}

#[test]
fn no_catch_all_arm_over_spec_kind_or_verb() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&src) {
        // The machine layer has a `Kind` of its own (what is at a path), not the resource kind.
        if file.starts_with(src.join("system")) {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (line, arms) in matches(&code) {
            let over = ["Spec", "Kind", "Verb"].into_iter().find(|e| arms.iter().any(|a| names_enum(a, e)));
            let catch_all = arms.iter().any(|a| a == "_" || a.starts_with("_ if"));
            if let (Some(e), true) = (over, catch_all) {
                wrong.push(format!("{}:{line}: a `_ =>` arm in a match over `{e}`", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "name every variant instead, so a new one is decided everywhere:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The scanner itself: a catch-all over Spec is found, comments and strings are not code.
    let code = code_only("match r.spec { Spec::File(f) => 1, _ => 2 } // crate::apply\n\"crate::cli\"");
    let found = matches(&code);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, vec!["Spec::File(f)".to_owned(), "_".to_owned()]);
    assert!(arrows(&code).is_empty());
    let grouped =
        code_only("use crate::{apply::{self, Verb}, store,\n    system::fs as f};\nuse crate::{self};");
    assert_eq!(arrows(&grouped), ["apply", "store", "system"].map(String::from).into());
    assert_eq!(arrows(&code_only("mesh_host_watchers::Change; my_crate::x")), BTreeSet::new());
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(through_super("use super::apply::Verb;", 1), set(&["apply"]));
    assert_eq!(through_super("use super::{store, system};", 1), set(&["store", "system"]));
    assert_eq!(through_super("fn f() { g(super::x) }", 2), set(&[]), "a sibling, not the root");
    assert_eq!(through_super("use super::super::cron;", 2), set(&["cron"]));
    assert_eq!(through_super("mod tests { use super::*; use super::super::store; }", 1), set(&["store"]));
    assert_eq!(through_super("pub(crate) mod inner { use super::x; }", 1), set(&[]));
    assert!(names_enum("Kind::File | Kind::Directory", "Kind"));
    assert!(!names_enum("FsKind::File", "Kind"));
    assert!(!names_enum("fs::Kind::File", "Kind"));
    let nested = code_only("match a { Kind::File => { if x { 1 } else { 2 } } _ if y => 3, _ => 4 }");
    assert_eq!(matches(&nested)[0].1, vec!["Kind::File", "_ if y", "_"]);
    let inner = code_only("match k { Kind::File => match x { A => 1, B => 2 }, Kind::Dir => 3, _ => 4 }");
    assert_eq!(matches(&inner)[0].1, vec!["Kind::File", "Kind::Dir", "_"]);
}

/// The controller asks the declaration its questions (methods such as `movable_bodies`,
/// `container_names`, `closure`) and never takes a resource's `Spec` apart itself: what a type
/// means is decided in one place (issue 16, item 1). Its tests may look inside.
#[test]
fn the_controller_never_takes_a_spec_apart() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&src.join("controller")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = code_only(text.split("#[cfg(test)]").next().unwrap_or_default());
        for (n, line) in code.lines().enumerate() {
            if spec_variant_named(line) {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ask the declaration instead (a method in src/declaration):\n{}",
        wrong.join("\n")
    );
}

/// Whether a line of code names a variant of `Spec` (`Spec::File`, not `FileSpec::` or `spec::`).
fn spec_variant_named(line: &str) -> bool {
    line.match_indices("Spec::").any(|(at, _)| {
        !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            && line[at + 6..].starts_with(|c: char| c.is_ascii_uppercase())
    })
}

#[test]
fn the_spec_check_sees_what_it_looks_for() {
    assert!(spec_variant_named("let Spec::File(f) = &r.spec else { continue };"));
    assert!(spec_variant_named("if let Some(Spec::Container(c)) = x {"));
    assert!(!spec_variant_named("let s = FileSpec::new();"));
    assert!(!spec_variant_named("use crate::declaration::Spec;"));
    let code = code_only("// Spec::File in a comment\nlet a = \"Spec::File\";");
    assert!(!code.lines().any(spec_variant_named), "comments and strings are not code");
}

/// The sections of a markdown document a comment may cite: its headings (`#` to `####`) and
/// the bold leads of its bullets (`- **A step has a time limit**, ...`), at any depth; a lead
/// may run over lines. Bold words inside a sentence are emphasis, not places to point at.
fn sections(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, line) in markdown.lines().scan(0, |at, l| {
        let here = *at;
        *at += l.len() + 1;
        Some((here, l))
    }) {
        let trimmed = line.trim_start();
        let heading = trimmed.trim_start_matches('#');
        if (1..=4).contains(&(trimmed.len() - heading.len())) && heading.starts_with(' ') {
            out.push(heading.trim().to_owned());
        } else if let Some(lead) = trimmed.strip_prefix("- **") {
            let start = at + (line.len() - lead.len());
            if let Some(end) = markdown[start..].find("**") {
                out.push(markdown[start..start + end].split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
    }
    out
}

/// The comments of a Rust file, each run of comment lines joined into one line (a citation is
/// often cut by a line break), with the `//`, `///` or `//!` taken off each.
fn comment_runs(text: &str) -> Vec<String> {
    let mut runs = Vec::new();
    let mut run: Vec<&str> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(c) = trimmed.strip_prefix("//") {
            run.push(c.trim_start_matches(['/', '!']).trim());
            continue;
        }
        if !run.is_empty() {
            runs.push(run.join(" "));
            run.clear();
        }
        // A comment after code on the line starts a run the next lines may continue.
        if let Some(at) = line.find("// ") {
            run.push(line[at + 3..].trim());
        }
    }
    if !run.is_empty() {
        runs.push(run.join(" "));
    }
    runs
}

/// Each citation in a comment: the document (`docs/decisions.md`) and the text after it, from
/// which a quoted section is read against the document's own sections (so a section whose name
/// holds quotes, `What makes a container "the same"`, is read whole).
fn citations(comment: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (at, _) in comment.match_indices("docs/") {
        if comment[..at].ends_with(|c: char| is_ident(c) || c == '/' || c == '.') {
            continue;
        }
        let rest = &comment[at..];
        let Some(end) = rest.find(".md") else { continue };
        let doc = &rest[..end + 3];
        if !doc["docs/".len()..end].chars().all(|c| is_ident(c) || c == '-' || c == '/') {
            continue;
        }
        let after = rest[end + 3..].strip_prefix(',').unwrap_or(&rest[end + 3..]).trim_start();
        out.push((doc.to_owned(), after.strip_prefix('"').map(str::to_owned)));
    }
    out
}

/// Every `docs/…` file a comment cites exists, and every section it names (`docs/decisions.md,
/// "The daemon"`) is a heading or a bullet's bold lead there, word for word: a section renamed
/// or moved fails here, not in a reader's search.
#[test]
fn every_cited_document_and_section_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for dir in ["src", "watchers/src", "tests", "benches", "fuzz"] {
        for file in rust_files(&root.join(dir)) {
            if file.ends_with("tests/tidy.rs") {
                continue; // its own tests' examples, which cite nothing real
            }
            for comment in comment_runs(&std::fs::read_to_string(&file).unwrap()) {
                for (doc, quoted) in citations(&comment) {
                    seen += 1;
                    let known = docs.entry(doc.clone()).or_insert_with(|| {
                        std::fs::read_to_string(root.join(&doc)).ok().map(|text| sections(&text))
                    });
                    let Some(known) = known else {
                        wrong.push(format!("{}: cites {doc}, which does not exist", file.display()));
                        continue;
                    };
                    let Some(quoted) = quoted else { continue };
                    if !known.iter().any(|s| quoted.starts_with(&format!("{s}\""))) {
                        let shown: String = quoted.chars().take(70).collect();
                        wrong.push(format!("{}: {doc}, \"{shown}...: no such section", file.display()));
                    }
                }
            }
        }
    }
    assert!(seen > 100, "the citations were not found ({seen}): the check reads the wrong thing");
    assert!(wrong.is_empty(), "citations that lead nowhere:\n{}", wrong.join("\n"));
}

#[test]
fn the_citation_check_sees_what_it_looks_for() {
    let doc = "# Title\n## The daemon\n- **A step has a time\n  limit**, and more\n  - **Nested** too\n\
               Some **emphasis** here.\n##### Too deep\n";
    assert_eq!(sections(doc), ["Title", "The daemon", "A step has a time limit", "Nested"]);
    let runs = comment_runs(
        "/// See (docs/decisions.md,\n/// \"The daemon\").\nlet x = 1; // docs/a.md\n// \"B\"\n",
    );
    assert_eq!(runs, ["See (docs/decisions.md, \"The daemon\").", "docs/a.md \"B\""]);
    assert_eq!(
        citations("(docs/a.md, \"X \"y\"\"; docs/b.md) and mydocs/c.md"),
        [
            ("docs/a.md".to_owned(), Some("X \"y\"\"; docs/b.md) and mydocs/c.md".to_owned())),
            ("docs/b.md".to_owned(), None)
        ]
    );
}

/// The house's bound on a function's length (../shared/guide/STYLE.md; docs/testing.md, "The
/// house's rules, held by tests"): lines from the `fn` line to the line of its closing brace,
/// both counted, comments and blank lines included.
const FUNCTION_LINES: usize = 100;

/// Functions in `src/` and `watchers/src/` (outside their tests) allowed over `FUNCTION_LINES`:
/// the file, the function's name, and why. Each entry must still be needed
/// (`every_rule_exception_is_needed`).
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// The bound on a file of `src/`, in lines outside its `#[cfg(test)]` items.
const FILE_LINES: usize = 1_200;

/// Files of `src/` allowed over `FILE_LINES` (outside their tests), with why. Each entry must
/// still be needed.
const LONG_FILES: &[(&str, &str)] = &[];

/// Sleeps of a second or more in `tests/it` (or of a length the check cannot read), allowed by
/// the file under `tests/it/`, the function they are in, and why. docs/testing.md: a test never
/// sleeps to show that something did not happen, it waits for a barrier; these are the
/// exceptions, each with its reason. Each entry must still be needed.
const LONG_SLEEPS: &[(&str, &str, &str)] = &[
    ("daemon.rs", "hold", "a slow client's pace, one byte a second: the slowness is what the test floods the daemon with, not a wait for it"),
    ("fleet/auth.rs", "a_password_login_outlives_its_token_and_a_change_put_after_it_expired_is_applied", "waits out the token's TTL (etcd 3.4 says nothing when a token expires): idle for more than twice it is the state under test; issue 46 asks a barrier"),
    ("fleet/confirm.rs", "a_new_generation_and_its_confirmation_are_one_status_write", "lets the status writer's rate limit (1 s and a quarter at random) pass twice: once so that it is idle when the change comes, once so that a second write, had there been one, has landed; the absence of a write has no barrier"),
    ("fleet/confirm.rs", "an_agent_killed_inside_its_window_and_restarted_cut_off_goes_back", "waits until the recorded window's wall-clock deadline has passed while the agent is down: the restart after it is the state under test"),
    ("fleet/node.rs", "a_status_write_whose_answer_was_lost_is_read_back_not_written_again", "counts etcd's transactions over 25 s of a node with nothing new to say: the absence of writes (one every backoff of 1, 2, 4, 8 s when the bug is in) has no barrier"),
    ("refusal.rs", "the_daemon_applies_nothing_of_a_declaration_refused_here_and_lets_it_in_once_the_filter_goes", "gives the reconciles of two hand-edits under a refusal time to (wrongly) apply: the daemon exports no per-key count to wait on, and merged events make the resource count no barrier"),
];

/// One function of a source text (after `code_only`): its name, the line of its `fn` (from 1),
/// its length in lines (from the `fn` line to its closing brace's, both counted), and the
/// byte range from its `fn` to its closing brace.
#[derive(Debug)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
    span: std::ops::Range<usize>,
}

/// The byte offset just past the brace that closes the one at `open`, or the text's end.
fn block_end(b: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// Where an item's own text ends, from `from`: past the `;` or the `{...}` block that comes
/// first outside brackets and parentheses (attributes and signatures hold no braces).
fn item_end(b: &[u8], from: usize) -> usize {
    let mut depth = 0i32;
    let mut k = from;
    while k < b.len() {
        match b[k] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b';' if depth == 0 => return k + 1,
            b'{' if depth == 0 => return block_end(b, k),
            _ => {}
        }
        k += 1;
    }
    b.len()
}

/// Every function with a body in `code` (after `code_only`), nested ones too. A `fn` type
/// (`fn(u32) -> u32`) and a declaration without a body (in a trait) are not functions here.
fn functions(code: &str) -> Vec<Function> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn") {
        let word =
            (at == 0 || !is_ident(b[at - 1] as char)) && b.get(at + 2).is_some_and(u8::is_ascii_whitespace);
        if !word {
            continue;
        }
        let rest = code[at + 2..].trim_start();
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            continue;
        }
        let end = item_end(b, at + 2);
        if b[end - 1] != b'}' {
            continue; // no body
        }
        let line = code[..at].matches('\n').count() + 1;
        let lines = code[at..end].matches('\n').count() + 1;
        out.push(Function { name, line, lines, span: at..end });
    }
    out
}

/// The byte ranges of the items under `#[cfg(test)]` in `code` (after `code_only`): a test
/// module, a test-only function or import, each from its attribute to its end.
fn test_items(code: &str) -> Vec<std::ops::Range<usize>> {
    code.match_indices("#[cfg(test)]").map(|(at, a)| at..item_end(code.as_bytes(), at + a.len())).collect()
}

/// The lines of `code` (after `code_only`) outside its `#[cfg(test)]` items.
fn lines_outside_tests(code: &str) -> usize {
    let total = code.lines().count();
    let tests: usize = test_items(code).iter().map(|r| code[r.clone()].matches('\n').count() + 1).sum();
    total.saturating_sub(tests)
}

/// The files of `src/` that are test modules whole: `#[cfg(test)] mod tests;` in their parent.
fn test_module_files(src: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in rust_files(src) {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for r in test_items(&code) {
            let item = code[r].split_whitespace().collect::<Vec<_>>().join(" ");
            let Some(name) = item.strip_prefix("#[cfg(test)] mod ").and_then(|m| m.strip_suffix(';')) else {
                continue;
            };
            let stem = file.file_stem().unwrap();
            let dir = if stem == "mod" || stem == "lib" {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            out.insert(dir.join(format!("{}.rs", name.trim())));
            out.insert(dir.join(name.trim()).join("mod.rs"));
        }
    }
    out
}

/// Each over-long function outside the tests of the files under these directories: its file
/// (from the crate's root), name, line and length.
fn long_functions_in(root: &Path, dirs: &[&str]) -> Vec<(String, String, usize, usize)> {
    let mut out = Vec::new();
    for dir in dirs {
        let tests = test_module_files(&root.join(dir));
        for file in rust_files(&root.join(dir)).into_iter().filter(|f| !tests.contains(f)) {
            let code = code_only(&std::fs::read_to_string(&file).unwrap());
            let skip = test_items(&code);
            let rel = file.strip_prefix(root).unwrap().display().to_string();
            for f in functions(&code) {
                if f.lines > FUNCTION_LINES && !skip.iter().any(|r| r.contains(&f.span.start)) {
                    out.push((rel.clone(), f.name, f.line, f.lines));
                }
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_100_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wrong: Vec<String> = long_functions_in(root, &["src", "watchers/src"])
        .into_iter()
        .filter(|(file, name, _, _)| !LONG_FUNCTIONS.iter().any(|(f, n, _)| f == file && n == name))
        .map(|(file, name, line, lines)| format!("{file}:{line}: `{name}` is {lines} lines"))
        .collect();
    assert!(
        wrong.is_empty(),
        "functions over {FUNCTION_LINES} lines, from `fn` to the closing brace: cut each into named \
         steps (or, for a reason that will not last, add it to LONG_FUNCTIONS in tests/tidy.rs):\n{}",
        wrong.join("\n")
    );
}

/// Each file of `src/` over the bound outside its tests: its path (from the crate's root) and
/// length.
fn long_files_in(root: &Path) -> Vec<(String, usize)> {
    let src = root.join("src");
    let tests = test_module_files(&src);
    let mut out = Vec::new();
    for file in rust_files(&src).into_iter().filter(|f| !tests.contains(f)) {
        let lines = lines_outside_tests(&code_only(&std::fs::read_to_string(&file).unwrap()));
        if lines > FILE_LINES {
            out.push((file.strip_prefix(root).unwrap().display().to_string(), lines));
        }
    }
    out
}

#[test]
fn no_file_in_src_is_longer_than_1200_lines_outside_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wrong: Vec<String> = long_files_in(root)
        .into_iter()
        .filter(|(file, _)| !LONG_FILES.iter().any(|(f, _)| f == file))
        .map(|(file, lines)| format!("{file}: {lines} lines outside its tests"))
        .collect();
    assert!(
        wrong.is_empty(),
        "files over {FILE_LINES} lines outside their #[cfg(test)] items: split each (or, for a reason \
         that will not last, add it to LONG_FILES in tests/tidy.rs):\n{}",
        wrong.join("\n")
    );
}

/// A length of time written in code, in seconds: `Duration::from_secs(4)` (any path before it),
/// `from_millis`, `from_micros`, `from_nanos`, `from_secs_f64`/`_f32`, or the name of a constant
/// in `consts` that is one of those. `None` for anything else (a variable, a sum).
fn seconds(expr: &str, consts: &BTreeMap<String, String>) -> Option<f64> {
    let expr = expr.trim();
    if let Some(value) = consts.get(expr) {
        return seconds(value, &BTreeMap::new());
    }
    let at = expr.find("Duration::from_")?;
    let call = &expr[at + "Duration::from_".len()..];
    let (unit, arg) = call.split_once('(')?;
    let n: f64 = arg.strip_suffix(')')?.trim().replace('_', "").parse().ok()?;
    let scale = match unit {
        "secs" | "secs_f64" | "secs_f32" => 1.0,
        "millis" => 1e-3,
        "micros" => 1e-6,
        "nanos" => 1e-9,
        _ => return None,
    };
    Some(n * scale)
}

/// The constants of `code` (after `code_only`) that are a `Duration`: name to expression.
fn duration_consts(code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (at, _) in code.match_indices("const ") {
        let rest = &code[at + "const ".len()..];
        let Some((head, tail)) = rest.split_once('=') else { continue };
        let Some((name, ty)) = head.split_once(':') else { continue };
        if ty.trim().ends_with("Duration") {
            if let Some((value, _)) = tail.split_once(';') {
                out.insert(name.trim().to_owned(), value.split_whitespace().collect());
            }
        }
    }
    out
}

/// Each sleep in `code` (after `code_only`) of a second or more, or whose length cannot be
/// read: its line, the function it is in, and what it is given.
fn long_sleeps(code: &str, consts: &BTreeMap<String, String>) -> Vec<(usize, String, String)> {
    let b = code.as_bytes();
    let fns = functions(code);
    let mut out = Vec::new();
    for (at, _) in code.match_indices("sleep(") {
        if at > 0 && is_ident(b[at - 1] as char) {
            continue;
        }
        let open = at + "sleep".len();
        let mut depth = 0;
        let mut end = open;
        for (k, c) in b.iter().enumerate().skip(open) {
            match c {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let arg: String = code[open + 1..end].split_whitespace().collect();
        if seconds(&arg, consts).is_some_and(|s| s < 1.0) {
            continue;
        }
        let within = fns.iter().filter(|f| f.span.contains(&at)).min_by_key(|f| f.span.len());
        let line = code[..at].matches('\n').count() + 1;
        out.push((line, within.map_or_else(String::new, |f| f.name.clone()), arg));
    }
    out
}

/// Each long sleep in `tests/it`: its file (under `tests/it/`), line, function and argument.
fn long_sleeps_in(root: &Path) -> Vec<(String, usize, String, String)> {
    let it = root.join("tests/it");
    let files: Vec<(PathBuf, String)> = rust_files(&it)
        .into_iter()
        .map(|f| {
            let code = code_only(&std::fs::read_to_string(&f).unwrap());
            (f, code)
        })
        .collect();
    // A constant may be named in another file of the one binary (`support.rs`, a `mod.rs`).
    let consts: BTreeMap<String, String> = files.iter().flat_map(|(_, code)| duration_consts(code)).collect();
    let mut out = Vec::new();
    for (file, code) in &files {
        let rel = file.strip_prefix(&it).unwrap().display().to_string();
        for (line, within, arg) in long_sleeps(code, &consts) {
            out.push((rel.clone(), line, within, arg));
        }
    }
    out
}

#[test]
fn no_test_sleeps_a_second_or_more_unless_allowed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wrong: Vec<String> = long_sleeps_in(root)
        .into_iter()
        .filter(|(file, _, within, _)| !LONG_SLEEPS.iter().any(|(f, n, _)| f == file && n == within))
        .map(|(file, line, within, arg)| format!("tests/it/{file}:{line}: sleep({arg}) in `{within}`"))
        .collect();
    assert!(
        wrong.is_empty(),
        "sleeps of a second or more (or of a length this check cannot read) in tests/it: wait for a \
         barrier the daemon exports instead, then look (docs/testing.md), or add the function to \
         LONG_SLEEPS in tests/tidy.rs with the reason:\n{}",
        wrong.join("\n")
    );
}

/// The exceptions are the code's picture, as ALLOWED is: one that no longer matches anything
/// (the function cut, the file split, the sleep replaced by a barrier) is taken out.
#[test]
fn every_rule_exception_is_needed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let functions = long_functions_in(root, &["src", "watchers/src"]);
    let files = long_files_in(root);
    let sleeps = long_sleeps_in(root);
    let mut unused = Vec::new();
    for (file, name, _) in LONG_FUNCTIONS {
        if !functions.iter().any(|(f, n, _, _)| f == file && n == name) {
            unused.push(format!("LONG_FUNCTIONS: {file} `{name}`"));
        }
    }
    for (file, _) in LONG_FILES {
        if !files.iter().any(|(f, _)| f == file) {
            unused.push(format!("LONG_FILES: {file}"));
        }
    }
    for (file, name, _) in LONG_SLEEPS {
        if !sleeps.iter().any(|(f, _, n, _)| f == file && n == name) {
            unused.push(format!("LONG_SLEEPS: {file} `{name}`"));
        }
    }
    assert!(
        unused.is_empty(),
        "exceptions in tests/tidy.rs that nothing needs; take them out:\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_rule_checks_refuse_what_breaks_the_rules() {
    // A function of 101 lines is found, one of 100 is not; a function under #[cfg(test)] is
    // not looked at; a `fn` type and a declaration without a body are not functions.
    let body = |n: usize| "    x();\n".repeat(n - 2);
    let code = code_only(&format!(
        "fn short() {{\n{}}}\nfn long(a: [u8; 2]) -> impl Fn() -> u8 {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn huge() {{\n{}    }}\n}}\n\
         trait T {{ fn f(&self); }}\ntype F = fn(u32) -> u32;\n",
        body(100),
        body(101),
        body(300)
    ));
    let found: Vec<(String, usize, usize)> =
        functions(&code).into_iter().map(|f| (f.name, f.line, f.lines)).collect();
    assert_eq!(
        found,
        [("short".to_owned(), 1, 100), ("long".to_owned(), 101, 101), ("huge".to_owned(), 204, 300)]
    );
    let skip = test_items(&code);
    let long: Vec<String> = functions(&code)
        .into_iter()
        .filter(|f| f.lines > FUNCTION_LINES && !skip.iter().any(|r| r.contains(&f.span.start)))
        .map(|f| f.name)
        .collect();
    assert_eq!(long, ["long"], "the one over the bound, outside the tests");
    // Braces in comments and strings do not count.
    let tricky = code_only("fn a() {\n    let s = \"}}}\"; // }\n    let c = '}';\n}\nfn b() {}\n");
    assert_eq!(functions(&tricky).iter().map(|f| f.lines).collect::<Vec<_>>(), [4, 1]);

    // A file of 1,201 lines outside its tests is over the bound; its test module is not counted.
    let file = |outside: usize, tests: usize| {
        code_only(&format!(
            "{}#[cfg(test)]\nmod tests {{\n{}}}\n",
            "fn x() {}\n".repeat(outside),
            "    fn t() {}\n".repeat(tests.saturating_sub(2))
        ))
    };
    assert_eq!(lines_outside_tests(&file(1_201, 50)), 1_201);
    assert_eq!(lines_outside_tests(&file(1_200, 5_000)), 1_200);
    assert_eq!(lines_outside_tests(&code_only("#[cfg(test)]\nuse a::b;\nfn x() {}\n")), 1);

    // Sleeps: a second or more is found, under a second is not, a constant is read, and a length
    // the check cannot read is found too; each with the function it is in.
    let code = code_only(
        "const WAIT: Duration = Duration::from_millis(1_500);\nconst TICK: std::time::Duration = \
         std::time::Duration::from_millis(5);\nfn t() {\n    std::thread::sleep(Duration::from_secs(1));\n    \
         std::thread::sleep(Duration::from_millis(999));\n    tokio::time::sleep(std::time::Duration::from_secs_f64(0.5)).await;\n    \
         sleep(WAIT);\n    sleep(TICK);\n    std::thread::sleep(left);\n    let f = || std::thread::sleep(Duration::from_secs(2));\n}\n\
         fn not_a_sleep() { a.oversleep(Duration::from_secs(9)); }\n",
    );
    let consts = duration_consts(&code);
    assert_eq!(consts.len(), 2, "{consts:?}");
    let found: Vec<(usize, String, String)> = long_sleeps(&code, &consts);
    let t = |line: usize, arg: &str| (line, "t".to_owned(), arg.to_owned());
    assert_eq!(
        found,
        [t(4, "Duration::from_secs(1)"), t(7, "WAIT"), t(9, "left"), t(10, "Duration::from_secs(2)")]
    );
    assert_eq!(seconds("std::time::Duration::from_secs(4)", &BTreeMap::new()), Some(4.0));
    assert_eq!(seconds("Duration::from_secs(a + 1)", &BTreeMap::new()), None);
}

/// The checks as the suite runs them, on a planted tree: a crate root with a function of 101
/// lines, a file of 1,201 lines outside its tests, a test module file of any length, and a
/// `tests/it` with a sleep of two seconds. Each is reported, by the same functions the three
/// rule tests call on the real tree, and what stays within its bound is not.
#[test]
#[allow(clippy::disallowed_methods, reason = "the test plants a tree of its own")]
fn the_rule_checks_find_breaches_planted_in_a_tree() {
    let root = tempfile::tempdir().unwrap();
    let write = |path: &str, text: String| {
        let path = root.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    let body = |n: usize| format!("fn f{n}() {{\n{}}}\n", "    x();\n".repeat(n - 2));
    write("src/lib.rs", format!("#[cfg(test)]\nmod tests;\n{}{}", body(101), body(100)));
    write("src/tests.rs", "fn t() {}\n".repeat(5_000));
    write("src/long.rs", format!("{}#[cfg(test)]\nmod t {{\n{}}}\n", "fn x() {}\n".repeat(1_201), body(300)));
    write("src/short.rs", format!("{}#[cfg(test)]\nmod t {{}}\n", "fn x() {}\n".repeat(1_200)));
    write(
        "tests/it/a.rs",
        "const WAIT: Duration = Duration::from_secs(2);\nfn waits() {\n    std::thread::sleep(WAIT);\n    \
         std::thread::sleep(Duration::from_millis(10));\n}\n"
            .into(),
    );
    let root = root.path();
    let functions: Vec<(String, String, usize)> =
        long_functions_in(root, &["src"]).into_iter().map(|(f, n, _, l)| (f, n, l)).collect();
    assert_eq!(functions, [("src/lib.rs".to_owned(), "f101".to_owned(), 101)]);
    assert_eq!(long_files_in(root), [("src/long.rs".to_owned(), 1_201)]);
    let sleeps: Vec<(String, String, String)> =
        long_sleeps_in(root).into_iter().map(|(f, _, n, a)| (f, n, a)).collect();
    assert_eq!(sleeps, [("a.rs".to_owned(), "waits".to_owned(), "WAIT".to_owned())]);
}

/// Issue 46's shape of the controller, held: the reconciler (`src/controller/worker.rs`) at most
/// `WORKER_LINES` lines in all (what it carried before went to `Source`, `Watches` and `Report`;
/// each feature since had added a field to it), and the runner (`runner.rs` and its tests)
/// knowing only the `Reconcile` trait, never the `Worker`.
const WORKER_LINES: usize = 600;

/// What breaks that shape, given the worker's text and the runner's files' (comments and
/// strings left out, so that a doc comment may name the worker).
fn controller_shape_breaches(worker: &str, runner: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    let lines = worker.lines().count();
    if lines > WORKER_LINES {
        out.push(format!(
            "src/controller/worker.rs: {lines} lines, over {WORKER_LINES}: give what it carries to a part that owns it"
        ));
    }
    for (file, text) in runner {
        let code = code_only(text);
        let named = code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|word| word == "Worker");
        if named {
            out.push(format!("{file}: names the Worker; the runner knows only the Reconcile trait"));
        }
    }
    out
}

#[test]
fn the_controllers_worker_stays_small_and_its_runner_knows_only_the_trait() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let worker = std::fs::read_to_string(root.join("src/controller/worker.rs")).unwrap();
    let mut runner = vec![("src/controller/runner.rs".to_owned(), root.join("src/controller/runner.rs"))];
    for f in rust_files(&root.join("src/controller/runner")) {
        runner.push((f.strip_prefix(root).unwrap().display().to_string(), f));
    }
    let runner: Vec<(String, String)> =
        runner.into_iter().map(|(name, path)| (name, std::fs::read_to_string(path).unwrap())).collect();
    assert!(runner.len() >= 2, "the runner and its tests were not found: {runner:?}");
    let wrong = controller_shape_breaches(&worker, &runner);
    assert!(wrong.is_empty(), "the controller's shape (issue 46) is broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_controller_shape_check_refuses_a_long_worker_and_a_runner_naming_it() {
    let short = "fn x() {}\n".repeat(WORKER_LINES);
    let long = "fn x() {}\n".repeat(WORKER_LINES + 1);
    let clean = vec![(
        "runner.rs".to_owned(),
        "/// Runs a Worker's reconciles.\nfn run<R: Reconcile>(r: R) {}\n".to_owned(),
    )];
    let naming = vec![("runner.rs".to_owned(), "fn run(w: &mut Worker) {}\n".to_owned())];
    assert!(controller_shape_breaches(&short, &clean).is_empty());
    let caught = controller_shape_breaches(&long, &naming);
    assert_eq!(caught.len(), 2, "{caught:?}");
    assert!(caught[0].contains("601 lines") && caught[1].contains("names the Worker"), "{caught:?}");
}
