//! The cron parser and the scheduler's evaluator: any text is accepted or refused, and an
//! accepted expression's next fire, when it has one, is a whole minute strictly after the time
//! asked about. Never a panic, never a hang.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use mesh_host::declaration::Cron;
use mesh_host::cron::next_fire;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cron) = Cron::parse(text) else { return };
    // The epoch, a time in 2026 half way through a minute, and the last minute of a leap day.
    for secs in [0, 1_780_000_030, 1_835_481_599] {
        let after = UNIX_EPOCH + Duration::from_secs(secs);
        if let Some(at) = next_fire(&cron, after) {
            assert!(at > after, "{text:?} fires at {at:?}, not after {after:?}");
            let since = at.duration_since(UNIX_EPOCH).unwrap();
            assert_eq!(since.as_secs() % 60, 0, "{text:?} fires off a whole minute");
            assert_eq!(since.subsec_nanos(), 0);
        }
    }
});
