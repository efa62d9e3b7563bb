//! Field-level value types. Each one refuses a bad value while it is being deserialised, so the
//! error carries the exact field path that `serde_path_to_error` tracked; only rules that span
//! several fields or several resources are left to `validate`.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The schema of a value declared as a string of a grammar: its pattern, under the type's name.
macro_rules! schema_of_a_pattern {
    ($t:ty, $name:literal, $pattern:expr, $description:literal) => {
        impl JsonSchema for $t {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({"type": "string", "pattern": $pattern, "description": $description})
            }
        }
    };
}

/// Deserialise from a string through the type's `parse`, and serialise back as the declared
/// text.
macro_rules! text_serde {
    ($t:ty) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <Cow<'de, str>>::deserialize(d)?;
                <$t>::parse(&s).map_err(D::Error::custom)
            }
        }

        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

mod container;
mod content;
mod cron;

pub use container::{HostEntry, PortMapping, Transport, Volume, VolumeSource};
pub use content::{Base64Bytes, Sealed, Sha256};
pub use cron::Cron;

/// The pieces the schema's patterns are made of (`mesh-host schema`), each matching what the
/// parsers here accept, so a validator refuses what the agent refuses wherever a regular
/// expression can say it (issue 13). Written for both ECMA-262 and Python `re`, the dialects
/// JSON Schema validators use. The corpus in `tests/it/schema.rs` holds them to the parser.
pub(crate) mod pattern {
    /// An IPv4 address as Rust parses one: four decimal octets, no leading zero.
    pub const IPV4: &str =
        r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}";
    /// An IPv6 address, loosely: hex digits, colons (at least two), and dots for an embedded
    /// IPv4 tail. A malformed one it lets through (`1:::2`) the agent refuses: a listed
    /// disagreement, since the full grammar as one expression would be unreadable.
    pub const IPV6: &str = r"[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*";
    /// A port, 1 to 65535, leading zeros allowed as Rust's integer parse allows them.
    pub const PORT: &str =
        r"0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
    /// One path segment after its `/`: not `.` or `..`, no NUL; `end` lists what else ends it.
    pub fn segment(end: &str) -> String {
        format!(r"/(?!\.\.?(/|{end}$))[^/{end}\x00]+")
    }
}

/// A resource identity: `[a-z0-9][a-z0-9._-]*`. The part before the first `.` is its module.
/// A boxed text, not a `String`: it is in every resource a daemon holds, and a capacity
/// beside the length is 8 bytes of each for nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(Box<str>);

impl Id {
    /// Checks the spec's pattern; the error is a sentence about the value.
    pub fn parse(s: &str) -> Result<Id, String> {
        let mut chars = s.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let rest_ok =
            s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
        if first_ok && rest_ok {
            Ok(Id(s.into()))
        } else {
            Err(format!(
                "{s:?} is not an id: ids are lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"
            ))
        }
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The module a resource belongs to: its id up to the first `.`.
    pub fn module(&self) -> &str {
        self.0.split('.').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Id::parse(&s).map_err(D::Error::custom)
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl JsonSchema for Id {
    fn schema_name() -> Cow<'static, str> {
        "Id".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$"})
    }
}

/// An absolute, normalised path: no `.` or `..` segment, no empty segment, no NUL.
///
/// Normalised rather than resolved: the agent never resolves a declared path against the
/// machine (that would follow symlinks), so what is declared must already be the real path
/// (docs/decisions.md, "Paths are normalised, not resolved").
///
/// Held as the text it was declared as (valid UTF-8, and already normalised, so equal text is an
/// equal path): a report or a record gets it without a lossy conversion. Shared: the store's
/// record of a file or directory holds the same text as its resource (`shared`), one copy for
/// both in a daemon that holds them for months (docs/memory.md).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbsPath(std::sync::Arc<str>);

impl AbsPath {
    /// Reads an absolute path with no `.`, `..` or empty segment (a trailing `/` dropped), or says
    /// why it is not one.
    pub fn parse(s: &str) -> Result<AbsPath, String> {
        if !s.starts_with('/') {
            return Err(format!("{s:?} is a relative path; paths must be absolute"));
        }
        if s.contains('\0') {
            return Err(format!("{s:?} contains a NUL byte"));
        }
        let trimmed = if s.len() > 1 { s.trim_end_matches('/') } else { s };
        for segment in trimmed.split('/').skip(1) {
            match segment {
                ".." => return Err(format!("{s:?} has a '..' segment; write the path it means")),
                "." => return Err(format!("{s:?} has a '.' segment; write the path it means")),
                "" if trimmed != "/" => {
                    return Err(format!("{s:?} has an empty segment ('//'); write the path it means"))
                }
                _ => {}
            }
        }
        Ok(AbsPath(trimmed.into()))
    }

    /// The path, for the filesystem calls.
    pub fn as_path(&self) -> &Path {
        Path::new(&*self.0)
    }

    /// The path as text, for messages and the store.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path's text itself, shared rather than copied: what a record of it holds.
    pub fn shared(&self) -> std::sync::Arc<str> {
        std::sync::Arc::clone(&self.0)
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AbsPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AbsPath::parse(&s).map_err(D::Error::custom)
    }
}

impl Serialize for AbsPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl JsonSchema for AbsPath {
    fn schema_name() -> Cow<'static, str> {
        "AbsolutePath".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let pattern = format!("^/$|^({})+/*$", pattern::segment(""));
        json_schema!({"type": "string", "pattern": pattern, "description": "an absolute path with no '.', '..' or empty segment"})
    }
}

/// Permission bits, declared as an octal string of three or four digits ("0644", "750").
// 16 bits hold the 12 a mode has: `Option<Mode>` in every file and directory is 4 bytes, not 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mode(u16);

impl Mode {
    /// The mode of these permission bits; bits above 0o7777 are dropped.
    pub const fn new(bits: u32) -> Mode {
        Mode((bits & 0o7777) as u16)
    }

