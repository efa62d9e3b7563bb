//! A small etcd v3 client over etcd's JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/watch`):
//! the few calls the fleet needs, on the hyper client bollard already brings in.
//!
//! Why not the `etcd-client` crate: it brings tonic, prost and a build script that needs
//! `protoc`, a heavy build on the two shared cores the project builds on, for four calls that
//! the gateway every etcd since 3.3 serves answers just as well. docs/dependencies.md says more.
//!
//! The gateway speaks proto3 JSON: keys and values are base64, 64-bit numbers are strings, and a
//! field at its zero value is left out. Streamed answers (a watch) are a sequence of JSON
//! documents, each `{"result": ...}` or `{"error": ...}`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{json, Value};

/// How long one unary call (a read, a transaction) may take before the next endpoint is tried.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read from etcd: its own default request limit is 1.5 MiB per value, and a
/// range holds a node's whole declaration.
const ANSWER_LIMIT: usize = 512 << 20;

/// The largest certificate file read: a CA bundle of a few hundred certificates fits.
const PEM_LIMIT: u64 = 1 << 20;

/// Why etcd could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint answered.
    #[error("{endpoints}: {message}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// Why none answered.
        message: String,
    },
    /// etcd answered a call with an error.
    #[error("etcd at {endpoint} refused {call}: {message}")]
    Refused {
        /// The endpoint that answered.
        endpoint: String,
        /// The call refused.
        call: &'static str,
        /// What the refusal means, read from etcd's code: what callers match.
        why: Refusal,
        /// etcd's answer, for people.
        message: String,
    },
    /// etcd cancelled a watch it had taken (for a token it no longer accepts, say): watch again.
    #[error("{endpoint}: etcd cancelled the watch: {reason}")]
    Cancelled {
        /// The endpoint that cancelled it.
        endpoint: String,
        /// What the cancellation means, read from the gRPC status in its reason.
        why: Refusal,
        /// etcd's reason, for people.
        reason: String,
    },
    /// The revision asked for was compacted away: read everything again at the current one.
    #[error("etcd has compacted revision {0} away")]
    Compacted(i64),
    /// etcd answered with something the client cannot read.
    #[error("etcd at {endpoint} answered {call} with something that is not etcd's JSON: {message}")]
    Garbled {
        /// The endpoint that answered.
        endpoint: String,
        /// The call it answered.
        call: &'static str,
        /// What is wrong with the answer.
        message: String,
    },
}

/// What an etcd refusal means, read once from the gRPC code etcd gives with it, so that callers
/// match a variant and never etcd's words. The codes are etcd's (`api/v3rpc/rpctypes`): its JSON
/// gateway answers a unary call with `{"error", "code", "message"}`, a watch stream's error with
/// `{"error": {"grpc_code", "message"}}`, and a watch it cancels with the gRPC status written
/// out in `cancel_reason` ("rpc error: code = Unauthenticated desc = ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// gRPC 16, Unauthenticated: the token sent is not (or no longer) valid; log in again.
    InvalidToken,
    /// gRPC 7, PermissionDenied: the user's roles do not allow the call.
    PermissionDenied,
    /// gRPC 9, FailedPrecondition, for a role or user that is already there.
    AlreadyExists,
    /// Anything else, with etcd's gRPC code when it gave one (none when the gateway refused the
    /// request before etcd saw it).
    Other(Option<u64>),
}

/// etcd's words for a role or a user made twice ("etcdserver: role name already exists",
/// "etcdserver: user name already exists"). Code 9 also means "not found" and "authentication is
/// not enabled", so the code alone cannot tell them apart: the fixed message, in this one place,
/// does.
const ALREADY_EXISTS: &str = "name already exists";

/// etcd's words for a revision compacted away ("etcdserver: mvcc: required revision has been
/// compacted"). Its code, 11 (OutOfRange), also means a revision in the future.
const COMPACTED: &str = "required revision has been compacted";

impl Refusal {
    /// The refusal that etcd's gRPC `code` and `message` say.
    fn of(code: Option<u64>, message: &str) -> Self {
        match code {
            Some(16) => Refusal::InvalidToken,
            Some(7) => Refusal::PermissionDenied,
            Some(9) if message.ends_with(ALREADY_EXISTS) => Refusal::AlreadyExists,
            code => Refusal::Other(code),
        }
    }

