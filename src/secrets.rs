//! Sealed values: the node's sealing identity, opening what was sealed to it, sealing for it,
//! and the keyed digest of what carries a secret.
//!
//! The format is age's (X25519), through the `age` crate; nothing here is cryptography of the
//! project's own. A value is sealed with the node's public key (`age1...`) by the control plane
//! or by `mesh-host seal`, and only the node's private half opens it.
//!
//! Architecture Invariant: nothing here touches the machine. The key file is read and written
//! by `system::keys`; this module turns its text into a `Keyring` and back, so every rule about
//! what a key file holds is tested without root.
//!
//! Architecture Invariant: an opened value lives in a `SecretBox`, zeroed when it is dropped,
//! and is never formatted: no `Debug` or `Display` here shows one. Errors name what failed to
//! open, never what it held.

use std::fmt;
use std::io::Read as _;
use std::str::FromStr as _;

use age::secrecy::{ExposeSecret as _, SecretBox, SecretString};
use base64::Engine as _;
use hmac::Mac as _;
use zeroize::Zeroize as _;

/// An opened value: zeroed when dropped.
pub type Opened = SecretBox<Vec<u8>>;

/// What the comment carrying the digest key starts with, in the key file.
const DIGEST_LINE: &str = "# mesh-host digest key: ";
/// What the digest key is derived from the first identity with, so that it is never the
/// identity itself and a future derivation can be told apart.
const DIGEST_CONTEXT: &[u8] = b"mesh-host keyed digest v1";
const ARMOR: &str = "-----BEGIN AGE ENCRYPTED FILE-----";

/// The node's sealing identities (the current one first, then the previous one kept during a
/// rotation) and the key of its keyed digests.
pub struct Keyring {
    identities: Vec<age::x25519::Identity>,
    digest_key: SecretBox<[u8; 32]>,
}

/// Why a key file's text is not a keyring. Never quotes a line: a line of a key file may be a
/// private key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// No identity in the file at all.
    #[error("it holds no age identity (a line `AGE-SECRET-KEY-1...`)")]
    Empty,
    /// A line that is not a comment and not an identity; holds its line number.
    #[error("line {0} is neither a comment nor an age X25519 identity")]
    NotIdentity(usize),
    /// A digest key that is not 64 hex digits; holds its line number.
    #[error("line {0} carries a digest key that is not 64 hex digits")]
    BadDigestKey(usize),
    /// `keygen --retire-previous` asked of a key file with one identity only.
    #[error("there is no previous identity to retire: it holds one identity only")]
    NoPrevious,
}

/// Why a sealed value did not open. Says what is wrong with the value, never what it held.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The value is neither armored age nor base64 of binary age.
    #[error("it is neither an armored age value (`{ARMOR}`) nor base64 of a binary one")]
    NotAge,
    /// The value was sealed to another key than this node's (and its previous one).
    #[error(
        "it was not sealed to this node's key (nor to the previous one, during a rotation): seal it again with `mesh-host seal --to` and the key `mesh-host pubkey` prints"
    )]
    NotOurs,
    /// The value is age and cannot be read as such; holds the library's error.
    #[error("it is not a readable age value: {0}")]
    Corrupt(String),
}

/// Why `seal` could not seal.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The public key given is not an age X25519 one; holds the key and why.
    #[error("{0:?} is not an age X25519 public key (`age1...`): {1}")]
    Recipient(String, &'static str),
    /// Sealing failed; holds the library's error.
    #[error("cannot seal: {0}")]
    Encrypt(String),
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The public halves only.
        f.debug_struct("Keyring").field("public", &self.public_keys()).finish_non_exhaustive()
    }
}

impl Keyring {
    /// Reads a key file's text: comments (`#`), blank lines, and age X25519 identities, the
    /// current one first. The digest key is the one the file carries, or, in a key file made by
    /// `age-keygen`, derived from its first identity (docs/decisions.md, "The key file"; "The
    /// digest key").
    pub fn parse(text: &SecretString) -> Result<Keyring, KeyError> {
        let mut identities = Vec::new();
        let mut digest_key = None;
        for (n, line) in text.expose_secret().lines().enumerate() {
            let line = line.trim();
            if let Some(hex) = line.strip_prefix(DIGEST_LINE) {
                digest_key = Some(unhex(hex.trim()).ok_or(KeyError::BadDigestKey(n + 1))?);
            } else if line.is_empty() || line.starts_with('#') {
                continue;
            } else {
                let identity =
                    age::x25519::Identity::from_str(line).map_err(|_| KeyError::NotIdentity(n + 1))?;
                identities.push(identity);
            }
        }
        let first = identities.first().ok_or(KeyError::Empty)?;
        let digest_key = match digest_key {
            Some(key) => key,
            None => derive_digest_key(first),
        };
        Ok(Keyring { identities, digest_key })
    }

