//! `Digest`: a sha256, held as its 32 bytes and written as `sha256:<64 hex digits>`; or, for
//! what carries a secret, the node's keyed digest (an HMAC-SHA256), written
//! `hmac-sha256:<64 hex digits>`.
//!
//! The two kinds never compare equal, and the text says which one a record holds, so whoever
//! reads the store or a label can tell that a keyed digest cannot be checked against a guess
//! without the node's key (docs/decisions.md, "A keyed digest is spelled `hmac-sha256:<hex>`").
//! The keyed one is made in `secrets`, from the node's identity; this module only holds and
//! spells it.
//!
//! The text form is what records, reports and container labels carry, and it is unchanged from
//! when digests were held as strings. Held as bytes, a digest costs 32 bytes inline rather than a
//! 24-byte string header and an 80-byte allocation; with a digest for each resource and two for
//! each file record, that is about 2 MiB of a daemon's memory at 10,000 resources.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

const PREFIX: &str = "sha256:";
const KEYED: &str = "hmac-sha256:";
const HEX: &[u8; 16] = b"0123456789abcdef";

/// A sha256, or the node's keyed digest (an HMAC-SHA256), held as its 32 bytes; the two never
/// compare equal.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    sum: [u8; 32],
    /// An HMAC-SHA256 under the node's digest key, not a plain sha256.
    keyed: bool,
}

impl Digest {
    /// The digest of some bytes.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest { sum: Sha256::digest(bytes).into(), keyed: false }
    }

    /// A finished sha256.
    pub fn from_sum(sum: [u8; 32]) -> Digest {
        Digest { sum, keyed: false }
    }

    /// A finished HMAC-SHA256 under the node's digest key (`secrets::Keyring::digest`).
    pub fn from_keyed(sum: [u8; 32]) -> Digest {
        Digest { sum, keyed: true }
    }

    /// Whether this is a keyed digest, which only the node's key can reproduce.
    pub fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// Reads the text form, `sha256:` or `hmac-sha256:` and 64 lower-case hex digits; nothing
    /// else is a digest.
    pub fn parse(s: &str) -> Option<Digest> {
        let (hex, keyed) = match s.strip_prefix(KEYED) {
            Some(hex) => (hex, true),
            None => (s.strip_prefix(PREFIX)?, false),
        };
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(Digest { sum: out, keyed })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 64];
        for (i, b) in self.sum.iter().enumerate() {
            text[2 * i] = HEX[(b >> 4) as usize];
            text[2 * i + 1] = HEX[(b & 15) as usize];
        }
        f.write_str(if self.keyed { KEYED } else { PREFIX })?;
        // Only ASCII went in.
        f.write_str(std::str::from_utf8(&text).expect("hex digits are ASCII"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Digest::parse(&s)
            .ok_or_else(|| D::Error::custom(format!("{s:?} is not a sha256: or hmac-sha256: digest")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_is_the_one_records_and_labels_carry() {
        let d = Digest::of(b"test");
        let text = d.to_string();
        assert_eq!(text, "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert_eq!(Digest::parse(&text), Some(d));
        assert_eq!(format!("{d:?}"), text);
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<Digest>(&format!("\"{text}\"")).unwrap(), d);
    }

    #[test]
    fn only_the_exact_text_form_parses() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert!(Digest::parse(hex).is_none(), "the prefix is part of it");
        assert!(Digest::parse(&format!("sha256:{}", hex.to_uppercase())).is_none());
        assert!(Digest::parse(&format!("sha256:{}", &hex[1..])).is_none());
        assert!(Digest::parse(&format!("sha256:{hex}0")).is_none());
        assert!(Digest::parse(&format!("sha256:{}z", &hex[1..])).is_none());
        assert!(serde_json::from_str::<Digest>("\"absent\"").is_err());
    }

    #[test]
    fn a_keyed_digest_says_so_and_never_equals_a_plain_one() {
        let plain = Digest::of(b"test");
        let keyed = Digest::from_keyed(Digest::of(b"test").sum);
        assert_ne!(plain, keyed);
        let text = keyed.to_string();
        assert_eq!(text, "hmac-sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert_eq!(Digest::parse(&text), Some(keyed));
        assert!(Digest::parse(&text).unwrap().is_keyed() && !plain.is_keyed());
    }
}
