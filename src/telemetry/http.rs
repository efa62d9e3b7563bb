//! `/metrics` and `/healthz` over HTTP/1.1, loopback by default; with a web configuration file
//! (`web`), over TLS, with client certificates or basic auth, as Prometheus exporters take them.
//!
//! `/healthz` tells a caller who has not authenticated (any caller, without a web configuration)
//! only the verdict and its fixed lead ("no declaration in force"), never the detail after it:
//! paths, a foreign firewall's tables, the name and reason of whoever rolled the node back
//! (issue 45, point 6). The detail goes to the log, `mesh-host status`, and an authenticated
//! caller.
//!
//! Hand-written rather than a web framework: two read-only GET routes for a scraper do not
//! justify a server stack in a root daemon, and a small loop is easy to audit. Each request
//! is bounded in size and time, connections are closed after one response, and at most
//! `connections_for` of the agent's descriptor limit are held at once (issue 12, fault 9: there
//! was no limit, so a flood of connections could take every file descriptor the agent has, and
//! with them its ability to open the files it manages).
//!
//! The limit is kept by dropping the oldest connection held, never by leaving new ones
//! unaccepted (issue 22, point 6: a slot was taken before accepting, so 200 idle connections
//! from one local user filled the slots and the listen queue, and `/healthz` probes timed out
//! in the kernel, unseen by the agent). A probe is a new connection that sends its request at
//! once, so it is answered before a flood can make it the oldest.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{AbortHandle, JoinSet};

use super::metrics::Metrics;
use super::web::{WebConfig, WebConfigFile};

/// Whether the agent is healthy, for `/healthz`.
pub type Health = Arc<dyn Fn() -> Result<Option<String>, String> + Send + Sync>;

/// The most connections held at once, whatever the descriptor limit. A scraper and a health
/// check need one each; the rest is room for a flood to be cut down in, oldest first, while new
/// connections are still taken in. 256 connections held cost the agent 256 descriptors and
/// about 1.5 MiB (measured in RELIABILITY.md, "The endpoints under a connection flood").
pub const CONNECTIONS: usize = 256;

/// The fewest connections held at once, however low the descriptor limit.
const FEWEST: usize = 16;

/// How many connections are held at once under a soft descriptor limit of `nofile`: an eighth
/// of it, between `FEWEST` and `CONNECTIONS`. Under the unit file's 65,536 that is 256; under
/// the 1,024 a shell usually gives, 128, which leaves the rest for the agent's own work (its
/// cache of 256 directories and a batch of 512 files, the store, the watchers), so a flood can
/// never take the descriptors the files it manages need.
pub fn connections_for(nofile: u64) -> usize {
    usize::try_from(nofile / 8).unwrap_or(usize::MAX).clamp(FEWEST, CONNECTIONS)
}

/// How many connections may wait in the kernel's listen queue for the loop to accept them (the
/// kernel takes at most `net.core.somaxconn`). The loop accepts at once, so the queue only
/// fills when connections come faster than it runs: larger than std's 128, so a burst of a
/// thousand connects is queued rather than dropped (a dropped SYN is retried after a second,
/// which a probe with a one-second limit cannot wait for).
const BACKLOG: u32 = 1024;

/// How long a client has, from its connection's acceptance, to send its whole request. A
/// scraper sends it at once; a client that trickles bytes (slowloris) or sends nothing is cut
/// off here, so it holds a connection for this long at most, and less under a flood.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(5);

/// How long writing an answer may take, for a client that does not read it.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Binds and serves until `shutdown`, through the web configuration `web` when there is one.
/// Returns the bound address (for port 0) and the task.
pub async fn serve(
    addr: SocketAddr,
    web: Option<WebConfigFile>,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let most = connections_for(crate::system::descriptor_limit());
    serve_holding(addr, most, web, metrics, health, shutdown).await
}

/// Listens on `addr` with the larger backlog; the socket is made by hand for that, since
/// `TcpListener::bind` always asks for 128.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // As `TcpListener::bind` does: a restarted agent binds its port again at once, rather than
    // failing while the last one's connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// `serve`, holding at most `most` connections at once.
