//! A small etcd v3 client over etcd's gRPC API: the few calls the fleet needs (KV, Watch, Lease,
//! Auth), on one HTTP/2 connection per client.
//!
//! The messages and clients are generated at build time from etcd's own protos (`proto/`) by
//! protox and tonic-prost-build (`build.rs`): no `protoc` on the build machine. Why gRPC rather
//! than etcd's JSON gateway, which mesh-host spoke first: the gateway never takes the user from
//! a client certificate's CN, costs one connection per watch and has no progress notices
//! (docs/decisions.md, "etcd over gRPC, the node's identity from its certificate").
//!
//! One connection: every call of a client and every watch it opens are streams on one tonic
//! `Channel` to one endpoint at a time, all the prefixes of a node on one bidirectional Watch
//! stream. When that endpoint stops answering, the connection is dropped and the next endpoint
//! is dialled; nothing else holds a connection open.
//!
//! TLS is made here, by the connector the channel dials with (rustls and ring, through
//! tokio-rustls), not by tonic's own TLS: the key and certificates are read again at every
//! connect, so a certificate renewed in place is taken at the next reconnect without a restart,
//! and a refusal can say that etcd asked for a certificate the client does not have.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret as _, SecretString};
use tokio::sync::mpsc;
use tonic::codegen::http;
use tonic::transport::Channel;

/// The code generated from etcd's protos (`build.rs`): private, undocumented, not linted.
#[allow(missing_docs, dead_code, clippy::all, clippy::pedantic, unreachable_pub)]
mod pb {
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

use pb::etcdserverpb as rpc;
use rpc::auth_client::AuthClient;
use rpc::kv_client::KvClient;
use rpc::lease_client::LeaseClient;
use rpc::watch_client::WatchClient;

/// How long one unary call (a read, a transaction) may take before the next endpoint is tried.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection (TCP and TLS) may take to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// HTTP/2 pings while a stream is open: a connection that died without a word (a cable pulled,
/// a firewall dropping packets) is known dead within `KEEPALIVE + KEEPALIVE_TIMEOUT`, and every
/// watch on it ends. Not more often than etcd's `--grpc-keepalive-min-time` (5 s), below which
/// etcd answers pings with GOAWAY; never while no stream is open, which etcd also punishes.
const KEEPALIVE: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest message read from etcd: its own default request limit is 1.5 MiB per value, and
/// a range holds a node's whole declaration.
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
        /// The last one's TLS refused the connection, and why, as rustls said it.
        tls: Option<TlsRefusal>,
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
    /// A write was sent and etcd's answer was lost (a timeout, a connection reset mid-call):
    /// it may have been applied or not. Never reported as failed (Jepsen's `info`): the caller
    /// reads back what it can, and otherwise says the outcome is unknown (exit 3).
    #[error("unknown: {call} was sent to etcd ({endpoints}) and its answer was lost ({message}); it may or may not have been written")]
    Unknown {
        /// The endpoints tried.
        endpoints: String,
        /// The call whose outcome is unknown.
        call: &'static str,
        /// What was lost, for people.
        message: String,
    },
    /// etcd answered with something the client cannot read.
    #[error("etcd at {endpoint} answered {call} with something mesh-host cannot read: {message}")]
    Garbled {
        /// The endpoint that answered.
        endpoint: String,
        /// The call it answered.
        call: &'static str,
        /// What is wrong with the answer.
        message: String,
    },
}

/// What an etcd refusal means, read once from the gRPC status etcd answers with, so that callers
/// match a variant and never etcd's words. The codes are etcd's (`api/v3rpc/rpctypes`); a watch
/// etcd cancels carries its gRPC status written out in `cancel_reason` ("rpc error: code =
/// PermissionDenied desc = ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// gRPC 16, Unauthenticated: the token sent is not (or no longer) valid; log in again.
    InvalidToken,
    /// gRPC 7, PermissionDenied: the user's roles do not allow the call.
    PermissionDenied,
    /// gRPC 9, FailedPrecondition, for a role or user that is already there.
    AlreadyExists,
    /// gRPC 3, InvalidArgument: a request over one of etcd's limits (`--max-txn-ops`,
    /// `--max-request-bytes`), or one it cannot take as written.
    OverLimit,
    /// gRPC 8, ResourceExhausted: the backend's quota is spent (the NOSPACE alarm).
    NoSpace,
    /// Anything else, with etcd's gRPC code when it gave one (none in a cancellation's reason
    /// that names no code).
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
            Some(3) => Refusal::OverLimit,
            Some(8) => Refusal::NoSpace,
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

    /// The TLS configuration these files make, read from them now: etcd's certificate checked
    /// against the CA, the client's certificate shown when there is one, and HTTP/2 asked for
    /// (gRPC's). Without a certificate, the resolver that notes whether etcd asked for one.
    fn config(&self) -> Result<(rustls::ClientConfig, Option<Arc<NoCertificate>>), String> {
        let (mut config, asked) = self.config_without_alpn()?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok((config, asked))
    }

    fn config_without_alpn(&self) -> Result<(rustls::ClientConfig, Option<Arc<NoCertificate>>), String> {
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
/// handshake, and often reaches the client only as a connection closed, without the alert's
/// words; this is what lets the connector say why all the same, before any request is sent.
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

/// Why etcd's TLS refused a connection, read from rustls's own error (the alert etcd sent, or
/// rustls's verdict on etcd's certificate) found in the error's chain, never from its words:
/// what `Error::certificate_refused` and the hint beside the message are decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsRefusal {
    /// etcd asked this client, which has no certificate, for one (`NoCertificate` saw it ask).
    NoClientCertificate,
    /// etcd's certificate does not name the host or address the endpoint gives.
    ServerName,
    /// etcd's certificate is not signed by the CA of --etcd-ca, or is not valid now.
    ServerCertificate,
    /// etcd requires a client certificate signed by the CA it trusts (the `certificate_required`
    /// alert).
    ClientCertificateRequired,
    /// etcd refused the client's certificate: the `bad_certificate`, `certificate_expired`,
    /// `certificate_revoked`, `certificate_unknown` or `unknown_ca` alert, or the connection
    /// closed as the handshake ended (`accepted`).
    ClientCertificate,
}

