//! What a file's content is declared as: a digest, a sealed value, base64 bytes.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::super::Digest;

/// A sha256 the declaration names a thing by (an archive's), as 64 lower-case hex digits with
/// or without the `sha256:` prefix; held as the `Digest` it is, so it is compared, not re-read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sha256(Digest);

impl Sha256 {
    /// Reads 64 hex digits, with or without a `sha256:` prefix, or says why they are not a digest.
    pub fn parse(s: &str) -> Result<Sha256, String> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        Digest::parse(&format!("sha256:{hex}"))
            .map(Sha256)
            .ok_or_else(|| format!("{s:?} is not a sha256 digest (64 lower-case hex digits)"))
    }

    /// The digest, in the form the rest of the host compares.
    pub fn digest(self) -> Digest {
        self.0
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <Cow<'de, str>>::deserialize(d)?;
        Sha256::parse(&s).map_err(D::Error::custom)
    }
}

schema_of_a_pattern!(
    Sha256,
    "Sha256",
    "^(sha256:)?[0-9a-f]{64}$",
    "a sha256 digest: 64 lower-case hex digits, optionally after \"sha256:\""
);

/// A value sealed to the node's key (`sealed`, each value of `secrets`): armored age text, or
/// base64 of a binary age value. Only its shape is checked here, so that a value pasted wrong is
/// refused with the declaration, naming its field; whether it opens is the node's key's to say,
/// at apply. Kept as the text.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed(Box<str>);

/// How armored age text begins and ends.
const ARMOR_BEGIN: &str = "-----BEGIN AGE ENCRYPTED FILE-----";
const ARMOR_END: &str = "-----END AGE ENCRYPTED FILE-----";
/// The base64 of `age-encryption.org`, with which every binary age value begins; 24 characters,
/// so whole groups of base64.
const BINARY_BEGIN: &str = "YWdlLWVuY3J5cHRpb24ub3Jn";

/// The same rule for the JSON Schema: armored, or standard base64 beginning as above.
pub(super) const SEALED_PATTERN: &str = "^(-----BEGIN AGE ENCRYPTED FILE-----[\\s\\S]*-----END AGE ENCRYPTED FILE-----[ \\t\\r\\n]*|YWdlLWVuY3J5cHRpb24ub3Jn([A-Za-z0-9+/]{4})*([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?)$";

impl Sealed {
    /// Reads an age ciphertext, armored or as base64 of binary, or says why it is not one; it is
    /// never opened here, and the refusal never quotes the value (docs/decisions.md, "A value's
    /// shape is checked at parse, its opening at apply").
    pub fn parse(s: &str) -> Result<Sealed, String> {
        use base64::Engine as _;
        let body = s.trim_end_matches([' ', '\t', '\r', '\n']);
        let armored = s.starts_with(ARMOR_BEGIN)
            && body.ends_with(ARMOR_END)
            && body.len() >= ARMOR_BEGIN.len() + ARMOR_END.len();
        let binary =
            s.starts_with(BINARY_BEGIN) && base64::engine::general_purpose::STANDARD.decode(s).is_ok();
        if armored || binary {
            Ok(Sealed(s.into()))
        } else {
            Err(format!(
                "is not a sealed value: armored age text (`{ARMOR_BEGIN}` ... `{ARMOR_END}`), or base64 of a binary age value, as `mesh-host seal` or `age -r` make"
            ))
        }
    }

    /// The ciphertext as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A ciphertext is not a secret, but it is long and says nothing to a reader.
        write!(f, "Sealed({} bytes)", self.0.len())
    }
}

impl<'de> Deserialize<'de> for Sealed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Sealed::parse(&s).map_err(D::Error::custom)
    }
}

impl JsonSchema for Sealed {
    fn schema_name() -> Cow<'static, str> {
        "Sealed".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": SEALED_PATTERN})
    }
}

/// Bytes declared as base64 text (standard alphabet, padded): `bytes` of a file or an archive.
/// Decoded once, when the declaration is parsed, and held as the bytes (three quarters of the
/// text); text that is not base64 refuses the declaration, naming the field.
#[derive(Clone, PartialEq, Eq)]
pub struct Base64Bytes(Box<[u8]>);

