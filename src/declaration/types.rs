//! Field-level value types. Each one refuses a bad value while it is being deserialised, so the
//! error carries the exact field path that `serde_path_to_error` tracked; only rules that span
//! several fields or several resources are left to `validate`.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Digest;

/// The pieces the schema's patterns are made of (`mesh-host schema`), each matching what the
/// parser below accepts, so a validator refuses what the agent refuses wherever a regular
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

/// A 5-field cron expression (minute hour day-of-month month day-of-week), evaluated in UTC,
/// compiled while it is read: each field becomes the set of values it allows, as bits, so
/// `crate::cron` walks bits and never reads the text again. What the fields mean is Vixie
/// cron's (see `crate::cron`).
///
/// Kept with the text it was declared as: a step's spec digest and its record are of it, so
/// `@daily` and `0 0 * * *` are two declarations (docs/decisions.md, "The schema").
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cron {
    text: Box<str>,
    /// Bit m: fires at minute m (0-59).
    minutes: u64,
    /// Bit h: fires in hour h (0-23).
    hours: u32,
    /// Bit d: fires on day d of the month (1-31).
    days: u32,
    /// Bit m: fires in month m (1-12).
    months: u16,
    /// Bit w: fires on weekday w (0-6, Sunday 0; a declared 7 is Sunday too).
    weekdays: u8,
    /// Both the day and the weekday are restricted (neither starts with `*`): a day matching
    /// either fires. Otherwise a day must match both.
    either_day: bool,
}

/// The nicknames crontabs accept for whole expressions, as Vixie cron defines them.
const NICKNAMES: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Month names, from January (1), and weekday names, from Sunday (0), as crontabs write them.
const MONTHS: [&str; 12] =
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Cron {
    /// Compiles a 5-field cron expression (minute hour day month weekday, UTC), or says why it is
    /// not one.
    pub fn parse(s: &str) -> Result<Cron, String> {
        let nickname = s.trim();
        let expanded = if nickname.starts_with('@') {
            match NICKNAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(nickname)) {
                Some((_, fields)) => *fields,
                // `@reboot` has no time to compute: a scheduler would run it at every start of
                // the agent, and what it means is a run-once step (docs/decisions.md, "The
                // schema").
                None if nickname.eq_ignore_ascii_case("@reboot") => {
                    return Err(format!("{s:?} has no time of day; for a step run once, declare `run-once` instead"))
                }
                None => {
                    return Err(format!(
                        "{s:?} is not a cron nickname: write @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or five fields"
                    ))
                }
            }
        } else {
            s
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minutes, hours, days, months, weekdays] = fields.as_slice() else {
            return Err(format!("{s:?} is not a 5-field cron expression (minute hour day month weekday)"));
        };
        let set = |field: &str, lo: u32, hi: u32, names: &[&str], first: u32| {
            field_bits(field, lo, hi, names, first)
                .map_err(|part| format!("{s:?}: {part:?} is not a cron field between {lo} and {hi}"))
        };
        let (minutes_bits, hours_bits, days_bits, months_bits, weekday_bits) = (
            set(minutes, 0, 59, &[], 0)?,
            set(hours, 0, 23, &[], 0)?,
            set(days, 1, 31, &[], 0)?,
            set(months, 1, 12, &MONTHS, 1)?,
            set(weekdays, 0, 7, &WEEKDAYS, 0)?,
        );
        // Bit 7 (Sunday written as 7) folds onto bit 0; the casts keep only bits the field's
        // range allows.
        let weekdays_bits = (weekday_bits | weekday_bits >> 7) & 0x7f;
        Ok(Cron {
            text: s.into(),
            minutes: minutes_bits,
            hours: hours_bits as u32,
            days: days_bits as u32,
            months: months_bits as u16,
            weekdays: weekdays_bits as u8,
            either_day: !days.starts_with('*') && !weekdays.starts_with('*'),
        })
    }

    /// The expression as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The minutes of an hour it fires at: bit m for minute m.
    pub fn minutes(&self) -> u64 {
        self.minutes
    }

    /// The hours of a day it fires in: bit h for hour h.
    pub fn hours(&self) -> u32 {
        self.hours
    }

    /// Whether it fires on a day: its month (1-12), its day of the month (1-31) and its
    /// weekday (0-6, Sunday 0).
    pub fn fires_on(&self, month: u32, day: u32, weekday: u32) -> bool {
        let bit = |set: u32, at: u32| at < 32 && set & (1 << at) != 0;
        if !bit(u32::from(self.months), month) {
            return false;
        }
        let (day_ok, weekday_ok) = (bit(self.days, day), bit(u32::from(self.weekdays), weekday));
        if self.either_day {
            day_ok || weekday_ok
        } else {
            day_ok && weekday_ok
        }
    }
}

