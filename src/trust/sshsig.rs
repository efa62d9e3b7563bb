//! SSH signatures (the SSHSIG format `ssh-keygen -Y sign` writes, OpenSSH's PROTOCOL.sshsig),
//! verified in-tree over `ring`'s Ed25519: the armored blob, its magic, version, namespace and
//! hash algorithm, the key inside it, and the signature over the signed data. Two key types
//! only: `ssh-ed25519` and the FIDO `sk-ssh-ed25519@openssh.com`, whose signature covers
//! `sha256(application) || flags || counter || sha256(signed data)` and must carry the
//! user-presence flag. RSA and ECDSA are refused by name: a root agent's trust is kept to one
//! small, malleability-free algorithm (docs/dependencies.md, "ring for SSH signatures").
//!
//! Nothing here reads a file or a clock: bytes in, a verdict out.

use base64::Engine as _;
use sha2::Digest as _;

/// The namespace every declaration signature is made in (`ssh-keygen -Y sign -n ...`): a
/// signature made for anything else (a git commit, `file`) cannot be replayed as one, and
/// `@v1` leaves room for a later manifest format to be kept apart the same way.
pub const NAMESPACE: &str = "mesh-host-declaration@v1";

/// The largest armored signature read: an Ed25519 one is about 300 bytes.
pub const SIGNATURE_LIMIT: usize = 16 * 1024;

const ED25519: &str = "ssh-ed25519";
const SK_ED25519: &str = "sk-ssh-ed25519@openssh.com";
const BEGIN: &str = "-----BEGIN SSH SIGNATURE-----";
const END: &str = "-----END SSH SIGNATURE-----";
/// The FIDO flag that says the user touched the key.
const USER_PRESENT: u8 = 0x01;

/// A public key of one of the two types verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    /// The key's SSH wire encoding: what identifies it (two keys are the same key when these
    /// bytes are), and what its fingerprint is taken of.
    pub blob: Vec<u8>,
    kind: KeyKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum KeyKind {
    Ed25519([u8; 32]),
    SkEd25519 { key: [u8; 32], application: Vec<u8> },
}

impl PublicKey {
    /// Reads a key from its wire encoding (the base64 of an `allowed_signers` or `.pub` line,
    /// decoded, or the key inside a signature).
    pub fn from_blob(blob: &[u8]) -> Result<PublicKey, String> {
        let mut r = Reader(blob);
        let kind = r.string()?;
        let key = |k: &[u8]| -> Result<[u8; 32], String> {
            k.try_into().map_err(|_| format!("the Ed25519 key is {} bytes, not 32", k.len()))
        };
        let kind = match kind {
            k if k == ED25519.as_bytes() => KeyKind::Ed25519(key(r.string()?)?),
            k if k == SK_ED25519.as_bytes() => {
                let k = key(r.string()?)?;
                KeyKind::SkEd25519 { key: k, application: r.string()?.to_vec() }
            }
            other => return Err(unsupported(other)),
        };
        r.end("the public key")?;
        Ok(PublicKey { blob: blob.to_vec(), kind })
    }

    /// The key's type, as OpenSSH names it.
    pub fn kind(&self) -> &'static str {
        match self.kind {
            KeyKind::Ed25519(_) => ED25519,
            KeyKind::SkEd25519 { .. } => SK_ED25519,
        }
    }

    /// `SHA256:...`, as `ssh-keygen -l` prints it: how a key is named in a message.
    pub fn fingerprint(&self) -> String {
        let digest = sha2::Sha256::digest(&self.blob);
        format!("SHA256:{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
    }
}

/// Why a key type is not verified, named.
fn unsupported(kind: &[u8]) -> String {
    format!(
        "key type {} is not verified by mesh-host: only {ED25519} and {SK_ED25519} keys sign declarations",
        String::from_utf8_lossy(kind).escape_debug()
    )
}

/// A signature read from its armor, not yet verified.
#[derive(Clone, Debug)]
pub struct Signature {
    /// The key that says it made it (verified against, and only then trusted).
    pub key: PublicKey,
    namespace: Vec<u8>,
    reserved: Vec<u8>,
    hash: Hash,
    /// The signature's bytes, and for a FIDO key its flags and counter.
    signed: Signed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    fn name(self) -> &'static str {
        match self {
            Hash::Sha256 => "sha256",
            Hash::Sha512 => "sha512",
        }
    }

    fn digest(self, message: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => sha2::Sha256::digest(message).to_vec(),
            Hash::Sha512 => sha2::Sha512::digest(message).to_vec(),
        }
    }
}