    /// A new key file: one fresh identity and the digest key derived from it.
    pub fn generate() -> SecretString {
        let identity = age::x25519::Identity::generate();
        let digest_key = derive_digest_key(&identity);
        Keyring { identities: vec![identity], digest_key }.to_text()
    }

    /// A new identity in front, the current one kept behind it as the previous (an older
    /// previous one is dropped), and the digest key unchanged: a rotation moves no keyed digest,
    /// so it recreates nothing (docs/decisions.md, "The digest key"; docs/secrets.md, "Keyed
    /// digests").
    pub fn rotate(&self) -> SecretString {
        let mut identities = vec![age::x25519::Identity::generate()];
        identities.extend(self.identities.first().cloned());
        Keyring { identities, digest_key: SecretBox::new(Box::new(*self.digest_key.expose_secret())) }
            .to_text()
    }

    /// The current identity alone: values sealed to the previous one no longer open.
    pub fn retire_previous(&self) -> Result<SecretString, KeyError> {
        if self.identities.len() < 2 {
            return Err(KeyError::NoPrevious);
        }
        let current = self.identities[..1].to_vec();
        Ok(Keyring {
            identities: current,
            digest_key: SecretBox::new(Box::new(*self.digest_key.expose_secret())),
        }
        .to_text())
    }

    /// The public key values are sealed to: the current identity's, `age1...`.
    pub fn public_key(&self) -> String {
        self.identities[0].to_public().to_string()
    }

    /// Every public key that opens: the current one, then the previous one.
    pub fn public_keys(&self) -> Vec<String> {
        self.identities.iter().map(|i| i.to_public().to_string()).collect()
    }

    /// Whether a previous identity is kept.
    pub fn has_previous(&self) -> bool {
        self.identities.len() > 1
    }

    /// Opens a sealed value: armored age text, or base64 of a binary age value, the two shapes
    /// the parse lets through (docs/decisions.md, "A value's shape is checked at parse, its
    /// opening at apply").
    pub fn open(&self, sealed: &str) -> Result<Opened, OpenError> {
        Self::open_with(sealed, &self.identities)
    }

    /// Whether a sealed value opens with the current identity alone. One that opens only with
    /// the previous identity must be sealed again before that one is retired, if the node is
    /// to open it afterwards. What it opens to is zeroed at once.
    pub fn opens_with_current(&self, sealed: &str) -> bool {
        Self::open_with(sealed, &self.identities[..1]).is_ok()
    }