    /// The refusal in a watch's `cancel_reason`: a gRPC status written out as
    /// `rpc error: code = NAME desc = MESSAGE`, its code by name.
    fn of_status(reason: &str) -> Self {
        let name = reason.strip_prefix("rpc error: code = ").and_then(|r| r.split(' ').next());
        let desc = reason.split_once(" desc = ").map_or(reason, |(_, d)| d);
        let code = match name {
            Some("Unauthenticated") => Some(16),
            Some("PermissionDenied") => Some(7),
            Some("FailedPrecondition") => Some(9),
            Some("OutOfRange") => Some(11),
            _ => None,
        };
        Refusal::of(code, desc)
    }
}

/// etcd's gRPC code and message in the answer to a unary call that failed:
/// `{"error": "...", "code": 16, "message": "..."}`.
fn code_and_message(value: &Value) -> (Option<u64>, String) {
    let message = value.get("error").or(value.get("message")).and_then(Value::as_str).unwrap_or("");
    (value.get("code").and_then(Value::as_u64), message.to_owned())
}

/// Whether etcd's gRPC `code` and `message` say the revision asked for was compacted away.
fn compacted(code: Option<u64>, message: &str) -> bool {
    code == Some(11) && message.ends_with(COMPACTED)
}

/// One key and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: String,
    /// Its value, as stored.
    pub value: Vec<u8>,
    /// The revision at which it was last changed.
    pub mod_revision: i64,
}

/// What a range read found, and the store's revision it was read at.
#[derive(Clone, Debug)]
pub struct Range {
    /// The store's revision the read was made at.
    pub revision: i64,
    /// The keys found, with their values.
    pub kvs: Vec<Kv>,
}

/// A client for one cluster: its endpoints are tried in turn, starting with the last that
/// answered.
pub struct Etcd {
    endpoints: Vec<String>,
    /// The endpoint that answered last; a failing one moves it on.
    current: AtomicUsize,
    /// Speaks plain HTTP to `http://` endpoints and TLS to `https://` ones (never both for one
    /// cluster: `new` refuses a mix, which would send the login's token in the clear to some).
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The user and password of etcd's auth, when it is on: exchanged for a token, which every
    /// request then carries.
    login: Option<(String, SecretString)>,
    /// The token of the last login; cleared when etcd says it is no longer good.
    token: std::sync::Mutex<Option<String>>,
    /// Over TLS without a client certificate: whether etcd asked for one.
    no_certificate: Option<Arc<NoCertificate>>,
}

/// The files of TLS to etcd: whom to trust, and who this client is.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// The CA certificates (PEM) that etcd's server certificates are checked against. Required
    /// for `https://` endpoints: the machine's own trust store is never used, since an etcd
    /// cluster's certificates come from a CA of its own.
    pub ca: Option<PathBuf>,
    /// This client's certificate chain (PEM), shown to etcd when it asks for one
    /// (`--client-cert-auth`).
    pub cert: Option<PathBuf>,
    /// The private key of that certificate (PEM), readable by its owner only.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The TLS configuration these files make: etcd's certificate checked against the CA, and
    /// the client's certificate shown when there is one. Without one, the resolver that notes
    /// whether etcd asked for one.
    fn config(&self) -> Result<(rustls::ClientConfig, Option<Arc<NoCertificate>>), String> {
        let Some(ca) = &self.ca else {
            return Err(
                "https:// endpoints need --etcd-ca, the CA certificate that signed etcd's: without it there is nothing to check etcd's certificate against"
                    .into(),
            );
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates("--etcd-ca", ca)? {
            roots.add(cert).map_err(|e| {
                format!("--etcd-ca {}: a certificate that cannot be trusted: {e}", ca.display())
            })?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                // The key first: one readable by others is refused whatever else is wrong.
                let key = private_key(key)?;
                let chain = certificates("--etcd-cert", cert)?;
                let config = builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!(
                        "--etcd-cert {} and --etcd-key: not a certificate and its key: {e}",
                        cert.display()
                    )
                })?;
                Ok((config, None))
            }
            (None, None) => {
                let asked = Arc::new(NoCertificate::default());
                Ok((builder.with_client_cert_resolver(asked.clone()), Some(asked)))
            }
            (Some(_), None) => Err("--etcd-cert needs --etcd-key, the certificate's private key".into()),
            (None, Some(_)) => Err("--etcd-key needs --etcd-cert, the certificate it is the key of".into()),
        }
    }
}

