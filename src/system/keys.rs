//! The node's key file: read only when it is private to its owner, written atomically, a new
//! one never over an existing one.
//!
//! What the file holds is `secrets`' business; this module only moves its text between the disk
//! and a `SecretString`, which is zeroed when dropped.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use age::secrecy::SecretString;
use zeroize::Zeroize as _;

/// A key file is a few lines; anything larger is not one.
const LIMIT: u64 = 64 * 1024;

/// The key file's name in the state directory, when `--key` does not say otherwise.
pub const DEFAULT_NAME: &str = "sealing.key";

/// Why the node's key file could not be read or written. The messages name the file, never what it
/// holds.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The key file can be read by others than its owner.
    #[error(
        "the key file {path} is readable by others than its owner (mode {mode:04o}): it is refused, since anyone who can read it can open every secret sealed to this node; `chmod 600 {path}`, then, if it may have been copied, rotate it (`mesh-host keygen --rotate`) and have every value sealed again"
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file belongs to another user than the agent.
    #[error("the key file {path} is owned by uid {uid}, not by the agent (uid {agent}): it is refused")]
    NotOwner {
        /// The key file.
        path: PathBuf,
        /// Its owner's uid.
        uid: u32,
        /// The agent's own uid.
        agent: u32,
    },
    /// `keygen` was asked to make a key where one already is.
    #[error("the key file {path} already exists: `keygen` never writes over a key (see `keygen --rotate`)")]
    Exists {
        /// The key file.
        path: PathBuf,
    },
    /// The key file could not be read.
    #[error("cannot read the key file {path}: {error}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// The system's error.
        error: std::io::Error,
    },
    /// The key file could not be written.
    #[error("cannot write the key file {path}: {error}")]
    Write {
        /// The key file.
        path: PathBuf,
        /// The system's error.
        error: std::io::Error,
    },
}

/// Reads the key file; `None` when there is none. Refuses a file that anyone but its owner can
/// read or write, one owned by someone other than the agent, anything not a regular file (a
/// symlink is not followed), and one in a directory that anyone but root or the agent can
/// write, or under one (`strict::check_above`).
pub fn read(path: &Path) -> Result<Option<SecretString>, KeyFileError> {
    let failed = |error| KeyFileError::Read { path: path.to_owned(), error };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits()
                as i32,
        )
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(failed(std::io::Error::other("it is a symlink, which is never followed to a key")))
        }
        Err(e) => return Err(failed(e)),
    };
    let meta = file.metadata().map_err(failed)?;
    if !meta.file_type().is_file() {
        return Err(failed(std::io::Error::other("it is not a regular file")));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Exposed { path: path.to_owned(), mode });
    }
    let agent = nix::unistd::geteuid().as_raw();
    if meta.uid() != agent {
        return Err(KeyFileError::NotOwner { path: path.to_owned(), uid: meta.uid(), agent });
    }
    if meta.len() > LIMIT {
        return Err(failed(std::io::Error::other(format!("it is {} bytes: not a key file", meta.len()))));
    }
    // The directories above it, as sshd's StrictModes: whoever can write one can swap the key.
    super::strict::check_above(path, &super::strict::Trusted::agent()).map_err(failed)?;
    // Exactly the file's size: `SecretString` boxes the text, which would reallocate (and leave
    // a copy of the key behind, unzeroed) a buffer with room to spare, and `read_to_end` probes
    // for the end without growing a buffer that is exactly full.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = file.take(LIMIT).read_to_end(&mut bytes) {
        bytes.zeroize();
        return Err(failed(e));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(SecretString::from(text))),
        Err(e) => {
            e.into_bytes().zeroize();
            Err(failed(std::io::Error::other("it is not text")))
        }
    }
}

/// Writes a new key file, mode 0600, durably; fails if one is already there (the check and the
/// write are one step: a rename that refuses to replace). The directory is made 0700 if missing.
pub fn create(path: &Path, text: &SecretString) -> Result<(), KeyFileError> {
    write(path, text, false)
}

/// Replaces the key file atomically (a rotation): readers see the old file or the new one.
pub fn replace(path: &Path, text: &SecretString) -> Result<(), KeyFileError> {
    write(path, text, true)
}

fn write(path: &Path, text: &SecretString, over: bool) -> Result<(), KeyFileError> {
    use age::secrecy::ExposeSecret as _;
    let failed = |error| KeyFileError::Write { path: path.to_owned(), error };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(failed(std::io::Error::other("not a file's path")));
    };
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(failed)?;
    }
    let tmp = dir.join(format!(".{}.mesh-host-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        file.write_all(text.expose_secret().as_bytes())?;
        super::durable::file(&file)?;
        let flags = if over { rustix::fs::RenameFlags::empty() } else { rustix::fs::RenameFlags::NOREPLACE };
        rustix::fs::renameat_with(rustix::fs::CWD, &tmp, rustix::fs::CWD, path, flags)?;
        super::durable::file(&std::fs::File::open(dir)?)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(KeyFileError::Exists { path: path.to_owned() })
        }
        other => other.map_err(failed),
    }
}
