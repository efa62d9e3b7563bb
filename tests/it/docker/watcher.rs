//! The event watcher against a real engine: what it reports, and its reconnect and resync
//! after the engine restarts.

use super::*;

/// Waits for a change matching `want`, failing after a few seconds.
async fn expect_change(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>,
    what: &str,
    want: impl Fn(&mesh_host_watchers::Change) -> bool,
) -> Vec<mesh_host_watchers::Change> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(c)) => {
                let done = want(&c);
                seen.push(c);
                if done {
                    return seen;
                }
            }
            Ok(None) => panic!("the watcher ended while waiting for {what}; saw {seen:?}"),
            Err(_) => panic!("no {what} within 20 s; saw {seen:?}"),
        }
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_watcher_reports_a_labelled_container_killed_by_hand() {
    use mesh_host_watchers::Change;
    let n = Names::new(DOCKER, "watch");
    let web = n.container("web");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = mesh_host_watchers::docker::spawn(None, tx);
        expect_change(&mut rx, "the watcher up", |c| matches!(c, Change::Up { up: true, .. })).await;
        // An unlabelled container is not the host's: its events are not reported.
        let theirs = n.container("theirs");
        DOCKER.ok(&["run", "-d", "--name", &theirs, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
        DOCKER.ok(&["rm", "-f", &theirs]);
        DOCKER.ok(&[
            "run",
            "-d",
            "--name",
            &web,
            "--label",
            "mesh-host.id=web.app",
            IMAGE,
            SERVE[0],
            SERVE[1],
            SERVE[2],
        ]);
        DOCKER.ok(&["kill", &web]);
        let seen = expect_change(
            &mut rx,
            "the kill",
            |c| matches!(c, Change::Container { action, name, .. } if action == "die" && *name == web),
        )
        .await;
        assert!(
            seen.iter().all(|c| !matches!(c, Change::Container { name, .. } if *name == theirs)),
            "{seen:?}"
        );
        assert!(
            seen.contains(&Change::Container {
                id_label: "web.app".into(),
                name: web.clone(),
                action: "kill".into()
            }),
            "{seen:?}"
        );
        DOCKER.ok(&["rm", "-f", &web]);
        expect_change(
            &mut rx,
            "the removal",
            |c| matches!(c, Change::Container { action, name, .. } if action == "destroy" && *name == web),
        )
        .await;
        // Dropping the receiver ends the watcher.
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("the watcher ends").unwrap();
    });
}

/// The watcher on an engine of the test's own, which stops and starts again: it says it is down,
/// then up and resynced, and goes on reporting a labelled container killed by hand.
fn watcher_reconnects_and_resyncs_after_the_engine_restarts(engine: &mut dyn OwnEngine, web: &str) {
    use mesh_host_watchers::{Change, Watcher};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _task = mesh_host_watchers::docker::spawn(Some(engine.socket().to_owned()), tx);
        expect_change(&mut rx, "the watcher up", |c| matches!(c, Change::Up { up: true, .. })).await;

        tokio::task::block_in_place(|| engine.stop());
        expect_change(&mut rx, "the watcher down", |c| matches!(c, Change::Up { up: false, .. })).await;
        tokio::task::block_in_place(|| engine.start());
        let seen = expect_change(&mut rx, "a resync", |c| {
            matches!(c, Change::Resynced { watcher: Watcher::Docker })
        })
        .await;
        assert!(seen.contains(&Change::Up { watcher: Watcher::Docker, up: true }), "{seen:?}");

        // And it still reports what it watches.
        tokio::task::block_in_place(|| {
            engine.ok(&["run", "-d", "--name", web, "--network", "none", "--label", "mesh-host.id=web.app"]
                .into_iter()
                .chain([IMAGE, "sleep", "3600"])
                .collect::<Vec<_>>());
            engine.ok(&["kill", web]);
        });
        expect_change(&mut rx, "the kill", |c| matches!(c, Change::Container { name, .. } if name == web))
            .await;
    });
    let _ = engine.ok(&["rm", "-f", web]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_watcher_reconnects_and_resyncs_after_the_engine_restarts() {
    require(DOCKER);
    let s = Scratch::new();
    let mut engine = PrivateDocker::new(s.dir.path());
    engine.load_image();
    watcher_reconnects_and_resyncs_after_the_engine_restarts(&mut engine, "mh-it-docker-rewatch-web");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_watcher_reconnects_and_resyncs_after_the_engine_restarts() {
    // The service shares the machine's Podman storage: the guard removes what it made.
    let n = Names::new(PODMAN_CLI, "rewatch");
    let s = Scratch::new();
    let mut engine = Service::new(&format!("unix://{}", s.p("podman.sock")));
    watcher_reconnects_and_resyncs_after_the_engine_restarts(&mut engine, &n.container("web"));
}
