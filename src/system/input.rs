//! Reading the agent's own inputs: a declaration, its directory, the state store, an archive's
//! source. Unlike managed targets these are followed through symlinks, as any reader would, but
//! nothing on the machine can make reading them hang or eat memory:
//!
//! - the path is opened `O_NONBLOCK`, so a FIFO planted there cannot block the open;
//! - what was opened is checked on the descriptor (never by a second look at the path) to be a
//!   regular file, and anything else (a FIFO, a device such as `/dev/zero`, a socket) is refused,
//!   naming what it is;
//! - reads are bounded: a file larger than the caller's limit is refused before its bytes are
//!   read, and a file that grows past the limit while it is read is refused too.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The largest declaration file read: about 25,000 resources of 10 KiB of content each. A
/// declaration is held in memory while it is parsed, so this bounds what a bad file can cost.
pub const DECLARATION_LIMIT: u64 = 256 << 20;

/// The largest state store read: a record is a few hundred bytes, so this is millions of them.
pub const STORE_LIMIT: u64 = 1 << 30;

/// What a file type is called in a message.
fn what(ft: std::fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

/// Opens a regular file for reading without blocking on it, refusing anything else. Returns the
/// file and its size.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32 | rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::other(format!(
            "it is {}, not a regular file; mesh-host reads only regular files here",
            what(meta.file_type())
        )));
    }
    // Back to ordinary blocking reads: for a regular file it makes no difference, and it keeps
    // a later reader from seeing EAGAIN on an exotic filesystem.
    rustix::fs::fcntl_setfl(&file, rustix::fs::fcntl_getfl(&file)? - rustix::fs::OFlags::NONBLOCK)?;
    Ok((file, meta.len()))
}

/// Reads a whole regular file of at most `limit` bytes (see the module's notes).
pub fn read_input(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, size) = open_regular(path)?;
    read_bounded(file, size, limit)
}

/// Opens a regular file of at most `limit` bytes to be read as a stream, buffered: for a reader
/// that parses as it reads and needs no copy of the whole text (the state store: 56 MB at
/// 100,000 records, which read whole sat beside the declaration's text at the peak of an
/// `apply`). A file past the limit is refused before anything is read; one that grows past it
/// meanwhile ends at the limit, where its parser finds it cut short.
pub fn open_input(path: &Path, limit: u64) -> io::Result<io::BufReader<io::Take<File>>> {
    let (file, size) = open_regular(path)?;
    if size > limit {
        return Err(too_big(size, limit));
    }
    Ok(io::BufReader::with_capacity(64 * 1024, file.take(limit)))
}

/// Why a file of `size` bytes is not read.
fn too_big(size: u64, limit: u64) -> io::Error {
    io::Error::other(format!(
        "it is {size} bytes, more than the {limit} bytes mesh-host reads from such a file"
    ))
}

/// Reads an opened regular file of `size` bytes whole, refusing it past `limit`: the size only
/// guides the first allocation, and the read itself stops at the limit, so a file that grows
/// meanwhile cannot make it read more.
fn read_bounded(file: File, size: u64, limit: u64) -> io::Result<Vec<u8>> {
    let too_big = |size: u64| too_big(size, limit);
    if size > limit {
        return Err(too_big(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads standard input to its end, at most `limit` bytes: a declaration piped to a command
/// (`mesh-host check -`). Bounded like a file, so `cat /dev/zero | mesh-host check -` is refused
/// rather than eating memory.
pub fn read_stdin(limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    io::stdin().lock().take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::other(format!(
            "standard input holds more than the {limit} bytes mesh-host reads as a declaration"
        )));
    }
    Ok(bytes)
}

/// Whether standard error is connected to the journal: systemd sets `JOURNAL_STREAM` to the
/// device and inode of the stream it gave the service, and a program whose stderr is still that
/// stream (not redirected by a wrapper) may write journal-aware lines there.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else { return false };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
    rustix::fs::fstat(std::io::stderr()).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

/// The files of a declaration source, read now: the file itself, or every `*.json` in the
/// directory (not hidden), sorted by name. Anything in the directory named `*.json` that is not
/// a regular file (a FIFO, a device, a directory) is refused, naming it, rather than skipped: an
/// operator who put it there meant it to be read.
pub fn read_source(source: &Path) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
    read_source_with(source, None)
}

/// `read_source` of a source the agent takes its orders from: the source, each file and every
/// directory above them checked first (`strict::check`), and a refusal returned as an error of
/// kind `PermissionDenied` that names the path and the fix. A source that is not there is
/// `NotFound`, as for `read_source`.
pub fn read_strict_source(
    source: &Path,
    trusted: &super::strict::Trusted,
) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
    read_source_with(source, Some(trusted))
}

