//! The web configuration file of `/metrics` and `/healthz` (`run --web-config`): TLS, client
//! certificates and basic auth, in the format of the Prometheus exporter toolkit, so the file
//! node_exporter takes with `--web.config.file` works here as it is (issue 45, point 6).
//!
//! What is taken: `tls_server_config` with `cert_file`, `key_file`, `client_auth_type`
//! (`NoClientCert`, `RequireAndVerifyClientCert`, `VerifyClientCertIfGiven`), `client_ca_file`
//! and `min_version` (`TLS12`, `TLS13`); `basic_auth_users`, a user to a bcrypt hash. Any other
//! field is refused by name, as the toolkit refuses an unknown one, rather than ignored: a
//! `cipher_suites` or `RequestClientCert` the agent would not honour must not look honoured.
//!
//! The file is read at start, where a mistake stops the agent naming the file and the field,
//! and again at each connection, as the toolkit does: a certificate renewed in place, or a
//! user added, needs no restart. A file broken later drops connections and says so in the log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The most a web configuration file or one of its PEM files may hold.
const FILE_LIMIT: u64 = 1 << 20;

/// The file as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: ClientAuth,
    client_ca_file: Option<PathBuf>,
    min_version: Option<MinVersion>,
}

/// Whether a client must show a certificate, the toolkit's words for the three it can keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
enum ClientAuth {
    #[default]
    NoClientCert,
    RequireAndVerifyClientCert,
    VerifyClientCertIfGiven,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
enum MinVersion {
    TLS12,
    TLS13,
}

/// A web configuration, read and checked: what the server needs for one connection.
pub struct WebConfig {
    /// The TLS acceptor, when the file asks for TLS.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Whether a client's certificate, verified, is asked for: one shown is then a login.
    pub client_certificates: bool,
    /// Users and their bcrypt hashes; none asks for no basic auth.
    pub users: BTreeMap<String, String>,
}

/// The file's path, read again at each connection.
#[derive(Clone, Debug)]
pub struct WebConfigFile(Arc<Path>);

impl WebConfigFile {
    /// Reads and checks the file once, so a mistake is refused at start.
    pub fn open(path: &Path) -> Result<WebConfigFile, String> {
        load(path)?;
        Ok(WebConfigFile(Arc::from(path)))
    }

    /// The file as it is now.
    pub fn load(&self) -> Result<WebConfig, String> {
        load(&self.0)
    }
}

/// Reads, checks and builds the configuration at `path`; the error names the file and field.
fn load(path: &Path) -> Result<WebConfig, String> {
    let at = path.display();
    let bytes = crate::system::read_input(path, FILE_LIMIT)
        .map_err(|e| format!("--web-config {at}: cannot read it: {e}"))?;
    let file: File = if bytes.iter().all(u8::is_ascii_whitespace) {
        File::default()
    } else {
        serde_norway::from_slice(&bytes).map_err(|e| format!("--web-config {at}: {e}"))?
    };
    for (user, hash) in &file.basic_auth_users {
        // Checked with a password nobody has: a hash that cannot be read fails here, not at
        // the first scrape.
        bcrypt::verify("", hash).map_err(|e| {
            format!("--web-config {at}: basic_auth_users.{user} is not a bcrypt hash (htpasswd -nB makes one): {e}")
        })?;
    }
    let (tls, client_certificates) = match &file.tls_server_config {
        None => (None, false),
        Some(t) => {
            let acceptor = acceptor(t).map_err(|e| format!("--web-config {at}: tls_server_config.{e}"))?;
            (Some(acceptor), t.client_auth_type != ClientAuth::NoClientCert)
        }
    };
    Ok(WebConfig { tls, client_certificates, users: file.basic_auth_users })
}

/// The TLS acceptor a `tls_server_config` describes; the error begins with the field's name.
fn acceptor(t: &TlsFile) -> Result<tokio_rustls::TlsAcceptor, String> {
    let cert = t.cert_file.as_deref().ok_or("cert_file: missing (key_file needs it)")?;
    let key = t.key_file.as_deref().ok_or("key_file: missing (cert_file needs it)")?;
    let chain = certificates(cert).map_err(|e| format!("cert_file: {e}"))?;
    let key = private_key(key).map_err(|e| format!("key_file: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match t.min_version {
        Some(MinVersion::TLS13) => &[&rustls::version::TLS13],
        Some(MinVersion::TLS12) | None => &[&rustls::version::TLS12, &rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .map_err(|e| format!("min_version: {e}"))?;
    let builder = match (t.client_auth_type, t.client_ca_file.as_deref()) {
        (ClientAuth::NoClientCert, None) => builder.with_no_client_auth(),
        (ClientAuth::NoClientCert, Some(_)) => {
            return Err(
                "client_ca_file: given with client_auth_type NoClientCert, which would ignore it".into()
            )
        }
        (_, None) => {
            return Err("client_ca_file: missing, and the client_auth_type asks for certificates".into())
        }
        (how, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca).map_err(|e| format!("client_ca_file: {e}"))? {
                roots.add(c).map_err(|e| format!("client_ca_file: {e}"))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if how == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("client_ca_file: {e}"))?)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("key_file: does not match cert_file: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Every certificate in a PEM file, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = crate::system::read_input(path, FILE_LIMIT)
        .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate (-----BEGIN CERTIFICATE-----) in it", path.display()));
    }
    Ok(certs)
}

/// The server's private key, refused when anyone but its owner can read it, as the agent's
/// other keys are. Its bytes are never in a message.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    use secrecy::ExposeSecret as _;
    let text = match crate::system::keys::read(path) {
        Ok(Some(text)) => text,
        Ok(None) => return Err(format!("{}: no such file", path.display())),
        Err(e) => return Err(format!("{e} (`chmod 600` it)")),
    };
    PrivateKeyDer::from_pem_slice(text.expose_secret().as_bytes())
        .map_err(|e| format!("{}: no PEM private key (PKCS#8, RSA or EC) in it: {e}", path.display()))
}

/// The hash of a password nobody has, at the toolkit's usual cost, checked for unknown users.
const NOBODY: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// Whether the `Authorization` header's basic credentials name a user of `users` with their
/// password. An unknown user is checked against a hash all the same, so the time taken does
/// not tell which users exist.
pub fn basic_auth_ok(users: &BTreeMap<String, String>, authorization: Option<&str>) -> bool {
    use base64::Engine as _;
    let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else { return false };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else { return false };
    let Some((user, password)) = std::str::from_utf8(&decoded).ok().and_then(|t| t.split_once(':')) else {
        return false;
    };
    match users.get(user) {
        Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
        None => {
            let _ = bcrypt::verify(password, NOBODY);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_takes_the_right_password_only() {
        let hash =
            bcrypt::hash_with_salt("pw", 4, [7; 16]).unwrap().format_for_version(bcrypt::Version::TwoY);
        let users = BTreeMap::from([("prom".to_owned(), hash)]);
        let header = |s: &str| {
            use base64::Engine as _;
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s))
        };
        assert!(basic_auth_ok(&users, Some(&header("prom:pw"))));
        assert!(!basic_auth_ok(&users, Some(&header("prom:wrong"))));
        assert!(!basic_auth_ok(&users, Some(&header("other:pw"))));
        assert!(!basic_auth_ok(&users, None));
        assert!(!basic_auth_ok(&users, Some("Bearer x")));
        assert!(bcrypt::verify("x", NOBODY).is_ok(), "the stand-in hash is a hash");
    }
}
