//! Text for a person's terminal that nothing foreign can steer (issue 45, security review F9).
//!
//! A path, a file's content, a process's `comm`, a node's status in etcd and an error's words
//! are written by whoever made them: a local user, a container, a compromised node. Printed
//! raw, an escape sequence in one of them is read by the operator's terminal (a title set, the
//! screen cleared, lines hidden, the clipboard written through OSC 52). Every such string
//! printed as text goes through [`escape`] or [`escape_lines`] first; JSON output does not,
//! since serde already writes control characters as `\u001b` (docs/decisions.md, "Nothing
//! foreign steers a terminal").
//!
//! Escaped: the C0 controls (U+0000 to U+001F), DEL, the C1 controls (U+0080 to U+009F, which
//! some terminals take as escape sequences of their own) as `\xNN` (ESC is `\x1b`), with `\n`,
//! `\r` and `\t` as those two characters; and the bidirectional overrides and isolates
//! (U+202A to U+202E, U+2066 to U+2069), which reorder what a reader sees, as `\u{NNNN}`. A
//! backslash is left as it is: the escaped form is for a person to read, not to be decoded.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with every control character escaped, newlines and tabs included: for a string that is
/// one field of one line (a path, a `comm`, a node's error), so it cannot start a fake line.
pub fn escape(s: &str) -> Cow<'_, str> {
    escaped(s, false)
}

/// `s` with every control character escaped but newlines and tabs, which stay as they are: for
/// text that is many lines by design (a diff, a table, a refusal listing its problems).
pub fn escape_lines(s: &str) -> Cow<'_, str> {
    escaped(s, true)
}

fn escaped(s: &str, keep_lines: bool) -> Cow<'_, str> {
    let kept = |c: char| keep_lines && (c == '\n' || c == '\t');
    if !s.chars().any(|c| steers(c) && !kept(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !steers(c) || kept(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Whether a terminal could take `c` as (part of) a command rather than a character to show.
fn steers(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The text log's fields (`tracing`'s default formatting), each control character escaped as
/// [`escape_lines`] does. tracing-subscriber escapes ESC in an event's message, but a field
/// given by `%` (a path, an error) is written as it is: this covers every field, the message
/// included. On a terminal, field names lose their italics; the JSON log is left to serde.
#[derive(Debug, Default)]
pub struct EscapedFields(tracing_subscriber::fmt::format::DefaultFields);

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut raw = String::new();
        self.0.format_fields(tracing_subscriber::fmt::format::Writer::new(&mut raw), fields)?;
        writer.write_str(&escape_lines(&raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in ["", "/etc/app.conf", "vim", "caf\u{e9} \u{2014} \u{1f600}", "a\\x1b stays"] {
            assert!(matches!(escape(s), Cow::Borrowed(t) if t == s), "{s:?}");
        }
        assert!(matches!(escape_lines("a\n\tb\n"), Cow::Borrowed("a\n\tb\n")));
    }

    #[test]
    fn escape_sequences_are_shown_not_sent() {
        assert_eq!(escape("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(escape("\x1b[2J"), "\\x1b[2J");
        assert_eq!(escape("a\0b\x08c\x7fd"), "a\\x00b\\x08c\\x7fd");
        // C1: CSI alone (U+009B) is ESC [ to some terminals.
        assert_eq!(escape("\u{9b}2J \u{85}"), "\\x9b2J \\x85");
        assert_eq!(escape("abc\u{202e}txt.exe\u{2066}"), "abc\\u{202e}txt.exe\\u{2066}");
    }

    #[test]
    fn one_line_stays_one_line() {
        assert_eq!(escape("a\nfake line\r\tb"), "a\\nfake line\\r\\tb");
    }

    #[test]
    fn lines_keep_newlines_and_tabs_and_nothing_else() {
        assert_eq!(escape_lines("-old\n+\x1b[2Jnew\r\n\tx\n"), "-old\n+\\x1b[2Jnew\\r\n\tx\n");
    }

    #[test]
    fn nothing_that_steers_survives_either() {
        // Every code point that steers, alone and beside text: none is left in the output.
        let all: Vec<char> = (0u32..0x3000).filter_map(char::from_u32).filter(|c| steers(*c)).collect();
        assert_eq!(all.len(), 32 + 33 + 5 + 4, "C0, DEL with C1, and the bidi controls");
        for c in all {
            let s = format!("x{c}y");
            assert!(!escape(&s).chars().any(steers), "{c:?}");
            assert!(!escape_lines(&s).chars().any(|c| steers(c) && c != '\n' && c != '\t'), "{c:?}");
        }
    }

    /// What a subscriber writes for one event with a field given by `%`, as `target = %path`
    /// is, formatted by `fields` when given, by tracing's default otherwise.
    fn logged(fields: Option<EscapedFields>) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf(Arc::new(Mutex::new(Vec::new())));
        let to = buf.clone();
        let builder =
            tracing_subscriber::fmt().with_ansi(false).without_time().with_writer(move || to.clone());
        let event = || tracing::info!(target = %"/srv/\x1b]0;pwned\x07.conf", "put back");
        match fields {
            Some(f) => tracing::subscriber::with_default(builder.fmt_fields(f).finish(), event),
            None => tracing::subscriber::with_default(builder.finish(), event),
        }
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_log_fields_escape_is_escaped() {
        let line = logged(Some(EscapedFields::default()));
        assert!(line.contains("target=/srv/\\x1b]0;pwned\\x07.conf"), "{line:?}");
        assert!(!line.contains('\x1b'), "{line:?}");
        // The test can fail: tracing's own formatting writes such a field raw.
        assert!(logged(None).contains('\x1b'));
    }
}