#[derive(Clone, Debug)]
struct Signed {
    bytes: Vec<u8>,
    /// The FIDO flags and counter; `None` for a plain Ed25519 signature.
    sk: Option<(u8, u32)>,
}

impl Signature {
    /// Reads an armored signature (`-----BEGIN SSH SIGNATURE-----`, base64 lines, `-----END
    /// SSH SIGNATURE-----`), checking its magic and version and that it names a key of a type
    /// verified here. Nothing is verified yet.
    pub fn from_armored(text: &[u8]) -> Result<Signature, String> {
        if text.len() > SIGNATURE_LIMIT {
            return Err(format!(
                "it is {} bytes, more than the {SIGNATURE_LIMIT} a signature may be",
                text.len()
            ));
        }
        let text = std::str::from_utf8(text).map_err(|_| "it is not text".to_owned())?;
        let mut lines = text.lines().map(str::trim_end).filter(|l| !l.is_empty());
        if lines.next() != Some(BEGIN) {
            return Err(format!("it does not begin with {BEGIN}"));
        }
        let mut body = String::new();
        let mut ended = false;
        for line in lines.by_ref() {
            if line == END {
                ended = true;
                break;
            }
            body.push_str(line);
        }
        if !ended || lines.next().is_some() {
            return Err(format!("it does not end with {END}"));
        }
        let blob = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|e| format!("its armor is not base64: {e}"))?;
        Signature::from_blob(&blob)
    }

    /// Reads a signature from its binary form (the armor's content).
    pub fn from_blob(blob: &[u8]) -> Result<Signature, String> {
        let mut r = Reader(blob);
        if r.take(6)? != b"SSHSIG" {
            return Err("it is not an SSH signature (no SSHSIG magic)".into());
        }
        let version = r.u32()?;
        if version != 1 {
            return Err(format!("SSH signature version {version} is not known (1 is)"));
        }
        let key = PublicKey::from_blob(r.string()?)?;
        let namespace = r.string()?.to_vec();
        let reserved = r.string()?.to_vec();
        let hash = match r.string()? {
            b"sha512" => Hash::Sha512,
            b"sha256" => Hash::Sha256,
            other => {
                return Err(format!(
                    "hash algorithm {} is not sha512 or sha256",
                    String::from_utf8_lossy(other).escape_debug()
                ))
            }
        };
        let mut s = Reader(r.string()?);
        r.end("the signature")?;
        let kind = s.string()?.to_vec();
        let bytes = s.string()?.to_vec();
        let sk = if kind == SK_ED25519.as_bytes() { Some((s.byte()?, s.u32()?)) } else { None };
        s.end("the signature's body")?;
        if kind != key.kind().as_bytes() {
            return Err(format!(
                "the signature is of type {} but its key is {}",
                String::from_utf8_lossy(&kind).escape_debug(),
                key.kind()
            ));
        }
        Ok(Signature { key, namespace, reserved, hash, signed: Signed { bytes, sk } })
    }

    /// The namespace it was made in, as text for a message.
    pub fn namespace(&self) -> String {
        String::from_utf8_lossy(&self.namespace).escape_debug().to_string()
    }

    /// Verifies it over `message` in `namespace`: the namespace first (a signature made for
    /// anything else is refused before any arithmetic), then the signature by its own key.
    /// Whether that key is trusted is the caller's question.
    pub fn verify(&self, namespace: &str, message: &[u8]) -> Result<(), String> {
        if self.namespace != namespace.as_bytes() {
            return Err(format!("it was made in namespace \"{}\", not \"{namespace}\"", self.namespace()));
        }
        let data = signed_data(&self.namespace, &self.reserved, self.hash, message);
        let (key, data) = match (&self.key.kind, self.signed.sk) {
            (KeyKind::Ed25519(key), None) => (key, data),
            (KeyKind::SkEd25519 { key, application }, Some((flags, counter))) => {
                if flags & USER_PRESENT == 0 {
                    return Err("the FIDO key did not see the user's presence (no touch): refused".into());
                }
                (key, sk_signed_data(application, flags, counter, &data))
            }
            (KeyKind::Ed25519(_), Some(_)) | (KeyKind::SkEd25519 { .. }, None) => {
                return Err("the signature's type does not match its key".into())
            }
        };
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
            .verify(&data, &self.signed.bytes)
            .map_err(|_| "the signature does not verify: the manifest is not what was signed".into())
    }
}