/// The values one field allows, as bits (bit v for value v); the part that is not a field
/// between `lo` and `hi` when one is not. A part is `*`, `a`, `a-b`, each optionally `/step`,
/// and `a/step` runs from `a` to `hi`. A value may also be one of `names` (any case), the first
/// of which is `first`: `jan` for a month, `mon-fri` for weekdays.
fn field_bits<'a>(field: &'a str, lo: u32, hi: u32, names: &[&str], first: u32) -> Result<u64, &'a str> {
    let mut bits = 0u64;
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => (range, step.parse::<u32>().ok().filter(|n| *n > 0).ok_or(part)?),
            None => (part, 1),
        };
        let value = |v: &str| {
            let named = names.iter().position(|n| n.eq_ignore_ascii_case(v)).map(|i| i as u32 + first);
            named.or_else(|| v.parse::<u32>().ok()).filter(|n| (lo..=hi).contains(n)).ok_or(part)
        };
        let (from, to) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(part);
            }
            (a, b)
        } else {
            let a = value(range)?;
            // `a/n` runs from a to the end of the field; a plain `a` is a itself.
            (a, if part.contains('/') { hi } else { a })
        };
        // Stepped as an iterator: a step as large as u32 allows must not overflow the count.
        for v in (from..=to).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    Ok(bits)
}

impl Serialize for Cron {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Cron {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Cron::parse(&s).map_err(D::Error::custom)
    }
}

impl JsonSchema for Cron {
    fn schema_name() -> Cow<'static, str> {
        "Cron".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // Each field is `field_bits`' grammar over its own range; a range written backwards
        // (`5-1`) is the one thing the pattern cannot see.
        let field = |value: &str| {
            let part = format!(r"(\*|{value}(-{value})?)(/0*[1-9][0-9]*)?");
            format!("{part}(,{part})*")
        };
        // JSON Schema's patterns have no flag for case: each letter of a name is a class.
        let any_case = |name: &str| -> String {
            name.chars().map(|c| format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())).collect()
        };
        let named = |numbers: &str, names: &[&str]| {
            let names: Vec<String> = names.iter().map(|n| any_case(n)).collect();
            format!("({numbers}|{})", names.join("|"))
        };
        let fields = [
            field("0*[1-5]?[0-9]"),
            field("0*(1?[0-9]|2[0-3])"),
            field("0*([1-9]|[12][0-9]|3[01])"),
            field(&named("0*([1-9]|1[0-2])", &MONTHS)),
            field(&named("0*[0-7]", &WEEKDAYS)),
        ];
        let nicknames: Vec<String> = NICKNAMES.iter().map(|(n, _)| any_case(n)).collect();
        json_schema!({
            "type": "string",
            "pattern": format!(r"^\s*({}|{})\s*$", fields.join(r"\s+"), nicknames.join("|")),
            "description": "5-field cron expression (month and weekday names allowed), or @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly; UTC"
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

/// The transport of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP, the default.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Transport {
    /// The transport as the runtime spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Sctp => "sctp",
        }
    }
}

/// A container's published port, as `docker run --publish` takes it:
/// `[ip:][host port:]container port[/tcp|udp|sctp]`, the ip IPv6 in brackets. A host ip with
/// an empty host port (`127.0.0.1::80`) lets the runtime pick the port.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of: the
/// same mapping written another way is another declaration, as it always was.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortMapping {
    text: Box<str>,
    host_ip: Option<std::net::IpAddr>,
    host_port: Option<u16>,
    container_port: u16,
    /// How many consecutive ports, from those above: 1, or the length of a range
    /// (`8000-8010:8000-8010` is 11).
    count: u16,
    transport: Transport,
}