impl TlsRefusal {
    /// The refusal a rustls error says, if it is one.
    fn of(e: &rustls::Error) -> Option<TlsRefusal> {
        use rustls::{AlertDescription as Alert, CertificateError as Cert};
        match e {
            rustls::Error::InvalidCertificate(
                Cert::NotValidForName | Cert::NotValidForNameContext { .. },
            ) => Some(TlsRefusal::ServerName),
            rustls::Error::InvalidCertificate(_) => Some(TlsRefusal::ServerCertificate),
            rustls::Error::AlertReceived(Alert::CertificateRequired) => {
                Some(TlsRefusal::ClientCertificateRequired)
            }
            rustls::Error::AlertReceived(
                Alert::BadCertificate
                | Alert::CertificateExpired
                | Alert::CertificateRevoked
                | Alert::CertificateUnknown
                | Alert::UnknownCA,
            ) => Some(TlsRefusal::ClientCertificate),
            _ => None,
        }
    }

    /// The refusal anywhere in `e`'s chain: the connector's own (`Dial`), or a rustls error,
    /// also where an `io::Error` wraps one (whose `source` skips the error it wraps, so it is
    /// opened here).
    fn in_chain(e: &(dyn std::error::Error + 'static)) -> Option<TlsRefusal> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(dial) = e.downcast_ref::<Dial>() {
                return dial.tls;
            }
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return TlsRefusal::of(tls);
            }
            let wrapped = e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
            if let Some(found) = wrapped.and_then(|inner| TlsRefusal::in_chain(inner)) {
                return Some(found);
            }
            next = e.source();
        }
        None
    }

    /// What it means, for the operator reading it: beside rustls's own words, which are exact
    /// but terse.
    fn hint(self) -> &'static str {
        match self {
            TlsRefusal::NoClientCertificate => "etcd asked for a client certificate and mesh-host has none: give --etcd-cert and --etcd-key, a certificate signed by the CA etcd trusts",
            TlsRefusal::ServerName => "etcd's certificate does not name the host or address the endpoint gives: use one it names",
            TlsRefusal::ServerCertificate => "etcd's certificate is not signed by the CA of --etcd-ca, or is not valid now",
            TlsRefusal::ClientCertificateRequired => "etcd asks for a client certificate signed by the CA it trusts: give --etcd-cert and --etcd-key",
            TlsRefusal::ClientCertificate => "etcd refused the client certificate of --etcd-cert: not signed by the CA etcd trusts, expired, or revoked; write a valid one and its key in place, they are read again at every connection",
        }
    }
}

/// Why the connector could not connect: its words, and etcd's TLS refusal when it was one.
#[derive(Debug)]
struct Dial {
    message: String,
    tls: Option<TlsRefusal>,
}

impl From<String> for Dial {
    fn from(message: String) -> Dial {
        Dial { message, tls: None }
    }
}

impl std::fmt::Display for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Dial {}

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

/// The refusal a gRPC status says, and etcd's message.
fn refusal_of(status: &tonic::Status) -> Refusal {
    Refusal::of(Some(status.code() as u64), status.message())
}

/// Whether a status says the endpoint could not serve the call at all (gone, stopping, without
/// a leader mid-election, or not answering in time): another endpoint may.
fn another_may_answer(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
        // A transport error (a connection reset mid-call) reaches tonic as Unknown with a source.
        || (status.code() == tonic::Code::Unknown && std::error::Error::source(status).is_some())
}

/// Whether a status that another endpoint may answer still leaves the call's outcome open: the
/// request may have reached etcd (a timeout, a connection reset mid-call, etcd's own "request
/// timed out" while its proposal may yet commit), as against a connection never made or a member
/// that said it has no leader and so proposed nothing.
fn sent_and_lost(status: &tonic::Status) -> bool {
    let refused_before = status.code() == tonic::Code::Unavailable
        && (status.message().contains("no leader")
            || status.message().contains("connection refused")
            || status.message().contains("tcp connect error"));
    !refused_before
}

/// An error and every error under it, in one line: tonic's and hyper's own words are terse
/// ("transport error"), the sources say why (the connector's words, rustls's alert).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !message.contains(&more) {
            message = format!("{message}: {more}");
        }
        source = s.source();
    }
    message
}

/// `chain`, with the hint of a TLS refusal (the connector's, or one that came after the
/// handshake: under TLS 1.3, etcd's refusal of a certificate reaches the client as an alert on
/// the first read, through HTTP/2, not through the connector); and the refusal.
fn said(e: &(dyn std::error::Error + 'static)) -> (String, Option<TlsRefusal>) {
    let message = chain(e);
    match TlsRefusal::in_chain(e) {
        Some(tls) => (format!("{message} ({})", tls.hint()), Some(tls)),
        None => (message, None),
    }
}

/// What the channel dials with: TCP, and TLS over it for `https://` endpoints, the files read
/// again at every connect.
#[derive(Clone)]
struct Connector {
    tls: Option<Arc<TlsFiles>>,
}

/// A connection the channel speaks HTTP/2 over: plain TCP or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

type Connected = hyper_util::rt::TokioIo<Box<dyn Io>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Connected;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Connected, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move { connect(&uri, tls.as_deref()).await.map_err(std::io::Error::other) })
    }
}

/// One connection to `uri`: TCP, then TLS when `tls` is given, with the files read now.
async fn connect(uri: &http::Uri, tls: Option<&TlsFiles>) -> Result<Connected, Dial> {
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(2379);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let Some(tls) = tls else {
        return Ok(hyper_util::rt::TokioIo::new(Box::new(tcp) as Box<dyn Io>));
    };
    let (config, no_certificate) = tls.config()?;
    let name = rustls_pki_types::ServerName::try_from(host.clone())
        .map_err(|e| format!("{host}: not a name TLS can check a certificate against: {e}"))?;
    let asked = |n: &Option<Arc<NoCertificate>>| n.as_ref().is_some_and(|n| n.asked.load(Ordering::Relaxed));
    let stream =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| {
            let tls = if asked(&no_certificate) {
                Some(TlsRefusal::NoClientCertificate)
            } else {
                TlsRefusal::in_chain(&e)
            };
            Dial { message: format!("TLS: {}", chain(&e)), tls }
        })?;
    // Under TLS 1.3 etcd refuses a client without a certificate only after the handshake: said
    // now, rather than as the connection closed a moment later.
    if asked(&no_certificate) {
        return Err(Dial {
            message: "TLS: etcd asked for a client certificate in the handshake".into(),
            tls: Some(TlsRefusal::NoClientCertificate),
        });
    }
    let primed = accepted(stream).await?;
    Ok(hyper_util::rt::TokioIo::new(Box::new(primed) as Box<dyn Io>))
}

