//! The container env-file parser: any bytes are parsed or refused, what is kept is a
//! `KEY=VALUE` line with a name, and a refusal never repeats the file's text (it may hold a
//! secret). Never a panic.
//!
//! `parse_env_file` is private to `src/apply/container.rs`, and the only public path to it
//! creates a container through Docker. Until it is made reachable, `build.rs` copies the
//! function's text out of that file, unchanged, so what is fuzzed is the code that runs; the
//! build fails if the function cannot be found.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!(concat!(env!("OUT_DIR"), "/parse_env_file.rs"));

fuzz_target!(|data: &[u8]| {
    match parse_env_file(data) {
        Ok(lines) => {
            for line in lines {
                let (key, _) = line.split_once('=').expect("a kept line holds '='");
                assert!(!key.is_empty() && !key.contains(char::is_whitespace), "kept {line:?}");
            }
        }
        Err(message) => {
            let numbered = message
                .strip_prefix("line ")
                .and_then(|rest| rest.strip_suffix(" does not start with a variable name"))
                .is_some_and(|n| n.parse::<usize>().is_ok());
            assert!(numbered || message == "is not UTF-8 text", "the refusal says {message:?}");
        }
    }
});
