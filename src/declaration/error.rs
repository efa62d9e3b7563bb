//! Why a declaration was refused, named the way a compiler names a line.

use std::borrow::Cow;
use std::fmt;

/// One thing wrong with a declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The document the problem is in, when the declaration came from several named ones.
    pub source: Option<String>,
    /// The resource's position in `resources`, when the problem is inside one.
    pub index: Option<usize>,
    /// The resource's id, when it has a readable one.
    pub id: Option<String>,
    /// The field, as a path inside the resource (`mode`, `restart-on[1]`, `secrets.db`).
    pub field: Option<String>,
    /// What is wrong, as a sentence for a person.
    pub message: String,
}

impl Problem {
    /// A problem, with every value it quotes cut to a bounded length: the one place a refusal's
    /// text is built, so no declaration, however large its values, makes a large message. A
    /// refusal used to repeat a bad value in full: 52 MB on stderr for a 50 MB `mode`.
    pub fn new(index: Option<usize>, id: Option<&str>, field: Option<&str>, message: &str) -> Problem {
        Problem {
            source: None,
            index,
            id: id.map(|id| cut(id).into_owned()),
            field: field.map(|f| cut(f).into_owned()),
            message: cut_values(message),
        }
    }
}

/// The most characters of one value a message quotes; the rest is left out and counted. Long
/// enough for a whole digest (71) and most paths, which a person needs to see whole to find the
/// typo; short enough that a refusal of any declaration is a few hundred bytes a problem.
const QUOTED: usize = 100;

/// The longest message kept whole, in bytes. Every message the rules write is far shorter once
/// its quoted values are cut; this catches a value shown unquoted (a `version` given as a long
/// list) or quoted in a way the scan below cannot pair.
const MESSAGE: usize = 1_000;

/// An id or a field path, which may hold a declared key: at most `QUOTED` characters, and `…`
/// where the rest was left out.
fn cut(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(QUOTED) {
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
        None => Cow::Borrowed(text),
    }
}

/// Cuts each value the message quotes (between `"`, as Rust's `{:?}` and JSON write a string,
/// or between backticks, as serde names a field or a variant) that is longer than `QUOTED`
/// characters: `"rwxrwxrwx…" (52428800 bytes)`, the count being of the value as quoted. A
/// message still longer than `MESSAGE` bytes is cut there.
pub(crate) fn cut_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MESSAGE + 64));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest.as_bytes()[open];
        out.push_str(&rest[..=open]);
        let inner = &rest[open + 1..];
        let Some(close) = closing(inner, quote) else {
            // An opening quote with no closing one: nothing more can be paired.
            rest = inner;
            break;
        };
        let value = &inner[..close];
        match kept(value, quote) {
            Some(head) => {
                out.push_str(head);
                out.push('…');
                out.push(char::from(quote));
                out.push_str(&format!(" ({} bytes)", value.len()));
            }
            None => {
                out.push_str(value);
                out.push(char::from(quote));
            }
        }
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    if out.len() > MESSAGE {
        let mut end = MESSAGE;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        let whole = out.len();
        out.truncate(end);
        out.push_str(&format!("… (a message of {whole} bytes, cut)"));
    }
    out
}

/// Where the quoted text that starts `inner` ends: the next `quote`, passing over escaped
/// characters in a `"` string. Backtick-quoted names are written raw, with no escapes.
fn closing(inner: &str, quote: u8) -> Option<usize> {
    if quote == b'`' {
        return inner.find('`');
    }
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The first `QUOTED` characters of a quoted value when it is longer, with an escape sequence
/// (`\u{1b}`, `\n`) counted as one character and never split; `None` when it is short enough.
fn kept(value: &str, quote: u8) -> Option<&str> {
    let mut chars = value.char_indices().peekable();
    let mut n = 0;
    while let Some((at, c)) = chars.next() {
        if n == QUOTED {
            return Some(&value[..at]);
        }
        n += 1;
        // The escaped character; `\u{...}` as Rust writes it, or `\uXXXX` as JSON does, runs on.
        if c == '\\' && quote == b'"' && chars.next().is_some_and(|(_, c)| c == 'u') {
            if chars.peek().is_some_and(|&(_, c)| c == '{') {
                while chars.next().is_some_and(|(_, c)| c != '}') {}
            } else {
                for _ in 0..4 {
                    chars.next();
                }
            }
        }
    }
    None
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}: ")?;
        }
        match (self.index, &self.id) {
            (Some(i), Some(id)) => write!(f, "resources[{i}] (id {id:?})")?,
            (Some(i), None) => write!(f, "resources[{i}]")?,
            (None, _) => f.write_str("declaration")?,
        }
        if let Some(field) = &self.field {
            write!(f, ", field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A declaration refused whole. Every problem found is listed, not only the first, so one
/// round trip through the control plane fixes them all; past the first hundred, problems are
/// counted in `unlisted` rather than kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    /// The problems found, in the order they were found, the first hundred at most.
    pub problems: Vec<Problem>,
    /// Problems found after those in `problems`, and not kept.
    pub unlisted: usize,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len() + self.unlisted;
        write!(
            f,
            "the declaration was refused ({n} problem{}); nothing on the machine was touched",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        if self.unlisted > 0 {
            write!(
                f,
                "\n  … and {} more problem{}, not listed",
                self.unlisted,
                if self.unlisted == 1 { "" } else { "s" }
            )?;
        }
        Ok(())
    }
}

/// The most problems a refusal keeps and lists. Past them, problems are counted, not kept: a
/// 10 MB declaration of five million bad resources took 2 GB and wrote 309 MB to stderr when
/// each was kept, and at the 256 MiB input limit it would have taken more memory than a host
/// has. The first hundred say what is wrong; a person fixes those and sends it again.
const LISTED: usize = 100;

/// Collects problems, so each carries the index and id without repeating them: the first
/// `LISTED` of them, and how many more there were. Here, beside what it makes, so that the rules
/// of one resource (`validate`) and those between resources (`across`) both use it without
/// either depending on the other's module.
pub(super) struct Problems {
    pub(super) all: Vec<Problem>,
    unlisted: usize,
}

impl Problems {
    pub(super) fn new() -> Problems {
        Problems { all: Vec::new(), unlisted: 0 }
    }

    pub(super) fn at(
        &mut self,
        index: Option<usize>,
        id: Option<&str>,
        field: Option<&str>,
        message: String,
    ) {
        if self.all.len() < LISTED {
            self.all.push(Problem::new(index, id, field, &message));
        } else {
            self.unlisted += 1;
        }
    }

    /// Takes in the problems found after this collection's own, in order.
    pub(super) fn extend(&mut self, later: Problems) {
        let room = LISTED.saturating_sub(self.all.len());
        let kept = later.all.len().min(room);
        self.unlisted += later.all.len() - kept + later.unlisted;
        self.all.extend(later.all.into_iter().take(kept));
    }

    pub(super) fn refused(self) -> Refused {
        Refused { problems: self.all, unlisted: self.unlisted }
    }
}
