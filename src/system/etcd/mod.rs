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
//! is dialled; nothing else holds a connection open. A member that is only slow (it answers a
//! status request while a call waits) is kept (`timed`).
//!
//! TLS is made here, by the connector the channel dials with (rustls and ring, through
//! tokio-rustls), not by tonic's own TLS: the key and certificates are read again at every
//! connect, so a certificate renewed in place is taken at the next reconnect without a restart,
//! and a refusal can say that etcd asked for a certificate the client does not have.
//!
//! Here: the client, its calls and its failover from one endpoint to the next. `tls`: the TLS
//! files and the connector; `watch`: the Watch stream and what its answers say; `timed`: a
//! call's timeout, and a member busy told from one gone.

mod lease;
mod refusal;
mod timed;
mod tls;
mod watch;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use tonic::codegen::http;
use tonic::transport::Channel;

pub use lease::lease_patience;
use refusal::Patience;
pub use refusal::Refusal;
use refusal::{busy_answer, compacted, refusal_of, while_busy};

use timed::{busy, busy_said, count, Left, Timed};
pub use timed::{counts, Counts};
use tls::Connector;
pub use tls::{TlsFiles, TlsRefusal};
pub use watch::{Event, Seen, Watch};

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

/// The most keys one range answer holds: a larger range is read in pages of this many, all at
/// one revision (issue 43: a whole fleet's statuses in one answer cost etcd several times their
/// size in memory).
const PAGE: i64 = 1000;

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

/// The endpoints of a comma-separated list that are `http://` to a host other than loopback
/// (`127.0.0.0/8`, `::1`, `localhost`): where a declaration, a status and a login's password
/// and token would cross a network in the clear (docs/decisions.md, "Plaintext etcd only on
/// loopback"). A host given by any other name is counted as beyond loopback: what it resolves
/// to is not this code's to know, and may change.
pub fn plaintext_beyond_loopback(endpoints: &str) -> Vec<String> {
    endpoints
        .split(',')
        .map(|e| e.trim().trim_end_matches('/'))
        .filter(|e| e.starts_with("http://"))
        .filter(|e| {
            let host = e.parse::<http::Uri>().ok().and_then(|u| u.host().map(str::to_owned));
            let host = host.as_deref().map(|h| h.trim_start_matches('[').trim_end_matches(']'));
            !host.is_some_and(|h| {
                h.eq_ignore_ascii_case("localhost")
                    || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            })
        })
        .map(str::to_owned)
        .collect()
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
pub(super) fn said(e: &(dyn std::error::Error + 'static)) -> (String, Option<TlsRefusal>) {
    let message = chain(e);
    match TlsRefusal::in_chain(e) {
        Some(tls) => (format!("{message} ({})", tls.hint()), Some(tls)),
        None => (message, None),
    }
}

/// One write of a transaction, as etcd takes it.
fn request_op(w: &Write) -> rpc::RequestOp {
    use rpc::request_op::Request as Op;
    rpc::RequestOp {
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
                Op::RequestDeleteRange(rpc::DeleteRangeRequest { key, range_end, ..Default::default() })
            }
        }),
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

/// How a range read is answered (etcd's two read paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The cluster's latest: the member asks the leader how far the log goes and answers once
    /// it has applied that far (etcd's read index). What every read is unless it says otherwise.
    Linearizable,
    /// What the member asked has applied, answered at once, without the leader: may be behind
    /// (by milliseconds in a healthy cluster; by as long as a member cut off from the others has
    /// been cut off), and answered by a member without quorum. Only for a read whose use is
    /// checked against the cluster's latest afterwards, such as a write whose transaction
    /// compares the revisions read (`fleet put`).
    Serializable,
}