/// How long the connector waits for etcd's first bytes after the handshake.
const FIRST_BYTES: Duration = Duration::from_secs(2);

/// Whether etcd took the client's certificate. Under TLS 1.3 the client's side of the handshake
/// ends before etcd has checked its certificate, and a refusal (expired, revoked, another CA's)
/// comes as an alert on the first read; read through HTTP/2 it may surface as an alert, a reset
/// or a closed connection, depending on timing. So the first bytes are read here: etcd's HTTP/2
/// server speaks first (its SETTINGS), so they come at once, and a refusal is said in words.
/// The bytes read are handed on in front of the rest. Nothing come after `FIRST_BYTES`: handed
/// on as it is.
async fn accepted<S>(mut stream: S) -> Result<Primed<S>, Dial>
where
    S: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt as _;
    let mut first = vec![0; 16 << 10];
    match tokio::time::timeout(FIRST_BYTES, stream.read(&mut first)).await {
        Ok(Ok(0)) => Err(Dial {
            message: "TLS: etcd closed the connection just after the handshake, as it does when it refuses the client's certificate".into(),
            tls: Some(TlsRefusal::ClientCertificate),
        }),
        Ok(Ok(n)) => {
            first.truncate(n);
            Ok(Primed { first, at: 0, inner: stream })
        }
        Ok(Err(e)) => Err(Dial { message: format!("TLS: {}", chain(&e)), tls: TlsRefusal::in_chain(&e) }),
        Err(_) => Ok(Primed { first: Vec::new(), at: 0, inner: stream }),
    }
}

/// A stream with the bytes `accepted` read put back in front of the rest.
struct Primed<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Primed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.first.len() {
            let n = (this.first.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Primed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Error {
    /// Whether etcd could not be reached because it refused the client's certificate: the
    /// operator's to mend, by writing a new one in place.
    pub fn certificate_refused(&self) -> bool {
        matches!(self, Error::Unreachable { tls: Some(TlsRefusal::ClientCertificate), .. })
    }
}

/// The end of the range of every key that starts with `prefix` (etcd's `range_end`), as bytes.
fn range_of(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    (prefix.as_bytes().to_vec(), prefix_end(prefix))
}

/// The one connection of a client: which endpoint, and the channel to it.
struct Connection {
    at: usize,
    channel: Channel,
}

/// A client for one cluster: one connection at a time, to one of its endpoints, tried in turn
/// starting with the last that answered.
pub struct Etcd {
    endpoints: Vec<String>,
    /// The endpoint to dial next: the one that answered last, moved on when it fails.
    current: AtomicUsize,
    /// The TLS files for `https://` endpoints (never a mix: `new` refuses one, which would send
    /// a login's token in the clear to some).
    tls: Option<Arc<TlsFiles>>,
    /// The connection, made at the first call and again after its endpoint failed. A tokio lock
    /// held while dialling: two calls at once must not make two connections.
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// Bumped each time the connection is dropped (for another endpoint, or by `reconnect`): a
    /// watch opened on the old one ends then, so that its stream does not hold the old
    /// connection open beside the new one (a call can fail over, "no leader" say, while the
    /// watch's stream still flows).
    moved: tokio::sync::watch::Sender<u64>,
    /// The user and password of etcd's auth, when the node logs in with a password (without
    /// one, over TLS, etcd takes the user from the certificate's CN): exchanged for a token,
    /// which every request then carries.
    login: Option<(String, SecretString)>,
    /// The token of the last login; cleared when etcd says it is no longer good.
    token: std::sync::Mutex<Option<String>>,
}

impl Etcd {
    /// A client for a comma-separated list of endpoints (`http://127.0.0.1:2379,...`, or all
    /// `https://`, which needs `tls.ca`). Reads the TLS files once to refuse them now when they
    /// cannot be used (a message naming the option and the file); they are read again at every
    /// connect. Connects at the first call.
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
            e.parse::<http::Uri>().map_err(|err| format!("{e}: not a URL: {err}"))?;
        }
        let https = endpoints.iter().filter(|e| e.starts_with("https://")).count();
        let tls = if https == 0 {
            if !tls.is_empty() {
                return Err(format!(
                    "--etcd-ca, --etcd-cert and --etcd-key are for https:// endpoints; {} would not use them: say https://, or leave them out",
                    endpoints.join(",")
                ));
            }
            None
        } else if https < endpoints.len() {
            return Err(format!(
                "{}: some endpoints are https:// and some http://; one cluster is spoken to one way (the login's token would otherwise cross the network in the clear)",
                endpoints.join(",")
            ));
        } else {
            tls.config()?;
            Some(Arc::new(tls.clone()))
        };
        Ok(Etcd {
            endpoints,
            current: AtomicUsize::new(0),
            tls,
            connection: tokio::sync::Mutex::new(None),
            moved: tokio::sync::watch::Sender::new(0),
            login: None,
            token: std::sync::Mutex::new(None),
        })
    }

