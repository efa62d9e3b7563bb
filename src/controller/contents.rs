//! Declared content kept out of the heap.
//!
//! The daemon holds its declaration for months, only to put back the few files that drift: ten
//! thousand files of a few kilobytes are tens of megabytes of heap. So while a declaration is
//! parsed the daemon writes every file's declared bytes once into an unlinked file in the
//! state directory (`system::contents`), and the declaration keeps only where each body is
//! (`declaration::Stored`, plain values). The file is the daemon's: it hands it to each apply in
//! `apply::Options::contents`. A one-shot `apply` does the same for its one pass, so that its
//! peak is not the declaration's text and every body at once (`cli`). A memory policy of the
//! callers, so it lives here, not in an applier (docs/memory.md, "Memory at scale").

use std::path::Path;
use std::sync::Mutex;

use crate::declaration::{Declaration, Refused, Resource, Stored};
use crate::system::{ContentFile, ContentWriter};

/// What a parse that moves bodies as it goes ends with: the declaration, and the content file
/// with how many bodies moved, or why there is none (every body then in memory).
pub type Parsed = (Declaration, std::io::Result<(ContentFile, usize)>);

/// Parses a declaration's sources, moving each file's declared bytes into a new content file in
/// `dir` as soon as the file is validated, so that the bodies never pile up in the heap beside
/// the declaration's text: moved after the parse, as `move_bodies` does, the bodies of 100,000
/// files of 1 KiB (102 MB) were all in memory at once with the text (113 MB) at the peak of a
/// start (docs/memory.md, "The peak of a start"). Do not move them after the parse again.
///
/// All or nothing, as `move_bodies`: where the file cannot be made, the declaration is parsed
/// with every body in memory; where a body cannot be written, it is parsed again so (a second
/// parse, only on a write error, rather than bodies split between the file and the heap).
pub fn parse_moving(sources: &[(String, Vec<u8>)], dir: &Path) -> Result<Parsed, Refused> {
    parse_moving_with(dir, |keep| Declaration::parse_sources_keeping(sources, keep))
}

/// As `parse_moving`, for a declaration that `parse` reads, handing each resource it validates
/// to the `keep` it is given: `apply` reads a single file as one unnamed document
/// (`Declaration::parse_keeping`), so that its problems are named as before. `parse` is called
/// again with a `keep` that does nothing where the bodies must stay in memory.
pub fn parse_moving_with(
    dir: &Path,
    parse: impl Fn(&(dyn Fn(&mut Resource) + Sync)) -> Result<Declaration, Refused>,
) -> Result<Parsed, Refused> {
    let writer = match ContentWriter::create(dir) {
        Ok(writer) => writer,
        Err(e) => return Ok((parse(&|_| {})?, Err(e))),
    };
    // One writer for both validating threads: a lock per body is nothing beside its parse.
    let spill = Mutex::new(Spill { writer, moved: 0, failed: None });
    let keep = |r: &mut Resource| {
        let mut spill = spill.lock().unwrap_or_else(|e| e.into_inner());
        if spill.failed.is_some() {
            return;
        }
        let Some(body) = r.movable_body() else { return };
        match spill.writer.push(body) {
            Ok(place) => {
                r.body_moved(Stored::new(place.at, place.len, place.sum));
                spill.moved += 1;
            }
            Err(e) => spill.failed = Some(e),
        }
    };
    let d = parse(&keep)?;
    let Spill { writer, moved, failed } = spill.into_inner().unwrap_or_else(|e| e.into_inner());
    match failed.map_or_else(|| writer.finish(), Err) {
        Ok(file) => Ok((d, Ok((file, moved)))),
        Err(e) => Ok((parse(&|_| {})?, Err(e))),
    }
}

/// The content file being filled while a declaration is parsed.
struct Spill {
    writer: ContentWriter,
    moved: usize,
    /// The first write that failed; nothing more is written after it.
    failed: Option<std::io::Error>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::declared_bytes;
    use crate::declaration::{File, Spec};

