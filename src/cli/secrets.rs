//! `keygen`, `pubkey` and `seal`: the sealing key and sealed values.

use super::*;

/// Where the node's key is: `--key`, else `sealing.key` beside the store, since the state
/// directory is already the agent's private one (docs/decisions.md, "The key file").
pub fn key_path(key: Option<&Path>, state: &Path) -> PathBuf {
    match key {
        Some(key) => std::path::absolute(key).unwrap_or_else(|_| key.to_owned()),
        None => crate::store::state_dir(state).join(crate::system::keys::DEFAULT_NAME),
    }
}

/// Reads the node's keyring, or says how to make one.
pub(super) fn keyring(key: &Path) -> anyhow::Result<crate::secrets::Keyring> {
    let text = crate::system::keys::read(key)?.ok_or_else(|| {
        anyhow::anyhow!("this node has no sealing key at {}: make one with `mesh-host keygen`", key.display())
    })?;
    crate::secrets::Keyring::parse(&text)
        .with_context(|| format!("the key file {} is not an age identity file", key.display()))
}

pub(super) fn keygen(key: &Path, rotate: bool, retire_previous: bool) -> anyhow::Result<Ended> {
    use crate::secrets::Keyring;
    if rotate || retire_previous {
        let current = keyring(key)?;
        let text = if rotate { current.rotate() } else { current.retire_previous()? };
        crate::system::keys::replace(key, &text)?;
        let now = Keyring::parse(&text)?;
        if rotate {
            eprintln!(
                "rotated {}: values sealed to the previous key ({}) still open until `mesh-host keygen --retire-previous`",
                key.display(),
                current.public_key()
            );
        } else {
            eprintln!(
                "retired the previous key of {}: only values sealed to the key below open",
                key.display()
            );
        }
        println!("{}", now.public_key());
    } else {
        let text = Keyring::generate();
        crate::system::keys::create(key, &text)?;
        eprintln!("made the sealing key {} (mode 0600); its public key:", key.display());
        println!("{}", Keyring::parse(&text)?.public_key());
    }
    Ok(Ended::Converged)
}

pub(super) fn pubkey(key: &Path) -> anyhow::Result<Ended> {
    let ring = keyring(key)?;
    println!("{}", ring.public_key());
    if ring.has_previous() {
        eprintln!("(a previous key is kept as well, until `mesh-host keygen --retire-previous`)");
    }
    Ok(Ended::Converged)
}

/// Seals what is on standard input. The value is held zeroed-on-drop, never logged.
pub(super) fn seal(to: &str) -> anyhow::Result<Ended> {
    use std::io::Read as _;
    use zeroize::Zeroize as _;
    // Room for an ordinary value up front: a buffer that grows leaves its old copies behind.
    let mut plain = Vec::with_capacity(64 * 1024);
    let read = std::io::stdin().lock().read_to_end(&mut plain);
    let sealed = read.map_err(anyhow::Error::from).and_then(|_| Ok(crate::secrets::seal(to, &plain)?));
    plain.zeroize();
    println!("{}", sealed.context("cannot seal standard input")?.trim_end());
    Ok(Ended::Converged)
}
