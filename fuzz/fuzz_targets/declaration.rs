//! The declaration parser: any bytes are accepted or refused with at least one problem, and the
//! refusal's text is bounded however large the values in the input. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_host::declaration::{Declaration, Refused};

/// A refusal's lines are at most a message (cut at 1,000 bytes), an id and a field (cut at 100
/// characters each) and the resource's position.
const LONGEST_LINE: usize = 1_500;

fn refused_well(refused: &Refused) {
    assert!(!refused.problems.is_empty(), "a refusal with no problem: {refused:?}");
    assert!(refused.problems.len() <= 100, "{} problems kept", refused.problems.len());
    for line in refused.to_string().lines() {
        assert!(line.len() <= LONGEST_LINE, "a line of {} bytes: {line}", line.len());
    }
}

fuzz_target!(|data: &[u8]| {
    match Declaration::parse(data) {
        Ok(d) => {
            for r in &d.resources {
                assert!(d.find(r.id.as_str()).is_some_and(|found| found.index() == r.index()));
                let _ = r.target();
            }
        }
        Err(refused) => refused_well(&refused),
    }
    // The same bytes as two documents of a directory, split in the middle: the path that
    // names each problem's document.
    let (a, b) = data.split_at(data.len() / 2);
    let sources = vec![("10-a.json".to_owned(), a.to_vec()), ("20-b.json".to_owned(), b.to_vec())];
    if let Err(refused) = Declaration::parse_sources(&sources) {
        refused_well(&refused);
        for p in &refused.problems {
            assert!(p.source.is_some(), "a problem of two named documents names neither: {p}");
        }
    }
});