/// What an SSH signature signs: the magic, the namespace, the reserved field, the hash's name
/// and the hash of the message (PROTOCOL.sshsig).
fn signed_data(namespace: &[u8], reserved: &[u8], hash: Hash, message: &[u8]) -> Vec<u8> {
    let mut out = b"SSHSIG".to_vec();
    put_string(&mut out, namespace);
    put_string(&mut out, reserved);
    put_string(&mut out, hash.name().as_bytes());
    put_string(&mut out, &hash.digest(message));
    out
}

/// What a FIDO authenticator signs for `sk-ssh-ed25519@openssh.com`: the application's and the
/// data's SHA-256, around the flags and the counter.
fn sk_signed_data(application: &[u8], flags: u8, counter: u32, data: &[u8]) -> Vec<u8> {
    let mut out = sha2::Sha256::digest(application).to_vec();
    out.push(flags);
    out.extend_from_slice(&counter.to_be_bytes());
    out.extend_from_slice(&sha2::Sha256::digest(data));
    out
}

/// Appends an SSH `string`: a big-endian u32 length, then the bytes.
pub fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Reads SSH wire types, every length checked against what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("it is cut short".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn end(&self, what: &str) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{what} has {} bytes after its end", self.0.len()))
        }
    }
}

/// What a test needs to make signatures of its own (the FIDO path, which no hardware here
/// can sign): the wire encodings, from a raw Ed25519 public key.
#[cfg(test)]
pub(crate) mod make {
    use super::*;

    /// An armored SSHSIG over `message` in `namespace` by `pair`: a plain `ssh-ed25519`
    /// signature when `sk` is `None`, else one by a FIDO key of that application with those
    /// flags, its authenticator played by the ring key pair (the signed data laid out as
    /// PROTOCOL.u2f says an authenticator signs it). SHA-512, as ssh-keygen hashes.
    pub fn signature(
        pair: &ring::signature::Ed25519KeyPair,
        sk: Option<(&[u8], u8)>,
        namespace: &str,
        message: &[u8],
    ) -> String {
        use ring::signature::KeyPair as _;
        let key = key_blob(pair.public_key().as_ref(), sk.map(|(app, _)| app));
        let data = signed_data(namespace.as_bytes(), b"", Hash::Sha512, message);
        let mut body = Vec::new();
        match sk {
            None => {
                put_string(&mut body, ED25519.as_bytes());
                put_string(&mut body, pair.sign(&data).as_ref());
            }
            Some((application, flags)) => {
                let counter = 7;
                put_string(&mut body, SK_ED25519.as_bytes());
                put_string(
                    &mut body,
                    pair.sign(&sk_signed_data(application, flags, counter, &data)).as_ref(),
                );
                body.push(flags);
                body.extend_from_slice(&counter.to_be_bytes());
            }
        }
        let mut blob = b"SSHSIG".to_vec();
        blob.extend_from_slice(&1u32.to_be_bytes());
        put_string(&mut blob, &key);
        put_string(&mut blob, namespace.as_bytes());
        put_string(&mut blob, b"");
        put_string(&mut blob, b"sha512");
        put_string(&mut blob, &body);
        armor(&blob)
    }

    /// The wire encoding of an Ed25519 key, or of a FIDO one of `application`.
    pub fn key_blob(key: &[u8], application: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        put_string(&mut out, if application.is_some() { SK_ED25519 } else { ED25519 }.as_bytes());
        put_string(&mut out, key);
        if let Some(app) = application {
            put_string(&mut out, app);
        }
        out
    }

    /// An `allowed_signers` line for that key.
    pub fn signer_line(principal: &str, key: &[u8], application: Option<&[u8]>) -> String {
        let blob = key_blob(key, application);
        let kind = if application.is_some() { SK_ED25519 } else { ED25519 };
        format!("{principal} {kind} {}\n", base64::engine::general_purpose::STANDARD.encode(blob))
    }

    /// The armor `ssh-keygen` writes around a signature blob.
    pub fn armor(blob: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(blob);
        let lines: Vec<&str> =
            b64.as_bytes().chunks(70).map(|c| std::str::from_utf8(c).expect("base64 is ASCII")).collect();
        format!("{BEGIN}\n{}\n{END}\n", lines.join("\n"))
    }
}