/// The longest port range one mapping may publish. Each published port is a listener (and,
/// with Docker's userland proxy, a process) on the machine: a typo such as `1-65535` should be
/// refused, not take the runtime minutes to create (docs/decisions.md, "The schema").
pub const PORT_RANGE_LIMIT: u16 = 1000;

impl PortMapping {
    /// Reads `[ip:][host:]container[/tcp|udp|sctp]` (an IPv6 address in brackets), or says why it
    /// is not a port mapping.
    pub fn parse(s: &str) -> Result<PortMapping, String> {
        let bad = || format!("{s:?} is not a port mapping such as \"8080:80\" or \"127.0.0.1:8080:80/tcp\"");
        let (ports, transport) = match s.rsplit_once('/') {
            Some((ports, "tcp")) => (ports, Transport::Tcp),
            Some((ports, "udp")) => (ports, Transport::Udp),
            Some((ports, "sctp")) => (ports, Transport::Sctp),
            Some(_) => return Err(bad()),
            None => (s, Transport::Tcp),
        };
        let one = |p: &str| p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(bad);
        // A port, or a range `a-b` (a <= b): its first port and how many.
        let port = |p: &str| -> Result<(u16, u16), String> {
            match p.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (one(a)?, one(b)?);
                    if a > b {
                        return Err(bad());
                    }
                    let count = b - a + 1;
                    if count > PORT_RANGE_LIMIT {
                        return Err(format!(
                            "{s:?} publishes {count} ports; a mapping publishes at most {PORT_RANGE_LIMIT}"
                        ));
                    }
                    Ok((a, count))
                }
                None => Ok((one(p)?, 1)),
            }
        };
        // The host address may be IPv6 in brackets, which itself holds colons.
        let (v6, rest) = match ports.strip_prefix('[') {
            Some(r) => {
                let (a, rest) = r.split_once("]:").ok_or_else(bad)?;
                let a: std::net::Ipv6Addr = a.parse().map_err(|_| bad())?;
                (Some(a), rest)
            }
            None => (None, ports),
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let (host_ip, host, (container_port, count)) = match (v6, parts.as_slice()) {
            (Some(a), [h, c]) => (Some(a.into()), Some(port(h)?), port(c)?),
            (None, [c]) => (None, None, port(c)?),
            (None, [h, c]) => (None, Some(port(h)?), port(c)?),
            (None, [ip, h, c]) => {
                let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| bad())?;
                let h = if h.is_empty() { None } else { Some(port(h)?) };
                (Some(ip.into()), h, port(c)?)
            }
            _ => return Err(bad()),
        };
        // Port for port: Docker's other reading of `8000-8010:80` (any one host port of the
        // range) publishes a port nobody can name in advance, so it is refused here
        // (docs/decisions.md, "The schema").
        if let Some((_, host_count)) = host {
            if host_count != count {
                return Err(format!(
                    "{s:?} maps {host_count} host ports to {count} container ports; give ranges of the same length"
                ));
            }
        }
        let host_port = host.map(|(first, _)| first);
        Ok(PortMapping { text: s.into(), host_ip, host_port, container_port, count, transport })
    }

    /// Each port it publishes, in order: (the port on the machine, `None` for one the runtime
    /// picks; the container's port). One pair for a single port, one per port of a range.
    pub fn publishes(&self) -> impl Iterator<Item = (Option<u16>, u16)> + '_ {
        (0..self.count).map(|i| (self.host_port.map(|h| h + i), self.container_port + i))
    }

    /// The mapping as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The address on the machine it is published on; `None` is every address.
    pub fn host_ip(&self) -> Option<std::net::IpAddr> {
        self.host_ip
    }

    /// The port on the machine (the first of a range); `None` lets the runtime pick one.
    pub fn host_port(&self) -> Option<u16> {
        self.host_port
    }

    /// The port inside the container.
    pub fn container_port(&self) -> u16 {
        self.container_port
    }

    /// The transport it is published for.
    pub fn transport(&self) -> Transport {
        self.transport
    }
}

