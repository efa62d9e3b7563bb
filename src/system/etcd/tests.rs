//! The unit tests of the etcd client's calls: refusals, prefixes, endpoints and TLS files.

use super::*;

/// etcd's refusals, as gRPC statuses: read by code, and by etcd's fixed words only where
/// one code means several things.
#[test]
fn a_refusal_is_read_by_its_grpc_code() {
    use tonic::{Code, Status};
    let read = |code: Code, m: &str| {
        let status = Status::new(code, m);
        (refusal_of(&status), compacted(Some(status.code() as u64), status.message()))
    };
    assert_eq!(read(Code::Unauthenticated, "etcdserver: invalid auth token"), (Refusal::InvalidToken, false));
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
    assert_eq!(future, (Refusal::FutureRevision, false), "out of range, not compacted");
    let busy = read(Code::ResourceExhausted, "etcdserver: too many requests");
    assert_eq!(busy, (Refusal::Busy, false), "a member behind on its apply, not a full backend");
    let full = read(Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded");
    assert_eq!(full, (Refusal::NoSpace, false));
    let range = read(Code::OutOfRange, "etcdserver: mvcc: something else");
    assert_eq!(range, (Refusal::Other(Some(11)), false), "the code alone says neither");

    let status = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
    assert_eq!(Refusal::of_status(status), Refusal::PermissionDenied);
    assert_eq!(Refusal::of_status("no reason given"), Refusal::Other(None));

    let lease = read(Code::FailedPrecondition, "etcdserver: lease already exists");
    assert_eq!(lease, (Refusal::AlreadyExists, false), "a grant asked again under its id");

    // A member going away, stopping or without a leader: another endpoint is tried.
    assert!(another_may_answer(&Status::unavailable("etcdserver: no leader")));
    // A live member's own timeout: busy, kept; unless it lost its leader's connection.
    let busy = |code: Code, m: &str| refusal::busy_answer(&Status::new(code, m));
    assert!(busy(
        Code::Unavailable,
        "etcdserver: request timed out, waiting for the applied index took too long"
    ));
    assert!(busy(Code::Unavailable, "etcdserver: request timed out"));
    assert!(busy(
        Code::Unavailable,
        "etcdserver: request timed out, possibly due to previous leader failure"
    ));
    assert!(!busy(Code::Unavailable, "etcdserver: request timed out, possibly due to connection lost"));
    assert!(!busy(Code::Unavailable, "etcdserver: no leader"));
    assert!(
        !busy(Code::DeadlineExceeded, "etcdserver: request timed out"),
        "etcd's code, or not etcd's words"
    );
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
    assert_eq!(two.in_order().current(), "http://10.0.0.1:2379", "the first first, when asked");
    // Otherwise a random one: over many clients, each endpoint of the list is dialled first.
    let list = "http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379";
    let firsts: std::collections::BTreeSet<String> =
        (0..200).map(|_| Etcd::new(list, &none).unwrap().current().to_owned()).collect();
    assert_eq!(firsts.len(), 3, "{firsts:?}");

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
fn plaintext_is_told_apart_only_for_loopback_by_address_or_localhost() {
    let beyond = |e: &str| plaintext_beyond_loopback(e);
    for local in
        ["http://127.0.0.1:2379", "http://127.8.9.1:1/", "http://[::1]:2379", "http://localhost:2379"]
    {
        assert!(beyond(local).is_empty(), "{local} is loopback");
    }
    assert!(beyond("https://10.0.0.1:2379,https://etcd.example:2379").is_empty(), "TLS");
    assert_eq!(
        beyond("http://127.0.0.1:1, http://10.0.0.1:2379, http://etcd:2379, http://[fe80::1]:2379"),
        ["http://10.0.0.1:2379", "http://etcd:2379", "http://[fe80::1]:2379"],
        "a name other than localhost may resolve anywhere"
    );
}

#[test]
#[allow(clippy::disallowed_methods, reason = "the test writes the files it then gives")]
fn tls_files_that_cannot_be_used_are_refused_naming_the_option_and_the_file() {
    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("missing.pem");
    let e =
        Etcd::new("https://127.0.0.1:2379", &TlsFiles { ca: Some(missing.clone()), ..TlsFiles::default() })
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

fn busy() -> Error {
    Error::Refused {
        endpoint: "http://127.0.0.1:2379".into(),
        call: "a transaction",
        why: Refusal::Busy,
        message: "etcdserver: too many requests".into(),
    }
}

/// An operator's call refused by a busy member is asked again, with growing pauses, for up to
/// `READ_PATIENCE`; the agent's is not (its loops pause on their own); any other refusal is
/// returned at once.
#[tokio::test(start_paused = true)]
async fn a_busy_refusal_is_asked_again_for_an_operator_only() {
    let mut asked = 0;
    let answer = while_busy(true, "a transaction", || {
        asked += 1;
        let answer = if asked < 3 { Err(busy()) } else { Ok(7) };
        async move { answer }
    })
    .await;
    assert_eq!((answer.unwrap(), asked), (7, 3));

    let started = tokio::time::Instant::now();
    let mut asked = 0;
    let answer: Result<(), _> = while_busy(true, "a transaction", || {
        asked += 1;
        async { Err(busy()) }
    })
    .await;
    assert!(matches!(answer, Err(Error::Refused { why: Refusal::Busy, .. })), "{answer:?}");
    let spent = started.elapsed();
    assert!(spent <= refusal::READ_PATIENCE && spent >= Duration::from_secs(20), "asked for {spent:?}");
    assert!((8..=12).contains(&asked), "asked {asked} times");

    let mut asked = 0;
    let answer: Result<(), _> = while_busy(false, "a transaction", || {
        asked += 1;
        async { Err(busy()) }
    })
    .await;
    assert!(answer.is_err() && asked == 1, "the agent's call is asked once");

    let mut asked = 0;
    let answer: Result<(), _> = while_busy(true, "a transaction", || {
        asked += 1;
        async { Err(Error::Compacted(3)) }
    })
    .await;
    assert!(matches!(answer, Err(Error::Compacted(3))) && asked == 1);
}

#[test]
fn a_chosen_lease_id_is_positive_and_new_each_time() {
    let ids: std::collections::BTreeSet<i64> = (0..10_000).map(|_| crate::system::random_id()).collect();
    assert_eq!(ids.len(), 10_000, "no id twice");
    assert!(ids.iter().all(|id| *id > 0), "0 asks etcd to choose; a negative id is refused");
}

/// A call judged by its timeout (`Etcd::timed`) against a "member" that takes the connection
/// and never answers (a listener that accepts and reads nothing, as a frozen process's kernel
/// does): left at the deadline when this process kept its time; kept when the process's one
/// thread was held past the deadline (another task's blocking work), since a status request
/// not answered then says nothing of the member. Without the `LATE` rule both are left: the
/// second assertion fails.
#[test]
fn a_silent_member_is_left_unless_this_process_woke_too_late_to_judge_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepted and held, never read: the kernel completes the handshake, nothing answers.
    let held = std::thread::spawn(move || listener.incoming().take(4).flatten().collect::<Vec<_>>());
    let judge = |hog: bool| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let etcd = Etcd::new(&url, &TlsFiles::default()).unwrap();
            let channel = tonic::transport::Endpoint::from_shared(url.clone()).unwrap().connect_lazy();
            if hog {
                // The one thread held from 4.5 s to 6.5 s into the call: every timer wakes late.
                tokio::spawn(async {
                    tokio::time::sleep(Duration::from_millis(4500)).await;
                    std::thread::sleep(Duration::from_secs(2));
                });
            }
            match etcd.timed(&channel, std::future::pending::<()>()).await {
                Timed::Answered(()) => "answered",
                Timed::Busy => "kept",
                Timed::Gone => "left",
            }
        })
    };
    assert_eq!(judge(false), "left", "silent, and judged in time");
    assert_eq!(judge(true), "kept", "silent, but this process woke too late to say so");
    drop(held);
}

#[test]
fn a_renewal_waits_on_a_busy_member_until_a_second_before_its_lease_would_end() {
    let renewed = tokio::time::Instant::now();
    let ttl = Duration::from_secs(10);
    assert_eq!(super::lease_patience(renewed, ttl), renewed + Duration::from_secs(9));
    // A TTL under the margin leaves no patience past the call timeout.
    assert_eq!(super::lease_patience(renewed, Duration::from_millis(500)), renewed);
}
