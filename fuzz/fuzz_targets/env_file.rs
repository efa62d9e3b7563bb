//! The container env-file parser: any bytes are parsed or refused, what is kept is a
//! `KEY=VALUE` line with a name, and a refusal never repeats the file's text (it may hold a
//! secret). Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_host::apply::parse_env_file;

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
