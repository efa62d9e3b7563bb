//! The manifest: what a signature covers. One per scope write, in a line-based text format with
//! exactly one way to write each manifest, so that its bytes are the manifest (signed as bytes,
//! compared as bytes, no canonicalisation to get wrong), and `render(parse(b)) == b`:
//!
//! ```text
//! mesh-host manifest v1
//! fleet prod-eu
//! scope group web
//! version 42
//! issued 1764928800
//! expires 1767520800
//! file 10-base.json 1834 4f1c...(64 lowercase hex)
//! file 20-nginx.json 912 9a0b...
//! ```
//!
//! Every line ends in `\n`, fields are separated by one space, numbers are decimal without
//! leading zeros, times are seconds since the epoch, and files are sorted by name (bytewise),
//! each once. A scope is `fleet`, `group G`, `node N`, `local` (a node's own directory), or
//! `candidate ID SCOPE` (a rollout's candidate for SCOPE; the id may also hold `:`). It is parsed only after its
//! signatures verified.

use std::fmt::Write as _;

/// The largest manifest read: 10,000 files of long names fit.
pub const MANIFEST_LIMIT: usize = 1 << 20;

/// The most files one manifest lists.
pub const MAX_FILES: usize = 10_000;

const HEADER: &str = "mesh-host manifest v1";

/// What a manifest is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every node of the fleet.
    Fleet,
    /// Every node of a group.
    Group(String),
    /// One node.
    Node(String),
    /// A node's own directory (`--declaration`), wherever it is.
    Local,
    /// A rollout's candidate, by the rollout's id, for the scope it replaces.
    Candidate {
        /// The rollout.
        rollout: String,
        /// What it replaces: fleet, a group or a node.
        replaces: Box<Scope>,
    },
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Fleet => f.write_str("fleet"),
            Scope::Group(g) => write!(f, "group {g}"),
            Scope::Node(n) => write!(f, "node {n}"),
            Scope::Local => f.write_str("local"),
            Scope::Candidate { rollout, replaces } => write!(f, "candidate {rollout} {replaces}"),
        }
    }
}

/// One file a manifest lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its name in the scope (a file's name in the directory, a key's under `declaration/`).
    pub name: String,
    /// Its length in bytes.
    pub length: u64,
    /// Its SHA-256.
    pub sha256: [u8; 32],
}

/// A manifest, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The fleet it is for.
    pub fleet: String,
    /// The scope it is for.
    pub scope: Scope,
    /// Only ever goes up, per scope.
    pub version: u64,
    /// When it was signed (seconds since the epoch).
    pub issued: u64,
    /// After when it is no longer taken when first seen (seconds since the epoch).
    pub expires: u64,
    /// Exactly the files, sorted by name.
    pub files: Vec<Listed>,
}

impl Manifest {
    /// Its one text. Panics on nothing; a manifest built with names that `parse` would refuse
    /// renders text that `parse` refuses.
    pub fn render(&self) -> String {
        let mut out = format!("{HEADER}\nfleet {}\nscope {}\n", self.fleet, self.scope);
        let _ = write!(out, "version {}\nissued {}\nexpires {}\n", self.version, self.issued, self.expires);
        for f in &self.files {
            let _ = writeln!(out, "file {} {} {}", f.name, f.length, hex(&f.sha256));
        }
        out
    }

