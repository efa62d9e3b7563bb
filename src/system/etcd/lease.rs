//! Leases: granted, renewed on a keep-alive stream kept between renewals, revoked.

use super::{busy, busy_answer, busy_said, count, rpc, Channel, Error, Etcd, LeaseClient, Left, Timed};
use std::sync::atomic::Ordering;

/// A lease's keep-alive stream, kept open from one renewal to the next (`Etcd::lease_keepalive`):
/// a presence renewed every few seconds by every node of a fleet is otherwise a new stream each
/// time (at 10,000 nodes, about 3,300 streams opened and closed a second on the members).
pub(super) struct KeepAlive {
    /// `Etcd::moved` when it was opened: a stream of a connection since dropped is not used.
    moved: u64,
    /// The endpoint it is to, and the connection.
    at: usize,
    channel: Channel,
    send: tokio::sync::mpsc::Sender<rpc::LeaseKeepAliveRequest>,
    answers: tonic::Streaming<rpc::LeaseKeepAliveResponse>,
}

/// The failpoint `etcd-renew-late`: each renewal's answer, on a kept stream or as the first of a
/// new one, held 6 s, past the call timeout, as a member whose apply is behind holds it: the
/// test that such a renewal is waited for, not given up.
fn late() -> bool {
    crate::system::fs::failpoint_named("etcd-renew-late")
}

impl KeepAlive {
    /// One renewal on the stream: the lease's time left, in seconds (0: etcd has no such lease).
    /// Refused: the status etcd ended the stream with, when it gave one.
    async fn renew(&mut self, id: i64) -> Result<i64, Option<tonic::Status>> {
        self.send.send(rpc::LeaseKeepAliveRequest { id }).await.map_err(|_| None)?;
        let answer = self.answers.message().await;
        if late() {
            tokio::time::sleep(std::time::Duration::from_secs(6)).await;
        }
        match answer {
            Ok(Some(answer)) if answer.id == id => Ok(answer.ttl),
            Err(status) => Err(Some(status)),
            _ => Err(None),
        }
    }
}

/// How long a renewal of a lease last renewed (or granted) by a request sent at `renewed`, for
/// `ttl`, may wait on a busy member (`Etcd::lease_keepalive`): until a second before the lease
/// would end, when a later answer could not save it.
pub fn lease_patience(renewed: tokio::time::Instant, ttl: std::time::Duration) -> tokio::time::Instant {
    renewed + ttl.saturating_sub(std::time::Duration::from_secs(1))
}

impl Etcd {
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