impl Base64Bytes {
    /// The decoded bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// How many bytes, decoded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Base64Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Base64Bytes({} bytes)", self.0.len())
    }
}

impl<'de> Deserialize<'de> for Base64Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(&text)
            .map(|bytes| Base64Bytes(bytes.into_boxed_slice()))
            .map_err(|_| D::Error::custom("is not standard base64"))
    }
}

impl JsonSchema for Base64Bytes {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        "Base64".into()
    }
    // The alphabet's pattern is added where the field is (`schema::within`).
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string"})
    }
}

#[cfg(test)]
mod tests {
    use super::super::from_json;
    use super::*;

    #[test]
    fn a_sha256_is_64_lower_case_hex_digits_with_or_without_its_prefix() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let want = Digest::of(b"test");
        assert_eq!(Sha256::parse(hex).unwrap().digest(), want);
        assert_eq!(Sha256::parse(&format!("sha256:{hex}")).unwrap().digest(), want);
        for bad in [
            String::new(),
            "sha256:".to_owned(),
            hex.to_uppercase(),
            hex[1..].to_owned(),
            format!("{hex}0"),
            format!("sha256:zz{}", &hex[2..]),
            format!("sha512:{hex}"),
            format!("sha256:sha256:{hex}"),
        ] {
            assert_eq!(
                Sha256::parse(&bad).unwrap_err(),
                format!("{bad:?} is not a sha256 digest (64 lower-case hex digits)")
            );
        }
        assert_eq!(from_json::<Sha256>(&format!("\"{hex}\"")).unwrap().digest(), want);
    }

    #[test]
    fn a_sealed_value_is_armored_age_or_base64_of_binary_age() {
        use base64::Engine as _;
        let armored = format!("{ARMOR_BEGIN}\nYWdl\n{ARMOR_END}\n");
        let binary =
            base64::engine::general_purpose::STANDARD.encode(b"age-encryption.org/v1\n-> X25519 x\n");
        for ok in [armored.as_str(), armored.trim_end(), binary.as_str()] {
            assert_eq!(Sealed::parse(ok).unwrap().as_str(), ok);
        }
        let wrapped = format!("{}\n{}", &binary[..24], &binary[24..]);
        let other = base64::engine::general_purpose::STANDARD.encode(b"not age at all");
        let overlapping = format!("{ARMOR_BEGIN}END AGE ENCRYPTED FILE-----");
        for bad in [
            "",
            "age1sealed",
            "hunter2",
            &other,
            &binary[..binary.len() - 1],
            &wrapped,
            &overlapping,
            &armored[1..],
        ] {
            assert!(Sealed::parse(bad).unwrap_err().starts_with("is not a sealed value"), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", Sealed::parse(&binary).unwrap()),
            format!("Sealed({} bytes)", binary.len())
        );
    }

    #[test]
    fn base64_bytes_are_decoded_at_parse_and_refused_when_they_are_not_base64() {
        #[derive(Deserialize)]
        struct Carries {
            bytes: Option<Base64Bytes>,
        }
        let bytes = |json: &str| from_json::<Carries>(json).map(|c| c.bytes.map(|b| b.as_slice().to_vec()));
        assert_eq!(bytes(r#"{"bytes": "UE9SVD04MDgwCg=="}"#), Ok(Some(b"PORT=8080\n".to_vec())));
        assert_eq!(bytes(r#"{"bytes": ""}"#), Ok(Some(Vec::new())));
        assert_eq!(bytes("{}"), Ok(None));
        assert_eq!(bytes(r#"{"bytes": null}"#), Ok(None));
        for bad in ["not base64!", "UE9SVD04MDgwCg", "UE9SVD04MDgwCg=", "-_-_"] {
            assert_eq!(
                bytes(&format!(r#"{{"bytes": "{bad}"}}"#)),
                Err("is not standard base64".to_owned()),
                "{bad}"
            );
        }
        let b: Base64Bytes = serde_json::from_str(r#""AAEC""#).unwrap();
        assert_eq!(format!("{b:?}"), "Base64Bytes(3 bytes)", "the bytes are never printed");
    }
}
