//! `/metrics` and `/healthz` over plain HTTP/1.1, loopback by default.
//!
//! Hand-written rather than a web framework: two read-only GET routes for a scraper do not
//! justify a server stack in a root daemon, and a small loop is easy to audit. Each request
//! is bounded in size and time, and connections are closed after one response.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::metrics::Metrics;

/// Whether the agent is healthy, for `/healthz`.
pub type Health = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Binds and serves until the task is dropped. Returns the bound address (for port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let metrics = Arc::clone(&metrics);
            let health = Arc::clone(&health);
            tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), respond(stream, &metrics, &health)).await;
            });
        }
    });
    Ok((bound, task))
}

async fn respond(mut stream: TcpStream, metrics: &Metrics, health: &Health) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() > 8192 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.encode())
        }
        ("GET", "/healthz") => match health() {
            Ok(()) => ("200 OK", "text/plain; charset=utf-8", "ok\n".to_owned()),
            Err(why) => ("503 Service Unavailable", "text/plain; charset=utf-8", format!("{why}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain; charset=utf-8", "try /metrics or /healthz\n".to_owned()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "GET only\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