text_serde!(PortMapping);
schema_of_a_pattern!(
    PortMapping,
    "PortMapping",
    {
        // A port or a range of them; that two ranges are the same length, and that a range is
        // neither backwards nor longer than `PORT_RANGE_LIMIT`, the parser alone checks.
        let port = &format!("{p}(-{p})?", p = pattern::PORT);
        let (v4, v6) = (pattern::IPV4, pattern::IPV6);
        format!(r"^({port}|{port}:{port}|{v4}:({port})?:{port}|\[{v6}\]:{port}:{port})(/(tcp|udp|sctp))?$")
    },
    "a published port or range: \"80\", \"8080:80\", \"8000-8010:8000-8010\", \"127.0.0.1:8080:80\", \"[::1]:8080:80\", each optionally /tcp, /udp or /sctp"
);

/// What a volume mounts: a path on the machine (bind-mounted) or a volume of the runtime's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VolumeSource {
    /// A path on the machine, bind-mounted.
    Path(AbsPath),
    /// A volume of the runtime's, by its name.
    Named(Box<str>),
}

impl fmt::Display for VolumeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeSource::Path(p) => f.write_str(p.as_str()),
            VolumeSource::Named(n) => f.write_str(n),
        }
    }
}

/// A container's volume, as `docker run --volume` takes it: `source:target[:options]`, the
/// source an absolute path on the machine or the name of a volume (no '/'), the target an
/// absolute path in the container.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Volume {
    text: Box<str>,
    source: VolumeSource,
    target: Box<str>,
    options: Option<Box<str>>,
}

impl Volume {
    /// Reads `source:target[:options]`, or says why it is not a volume.
    pub fn parse(s: &str) -> Result<Volume, String> {
        let bad = || format!("{s:?} is not a volume such as \"/srv/data:/data\" or \"name:/data:ro\"");
        let (source, target, options) = match s.split(':').collect::<Vec<&str>>().as_slice() {
            [source, target] => (*source, *target, None),
            [source, target, options] => (*source, *target, Some(*options)),
            _ => return Err(bad()),
        };
        if source.is_empty() || !target.starts_with('/') {
            return Err(bad());
        }
        // A source with a '/' is a path, and then it must be one the host would name so; one
        // without is a volume's name.
        let source = if source.contains('/') {
            VolumeSource::Path(AbsPath::parse(source).map_err(|_| bad())?)
        } else {
            VolumeSource::Named(source.into())
        };
        Ok(Volume { text: s.into(), source, target: target.into(), options: options.map(Into::into) })
    }

    /// The volume as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// What it mounts.
    pub fn source(&self) -> &VolumeSource {
        &self.source
    }

    /// The path on the machine it bind-mounts; `None` for a named volume.
    pub fn host_path(&self) -> Option<&AbsPath> {
        match &self.source {
            VolumeSource::Path(p) => Some(p),
            VolumeSource::Named(_) => None,
        }
    }

    /// Where it is mounted inside the container.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What follows the target (`ro`, `z`...), for the runtime to read.
    pub fn options(&self) -> Option<&str> {
        self.options.as_deref()
    }
}

text_serde!(Volume);
schema_of_a_pattern!(
    Volume,
    "Volume",
    format!(r"^([^:/]+|/|({})+/*):/[^:]*(:[^:]*)?$", pattern::segment(":")),
    "SOURCE:TARGET[:OPTIONS]: SOURCE a volume's name or an absolute path, TARGET absolute"
);

/// An entry of a container's own hosts file: `name:ip`, the ip IPv4 or IPv6 (`db6:fd00::5`),
/// or `host-gateway`, which the runtime (Docker 20.10 and later) resolves to the machine's
/// address on the container's bridge, as `docker run --add-host name:host-gateway` does.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of, and
/// what the runtime is given (it is the runtime's own form).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostEntry {
    text: Box<str>,
    /// `None` for `host-gateway`.
    ip: Option<std::net::IpAddr>,
}

/// The word that stands for the machine's address as the container sees it.
pub const HOST_GATEWAY: &str = "host-gateway";

impl HostEntry {
    /// Reads "name:ip", or says why it is not a host entry.
    pub fn parse(s: &str) -> Result<HostEntry, String> {
        match s.split_once(':') {
            Some((name, HOST_GATEWAY)) if !name.is_empty() => Ok(HostEntry { text: s.into(), ip: None }),
            Some((name, ip)) if !name.is_empty() => match ip.parse() {
                Ok(ip) => Ok(HostEntry { text: s.into(), ip: Some(ip) }),
                Err(_) => Err(format!("{s:?} is not \"name:ip\" or \"name:host-gateway\"")),
            },
            _ => Err(format!("{s:?} is not \"name:ip\" or \"name:host-gateway\"")),
        }
    }