    fn open_with(sealed: &str, identities: &[age::x25519::Identity]) -> Result<Opened, OpenError> {
        let trimmed = sealed.trim();
        let binary;
        let bytes: &[u8] = if trimmed.starts_with(ARMOR) {
            trimmed.as_bytes()
        } else {
            let compact: String = trimmed.split_ascii_whitespace().collect();
            binary =
                base64::engine::general_purpose::STANDARD.decode(compact).map_err(|_| OpenError::NotAge)?;
            &binary
        };
        let decryptor =
            age::Decryptor::new_buffered(age::armor::ArmoredReader::new(bytes)).map_err(|e| match e {
                age::DecryptError::InvalidHeader | age::DecryptError::UnknownFormat => OpenError::NotAge,
                other => OpenError::Corrupt(other.to_string()),
            })?;
        let identities = identities.iter().map(|i| i as &dyn age::Identity);
        let mut reader = decryptor.decrypt(identities).map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => OpenError::NotOurs,
            other => OpenError::Corrupt(other.to_string()),
        })?;
        // The plaintext is shorter than the ciphertext: room for all of it up front, so the
        // buffer never grows and leaves a copy of a value behind in memory freed unzeroed.
        let mut plain = Vec::with_capacity(bytes.len());
        if let Err(e) = reader.read_to_end(&mut plain) {
            // What was read before the failure is as secret as the rest.
            plain.zeroize();
            return Err(OpenError::Corrupt(e.to_string()));
        }
        Ok(SecretBox::new(Box::new(plain)))
    }

    /// The keyed digest of some bytes: HMAC-SHA256 under the node's digest key. It moves when
    /// the bytes move, and tells nothing about them to whoever lacks the key: a short password
    /// cannot be found by hashing guesses (docs/secrets.md, "Keyed digests"; docs/decisions.md,
    /// "A keyed digest is spelled `hmac-sha256:<hex>`").
    pub fn digest(&self, bytes: &[u8]) -> [u8; 32] {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(self.digest_key.expose_secret())
            .expect("HMAC takes a key of any length");
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }

    /// The key file's text for this keyring.
    fn to_text(&self) -> SecretString {
        use std::fmt::Write as _;
        // Room for the whole file up front (it is under a kilobyte): a string that grew would
        // leave copies of the private key in memory freed unzeroed.
        let mut text = String::with_capacity(2048);
        text.push_str(
            "# mesh-host sealing identity: this node's private key. Mode 0600, read by the agent alone.\n\
             # Values sealed to the public key below open on this node only (`mesh-host pubkey`).\n",
        );
        for (n, identity) in self.identities.iter().enumerate() {
            if n == 1 {
                text.push_str(
                    "# The previous identity, kept during a rotation so that values sealed to it still open;\n\
                     # `mesh-host keygen --retire-previous` drops it.\n",
                );
            }
            let _ = writeln!(text, "# public key: {}", identity.to_public());
            text.push_str(identity.to_string().expose_secret());
            text.push('\n');
        }
        text.push_str("# The key of the keyed digests in the store and in labels; kept through rotations.\n");
        text.push_str(DIGEST_LINE);
        for b in self.digest_key.expose_secret() {
            let _ = write!(text, "{b:02x}");
        }
        text.push('\n');
        // `into_boxed_str` (inside `SecretString::from`) moves the text to an allocation of its
        // exact length and frees this one without zeroing it; copying into an exact box first
        // lets this buffer be zeroed here.
        let exact = SecretString::from(text.as_str());
        zeroize::Zeroize::zeroize(&mut text);
        exact
    }
}

/// Seals `plaintext` to an age X25519 public key, armored.
pub fn seal(to: &str, plaintext: &[u8]) -> Result<String, SealError> {
    let recipient = age::x25519::Recipient::from_str(to.trim())
        .map_err(|why| SealError::Recipient(to.to_owned(), why))?;
    age::encrypt_and_armor(&recipient, plaintext).map_err(|e| SealError::Encrypt(e.to_string()))
}

/// The digest key derived from an identity: HMAC-SHA256 keyed by the identity's secret text,
/// over a fixed context. A derivation, so the key file can be one made by `age-keygen`
/// (docs/decisions.md, "The digest key").
fn derive_digest_key(identity: &age::x25519::Identity) -> SecretBox<[u8; 32]> {
    let secret = identity.to_string();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.expose_secret().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(DIGEST_CONTEXT);
    SecretBox::new(Box::new(mac.finalize().into_bytes().into()))
}