/// The client certificate of a client that has none: it shows none, and notes whether etcd
/// asked. Under TLS 1.3, etcd's refusal of a client without a certificate comes after the
/// handshake, and often reaches hyper only as a connection closed before the request went out
/// ("connection was not ready"), without the alert's words; this is what lets the error say why
/// all the same.
#[derive(Debug, Default)]
struct NoCertificate {
    asked: std::sync::atomic::AtomicBool,
}

impl rustls::client::ResolvesClientCert for NoCertificate {
    fn resolve(
        &self,
        _issuers: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.asked.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

/// rustls's cryptography from ring: aws-lc-rs, rustls's default, builds C with cmake and clang,
/// which neither CI nor the Debian package's build should need (docs/dependencies.md).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The configuration of a client that speaks only plain HTTP: the type wants one.
fn plain_config() -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// Every certificate in a PEM file, at least one.
fn certificates(option: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = crate::system::read_input(path, PEM_LIMIT)
        .map_err(|e| format!("{option} {}: cannot read it: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{option} {}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{option} {}: no certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// The client's private key, read as the node's sealing key is: refused when anyone but its
/// owner (the agent) can read it, or when it is a symlink.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    use crate::system::keys::KeyFileError;
    let text = match crate::system::keys::read(path) {
        Ok(Some(text)) => text,
        Ok(None) => return Err(format!("--etcd-key {}: no such file", path.display())),
        Err(KeyFileError::Exposed { mode, .. }) => {
            return Err(format!(
                "--etcd-key {path} is readable by others than its owner (mode {mode:04o}): it is refused, since anyone who can read it can speak to etcd as this node; `chmod 600 {path}`, and if it may have been copied, have a new certificate made",
                path = path.display()
            ))
        }
        Err(e) => return Err(format!("--etcd-key: {e}")),
    };
    // The key's bytes are never in a message: the parser's error says only what it missed.
    PrivateKeyDer::from_pem_slice(text.expose_secret().as_bytes()).map_err(|e| {
        format!("--etcd-key {}: no PEM private key (PKCS#8, RSA or EC) in it: {e}", path.display())
    })
}

/// What etcd's TLS refusal means, for the operator reading it: the hint beside rustls's own
/// words, which are exact but terse. `asked` when etcd asked this client, which has no
/// certificate, for one.
fn tls_hint(message: &str, asked: bool) -> &'static str {
    if asked {
        " (etcd asked for a client certificate and mesh-host has none: give --etcd-cert and --etcd-key, a certificate signed by the CA etcd trusts)"
    } else if message.contains("not valid for name") {
        " (etcd's certificate does not name the host or address the endpoint gives: use one it names)"
    } else if message.contains("invalid peer certificate") {
        " (etcd's certificate is not signed by the CA of --etcd-ca, or is not valid now)"
    } else if message.contains("CertificateRequired") || message.contains("BadCertificate") {
        " (etcd asks for a client certificate signed by the CA it trusts: give --etcd-cert and --etcd-key)"
    } else {
        ""
    }
}

/// What an answer that is not etcd's JSON says, when etcd's gateway refused the request before
/// etcd saw it.
fn not_json(status: hyper::StatusCode, bytes: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(bytes).chars().take(300).collect();
    let text = text.trim();
    if text.contains("CommonName") {
        // etcd 3.4 and later: its JSON gateway cannot take the user from the certificate (the
        // gateway calls etcd with etcd's own certificate), so it refuses one that names a user.
        format!(
            "HTTP {status}: {text} (etcd's JSON gateway, which mesh-host speaks, never takes the user from a certificate's CN, and refuses a certificate with a CN while its auth is on: give the node a certificate without a CN, and log in with --etcd-user and --etcd-password-file)"
        )
    } else {
        format!("HTTP {status}: {text}")
    }
}

/// The end of the range of every key that starts with `prefix` (etcd's `range_end`).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

fn num(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

impl Etcd {
    /// A client for a comma-separated list of endpoints (`http://127.0.0.1:2379,...`, or all
    /// `https://`, which needs `tls.ca`). Reads the TLS files, and refuses them when they cannot
    /// be used: a message naming the option and the file.
    pub fn new(endpoints: &str, tls: &TlsFiles) -> Result<Etcd, String> {
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(|e| e.trim().trim_end_matches('/').to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err("no etcd endpoint given".into());
        }
        for e in &endpoints {
            if !e.starts_with("http://") && !e.starts_with("https://") {
                return Err(format!(
                    "{e}: an etcd endpoint is a URL such as http://127.0.0.1:2379 or https://10.0.0.1:2379"
                ));
            }
        }
        let https = endpoints.iter().filter(|e| e.starts_with("https://")).count();
        let (config, no_certificate) = if https == 0 {
            if !tls.is_empty() {
                return Err(format!(
                    "--etcd-ca, --etcd-cert and --etcd-key are for https:// endpoints; {} would not use them: say https://, or leave them out",
                    endpoints.join(",")
                ));
            }
            // Never used for TLS: no endpoint is https://. A client with nothing to trust.
            (plain_config()?, None)
        } else if https < endpoints.len() {
            return Err(format!(
                "{}: some endpoints are https:// and some http://; one cluster is spoken to one way (the login's token would otherwise cross the network in the clear)",
                endpoints.join(",")
            ));
        } else {
            tls.config()?
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        connector.set_nodelay(true);
        // The TLS connector below is the one that looks at the scheme.
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(Etcd {
            endpoints,
            current: AtomicUsize::new(0),
            client,
            login: None,
            token: std::sync::Mutex::new(None),
            no_certificate,
        })
    }

    /// Logs in to etcd's auth as `user` before the first request (and again when the token
    /// expires).
    pub fn with_login(mut self, user: String, password: SecretString) -> Etcd {
        self.login = Some((user, password));
        self
    }

    fn token(&self) -> Option<String> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Logs in when there is a login and no token yet.
    async fn ensure_token(&self) -> Result<(), Error> {
        let Some((user, password)) = &self.login else { return Ok(()) };
        if self.token().is_some() {
            return Ok(());
        }
        // The password is in the body only: no error or log line carries a request's body.
        let body = json!({"name": user, "password": password.expose_secret()});
        let answer = self.call_once("a login", "/v3/auth/authenticate", body).await?;
        let token = answer["token"].as_str().unwrap_or_default().to_owned();
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
        Ok(())
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    async fn post(
        &self,
        endpoint: &str,
        path: &str,
        body: &Value,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut request =
            hyper::Request::post(format!("{endpoint}{path}")).header("content-type", "application/json");
        if let Some(token) = self.token() {
            request = request.header("authorization", token);
        }
        let request = request.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| e.to_string())?;
        self.client.request(request).await.map_err(|e| {
            // hyper's own message is terse ("client error (Connect)"): the source says why.
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message = format!("{message}: {s}");
                source = s.source();
            }
            let asked = self.no_certificate.as_ref().is_some_and(|n| n.asked.load(Ordering::Relaxed));
            let hint = tls_hint(&message, asked);
            message + hint
        })
    }

    /// One unary call, logged in first when etcd's auth is on, and once more with a new token
    /// when etcd says the one held expired.
    async fn call(&self, call: &'static str, path: &str, body: Value) -> Result<Value, Error> {
        self.ensure_token().await?;
        match self.call_once(call, path, body.clone()).await {
            Err(Error::Refused { why: Refusal::InvalidToken, .. }) if self.login.is_some() => {
                *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.ensure_token().await?;
                self.call_once(call, path, body).await
            }
            answer => answer,
        }
    }

    /// One unary call, tried on each endpoint in turn until one answers.
    async fn call_once(&self, call: &'static str, path: &str, body: Value) -> Result<Value, Error> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            let answer = tokio::time::timeout(CALL_TIMEOUT, async {
                let response = self.post(endpoint, path, &body).await?;
                let status = response.status();
                let bytes = http_body_util::Limited::new(response.into_body(), ANSWER_LIMIT)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the answer: {e}"))?
                    .to_bytes();
                Ok::<_, String>((status, bytes))
            })
            .await;
            let (status, bytes) = match answer {
                Ok(Ok(answer)) => answer,
                Ok(Err(e)) => {
                    last = format!("{endpoint}: {e}");
                    continue;
                }
                Err(_) => {
                    last = format!("{endpoint}: no answer in {}", crate::system::human(CALL_TIMEOUT));
                    continue;
                }
            };
            self.current.store(at, Ordering::Relaxed);
            let value: Value = match serde_json::from_slice(&bytes) {
                Ok(value) => value,
                // Refused before etcd saw it (by the gateway's own checks): say what it said.
                Err(_) if status.is_client_error() => {
                    return Err(Error::Refused {
                        endpoint: endpoint.clone(),
                        call,
                        why: Refusal::Other(None),
                        message: not_json(status, &bytes),
                    })
                }
                Err(e) => {
                    return Err(Error::Garbled {
                        endpoint: endpoint.clone(),
                        call,
                        message: format!("{e} (HTTP {status})"),
                    })
                }
            };
            if !status.is_success() {
                let (code, message) = code_and_message(&value);
                if compacted(code, &message) {
                    return Err(Error::Compacted(num(&body["revision"])));
                }
                // A member without a leader (mid-election) or stopping: another may answer.
                if status.is_server_error() {
                    last = format!("{endpoint}: HTTP {status}: {message}");
                    continue;
                }
                let why = Refusal::of(code, &message);
                return Err(Error::Refused { endpoint: endpoint.clone(), call, why, message });
            }
            return Ok(value);
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint answered {call}; last: {last}"),
        })
    }