/// A client for one cluster: one connection at a time, to one of its endpoints, tried in turn
/// starting with the last that answered (at first, a random one, or the first `in_order`).
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
    /// The lease keep-alive stream kept open between renewals, when one is.
    keepalive: tokio::sync::Mutex<Option<lease::KeepAlive>>,
    /// A paged read goes on for up to `READ_PATIENCE` when no endpoint answers a page
    /// (`patient`): an operator's command, not the agent, which has loops of its own.
    patient: bool,
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
        // A random endpoint first: a fleet of clients given one list spreads over its members
        // rather than all dialling the first (issue 43); `in_order` for the first first.
        let first = {
            use std::hash::BuildHasher as _;
            let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
            (random % endpoints.len() as u64) as usize
        };
        Ok(Etcd {
            endpoints,
            current: AtomicUsize::new(first),
            tls,
            connection: tokio::sync::Mutex::new(None),
            moved: tokio::sync::watch::Sender::new(0),
            login: None,
            token: std::sync::Mutex::new(None),
            keepalive: tokio::sync::Mutex::new(None),
            patient: false,
        })
    }

    /// Logs in to etcd's auth as `user` before the first request (and again when the token
    /// expires).
    pub fn with_login(mut self, user: String, password: SecretString) -> Etcd {
        self.login = Some((user, password));
        self
    }

    /// Dials the endpoints in the order given, the first first (`--etcd-in-order`), rather than
    /// starting at a random one.
    pub fn in_order(self) -> Etcd {
        self.current.store(0, Ordering::Relaxed);
        self
    }

    /// Paged reads go on through a cluster too busy to answer for a while (`READ_PATIENCE`):
    /// an operator's command, which has no loop of its own to try again in.
    pub fn patient(mut self) -> Etcd {
        self.patient = true;
        self
    }

    /// The endpoint dialled first, or dialled last.
    pub fn current(&self) -> &str {
        &self.endpoints[self.current.load(Ordering::Relaxed)]
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

    /// Drops the connection to endpoint `at` (it failed a call, as `why` says, naming it) so that
    /// the next call dials the next endpoint. Said in the log: the watches and the lease's
    /// stream follow to the new connection, and for a moment both are open.
    async fn failed(&self, at: usize, why: &str) {
        let mut connection = self.connection.lock().await;
        if connection.as_ref().is_some_and(|c| c.at == at) {
            *connection = None;
            let next = (at + 1) % self.endpoints.len();
            if next == at {
                tracing::warn!("dropping the connection to etcd and dialling it again: {why}");
            } else {
                tracing::warn!(
                    "leaving etcd endpoint {} for {}: {why}",
                    self.endpoints[at],
                    self.endpoints[next]
                );
            }
            self.current.store(next, Ordering::Relaxed);
            self.moved.send_modify(|n| *n += 1);
            self.drop_keepalive();
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
            self.drop_keepalive();
        }
    }

    /// Closes the kept keep-alive stream, so that it does not hold a dropped connection open
    /// until the next renewal. One in use now (its lock held) is closed by `lease_keepalive`
    /// itself when the renewal ends, since `moved` changed.
    fn drop_keepalive(&self) {
        if let Ok(mut kept) = self.keepalive.try_lock() {
            *kept = None;
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
        self.call_with(call, &mut None, tokio::time::Instant::now(), f).await
    }

    /// `call`, a try its member is judged busy for waited on until `until` (`Etcd::timed_until`):
    /// the opening of a lease's keep-alive stream, whose first answer is a renewal.
    async fn call_until<T, F, Fut>(
        &self,
        call: &'static str,
        until: tokio::time::Instant,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with(call, &mut None, until, f).await
    }

    /// `call`, noting in `lost` why, when a try was sent and its answer never came (a write's
    /// outcome is then unknown, whatever the next endpoint answers).
    async fn call_with<T, F, Fut>(
        &self,
        call: &'static str,
        lost: &mut Option<String>,
        until: tokio::time::Instant,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.ensure_token().await?;
        // Set when any try's answer was lost, across the asks of `while_busy`.
        let lost_any = std::sync::Mutex::new(lost.take());
        let answer = while_busy(self.patient, call, || async {
            let mut lost_now = None;
            let answer = match self.tries(call, &mut lost_now, until, &f).await {
                Err(Error::Refused { why: Refusal::InvalidToken, .. }) if self.login.is_some() => {
                    tracing::info!(
                        "etcd no longer takes the token of the last login (it expired): logging in again"
                    );
                    self.forget_token();
                    self.ensure_token().await?;
                    self.tries(call, &mut lost_now, until, &f).await
                }
                answer => answer,
            };
            if lost_now.is_some() {
                *lost_any.lock().unwrap_or_else(|e| e.into_inner()) = lost_now;
            }
            answer
        })
        .await;
        *lost = lost_any.into_inner().unwrap_or_else(|e| e.into_inner());
        answer
    }

    /// One unary call, on the connection, and on each endpoint in turn while the one it is to
    /// cannot serve it.
    async fn call_once<T, F, Fut>(&self, call: &'static str, f: F) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.tries(call, &mut None, tokio::time::Instant::now(), f).await
    }

    /// `call_once`, noting in `lost` a try that was sent and whose answer never came, and
    /// waiting on a busy member until `until` (`Etcd::timed_until`; no longer than the call
    /// timeout when that is past).
    async fn tries<T, F, Fut>(
        &self,
        call: &'static str,
        lost: &mut Option<String>,
        until: tokio::time::Instant,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let (mut last, mut tls) = (String::new(), None);
        for _ in 0..self.endpoints.len() {
            let (at, channel) = self.channel().await?;
            let endpoint = &self.endpoints[at];
            match self.timed_until(&channel, f(channel.clone()), until).await {
                Timed::Answered(Ok(answer)) => return Ok(answer.into_inner()),
                Timed::Answered(Err(status)) if busy_answer(&status) => {
                    count(Left::Busy);
                    let busy = busy_said(endpoint, call, status.message());
                    *lost = Some(busy.to_string());
                    return Err(busy);
                }
                Timed::Answered(Err(status)) if another_may_answer(&status) => {
                    let (message, refusal) = said(&status);
                    count(Left::Refused(&message));
                    (last, tls) = (format!("{endpoint}: {message}"), refusal);
                    if sent_and_lost(&status) {
                        *lost = Some(last.clone());
                    }
                }
                Timed::Answered(Err(status)) => {
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
                Timed::Busy => {
                    let busy = busy(endpoint, call);
                    *lost = Some(busy.to_string());
                    return Err(busy);
                }
                Timed::Gone => {
                    (last, tls) = (timed::silent(endpoint), None);
                    *lost = Some(last.clone());
                }
            }
            self.failed(at, &format!("{call}: {last}")).await;
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

    /// Every key under `prefix`, in key order, at `revision` (the latest when `None`): read in
    /// pages of `PAGE` keys, each at the first page's revision, so no answer holds a whole
    /// fleet's keys at once (etcd holds several times a large range in memory while it answers).
    pub async fn range_prefix(&self, prefix: &str, revision: Option<i64>) -> Result<Range, Error> {
        let (key, range_end) = range_of(prefix);
        self.range_pages(key, range_end, revision, Read::Linearizable).await
    }

    /// `range_prefix` at the latest revision, read as `read` says.
    pub async fn range_prefix_read(&self, prefix: &str, read: Read) -> Result<Range, Error> {
        let (key, range_end) = range_of(prefix);
        self.range_pages(key, range_end, None, read).await
    }

    /// Every key from `first` up to `end` (not included), as `range_prefix` reads them: in pages,
    /// at one revision.
    pub async fn range_between(
        &self,
        first: &str,
        end: &[u8],
        revision: Option<i64>,
    ) -> Result<Range, Error> {
        self.range_pages(first.as_bytes().to_vec(), end.to_vec(), revision, Read::Linearizable).await
    }

    async fn range_pages(
        &self,
        mut key: Vec<u8>,
        range_end: Vec<u8>,
        revision: Option<i64>,
        read: Read,
    ) -> Result<Range, Error> {
        let mut at = revision.unwrap_or(0);
        let mut kvs = Vec::new();
        loop {
            let message = rpc::RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                revision: at,
                limit: PAGE,
                serializable: read == Read::Serializable,
                ..Default::default()
            };
            let answer = match self.page(&message).await {
                Err(Error::Compacted(_)) => return Err(Error::Compacted(at)),
                other => other?,
            };
            if at == 0 {
                at = answer.header.map_or(0, |h| h.revision);
            }
            let more = answer.more;
            for kv in answer.kvs {
                let name = String::from_utf8(kv.key).map_err(|_| Error::Garbled {
                    endpoint: self.endpoints[self.current.load(Ordering::Relaxed)].clone(),
                    call: "a range read",
                    message: "a key that is not UTF-8".into(),
                })?;
                kvs.push(Kv { key: name, value: kv.value, mod_revision: kv.mod_revision });
            }
            match kvs.last() {
                // The next page starts just after the last key read.
                Some(last) if more => key = [last.key.as_bytes(), &[0]].concat(),
                _ => return Ok(Range { revision: at, kvs }),
            }
        }
    }

    /// One page of a range read. When no endpoint answers it and the client is `patient`, it
    /// is asked again, every endpoint in turn, after a pause of 0.5 s doubling to 4 s (each
    /// spread by up to a fifth, so that operators' commands started together do not ask in
    /// step), for up to `READ_PATIENCE`: a read has no effect, so asking again is always safe,
    /// and the page keeps the read's revision. Measured need: at 5,000 nodes, right after a
    /// promote, every member was too busy for a page within the 5 s call timeout
    /// (BENCHMARKS.md, "The fleet at scale, with the reflector").
    async fn page(&self, message: &rpc::RangeRequest) -> Result<rpc::RangeResponse, Error> {
        let mut patience = Patience::new();
        loop {
            let answer = self
                .call("a range read", |channel| {
                    let request = self.request(message.clone());
                    async move { Self::kv(channel).range(request).await }
                })
                .await;
            let Err(Error::Unreachable { endpoints, message: why, tls }) = answer else { return answer };
            // A TLS refusal is not a busy cluster: asking again would only be refused again.
            let pause = if self.patient && tls.is_none() { patience.next(&why) } else { None };
            let Some(pause) = pause else {
                let spent = patience.spent();
                let why = if spent >= Duration::from_secs(1) {
                    format!(
                        "{why} (the read was asked again for {})",
                        crate::system::human(Duration::from_secs(spent.as_secs()))
                    )
                } else {
                    why
                };
                return Err(Error::Unreachable { endpoints, message: why, tls });
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Every key under each of `prefixes`, all at one revision, in one read-only transaction:
    /// one round trip, whatever the number of prefixes (a node's: its admission, the fleet's,
    /// its groups', its own). Unpaged: for prefixes whose keys do not grow with the fleet.
    ///
    /// At the latest revision, linearizably, when `at` is `None`. At revision `at`, when given,
    /// serializably: answered from the member's own store, with no read index and no wait for
    /// its apply to catch up with the leader's log, which is what a revision a watch on this
    /// member announced needs (the member sent the event once it had applied it). A member that
    /// has not applied `at` refuses with `Refusal::FutureRevision`; one that compacted it away,
    /// with `Error::Compacted`.
    pub async fn read_prefixes(&self, prefixes: &[String], at: Option<i64>) -> Result<Range, Error> {
        use rpc::request_op::Request as Op;
        use rpc::response_op::Response;
        let success = prefixes
            .iter()
            .map(|p| {
                let (key, range_end) = range_of(p);
                rpc::RequestOp {
                    request: Some(Op::RequestRange(rpc::RangeRequest {
                        key,
                        range_end,
                        revision: at.unwrap_or(0),
                        serializable: at.is_some(),
                        ..Default::default()
                    })),
                }
            })
            .collect();
        let message = rpc::TxnRequest { compare: Vec::new(), success, failure: Vec::new() };
        let answer = self
            .call("a read", |channel| {
                let request = self.request(message.clone());
                async move { Self::kv(channel).txn(request).await }
            })
            .await?;
        let mut kvs = Vec::new();
        for response in answer.responses {
            let Some(Response::ResponseRange(range)) = response.response else { continue };
            for kv in range.kvs {
                let key = String::from_utf8(kv.key).map_err(|_| Error::Garbled {
                    endpoint: self.endpoints[self.current.load(Ordering::Relaxed)].clone(),
                    call: "a read",
                    message: "a key that is not UTF-8".into(),
                })?;
                kvs.push(Kv { key, value: kv.value, mod_revision: kv.mod_revision });
            }
        }
        // The header says the member's revision, past `at` when read at `at`.
        let revision = at.unwrap_or_else(|| answer.header.map_or(0, |h| h.revision));
        Ok(Range { revision, kvs })
    }

    /// The store's revision now, by a linearizable read of one key's count (nothing else comes
    /// back).
    pub async fn revision(&self, key: &str) -> Result<i64, Error> {
        Ok(self.count(key, 0).await?.0)
    }

    /// Whether etcd still holds its history from revision 1, that is, has never compacted it,
    /// and its revision now. A range at revision 1 answers only then.
    pub async fn never_compacted(&self, key: &str) -> Result<(bool, i64), Error> {
        match self.count(key, 1).await {
            Ok((now, _)) => Ok((true, now)),
            Err(Error::Compacted(_)) => Ok((false, self.revision(key).await?)),
            Err(e) => Err(e),
        }
    }

    /// How many keys `key` is at `revision` (0: the latest), and the store's revision.
    async fn count(&self, key: &str, revision: i64) -> Result<(i64, i64), Error> {
        let message = rpc::RangeRequest {
            key: key.as_bytes().to_vec(),
            revision,
            count_only: true,
            ..Default::default()
        };
        let answer = self
            .call("a range read", |channel| {
                let request = self.request(message.clone());
                async move { Self::kv(channel).range(request).await }
            })
            .await?;
        Ok((answer.header.map_or(0, |h| h.revision), answer.count))
    }

    /// One transaction: every write of `writes` when every condition of `conds` holds, else
    /// nothing. Returns the revision written, or `None` when a condition did not hold. etcd
    /// refuses a transaction whose writes overlap (a key put and deleted in one).
    pub async fn txn(&self, conds: &[Cond], writes: &[Write]) -> Result<Option<i64>, Error> {
        use rpc::compare::{CompareResult, CompareTarget, TargetUnion};
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
        let success = writes.iter().map(request_op).collect();
        let message = rpc::TxnRequest { compare, success, failure: Vec::new() };
        let mut lost = None;
        // The failpoint `etcd-txn-late` holds every transaction 6 s before it is sent, inside its
        // call timeout: a member that does not answer a call in time while it answers the rest,
        // for the test that such a member is kept.
        // The failpoint `etcd-txn-answer-late` holds a write's answer 6 s after etcd gave it:
        // a write that landed and whose answer was lost, as on a member whose apply is behind.
        let late = crate::system::fs::failpoint_named("etcd-txn-late")
            || crate::system::fs::failpoint_named("etcd-txn-late-status-late");
        let answer_late = crate::system::fs::failpoint_named("etcd-txn-answer-late") && !writes.is_empty();
        let answer = self
            .call_with("a transaction", &mut lost, tokio::time::Instant::now(), |channel| {
                let request = self.request(message.clone());
                async move {
                    if late {
                        tokio::time::sleep(Duration::from_secs(6)).await;
                    }
                    let answer = Self::kv(channel).txn(request).await;
                    if answer_late {
                        tokio::time::sleep(Duration::from_secs(6)).await;
                    }
                    answer
                }
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
}

impl Etcd {
    /// Whether etcd's auth is on, as etcd itself says it: a login is tried, without a token, as
    /// a user no one makes, with no password. etcd answers "authentication is not enabled"
    /// when it is off, and "authentication failed" when it is on. Asked so rather than by the
    /// `AuthStatus` call, which etcd 3.4 (Debian's) lacks; and rather than by a call only root
    /// may make, which over TLS a certificate whose CN is `root` would pass either way.
    pub async fn auth_enabled(&self) -> Result<bool, Error> {
        let probe = self
            .call_once("a login, to learn whether auth is on", |channel| {
                let request = tonic::Request::new(rpc::AuthenticateRequest {
                    name: "mesh-host-auth-probe".to_owned(),
                    password: String::new(),
                });
                async move { AuthClient::new(channel).authenticate(request).await }
            })
            .await;
        match probe {
            Err(Error::Refused { message, .. }) if message.ends_with(AUTH_OFF) => Ok(false),
            Err(Error::Refused { .. }) | Ok(_) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Deletes `user`; `false` when etcd has no such user.
    pub async fn user_delete(&self, user: &str) -> Result<bool, Error> {
        let deleted = self
            .call("a user's deletion", |channel| {
                let request = self.request(rpc::AuthUserDeleteRequest { name: user.to_owned() });
                async move { AuthClient::new(channel).user_delete(request).await }
            })
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(Error::Refused { message, .. }) if message.ends_with(NOT_FOUND) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The ranges `role` is granted, each as its key and range end (empty for one key); none
    /// when etcd has no such role.
    pub async fn role_ranges(&self, role: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        let got = self
            .call("a role's permissions", |channel| {
                let request = self.request(rpc::AuthRoleGetRequest { role: role.to_owned() });
                async move { AuthClient::new(channel).role_get(request).await }
            })
            .await;
        match got {
            Ok(answer) => Ok(answer.perm.into_iter().map(|p| (p.key, p.range_end)).collect()),
            Err(Error::Refused { message, .. }) if message.ends_with(NOT_FOUND) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Takes from `role` its permission on the range `key`..`range_end` (one key when empty).
    pub async fn revoke_range(&self, role: &str, key: &[u8], range_end: &[u8]) -> Result<(), Error> {
        self.call("a permission's revocation", |channel| {
            let request = self.request(rpc::AuthRoleRevokePermissionRequest {
                role: role.to_owned(),
                key: key.to_vec(),
                range_end: range_end.to_vec(),
            });
            async move { AuthClient::new(channel).role_revoke_permission(request).await }
        })
        .await?;
        Ok(())
    }

    /// Deletes `role` (and so every permission it grants); `false` when etcd has no such role.
    pub async fn role_delete(&self, role: &str) -> Result<bool, Error> {
        let deleted = self
            .call("a role's deletion", |channel| {
                let request = self.request(rpc::AuthRoleDeleteRequest { role: role.to_owned() });
                async move { AuthClient::new(channel).role_delete(request).await }
            })
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(Error::Refused { message, .. }) if message.ends_with(NOT_FOUND) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// etcd's words when its auth is off and a login is tried ("etcdserver: authentication is not
/// enabled", code 9, which also means other things).
const AUTH_OFF: &str = "authentication is not enabled";

/// etcd's words for a user or role that is not there ("etcdserver: user name not found",
/// "etcdserver: role name not found", code 9).
const NOT_FOUND: &str = "name not found";

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

#[cfg(test)]
mod tests;
