//! `/metrics` and `/healthz` over plain HTTP/1.1, loopback by default.
//!
//! Hand-written rather than a web framework: two read-only GET routes for a scraper do not
//! justify a server stack in a root daemon, and a small loop is easy to audit. Each request
//! is bounded in size and time, connections are closed after one response, and at most
//! `CONNECTIONS` are served at once (issue 12, fault 9: there was no limit, so a flood of
//! connections could take every file descriptor the agent has, and with them its ability to
//! open the files it manages).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::metrics::Metrics;

/// Whether the agent is healthy, for `/healthz`.
pub type Health = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How many connections are served at once. A scraper and a health check need one each; the
/// rest is headroom. Connections past the limit are not accepted until a slot frees: they wait
/// in the kernel's listen queue, where they cost the agent no descriptor and no task.
pub const CONNECTIONS: usize = 64;

/// How long a client has, from its connection's acceptance, to send its whole request. A
/// scraper sends it at once; a client that trickles bytes (slowloris) or sends nothing is cut
/// off here, so it holds a slot for this long at most.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(5);

/// How long writing an answer may take, for a client that does not read it.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Binds and serves until `shutdown`. Returns the bound address (for port 0) and the task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    let task = tokio::spawn(async move {
        loop {
            // A slot before the connection, not after: a connection accepted only to be closed
            // for want of a slot would still cost a descriptor while it lasts, and a client
            // refused that way retries at once. The semaphore is never closed.
            let slot = tokio::select! {
                _ = shutdown.cancelled() => return,
                slot = Arc::clone(&slots).acquire_owned() => slot,
            };
            let Ok(slot) = slot else { return };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else {
                // Out of descriptors, most likely: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let metrics = Arc::clone(&metrics);
            let health = Arc::clone(&health);
            tokio::spawn(async move {
                // Held until the connection is done, whichever way it ends.
                let _slot = slot;
                let _ = respond(stream, &metrics, &health).await;
            });
        }
    });
    Ok((bound, task))
}

/// Reads a request's head (up to the blank line), or `None` when the client closed first or
/// sent more than a head should be.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() > 8192 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(Some(buf))
}

/// The value of a request header (its name compared without case), the first if repeated.
fn header<'a>(request: &'a str, name: &str) -> Option<&'a str> {
    request.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

async fn respond(mut stream: TcpStream, metrics: &Metrics, health: &Health) -> std::io::Result<()> {
    // Too slow, closed early or too long: the connection is dropped without an answer.
    let Ok(Ok(Some(buf))) = tokio::time::timeout(REQUEST_LIMIT, read_head(&mut stream)).await else {
        return Ok(());
    };
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let (content_type, body) = metrics.exposition(header(&request, "accept"));
            ("200 OK", content_type, body)
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
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(ANSWER_LIMIT, answer).await.unwrap_or(Ok(()))
}
