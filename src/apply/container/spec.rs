//! A container's spec digest (the `mesh-host.spec` label), the files a long-running container
//! reads and their digests, and the legacy label from before those were folded in.

use std::collections::BTreeMap;
use std::path::Path;

use crate::apply::{secret, Ctx, Error};
use crate::declaration::{digest, Container, Declaration, Digest, Id, Kind, Spec, Volume};

/// The most of a mounted file carrying a secret the host reads to take its keyed digest.
const SECRET_FILE_LIMIT: u64 = 16 << 20;

/// The digest of a container's spec: what it is made from. `reads` are the files it reads at
/// creation; `None` computes the spec as it was before those were folded in (the legacy label).
///
/// Besides what the contract lists (image, name, env, ports, volumes, args, schedule, the
/// declared digest of each restart-on resource, the files read), the network and the extra
/// hosts are in it, each only when set: changing either changes the container, and a
/// container that sets neither keeps the digest the contract gives it.
pub fn spec_digest(
    declaration: &Declaration,
    c: &Container,
    reads: Option<&BTreeMap<String, String>>,
) -> String {
    spec(declaration, c, reads, &BTreeMap::new())
}

/// The declared digests of the restart-on files of `c` that carry a secret: keyed digests of
/// their opened content (`secret::declared_digest`), so the spec moves when a value moves and
/// not when the same value is sealed again.
pub(super) fn keyed_digests(ctx: &mut Ctx<'_>, c: &Container) -> Result<BTreeMap<Id, Digest>, Error> {
    let declaration = ctx.declaration;
    keyed_with(declaration, c, &mut |f| secret::keyring(ctx, f))
}

/// `keyed_digests`, with the keyring from `ring` (asked only if a restart-on file carries a
/// secret): the scheduler's way, which has no pass.
pub(super) fn keyed_with(
    declaration: &Declaration,
    c: &Container,
    ring: &mut dyn FnMut(&crate::declaration::File) -> Result<std::sync::Arc<crate::secrets::Keyring>, Error>,
) -> Result<BTreeMap<Id, Digest>, Error> {
    let mut out = BTreeMap::new();
    for id in &c.restart_on {
        let Some(r) = declaration.get(id) else { continue };
        let Spec::File(f) = &r.spec else { continue };
        if f.carries_secret() {
            out.insert(id.clone(), secret::declared_digest(&*ring(f)?, f)?);
        }
    }
    Ok(out)
}

/// `keyed` holds the declared digest of each restart-on file carrying a secret
/// (`keyed_digests`); every other resource is folded in by the digest of its declaration.
pub(super) fn spec(
    declaration: &Declaration,
    c: &Container,
    reads: Option<&BTreeMap<String, String>>,
    keyed: &BTreeMap<Id, Digest>,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "image {}", c.image.as_str());
    let _ = writeln!(s, "name {}", c.name.as_str());
    env_ports_volumes_args(&mut s, c);
    if let Some(n) = &c.network {
        let _ = writeln!(s, "network {}", n.as_str());
    }
    for h in &c.hosts {
        let _ = writeln!(s, "host {h}");
    }
    if let Some(cron) = &c.schedule {
        let _ = writeln!(s, "schedule {}", cron.as_str());
    }
    // Sorted, so a reordering nobody meant does not recreate anything.
    let mut named: Vec<&Id> = c.restart_on.iter().collect();
    named.sort();
    for id in named {
        let declared = match keyed.get(id) {
            Some(d) => d.to_string(),
            None => declaration.get(id).map(|r| r.digest.to_string()).unwrap_or_default(),
        };
        let _ = writeln!(s, "restart-on {id}={declared}");
    }
    for (path, d) in reads.into_iter().flatten() {
        let _ = writeln!(s, "file {path}={d}");
    }
    digest(s.as_bytes()).to_string()
}

/// The `mesh-host.spec` label the Go agent would have put on this container, so that a node
/// switched in place from it adopts its containers rather than recreating them all, the store
/// first (issue 45, point 7; docs/containers.md, "A node switched in place from the Go agent"). Its
/// rules, not its code: bare hex of the SHA-256 of the image and the name on lines of their
/// own, then `env K=V` (by key), `port`, `volume` and `arg` lines as declared, a `reads ID=D`
/// line per restart-on resource (by id; D a file's declared content, or a directory's path and
/// mode, by hex digest; empty for any other type), and a `file PATH=D` line per file it reads
/// at creation (`reads`: by path; D empty for an env-file that is absent). The network and the
/// extra hosts were not in it.
///
/// `None` where no such label can be matched without a plain SHA-256 of a secret: a file read
/// that this agent digests with the node's key, or a restart-on file carrying a secret. That
/// container is recreated once, as before.
pub(super) fn go_spec(ctx: &Ctx<'_>, c: &Container, reads: &BTreeMap<String, String>) -> Option<String> {
    use std::fmt::Write as _;
    let mut s = format!("{}\n{}\n", c.image.as_str(), c.name.as_str());
    env_ports_volumes_args(&mut s, c);
    let mut named: Vec<&Id> = c.restart_on.iter().collect();
    named.sort();
    for id in named {
        let declared = match ctx.declaration.get(id).map(|r| &r.spec) {
            Some(Spec::File(f)) if f.carries_secret() => return None,
            Some(Spec::File(f)) => go_hex(&go_file_material(ctx, f)?),
            Some(Spec::Directory(d)) => {
                let mode = d.mode.map(|m| m.to_string()).unwrap_or_default();
                go_hex(format!("{}\n{mode}", d.path.as_str()).as_bytes())
            }
            Some(_) | None => String::new(),
        };
        let _ = writeln!(s, "reads {id}={declared}");
    }
    for (path, d) in reads {
        // This agent's digests of what was read, in the Go's form: bare hex, empty for absent.
        let bare = match d.as_str() {
            "absent" => "",
            d => d.strip_prefix("sha256:")?,
        };
        let _ = writeln!(s, "file {path}={bare}");
    }
    Some(go_hex(s.as_bytes()))
}