fn read_source_with(
    source: &Path,
    strict: Option<&super::strict::Trusted>,
) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let checked = |path: &Path| strict.map_or(Ok(()), |t| super::strict::check(path, t));
    checked(source)?;
    let meta = std::fs::metadata(source)?;
    if !meta.is_dir() {
        return Ok(vec![(source.to_path_buf(), read_input(source, DECLARATION_LIMIT)?)]);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(source)? {
        let path = entry?.path();
        let hidden = path.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if path.extension().is_some_and(|e| e == "json") && !hidden {
            names.push(path);
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|p| match checked(&p).and_then(|()| read_input(&p, DECLARATION_LIMIT)) {
            Ok(bytes) => Ok((p, bytes)),
            // A strict refusal names its path (the file, or where a symlink led) itself.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && strict.is_some() => Err(e),
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
        })
        .collect()
}

/// Where a signed directory keeps its manifest and signatures: hidden, so `read_source` never
/// takes them for declaration files.
pub const SIGNED_DIR: &str = ".mesh-host";

/// The most signature files read beside one manifest.
pub const SIGNATURES_MAX: usize = 32;

/// A signed directory's manifest and signatures, read now: `DIR/.mesh-host/manifest` (at most
/// `manifest_limit` bytes) and every `*.sig` beside it (each at most `signature_limit`, at most
/// `SIGNATURES_MAX` of them), sorted by name. `None` when there is no manifest. Each is read as
/// any input is (regular files only, bounded); what they say is the caller's business.
#[allow(clippy::type_complexity, reason = "the manifest's bytes, and each signature's name and bytes")]
pub fn read_signed(
    dir: &Path,
    manifest_limit: u64,
    signature_limit: u64,
) -> io::Result<Option<(Vec<u8>, Vec<(String, Vec<u8>)>)>> {
    let signed = dir.join(SIGNED_DIR);
    let manifest = match read_input(&signed.join("manifest"), manifest_limit) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}/manifest: {e}", signed.display()))),
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&signed)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".sig") && !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    if names.len() > SIGNATURES_MAX {
        return Err(io::Error::other(format!(
            "{} holds {} signatures, more than the {SIGNATURES_MAX} read beside one manifest",
            signed.display(),
            names.len()
        )));
    }
    let mut signatures = Vec::new();
    for name in names {
        let path = signed.join(&name);
        let bytes = read_input(&path, signature_limit)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        signatures.push((name, bytes));
    }
    Ok(Some((manifest, signatures)))
}

