//! `Digest`: a sha256, held as its 32 bytes and written as `sha256:<64 hex digits>`.
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
const HEX: &[u8; 16] = b"0123456789abcdef";

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of some bytes.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// A finished sha256.
    pub fn from_sum(sum: [u8; 32]) -> Digest {
        Digest(sum)
    }

    /// Reads the text form, `sha256:` and 64 lower-case hex digits; nothing else is a digest.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix(PREFIX)?.as_bytes();
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
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 71];
        text[..7].copy_from_slice(PREFIX.as_bytes());
        for (i, b) in self.0.iter().enumerate() {
            text[7 + 2 * i] = HEX[(b >> 4) as usize];
            text[8 + 2 * i] = HEX[(b & 15) as usize];
        }
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
        Digest::parse(&s).ok_or_else(|| D::Error::custom(format!("{s:?} is not a sha256: digest")))
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
}