    /// Takes a lease of `ttl` seconds with the id `id` (not 0), chosen by the caller and asked
    /// for again, the same, until it is granted: a grant whose answer was lost (a timeout on a
    /// busy cluster) may have been made, and asked again it is found there ("lease already
    /// exists") and taken as granted, where a new id each time would leave every lost one to
    /// expire in etcd, a revocation through its log each. The id is random over 63 bits
    /// (`system::random_id`): another client's lease of the same id is not to be expected.
    pub async fn lease_grant_as(&self, id: i64, ttl: i64) -> Result<i64, Error> {
        let granted = self
            .call("a lease grant", |channel| {
                let request = self.request(rpc::LeaseGrantRequest { ttl, id });
                async move { LeaseClient::new(channel).lease_grant(request).await }
            })
            .await;
        match granted {
            Ok(answer) => Ok(answer.id),
            Err(Error::Refused { why: super::Refusal::AlreadyExists, .. }) => Ok(id),
            Err(e) => Err(e),
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

    /// Renews lease `id` once; `false` when etcd no longer has it (expired, or revoked). On the
    /// keep-alive stream kept from the renewal before when there is one and its connection is
    /// still the client's; else, or when that stream fails, on a new stream, opened as any call
    /// is (failing over, logged in), and kept. A renewal not answered in the call timeout by a
    /// member that answers otherwise (busy), on the kept stream or on the one it opens, is
    /// waited for until `patient_until` (the moment the lease would be lost anyway, less a
    /// margin: `lease_patience`), since its late answer still renews the lease; one not answered
    /// by then closes the stream.
    pub async fn lease_keepalive(&self, id: i64, patient_until: tokio::time::Instant) -> Result<bool, Error> {
        let mut kept = self.keepalive.lock().await;
        let renewed = self.renew_kept(&mut kept, id, patient_until).await;
        // A connection dropped while the lock was held here (`Etcd::drop_keepalive` cannot take
        // it then): the stream kept may be on that connection, which it would hold open beside
        // the new one until the next renewal. Closed now.
        if kept.as_ref().is_some_and(|k| k.moved != *self.moved.borrow()) {
            *kept = None;
        }
        renewed
    }

    /// `lease_keepalive`, with its lock held.
    async fn renew_kept(
        &self,
        kept: &mut Option<KeepAlive>,
        id: i64,
        patient_until: tokio::time::Instant,
    ) -> Result<bool, Error> {
        let moved = *self.moved.borrow();
        if let Some(k) = kept.as_mut().filter(|k| k.moved == moved) {
            let (at, channel) = (k.at, k.channel.clone());
            match self.timed_until(&channel, k.renew(id), patient_until).await {
                Timed::Answered(Ok(ttl)) => return Ok(ttl > 0),
                // Refused as too busy (the leader's apply behind: etcd waits a second for it, then
                // refuses the renewal and ends the stream): the connection kept, a new stream at
                // the next renewal.
                Timed::Answered(Err(Some(status))) if busy_answer(&status) => {
                    count(Left::Busy);
                    *kept = None;
                    return Err(busy_said(&self.endpoints[at], "a lease renewal", status.message()));
                }
                // Ended or refused otherwise: a new stream, on the same connection if it still
                // serves.
                Timed::Answered(Err(_)) => {}
                // No answer in the call timeout and the patience after it, from a member that
                // answers otherwise: kept, the stream closed (its late answer would be read as
                // the next renewal's) and opened again at the next renewal.
                Timed::Busy => {
                    *kept = None;
                    return Err(busy(&self.endpoints[at], "a lease renewal"));
                }
                // Gone: left at once, as a call that timed out, so that a member stopped under a
                // node costs one timeout, not two (the presence lease lasts two of them).
                Timed::Gone => {
                    let why = format!("a lease renewal: {}", super::timed::silent(&self.endpoints[at]));
                    self.failed(at, &why).await
                }
            }
        }
        *kept = None;
        // Read before the stream's connection is: a connection dropped while the stream opens
        // leaves it marked as of the connection before, and it is not kept (a stream marked as
        // of a newer connection than its own would hold the old one open for as long as it is
        // kept: every renewal).
        let moved = *self.moved.borrow();
        let (send, answers, ttl, channel) = self
            .call_until("a lease renewal", patient_until, |channel| {
                let (send, receive) = tokio::sync::mpsc::channel(1);
                let requests =
                    futures_util::stream::unfold(
                        receive,
                        |mut r| async move { r.recv().await.map(|q| (q, r)) },
                    );
                let request = self.request(requests);
                async move {
                    send.send(rpc::LeaseKeepAliveRequest { id })
                        .await
                        .map_err(|_| tonic::Status::internal("the lease's request stream closed"))?;
                    let mut answers =
                        LeaseClient::new(channel.clone()).lease_keep_alive(request).await?.into_inner();
                    let first = answers.message().await?;
                    if late() {
                        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
                    }
                    match first {
                        Some(answer) => Ok(tonic::Response::new((send, answers, answer.ttl, channel))),
                        None => Err(tonic::Status::unavailable("the lease's stream ended without an answer")),
                    }
                }
            })
            .await?;
        // The connection the stream is on is the client's now: `call` moved it before, if at all.
        let at = self.current.load(Ordering::Relaxed);
        *kept = Some(KeepAlive { moved, at, channel, send, answers });
        Ok(ttl > 0)
    }
}