async fn serve_holding(
    addr: SocketAddr,
    most: usize,
    web: Option<WebConfigFile>,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = listen(addr)?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        // Every connection held, owned by this loop alone, so counting them and choosing the
        // one to drop need no lock. Returning drops the set, which ends every connection.
        let mut held = Held::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Some(ended) = held.tasks.join_next_with_id(), if !held.tasks.is_empty() => {
                    held.forget(ended);
                }
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        // Out of descriptors, most likely: wait rather than spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    held.make_room(most).await;
                    let (metrics, health, web) = (Arc::clone(&metrics), Arc::clone(&health), web.clone());
                    let task = held.tasks.spawn(async move {
                        let _ = connection(stream, web, &metrics, &health).await;
                    });
                    held.by_age.push_back(task);
                }
            }
        }
    });
    Ok((bound, task))
}

/// The connections being served, and the order they were accepted in.
///
/// Why drop the oldest rather than refuse the newest: a connection refused (or left in the
/// listen queue) is the one a probe just made, so a flood that holds every place blinds the
/// agent's health for as long as it likes; dropping the oldest keeps every place for the newest
/// connections, and a flood then only shortens the time its own connections live, never a
/// probe's (a probe would have to wait behind `most` newer connections before sending its
/// request). Why not a request deadline that shrinks under load instead: it bounds how long
/// each connection lives, not how many are held, so the descriptors taken would still grow
/// with the rate of the flood; a cap bounds them by a number, and the oldest is the one
/// nearest its deadline anyway.
#[derive(Default)]
struct Held {
    /// The connections' tasks, each holding its stream: a task ended, by its answer, a time
    /// limit or being aborted, has closed its connection.
    tasks: JoinSet<()>,
    /// The connections still held, oldest first. A connection aborted is taken out at once,
    /// one ended by itself when its end is collected.
    by_age: VecDeque<AbortHandle>,
}

impl Held {
    /// Drops the oldest connections until fewer than `most` are held, so that with the one
    /// being accepted there are at most `most`. Each is waited for, so its descriptor is closed
    /// before the next connection is taken in: the bound is on descriptors, not intentions.
    async fn make_room(&mut self, most: usize) {
        while self.tasks.len() >= most.max(1) {
            if let Some(oldest) = self.by_age.pop_front() {
                oldest.abort();
            }
            // The one aborted, or another that ended meanwhile: either way one fewer is held.
            match self.tasks.join_next_with_id().await {
                Some(ended) => self.forget(ended),
                None => return,
            }
        }
    }

    /// Takes a connection whose task has ended out of the order (a scan of at most `most`).
    fn forget(&mut self, ended: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        let id = match ended {
            Ok((id, ())) => id,
            Err(e) => e.id(),
        };
        self.by_age.retain(|task| task.id() != id);
    }
}

/// Reads a request's head (up to the blank line), or `None` when the client closed first or
/// sent more than a head should be.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Option<Vec<u8>>> {
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

/// One connection: under a web configuration, read again now, its TLS handshake (within the
/// request's time) and who the caller is; then the answer.
async fn connection(
    stream: TcpStream,
    web: Option<WebConfigFile>,
    metrics: &Metrics,
    health: &Health,
) -> std::io::Result<()> {
    let Some(web) = web else {
        return respond(stream, None, false, metrics, health).await;
    };
    let config = match web.load() {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!(error = %e, "the web configuration cannot be used; the connection is dropped");
            return Ok(());
        }
    };
    let Some(tls) = &config.tls else {
        return respond(stream, Some(&config), false, metrics, health).await;
    };
    let Ok(Ok(stream)) = tokio::time::timeout(REQUEST_LIMIT, tls.accept(stream)).await else {
        return Ok(());
    };
    // rustls verified any certificate shown against client_ca_file during the handshake.
    let certified =
        config.client_certificates && stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
    respond(stream, Some(&config), certified, metrics, health).await
}