    /// Reads three or four octal digits ("0644"), or says why they are not a mode.
    pub fn parse(s: &str) -> Result<Mode, String> {
        let ok = (3..=4).contains(&s.len()) && s.bytes().all(|b| (b'0'..=b'7').contains(&b));
        if !ok {
            return Err(format!("{s:?} is not a mode: write three or four octal digits, such as \"0644\""));
        }
        u16::from_str_radix(s, 8).map(Mode).map_err(|e| e.to_string())
    }

    /// The permission bits, for `chmod`.
    pub fn bits(self) -> u32 {
        u32::from(self.0)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `"mode": 644` is the likeliest mistake (JSON has no octal numbers, so 0644 is not even
        // JSON); the refusal says how to write it rather than only that a string was expected.
        struct ModeText;
        impl serde::de::Visitor<'_> for ModeText {
            type Value = Mode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string of three or four octal digits, such as \"0644\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Mode, E> {
                Mode::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_str(ModeText)
    }
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl JsonSchema for Mode {
    fn schema_name() -> Cow<'static, str> {
        "Mode".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[0-7]{3,4}$"})
    }
}

/// `user` or `user:group`. Whether they exist is the machine's business, checked at apply.
///
/// Kept as the one text it was declared as, behind one pointer: 8 bytes in every file and
/// directory (an `Option` of it too), where a user and an optional group as two strings were
/// 48 bytes in each of them, declared or not, and the text's own box 16 (docs/memory.md). Most
/// files declare none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::redundant_allocation, reason = "a thin pointer: 8 bytes where the box of a str is 16")]
pub struct Owner(Box<Box<str>>);

fn account_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'))
        && !s.starts_with('-')
}

impl Owner {
    /// Reads `user` or `user:group`, or says why it is not an owner.
    pub fn parse(s: &str) -> Result<Owner, String> {
        let (user, group) = match s.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (s, None),
        };
        if !account_name_ok(user) || group.is_some_and(|g| !account_name_ok(g)) {
            return Err(format!(
                "{s:?} is not an owner: write \"user\" or \"user:group\" with account names"
            ));
        }
        Ok(Owner(Box::new(s.into())))
    }

    /// The owning user's name.
    pub fn user(&self) -> &str {
        self.0.split_once(':').map_or(&self.0, |(user, _)| user)
    }

    /// The owning group's name; the user's primary group when absent.
    pub fn group(&self) -> Option<&str> {
        self.0.split_once(':').map(|(_, group)| group)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Owner {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Owner::parse(&s).map_err(D::Error::custom)
    }
}

impl JsonSchema for Owner {
    fn schema_name() -> Cow<'static, str> {
        "Owner".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // `account_name_ok`: up to 32 of letters, digits, `_ - . $`, not starting with `-`.
        let name = r"[A-Za-z0-9_.$][A-Za-z0-9_.$-]{0,31}";
        json_schema!({"type": "string", "pattern": format!("^{name}(:{name})?$")})
    }
}

/// A TCP or UDP port, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Port(u16);

impl Port {
    /// The port's number.
    pub fn get(self) -> u16 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than `i64::deserialize`, so a port given as `"80"` is refused with
        // words a person reads ("expected a port number") and not serde's "expected i64".
        struct PortNumber;
        impl serde::de::Visitor<'_> for PortNumber {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number, 1 to 65535")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Port, E> {
                match u16::try_from(n) {
                    Ok(p) if p > 0 => Ok(Port(p)),
                    _ => Err(E::custom(format!("{n} is not a port: ports are 1 to 65535"))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Port, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!("{n} is not a port: ports are 1 to 65535"))),
                }
            }
        }
        d.deserialize_u64(PortNumber)
    }
}

impl JsonSchema for Port {
    fn schema_name() -> Cow<'static, str> {
        "Port".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": 1, "maximum": 65535})
    }
}

