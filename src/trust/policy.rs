//! The trust policy (issue 44, point 4): TUF's root role in this project's terms. One signed
//! file names the fleet's keys, which of them may sign which scope with what threshold, and
//! which groups each node is in; it is installed on the node out of band (never taken from
//! etcd), and replaced only by a policy signed by a threshold of the old one's root keys and of
//! its own, at a higher version.
//!
//! Its body has one text per policy, as the manifest's does, so that it is signed and compared
//! as bytes and `render(parse(b)) == b`:
//!
//! ```text
//! mesh-host policy v1
//! fleet prod
//! version 3
//! issued 1764928800
//! expires 1796464800
//! key alice ssh-ed25519 AAAAC3Nz...
//! key root-1 ssh-ed25519 AAAAC3Nz...
//! role fleet 1 alice
//! role group:* 1 alice
//! role group:db 2 alice bob
//! role root 1 root-1
//! node db-1 db eu
//! node web-1 web
//! ```
//!
//! Keys, roles and nodes are sorted by name, each once; a role's keys sorted, each once; a
//! node's groups in the order it reads them, each once. A role is `root`, `fleet`, `local`,
//! `group:G`, `group:*`, `node:N` or `node:*`; the named one is taken before the `*` one. A
//! candidate is signed under the role of the scope it replaces (promote writes it there).
//!
//! The signed file is the body followed by its SSH signatures (armored, as `ssh-keygen -Y
//! sign -n mesh-host-policy@v1` writes them), one after the other: what is signed is the body's
//! exact bytes, everything before the first `-----BEGIN SSH SIGNATURE-----` line.

use std::fmt::Write as _;

use base64::Engine as _;

use super::manifest::name;
use super::signers::{AllowedSigners, Signer};
use super::sshsig::{PublicKey, Signature};
use super::Scope;

/// The namespace every policy signature is made in: a declaration's signature (another
/// namespace) can never count for a policy, nor the other way round.
pub const POLICY_NAMESPACE: &str = "mesh-host-policy@v1";

/// The largest signed policy read.
pub const POLICY_LIMIT: usize = 1 << 20;

const HEADER: &str = "mesh-host policy v1";
const BEGIN: &str = "-----BEGIN SSH SIGNATURE-----";
const END: &str = "-----END SSH SIGNATURE-----\n";

/// A key the policy names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// Its name in the policy (a name, as a node's).
    pub name: String,
    /// The key.
    pub key: PublicKey,
}

/// Who may sign a role's scopes: `threshold` distinct keys of `keys`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    /// `root`, `fleet`, `local`, `group:G`, `group:*`, `node:N` or `node:*`.
    pub name: String,
    /// How many distinct keys of `keys` must sign.
    pub threshold: usize,
    /// The keys' names, sorted.
    pub keys: Vec<String>,
}

/// A policy's body, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The fleet it is for (the manifests' fleet).
    pub fleet: String,
    /// Only ever goes up.
    pub version: u64,
    /// When it was made (seconds since the epoch).
    pub issued: u64,
    /// After when it is no longer taken when first seen.
    pub expires: u64,
    /// The keys, sorted by name.
    pub keys: Vec<Key>,
    /// The roles, sorted by name; `root` among them.
    pub roles: Vec<Role>,
    /// Each node and its groups (in the order it reads them), sorted by node.
    pub nodes: Vec<(String, Vec<String>)>,
}

impl Policy {
    /// Its one text.
    pub fn render(&self) -> String {
        let mut out = format!("{HEADER}\nfleet {}\nversion {}\n", self.fleet, self.version);
        let _ = write!(out, "issued {}\nexpires {}\n", self.issued, self.expires);
        for k in &self.keys {
            let b64 = base64::engine::general_purpose::STANDARD.encode(&k.key.blob);
            let _ = writeln!(out, "key {} {} {b64}", k.name, k.key.kind());
        }
        for r in &self.roles {
            let _ = writeln!(out, "role {} {} {}", r.name, r.threshold, r.keys.join(" "));
        }
        for (node, groups) in &self.nodes {
            let _ =
                writeln!(out, "node {node}{}", groups.iter().map(|g| format!(" {g}")).collect::<String>());
        }
        out
    }

