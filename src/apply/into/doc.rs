//! Someone else's file, edited key by key: a JSON object's top-level members, or an env file's
//! `KEY=VALUE` lines. Pure: text in, text out.
//!
//! The text is edited in place, never parsed into a value and printed again: a printer would
//! reorder the other keys, change the file's indentation, and drop an env file's comments.
//! Only the span of an owned value changes; a key the mesh adds goes last, written in the
//! file's own style.
//!
//! The text may hold opened secrets (what the host filled in, or a credential the file had):
//! every buffer that holds any of it is zeroed when it is dropped, and is built at its final
//! size, so no buffer that grew leaves a copy behind in memory freed unzeroed. An edit builds
//! the new text in a buffer of its exact size and zeroes the old one; JSON values are read
//! without being copied where they need not be, and what serde_json does copy is zeroed.

use std::fmt;
use std::ops::Range;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use zeroize::{Zeroize as _, Zeroizing};

use crate::declaration::MergeInto;

/// A file's text, checked to be of its format. Zeroed when dropped; never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Doc {
    format: MergeInto,
    text: String,
}

impl Drop for Doc {
    fn drop(&mut self) {
        self.text.zeroize();
    }
}

impl fmt::Debug for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Its length only: the text may hold a secret.
        f.debug_struct("Doc").field("format", &self.format).field("len", &self.text.len()).finish()
    }
}

/// A declared key and its value (JSON text, or an env value): zeroed when dropped, since the
/// value may have been filled from a secret.
pub(super) type Pair = (String, Zeroizing<String>);

/// One top-level member of a JSON object, by byte ranges into the text.
#[derive(Clone, Debug)]
struct Member {
    key: String,
    /// From the key's opening quote to its closing one, included.
    key_span: Range<usize>,
    value: Range<usize>,
}

/// Why a file is not of its format: a person can find the place from it.
pub(super) type Unreadable = String;

