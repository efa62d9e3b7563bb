//! OpenSSH's `allowed_signers` file, as `ssh-keygen -Y verify` and git read it: one key a line,
//! `principals [options] keytype base64-key [comment]`, `#` comments and blank lines skipped.
//!
//! Strict where a root agent should be: a line this reader cannot take whole (a key type other
//! than Ed25519 or its FIDO form, `cert-authority`, a validity window, an option it does not
//! know, a key that does not decode) refuses the whole file, naming the line and what to do,
//! rather than being skipped: the operator then knows exactly which keys count.
//! `namespaces="..."` is honoured: a key limited to other namespaces does not count for
//! declarations.

use base64::Engine as _;

use super::sshsig::{PublicKey, NAMESPACE};

/// The largest allowed_signers file read.
pub const SIGNERS_LIMIT: u64 = 1 << 20;

/// One trusted key.
#[derive(Clone, Debug)]
pub struct Signer {
    /// Who it is, as the file names them (its principals field): for messages and logs.
    pub principals: String,
    /// The key.
    pub key: PublicKey,
}

/// The keys an `allowed_signers` file trusts for declarations.
#[derive(Clone, Debug, Default)]
pub struct AllowedSigners {
    signers: Vec<Signer>,
}

impl AllowedSigners {
    /// Reads the file's text. `Err` names the line and why it cannot be taken.
    pub fn parse(text: &[u8]) -> Result<AllowedSigners, String> {
        let text = std::str::from_utf8(text).map_err(|_| "it is not UTF-8 text".to_owned())?;
        let mut signers = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(signer) = signer(line).map_err(|e| format!("line {}: {e}", n + 1))? {
                signers.push(signer);
            }
        }
        Ok(AllowedSigners { signers })
    }

    /// The signers given (a policy's role: its keys, named by the policy).
    pub fn from_signers(signers: Vec<Signer>) -> AllowedSigners {
        AllowedSigners { signers }
    }

    /// The signer whose key this is, if the file trusts it (for declarations).
    pub fn find(&self, key: &PublicKey) -> Option<&Signer> {
        self.signers.iter().find(|s| s.key.blob == key.blob)
    }

    /// How many distinct keys are trusted.
    pub fn distinct_keys(&self) -> usize {
        let mut blobs: Vec<&[u8]> = self.signers.iter().map(|s| s.key.blob.as_slice()).collect();
        blobs.sort();
        blobs.dedup();
        blobs.len()
    }
}

/// Key types OpenSSH knows, so that the field after the principals is told apart from options.
fn is_key_type(word: &str) -> bool {
    word.starts_with("ssh-")
        || word.starts_with("sk-")
        || word.starts_with("ecdsa-")
        || word.starts_with("rsa-sha2-")
        || word.ends_with("@openssh.com")
}

/// One line: `None` when its key is limited to namespaces other than the declarations'.
fn signer(line: &str) -> Result<Option<Signer>, String> {
    let fields = split_fields(line)?;
    let mut fields = fields.iter().map(String::as_str);
    let principals = fields.next().unwrap_or_default().to_owned();
    let mut next = fields.next().ok_or("it has principals and no key")?;
    let mut namespaces = None;
    if !is_key_type(next) {
        namespaces = options(next)?;
        next = fields.next().ok_or("it has no key after its options")?;
    }
    let kind = next;
    let b64 = fields.next().ok_or_else(|| format!("its {kind} key has no base64 after the type"))?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("its key is not base64: {e}"))?;
    let key = PublicKey::from_blob(&blob)?;
    if key.kind() != kind {
        return Err(format!("the line says {kind} but the key it holds is {}", key.kind()));
    }
    if let Some(list) = namespaces {
        if !pattern_list_matches(&list, NAMESPACE) {
            return Ok(None);
        }
    }
    Ok(Some(Signer { principals: principals.trim_matches('"').to_owned(), key }))
}

/// The options field: `namespaces="..."` taken (its pattern list), anything else refused.
fn options(field: &str) -> Result<Option<String>, String> {
    let mut namespaces = None;
    for option in split_options(field) {
        let (name, value) = option.split_once('=').unwrap_or((option.as_str(), ""));
        match name.to_ascii_lowercase().as_str() {
            "namespaces" => namespaces = Some(value.trim_matches('"').to_owned()),
            "cert-authority" => {
                return Err("cert-authority is not supported: mesh-host trusts keys, not certificates; list the signers' own keys".into())
            }
            "valid-after" | "valid-before" => {
                return Err(format!(
                    "{name} is not supported yet: remove it, and remove the line when the key should no longer sign"
                ))
            }
            _ => return Err(format!("option {} is not known", name.escape_debug())),
        }
    }
    Ok(namespaces)
}

/// The fields of a line, split at whitespace outside double quotes.
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    fields.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if quoted {
        return Err("a quote is not closed".into());
    }
    if !current.is_empty() {
        fields.push(current);
    }
    Ok(fields)
}

/// The options of an options field, split at commas outside double quotes.
fn split_options(field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in field.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    out.push(current);
    out
}

