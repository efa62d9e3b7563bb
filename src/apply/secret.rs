//! Files that carry a secret: their sealed values opened with the node's key, only when the
//! file must be written or compared, into memory zeroed when dropped; and their declared digest,
//! a keyed one, for what restarts or recreates on them.
//!
//! Architecture Invariant: an opened value leaves this module only as `Opened` (zeroed on drop)
//! or as a keyed digest. No error, detail or log line here carries one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use age::secrecy::{ExposeSecret as _, SecretBox};
use zeroize::Zeroize as _;

use super::{Ctx, Error, Managers};
use crate::declaration::{Digest, File};
use crate::secrets::{Keyring, Opened};

/// What opens `${secret:NAME}` in `content`.
const HOLE: &str = "${secret:";

impl Managers {
    /// The node's keyring, read once in a pass: `None` when there is no key file. Read in each
    /// pass that opens a value, not once at start-up, so a key made or rotated under the daemon
    /// is used from its next pass (docs/decisions.md, "The key is read in each pass that opens a
    /// value").
    pub(super) fn keyring(&mut self, key: &Path) -> Result<Option<Arc<Keyring>>, Arc<str>> {
        self.keyring.get_or_insert_with(|| load(key)).clone()
    }
}

/// Reads the node's keyring: `None` when there is no key file; why not, when it cannot be used.
pub fn load(key: &Path) -> Result<Option<Arc<Keyring>>, Arc<str>> {
    let Some(text) = crate::system::keys::read(key).map_err(|e| Arc::from(e.to_string()))? else {
        return Ok(None);
    };
    Keyring::parse(&text)
        .map(|ring| Some(Arc::new(ring)))
        .map_err(|e| Arc::from(format!("the key file {} is not an age identity file: {e}", key.display())))
}

/// The keyring a file carrying a secret is opened with, or the failure of that file: no key
/// (naming where it was looked for, and `keygen`), or a key file that cannot be used.
pub(super) fn keyring(ctx: &mut Ctx<'_>, f: &File) -> Result<Arc<Keyring>, Error> {
    let path = f.path.as_path().to_owned();
    match ctx.machine.keyring(&ctx.opts.key) {
        Ok(Some(ring)) => Ok(ring),
        Ok(None) => Err(Error::NoKey { path, key: ctx.opts.key.clone() }),
        Err(error) => Err(Error::KeyUnusable { path, error }),
    }
}

/// The file's content with its secrets opened: the `sealed` value, or `content` with each
/// `${secret:NAME}` hole filled. Held in one buffer sized up front, so no copy of a value is
/// left behind by a buffer that grew.
pub(super) fn open(ring: &Keyring, f: &File) -> Result<Opened, Error> {
    open_as(ring, f, Fill::Raw)
}

/// How an opened value goes into its hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fill {
    /// Byte for byte: the file is the operator's template, whatever its format.
    Raw,
    /// Inside a JSON string (`into: json`, where a hole can only be in a string): escaped as
    /// JSON escapes, so a quote or a backslash in a password is that character of the value
    /// rather than the end of the string (docs/decisions.md, "Secret holes in `into` content").
    JsonString,
    /// Inside one `KEY=VALUE` line (`into: env`): a value with a line break would write lines
    /// of its own, keys the declaration never named, so it is refused (docs/decisions.md,
    /// "Secret holes in `into` content").
    EnvLine,
}

/// `open`, each value put in its hole as `how` says: the content of an `into` file, whose
/// keys are then read from it. Only the secrets a hole names are opened (docs/decisions.md,
/// "Only the secrets a hole names are opened"); one that does not open fails this file alone,
/// naming the field (docs/decisions.md, "A value's shape is checked at parse, its opening at
/// apply").
pub(super) fn open_as(ring: &Keyring, f: &File, how: Fill) -> Result<Opened, Error> {
    let not_opened =
        |field: String, error| Error::NotOpened { path: f.path.as_path().to_owned(), field, error };
    if let Some(sealed) = &f.sealed {
        return ring.open(sealed.as_str()).map_err(|e| not_opened("sealed".into(), e));
    }
    let content = f.content().unwrap_or_default();
    let mut opened: BTreeMap<&str, Opened> = BTreeMap::new();
    for name in holes(content).map(|(_, name, _)| name) {
        if opened.contains_key(name) {
            continue;
        }
        // Checked at parse: every hole names a declared secret.
        let sealed = f.secrets.get(name).ok_or_else(|| {
            not_opened(format!("secrets.{name}"), crate::secrets::OpenError::Corrupt("not declared".into()))
        })?;
        let value = ring.open(sealed.as_str()).map_err(|e| not_opened(format!("secrets.{name}"), e))?;
        let value = fitted(value, how).map_err(|why| Error::IntoValue {
            path: f.path.as_path().to_owned(),
            field: format!("secrets.{name}"),
            why,
        })?;
        opened.insert(name, value);
    }
    Ok(fill(content, &opened))
}