    /// Reads a body, refusing anything but its one text, naming the line.
    pub fn parse(bytes: &[u8]) -> Result<Policy, String> {
        if bytes.len() > POLICY_LIMIT {
            return Err(format!("it is {} bytes, more than the {POLICY_LIMIT} a policy may be", bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8".to_owned())?;
        if !text.is_ascii() {
            return Err("it holds characters other than ASCII".into());
        }
        let body = text.strip_suffix('\n').ok_or("its last line does not end in a newline")?;
        let lines: Vec<&str> = body.split('\n').collect();
        let head = |i: usize, field: &str| -> Result<&str, String> {
            lines
                .get(i)
                .and_then(|l| l.strip_prefix(field))
                .and_then(|l| l.strip_prefix(' '))
                .ok_or_else(|| format!("line {} is not its {field} line", i + 1))
        };
        if lines[0] != HEADER {
            return Err(format!("it is not a mesh-host policy v1 (its first line is not {HEADER:?})"));
        }
        let fleet = head(1, "fleet")?;
        name(fleet).map_err(|e| format!("line 2: the fleet {e}"))?;
        let number = |i: usize, field: &str| -> Result<u64, String> {
            let t = head(i, field)?;
            let canonical =
                !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && (t == "0" || !t.starts_with('0'));
            t.parse()
                .ok()
                .filter(|_| canonical)
                .ok_or_else(|| format!("line {}: {t:?} is not a number", i + 1))
        };
        let (version, issued, expires) = (number(2, "version")?, number(3, "issued")?, number(4, "expires")?);
        let mut draft = Draft::default();
        for (i, line) in lines.iter().enumerate().skip(5) {
            draft.line(line, false).map_err(|e| format!("line {}: {e}", i + 1))?;
        }
        let policy = draft.policy(fleet, version, issued, expires)?;
        if policy.render() != text {
            return Err("its lines are not in their one order (keys, then roles, then nodes, each sorted by name; a role's keys sorted)".into());
        }
        Ok(policy)
    }

    /// A policy from a draft: `key`, `role` and `node` lines in any order (a key line may end
    /// in a comment, as a `.pub` file's does), `#` comments and blank lines; sorted and
    /// checked as `parse` checks them.
    pub fn from_draft(
        text: &str,
        fleet: &str,
        version: u64,
        issued: u64,
        expires: u64,
    ) -> Result<Policy, String> {
        name(fleet).map_err(|e| format!("the fleet {e}"))?;
        let mut draft = Draft::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            draft.line(line, true).map_err(|e| format!("line {}: {e}", i + 1))?;
        }
        draft.keys.sort_by(|a, b| a.name.cmp(&b.name));
        draft.roles.sort_by(|a, b| a.name.cmp(&b.name));
        draft.nodes.sort_by(|a, b| a.0.cmp(&b.0));
        for r in &mut draft.roles {
            r.keys.sort();
        }
        let policy = draft.policy(fleet, version, issued, expires)?;
        Policy::parse(policy.render().as_bytes()).map_err(|e| format!("the policy would not read back: {e}"))
    }

    /// The role whose keys sign `scope`: the named one before the `*` one; a candidate's is
    /// the role of the scope it replaces.
    pub fn role_for(&self, scope: &Scope) -> Option<&Role> {
        let named = |name: String| self.roles.iter().find(|r| r.name == name);
        match scope {
            Scope::Fleet => named("fleet".into()),
            Scope::Local => named("local".into()),
            Scope::Group(g) => named(format!("group:{g}")).or_else(|| named("group:*".into())),
            Scope::Node(n) => named(format!("node:{n}")).or_else(|| named("node:*".into())),
            Scope::Candidate { replaces, .. } => self.role_for(replaces),
        }
    }

    /// The root role (`parse` refuses a policy without one).
    pub fn root(&self) -> &Role {
        self.roles.iter().find(|r| r.name == "root").expect("a parsed policy has a root role")
    }

    /// The groups `node` is in; `None`: the policy does not name it.
    pub fn groups_of(&self, node: &str) -> Option<&[String]> {
        self.nodes.iter().find(|(n, _)| n == node).map(|(_, g)| g.as_slice())
    }

    /// The groups a node run as `node` with `--group given` reads: the policy's. `given` empty
    /// takes them; `given` other than them is refused (a unit file that says otherwise is a
    /// mistake or a node choosing its own groups, to be said rather than overruled silently).
    pub fn bound_groups(&self, node: &str, given: &[String]) -> Result<Vec<String>, String> {
        let bound = self.groups_of(node).unwrap_or_default();
        if given.is_empty() || given == bound {
            return Ok(bound.to_vec());
        }
        let said =
            if bound.is_empty() { "no group".to_owned() } else { format!("groups {}", bound.join(",")) };
        Err(format!(
            "--group {} is not what policy version {} binds node {node} to ({said}): a node's groups come from the signed policy; drop --group, or rotate the policy to bind it",
            given.join(","),
            self.version
        ))
    }

    /// Whether the keys that signed a manifest for `scope` (`signed`, one per signature, as the
    /// operator's tools made them) meet the threshold of the scope's role, as a node will judge
    /// it: `Ok` the names of the distinct keys that count; `Err` names the scope, the role, its
    /// threshold and keys, those that count, and each key given that does not.
    pub fn meets(&self, scope: &Scope, signed: &[PublicKey]) -> Result<Vec<String>, String> {
        let Some(role) = self.role_for(scope) else {
            return Err(format!(
                "policy version {} has no role for the {scope} declaration: no key may sign it (a role fleet, local, group:G, group:*, node:N or node:* covers it)",
                self.version
            ));
        };
        let mut counted: Vec<String> = Vec::new();
        let mut not: Vec<String> = Vec::new();
        for key in signed {
            let said = format!("{} key {}", key.kind(), key.fingerprint());
            match self.keys.iter().find(|k| k.key == *key) {
                Some(k) if role.keys.contains(&k.name) => {
                    if !counted.contains(&k.name) {
                        counted.push(k.name.clone());
                    }
                }
                Some(k) => not.push(format!("{} ({said}) is not one of its keys", k.name)),
                None => not.push(format!("{said} is no key of the policy")),
            }
        }
        if counted.len() >= role.threshold {
            return Ok(counted);
        }
        let mut m = format!(
            "the {scope} declaration is signed under role {} of policy version {}, which needs {} distinct key(s) of: {}; the keys given make {} ({})",
            role.name,
            self.version,
            role.threshold,
            role.keys.join(", "),
            counted.len(),
            if counted.is_empty() { "none count".to_owned() } else { counted.join(", ") },
        );
        for n in not {
            m.push_str("; ");
            m.push_str(&n);
        }
        Err(m)
    }

    /// The role's keys as signers, named by their names in the policy.
    pub fn signers(&self, role: &Role) -> AllowedSigners {
        let keys = self.keys.iter().filter(|k| role.keys.contains(&k.name));
        AllowedSigners::from_signers(
            keys.map(|k| Signer { principals: k.name.clone(), key: k.key.clone() }).collect(),
        )
    }

    /// Every key the policy names, as signers (to name a key that signed outside its role).
    pub fn all_signers(&self) -> AllowedSigners {
        let keys = self.keys.iter().map(|k| Signer { principals: k.name.clone(), key: k.key.clone() });
        AllowedSigners::from_signers(keys.collect())
    }
}

/// Key, role and node lines read, before they are checked together.
#[derive(Default)]
struct Draft {
    keys: Vec<Key>,
    roles: Vec<Role>,
    nodes: Vec<(String, Vec<String>)>,
}

impl Draft {
    /// One line; `lenient`: a key line may carry a comment after its key.
    fn line(&mut self, line: &str, lenient: bool) -> Result<(), String> {
        let words: Vec<&str> =
            if lenient { line.split_whitespace().collect() } else { line.split(' ').collect() };
        match words.as_slice() {
            ["key", key_name, kind, b64, rest @ ..] if lenient || rest.is_empty() => {
                name(key_name).map_err(|e| format!("the key name {e}"))?;
                let blob = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| format!("the key {key_name} is not base64: {e}"))?;
                let key = PublicKey::from_blob(&blob).map_err(|e| format!("the key {key_name}: {e}"))?;
                if key.kind() != *kind {
                    return Err(format!("the key {key_name} says {kind} but is {}", key.kind()));
                }
                self.keys.push(Key { name: (*key_name).to_owned(), key });
            }
            ["role", role, threshold, keys @ ..] => {
                role_name(role)?;
                let t = threshold
                    .parse::<usize>()
                    .ok()
                    .filter(|t| *t >= 1 && threshold.bytes().all(|b| b.is_ascii_digit()) && !threshold.starts_with('0'))
                    .ok_or_else(|| format!("the threshold of role {role} is {threshold:?}, not a number from 1"))?;
                let keys = keys.iter().map(|k| (*k).to_owned()).collect();
                self.roles.push(Role { name: (*role).to_owned(), threshold: t, keys });
            }
            ["node", node, groups @ ..] => {
                name(node).map_err(|e| format!("the node {e}"))?;
                for g in groups {
                    name(g).map_err(|e| format!("node {node}'s group {e}"))?;
                }
                if let Some(g) = groups.iter().enumerate().find_map(|(i, g)| groups[..i].contains(g).then_some(g)) {
                    return Err(format!("node {node} names group {g} twice"));
                }
                self.nodes.push(((*node).to_owned(), groups.iter().map(|g| (*g).to_owned()).collect()));
            }
            _ => return Err("it is not a key, role or node line (key NAME TYPE BASE64, role NAME THRESHOLD KEY..., node NAME GROUP...)".into()),
        }
        Ok(())
    }

    /// The policy, once its lines hold together: names each once, in order, the root role
    /// there, each role's keys known, each once, and at least its threshold of them, no key
    /// under two names.
    fn policy(self, fleet: &str, version: u64, issued: u64, expires: u64) -> Result<Policy, String> {
        if expires <= issued {
            return Err(format!("it expires ({expires}) no later than it was issued ({issued})"));
        }
        sorted("key", self.keys.iter().map(|k| k.name.as_str()))?;
        sorted("role", self.roles.iter().map(|r| r.name.as_str()))?;
        sorted("node", self.nodes.iter().map(|(n, _)| n.as_str()))?;
        if let Some((i, k)) =
            self.keys.iter().enumerate().find(|(i, k)| self.keys[..*i].iter().any(|o| o.key == k.key))
        {
            let other =
                self.keys[..i].iter().find(|o| o.key == k.key).map(|o| o.name.as_str()).unwrap_or_default();
            return Err(format!(
                "key {} is key {other} again: a key is named once, so that a threshold counts distinct keys",
                k.name
            ));
        }
        for r in &self.roles {
            sorted(&format!("role {}'s key", r.name), r.keys.iter().map(String::as_str))?;
            if let Some(unknown) = r.keys.iter().find(|k| !self.keys.iter().any(|key| &key.name == *k)) {
                return Err(format!("role {} names key {unknown}, which no key line names", r.name));
            }
            if r.threshold > r.keys.len() {
                return Err(format!(
                    "role {} needs {} signatures of its {} key(s): it could never be met",
                    r.name,
                    r.threshold,
                    r.keys.len()
                ));
            }
        }
        if !self.roles.iter().any(|r| r.name == "root") {
            return Err(
                "it has no root role (role root THRESHOLD KEY...): who may sign the next policy".into()
            );
        }
        let (keys, roles, nodes) = (self.keys, self.roles, self.nodes);
        Ok(Policy { fleet: fleet.to_owned(), version, issued, expires, keys, roles, nodes })
    }
}

/// Names in strictly increasing order (sorted, each once); `Err` names the first out of place.
fn sorted<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut last: Option<&str> = None;
    for n in names {
        if last.is_some_and(|l| l >= n) {
            return Err(format!(
                "{what} {n} is not after {what} {} (sorted by name, each once)",
                last.unwrap_or_default()
            ));
        }
        last = Some(n);
    }
    Ok(())
}