/// OpenSSH's pattern lists: comma-separated patterns with `*` and `?`; a `!pattern` that
/// matches excludes whatever else matched.
fn pattern_list_matches(list: &str, word: &str) -> bool {
    let mut matched = false;
    for pattern in list.split(',') {
        if let Some(negated) = pattern.strip_prefix('!') {
            if glob(negated.as_bytes(), word.as_bytes()) {
                return false;
            }
        } else if glob(pattern.as_bytes(), word.as_bytes()) {
            matched = true;
        }
    }
    matched
}

/// Whether `word` matches `pattern` (`*` any run of bytes, `?` one byte). In O(pattern × word)
/// at worst: on a mismatch only the last `*` is tried one byte further, never each earlier one
/// again, since a later star can absorb whatever an earlier one would have. A recursive matcher
/// trying every split at every star took exponential time on a pattern of many stars (the fuzz
/// target's timeout: `"me????????****...???s^)s=\"mesh-h-ost*\""`, 14 s and counting).
fn glob(pattern: &[u8], word: &[u8]) -> bool {
    let (mut p, mut w) = (0, 0);
    // The position after the last star seen, and the word's position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while w < word.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, w));
                p += 1;
            }
            Some(&c) if c == b'?' || c == word[w] => {
                p += 1;
                w += 1;
            }
            _ => match star {
                Some((after, tried)) => {
                    p = after;
                    w = tried + 1;
                    star = Some((after, tried + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `*` and `?` as OpenSSH reads them, and the fuzz target's slow input answered at once.
    #[test]
    fn globs_match_as_openssh_and_in_time_whatever_the_stars() {
        for (pattern, word, expect) in [
            ("mesh-host@*", "mesh-host@v1", true),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("?", "", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbYcZ", false),
            ("*c", "abcabc", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("**a**", "bab", true),
            ("*a*b", "ba", false),
        ] {
            assert_eq!(glob(pattern.as_bytes(), word.as_bytes()), expect, "{pattern:?} against {word:?}");
        }
        let slow = format!("me????????{}{}s^)s=\"mesh-h-ost*\"", "*".repeat(26), "?".repeat(18));
        let word = "mesh-host@v1".repeat(20);
        let started = std::time::Instant::now();
        assert!(!glob(slow.as_bytes(), word.as_bytes()));
        let many = format!("{}b", "*a".repeat(40));
        assert!(!glob(many.as_bytes(), "a".repeat(200).as_bytes()));
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
    }

    const KEY: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIHPUFS8gtGWN1VV2DmzLaeEVCfgGKQ7s4ieLGu/nFSGS";

    #[test]
    fn lines_are_read_or_refused_by_name() {
        let ok = format!("# ops\n\nalice@example.com ssh-ed25519 {KEY} alice's laptop\n");
        let s = AllowedSigners::parse(ok.as_bytes()).unwrap();
        assert_eq!(s.signers.len(), 1);
        assert_eq!(s.signers[0].principals, "alice@example.com");

        let scoped = format!("alice namespaces=\"git,mesh-host-*\" ssh-ed25519 {KEY}\n");
        assert_eq!(AllowedSigners::parse(scoped.as_bytes()).unwrap().signers.len(), 1);
        let elsewhere = format!("alice namespaces=\"git\" ssh-ed25519 {KEY}\n");
        assert_eq!(
            AllowedSigners::parse(elsewhere.as_bytes()).unwrap().signers.len(),
            0,
            "not for declarations"
        );
        let excluded = format!("alice namespaces=\"*,!mesh-host-declaration@v1\" ssh-ed25519 {KEY}\n");
        assert_eq!(AllowedSigners::parse(excluded.as_bytes()).unwrap().signers.len(), 0);

        for (line, says) in [
            (format!("ca cert-authority ssh-ed25519 {KEY}"), "line 1: cert-authority is not supported"),
            (format!("a valid-after=\"20260101\" ssh-ed25519 {KEY}"), "line 1: valid-after is not supported"),
            (format!("a frobnicate ssh-ed25519 {KEY}"), "line 1: option frobnicate is not known"),
            ("a ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAAQC7!".into(), "line 1: its key is not base64"),
            ("a ssh-ed25519".into(), "line 1: its ssh-ed25519 key has no base64"),
            ("a ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB".into(), "line 1: key type ssh-rsa is not verified"),
            (
                format!("a sk-ssh-ed25519@openssh.com {KEY}"),
                "line 1: the line says sk-ssh-ed25519@openssh.com",
            ),
            ("\"a ssh-ed25519 x".into(), "line 1: a quote is not closed"),
        ] {
            let e = AllowedSigners::parse(line.as_bytes()).unwrap_err();
            assert!(e.starts_with(says), "{line}: {e}");
        }
    }

    #[test]
    fn the_same_key_on_two_lines_is_one_key() {
        let two = format!("alice ssh-ed25519 {KEY}\nalice-again ssh-ed25519 {KEY}\n");
        assert_eq!(AllowedSigners::parse(two.as_bytes()).unwrap().distinct_keys(), 1);
    }
}