impl Doc {
    /// Checks the text. JSON must be one object (its line and column named otherwise); an env
    /// file must be UTF-8. An empty JSON file is not an object: it is refused like any other
    /// invalid one, which also keeps the host from writing into a file its program has just
    /// truncated to write it again (the program's write would land on the replaced file and be
    /// lost); the next try finds it written.
    pub(super) fn parse(format: MergeInto, bytes: Vec<u8>) -> Result<Doc, Unreadable> {
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..at].iter().filter(|b| **b == b'\n').count() + 1;
            e.into_bytes().zeroize();
            format!("is not UTF-8 text (line {line})")
        })?;
        // Owned from here, so the text is zeroed however this returns.
        let doc = Doc { format, text };
        match format {
            MergeInto::Env => {}
            MergeInto::Json if doc.text.trim().is_empty() => {
                return Err("is empty, which is not a JSON object".to_owned());
            }
            // Read for its shape only: no value of the file is copied out of it.
            MergeInto::Json => match serde_json::from_str::<Top>(&doc.text) {
                Ok(Top::Object) => {}
                Ok(Top::Other) => {
                    return Err("is valid JSON but not an object, so it has no keys to set".to_owned())
                }
                Err(e) => {
                    return Err(format!(
                        "is not valid JSON (line {}, column {}: {})",
                        e.line(),
                        e.column(),
                        strip_position(&e.to_string())
                    ))
                }
            },
        }
        Ok(doc)
    }

    /// A new file holding nothing yet.
    pub(super) fn empty(format: MergeInto) -> Doc {
        Doc { format, text: String::new() }
    }

    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Each value the key has in the file, as written there, in the order they appear: none
    /// when it is absent, more than one when the file gives it twice.
    pub(super) fn get(&self, key: &str) -> Vec<&str> {
        match self.format {
            MergeInto::Json => {
                self.members().into_iter().filter(|m| m.key == key).map(|m| &self.text[m.value]).collect()
            }
            MergeInto::Env => env_lines(&self.text)
                .filter_map(|(_, line)| env_value(line, key))
                .map(|(value, _)| value)
                .collect(),
        }
    }

    /// Whether the file holds `want` for the key at every place it gives it, and gives it at
    /// all. JSON values are compared as values, so the file's own spacing is not drift.
    pub(super) fn holds(&self, key: &str, want: &str) -> bool {
        let found = self.get(key);
        !found.is_empty()
            && found.iter().all(|v| match self.format {
                MergeInto::Json => same_json(v, want),
                MergeInto::Env => *v == want,
            })
    }

    /// Sets the key to `value` (for JSON, a JSON text) at every place the file gives it, or
    /// adds it last when the file does not.
    pub(super) fn set(&mut self, key: &str, value: &str) {
        match self.format {
            MergeInto::Json => self.json_set(key, value, false),
            MergeInto::Env => self.env_set(key, value),
        }
    }

    /// Puts back a value as it was written in this file (`get`), byte for byte: a nested
    /// object keeps its own order and spacing.
    pub(super) fn restore(&mut self, key: &str, value: &str) {
        match self.format {
            MergeInto::Json => self.json_set(key, value, true),
            MergeInto::Env => self.env_set(key, value),
        }
    }

    /// Takes the key out of the file, wherever it is.
    pub(super) fn remove(&mut self, key: &str) {
        match self.format {
            MergeInto::Json => self.json_remove(key),
            MergeInto::Env => {
                // Never longer than the text it is taken from.
                let mut out = String::with_capacity(self.text.len());
                for (raw, line) in env_lines(&self.text) {
                    if env_value(line, key).is_none() {
                        out.push_str(raw);
                    }
                }
                self.replace_text(out);
            }
        }
    }

    /// The text replaced by `new`, the old one zeroed.
    fn replace_text(&mut self, new: String) {
        let mut old = std::mem::replace(&mut self.text, new);
        old.zeroize();
    }

    /// `range` of the text replaced by `with`, in a new buffer of its exact size: an edit in
    /// place could grow the buffer, and the allocator frees the old one unzeroed.
    fn splice(&mut self, range: Range<usize>, with: &str) {
        let text = &self.text;
        let new = joined(&[&text[..range.start], with, &text[range.end..]]);
        self.replace_text(new);
    }

    /// Whether nothing is left in it but white space (and, for JSON, the braces): no key, no
    /// comment, nobody's work.
    pub(super) fn is_bare(&self) -> bool {
        match self.format {
            MergeInto::Json => self.members().is_empty(),
            MergeInto::Env => self.text.trim().is_empty(),
        }
    }

    /// The top-level members, in order. The text is known to be one valid object (or blank).
    fn members(&self) -> Vec<Member> {
        let b = self.text.as_bytes();
        let mut out = Vec::new();
        let Some(open) = self.text.find('{') else { return out };
        let mut i = open + 1;
        loop {
            i = skip_ws(b, i);
            if i >= b.len() || b[i] == b'}' {
                return out;
            }
            let key_end = skip_string(b, i);
            let key = serde_json::from_str::<String>(&self.text[i..key_end]).unwrap_or_default();
            let colon = skip_ws(b, key_end);
            let start = skip_ws(b, colon + 1);
            let end = skip_value(b, start);
            out.push(Member { key, key_span: i..key_end, value: start..end });
            i = skip_ws(b, end);
            if i < b.len() && b[i] == b',' {
                i += 1;
            }
        }
    }

    fn json_set(&mut self, key: &str, value: &str, verbatim: bool) {
        let members = self.members();
        let mut found: Vec<&Member> = members.iter().filter(|m| m.key == key).collect();
        if !found.is_empty() {
            // From the last, so the earlier ranges stay true.
            found.reverse();
            for m in found {
                let text = self.styled(value, line_indent(&self.text, m.key_span.start), verbatim);
                self.splice(m.value.clone(), &text);
            }
            return;
        }
        let quoted = serde_json::to_string(key).expect("a string serialises");
        if self.text.trim().is_empty() {
            let text = self.styled(value, "  ", verbatim);
            self.replace_text(joined(&["{\n  ", &quoted, ": ", &text, "\n}\n"]));
            return;
        }
        match members.last() {
            // After the last member, with the same white space before the key and around the
            // colon as it has.
            Some(last) => {
                let before = preceding_ws(&self.text, last.key_span.start);
                let colon = &self.text[last.key_span.end..last.value.start];
                let text = self.styled(value, line_indent(&self.text, last.key_span.start), verbatim);
                let member = Zeroizing::new(joined(&[",", before, &quoted, colon, &text]));
                self.splice(last.value.end..last.value.end, &member);
            }
            None => {
                let open = self.text.find('{').expect("an object");
                let close = open + 1 + self.text[open + 1..].find('}').expect("closed");
                let multiline = self.text.contains('\n');
                let member = if multiline {
                    Zeroizing::new(joined(&[
                        "\n  ",
                        &quoted,
                        ": ",
                        &self.styled(value, "  ", verbatim),
                        "\n",
                    ]))
                } else {
                    Zeroizing::new(joined(&[&quoted, ": ", &self.styled(value, "", verbatim)]))
                };
                self.splice(open + 1..close, &member);
            }
        }
    }

    fn json_remove(&mut self, key: &str) {
        loop {
            let members = self.members();
            let Some(i) = members.iter().position(|m| m.key == key) else { return };
            let range = match (i.checked_sub(1), members.get(i + 1)) {
                // Up to the next key: it takes this one's place, and its leading white space.
                (_, Some(next)) => members[i].key_span.start..next.key_span.start,
                // The last of several: from the end of the one before, its comma included.
                (Some(prev), None) => members[prev].value.end..members[i].value.end,
                // The only one: the object is left empty, with what was around it.
                (None, None) => {
                    let open = self.text.find('{').expect("an object");
                    let close =
                        members[i].value.end + self.text[members[i].value.end..].find('}').expect("closed");
                    let inner = &self.text[open + 1..close];
                    let keep_newline = if inner.contains('\n') { "\n" } else { "" };
                    self.splice(open + 1..close, keep_newline);
                    continue;
                }
            };
            self.splice(range, "");
        }
    }

    /// A JSON value written as the file writes: compact in a one-line file, else indented by
    /// the member's own indentation, nested levels by the same step. A scalar (a string, a
    /// number, `true`, `false`, `null`) is the same text either way, and is written as
    /// declared, without a parse of what may be a secret.
    fn styled(&self, value: &str, indent: &str, verbatim: bool) -> Zeroizing<String> {
        if verbatim || !value.trim_start().starts_with(['{', '[']) {
            return Zeroizing::new(value.to_owned());
        }
        let Ok(v) = serde_json::from_str::<Value>(value) else { return Zeroizing::new(value.to_owned()) };
        let compact = indent.is_empty() || !self.text.contains('\n') && !self.text.trim().is_empty();
        let text = sized_json(&v, (!compact).then_some(indent));
        wipe(v);
        Zeroizing::new(text)
    }

    fn env_set(&mut self, key: &str, value: &str) {
        // The new text's length first, so it is built in a buffer of its final size.
        let mut len = 0;
        let mut seen = false;
        for (raw, line) in env_lines(&self.text) {
            match env_value(line, key) {
                Some((_, at)) => {
                    seen = true;
                    len += at + value.len() + (raw.len() - line.len());
                }
                None => len += raw.len(),
            }
        }
        let gap = !seen && !self.text.is_empty() && !self.text.ends_with('\n');
        if !seen {
            len += usize::from(gap) + key.len() + 1 + value.len() + 1;
        }
        let mut out = String::with_capacity(len);
        for (raw, line) in env_lines(&self.text) {
            match env_value(line, key) {
                Some((_, at)) => {
                    // What is before the value (indentation, `export `, the key) is kept.
                    out.push_str(&line[..at]);
                    out.push_str(value);
                    out.push_str(&raw[line.len()..]);
                }
                None => out.push_str(raw),
            }
        }
        if !seen {
            if gap {
                out.push('\n');
            }
            for part in [key, "=", value, "\n"] {
                out.push_str(part);
            }
        }
        debug_assert_eq!(out.len(), len, "sized up front");
        self.replace_text(out);
    }
}

