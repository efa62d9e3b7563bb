//! Declared content kept out of the daemon's heap.
//!
//! The daemon holds its declaration for months, only to put back the few files that drift: ten
//! thousand files of a few kilobytes are tens of megabytes of heap. So when a declaration is
//! accepted the daemon writes every file's declared bytes once into an unlinked file in the
//! state directory (`system::contents`), and the declaration keeps only where each body is
//! (`declaration::Stored`, plain values). The file is the daemon's: it hands it to each apply in
//! `apply::Options::contents`. A daemon memory policy, so it lives here, not in an applier
//! (docs/memory.md, "Memory at scale").

use std::path::Path;

use crate::declaration::{Declaration, Stored};
use crate::system::{ContentFile, ContentWriter};

/// Moves the declared bytes of the declaration's files into a new content file in `dir`. All
/// or nothing: if the file cannot be made or written, every body stays in memory. Files
/// carrying a sealed value or writing keys `into` a file are left as they are: they are applied
/// from the declaration, which keeps the values sealed between passes (docs/secrets.md, "In
/// memory"). Returns the file and how many bodies moved.
pub fn move_bodies(d: &mut Declaration, dir: &Path) -> std::io::Result<(ContentFile, usize)> {
    let mut writer = ContentWriter::create(dir)?;
    let mut moved = Vec::new();
    for (index, body) in d.movable_bodies() {
        let place = writer.push(body)?;
        moved.push((index, Stored { at: place.at, len: place.len, sum: place.sum }));
    }
    let file = writer.finish()?;
    let count = moved.len();
    for (index, stored) in moved {
        d.body_moved(index, stored);
    }
    Ok((file, count))
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

    #[test]
    fn bodies_move_to_the_content_file_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "a.text", "path": "/srv/text", "content": "port=80\n"},
                {"type": "file", "id": "a.bin", "path": "/srv/bin", "bytes": "AAEC/w=="},
                {"type": "file", "id": "a.empty", "path": "/srv/empty", "content": ""},
                {"type": "file", "id": "a.key", "path": "/srv/key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="},
                {"type": "directory", "id": "a.dir", "path": "/srv"}
            ]}"#,
        )
        .unwrap();
        let before: Vec<Vec<u8>> = ["a.text", "a.bin", "a.empty"]
            .iter()
            .map(|id| declared_bytes(file_of(&d, id), None).unwrap().into_owned())
            .collect();
        let (file, moved) = move_bodies(&mut d, dir.path()).unwrap();
        assert_eq!((moved, file.len()), (3, 12));
        for (id, bytes) in ["a.text", "a.bin", "a.empty"].iter().zip(&before) {
            let f = file_of(&d, id);
            assert!(f.content.is_none() && f.bytes.is_none() && f.stored.is_some(), "{id} left memory");
            assert_eq!(&declared_bytes(f, Some(&file)).unwrap().into_owned(), bytes, "{id}");
            assert!(declared_bytes(f, None).is_err(), "{id}: without the file there is nothing to read");
        }
        let sealed = file_of(&d, "a.key");
        assert!(sealed.stored.is_none() && sealed.sealed.is_some(), "a sealed file is left as it is");
        assert!(declared_bytes(sealed, Some(&file)).is_err());
        assert_eq!(d.inline_bytes(), 0);
    }

    #[test]
    fn where_no_content_file_can_be_made_every_body_stays_in_memory() {
        let mut d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "a.text", "path": "/srv/text", "content": "port=80\n"}]}"#,
        )
        .unwrap();
        assert!(move_bodies(&mut d, Path::new("/nonexistent/state")).is_err());
        let f = file_of(&d, "a.text");
        assert!(f.stored.is_none());
        assert_eq!(declared_bytes(f, None).unwrap().as_ref(), b"port=80\n");
        assert_eq!(d.inline_bytes(), 8);
    }
}