fn unhex(hex: &str) -> Option<SecretBox<[u8; 32]>> {
    if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    let key = SecretBox::new(Box::new(out));
    out.zeroize();
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(text: &SecretString) -> Keyring {
        Keyring::parse(text).unwrap()
    }

    #[test]
    fn what_is_sealed_to_the_node_opens_and_nothing_else_does() {
        let node = ring(&Keyring::generate());
        let sealed = seal(&node.public_key(), b"hunter2").unwrap();
        assert!(sealed.starts_with(ARMOR));
        assert_eq!(node.open(&sealed).unwrap().expose_secret().as_slice(), b"hunter2");
        // Binary, as base64.
        let recipient = age::x25519::Recipient::from_str(&node.public_key()).unwrap();
        let binary = age::encrypt(&recipient, b"binary\0value").unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(&binary);
        assert_eq!(node.open(&b64).unwrap().expose_secret().as_slice(), b"binary\0value");
        // Another node's.
        let other = ring(&Keyring::generate());
        assert!(matches!(other.open(&sealed), Err(OpenError::NotOurs)));
        // Not age at all, and age cut short.
        assert!(matches!(node.open("age1sealed"), Err(OpenError::NotAge)));
        assert!(matches!(node.open("not base64 at all!"), Err(OpenError::NotAge)));
        let cut = base64::engine::general_purpose::STANDARD.encode(&binary[..binary.len() - 5]);
        assert!(node.open(&cut).is_err());
    }

    #[test]
    fn a_rotation_keeps_the_previous_identity_and_the_digest_key_until_retired() {
        let first = ring(&Keyring::generate());
        let old = seal(&first.public_key(), b"old").unwrap();
        let rotated = ring(&first.rotate());
        assert_ne!(rotated.public_key(), first.public_key());
        assert_eq!(rotated.public_keys(), vec![rotated.public_key(), first.public_key()]);
        let new = seal(&rotated.public_key(), b"new").unwrap();
        assert_eq!(rotated.open(&old).unwrap().expose_secret().as_slice(), b"old");
        assert_eq!(rotated.open(&new).unwrap().expose_secret().as_slice(), b"new");
        assert_eq!(rotated.digest(b"x"), first.digest(b"x"), "a rotation moves no keyed digest");
        // Rotating again drops the oldest.
        assert_eq!(ring(&rotated.rotate()).public_keys().len(), 2);

        let retired = ring(&rotated.retire_previous().unwrap());
        assert_eq!(retired.public_keys(), vec![rotated.public_key()]);
        assert!(matches!(retired.open(&old), Err(OpenError::NotOurs)));
        assert!(rotated.opens_with_current(&new) && !rotated.opens_with_current(&old));
        assert_eq!(retired.digest(b"x"), first.digest(b"x"));
        assert_eq!(retired.retire_previous().err(), Some(KeyError::NoPrevious));
    }

    #[test]
    fn the_keyed_digest_is_an_hmac_under_a_key_that_is_not_the_identity() {
        let node = ring(&Keyring::generate());
        let d = node.digest(b"hunter2");
        use sha2::Digest as _;
        let plain: [u8; 32] = sha2::Sha256::digest(b"hunter2").into();
        assert_ne!(d, plain, "not the plain sha256");
        assert_eq!(d, node.digest(b"hunter2"));
        assert_ne!(d, node.digest(b"hunter3"));
        assert_ne!(d, ring(&Keyring::generate()).digest(b"hunter2"), "another node, another key");
    }

    #[test]
    fn a_key_file_from_age_keygen_is_read_and_its_digest_key_derived() {
        let identity = age::x25519::Identity::generate();
        let text = format!(
            "# created: 2026-12-01T00:00:00Z\n# public key: {}\n{}\n",
            identity.to_public(),
            identity.to_string().expose_secret()
        );
        let node = ring(&SecretString::from(text.clone()));
        assert_eq!(node.public_key(), identity.to_public().to_string());
        assert_eq!(node.digest(b"x"), ring(&SecretString::from(text)).digest(b"x"));
    }

    #[test]
    fn a_bad_key_file_is_refused_without_quoting_it() {
        let no_identity = SecretString::from("# only a comment\n\n".to_owned());
        assert_eq!(Keyring::parse(&no_identity).err(), Some(KeyError::Empty));
        let bad = SecretString::from("# x\nAGE-SECRET-KEY-1NOTAKEY\n".to_owned());
        let e = Keyring::parse(&bad).unwrap_err();
        assert_eq!(e, KeyError::NotIdentity(2));
        assert!(!e.to_string().contains("NOTAKEY"));
        let text = Keyring::generate();
        let short: Vec<String> = text
            .expose_secret()
            .lines()
            .map(|l| if l.starts_with(DIGEST_LINE) { format!("{DIGEST_LINE}abc") } else { l.to_owned() })
            .collect();
        let short = SecretString::from(short.join("\n"));
        assert!(matches!(Keyring::parse(&short), Err(KeyError::BadDigestKey(_))));
        assert!(!format!("{:?}", ring(&text)).contains("AGE-SECRET-KEY"), "Debug shows public keys only");
    }

    #[test]
    fn sealing_to_what_is_not_a_public_key_is_refused() {
        assert!(matches!(seal("age1nope", b"x"), Err(SealError::Recipient(..))));
        assert!(matches!(seal("", b"x"), Err(SealError::Recipient(..))));
    }
}