/// Some texts one after another, in a buffer of exactly their length.
fn joined(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// A JSON value as text, compact or (with `indent`) pretty with each line after the first
/// indented by it as well, written into a buffer of its final size: serialised once to count,
/// once to write.
fn sized_json(v: &Value, indent: Option<&str>) -> String {
    let run = |w: &mut Indented<'_>| match indent {
        None => serde_json::to_writer(w, v),
        Some(step) => {
            let formatter = serde_json::ser::PrettyFormatter::with_indent(step.as_bytes());
            serde::Serialize::serialize(v, &mut serde_json::Serializer::with_formatter(w, formatter))
        }
    };
    let after_newline = indent.unwrap_or_default().as_bytes();
    let mut count = Indented { out: None, len: 0, after_newline };
    run(&mut count).expect("a value serialises");
    let mut write = Indented { out: Some(Vec::with_capacity(count.len)), len: 0, after_newline };
    run(&mut write).expect("a value serialises");
    let out = write.out.unwrap_or_default();
    debug_assert_eq!(out.len(), count.len, "sized up front");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// What a serialiser writes, with `after_newline` after each line break: counted only
/// (`out: None`), or written.
struct Indented<'a> {
    out: Option<Vec<u8>>,
    len: usize,
    after_newline: &'a [u8],
}