    /// Logs in to etcd's auth as `user` before the first request (and again when the token
    /// expires).
    pub fn with_login(mut self, user: String, password: SecretString) -> Etcd {
        self.login = Some((user, password));
        self
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// The connection, made now when there is none: each endpoint dialled in turn from the
    /// current one. Returns the endpoint's index and the channel.
    async fn channel(&self) -> Result<(usize, Channel), Error> {
        let mut connection = self.connection.lock().await;
        if let Some(c) = connection.as_ref() {
            return Ok((c.at, c.channel.clone()));
        }
        let start = self.current.load(Ordering::Relaxed);
        let (mut last, mut tls) = (String::new(), None);
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            let dial = tonic::transport::Endpoint::from_shared(endpoint.clone())
                .map_err(|e| Error::Unreachable {
                    endpoints: endpoint.clone(),
                    message: e.to_string(),
                    tls: None,
                })?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                .keep_alive_while_idle(false);
            match dial.connect_with_connector(Connector { tls: self.tls.clone() }).await {
                Ok(channel) => {
                    self.current.store(at, Ordering::Relaxed);
                    *connection = Some(Connection { at, channel: channel.clone() });
                    return Ok((at, channel));
                }
                Err(e) => {
                    let (message, refusal) = said(&e);
                    (last, tls) = (format!("{endpoint}: {message}"), refusal);
                }
            }
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint could be connected to; last: {last}"),
            tls,
        })
    }

    /// Drops the connection to endpoint `at` (it failed a call) so that the next call dials the
    /// next endpoint.
    async fn failed(&self, at: usize) {
        let mut connection = self.connection.lock().await;
        if connection.as_ref().is_some_and(|c| c.at == at) {
            *connection = None;
            self.current.store((at + 1) % self.endpoints.len(), Ordering::Relaxed);
            self.moved.send_modify(|n| *n += 1);
        }
    }

    /// Drops the connection, whatever its state, so that the next call dials afresh: the
    /// endpoint's name resolved again, the TLS files read again. Watches on it end, as when it
    /// fails over, and are opened again on the new one, so the client still holds one
    /// connection. The same endpoint is dialled first. The fleet's confirmation of a new
    /// generation proves the route with it (docs/decisions.md, "Confirm or go back").
    pub async fn reconnect(&self) {
        let mut connection = self.connection.lock().await;
        if connection.take().is_some() {
            self.moved.send_modify(|n| *n += 1);
        }
    }

    fn token(&self) -> Option<String> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the token, so the next request logs in again (a watch refused for its token).
    pub fn forget_token(&self) {
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A request carrying the token of the login, when there is one.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = self.token().and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        request
    }

    /// Logs in when there is a login and no token yet.
    async fn ensure_token(&self) -> Result<(), Error> {
        let Some((user, password)) = &self.login else { return Ok(()) };
        if self.token().is_some() {
            return Ok(());
        }
        // The password is in the request only: no error or log line carries a request.
        let answer = self
            .call_once("a login", |channel| {
                let request = tonic::Request::new(rpc::AuthenticateRequest {
                    name: user.clone(),
                    password: password.expose_secret().to_owned(),
                });
                async move { AuthClient::new(channel).authenticate(request).await }
            })
            .await?;
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer.token);
        Ok(())
    }

    /// One unary call, logged in first when etcd's auth is on by password, and once more with
    /// a new token when etcd says the one held expired (etcd's simple tokens last
    /// `--auth-token-ttl`, 300 s by default, after their last use).
    async fn call<T, F, Fut>(&self, call: &'static str, f: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with(call, &mut None, f).await
    }

    /// `call`, noting in `lost` why, when a try was sent and its answer never came (a write's
    /// outcome is then unknown, whatever the next endpoint answers).
    async fn call_with<T, F, Fut>(
        &self,
        call: &'static str,
        lost: &mut Option<String>,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.ensure_token().await?;
        match self.tries(call, lost, &f).await {
            Err(Error::Refused { why: Refusal::InvalidToken, .. }) if self.login.is_some() => {
                tracing::info!(
                    "etcd no longer takes the token of the last login (it expired): logging in again"
                );
                self.forget_token();
                self.ensure_token().await?;
                self.tries(call, lost, &f).await
            }
            answer => answer,
        }
    }

    /// One unary call, on the connection, and on each endpoint in turn while the one it is to
    /// cannot serve it.
    async fn call_once<T, F, Fut>(&self, call: &'static str, f: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.tries(call, &mut None, f).await
    }

    /// `call_once`, noting in `lost` a try that was sent and whose answer never came.
    async fn tries<T, F, Fut>(&self, call: &'static str, lost: &mut Option<String>, f: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let (mut last, mut tls) = (String::new(), None);
        for _ in 0..self.endpoints.len() {
            let (at, channel) = self.channel().await?;
            let endpoint = &self.endpoints[at];
            match tokio::time::timeout(CALL_TIMEOUT, f(channel)).await {
                Ok(Ok(answer)) => return Ok(answer.into_inner()),
                Ok(Err(status)) if another_may_answer(&status) => {
                    let (message, refusal) = said(&status);
                    (last, tls) = (format!("{endpoint}: {message}"), refusal);
                    if sent_and_lost(&status) {
                        *lost = Some(last.clone());
                    }
                }
                Ok(Err(status)) => {
                    if compacted(Some(status.code() as u64), status.message()) {
                        return Err(Error::Compacted(0));
                    }
                    return Err(Error::Refused {
                        endpoint: endpoint.clone(),
                        call,
                        why: refusal_of(&status),
                        message: status.message().to_owned(),
                    });
                }
                Err(_) => {
                    (last, tls) =
                        (format!("{endpoint}: no answer in {}", crate::system::human(CALL_TIMEOUT)), None);
                    *lost = Some(last.clone());
                }
            }
            self.failed(at).await;
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint answered {call}; last: {last}"),
            tls,
        })
    }

    fn kv(channel: Channel) -> KvClient<Channel> {
        KvClient::new(channel).max_decoding_message_size(ANSWER_LIMIT)
    }

    /// Every key under `prefix`, in key order, at `revision` (the latest when `None`).
    pub async fn range_prefix(&self, prefix: &str, revision: Option<i64>) -> Result<Range, Error> {
        let (key, range_end) = range_of(prefix);
        let message =
            rpc::RangeRequest { key, range_end, revision: revision.unwrap_or(0), ..Default::default() };
        let answer = match self
            .call("a range read", |channel| {
                let request = self.request(message.clone());
                async move { Self::kv(channel).range(request).await }
            })
            .await
        {
            Err(Error::Compacted(_)) => return Err(Error::Compacted(revision.unwrap_or(0))),
            other => other?,
        };
        let revision = answer.header.map_or(0, |h| h.revision);
        let mut kvs = Vec::with_capacity(answer.kvs.len());
        for kv in answer.kvs {
            let key = String::from_utf8(kv.key).map_err(|_| Error::Garbled {
                endpoint: self.endpoints[self.current.load(Ordering::Relaxed)].clone(),
                call: "a range read",
                message: "a key that is not UTF-8".into(),
            })?;
            kvs.push(Kv { key, value: kv.value, mod_revision: kv.mod_revision });
        }
        Ok(Range { revision, kvs })
    }

    /// One transaction: every write of `writes` when every condition of `conds` holds, else
    /// nothing. Returns the revision written, or `None` when a condition did not hold. etcd
    /// refuses a transaction whose writes overlap (a key put and deleted in one).
    pub async fn txn(&self, conds: &[Cond], writes: &[Write]) -> Result<Option<i64>, Error> {
        use rpc::compare::{CompareResult, CompareTarget, TargetUnion};
        use rpc::request_op::Request as Op;
        let compare = conds
            .iter()
            .map(|c| match c {
                // Every key under the prefix was last written at or before `revision`.
                Cond::UnchangedSince { prefix, revision } => {
                    let (key, range_end) = range_of(prefix);
                    rpc::Compare {
                        result: CompareResult::Less as i32,
                        target: CompareTarget::Mod as i32,
                        key,
                        range_end,
                        target_union: Some(TargetUnion::ModRevision(revision + 1)),
                    }
                }
                // A key that is not there was created at revision 0.
                Cond::Absent(key) => rpc::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: key.as_bytes().to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                },
                Cond::WrittenAt(key, revision) => rpc::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.as_bytes().to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(TargetUnion::ModRevision(*revision)),
                },
                Cond::LeaseIs(key, lease) => rpc::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Lease as i32,
                    key: key.as_bytes().to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(TargetUnion::Lease(*lease)),
                },
            })
            .collect();
        let success = writes
            .iter()
            .map(|w| rpc::RequestOp {
                request: Some(match w {
                    Write::Put { key, value, lease } => Op::RequestPut(rpc::PutRequest {
                        key: key.as_bytes().to_vec(),
                        value: value.clone(),
                        lease: *lease,
                        ..Default::default()
                    }),
                    Write::Delete(key) => Op::RequestDeleteRange(rpc::DeleteRangeRequest {
                        key: key.as_bytes().to_vec(),
                        ..Default::default()
                    }),
                    Write::DeletePrefix(prefix) => {
                        let (key, range_end) = range_of(prefix);
                        Op::RequestDeleteRange(rpc::DeleteRangeRequest {
                            key,
                            range_end,
                            ..Default::default()
                        })
                    }
                }),
            })
            .collect();
        let message = rpc::TxnRequest { compare, success, failure: Vec::new() };
        let mut lost = None;
        let answer = self
            .call_with("a transaction", &mut lost, |channel| {
                let request = self.request(message.clone());
                async move { Self::kv(channel).txn(request).await }
            })
            .await;
        let unknown =
            |message: String| Error::Unknown { endpoints: self.endpoints(), call: "a transaction", message };
        match (answer, lost) {
            (Ok(answer), _) if answer.succeeded => Ok(Some(answer.header.map_or(0, |h| h.revision))),
            // An earlier try whose answer was lost may be what made the condition fail now: a
            // conditional write sent again cannot say "nothing was written".
            (Ok(_), Some(lost)) | (Err(Error::Unreachable { .. }), Some(lost)) => Err(unknown(lost)),
            (Ok(_), None) => Ok(None),
            (Err(e), _) => Err(e),
        }
    }

    /// Ends a lease at once: the keys bound to it go now rather than at its TTL.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        self.call("a lease revocation", |channel| {
            let request = self.request(rpc::LeaseRevokeRequest { id });
            async move { LeaseClient::new(channel).lease_revoke(request).await }
        })
        .await?;
        Ok(())
    }

    /// Puts one key; bound to `lease` when it is not 0, so that it goes when the lease does.
    async fn put_in(&self, key: &str, value: &[u8], lease: i64) -> Result<i64, Error> {
        let message = rpc::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        };
        let answer = self
            .call("a put", |channel| {
                let request = self.request(message.clone());
                async move { Self::kv(channel).put(request).await }
            })
            .await?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Puts one key.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<i64, Error> {
        self.put_in(key, value, 0).await
    }

    /// Puts one key bound to a lease: it goes when the lease does.
    pub async fn put_with_lease(&self, key: &str, value: &[u8], lease: i64) -> Result<i64, Error> {
        self.put_in(key, value, lease).await
    }

    /// Takes a lease of `ttl` seconds; returns its id.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, Error> {
        let answer = self
            .call("a lease grant", |channel| {
                let request = self.request(rpc::LeaseGrantRequest { ttl, id: 0 });
                async move { LeaseClient::new(channel).lease_grant(request).await }
            })
            .await?;
        Ok(answer.id)
    }

    /// Renews a lease once, on a LeaseKeepAlive stream of the connection: one request, one
    /// answer. `false` when it had expired already (its keys are gone).
    pub async fn lease_keepalive(&self, id: i64) -> Result<bool, Error> {
        let answer = self
            .call("a lease renewal", |channel| {
                let request = self.request(futures_util::stream::iter([rpc::LeaseKeepAliveRequest { id }]));
                async move {
                    let mut answers = LeaseClient::new(channel).lease_keep_alive(request).await?.into_inner();
                    match answers.message().await? {
                        Some(answer) => Ok(tonic::Response::new(answer)),
                        None => Err(tonic::Status::unavailable("the lease's stream ended without an answer")),
                    }
                }
            })
            .await?;
        Ok(answer.ttl > 0)
    }

    /// Makes `role` (when missing) and grants it `permission` (`READ`, `WRITE`, `READWRITE`) on
    /// `key`, or on every key under it when `prefix`.
    pub async fn grant(&self, role: &str, permission: &str, key: &str, prefix: bool) -> Result<(), Error> {
        let add = self
            .call("a role", |channel| {
                let request = self.request(rpc::AuthRoleAddRequest { name: role.to_owned() });
                async move { AuthClient::new(channel).role_add(request).await }
            })
            .await;
        match add {
            Err(Error::Refused { why: Refusal::AlreadyExists, .. }) => {}
            other => {
                other?;
            }
        }
        use pb::authpb::permission::Type;
        let perm_type = match permission {
            "READ" => Type::Read,
            "WRITE" => Type::Write,
            _ => Type::Readwrite,
        };
        let perm = pb::authpb::Permission {
            perm_type: perm_type as i32,
            key: key.as_bytes().to_vec(),
            range_end: if prefix { prefix_end(key) } else { Vec::new() },
        };
        self.call("a grant", |channel| {
            let request = self.request(rpc::AuthRoleGrantPermissionRequest {
                name: role.to_owned(),
                perm: Some(perm.clone()),
            });
            async move { AuthClient::new(channel).role_grant_permission(request).await }
        })
        .await?;
        Ok(())
    }

    /// Makes `user` (when missing: an existing user keeps its password) and gives it `role`.
    /// Without a password, the user has none (etcd's `no_password`): it is known by the CN of
    /// its client certificate only, and no login can be made as it.
    pub async fn user_with_role(
        &self,
        user: &str,
        password: Option<&SecretString>,
        role: &str,
    ) -> Result<bool, Error> {
        let add = self
            .call("a user", |channel| {
                let request = self.request(rpc::AuthUserAddRequest {
                    name: user.to_owned(),
                    password: password.map(|p| p.expose_secret().to_owned()).unwrap_or_default(),
                    options: Some(pb::authpb::UserAddOptions { no_password: password.is_none() }),
                    hashed_password: String::new(),
                });
                async move { AuthClient::new(channel).user_add(request).await }
            })
            .await;
        let made = match add {
            Err(Error::Refused { why: Refusal::AlreadyExists, .. }) => false,
            other => {
                other?;
                true
            }
        };
        self.call("a role for a user", |channel| {
            let request =
                self.request(rpc::AuthUserGrantRoleRequest { user: user.to_owned(), role: role.to_owned() });
            async move { AuthClient::new(channel).user_grant_role(request).await }
        })
        .await?;
        Ok(made)
    }

    /// Watches every key under each of `prefixes` from `start_revision` on, all on one Watch
    /// stream of the connection (one watcher per prefix), with progress notices. The watch ends
    /// (`next` says so) when the endpoint goes away; the caller watches anew from what it saw.
    pub async fn watch_prefixes(&self, prefixes: &[String], start_revision: i64) -> Result<Watch, Error> {
        self.ensure_token().await?;
        let (mut last, mut tls) = (String::new(), None);
        for _ in 0..self.endpoints.len() {
            // Taken before the channel: a move while the watch opens is seen by it.
            let moved = self.moved.subscribe();
            let (at, channel) = self.channel().await?;
            let endpoint = self.endpoints[at].clone();
            // The creations are queued before the stream opens: etcd answers the stream's
            // headers with its first message, the first creation's answer.
            let (tx, rx) = mpsc::channel(prefixes.len().max(1));
            for prefix in prefixes {
                let (key, range_end) = range_of(prefix);
                let create = rpc::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision,
                    progress_notify: true,
                    ..Default::default()
                };
                let request = rpc::WatchRequest {
                    request_union: Some(rpc::watch_request::RequestUnion::CreateRequest(create)),
                };
                // Room for every one: `rx` is right here.
                let _ = tx.try_send(request);
            }
            let requests =
                futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
            let opened = tokio::time::timeout(
                CALL_TIMEOUT,
                WatchClient::new(channel)
                    .max_decoding_message_size(ANSWER_LIMIT)
                    .watch(self.request(requests)),
            )
            .await;
            match opened {
                Ok(Ok(answers)) => {
                    return Ok(Watch {
                        _requests: tx,
                        answers: answers.into_inner(),
                        moved,
                        watchers: Watchers {
                            endpoint,
                            progress: vec![start_revision - 1; prefixes.len()],
                            created: 0,
                        },
                    });
                }
                Ok(Err(status)) if another_may_answer(&status) => {
                    let (message, refusal) = said(&status);
                    (last, tls) = (format!("{endpoint}: {message}"), refusal);
                }
                Ok(Err(status)) => {
                    return Err(Error::Refused {
                        endpoint,
                        call: "a watch",
                        why: refusal_of(&status),
                        message: status.message().to_owned(),
                    })
                }
                Err(_) => {
                    (last, tls) =
                        (format!("{endpoint}: no answer in {}", crate::system::human(CALL_TIMEOUT)), None);
                }
            }
            self.failed(at).await;
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint accepted a watch; last: {last}"),
            tls,
        })
    }
}

