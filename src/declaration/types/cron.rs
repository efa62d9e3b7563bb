//! A cron expression, compiled while it is read.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

#[cfg(test)]
mod tests {
    use super::super::from_json;
    use super::*;

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
}
