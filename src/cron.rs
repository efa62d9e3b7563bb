//! When a scheduled step fires next: a 5-field cron expression (minute hour day month weekday),
//! read in UTC. Pure: the daemon's scheduler asks, sleeps until then, and runs the step with
//! [`crate::apply::run_scheduled`].
//!
//! The fields mean what they mean to Vixie cron, which is what an operator writing one expects:
//! `*`, a number, `a-b`, `*/n`, `a-b/n`, `a/n` (from `a` to the end, every `n`), and lists of
//! these; weekday 0 and 7 are both Sunday; months and weekdays may be named (`jan`, `mon-fri`,
//! any case); and the nicknames `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`,
//! `@midnight` and `@hourly` stand for their five fields (`@reboot`, which has no time, is
//! refused: a run-once step is what it means). When both the day and the weekday are restricted
//! (neither starts with `*`), a day matching either fires, as in Vixie cron.
//!
//! The parser is this project's own rather than the `cron` or `croner` crate: both read other
//! grammars (a seconds field, `L`, `W`, `#`, years) that a 5-field crontab line does not have and
//! that the declaration would then accept, and `croner` makes the day-or-weekday rule an
//! option; the fuzz target and the compiled bitsets stay as they are.
//!
//! The grammar is read once, by `declaration::Cron` while the declaration is parsed, into the
//! sets of values each field allows; this module only walks those sets through the calendar.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::declaration::Cron;

/// How far ahead to look. Eight years covers every leap day; an expression that has not fired
/// by then (`0 0 30 2 *`, the 30th of February) never will.
const HORIZON_DAYS: i64 = 366 * 8;

/// The next time strictly after `after` at which the expression fires, at a whole minute;
/// `None` if it never does.
///
/// The expression was compiled into sets of bits when the declaration was read: a day is
/// tested against them, and the first minute of a matching day is found by scanning bits, not
/// by reading the text or trying each of its 1,440 minutes.
pub fn next_fire(cron: &Cron, after: SystemTime) -> Option<SystemTime> {
    let secs = after.duration_since(UNIX_EPOCH).ok()?.as_secs() as i64;
    let first = secs.div_euclid(60) + 1; // The next whole minute, in minutes since the epoch.
    let first_day = first.div_euclid(1440);
    for day in first_day..first_day + HORIZON_DAYS {
        let (_, month, dom) = civil(day);
        let dow = (day + 4).rem_euclid(7) as u32; // 1970-01-01 was a Thursday.
        if !cron.fires_on(month, dom, dow) {
            continue;
        }
        let start = if day == first_day { first.rem_euclid(1440) as u32 } else { 0 };
        if let Some(minute_of_day) = first_minute(cron, start) {
            let at = (day * 1440 + i64::from(minute_of_day)) * 60;
            return Some(UNIX_EPOCH + Duration::from_secs(at as u64));
        }
    }
    None
}

/// The first minute of a day, at or after `start` (0-1439), at which the expression fires.
fn first_minute(cron: &Cron, start: u32) -> Option<u32> {
    let (start_hour, start_minute) = (start / 60, start % 60);
    // The hours from the start's on, lowest first.
    let mut hours = cron.hours() & (u32::MAX << start_hour);
    while hours != 0 {
        let hour = hours.trailing_zeros();
        let from = if hour == start_hour { start_minute } else { 0 };
        let minutes = cron.minutes() & (u64::MAX << from);
        if minutes != 0 {
            return Some(hour * 60 + minutes.trailing_zeros());
        }
        hours &= hours - 1; // The next hour.
    }
    None
}