/// A condition of a transaction (`Etcd::txn`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    /// No key under `prefix` was written after `revision`.
    UnchangedSince {
        /// The prefix.
        prefix: String,
        /// The revision the caller read the prefix at.
        revision: i64,
    },
    /// The key is not there.
    Absent(String),
    /// The key is there and was last written at exactly this revision.
    WrittenAt(String, i64),
    /// The key is there and bound to exactly this lease (a writer's fence: a holder whose lease
    /// ended, and whose key someone else took, writes nothing).
    LeaseIs(String, i64),
}

/// A write of a transaction (`Etcd::txn`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Puts a key, bound to `lease` unless it is 0.
    Put {
        /// The key.
        key: String,
        /// Its new value.
        value: Vec<u8>,
        /// The lease it goes with, or 0.
        lease: i64,
    },
    /// Deletes one key.
    Delete(String),
    /// Deletes every key under a prefix.
    DeletePrefix(String),
}

/// What a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Every prefix's watcher is in place.
    Created,
    /// Keys under a prefix changed; the revision of the last change.
    Changed(i64),
    /// A progress notice: every watcher is alive, and has sent every change up to the
    /// revision given (`Watch::seen`).
    Progress(i64),
}

/// The watchers of one client's prefixes on one Watch stream, read with `next`.
pub struct Watch {
    /// The request side of the stream, held open: dropping it would end the stream.
    _requests: mpsc::Sender<rpc::WatchRequest>,
    answers: tonic::Streaming<rpc::WatchResponse>,
    /// Changes when the client drops the connection this watch is on (for another endpoint, or
    /// `reconnect`).
    moved: tokio::sync::watch::Receiver<u64>,
    watchers: Watchers,
}