    /// Every key under `prefix`, in key order, at `revision` (the latest when `None`).
    pub async fn range_prefix(&self, prefix: &str, revision: Option<i64>) -> Result<Range, Error> {
        let mut body = json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
        });
        if let Some(r) = revision {
            body["revision"] = r.to_string().into();
        }
        let answer = self.call("a range read", "/v3/kv/range", body).await?;
        let endpoint = self.endpoints[self.current.load(Ordering::Relaxed)].clone();
        let garbled =
            |message: String| Error::Garbled { endpoint: endpoint.clone(), call: "a range read", message };
        let revision = num(&answer["header"]["revision"]);
        let mut kvs = Vec::new();
        for kv in answer["kvs"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let key =
                B64.decode(kv["key"].as_str().unwrap_or_default()).map_err(|e| garbled(e.to_string()))?;
            let key = String::from_utf8(key).map_err(|_| garbled("a key that is not UTF-8".into()))?;
            let value =
                B64.decode(kv["value"].as_str().unwrap_or_default()).map_err(|e| garbled(e.to_string()))?;
            kvs.push(Kv { key, value, mod_revision: num(&kv["mod_revision"]) });
        }
        Ok(Range { revision, kvs })
    }

    /// Makes the keys under `prefix` exactly `kvs` in one transaction, provided nothing under
    /// the prefix was written after `read_at` (the revision the caller compared against): puts
    /// for each, deletes for the keys `stale`. Returns the revision written, or `None` when
    /// something under the prefix changed meanwhile and nothing was written.
    pub async fn replace_prefix(
        &self,
        prefix: &str,
        read_at: i64,
        kvs: &[(String, Vec<u8>)],
        stale: &[String],
    ) -> Result<Option<i64>, Error> {
        let mut ops: Vec<Value> = kvs
            .iter()
            .map(|(k, v)| json!({"request_put": {"key": B64.encode(k), "value": B64.encode(v)}}))
            .collect();
        ops.extend(stale.iter().map(|k| json!({"request_delete_range": {"key": B64.encode(k)}})));
        let body = json!({
            // Every key under the prefix was last written at or before `read_at`.
            "compare": [{
                "key": B64.encode(prefix),
                "range_end": B64.encode(prefix_end(prefix)),
                "target": "MOD",
                "result": "LESS",
                "mod_revision": (read_at + 1).to_string(),
            }],
            "success": ops,
        });
        let answer = self.call("a transaction", "/v3/kv/txn", body).await?;
        Ok(answer["succeeded"].as_bool().unwrap_or(false).then(|| num(&answer["header"]["revision"])))
    }

    /// Puts one key.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<i64, Error> {
        let body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        let answer = self.call("a put", "/v3/kv/put", body).await?;
        Ok(num(&answer["header"]["revision"]))
    }

    /// Puts one key bound to a lease: it goes when the lease does.
    pub async fn put_with_lease(&self, key: &str, value: &[u8], lease: i64) -> Result<i64, Error> {
        let body = json!({"key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string()});
        let answer = self.call("a put", "/v3/kv/put", body).await?;
        Ok(num(&answer["header"]["revision"]))
    }

    /// Takes a lease of `ttl` seconds; returns its id.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, Error> {
        let answer = self.call("a lease grant", "/v3/lease/grant", json!({"TTL": ttl.to_string()})).await?;
        Ok(num(&answer["ID"]))
    }

    /// Renews a lease once. `false` when it had expired already (its keys are gone).
    pub async fn lease_keepalive(&self, id: i64) -> Result<bool, Error> {
        // A stream on the gateway: one request in the body, one answer back.
        let answer =
            self.call("a lease renewal", "/v3/lease/keepalive", json!({"ID": id.to_string()})).await?;
        Ok(num(&answer["result"]["TTL"]) > 0)
    }

    /// Forgets the token, so the next request logs in again (a watch refused for its token).
    pub fn forget_token(&self) {
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Makes `role` (when missing) and grants it `permission` (`READ`, `WRITE`, `READWRITE`) on
    /// `key`, or on every key under it when `prefix`.
    pub async fn grant(&self, role: &str, permission: &str, key: &str, prefix: bool) -> Result<(), Error> {
        match self.call("a role", "/v3/auth/role/add", json!({"name": role})).await {
            Err(Error::Refused { why: Refusal::AlreadyExists, .. }) => {}
            other => {
                other?;
            }
        }
        let mut perm = json!({"permType": permission, "key": B64.encode(key)});
        if prefix {
            perm["range_end"] = B64.encode(prefix_end(key)).into();
        }
        self.call("a grant", "/v3/auth/role/grant", json!({"name": role, "perm": perm})).await?;
        Ok(())
    }

    /// Makes `user` (when missing: an existing user keeps its password) and gives it `role`.
    pub async fn user_with_role(
        &self,
        user: &str,
        password: &SecretString,
        role: &str,
    ) -> Result<bool, Error> {
        let made = match self
            .call("a user", "/v3/auth/user/add", json!({"name": user, "password": password.expose_secret()}))
            .await
        {
            Err(Error::Refused { why: Refusal::AlreadyExists, .. }) => false,
            other => {
                other?;
                true
            }
        };
        self.call("a role for a user", "/v3/auth/user/grant", json!({"user": user, "role": role})).await?;
        Ok(made)
    }

    /// Watches every key under `prefix` from `start_revision` on. The watch ends (`next` says
    /// so) when the endpoint goes away; the caller reads again and watches anew.
    pub async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<Watch, Error> {
        let body = json!({"create_request": {
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        self.ensure_token().await?;
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            match tokio::time::timeout(CALL_TIMEOUT, self.post(endpoint, "/v3/watch", &body)).await {
                Ok(Ok(response)) if response.status().is_success() => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok(Watch {
                        body: response.into_body(),
                        buffer: Vec::new(),
                        endpoint: endpoint.clone(),
                    });
                }
                Ok(Ok(response)) => {
                    let status = response.status();
                    // The refusal's words, bounded: a gateway's error page is short.
                    let body = http_body_util::Limited::new(response.into_body(), 4096)
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    last = format!("{endpoint}: {}", not_json(status, &body));
                }
                Ok(Err(e)) => last = format!("{endpoint}: {e}"),
                Err(_) => last = format!("{endpoint}: no answer in {}", crate::system::human(CALL_TIMEOUT)),
            }
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint accepted a watch; last: {last}"),
        })
    }
}

/// What a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The watch is in place.
    Created,
    /// Keys under the prefix changed; the revision of the last change.
    Changed(i64),
}