/// An IPv4 or IPv6 network in CIDR notation; a bare address means just that host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address, IPv4 or IPv6.
    pub addr: std::net::IpAddr,
    /// The prefix length: how many leading bits name the network.
    pub prefix: u8,
}

impl Cidr {
    /// Reads an address or a network in CIDR notation, or says why it is not one.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let bad = || format!("{s:?} is not a CIDR such as \"10.0.0.0/8\" or \"fd00::/8\"");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Cidr::parse(&s).map_err(D::Error::custom)
    }
}

impl JsonSchema for Cidr {
    fn schema_name() -> Cow<'static, str> {
        "Cidr".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let v4 = format!(r"{}(/0*(3[0-2]|[12]?[0-9]))?", pattern::IPV4);
        let v6 = format!(r"{}(/0*(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?", pattern::IPV6);
        json_schema!({
            "type": "string",
            "pattern": format!("^({v4}|{v6})$"),
            "description": "an address or network in CIDR notation"
        })
    }
}

/// A command line as an argument vector, never a shell string: at least the program. The
/// vector is private, so an `Argv` is non-empty with a non-empty program by construction (the
/// parse is the only way to make one), and what runs it may rely on that.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Argv(Vec<String>);

impl Argv {
    /// The program and its arguments.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Argv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        if v.first().is_none_or(|p| p.is_empty()) {
            return Err(D::Error::custom("an empty command: give the program and its arguments as a list"));
        }
        Ok(Argv(v))
    }
}

impl JsonSchema for Argv {
    fn schema_name() -> Cow<'static, str> {
        "Argv".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "array",
            "prefixItems": [{"type": "string", "minLength": 1}],
            "items": {"type": "string"},
            "minItems": 1
        })
    }
}

/// A non-empty name (unit, container, network, package, account).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Name(String);

impl Name {
    /// The name as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
            return Err(D::Error::custom(format!(
                "{s:?} is not a name: it must be non-empty, with no whitespace or '/'"
            )));
        }
        Ok(Name(s))
    }
}

impl JsonSchema for Name {
    fn schema_name() -> Cow<'static, str> {
        "Name".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "minLength": 1, "pattern": "^[^\\s/\\x00-\\x1f\\x7f-\\x9f]+$"})
    }
}

/// A container image reference ("nginx:1.27", "registry.example:5000/team/web@sha256:...").
///
/// Not a `Name`: an image reference holds '/' between its registry, namespace and repository.
/// Only its shape is checked here; whether it can be pulled is the runtime's to say, at apply.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Image(String);

impl Image {
    /// The image as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Image {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.starts_with('/') || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(D::Error::custom(format!(
                "{s:?} is not an image reference such as \"nginx:1.27\" or \"registry.example/web:1\""
            )));
        }
        Ok(Image(s))
    }
}

impl JsonSchema for Image {
    fn schema_name() -> Cow<'static, str> {
        "Image".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "minLength": 1, "pattern": "^[^\\s/\\x00-\\x1f\\x7f-\\x9f][^\\s\\x00-\\x1f\\x7f-\\x9f]*$"})
    }
}

/// The name of an environment variable: non-empty, without `=` (which would end the name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvName(Box<str>);

impl EnvName {
    /// Reads an environment variable name (not empty, no `=`), or says why it is not one.
    pub fn parse(s: &str) -> Result<EnvName, String> {
        if s.is_empty() || s.contains('=') {
            // The key is the field's path (`env.PORT=8080`), so the message need not repeat it.
            return Err("is not an environment variable name".to_owned());
        }
        Ok(EnvName(s.into()))
    }

    /// The name as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for EnvName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

text_serde!(EnvName);
schema_of_a_pattern!(EnvName, "EnvName", "^[^=]+$", "an environment variable's name: not empty, no '='");

/// What deserialising a JSON value into `T` gives: the value, or the refusal's message.
#[cfg(test)]
fn from_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, String> {
    serde_json::from_str(json).map_err(|e| {
        let message = e.to_string();
        message.split(" at line ").next().unwrap_or(&message).to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_env_name_is_anything_but_empty_or_holding_an_equals_sign() {
        for ok in ["PORT", "lower_case", "WITH SPACE", "1ST", "É"] {
            assert_eq!(EnvName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in ["", "A=B", "="] {
            assert_eq!(EnvName::parse(bad).unwrap_err(), "is not an environment variable name");
        }
        // As a map's key, in declared order sorted as the text sorts, and written back as is.
        let env: std::collections::BTreeMap<EnvName, String> = from_json(r#"{"B": "2", "A": "1"}"#).unwrap();
        assert_eq!(env.keys().map(EnvName::as_str).collect::<Vec<_>>(), ["A", "B"]);
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(serde_json::to_string(&env).unwrap(), r#"{"A":"1","B":"2"}"#);
        let refused = from_json::<std::collections::BTreeMap<EnvName, String>>(r#"{"A=B": "1"}"#);
        assert_eq!(refused.unwrap_err(), "is not an environment variable name");
    }
}
