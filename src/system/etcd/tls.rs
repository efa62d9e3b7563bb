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

/// What etcd's TLS refusal means, for the operator reading it: the hint beside rustls's own
/// words, which are exact but terse. `asked` when etcd asked this client, which has no
/// certificate, for one.
pub(super) fn tls_hint(message: &str, asked: bool) -> &'static str {
    if asked {
        " (etcd asked for a client certificate and mesh-host has none: give --etcd-cert and --etcd-key, a certificate signed by the CA etcd trusts)"
    } else if message.contains("not valid for name") {
        " (etcd's certificate does not name the host or address the endpoint gives: use one it names)"
    } else if message.contains("invalid peer certificate") {
        " (etcd's certificate is not signed by the CA of --etcd-ca, or is not valid now)"
    } else if message.contains("CertificateRequired") {
        " (etcd asks for a client certificate signed by the CA it trusts: give --etcd-cert and --etcd-key)"
    } else if message.contains("BadCertificate")
        || message.contains("CertificateExpired")
        || message.contains("CertificateRevoked")
        || message.contains("UnknownCA")
    {
        CERTIFICATE_REFUSED
    } else {
        ""
    }
}

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
async fn connect(uri: &http::Uri, tls: Option<&TlsFiles>) -> Result<Connected, String> {
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
    let stream =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| {
            let message = chain(&e);
            let asked = no_certificate.as_ref().is_some_and(|n| n.asked.load(Ordering::Relaxed));
            let hint = tls_hint(&message, asked);
            format!("TLS: {message}{hint}")
        })?;
    // Under TLS 1.3 etcd refuses a client without a certificate only after the handshake: said
    // now, in words, rather than as the connection closed a moment later.
    if no_certificate.is_some_and(|n| n.asked.load(Ordering::Relaxed)) {
        return Err(format!(
            "TLS: {}",
            tls_hint("", true).trim_start().trim_start_matches('(').trim_end_matches(')')
        ));
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
async fn accepted<S>(mut stream: S) -> Result<Primed<S>, String>
where
    S: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt as _;
    let mut first = vec![0; 16 << 10];
    match tokio::time::timeout(FIRST_BYTES, stream.read(&mut first)).await {
        Ok(Ok(0)) => Err(format!(
            "TLS: etcd closed the connection just after the handshake, as it does when it refuses the client's certificate{CERTIFICATE_REFUSED}"
        )),
        Ok(Ok(n)) => {
            first.truncate(n);
            Ok(Primed { first, at: 0, inner: stream })
        }
        Ok(Err(e)) => {
            let message = chain(&e);
            Err(format!("TLS: {message}{}", tls_hint(&message, false)))
        }
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

/// The hint beside TLS's words when etcd refused the client's certificate: what
/// `Error::certificate_refused` looks for.
const CERTIFICATE_REFUSED: &str = " (etcd refused the client certificate of --etcd-cert: not signed by the CA etcd trusts, expired, or revoked; write a valid one and its key in place, they are read again at every connection)";

impl Error {
    /// Whether etcd could not be reached because it refused the client's certificate: the
    /// operator's to mend, by writing a new one in place.
    pub fn certificate_refused(&self) -> bool {
        matches!(self, Error::Unreachable { message, .. } if message.contains(CERTIFICATE_REFUSED.trim_start()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_refusals_carry_a_hint() {
        assert!(tls_hint("invalid peer certificate: UnknownIssuer", false).contains("--etcd-ca"));
        assert!(tls_hint("received fatal alert: CertificateRequired", false).contains("--etcd-cert"));
        assert!(tls_hint("", true).contains("has none"));
        assert_eq!(tls_hint("Connection refused (os error 111)", false), "");
    }
}