    /// Reads a manifest's bytes, refusing anything but its one text.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, String> {
        if bytes.len() > MANIFEST_LIMIT {
            return Err(format!(
                "it is {} bytes, more than the {MANIFEST_LIMIT} a manifest may be",
                bytes.len()
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8".to_owned())?;
        if !text.is_ascii() {
            return Err("it holds characters other than ASCII".into());
        }
        let Some(body) = text.strip_suffix('\n') else {
            return Err("its last line does not end in a newline".into());
        };
        let mut lines = body.split('\n').enumerate().map(|(n, l)| (n + 1, l));
        let mut field = |name: &str| -> Result<(usize, &str), String> {
            let (n, line) = lines.next().ok_or_else(|| format!("it ends before its {name} line"))?;
            let value = line
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .ok_or_else(|| format!("line {n} is not its {name} line"))?;
            Ok((n, value))
        };
        let first = field("mesh-host")?;
        if first.1 != "manifest v1" {
            return Err(format!("it is not a mesh-host manifest v1 (its first line is not {HEADER:?})"));
        }
        let (n, fleet) = field("fleet")?;
        name(fleet).map_err(|e| format!("line {n}: the fleet {e}"))?;
        let (n, scope) = field("scope")?;
        let scope = parse_scope(scope).map_err(|e| format!("line {n}: {e}"))?;
        let version = number(field("version")?)?;
        let issued = number(field("issued")?)?;
        let (n, expires) = field("expires")?;
        let expires = number((n, expires))?;
        if expires <= issued {
            return Err(format!("line {n}: it expires ({expires}) no later than it was issued ({issued})"));
        }
        let mut files: Vec<Listed> = Vec::new();
        while let Ok((n, line)) = field("file") {
            if files.len() == MAX_FILES {
                return Err(format!("line {n}: it lists more than {MAX_FILES} files"));
            }
            let listed = parse_file(line).map_err(|e| format!("line {n}: {e}"))?;
            if files.last().is_some_and(|last| last.name.as_bytes() >= listed.name.as_bytes()) {
                return Err(format!(
                    "line {n}: {} is not after the file before it (sorted by name, each once)",
                    listed.name
                ));
            }
            files.push(listed);
        }
        let manifest = Manifest { fleet: fleet.to_owned(), scope, version, issued, expires, files };
        // Whatever did not parse as a file line is left over: refused, naming its line. Every
        // field above was read in its one form, so the text is the manifest's only when equal.
        if manifest.render() != text {
            let n = 7 + manifest.files.len();
            return Err(format!("line {n} is not a file line (file NAME LENGTH SHA256)"));
        }
        Ok(manifest)
    }

    /// The file of this name, if it is listed.
    pub fn listed(&self, name: &str) -> Option<&Listed> {
        self.files.binary_search_by(|f| f.name.as_bytes().cmp(name.as_bytes())).ok().map(|i| &self.files[i])
    }
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    let words: Vec<&str> = text.split(' ').collect();
    scope_of(&words).ok_or_else(|| {
        format!("the scope {text:?} is not one of: fleet, group G, node N, local, candidate ID SCOPE")
    })
}

fn scope_of(words: &[&str]) -> Option<Scope> {
    match words {
        ["fleet"] => Some(Scope::Fleet),
        ["local"] => Some(Scope::Local),
        ["group", g] => name(g).ok().map(|()| Scope::Group((*g).to_owned())),
        ["node", n] => name(n).ok().map(|()| Scope::Node((*n).to_owned())),
        ["candidate", id, rest @ ..] => {
            rollout_id(id)?;
            let replaces = scope_of(rest)?;
            matches!(replaces, Scope::Fleet | Scope::Group(_) | Scope::Node(_))
                .then(|| Scope::Candidate { rollout: (*id).to_owned(), replaces: Box::new(replaces) })
        }
        _ => None,
    }
}

/// A fleet's, group's, node's or rollout's name: 1 to 63 of `A-Z a-z 0-9 . _ -`, starting with
/// a letter or digit.
pub(super) fn name(text: &str) -> Result<(), String> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text.as_bytes()[0].is_ascii_alphanumeric()
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!("{text:?} is not a name (1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit)"))
    }
}

/// A rollout's id: a name, which may also hold `:` (`rollout-2026-12-05T18:50:00Z`).
fn rollout_id(text: &str) -> Option<()> {
    name(&text.replace(':', "-")).ok()
}

/// A file's name: printable ASCII without spaces, at most 255 bytes, not hidden, and no `..`
/// or empty path component (an etcd key may hold `/`; a directory's file never does).
pub fn file_name(text: &str) -> Result<(), String> {
    let ok = !text.is_empty()
        && text.len() <= 255
        && text.bytes().all(|b| b.is_ascii_graphic())
        && !text.starts_with('.')
        && text.split('/').all(|part| !part.is_empty() && part != "..");
    if ok {
        Ok(())
    } else {
        Err(format!("{:?} is not a file name a manifest lists", text.escape_debug().to_string()))
    }
}

fn number((n, text): (usize, &str)) -> Result<u64, String> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    text.parse::<u64>()
        .ok()
        .filter(|_| canonical)
        .ok_or_else(|| format!("line {n}: {text:?} is not a number (decimal, no leading zeros)"))
}

