//! Watches: every prefix of a client on one Watch stream, and what etcd's answers on it say.

use tokio::sync::mpsc;

use super::*;

impl Etcd {
    /// Watches every key under each of `prefixes` from `start_revision` on, all on one Watch
    /// stream of the connection (one watcher per prefix), with progress notices. The watch ends
    /// (`next` says so) when the endpoint goes away; the caller watches anew from what it saw.
    pub async fn watch_prefixes(&self, prefixes: &[String], start_revision: i64) -> Result<Watch, Error> {
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = prefixes.iter().map(|p| range_of(p)).collect();
        self.watch_ranges(&ranges, start_revision).await
    }

    /// Watches every key from `first` to the last key under `last_prefix`, both included, as one
    /// watcher from `start_revision` on: its changes come in the order etcd made them, a
    /// revision's all in one answer, so what has been applied of them is always etcd's keys at one
    /// revision (the rollout driver's cache, `fleet::rollout::reflector`).
    pub async fn watch_between(
        &self,
        first: &str,
        last_prefix: &str,
        start_revision: i64,
    ) -> Result<Watch, Error> {
        self.watch_ranges(&[(first.as_bytes().to_vec(), prefix_end(last_prefix))], start_revision).await
    }

    async fn watch_ranges(&self, ranges: &[(Vec<u8>, Vec<u8>)], start_revision: i64) -> Result<Watch, Error> {
        self.ensure_token().await?;
        let (mut last, mut tls) = (String::new(), None);
        for _ in 0..self.endpoints.len() {
            // Taken before the channel: a move while the watch opens is seen by it.
            let moved = self.moved.subscribe();
            let (at, channel) = self.channel().await?;
            let endpoint = self.endpoints[at].clone();
            // The creations are queued before the stream opens: etcd answers the stream's
            // headers with its first message, the first creation's answer.
            // Room for every creation, and a progress request beside them.
            let (tx, rx) = mpsc::channel(ranges.len() + 1);
            for (key, range_end) in ranges {
                let (key, range_end) = (key.clone(), range_end.clone());
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
            let opened = self
                .timed(
                    &channel,
                    WatchClient::new(channel.clone())
                        .max_decoding_message_size(ANSWER_LIMIT)
                        .watch(self.request(requests)),
                )
                .await;
            match opened {
                Timed::Answered(Ok(answers)) => {
                    return Ok(Watch {
                        requests: tx,
                        answers: answers.into_inner(),
                        moved,
                        watchers: Watchers {
                            endpoint,
                            progress: vec![start_revision - 1; ranges.len()],
                            created: 0,
                        },
                    });
                }
                Timed::Answered(Err(status)) if another_may_answer(&status) => {
                    let (message, refusal) = said(&status);
                    count(Left::Refused(&message));
                    (last, tls) = (format!("{endpoint}: {message}"), refusal);
                }
                Timed::Answered(Err(status)) => {
                    return Err(Error::Refused {
                        endpoint,
                        call: "a watch",
                        why: refusal_of(&status),
                        message: status.message().to_owned(),
                    })
                }
                Timed::Busy => return Err(busy(&endpoint, "a watch")),
                Timed::Gone => {
                    (last, tls) = (super::timed::silent(&endpoint), None);
                }
            }
            self.failed(at, &format!("a watch: {last}")).await;
        }
        Err(Error::Unreachable {
            endpoints: self.endpoints(),
            message: format!("no etcd endpoint accepted a watch; last: {last}"),
            tls,
        })
    }
}

/// What a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Every prefix's watcher is in place.
    Created,
    /// Keys under a prefix changed: the revision of the last change, and the changes, in the
    /// order etcd made them.
    Changed(i64, Vec<Event>),
    /// A progress notice: every watcher is alive, and has sent every change up to the
    /// revision given (`Watch::seen`).
    Progress(i64),
}

/// The watchers of one client's prefixes on one Watch stream, read with `next`.
pub struct Watch {
    /// The request side of the stream, held open (dropping it would end the stream); progress
    /// requests go on it.
    requests: mpsc::Sender<rpc::WatchRequest>,
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

    /// Asks etcd for a progress notice now (etcd 3.4 and later): its answer, read by `next`,
    /// says the store's revision, up to which every change has been sent. Not sent when the
    /// stream's request queue is full (a request is already waiting there).
    pub fn request_progress(&self) {
        let progress = rpc::WatchRequest {
            request_union: Some(rpc::watch_request::RequestUnion::ProgressRequest(
                rpc::WatchProgressRequest {},
            )),
        };
        let _ = self.requests.try_send(progress);
    }
}

/// One change a watch saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A key put: made or changed, as it is now.
    Put(Kv),
    /// A key deleted (by a delete, or with the lease it was bound to), at `revision`.
    Deleted {
        /// The key.
        key: String,
        /// The revision of the deletion.
        revision: i64,
    },
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
            let events = answer.events.iter().filter_map(|e| self.event(e)).collect::<Result<_, _>>()?;
            return Ok(Some(Seen::Changed(last, events)));
        }
        // No events: a progress notice, everything up to the header's revision sent; for every
        // watcher when it answers a progress request (etcd's watch id -1).
        let revision = answer.header.as_ref().map_or(0, |h| h.revision);
        if answer.watch_id == -1 {
            self.progress.iter_mut().for_each(|at| *at = (*at).max(revision));
            return Ok(Some(Seen::Progress(self.seen())));
        }
        let Some(at) = usize::try_from(answer.watch_id).ok().and_then(|id| self.progress.get_mut(id)) else {
            return Ok(None);
        };
        *at = (*at).max(revision);
        Ok(Some(Seen::Progress(self.seen())))
    }

    /// One event of an answer, as `Event`; `None` for one without its key.
    fn event(&self, e: &pb::mvccpb::Event) -> Option<Result<Event, Error>> {
        let kv = e.kv.as_ref()?;
        let key = match String::from_utf8(kv.key.clone()) {
            Ok(key) => key,
            Err(_) => {
                return Some(Err(Error::Garbled {
                    endpoint: self.endpoint.clone(),
                    call: "a watch",
                    message: "a key that is not UTF-8".into(),
                }))
            }
        };
        Some(Ok(if e.r#type == pb::mvccpb::event::EventType::Delete as i32 {
            Event::Deleted { key, revision: kv.mod_revision }
        } else {
            Event::Put(Kv { key, value: kv.value.clone(), mod_revision: kv.mod_revision })
        }))
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
        let Some(Seen::Changed(29, said)) = w.read(&events).unwrap() else {
            panic!("the last change's revision")
        };
        assert_eq!(said.len(), 2);
        let deleted = pb::mvccpb::Event {
            r#type: pb::mvccpb::event::EventType::Delete as i32,
            kv: Some(kv(31)),
            ..Default::default()
        };
        let events = rpc::WatchResponse { events: vec![event(30), deleted], ..answer(1, 31) };
        assert_eq!(
            w.read(&events).unwrap(),
            Some(Seen::Changed(
                31,
                vec![
                    Event::Put(Kv { key: "a".into(), value: Vec::new(), mod_revision: 30 }),
                    Event::Deleted { key: "a".into(), revision: 31 }
                ]
            ))
        );
        // The answer to a progress request: every watcher, at once.
        assert_eq!(w.read(&answer(-1, 40)).unwrap(), Some(Seen::Progress(40)));

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
}