/// (year, month 1-12, day 1-31) of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds since the epoch of a UTC date and time.
    fn at(y: i64, mo: u32, d: u32, h: u64, mi: u64) -> SystemTime {
        // Days from civil, the inverse of `civil`.
        let y = if mo <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = if mo > 2 { mo - 3 } else { mo + 9 } as i64;
        let doy = (153 * mp + 2) / 5 + d as i64 - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        UNIX_EPOCH + Duration::from_secs(days as u64 * 86_400 + h * 3600 + mi * 60)
    }

    fn next(expr: &str, after: SystemTime) -> Option<SystemTime> {
        next_fire(&Cron::parse(expr).unwrap(), after)
    }

    #[test]
    fn a_step_past_the_end_of_the_field_fires_at_its_start_only() {
        let t = at(2026, 11, 30, 4, 0) + Duration::from_secs(30);
        assert_eq!(next("1/4294967295 * * * *", t), Some(at(2026, 11, 30, 4, 1)));
        assert_eq!(next("1/4294967295 * * * *", at(2026, 11, 30, 4, 1)), Some(at(2026, 11, 30, 5, 1)));
        assert_eq!(next("0 1/4294967295 * * *", t), Some(at(2026, 12, 1, 1, 0)));
    }

    #[test]
    fn every_five_minutes_fires_at_the_next_multiple_strictly_after() {
        assert_eq!(next("*/5 * * * *", at(2026, 11, 30, 4, 2)), Some(at(2026, 11, 30, 4, 5)));
        assert_eq!(next("*/5 * * * *", at(2026, 11, 30, 4, 5)), Some(at(2026, 11, 30, 4, 10)));
        let mid_minute = at(2026, 11, 30, 4, 5) + Duration::from_secs(30);
        assert_eq!(next("*/5 * * * *", mid_minute), Some(at(2026, 11, 30, 4, 10)));
    }

    #[test]
    fn daily_at_a_time_rolls_over_the_day_month_and_year() {
        assert_eq!(next("30 2 * * *", at(2026, 11, 30, 4, 0)), Some(at(2026, 12, 1, 2, 30)));
        assert_eq!(next("0 0 1 1 *", at(2026, 11, 30, 4, 0)), Some(at(2027, 1, 1, 0, 0)));
        assert_eq!(next("59 23 31 12 *", at(2026, 12, 31, 23, 58)), Some(at(2026, 12, 31, 23, 59)));
    }

    #[test]
    fn weekdays_with_sunday_as_0_or_7() {
        // 2026-11-30 is a Monday.
        assert_eq!(next("0 9 * * 1-5", at(2026, 11, 30, 10, 0)), Some(at(2026, 12, 1, 9, 0)));
        assert_eq!(next("0 9 * * 0", at(2026, 11, 30, 10, 0)), Some(at(2026, 12, 6, 9, 0)));
        assert_eq!(next("0 9 * * 7", at(2026, 11, 30, 10, 0)), Some(at(2026, 12, 6, 9, 0)));
    }

    #[test]
    fn day_and_weekday_both_restricted_fire_on_either() {
        // The 15th, or any Friday: from Monday the 30th, Friday 4 December comes first.
        assert_eq!(next("0 0 15 * 5", at(2026, 11, 30, 0, 0)), Some(at(2026, 12, 4, 0, 0)));
        // With the weekday a star, only the 15th.
        assert_eq!(next("0 0 15 * *", at(2026, 11, 30, 0, 0)), Some(at(2026, 12, 15, 0, 0)));
    }

    #[test]
    fn leap_days_and_impossible_dates() {
        assert_eq!(next("0 0 29 2 *", at(2026, 11, 30, 0, 0)), Some(at(2028, 2, 29, 0, 0)));
        assert_eq!(next("0 0 30 2 *", at(2026, 11, 30, 0, 0)), None);
    }

    #[test]
    fn a_day_with_no_fire_left_rolls_to_the_next_matching_one() {
        // The last fire of the day has passed: the next is the first one of the next day.
        assert_eq!(next("0,30 9-17 * * *", at(2026, 11, 30, 17, 30)), Some(at(2026, 12, 1, 9, 0)));
        // Within the start's own hour, only the minutes after it; later hours from minute 0.
        assert_eq!(next("10,50 * * * *", at(2026, 11, 30, 8, 20)), Some(at(2026, 11, 30, 8, 50)));
        assert_eq!(next("10 * * * *", at(2026, 11, 30, 8, 20)), Some(at(2026, 11, 30, 9, 10)));
        assert_eq!(next("59 23 * * *", at(2026, 11, 30, 23, 59)), Some(at(2026, 12, 1, 23, 59)));
    }

    #[test]
    fn lists_ranges_and_steps() {
        assert_eq!(next("15,45 8-10/2 * * *", at(2026, 11, 30, 8, 20)), Some(at(2026, 11, 30, 8, 45)));
        assert_eq!(next("15,45 8-10/2 * * *", at(2026, 11, 30, 8, 50)), Some(at(2026, 11, 30, 10, 15)));
        assert_eq!(next("50/5 * * * *", at(2026, 11, 30, 8, 56)), Some(at(2026, 11, 30, 9, 50)));
    }

    /// The evaluator as it was before expressions were compiled: it read the text at every
    /// call and tried each minute of a matching day. Kept to hold the compiled one to it.
    mod by_text {
        use super::super::{civil, HORIZON_DAYS};
        use std::time::{Duration, SystemTime, UNIX_EPOCH};

        pub fn next_fire(expr: &str, after: SystemTime) -> Option<SystemTime> {
            let fields: Vec<&str> = expr.split_whitespace().collect();
            let minutes = set(fields[0], 0, 59)?;
            let hours = set(fields[1], 0, 23)?;
            let days = set(fields[2], 1, 31)?;
            let months = set(fields[3], 1, 12)?;
            let mut weekdays = set(fields[4], 0, 7)?;
            if weekdays & (1 << 7) != 0 {
                weekdays |= 1;
            }
            let day_star = fields[2].starts_with('*');
            let weekday_star = fields[4].starts_with('*');
            let secs = after.duration_since(UNIX_EPOCH).ok()?.as_secs() as i64;
            let first = secs.div_euclid(60) + 1;
            let first_day = first.div_euclid(1440);
            for day in first_day..first_day + HORIZON_DAYS {
                let (_, month, dom) = civil(day);
                let dow = (day + 4).rem_euclid(7) as u32;
                if months & (1 << month) == 0 {
                    continue;
                }
                let dom_ok = days & (1 << dom) != 0;
                let dow_ok = weekdays & (1 << dow) != 0;
                let day_ok = if day_star || weekday_star { dom_ok && dow_ok } else { dom_ok || dow_ok };
                if !day_ok {
                    continue;
                }
                let start = if day == first_day { first.rem_euclid(1440) } else { 0 };
                for minute_of_day in start..1440 {
                    let (h, m) = (minute_of_day / 60, minute_of_day % 60);
                    if hours & (1 << h) != 0 && minutes & (1 << m) != 0 {
                        let at = (day * 1440 + minute_of_day) * 60;
                        return Some(UNIX_EPOCH + Duration::from_secs(at as u64));
                    }
                }
            }
            None
        }

        fn set(field: &str, lo: u32, hi: u32) -> Option<u64> {
            let mut bits = 0u64;
            for part in field.split(',') {
                let (range, step) = match part.split_once('/') {
                    Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)?),
                    None => (part, 1),
                };
                let (from, to) = if range == "*" {
                    (lo, hi)
                } else if let Some((a, b)) = range.split_once('-') {
                    (a.parse().ok()?, b.parse().ok()?)
                } else {
                    let a: u32 = range.parse().ok()?;
                    (a, if part.contains('/') { hi } else { a })
                };
                if from < lo || to > hi || from > to {
                    return None;
                }
                // A step past the field's end ends the walk: added in u32 it would overflow.
                let mut v = Some(from);
                while let Some(at) = v.filter(|at| *at <= to) {
                    bits |= 1 << at;
                    v = at.checked_add(step);
                }
            }
            Some(bits)
        }
    }

    /// A small deterministic generator (splitmix64): the same cases on every run.
    struct Cases(u64);

    impl Cases {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u32) -> u32 {
            (self.next() % u64::from(n)) as u32
        }

        fn within(&mut self, lo: u32, hi: u32) -> u32 {
            lo + self.below(hi - lo + 1)
        }

        /// One field between `lo` and `hi`, as an operator might write it: mostly `*`, else a
        /// list of values, ranges and steps.
        fn field(&mut self, lo: u32, hi: u32) -> String {
            if self.below(3) == 0 {
                return "*".to_owned();
            }
            let parts: Vec<String> = (0..self.within(1, 3))
                .map(|_| {
                    let (a, b) = (self.within(lo, hi), self.within(lo, hi));
                    let (a, b) = (a.min(b), a.max(b));
                    let step = self.within(1, hi - lo + 2);
                    match self.below(6) {
                        0 => format!("*/{step}"),
                        1 => format!("{a}"),
                        2 => format!("{a}-{b}"),
                        3 => format!("{a}-{b}/{step}"),
                        4 => format!("{a}/{step}"),
                        _ => "*".to_owned(),
                    }
                })
                .collect();
            parts.join(",")
        }
    }

    #[test]
    fn the_compiled_expression_fires_when_the_text_did_on_many_expressions_and_times() {
        let mut cases = Cases(16);
        let mut fired = 0;
        for _ in 0..3_000 {
            let expr =
                [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)].map(|(lo, hi)| cases.field(lo, hi)).join(" ");
            let cron = Cron::parse(&expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            for _ in 0..4 {
                // Any time from 1970 to 2100, at any second.
                let after = UNIX_EPOCH + Duration::from_secs(cases.next() % 4_102_444_800);
                let want = by_text::next_fire(&expr, after);
                assert_eq!(next_fire(&cron, after), want, "{expr:?} after {after:?}");
                fired += usize::from(want.is_some());
            }
        }
        // The generator must make expressions that fire, or the comparison proves little.
        assert!(fired > 10_000, "only {fired} of 12000 cases fired");
    }

    #[test]
    fn the_compiled_expression_fires_when_the_text_did_at_the_edges_of_days_months_and_years() {
        let exprs = [
            "* * * * *",
            "0 0 * * *",
            "59 23 31 12 *",
            "0 0 29 2 *",
            "0 0 30 2 *",
            "*/7 */5 */3 */2 *",
            "0 12 1,15 * 1-5",
            "30 6 * * 0,7",
            "0 0 13 * 5",
            "5/15 22-23 28-31 * *",
        ];
        let edges = [
            at(2026, 12, 31, 23, 59),
            at(2027, 1, 1, 0, 0),
            at(2028, 2, 28, 23, 59),
            at(2028, 2, 29, 23, 59),
            at(2100, 2, 28, 23, 58),
            at(2026, 11, 30, 23, 59) + Duration::from_secs(59),
            UNIX_EPOCH,
        ];
        for expr in exprs {
            let cron = Cron::parse(expr).unwrap();
            for after in edges {
                assert_eq!(
                    next_fire(&cron, after),
                    by_text::next_fire(expr, after),
                    "{expr:?} after {after:?}"
                );
            }
        }
    }
}
