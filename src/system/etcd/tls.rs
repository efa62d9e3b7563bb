//! TLS to etcd: the files (read again at every connection), the connector the channel dials
//! with, and what a refusal of etcd's means, in words.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::ExposeSecret as _;
use tonic::codegen::http;

use super::{chain, Error, PEM_LIMIT};

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
    pub(super) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The TLS configuration these files make, read from them now: etcd's certificate checked
    /// against the CA, the client's certificate shown when there is one, and HTTP/2 asked for
    /// (gRPC's). Without a certificate, the resolver that notes whether etcd asked for one.
    pub(super) fn config(&self) -> Result<(rustls::ClientConfig, Option<Arc<NoCertificate>>), String> {
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
pub(super) struct NoCertificate {
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
    pub(super) fn of(e: &rustls::Error) -> Option<TlsRefusal> {
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
    pub(super) fn in_chain(e: &(dyn std::error::Error + 'static)) -> Option<TlsRefusal> {
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
    pub(super) fn hint(self) -> &'static str {
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
pub(super) struct Dial {
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

/// What the channel dials with: TCP, and TLS over it for `https://` endpoints, the files read
/// again at every connect.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) tls: Option<Arc<TlsFiles>>,
}

/// A connection the channel speaks HTTP/2 over: plain TCP or TLS.
pub(super) trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
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

#[cfg(test)]
mod tests {
    use super::super::said;
    use super::*;

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