/// An opened value as its hole takes it (see `Fill`), or why it cannot go there. The reason
/// says what is wrong with the value, never what it holds.
fn fitted(value: Opened, how: Fill) -> Result<Opened, &'static str> {
    let not_text = "is not UTF-8 text";
    match how {
        Fill::Raw => Ok(value),
        Fill::EnvLine => {
            let bytes = value.expose_secret();
            if std::str::from_utf8(bytes).is_err() {
                return Err(not_text);
            }
            if bytes.iter().any(|b| matches!(b, b'\n' | b'\r')) {
                return Err("holds a line break, and an env file's value is one line (seal it with `printf '%s'`, not `echo`, unless the newline is meant)");
            }
            Ok(value)
        }
        Fill::JsonString => {
            let text = std::str::from_utf8(value.expose_secret()).map_err(|_| not_text)?;
            // Sized up front, as `fill` is: no buffer that grew leaves a copy behind.
            let len = text.chars().map(|c| json_escape(c).map_or(c.len_utf8(), str::len)).sum();
            let mut out = Vec::with_capacity(len);
            let mut utf8 = [0u8; 4];
            for c in text.chars() {
                match json_escape(c) {
                    Some(escaped) => out.extend_from_slice(escaped.as_bytes()),
                    None => out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes()),
                }
            }
            utf8.zeroize();
            debug_assert_eq!(out.len(), len, "sized up front");
            Ok(SecretBox::new(Box::new(out)))
        }
    }
}

/// How JSON writes a character inside a string, where it must be escaped: `None` for itself.
fn json_escape(c: char) -> Option<&'static str> {
    /// The control characters without a short escape, as `\u00XX`.
    const CONTROL: [&str; 32] = [
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007", "\\b", "\\t",
        "\\n", "\\u000b", "\\f", "\\r", "\\u000e", "\\u000f", "\\u0010", "\\u0011", "\\u0012", "\\u0013",
        "\\u0014", "\\u0015", "\\u0016", "\\u0017", "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c",
        "\\u001d", "\\u001e", "\\u001f",
    ];
    match c {
        '"' => Some("\\\""),
        '\\' => Some("\\\\"),
        c if (c as u32) < 0x20 => Some(CONTROL[c as usize]),
        _ => None,
    }
}

/// `content` with each hole replaced by its opened value.
fn fill(content: &str, opened: &BTreeMap<&str, Opened>) -> Opened {
    let mut len = content.len();
    for (start, name, end) in holes(content) {
        len = len - (end - start) + opened.get(name).map_or(0, |v| v.expose_secret().len());
    }
    let mut out = Vec::with_capacity(len);
    let mut from = 0;
    for (start, name, end) in holes(content) {
        out.extend_from_slice(&content.as_bytes()[from..start]);
        if let Some(value) = opened.get(name) {
            out.extend_from_slice(value.expose_secret());
        }
        from = end;
    }
    out.extend_from_slice(&content.as_bytes()[from..]);
    debug_assert_eq!(out.len(), len, "sized up front");
    SecretBox::new(Box::new(out))
}

/// Each `${secret:NAME}` in a text: where it starts, the name, where it ends. The same reading
/// as the parse's check of the holes (`declaration::validate::secret_holes`).
fn holes(content: &str) -> impl Iterator<Item = (usize, &str, usize)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let start = at + content[at..].find(HOLE)?;
        let name_at = start + HOLE.len();
        let end = name_at + content[name_at..].find('}')?;
        at = end + 1;
        Some((start, &content[name_at..end], end + 1))
    })
}

/// How much of a file that carried a secret is read to digest it, where no declaration says
/// how large it is (an orphan, `status`): a credential file is small. Anything larger is not
/// what the host wrote.
const FOUND_LIMIT: u64 = 16 << 20;

/// What is at `path`, with its keyed digest when it is a regular file of at most
/// `FOUND_LIMIT` bytes; what was read is zeroed.
pub(super) fn found_keyed(
    fs: &mut crate::system::Fs,
    ring: &Keyring,
    path: &Path,
) -> Result<Option<(crate::system::Meta, Option<Digest>)>, crate::system::fs::Error> {
    // Nothing larger is read, nor hashed: it has no keyed digest either way.
    let Some((meta, held)) = fs.read_bounded(path, FOUND_LIMIT, FOUND_LIMIT)? else { return Ok(None) };
    let d = match held {
        crate::system::fs::Content::Bytes(mut bytes) => {
            let d = Digest::from_keyed(ring.digest(&bytes));
            zeroize::Zeroize::zeroize(&mut bytes);
            Some(d)
        }
        crate::system::fs::Content::Large { .. }
        | crate::system::fs::Content::Unhashed { .. }
        | crate::system::fs::Content::NotFile => None,
    };
    Ok(Some((meta, d)))
}

/// The declared digest of a file carrying a secret, as `restart-on` and a container's spec
/// fold it in: the keyed digest of its opened content, which moves when a value moves and not
/// when the same value is sealed again (docs/secrets.md, "Keyed digests"; docs/decisions.md,
/// "A step that restarts on a file carrying a secret").
pub(super) fn declared_digest(ring: &Keyring, f: &File) -> Result<Digest, Error> {
    let opened = open(ring, f)?;
    Ok(Digest::from_keyed(ring.digest(opened.expose_secret())))
}