/// A watch stream, read with `next`.
pub struct Watch {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    endpoint: String,
}

impl Watch {
    /// The next thing the watch saw. An error when the stream ended or broke (the caller reads
    /// again and watches anew) or etcd compacted the revision asked for (a full read).
    pub async fn next(&mut self) -> Result<Seen, Error> {
        loop {
            // A whole document in the buffer already?
            let mut stream = serde_json::Deserializer::from_slice(&self.buffer).into_iter::<Value>();
            match stream.next() {
                Some(Ok(doc)) => {
                    let used = stream.byte_offset();
                    self.buffer.drain(..used);
                    if let Some(seen) = self.read(doc)? {
                        return Ok(seen);
                    }
                    continue;
                }
                Some(Err(e)) if !e.is_eof() => {
                    return Err(Error::Garbled {
                        endpoint: self.endpoint.clone(),
                        call: "a watch",
                        message: e.to_string(),
                    })
                }
                _ => {}
            }
            if self.buffer.len() > ANSWER_LIMIT {
                return Err(Error::Garbled {
                    endpoint: self.endpoint.clone(),
                    call: "a watch",
                    message: "one watch answer larger than mesh-host reads".into(),
                });
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(Error::Unreachable {
                        endpoints: self.endpoint.clone(),
                        message: format!("the watch broke: {e}"),
                    })
                }
                None => {
                    return Err(Error::Unreachable {
                        endpoints: self.endpoint.clone(),
                        message: "the watch ended".into(),
                    })
                }
            }
        }
    }

    fn read(&self, doc: Value) -> Result<Option<Seen>, Error> {
        seen(&self.endpoint, doc)
    }
}