    /// The entry as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The host name it adds.
    pub fn name(&self) -> &str {
        self.text.split_once(':').map_or("", |(name, _)| name)
    }

    /// The address; `None` for `host-gateway`, which the runtime resolves.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.ip
    }
}

text_serde!(HostEntry);
schema_of_a_pattern!(
    HostEntry,
    "HostEntry",
    format!(r"^[^:]+:({}|{}|{HOST_GATEWAY})$", pattern::IPV4, pattern::IPV6),
    "NAME:IP or NAME:host-gateway, an entry of the container's /etc/hosts"
);

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
    use super::*;

    /// What deserialising a JSON value into `T` gives: the value, or the refusal's message.
    fn from_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, String> {
        serde_json::from_str(json).map_err(|e| {
            let message = e.to_string();
            message.split(" at line ").next().unwrap_or(&message).to_owned()
        })
    }

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

    #[test]
    fn a_port_mapping_reads_as_docker_run_publish_does() {
        let p = |s: &str| {
            let m = PortMapping::parse(s).unwrap();
            assert_eq!(m.as_str(), s, "the declared text is kept");
            (m.host_ip().map(|ip| ip.to_string()), m.host_port(), m.container_port(), m.transport().as_str())
        };
        assert_eq!(p("80"), (None, None, 80, "tcp"));
        assert_eq!(p("8080:80"), (None, Some(8080), 80, "tcp"));
        assert_eq!(p("127.0.0.1:8080:80/udp"), (Some("127.0.0.1".into()), Some(8080), 80, "udp"));
        assert_eq!(p("127.0.0.1::80"), (Some("127.0.0.1".into()), None, 80, "tcp"));
        assert_eq!(p("[::1]:8080:80"), (Some("::1".into()), Some(8080), 80, "tcp"));
        assert_eq!(p("[fd00::5]:53:53/sctp"), (Some("fd00::5".into()), Some(53), 53, "sctp"));
        // Ranges, as Docker takes them: port for port.
        let all = |s: &str| PortMapping::parse(s).unwrap().publishes().collect::<Vec<_>>();
        assert_eq!(all("8080:80"), [(Some(8080), 80)]);
        assert_eq!(all("8000-8002:9000-9002"), [(Some(8000), 9000), (Some(8001), 9001), (Some(8002), 9002)]);
        assert_eq!(all("127.0.0.1:8000-8001:8000-8001/udp"), [(Some(8000), 8000), (Some(8001), 8001)]);
        assert_eq!(all("5000-5001"), [(None, 5000), (None, 5001)]);
        assert_eq!(all("127.0.0.1::5000-5001"), [(None, 5000), (None, 5001)]);
        assert_eq!(all("65535-65535"), [(None, 65535)]);
        assert_eq!(
            PortMapping::parse("8000-8010:80").unwrap_err(),
            r#""8000-8010:80" maps 11 host ports to 1 container ports; give ranges of the same length"#
        );
        assert_eq!(
            PortMapping::parse("1-65535").unwrap_err(),
            r#""1-65535" publishes 65535 ports; a mapping publishes at most 1000"#
        );
    }

    #[test]
    fn a_port_mapping_out_of_its_grammar_is_refused_by_its_text() {
        for bad in [
            "",
            "http",
            "8080:http",
            "0",
            "8080:0",
            "65536",
            "80/icmp",
            "80/",
            "1:2:3:4",
            "localhost:8080:80",
            "::1:8080:80",
            "[::1]::80",
            "[::1]:80",
            "[127.0.0.1]:8080:80",
            "[::1:8080:80",
            "10.0.0.1:80",
            "8010-8000",
            "8000-:80",
            "-8000",
            "0-5",
        ] {
            assert_eq!(
                PortMapping::parse(bad).unwrap_err(),
                format!("{bad:?} is not a port mapping such as \"8080:80\" or \"127.0.0.1:8080:80/tcp\""),
            );
        }
        assert_eq!(from_json::<PortMapping>("\"8080:80\"").unwrap().to_string(), "8080:80");
        assert_eq!(
            from_json::<PortMapping>("\"80/icmp\"").unwrap_err(),
            r#""80/icmp" is not a port mapping such as "8080:80" or "127.0.0.1:8080:80/tcp""#
        );
    }

    #[test]
    fn a_volume_is_a_path_or_a_name_then_a_target() {
        let v = Volume::parse("/srv/web:/srv/web:ro").unwrap();
        assert_eq!(v.host_path().map(AbsPath::as_str), Some("/srv/web"));
        assert_eq!((v.target(), v.options(), v.as_str()), ("/srv/web", Some("ro"), "/srv/web:/srv/web:ro"));
        let v = Volume::parse("web-data:/data").unwrap();
        assert_eq!(v.source(), &VolumeSource::Named("web-data".into()));
        assert_eq!((v.host_path(), v.target(), v.options()), (None, "/data", None));
        // The source path is normalised as every declared path is; the text is kept.
        let v = Volume::parse("/srv/web/:/data").unwrap();
        assert_eq!(v.source().to_string(), "/srv/web");
        assert_eq!(v.to_string(), "/srv/web/:/data");
    }

    #[test]
    fn a_volume_out_of_its_grammar_is_refused_by_its_text() {
        for bad in [
            "",
            "/srv/web",
            "/srv/web:data",
            ":/data",
            "srv/web:/data",
            "/srv/../web:/data",
            "/srv//web:/data",
            "a:/b:ro:extra",
        ] {
            assert_eq!(
                Volume::parse(bad).unwrap_err(),
                format!("{bad:?} is not a volume such as \"/srv/data:/data\" or \"name:/data:ro\""),
            );
        }
        assert_eq!(
            from_json::<Volume>("\"/srv/web:data\"").unwrap_err(),
            r#""/srv/web:data" is not a volume such as "/srv/data:/data" or "name:/data:ro""#
        );
    }

    #[test]
    fn a_host_entry_is_a_name_and_an_address() {
        let h = HostEntry::parse("db:10.0.0.5").unwrap();
        assert_eq!((h.name(), h.ip(), h.as_str()), ("db", Some("10.0.0.5".parse().unwrap()), "db:10.0.0.5"));
        let h = HostEntry::parse("db6:fd00::5").unwrap();
        assert_eq!((h.name(), h.ip()), ("db6", Some("fd00::5".parse().unwrap())));
        let h = HostEntry::parse("host.docker.internal:host-gateway").unwrap();
        assert_eq!(
            (h.name(), h.ip(), h.as_str()),
            ("host.docker.internal", None, "host.docker.internal:host-gateway")
        );
        for bad in
            ["cache", ":10.0.0.5", "db:", "db:not-an-ip", "db:10.0.0.256", "db:Host-Gateway", ":host-gateway"]
        {
            assert_eq!(
                HostEntry::parse(bad).unwrap_err(),
                format!("{bad:?} is not \"name:ip\" or \"name:host-gateway\"")
            );
        }
        assert_eq!(
            from_json::<HostEntry>("\"cache\"").unwrap_err(),
            r#""cache" is not "name:ip" or "name:host-gateway""#
        );
    }

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
    fn a_cron_expression_takes_the_nicknames_and_names_crontabs_take() {
        let same = |a: &str, b: &str| {
            let (a, b) = (Cron::parse(a).unwrap(), Cron::parse(b).unwrap());
            assert_eq!(
                (a.minutes(), a.hours(), a.days, a.months, a.weekdays, a.either_day),
                (b.minutes(), b.hours(), b.days, b.months, b.weekdays, b.either_day),
                "{} and {}",
                a.as_str(),
                b.as_str()
            );
        };
        same("@yearly", "0 0 1 1 *");
        same("@annually", "0 0 1 1 *");
        same("@monthly", "0 0 1 * *");
        same("@weekly", "0 0 * * 0");
        same("@daily", "0 0 * * *");
        same(" @MIDNIGHT ", "0 0 * * *");
        same("@hourly", "0 * * * *");
        same("30 6 * jan,JUL mon-fri", "30 6 * 1,7 1-5");
        same("0 0 * * sat/2", "0 0 * * 6/2");
        same("0 0 1 dec *", "0 0 1 12 *");
        // The declared text is kept as written: the step's record and spec are of it.
        assert_eq!(Cron::parse("@daily").unwrap().as_str(), "@daily");
        let e = Cron::parse("@reboot").unwrap_err();
        assert!(e.contains("run-once"), "{e}");
        let e = Cron::parse("@fortnightly").unwrap_err();
        assert!(e.contains("is not a cron nickname"), "{e}");
        for bad in ["0 0 * * monday", "0 0 * jan-xyz *", "0 0 mon * *", "0 0 * * 1 @daily"] {
            assert!(Cron::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cron_expression_is_compiled_into_the_sets_it_allows() {
        let c = Cron::parse("15,45 8-10/2 * * *").unwrap();
        assert_eq!(c.minutes(), 1 << 15 | 1 << 45);
        assert_eq!(c.hours(), 1 << 8 | 1 << 10);
        assert_eq!(c.as_str(), "15,45 8-10/2 * * *");
        assert_eq!(Cron::parse("50/5 * * * *").unwrap().minutes(), 1 << 50 | 1 << 55);
        assert_eq!(Cron::parse("*/20 * * * *").unwrap().minutes(), 1 | 1 << 20 | 1 << 40);
        // A step as large as u32 allows takes the first value only, and does not overflow.
        assert_eq!(Cron::parse("5/4294967295 * * * *").unwrap().minutes(), 1 << 5);
        // Sunday is 0 or 7.
        let (monday, sunday) = ((12, 14, 1), (12, 13, 0));
        let on = |c: &Cron, (month, day, weekday): (u32, u32, u32)| c.fires_on(month, day, weekday);
        assert!(on(&Cron::parse("0 9 * * 7").unwrap(), sunday));
        assert!(!on(&Cron::parse("0 9 * * 7").unwrap(), monday));
        // A day must match both, unless both are restricted: then either.
        assert!(!on(&Cron::parse("0 0 15 * *").unwrap(), monday));
        assert!(on(&Cron::parse("0 0 15 * 1").unwrap(), monday));
        assert!(!on(&Cron::parse("0 0 */2 * 1").unwrap(), monday), "a day field starting with * is a star");
        assert!(!on(&Cron::parse("0 0 * 1-11 *").unwrap(), monday), "December is not in 1-11");
    }

    #[test]
    fn a_cron_expression_out_of_its_grammar_is_refused_naming_the_part() {
        let refused = |s: &str| Cron::parse(s).unwrap_err();
        assert_eq!(
            refused("0 0 3 * * *"),
            r#""0 0 3 * * *" is not a 5-field cron expression (minute hour day month weekday)"#
        );
        assert_eq!(refused(""), r#""" is not a 5-field cron expression (minute hour day month weekday)"#);
        assert_eq!(refused("61 3 * * *"), r#""61 3 * * *": "61" is not a cron field between 0 and 59"#);
        assert_eq!(refused("0 24 * * *"), r#""0 24 * * *": "24" is not a cron field between 0 and 23"#);
        assert_eq!(refused("0 0 0 * *"), r#""0 0 0 * *": "0" is not a cron field between 1 and 31"#);
        assert_eq!(refused("0 0 * 13 *"), r#""0 0 * 13 *": "13" is not a cron field between 1 and 12"#);
        assert_eq!(refused("0 0 * * 8"), r#""0 0 * * 8": "8" is not a cron field between 0 and 7"#);
        assert_eq!(refused("5-1 * * * *"), r#""5-1 * * * *": "5-1" is not a cron field between 0 and 59"#);
        assert_eq!(refused("*/0 * * * *"), r#""*/0 * * * *": "*/0" is not a cron field between 0 and 59"#);
        assert_eq!(refused("1,,2 * * * *"), r#""1,,2 * * * *": "" is not a cron field between 0 and 59"#);
        assert_eq!(refused("* * * janu *"), r#""* * * janu *": "janu" is not a cron field between 1 and 12"#);
        assert_eq!(
            from_json::<Cron>(r#""61 3 * * *""#).unwrap_err(),
            r#""61 3 * * *": "61" is not a cron field between 0 and 59"#
        );
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
