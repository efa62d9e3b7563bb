//! The declaration's source, as the worker reads it: what a read found, digested so that a
//! full pass parses the source only when it changed, and what the agent tells systemd about it.

use std::path::PathBuf;

use sha2::Digest as _;

use super::signed;

/// Tells systemd what the agent is doing, for `systemctl status` ("Status:"). Nothing when not
/// run by systemd.
pub(super) fn status(what: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(what)]);
}

/// A digest of a read of the declaration source: each file's name, length and bytes, or the
/// error, and the generation held, if any. Two reads that digest the same found the same thing.
pub(super) fn fingerprint(
    read: &std::io::Result<Vec<(PathBuf, Vec<u8>)>>,
    signed: Option<&std::io::Result<signed::SignedFiles>>,
    held: Option<u64>,
) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    if let Some(n) = held {
        h.update(b"held\0");
        h.update(n.to_le_bytes());
    }
    // A signed directory's manifest and signatures: signing again changes only them.
    match signed {
        None => {}
        Some(Ok(None)) => h.update(b"unsigned\0"),
        Some(Ok(Some((manifest, signatures)))) => {
            for (name, bytes) in
                std::iter::once(("manifest", manifest)).chain(signatures.iter().map(|(n, b)| (n.as_str(), b)))
            {
                h.update(name.as_bytes());
                h.update(b"\0");
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        Some(Err(e)) => {
            h.update(b"signed error\0");
            h.update(e.to_string().as_bytes());
        }
    }
    match read {
        Ok(files) => {
            for (path, bytes) in files {
                h.update(b"file\0");
                h.update(path.as_os_str().as_encoded_bytes());
                h.update(b"\0");
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        Err(e) => {
            h.update(b"error\0");
            h.update(e.to_string().as_bytes());
        }
    }
    h.finalize().into()
}