fn role_name(role: &str) -> Result<(), String> {
    let ok = match role.split_once(':') {
        None => matches!(role, "root" | "fleet" | "local"),
        Some(("group" | "node", "*")) => true,
        Some(("group" | "node", n)) => name(n).is_ok(),
        Some(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("role {role:?} is not one of: root, fleet, local, group:G, group:*, node:N, node:*"))
    }
}

/// The signed file cut into its body and its armored signatures; `Err` when anything else is
/// there.
pub fn split(bytes: &[u8]) -> Result<(&[u8], Vec<&[u8]>), String> {
    if bytes.len() > POLICY_LIMIT {
        return Err(format!("it is {} bytes, more than the {POLICY_LIMIT} a policy may be", bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8".to_owned())?;
    let at = |from: usize| text[from..].find(&format!("\n{BEGIN}\n")).map(|i| from + i + 1);
    let Some(mut start) = at(0) else { return Ok((bytes, Vec::new())) };
    let body = &bytes[..start];
    let mut sigs = Vec::new();
    while start < text.len() {
        let end = text[start..]
            .find(END)
            .map(|i| start + i + END.len())
            .filter(|_| text[start..].starts_with(BEGIN))
            .ok_or("what follows its body is not SSH signatures, one after the other")?;
        sigs.push(&bytes[start..end]);
        start = end;
    }
    Ok((body, sigs))
}

/// The signed file: the body, then each armored signature.
pub fn join(body: &[u8], signatures: &[Vec<u8>]) -> Vec<u8> {
    let mut out = body.to_vec();
    for s in signatures {
        out.extend_from_slice(s);
    }
    out
}

/// A policy whose signatures verified, and who signed it (by names in the policy).
#[derive(Clone, Debug)]
pub struct Verified {
    /// The policy.
    pub policy: Policy,
    /// The names of the distinct root keys (its own) that signed it.
    pub signed_by: Vec<String>,
}

/// The distinct keys of `role` (in `policy`) whose signatures verify over `body`; `Err` says
/// why too few did, signature by signature.
fn count(
    policy: &Policy,
    role: &Role,
    body: &[u8],
    sigs: &[&[u8]],
    whose: &str,
) -> Result<Vec<String>, String> {
    let mut by: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    for (i, armored) in sigs.iter().enumerate() {
        let sig = match Signature::from_armored(armored)
            .and_then(|s| s.verify(POLICY_NAMESPACE, body).map(|()| s))
        {
            Ok(sig) => sig,
            Err(e) => {
                notes.push(format!("signature {}: {e}", i + 1));
                continue;
            }
        };
        match policy.keys.iter().find(|k| k.key == sig.key && role.keys.contains(&k.name)) {
            Some(k) if by.contains(&k.name) => {
                notes.push(format!("signature {}: {} signed already", i + 1, k.name))
            }
            Some(k) => by.push(k.name.clone()),
            None => notes.push(format!(
                "signature {}: by {} key {}, not one of {whose} root keys",
                i + 1,
                sig.key.kind(),
                sig.key.fingerprint()
            )),
        }
    }
    if by.len() >= role.threshold {
        return Ok(by);
    }
    let mut m = format!(
        "it is signed by {} of {whose} root keys ({}), and {} are required ({})",
        by.len(),
        if by.is_empty() { "none".to_owned() } else { by.join(", ") },
        role.threshold,
        role.keys.join(", ")
    );
    for n in notes {
        m.push_str("; ");
        m.push_str(&n);
    }
    Err(m)
}

/// A first policy: parsed, signed by a threshold of its own root keys, and (with `now`) not
/// expired. `now` is `None` for a policy already pinned, whose expiry was judged when first
/// taken.
pub fn verify_root(bytes: &[u8], now: Option<u64>) -> Result<Verified, String> {
    let (body, sigs) = split(bytes)?;
    let policy = Policy::parse(body)?;
    let signed_by = count(&policy, policy.root(), body, &sigs, "its own")?;
    if let Some(now) = now.filter(|now| *now >= policy.expires) {
        return Err(format!(
            "policy version {} expired at {} (seconds since the epoch; it is now {now}): make and sign a new one",
            policy.version, policy.expires
        ));
    }
    Ok(Verified { policy, signed_by })
}

/// A new policy taking the place of `old`: signed by a threshold of `old`'s root keys and of
/// its own, for the same fleet, at a higher version, not expired (TUF's root rotation).
pub fn verify_rotation(old: &Policy, bytes: &[u8], now: u64) -> Result<Verified, String> {
    let (body, sigs) = split(bytes)?;
    let new = Policy::parse(body)?;
    if new.fleet != old.fleet {
        return Err(format!(
            "it is for fleet {}, and the policy in force for fleet {}",
            new.fleet, old.fleet
        ));
    }
    if new.version <= old.version {
        return Err(format!(
            "its version {} is not above version {}, the policy in force: a policy only goes forward",
            new.version, old.version
        ));
    }
    count(old, old.root(), body, &sigs, &format!("the old policy's (version {})", old.version))?;
    verify_root(bytes, Some(now)).map_err(|e| format!("signed by the old root keys, but as itself: {e}"))
}

/// What the node does with the policy it is given (`given`, its `--trust-policy` file) and the
/// one it pinned (`pinned`, kept in its state directory): the same bytes are taken as they are;
/// none pinned, a first policy (installed out of band); a higher version, a rotation of the
/// pinned one. Anything else is refused: a policy never goes back. `Ok((verified, pin))`: pin
/// says the given one must be pinned (durably) before it is used.
pub fn adopt(pinned: Option<&[u8]>, given: &[u8], now: u64) -> Result<(Verified, bool), String> {
    let Some(pinned) = pinned else { return verify_root(given, Some(now)).map(|v| (v, true)) };
    let old = verify_root(pinned, None).map_err(|e| format!("the pinned policy does not verify ({e})"))?;
    if pinned == given {
        return Ok((old, false));
    }
    let new = Policy::parse(split(given)?.0)?;
    if new.version <= old.policy.version {
        return Err(format!(
            "it is version {}, and version {} is pinned here: a policy never goes back (install the pinned one, or a rotation above it)",
            new.version, old.policy.version
        ));
    }
    verify_rotation(&old.policy, given, now).map(|v| (v, true))
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