/// What a watch's answers have said so far.
struct Watchers {
    endpoint: String,
    /// Per watcher (etcd numbers them 0, 1... in the order created): the revision up to which
    /// it has sent every change, from its progress notices.
    progress: Vec<i64>,
    /// How many watchers etcd said it created.
    created: usize,
}

impl Watch {
    /// The next thing the watch saw. An error when the stream ended or broke (the caller
    /// watches again from `seen`), a watcher was cancelled, or etcd compacted the revision asked
    /// for (a full read).
    pub async fn next(&mut self) -> Result<Seen, Error> {
        loop {
            let answer = tokio::select! {
                answer = self.answers.message() => answer,
                // The sender lives as long as the client; gone, the watch goes too.
                _ = self.moved.changed() => {
                    return Err(Error::Unreachable {
                        endpoints: self.watchers.endpoint.clone(),
                        message: "the client dropped its connection (for another endpoint, or to dial afresh); the watch follows it".into(),
                        tls: None,
                    })
                }
            };
            let answer = match answer {
                Ok(Some(answer)) => answer,
                Ok(None) => {
                    return Err(Error::Unreachable {
                        endpoints: self.watchers.endpoint.clone(),
                        message: "the watch ended".into(),
                        tls: None,
                    })
                }
                Err(status) => {
                    let (message, tls) = said(&status);
                    return Err(Error::Unreachable {
                        endpoints: self.watchers.endpoint.clone(),
                        message: format!("the watch broke: {message}"),
                        tls,
                    });
                }
            };
            if let Some(seen) = self.watchers.read(&answer)? {
                return Ok(seen);
            }
        }
    }