    fn file_of<'a>(d: &'a Declaration, id: &str) -> &'a File {
        match &d.find(id).unwrap().spec {
            Spec::File(f) => f,
            other => panic!("{other:?}"),
        }
    }

    const FOUR: &[u8] = br#"{"version": 1, "resources": [
        {"type": "file", "id": "a.text", "path": "/srv/text", "content": "port=80\n"},
        {"type": "file", "id": "a.bin", "path": "/srv/bin", "bytes": "AAEC/w=="},
        {"type": "file", "id": "a.empty", "path": "/srv/empty", "content": ""},
        {"type": "file", "id": "a.key", "path": "/srv/key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="},
        {"type": "directory", "id": "a.dir", "path": "/srv"}
    ]}"#;

    fn sources(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        vec![("a.json".to_owned(), bytes.to_vec())]
    }

    #[test]
    fn bodies_move_to_the_content_file_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let plain = Declaration::parse(FOUR).unwrap();
        let before: Vec<Vec<u8>> = ["a.text", "a.bin", "a.empty"]
            .iter()
            .map(|id| declared_bytes(file_of(&plain, id), None).unwrap().into_owned())
            .collect();
        let (d, file) = parse_moving(&sources(FOUR), dir.path()).unwrap();
        let (file, moved) = file.unwrap();
        assert_eq!((moved, file.len()), (3, 12));
        for (id, bytes) in ["a.text", "a.bin", "a.empty"].iter().zip(&before) {
            let f = file_of(&d, id);
            assert!(f.content().is_none() && f.bytes.is_none() && f.stored().is_some(), "{id} left memory");
            assert_eq!(&declared_bytes(f, Some(&file)).unwrap().into_owned(), bytes, "{id}");
            assert!(declared_bytes(f, None).is_err(), "{id}: without the file there is nothing to read");
        }
        let sealed = file_of(&d, "a.key");
        assert!(sealed.stored().is_none() && sealed.sealed.is_some(), "a sealed file is left as it is");
        assert!(declared_bytes(sealed, Some(&file)).is_err());
        assert_eq!(d.inline_bytes(), 0);
        // The digests are of the declaration as written, whatever moved.
        for (a, b) in plain.resources.iter().zip(&d.resources) {
            assert_eq!((&a.id, a.digest), (&b.id, b.digest));
        }
    }

    #[test]
    fn bodies_of_a_large_declaration_move_from_both_validating_threads() {
        // Past `resources_of`'s threshold, so both halves are validated at once.
        let files: Vec<String> = (0..3_000)
            .map(|n| {
                format!(r#"{{"type": "file", "id": "a.f{n}", "path": "/srv/{n}", "content": "body {n}\n"}}"#)
            })
            .collect();
        let text = format!(r#"{{"version": 1, "resources": [{}]}}"#, files.join(","));
        let dir = tempfile::tempdir().unwrap();
        let (d, file) = parse_moving(&sources(text.as_bytes()), dir.path()).unwrap();
        let (file, moved) = file.unwrap();
        assert_eq!(moved, 3_000);
        for n in [0, 1_499, 1_500, 2_999] {
            let f = file_of(&d, &format!("a.f{n}"));
            assert_eq!(declared_bytes(f, Some(&file)).unwrap().as_ref(), format!("body {n}\n").as_bytes());
        }
        assert_eq!(d.inline_bytes(), 0);
    }

    #[test]
    fn where_no_content_file_can_be_made_every_body_stays_in_memory() {
        let text = br#"{"version": 1, "resources": [
                {"type": "file", "id": "a.text", "path": "/srv/text", "content": "port=80\n"}]}"#;
        let (d, file) = parse_moving(&sources(text), Path::new("/nonexistent/state")).unwrap();
        assert!(file.is_err());
        let f = file_of(&d, "a.text");
        assert!(f.stored().is_none());
        assert_eq!(declared_bytes(f, None).unwrap().as_ref(), b"port=80\n");
        assert_eq!(d.inline_bytes(), 8);
    }

    #[test]
    fn a_refused_declaration_is_refused_as_without_moving() {
        let dir = tempfile::tempdir().unwrap();
        let bad =
            br#"{"version": 1, "resources": [{"type": "file", "id": "A", "path": "/srv/a", "content": ""}]}"#;
        let moving = parse_moving(&sources(bad), dir.path()).map(|_| ()).unwrap_err();
        let plain = Declaration::parse_sources(&sources(bad)).map(|_| ()).unwrap_err();
        assert_eq!(moving.to_string(), plain.to_string());
    }
}