/// A keyring for code outside a pass (the scheduler, `installed_steps`): the key file read once,
/// when first asked, and each file carrying a secret failed as in a pass when it cannot be.
pub(super) fn ring_at(key: &Path) -> impl FnMut(&File) -> Result<Arc<Keyring>, Error> + '_ {
    let mut loaded = None;
    move |f| match loaded.get_or_insert_with(|| load(key)) {
        Ok(Some(ring)) => Ok(Arc::clone(ring)),
        Ok(None) => Err(Error::NoKey { path: f.path.as_path().to_owned(), key: key.to_owned() }),
        Err(error) => Err(Error::KeyUnusable { path: f.path.as_path().to_owned(), error: Arc::clone(error) }),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn value(s: &str) -> Opened {
        SecretBox::new(Box::new(s.as_bytes().to_vec()))
    }

    #[test]
    fn holes_are_filled_with_their_values_and_the_rest_is_kept() {
        let content =
            "USER=app\nPASSWORD=${secret:pw}\nAGAIN=${secret:pw}${secret:token}!\n${secret:unclosed";
        let opened: BTreeMap<&str, Opened> =
            [("pw", value("hunter2")), ("token", value(""))].into_iter().collect();
        let filled = fill(content, &opened);
        assert_eq!(
            std::str::from_utf8(filled.expose_secret()).unwrap(),
            "USER=app\nPASSWORD=hunter2\nAGAIN=hunter2!\n${secret:unclosed"
        );
        assert_eq!(filled.expose_secret().capacity(), filled.expose_secret().len(), "sized up front");
        let names: Vec<&str> = holes(content).map(|(_, n, _)| n).collect();
        assert_eq!(names, ["pw", "pw", "token"]);
        assert_eq!(names, crate::declaration::secret_holes(content), "the same reading as the parse's check");
    }

    #[test]
    fn a_value_for_an_into_file_is_escaped_for_a_json_string_and_kept_to_one_env_line() {
        let raw = "pa\"ss\\w\n\u{1}\té";
        let json = fitted(value(raw), Fill::JsonString).unwrap();
        let text = std::str::from_utf8(json.expose_secret()).unwrap();
        assert_eq!(text, r#"pa\"ss\\w\n\u0001\té"#);
        assert_eq!(json.expose_secret().capacity(), json.expose_secret().len(), "sized up front");
        let back: String = serde_json::from_str(&format!("\"{text}\"")).unwrap();
        assert_eq!(back, raw, "a JSON string holding exactly the value");

        assert!(fitted(value("a b=c 'd'"), Fill::EnvLine).is_ok());
        for broken in ["one\ntwo", "trailing\n", "cr\r"] {
            let why = fitted(value(broken), Fill::EnvLine).err().unwrap();
            assert!(why.starts_with("holds a line break"), "{why}");
        }
        for how in [Fill::JsonString, Fill::EnvLine] {
            let bytes = SecretBox::new(Box::new(vec![b'a', 0xff]));
            assert_eq!(fitted(bytes, how).err(), Some("is not UTF-8 text"));
        }
        let bytes = SecretBox::new(Box::new(vec![0xff]));
        assert!(fitted(bytes, Fill::Raw).is_ok(), "a whole file's template takes any bytes");
    }

    /// Only the secrets a hole names are opened: a declared secret no hole names is left sealed,
    /// so one this node cannot open (sealed to another node) does not fail the file. Named by a
    /// hole, the same value fails it, which is what shows it was not opened before.
    #[test]
    fn a_secret_no_hole_names_is_not_opened() {
        let ring = Keyring::parse(&Keyring::generate()).unwrap();
        let elsewhere = Keyring::parse(&Keyring::generate()).unwrap();
        let pw = crate::secrets::seal(&ring.public_key(), b"hunter2").unwrap();
        let unused = crate::secrets::seal(&elsewhere.public_key(), b"not this node's").unwrap();
        let file = |content: &str| {
            let d = crate::declaration::Declaration::parse(
                serde_json::json!({"version": 1, "resources": [
                    {"type": "file", "id": "app.env", "path": "/etc/app.env", "content": content,
                     "secrets": {"pw": pw, "unused": unused}}]})
                .to_string()
                .as_bytes(),
            )
            .unwrap();
            let crate::declaration::Spec::File(f) = &d.resources[0].spec else { unreachable!() };
            f.clone()
        };
        for how in [Fill::Raw, Fill::EnvLine, Fill::JsonString] {
            let opened = open_as(&ring, &file("PW=${secret:pw}\n"), how).unwrap();
            assert_eq!(opened.expose_secret().as_slice(), b"PW=hunter2\n");
        }
        let named = open_as(&ring, &file("PW=${secret:pw} ${secret:unused}\n"), Fill::Raw).err().unwrap();
        assert!(matches!(&named, Error::NotOpened { field, .. } if field == "secrets.unused"), "{named}");
    }
}