    /// The revision up to which every watcher has sent every change: where a new watch resumes
    /// from (`seen() + 1`) without missing anything.
    pub fn seen(&self) -> i64 {
        self.watchers.seen()
    }
}

impl Watchers {
    fn seen(&self) -> i64 {
        self.progress.iter().copied().min().unwrap_or(0)
    }

    /// What one answer says: `None` for one that says nothing to act on yet.
    fn read(&mut self, answer: &rpc::WatchResponse) -> Result<Option<Seen>, Error> {
        if answer.compact_revision > 0 {
            return Err(Error::Compacted(answer.compact_revision));
        }
        if answer.canceled {
            let reason =
                if answer.cancel_reason.is_empty() { "no reason given" } else { &answer.cancel_reason };
            return Err(Error::Cancelled {
                endpoint: self.endpoint.clone(),
                why: Refusal::of_status(reason),
                reason: reason.to_owned(),
            });
        }
        if answer.created {
            self.created += 1;
            return Ok((self.created == self.progress.len()).then_some(Seen::Created));
        }
        if let Some(last) = answer.events.iter().filter_map(|e| e.kv.as_ref()).map(|kv| kv.mod_revision).max()
        {
            return Ok(Some(Seen::Changed(last)));
        }
        // No events: a progress notice, everything up to the header's revision sent.
        let revision = answer.header.as_ref().map_or(0, |h| h.revision);
        let Some(at) = usize::try_from(answer.watch_id).ok().and_then(|id| self.progress.get_mut(id)) else {
            return Ok(None);
        };
        *at = (*at).max(revision);
        Ok(Some(Seen::Progress(self.seen())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watchers(n: usize, from: i64) -> Watchers {
        Watchers { endpoint: "http://127.0.0.1:2379".into(), progress: vec![from - 1; n], created: 0 }
    }

    fn answer(watch_id: i64, revision: i64) -> rpc::WatchResponse {
        rpc::WatchResponse {
            header: Some(rpc::ResponseHeader { revision, ..Default::default() }),
            watch_id,
            ..Default::default()
        }
    }

    #[test]
    fn a_watch_answer_is_read_as_etcd_means_it() {
        let mut w = watchers(2, 10);
        let created = rpc::WatchResponse { created: true, ..answer(0, 12) };
        assert_eq!(w.read(&created).unwrap(), None, "one of two watchers in place");
        let created = rpc::WatchResponse { created: true, ..answer(1, 12) };
        assert_eq!(w.read(&created).unwrap(), Some(Seen::Created), "both");
        assert_eq!(w.seen(), 9, "the creation's revision is not progress: older changes may follow");

        // Progress notices, one per watcher: the watch has sent everything up to the lower.
        assert_eq!(w.read(&answer(0, 20)).unwrap(), Some(Seen::Progress(9)));
        assert_eq!(w.read(&answer(1, 25)).unwrap(), Some(Seen::Progress(20)));
        assert_eq!(w.seen(), 20);

        let kv = |rev| pb::mvccpb::KeyValue { key: b"a".to_vec(), mod_revision: rev, ..Default::default() };
        let event = |rev| pb::mvccpb::Event { kv: Some(kv(rev)), ..Default::default() };
        let events = rpc::WatchResponse { events: vec![event(27), event(29)], ..answer(1, 29) };
        assert_eq!(w.read(&events).unwrap(), Some(Seen::Changed(29)), "the last change's revision");

        // A watch from a revision compacted away: a full read follows.
        let compacted = rpc::WatchResponse { canceled: true, compact_revision: 40, ..answer(0, 50) };
        assert!(matches!(w.read(&compacted), Err(Error::Compacted(40))));
        // What etcd 3.4 answers a watch of keys the user may not read: taken, then cancelled,
        // the gRPC status written out in the reason.
        let denied = rpc::WatchResponse {
            created: true,
            canceled: true,
            cancel_reason: "rpc error: code = PermissionDenied desc = etcdserver: permission denied".into(),
            ..answer(-1, 50)
        };
        let e = w.read(&denied).unwrap_err();
        assert!(matches!(e, Error::Cancelled { why: Refusal::PermissionDenied, .. }), "{e:?}");
        assert!(e.to_string().contains("cancelled the watch: rpc error: code = PermissionDenied"), "{e}");
        let bare = rpc::WatchResponse { canceled: true, ..answer(0, 50) };
        let e = w.read(&bare).unwrap_err();
        assert!(matches!(e, Error::Cancelled { why: Refusal::Other(None), .. }), "{e:?}");
        assert!(e.to_string().contains("no reason given"), "{e}");
    }

    /// etcd's refusals, as gRPC statuses: read by code, and by etcd's fixed words only where
    /// one code means several things.
    #[test]
    fn a_refusal_is_read_by_its_grpc_code() {
        use tonic::{Code, Status};
        let read = |code: Code, m: &str| {
            let status = Status::new(code, m);
            (refusal_of(&status), compacted(Some(status.code() as u64), status.message()))
        };
        assert_eq!(
            read(Code::Unauthenticated, "etcdserver: invalid auth token"),
            (Refusal::InvalidToken, false)
        );
        assert_eq!(
            read(Code::PermissionDenied, "etcdserver: permission denied"),
            (Refusal::PermissionDenied, false)
        );
        let role = read(Code::FailedPrecondition, "etcdserver: role name already exists");
        assert_eq!(role, (Refusal::AlreadyExists, false));
        let user = read(Code::FailedPrecondition, "etcdserver: user name already exists");
        assert_eq!(user, (Refusal::AlreadyExists, false));
        let not_found = read(Code::FailedPrecondition, "etcdserver: role name not found");
        assert_eq!(not_found, (Refusal::Other(Some(9)), false), "the same code, another meaning");
        assert!(read(Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted").1);
        let future = read(Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision");
        assert_eq!(future, (Refusal::Other(Some(11)), false), "out of range, not compacted");

        let status = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
        assert_eq!(Refusal::of_status(status), Refusal::PermissionDenied);
        assert_eq!(Refusal::of_status("no reason given"), Refusal::Other(None));

        // A member going away, stopping or without a leader: another endpoint is tried.
        assert!(another_may_answer(&Status::unavailable("etcdserver: no leader")));
        assert!(!another_may_answer(&Status::permission_denied("etcdserver: permission denied")));
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
        let two = Etcd::new("http://10.0.0.1:2379, http://10.0.0.2:2379/", &none).unwrap();
        assert_eq!(two.endpoints(), "http://10.0.0.1:2379,http://10.0.0.2:2379");

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
    fn tls_refusals_carry_a_hint() {
        assert!(TlsRefusal::ServerCertificate.hint().contains("--etcd-ca"));
        assert!(TlsRefusal::ClientCertificateRequired.hint().contains("--etcd-cert"));
        assert!(TlsRefusal::NoClientCertificate.hint().contains("has none"));
    }

    /// Review 4, example 5: a TLS refusal is classified from rustls's error where the chain
    /// holds it (an alert after the handshake comes as tokio-rustls's `io::Error` wrapping
    /// rustls's, under hyper and tonic), not from the words of the message, which a refusal
    /// that is none can hold too.
    #[test]
    fn a_tls_refusal_is_read_from_rustls_in_the_error_chain_not_from_words() {
        use rustls::{AlertDescription as Alert, CertificateError as Cert};
        let under_tonic = |e: rustls::Error| {
            tonic::Status::from_error(Box::new(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
        };
        let cases = [
            (rustls::Error::AlertReceived(Alert::CertificateExpired), Some(TlsRefusal::ClientCertificate)),
            (rustls::Error::AlertReceived(Alert::BadCertificate), Some(TlsRefusal::ClientCertificate)),
            (rustls::Error::AlertReceived(Alert::CertificateRevoked), Some(TlsRefusal::ClientCertificate)),
            (rustls::Error::AlertReceived(Alert::UnknownCA), Some(TlsRefusal::ClientCertificate)),
            (
                rustls::Error::AlertReceived(Alert::CertificateRequired),
                Some(TlsRefusal::ClientCertificateRequired),
            ),
            (rustls::Error::InvalidCertificate(Cert::NotValidForName), Some(TlsRefusal::ServerName)),
            (rustls::Error::InvalidCertificate(Cert::UnknownIssuer), Some(TlsRefusal::ServerCertificate)),
            (rustls::Error::InvalidCertificate(Cert::Expired), Some(TlsRefusal::ServerCertificate)),
            (rustls::Error::AlertReceived(Alert::HandshakeFailure), None),
            (rustls::Error::DecryptError, None),
        ];
        for (e, want) in cases {
            let shown = format!("{e:?}");
            let status = under_tonic(e);
            assert_eq!(TlsRefusal::in_chain(&status), want, "{shown}");
            let (message, tls) = said(&status);
            assert_eq!(tls, want, "{shown}");
            assert_eq!(message.ends_with(')'), want.is_some(), "a hint only for a refusal: {message}");
        }
        let e = Error::Unreachable {
            endpoints: "https://e:2379".into(),
            message: said(&under_tonic(rustls::Error::AlertReceived(Alert::CertificateRevoked))).0,
            tls: said(&under_tonic(rustls::Error::AlertReceived(Alert::CertificateRevoked))).1,
        };
        assert!(e.certificate_refused(), "{e}");

        // Words alone are no refusal: a message that says one, with no rustls error under it.
        for words in ["received fatal alert: BadCertificate", "invalid peer certificate: UnknownIssuer"] {
            let status = tonic::Status::from_error(Box::new(std::io::Error::other(words)));
            assert_eq!(TlsRefusal::in_chain(&status), None, "{words}");
            let e =
                Error::Unreachable { endpoints: "e".into(), message: said(&status).0, tls: said(&status).1 };
            assert!(!e.certificate_refused(), "{e}");
        }

        // The connector's own word, carried through the io::Error the channel wants.
        let dial = Dial { message: "TLS: closed".into(), tls: Some(TlsRefusal::ClientCertificate) };
        let status = tonic::Status::from_error(Box::new(std::io::Error::other(dial)));
        assert_eq!(TlsRefusal::in_chain(&status), Some(TlsRefusal::ClientCertificate));
        assert!(said(&status).0.contains("etcd refused the client certificate of --etcd-cert"));
    }
}