/// What containers read (kept here with the agent's other bounded, non-blocking reads; the
/// container applier is their one user).
///
/// Opens a file a container will read at creation (an env-file, a file mounted into it),
/// following symlinks as the runtime does, without blocking on a FIFO planted there. `None`
/// when there is nothing there or it is not a regular file: a directory is not looked inside.
fn open_input_file(path: &Path) -> std::io::Result<Option<(std::fs::File, u64)>> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => match open_regular(path) {
            Ok(opened) => Ok(Some(opened)),
            // Replaced by something else between the look and the open.
            Err(e) if e.kind() == std::io::ErrorKind::Other => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        },
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads a file a container will read at creation whole, at most `limit` bytes (an env-file,
/// which the host parses; a mounted file carrying a secret, whose keyed digest needs its
/// bytes). `None` as for `open_input_file`.
pub fn read_input_file(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let Some((file, size)) = open_input_file(path)? else { return Ok(None) };
    read_bounded(file, size, limit).map(Some)
}

/// The SHA-256 of a file a container will read at creation, read as a stream: a mounted file
/// may be large (a database, a model), and only its digest is wanted. `None` as for
/// `open_input_file`.
pub fn hash_input_file(path: &Path) -> std::io::Result<Option<[u8; 32]>> {
    use sha2::Digest as _;
    let Some((mut file, _)) = open_input_file(path)? else { return Ok(None) };
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(Some(hasher.finalize().into()))
}

/// Reads a password from a file (its first line), bounded, for etcd's auth. Never logged.
/// With `strict` (the daemon's login), the file and the directories above it are checked first
/// (`strict::check`).
pub fn read_password(
    path: &std::path::Path,
    strict: Option<&super::strict::Trusted>,
) -> std::io::Result<secrecy::SecretString> {
    if let Some(trusted) = strict {
        super::strict::check(path, trusted)?;
    }
    let bytes = read_input(path, 4096)?;
    let text = String::from_utf8(bytes).map_err(|_| std::io::Error::other("the password is not UTF-8"))?;
    Ok(secrecy::SecretString::from(text.lines().next().unwrap_or_default().to_owned()))
}

/// Whether anything is at a path (a bind mount's source), following symlinks.
pub fn exists(path: &Path) -> bool {
    std::fs::metadata(path).is_ok()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the tests plant the inputs they then read")]
mod tests {
    use super::*;

    #[test]
    fn what_a_container_reads_is_read_bounded_hashed_as_a_stream_and_never_blocks_on_a_fifo() {
        use sha2::Digest as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.env");
        std::fs::write(&file, "A=1\n").unwrap();
        assert_eq!(read_input_file(&file, 16).unwrap(), Some(b"A=1\n".to_vec()));
        let over = read_input_file(&file, 3).unwrap_err().to_string();
        assert!(over.contains("more than the 3 bytes"), "{over}");
        let sum: [u8; 32] = sha2::Sha256::digest(b"A=1\n").into();
        assert_eq!(hash_input_file(&file).unwrap(), Some(sum));
        assert_eq!(read_input_file(&dir.path().join("absent"), 16).unwrap(), None);
        assert_eq!(read_input_file(dir.path(), 16).unwrap(), None, "a directory is not looked inside");
        // A FIFO: an ordinary open would wait for a writer for ever.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert_eq!(read_input_file(&fifo, 16).unwrap(), None);
        assert_eq!(hash_input_file(&fifo).unwrap(), None);
        // A symlink to a device is followed, as the runtime would, and is not a regular file.
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(read_input_file(&zero, 16).unwrap(), None);
    }

    #[test]
    fn a_fifo_is_refused_at_once_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.json");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = read_input(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("a FIFO, not a regular file"), "{e}");
        let e = read_source(dir.path()).unwrap_err().to_string();
        assert!(e.contains("fifo.json") && e.contains("a FIFO"), "{e}");
    }

    #[test]
    fn the_daemons_password_file_is_read_strictly_an_operators_is_not() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "hunter2\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o620)).unwrap();
        let strict = super::super::strict::Trusted::agent();
        let e = read_password(&file, Some(&strict)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let e = e.to_string();
        assert!(e.contains(&format!("{} is writable by its group (mode 0620)", file.display())), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(read_password(&file, None).is_ok(), "an operator's own file, not checked");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        use secrecy::ExposeSecret as _;
        assert_eq!(read_password(&file, Some(&strict)).unwrap().expose_secret(), "hunter2");
    }

    #[test]
    fn a_device_is_refused_without_reading_it() {
        let e = read_input(Path::new("/dev/zero"), 10).unwrap_err().to_string();
        assert!(e.contains("a character device"), "{e}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_both_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        let e = read_input(&big, 10).unwrap_err().to_string();
        assert!(e.contains("11 bytes") && e.contains("10 bytes"), "{e}");
        assert_eq!(read_input(&big, 11).unwrap().len(), 11);
    }
}