/// Reads one request and answers it. `certified`: the caller showed a verified certificate.
async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    web: Option<&WebConfig>,
    certified: bool,
    metrics: &Metrics,
    health: &Health,
) -> std::io::Result<()> {
    // Too slow, closed early or too long: the connection is dropped without an answer.
    let Ok(Ok(Some(buf))) = tokio::time::timeout(REQUEST_LIMIT, read_head(&mut stream)).await else {
        return Ok(());
    };
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // As the exporter toolkit does: with users, every path asks for a login, a certificate or
    // not. A login, or a verified certificate, lets the caller see the health's detail.
    let users = web.map(|w| &w.users).filter(|u| !u.is_empty());
    let logged_in = users.is_some_and(|u| super::web::basic_auth_ok(u, header(&request, "authorization")));
    let authenticated = logged_in || certified;
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        _ if users.is_some() && !logged_in => {
            ("401 Unauthorized", "text/plain; charset=utf-8", "a login is needed\n".to_owned())
        }
        ("GET", "/metrics") => {
            let (content_type, body) = metrics.exposition(header(&request, "accept"));
            ("200 OK", content_type, body)
        }
        ("GET", "/healthz") => {
            let told = |text: String| if authenticated { text } else { lead(&text).to_owned() };
            match health() {
                Ok(None) => ("200 OK", "text/plain; charset=utf-8", "ok\n".to_owned()),
                Ok(Some(note)) => ("200 OK", "text/plain; charset=utf-8", format!("ok: {}\n", told(note))),
                Err(why) => {
                    ("503 Service Unavailable", "text/plain; charset=utf-8", format!("{}\n", told(why)))
                }
            }
        }
        ("GET", _) => ("404 Not Found", "text/plain; charset=utf-8", "try /metrics or /healthz\n".to_owned()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "GET only\n".to_owned()),
    };
    let challenge = if status.starts_with("401") { "WWW-Authenticate: Basic\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{challenge}Connection: close\r\n\r\n",
        body.len()
    );
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(ANSWER_LIMIT, answer).await.unwrap_or(Ok(()))
}

/// What `/healthz` tells a caller who has not authenticated of a health text the agent wrote:
/// its fixed lead, up to the first ": ", " since " or " (", after which come the things only
/// the node's operators should read (a path, a table, a user, a reason, a time). The texts are
/// the agent's own (`controller::health`, `generations::Hold::describe`), each made to lead
/// with its verdict.
fn lead(text: &str) -> &str {
    [": ", " since ", " ("].iter().filter_map(|cut| text.find(cut)).min().map_or(text, |at| &text[..at])
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    use super::*;

    /// Whether the daemon's end of `s` is still open: nothing to read yet, and no end of file.
    fn open(s: &TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let open = matches!((&*s).read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).unwrap();
        open
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_connections_held_are_an_eighth_of_the_descriptor_limit_within_bounds() {
        assert_eq!(connections_for(0), FEWEST);
        assert_eq!(connections_for(64), FEWEST);
        assert_eq!(connections_for(1024), 128);
        assert_eq!(connections_for(65_536), CONNECTIONS);
        assert_eq!(connections_for(u64::MAX), CONNECTIONS);
    }

    /// Issue 22, point 6: past the limit, the oldest connection is dropped and the newest is
    /// answered; before, the newest waited in the listen queue for a slot the idle ones held.
    #[test]
    fn past_the_limit_the_oldest_connection_is_dropped_and_a_probe_answered() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let health: Health = Arc::new(|| Ok(None));
        let (addr, task) = runtime
            .block_on(serve_holding(
                "127.0.0.1:0".parse().unwrap(),
                4,
                None,
                Arc::new(Metrics::new()),
                health,
                shutdown.clone(),
            ))
            .unwrap();
        // Four idle connections fill the places; each is in once the server could read it.
        let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        assert!(idle.iter().all(open), "four idle connections are held");
        // A fifth comes in, and the first goes.
        let fifth = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(idle.iter().map(open).collect::<Vec<_>>(), [false, true, true, true]);
        assert!(open(&fifth));
        // A probe is answered at once, in the place of the second.
        assert!(get(addr, "/healthz").ends_with("\r\n\r\nok\n"));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(idle.iter().map(open).collect::<Vec<_>>(), [false, false, true, true]);
        assert!(open(&fifth));
        shutdown.cancel();
        runtime.block_on(task).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!open(&fifth), "shutdown ends every connection");
    }

    #[test]
    fn an_unauthenticated_caller_is_told_only_the_lead_of_each_health_text() {
        let cases = [
            ("starting: the first apply has not finished", "starting"),
            ("no declaration in force: waiting for /etc/x: it does not exist yet", "no declaration in force"),
            (
                "declaration refused on this machine, nothing of it is applied: table ip guard chain c",
                "declaration refused on this machine, nothing of it is applied",
            ),
            ("the worker has not finished a reconcile for 700 s", "the worker has not finished a reconcile for 700 s"),
            (
                "held at generation 3 by rollback since 2026-12-05 17:00:00 UTC (by alice: bad deploy); a newer",
                "held at generation 3 by rollback",
            ),
            ("held at generation 3 by the node itself since 2026-12-05, reverted from 4", "held at generation 3 by the node itself"),
        ];
        for (text, told) in cases {
            assert_eq!(lead(text), told);
        }
    }
}