/// What one document of a watch stream says: `None` for one that says nothing to act on (a
/// progress notice).
fn seen(endpoint: &str, doc: Value) -> Result<Option<Seen>, Error> {
    if let Some(error) = doc.get("error") {
        let message = error.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
        let why = Refusal::of(error.get("grpc_code").and_then(Value::as_u64), &message);
        return Err(Error::Refused { endpoint: endpoint.to_owned(), call: "a watch", why, message });
    }
    let result = &doc["result"];
    let compacted = num(&result["compact_revision"]);
    if compacted > 0 {
        return Err(Error::Compacted(compacted));
    }
    if result["canceled"].as_bool().unwrap_or(false) {
        let reason = result["cancel_reason"].as_str().unwrap_or("no reason given");
        return Err(Error::Cancelled {
            endpoint: endpoint.to_owned(),
            why: Refusal::of_status(reason),
            reason: reason.to_owned(),
        });
    }
    if result["created"].as_bool().unwrap_or(false) {
        return Ok(Some(Seen::Created));
    }
    let events = result["events"].as_array().map(Vec::as_slice).unwrap_or_default();
    let last = events.iter().map(|e| num(&e["kv"]["mod_revision"])).max();
    Ok(last.map(Seen::Changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_document_is_read_as_etcd_means_it() {
        let at = "http://127.0.0.1:2379";
        let doc = |v: &str| serde_json::from_str::<Value>(v).unwrap();
        assert_eq!(
            seen(at, doc(r#"{"result":{"header":{"revision":"5"},"created":true}}"#)).unwrap(),
            Some(Seen::Created)
        );
        let events = r#"{"result":{"events":[{"kv":{"key":"YQ==","mod_revision":"7"}},{"type":"DELETE","kv":{"key":"Yg==","mod_revision":"9"}}]}}"#;
        assert_eq!(
            seen(at, doc(events)).unwrap(),
            Some(Seen::Changed(9)),
            "the last change's revision, deletes too"
        );
        assert_eq!(
            seen(at, doc(r#"{"result":{"header":{"revision":"12"}}}"#)).unwrap(),
            None,
            "a progress notice"
        );
        // A watch from a revision compacted away: a full read follows.
        let compacted = r#"{"result":{"canceled":true,"compact_revision":"40"}}"#;
        assert!(matches!(seen(at, doc(compacted)), Err(Error::Compacted(40))));
        let canceled = r#"{"result":{"canceled":true,"cancel_reason":"permission denied"}}"#;
        let e = seen(at, doc(canceled)).unwrap_err();
        assert!(matches!(e, Error::Cancelled { why: Refusal::Other(None), .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("cancelled the watch: permission denied"), "{e}");
        let e = seen(at, doc(r#"{"error":{"grpc_code":16,"message":"etcdserver: invalid auth token"}}"#))
            .unwrap_err();
        assert!(matches!(e, Error::Refused { why: Refusal::InvalidToken, .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("invalid auth token") && e.contains(at), "{e}");
        // What etcd 3.4 answers a watch sent with a token it does not accept: taken, then
        // cancelled, the gRPC status written out in the reason.
        let bad_token = r#"{"result":{"watch_id":"-1","created":true,"canceled":true,"cancel_reason":"rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"}}"#;
        let e = seen(at, doc(bad_token)).unwrap_err();
        assert!(matches!(e, Error::Cancelled { why: Refusal::InvalidToken, .. }), "{e:?}");
        assert!(e.to_string().contains("cancelled the watch: rpc error: code = Unauthenticated"), "{e}");
    }

    /// etcd's refusals, as its JSON gateway (3.4, the testbed's) answers unary calls: read by
    /// code, and by etcd's fixed words only where one code means several things.
    #[test]
    fn a_refusal_is_read_by_its_grpc_code() {
        let read = |v: &str| {
            let (code, message) = code_and_message(&serde_json::from_str(v).unwrap());
            (Refusal::of(code, &message), compacted(code, &message))
        };
        let answer = |m: &str, code: u64| format!(r#"{{"error":"{m}","message":"{m}","code":{code}}}"#);
        let token = answer("etcdserver: invalid auth token", 16);
        assert_eq!(read(&token), (Refusal::InvalidToken, false));
        assert_eq!(read(&answer("etcdserver: permission denied", 7)), (Refusal::PermissionDenied, false));
        let role = answer("etcdserver: role name already exists", 9);
        assert_eq!(read(&role), (Refusal::AlreadyExists, false));
        let user = answer("etcdserver: user name already exists", 9);
        assert_eq!(read(&user), (Refusal::AlreadyExists, false));
        let not_found = answer("etcdserver: role name not found", 9);
        assert_eq!(read(&not_found), (Refusal::Other(Some(9)), false), "the same code, another meaning");
        let gone = answer("etcdserver: mvcc: required revision has been compacted", 11);
        assert!(read(&gone).1, "compacted");
        let future = answer("etcdserver: mvcc: required revision is a future revision", 11);
        assert_eq!(read(&future), (Refusal::Other(Some(11)), false), "out of range, not compacted");
        // Words without a code (an older gateway, a proxy) are not guessed at.
        let bare = r#"{"error":"etcdserver: invalid auth token"}"#;
        assert_eq!(read(bare), (Refusal::Other(None), false));

        let status = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
        assert_eq!(Refusal::of_status(status), Refusal::PermissionDenied);
        assert_eq!(Refusal::of_status("no reason given"), Refusal::Other(None));
    }

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }

    #[test]
    fn endpoints_are_urls_spoken_to_one_way_and_https_needs_a_ca() {
        let none = TlsFiles::default();
        let e = Etcd::new("10.0.0.1:2379", &none).err().unwrap();
        assert!(e.contains("a URL such as"), "{e}");
        assert!(Etcd::new(" , ", &none).is_err());
        Etcd::new("http://10.0.0.1:2379,http://10.0.0.2:2379", &none).unwrap();

        let e = Etcd::new("https://10.0.0.1:2379", &none).err().unwrap();
        assert!(e.contains("need --etcd-ca"), "{e}");
        let e = Etcd::new("https://10.0.0.1:2379,http://10.0.0.2:2379", &none).err().unwrap();
        assert!(e.contains("some endpoints are https:// and some http://"), "{e}");
        // Certificates for an endpoint that would not use them: said, not ignored.
        let ca = TlsFiles { ca: Some("/nonexistent/ca.pem".into()), ..TlsFiles::default() };
        let e = Etcd::new("http://10.0.0.1:2379", &ca).err().unwrap();
        assert!(e.contains("would not use them"), "{e}");
    }

    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test writes the files it then gives")]
    fn tls_files_that_cannot_be_used_are_refused_naming_the_option_and_the_file() {
        let scratch = tempfile::tempdir().unwrap();
        let missing = scratch.path().join("missing.pem");
        let e = Etcd::new(
            "https://127.0.0.1:2379",
            &TlsFiles { ca: Some(missing.clone()), ..TlsFiles::default() },
        )
        .err()
        .unwrap();
        assert!(e.starts_with("--etcd-ca ") && e.contains("missing.pem") && e.contains("cannot read"), "{e}");
        let empty = scratch.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Etcd::new("https://127.0.0.1:2379", &TlsFiles { ca: Some(empty), ..TlsFiles::default() })
            .err()
            .unwrap();
        assert!(e.contains("no certificate"), "{e}");
    }

    #[test]
    fn tls_refusals_carry_a_hint_and_a_gateway_refusal_says_why() {
        assert!(tls_hint("client error (Connect): invalid peer certificate: UnknownIssuer", false)
            .contains("--etcd-ca"));
        assert!(tls_hint("received fatal alert: CertificateRequired", false).contains("--etcd-cert"));
        // The alert's words lost (TLS 1.3: the refusal comes after the handshake), the request
        // for a certificate still says why.
        assert!(tls_hint("client error (Canceled): connection was not ready", true).contains("has none"));
        assert_eq!(tls_hint("Connection refused (os error 111)", false), "");
        let cn = not_json(
            hyper::StatusCode::BAD_REQUEST,
            b"CommonName of client sending a request against gateway will be ignored and not used as expected\n",
        );
        assert!(cn.starts_with("HTTP 400 Bad Request: CommonName") && cn.contains("without a CN"), "{cn}");
        let long = not_json(hyper::StatusCode::NOT_FOUND, "x".repeat(10_000).as_bytes());
        assert!(long.len() < 400, "bounded");
    }
}