/// What the Go agent digested of a declared file: its `content` as written; nothing (the
/// digest of no bytes) for `bytes` or a file sealed whole, whose content field it left empty.
fn go_file_material<'a>(
    ctx: &Ctx<'_>,
    f: &'a crate::declaration::File,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    if let Some(text) = f.content() {
        return Some(std::borrow::Cow::Borrowed(text.as_bytes()));
    }
    if f.stored().is_some() && f.bytes.is_none() {
        return crate::apply::file::declared_bytes(f, ctx.opts.contents.as_deref()).ok();
    }
    Some(std::borrow::Cow::Borrowed(b""))
}

/// Bare lower-case hex of the SHA-256 of `bytes`, as the Go agent wrote its digests.
fn go_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().fold(String::with_capacity(64), |mut out, b| {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// What a long-running container reads at creation, by path: each env-file, and each file
/// bind-mounted directly. A mounted directory is not looked inside, not even at files the host
/// wrote there: what a program reads out of a directory, and when, is the program's (a proxy
/// that re-reads its routes live would be recreated on every route change). A module whose
/// program reads such a file once says so with restart-on. Steps read nothing here: they read
/// their files afresh each time they run (docs/containers.md, "What makes a container "the
/// same"").
pub(super) fn reads(ctx: &mut Ctx<'_>, c: &Container) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for path in &c.env_file {
        let d = file_digest(ctx, path.as_path())?.unwrap_or_else(|| "absent".to_owned());
        out.insert(path.to_string(), d);
    }
    // A named volume is the runtime's, holding data: only a bind from the machine is read.
    for source in c.volumes.iter().filter_map(Volume::host_path) {
        if let Some(d) = file_digest(ctx, source.as_path())? {
            out.insert(source.to_string(), d);
        }
    }
    Ok(out)
}

/// What a file holds, by digest: what the host wrote there when it has a record of writing it,
/// else what is on disk. The record is preferred because it is what the host means by the
/// file: a seed created once digests as the seed, not as what the program grew in it. `None`
/// when nothing readable is there, or it is not a regular file.
///
/// The record of the file resource this declaration has at that path comes first; another
/// origin's record of the same path (a first-boot bundle's, which the mesh never removes) is
/// only a fallback, the most recent one, for a path this declaration does not write.
///
/// A file this declaration writes that carries a secret, found with no record (its apply
/// failed), is digested with the node's key, like its record would be: a plain sha256 of it
/// would be a way to check guesses of the secret, in the store and on the label.
fn file_digest(ctx: &mut Ctx<'_>, path: &Path) -> Result<Option<String>, Error> {
    let (store, declaration) = (ctx.store, ctx.declaration);
    let text = path.display().to_string();
    let at = declaration.at_path(path).filter(|r| r.kind() == Kind::File);
    let declared = at
        .and_then(|r| store.get(r.id.as_str()))
        .filter(|rec| rec.kind == Kind::File && *rec.target == *text);
    let record = declared.or_else(|| store.latest_at(Kind::File, &text).map(|(_, rec)| rec));
    if let Some(wrote) = record.and_then(|rec| rec.wrote) {
        return Ok(Some(wrote.to_string()));
    }
    let reads = |error| Error::ContainerReads { path: path.to_owned(), error };
    let secret = at.and_then(|r| if let Spec::File(f) = &r.spec { Some(f) } else { None });
    let d = match secret.filter(|f| f.carries_secret()) {
        // A file carrying a secret: its keyed digest needs its bytes (a secret is small).
        Some(f) => {
            let Some(mut bytes) =
                crate::system::input::read_input_file(path, SECRET_FILE_LIMIT).map_err(reads)?
            else {
                return Ok(None);
            };
            let ring = secret::keyring(ctx, f);
            let d = ring.map(|ring| Digest::from_keyed(ring.digest(&bytes)));
            zeroize::Zeroize::zeroize(&mut bytes);
            d?
        }
        // Anything else is hashed as a stream: a mounted file may be gigabytes.
        None => match crate::system::input::hash_input_file(path).map_err(reads)? {
            Some(sum) => Digest::from_sum(sum),
            None => return Ok(None),
        },
    };
    Ok(Some(d.to_string()))
}

/// The `env`, `port`, `volume` and `arg` lines, as declared: the part of the spec this agent's
/// label and the Go agent's write alike.
fn env_ports_volumes_args(s: &mut String, c: &Container) {
    use std::fmt::Write as _;
    for (k, v) in &c.env {
        let _ = writeln!(s, "env {k}={v}");
    }
    for p in &c.ports {
        let _ = writeln!(s, "port {p}");
    }
    for v in &c.volumes {
        let _ = writeln!(s, "volume {v}");
    }
    for a in &c.args {
        let _ = writeln!(s, "arg {a}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_of_the_declared_text_of_ports_volumes_hosts_env_and_schedule() {
        // The values are parsed into types, but the digest (the label on every running
        // container, and the record of every step) is of the text as declared, as it was when
        // they were strings: a change of it would recreate every container on the mesh.
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.backup", "name": "web-backup", "image": "local/web:1",
                 "env": {"B": "2", "A": "1"}, "ports": ["127.0.0.1:8080:80", "[::1]:8081:81/udp"],
                 "volumes": ["/srv/web/:/srv/web:ro", "web-data:/data"], "hosts": ["db6:fd00:0::5"],
                 "schedule": "*/15 3-5 * * 1,3"}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[0].spec else { unreachable!() };
        let text = "image local/web:1\nname web-backup\nenv A=1\nenv B=2\n\
                    port 127.0.0.1:8080:80\nport [::1]:8081:81/udp\n\
                    volume /srv/web/:/srv/web:ro\nvolume web-data:/data\n\
                    host db6:fd00:0::5\nschedule */15 3-5 * * 1,3\n";
        assert_eq!(spec(&d, c, None, &BTreeMap::new()), digest(text.as_bytes()).to_string());
    }

    #[test]
    fn the_spec_moves_with_what_is_read_and_only_then() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "env": {"B": "2", "A": "1"}}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[0].spec else { unreachable!() };
        let empty = BTreeMap::new();
        // A container that reads nothing has the same digest with and without file lines.
        let none = BTreeMap::new();
        assert_eq!(spec(&d, c, None, &none), spec(&d, c, Some(&empty), &none));
        let one = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:1".to_owned())]);
        let two = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:2".to_owned())]);
        assert_ne!(spec(&d, c, Some(&one), &none), spec(&d, c, Some(&two), &none));
        assert_ne!(spec(&d, c, Some(&one), &none), spec(&d, c, None, &none));
    }

    #[test]
    fn a_restart_on_file_carrying_a_secret_is_folded_in_by_its_keyed_digest() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "web.key", "path": "/etc/web.key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="},
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "restart-on": ["web.key"]}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[1].spec else { unreachable!() };
        let id = d.resources[0].id.clone();
        let keyed = |sum: u8| BTreeMap::from([(id.clone(), Digest::from_keyed([sum; 32]))]);
        // The same opened value, whatever its ciphertext: the same spec; another value, another.
        assert_eq!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &keyed(1)));
        assert_ne!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &keyed(2)));
        assert_ne!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &BTreeMap::new()));
    }

    #[test]
    fn a_restart_on_into_file_with_a_secret_moves_the_spec_only_when_the_value_moves() {
        let ring = std::sync::Arc::new(
            crate::secrets::Keyring::parse(&crate::secrets::Keyring::generate()).unwrap(),
        );
        let declared = |value: &[u8]| {
            let sealed = crate::secrets::seal(&ring.public_key(), value).unwrap();
            let text = serde_json::json!({"version": 1, "resources": [
                {"type": "file", "id": "web.env", "path": "/etc/web.env", "into": "env",
                 "content": "TOKEN=${secret:token}\n", "secrets": {"token": sealed}},
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "restart-on": ["web.env"]}]});
            Declaration::parse(text.to_string().as_bytes()).unwrap()
        };
        let spec_of = |d: &Declaration| {
            let Spec::Container(c) = &d.resources[1].spec else { unreachable!() };
            let keyed = keyed_with(d, c, &mut |_| Ok(std::sync::Arc::clone(&ring))).unwrap();
            assert!(keyed.values().all(Digest::is_keyed), "folded in by a keyed digest");
            spec(d, c, None, &keyed)
        };
        let (first, again, moved) = (declared(b"one"), declared(b"one"), declared(b"two"));
        assert_ne!(first.resources[0].digest, again.resources[0].digest, "another ciphertext");
        assert_eq!(spec_of(&first), spec_of(&again), "sealed again: the same spec");
        assert_ne!(spec_of(&first), spec_of(&moved), "a new value: another spec");
    }
}
