//! Copies `parse_env_file` out of `src/apply/container.rs` for the `env_file` target (see
//! there): from its signature to the closing brace at the start of a line.

#![allow(clippy::disallowed_methods, reason = "a build script writes its output into OUT_DIR")]

use std::path::Path;

fn main() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/apply/container.rs");
    println!("cargo:rerun-if-changed={}", source.display());
    let text = std::fs::read_to_string(&source).expect("src/apply/container.rs is readable");
    let start = text
        .find("fn parse_env_file(")
        .expect("src/apply/container.rs no longer defines parse_env_file: update fuzz/build.rs");
    let end = start
        + text[start..].find("\n}\n").expect("parse_env_file ends with a closing brace on a line of its own")
        + 3;
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("parse_env_file.rs");
    std::fs::write(out, &text[start..end]).expect("OUT_DIR is writable");
}