impl std::io::Write for Indented<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for piece in buf.split_inclusive(|b| *b == b'\n') {
            let newline = piece.ends_with(b"\n");
            self.len += piece.len() + if newline { self.after_newline.len() } else { 0 };
            if let Some(out) = &mut self.out {
                out.extend_from_slice(piece);
                if newline {
                    out.extend_from_slice(self.after_newline);
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Zeroes every string of a parsed value (keys included) as it is dropped.
fn wipe(v: Value) {
    match v {
        Value::String(mut s) => s.zeroize(),
        Value::Array(items) => items.into_iter().for_each(wipe),
        Value::Object(members) => {
            for (mut key, value) in members {
                key.zeroize();
                wipe(value);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The shape of a JSON text's top value, read without keeping any of it: values are skipped,
/// not copied (a file's values may be secrets).
enum Top {
    Object,
    Other,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Top, D::Error> {
        d.deserialize_any(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Top::Object)
    }

    // Read to its end, so a broken array is told as broken rather than as "not an object".
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Top, E> {
        Ok(Top::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Top, E> {
        Ok(Top::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Top, E> {
        Ok(Top::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Top, E> {
        Ok(Top::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Top, E> {
        Ok(Top::Other)
    }

    fn visit_unit<E>(self) -> Result<Top, E> {
        Ok(Top::Other)
    }
}

/// Each line of an env file, with its line ending (`raw`) and without it.
fn env_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.split_inclusive('\n').map(|raw| (raw, raw.strip_suffix('\n').unwrap_or(raw)))
}

/// The value a line gives `key`, and where in the line it starts: `KEY=VALUE`, optionally
/// indented or after `export `. A comment is not a line that gives anything.
fn env_value<'a>(line: &'a str, key: &str) -> Option<(&'a str, usize)> {
    let body = line.trim_start();
    let body = body.strip_prefix("export ").map(str::trim_start).unwrap_or(body);
    let rest = body.strip_prefix(key)?.strip_prefix('=')?;
    let at = line.len() - rest.len();
    Some((rest, at))
}

/// The declared content of an env `into`: its keys and values, in order. Lines that are blank
/// or comments set nothing (the declaration was checked to be KEY=VALUE lines otherwise).
pub(super) fn declared_env(content: &str) -> Vec<Pair> {
    content
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), Zeroizing::new(v.to_owned())))
        .collect()
}

/// The declared content of a JSON `into`: its top-level members, in the declared order, each
/// value as JSON text.
pub(super) fn declared_json(content: &str) -> Vec<Pair> {
    let doc = Doc { format: MergeInto::Json, text: content.to_owned() };
    doc.members().into_iter().map(|m| (m.key, Zeroizing::new(content[m.value].to_owned()))).collect()
}

/// Two JSON texts hold the same value. The same text needs no parse; otherwise both are
/// parsed and the parses zeroed.
fn same_json(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)) {
        (Ok(a), Ok(b)) => {
            let same = a == b;
            wipe(a);
            wipe(b);
            same
        }
        (a, b) => {
            a.into_iter().chain(b).for_each(wipe);
            false
        }
    }
}

/// serde_json's message without its own " at line L column C", which the caller words.
fn strip_position(message: &str) -> &str {
    message.rsplit_once(" at line ").map_or(message, |(m, _)| m)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// From an opening quote to just past the closing one.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Just past one JSON value.
fn skip_value(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace() {
                j += 1;
            }
            j
        }
    }
}

/// The white space just before `at`, back to the previous `{` or `,`.
fn preceding_ws(text: &str, at: usize) -> &str {
    let start = text[..at].rfind(|c: char| !c.is_whitespace()).map_or(0, |i| i + 1);
    &text[start..at]
}

/// The indentation of the line `at` is on, when only white space comes before it there; empty
/// for a member that does not start its line (a one-line file).
fn line_indent(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let lead = &text[start..at];
    if lead.chars().all(|c| c == ' ' || c == '\t') && text[..at].contains('\n') {
        lead
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAEMON_JSON: &str = r#"{
    "log-driver": "json-file",
    "log-opts": {
        "max-size": "10m",
        "max-file": "3"
    },
    "storage-driver": "overlay2",
    "live-restore": true
}
"#;

    fn json(text: &str) -> Doc {
        Doc::parse(MergeInto::Json, text.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn json_keys_are_set_in_place_and_added_last_in_the_files_style() {
        let mut d = json(DAEMON_JSON);
        d.set("storage-driver", r#""vfs""#);
        d.set("registry-mirrors", r#"["http://127.0.0.1:5055"]"#);
        d.set("log-opts", r#"{"max-size": "50m"}"#);
        assert_eq!(
            d.text(),
            r#"{
    "log-driver": "json-file",
    "log-opts": {
        "max-size": "50m"
    },
    "storage-driver": "vfs",
    "live-restore": true,
    "registry-mirrors": [
        "http://127.0.0.1:5055"
    ]
}
"#
        );
        assert!(d.holds("log-opts", r#"{ "max-size":"50m" }"#), "compared as values");
        assert_eq!(d.get("live-restore"), ["true"]);
        assert!(d.get("debug").is_empty());
        // Put back as it was: the other keys never moved.
        d.set("storage-driver", r#""overlay2""#);
        d.restore("log-opts", "{\n        \"max-size\": \"10m\",\n        \"max-file\": \"3\"\n    }");
        d.remove("registry-mirrors");
        assert_eq!(d.text(), DAEMON_JSON);
    }

    #[test]
    fn json_one_line_files_stay_on_one_line_and_empty_ones_are_written_pretty() {
        let mut d = json(r#"{"a":1,"b":{"c":2}}"#);
        d.set("b", r#"{"c": 3}"#);
        d.set("d", "[1, 2]");
        assert_eq!(d.text(), r#"{"a":1,"b":{"c":3},"d":[1,2]}"#);
        d.remove("a");
        d.remove("d");
        assert_eq!(d.text(), r#"{"b":{"c":3}}"#);
        d.remove("b");
        assert_eq!(d.text(), "{}");
        assert!(d.is_bare());
        let mut d = Doc::empty(MergeInto::Json);
        d.set("debug", "true");
        assert_eq!(d.text(), "{\n  \"debug\": true\n}\n");
        d.remove("debug");
        assert!(d.is_bare());
        let mut d = json("{\n}\n");
        d.set("a", "1");
        assert_eq!(d.text(), "{\n  \"a\": 1\n}\n");
    }

    #[test]
    fn a_key_given_twice_is_set_at_both_places() {
        let mut d = json("{\"a\": 1, \"b\": 2, \"a\": 3}");
        assert_eq!(d.get("a"), ["1", "3"]);
        assert!(!d.holds("a", "1"));
        d.set("a", "5");
        assert_eq!(d.text(), "{\"a\": 5, \"b\": 2, \"a\": 5}");
        assert!(d.holds("a", "5"));
        d.remove("a");
        assert_eq!(d.text(), "{\"b\": 2}");
    }

    #[test]
    fn what_is_not_a_json_object_is_named_by_line() {
        let err = Doc::parse(MergeInto::Json, b"{\n  \"a\": 1,\n  \"b\" 2\n}\n".to_vec()).unwrap_err();
        assert_eq!(err, "is not valid JSON (line 3, column 7: expected `:`)");
        let err = Doc::parse(MergeInto::Json, b"[1, 2]".to_vec()).unwrap_err();
        assert_eq!(err, "is valid JSON but not an object, so it has no keys to set");
        let err = Doc::parse(MergeInto::Env, b"A=1\nB=\xff\n".to_vec()).unwrap_err();
        assert_eq!(err, "is not UTF-8 text (line 2)");
        let err = Doc::parse(MergeInto::Json, b"  \n".to_vec()).unwrap_err();
        assert_eq!(err, "is empty, which is not a JSON object");
    }

    #[test]
    fn env_lines_comments_blanks_and_order_are_kept() {
        let text =
            "# the program's own\nexport PATH_X=/bin\n\n  PORT=80\nNAME=web # not a comment\nPORT=81\n";
        let mut d = Doc::parse(MergeInto::Env, text.as_bytes().to_vec()).unwrap();
        assert_eq!(d.get("PORT"), ["80", "81"]);
        assert_eq!(d.get("PATH_X"), ["/bin"]);
        assert!(d.get("PORT_").is_empty() && d.get("POR").is_empty());
        d.set("PORT", "8080");
        d.set("PATH_X", "/usr/bin");
        d.set("NEW", "a b=c");
        assert_eq!(
            d.text(),
            "# the program's own\nexport PATH_X=/usr/bin\n\n  PORT=8080\nNAME=web # not a comment\nPORT=8080\nNEW=a b=c\n"
        );
        assert!(d.holds("PORT", "8080"));
        d.remove("NEW");
        d.set("PORT", "80");
        assert!(!d.is_bare());
        let mut d = Doc::parse(MergeInto::Env, b"A=1".to_vec()).unwrap();
        d.set("B", "2");
        assert_eq!(d.text(), "A=1\nB=2\n");
        d.remove("A");
        d.remove("B");
        assert!(d.is_bare());
    }

    #[test]
    fn edits_that_grow_the_text_build_it_at_its_final_size() {
        // A buffer that grew would have been reallocated, leaving a copy of what it held.
        let exact = |d: &Doc| assert_eq!(d.text.capacity(), d.text.len(), "{}", d.text);
        let mut d = json(DAEMON_JSON);
        d.set("log-opts", r#"{"max-size": "50m", "password": "a longer value than before"}"#);
        exact(&d);
        d.set("registry-auth", r#"[{"user": "u", "password": "p"}, 2]"#);
        exact(&d);
        d.set("storage-driver", r#""a much longer driver name than overlay2""#);
        exact(&d);
        let mut d = Doc::empty(MergeInto::Json);
        d.set("a", r#"{"b": "c"}"#);
        exact(&d);
        let mut d = json("{}");
        d.set("a", "1");
        exact(&d);
        let mut d = Doc::parse(MergeInto::Env, b"A=1\nB=2".to_vec()).unwrap();
        d.set("A", "a longer value");
        exact(&d);
        d.set("C", "new");
        exact(&d);
        assert_eq!(d.text(), "A=a longer value\nB=2\nC=new\n");

        let v: Value = serde_json::from_str(r#"{"a": [1, "two"], "b": {"c": null}}"#).unwrap();
        for indent in [None, Some("    ")] {
            let text = sized_json(&v, indent);
            assert_eq!(text.capacity(), text.len());
            let back: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, v);
        }
        assert_eq!(
            sized_json(&v, Some("  ")),
            "{\n    \"a\": [\n      1,\n      \"two\"\n    ],\n    \"b\": {\n      \"c\": null\n    }\n  }"
        );
        assert!(!format!("{d:?}").contains("longer"), "Debug never shows the text");
    }

    fn plain(pairs: Vec<Pair>) -> Vec<(String, String)> {
        pairs.into_iter().map(|(k, v)| (k, v.to_string())).collect()
    }

    #[test]
    fn declared_keys_are_read_in_order() {
        assert_eq!(
            plain(declared_json(r#"{"z": 1, "a": {"b": [1, "}"]}}"#)),
            [("z".to_owned(), "1".to_owned()), ("a".to_owned(), r#"{"b": [1, "}"]}"#.to_owned())]
        );
        assert_eq!(
            plain(declared_env("# c\nB=2\n\nA= x=y\n")),
            [("B".to_owned(), "2".to_owned()), ("A".to_owned(), " x=y".to_owned())]
        );
    }
}