fn parse_file(line: &str) -> Result<Listed, String> {
    let [name, length, sha] = line.split(' ').collect::<Vec<_>>()[..] else {
        return Err("a file line is: file NAME LENGTH SHA256".into());
    };
    file_name(name)?;
    let length = number((0, length)).map_err(|_| format!("the length of {name} is not a number"))?;
    let sha256 = unhex(sha).ok_or_else(|| format!("the sha256 of {name} is not 64 lowercase hex digits"))?;
    Ok(Listed { name: name.to_owned(), length, sha256 })
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 lowercase hex digits, read back; `None` for anything else.
pub fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            fleet: "prod-eu".into(),
            scope: Scope::Candidate { rollout: "r-1".into(), replaces: Box::new(Scope::Group("web".into())) },
            version: 42,
            issued: 1_764_928_800,
            expires: 1_767_520_800,
            files: vec![
                Listed { name: "10-base.json".into(), length: 1834, sha256: [0x4f; 32] },
                Listed { name: "20-nginx.json".into(), length: 0, sha256: [0xab; 32] },
            ],
        }
    }

    #[test]
    fn a_manifest_has_one_text() {
        let m = sample();
        let text = m.render();
        assert!(text.starts_with(
            "mesh-host manifest v1\nfleet prod-eu\nscope candidate r-1 group web\nversion 42\n"
        ));
        assert_eq!(Manifest::parse(text.as_bytes()).unwrap(), m);
        let timed = Scope::Candidate {
            rollout: "rollout-2026-12-05T18:50:00Z".into(),
            replaces: Box::new(Scope::Fleet),
        };
        for scope in
            [Scope::Fleet, Scope::Local, Scope::Node("web-1".into()), Scope::Group("db".into()), timed]
        {
            let m = Manifest { scope, files: vec![], ..sample() };
            assert_eq!(Manifest::parse(m.render().as_bytes()).unwrap(), m);
        }
    }

    #[test]
    fn any_other_text_is_refused_by_line() {
        let good = sample().render();
        let cases: Vec<(String, &str)> = vec![
            (good.replace("v1\n", "v2\n"), "it is not a mesh-host manifest v1"),
            (good.trim_end().to_owned(), "its last line does not end in a newline"),
            (good.replace("\n", "\r\n"), "it is not a mesh-host manifest v1"),
            (good.replace("fleet prod-eu", "fleet  prod-eu"), "line 2: the fleet \" prod-eu\" is not a name"),
            (good.replace("fleet prod-eu", "fleet .x"), "line 2: the fleet \".x\" is not a name"),
            (good.replace("scope candidate r-1 group web", "scope candidate r-1 local"), "line 3: the scope"),
            (good.replace("scope candidate r-1 group web", "scope everything"), "line 3: the scope"),
            (good.replace("version 42", "version 042"), "line 4: \"042\" is not a number"),
            (good.replace("version 42", "version +42"), "line 4: \"+42\" is not a number"),
            (good.replace("version 42", "version 99999999999999999999"), "line 4:"),
            (
                good.replace("expires 1767520800", "expires 1764928800"),
                "line 6: it expires (1764928800) no later",
            ),
            (good.replace("issued", "issue"), "line 5 is not its issued line"),
            (good.replace("10-base.json", "30-z.json"), "line 8: 20-nginx.json is not after"),
            (good.replace("20-nginx.json", "10-base.json"), "line 8: 10-base.json is not after"),
            (good.replace("20-nginx.json", ".hidden.json"), "line 8: \".hidden.json\" is not a file name"),
            (good.replace("20-nginx.json", "a/../b.json"), "line 8: \"a/../b.json\" is not a file name"),
            (good.replace(" 1834 ", " -1 "), "line 7: the length of 10-base.json is not a number"),
            (
                good.replace(&"4f".repeat(32), &"4F".repeat(32)),
                "line 7: the sha256 of 10-base.json is not 64",
            ),
            (format!("{good}note hello\n"), "line 9 is not a file line"),
            (format!("{good}\n"), "line 9 is not a file line"),
            (good.replace("file 20", "file  20"), "line 8: a file line is"),
            (good.replace("prod-eu", "pröd"), "it holds characters other than ASCII"),
        ];
        for (text, says) in cases {
            let e = Manifest::parse(text.as_bytes()).unwrap_err();
            assert!(e.starts_with(says), "{text:?}\n  said: {e}\n  want: {says}");
        }
    }

    #[test]
    fn a_listed_file_is_found_by_name() {
        let m = sample();
        assert_eq!(m.listed("20-nginx.json").map(|f| f.length), Some(0));
        assert!(m.listed("30-other.json").is_none());
    }
}
