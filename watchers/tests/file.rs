//! The file and declaration watchers against real inotify in a scratch directory. A test named
//! `faultN_` is the regression test of fault N of issue 12.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::Duration;

use mesh_host_watchers::{source, Change, FileWatcher};
use tokio::sync::mpsc;

async fn expect_path(rx: &mut mpsc::UnboundedReceiver<Change>, path: &PathBuf, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Change::Path(p))) if &p == path => return,
            Ok(Some(_)) => continue,
            _ => panic!("no change reported for {} after {what}", path.display()),
        }
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Change>) -> Vec<Change> {
    let mut v = Vec::new();
    while let Ok(c) = rx.try_recv() {
        v.push(c);
    }
    v
}

#[tokio::test]
async fn every_kind_of_change_at_a_watched_path_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("app.conf");
    // A second watched path, changed only at the end: the sentinel.
    let sentinel = dir.path().join("sentinel");
    std::fs::write(&f, "a").unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut w = FileWatcher::new(tx);
    assert!(w.set_paths([f.clone(), sentinel.clone()]).is_empty());
    assert_eq!(w.watched(), 1);

    std::fs::write(&f, "b").unwrap();
    expect_path(&mut rx, &f, "a write").await;
    std::process::Command::new("chmod").arg("600").arg(&f).status().unwrap();
    expect_path(&mut rx, &f, "a chmod").await;
    std::process::Command::new("chown").arg("nobody").arg(&f).status().unwrap();
    expect_path(&mut rx, &f, "a chown").await;
    let tmp = dir.path().join(".app.conf.swp");
    std::fs::write(&tmp, "c").unwrap();
    std::fs::rename(&tmp, &f).unwrap();
    expect_path(&mut rx, &f, "a rename over it").await;
    std::fs::remove_file(&f).unwrap();
    expect_path(&mut rx, &f, "a delete").await;
    std::fs::write(&f, "d").unwrap();
    expect_path(&mut rx, &f, "a create").await;

    // A neighbour in the same directory is not reported. The sentinel, written after it, is
    // reported after anything the neighbour would have caused: the kernel queues one
    // instance's events in order and the watcher sends each as it reads it.
    std::fs::write(dir.path().join("neighbour"), "n").unwrap();
    std::fs::write(&sentinel, "s").unwrap();
    let before = until_path(&mut rx, &sentinel, "the sentinel").await;
    assert!(
        before.iter().all(|c| !matches!(c, Change::Path(p) if p.ends_with("neighbour"))),
        "the neighbour was reported: {before:?}"
    );
}

/// Every change reported before the first one for `path`.
async fn until_path(rx: &mut mpsc::UnboundedReceiver<Change>, path: &PathBuf, what: &str) -> Vec<Change> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut before = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Change::Path(p))) if &p == path => return before,
            Ok(Some(c)) => before.push(c),
            _ => panic!("no change reported for {} after {what}; before it: {before:?}", path.display()),
        }
    }
}

/// Asserts that the declaration watcher says nothing more about what came before: it waits a
/// little, makes `sentinel` (a change of the source), and requires the next report to be the
/// sentinel's. The watcher reports only after `quiet` without events, so the sentinel's report
/// comes at least `quiet` after it, and one that an earlier event caused comes sooner (the
/// wait, two quiet periods, keeps such a report from being merged into the sentinel's).
async fn nothing_before_the_sentinel(
    rx: &mut mpsc::UnboundedReceiver<Change>,
    source: &std::path::Path,
    quiet: Duration,
    sentinel: impl FnOnce(),
    what: &str,
) {
    tokio::time::sleep(quiet * 2).await;
    let made = tokio::time::Instant::now();
    sentinel();
    let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    let after = made.elapsed();
    let settled = Change::SourceChanged { source: source.to_path_buf() };
    assert_eq!(change, Ok(Some(settled)), "the sentinel's report, after {what}");
    assert!(after >= quiet, "{what}: a report came {after:?} after the sentinel, sooner than {quiet:?}: it was not the sentinel's");
}

#[tokio::test]
async fn a_removed_directory_is_watched_again_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let f = sub.join("x");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut w = FileWatcher::new(tx);
    assert!(w.set_paths([f.clone(), sub.clone()]).is_empty());
    std::fs::remove_dir(&sub).unwrap();
    expect_path(&mut rx, &sub, "the directory's removal").await;
    std::fs::create_dir(&sub).unwrap();
    // The owner calls set_paths again after it made the directory again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(w.set_paths([f.clone(), sub.clone()]).is_empty());
    std::fs::write(&f, "x").unwrap();
    expect_path(&mut rx, &f, "a write in the directory made again").await;
}

#[tokio::test]
async fn a_declaration_is_reported_only_once_it_settles() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("declaration.json");
    std::fs::write(&d, "{}").unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _task = source::spawn(vec![d.clone()], Duration::from_millis(200), tx).unwrap();
    // A slow writer: pieces 50 ms apart, each well inside the quiet period.
    let start = tokio::time::Instant::now();
    for piece in ["{\"vers", "ion\": 1, ", "\"resources\": []}"] {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().append(true).open(&d).unwrap();
        if piece.starts_with('{') {
            f.set_len(0).unwrap();
        }
        f.write_all(piece.as_bytes()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(change, Change::SourceChanged { source: d.clone() });
    assert!(start.elapsed() >= Duration::from_millis(300), "not before the writer paused");
    assert_eq!(std::fs::read(&d).unwrap(), b"{\"version\": 1, \"resources\": []}", "whole when reported");
    let touch = || std::fs::write(&d, "{\"version\": 1, \"resources\": []}\n").unwrap();
    nothing_before_the_sentinel(
        &mut rx,
        &d,
        Duration::from_millis(200),
        touch,
        "one burst of writes reported once",
    )
    .await;
}

/// Two sources on one watcher (one inotify instance): each is reported on its own, and a
/// change of one is not a change of the other.
#[tokio::test]
async fn two_sources_on_one_watcher_are_each_reported_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a/declaration.json"), dir.path().join("b/hold.json"));
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let quiet = Duration::from_millis(50);
    let _task = source::spawn(vec![a.clone(), b.clone()], quiet, tx).unwrap();
    async fn next(rx: &mut mpsc::UnboundedReceiver<Change>) -> Option<Change> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.ok().flatten()
    }
    std::fs::write(&b, "{}").unwrap();
    assert_eq!(next(&mut rx).await, Some(Change::SourceChanged { source: b.clone() }));
    std::fs::write(&a, "{}").unwrap();
    assert_eq!(next(&mut rx).await, Some(Change::SourceChanged { source: a.clone() }));
    let touch_a = || std::fs::write(&a, "{ }").unwrap();
    nothing_before_the_sentinel(&mut rx, &a, quiet, touch_a, "a write of one source only").await;
}

/// A source whose parent directory is made after the watcher started is watched from then on,
/// beside one watched from the start.
#[tokio::test]
async fn a_source_whose_directory_comes_later_is_watched_once_it_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let (now, later) = (dir.path().join("now.json"), dir.path().join("later/hold.json"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _task = source::spawn(vec![now.clone(), later.clone()], Duration::from_millis(50), tx).unwrap();
    std::fs::create_dir(dir.path().join("later")).unwrap();
    let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.ok().flatten();
    assert_eq!(change, Some(Change::SourceChanged { source: later.clone() }), "its directory made");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drain(&mut rx);
    std::fs::write(&later, "{}").unwrap();
    let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.ok().flatten();
    assert_eq!(change, Some(Change::SourceChanged { source: later.clone() }), "a write in it");
    std::fs::write(&now, "{}").unwrap();
    let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.ok().flatten();
    assert_eq!(change, Some(Change::SourceChanged { source: now.clone() }), "the other source still");
}

/// With no descriptor left to make an inotify instance from, neither watcher stops: each says
/// which two limits can cause it (not "Too many open files" alone), and each watches once an
/// instance can be made again: the file watcher at its next `set_paths`, the source watcher by
/// itself, reporting its sources changed for what moved meanwhile. Run in a child process of its
/// own (this test binary again), whose open-file limit prlimit(1) lowers to the three it has,
/// and raises again from here when the child has seen both fail.
#[tokio::test]
async fn without_an_inotify_instance_the_watchers_say_which_limits_and_watch_once_they_can() {
    use std::io::{BufRead as _, Write as _};
    const CHILD: &str = "MESH_HOST_WATCHERS_EMFILE_CHILD";
    const NAME: &str = "without_an_inotify_instance_the_watchers_say_which_limits_and_watch_once_they_can";
    if let Some(dir) = std::env::var_os(CHILD) {
        let dir = PathBuf::from(dir);
        let (f, d) = (dir.join("f"), dir.join("d.json"));
        // Lowered from outside once running: the dynamic loader needs descriptors of its own.
        let me = std::process::id().to_string();
        let lowered = std::process::Command::new("prlimit").args(["--pid", &me, "--nofile=3:"]).status();
        assert!(lowered.expect("prlimit (util-linux) runs").success());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        w.set_paths([f.clone()]);
        assert!(w.coverage().no_instance);
        println!("FILE: {}", w.no_instance().expect("no descriptor left: no instance"));
        let (source_tx, mut source_rx) = mpsc::unbounded_channel();
        let _task = source::spawn(vec![d.clone()], Duration::from_millis(50), source_tx)
            .expect("a source watcher without an instance still starts");
        println!("BOTH FAILED");
        std::io::stdout().flush().unwrap();
        // The parent raises the limit now.
        let start = std::time::Instant::now();
        while w.coverage().no_instance {
            assert!(start.elapsed() < Duration::from_secs(30), "no instance 30 s after the limit was raised");
            tokio::time::sleep(Duration::from_millis(50)).await;
            w.set_paths([f.clone()]);
        }
        assert_eq!(w.no_instance(), None);
        std::fs::write(&f, "x").unwrap();
        expect_path(&mut rx, &f, "a write once the file watcher has its instance").await;
        println!("FILE WATCHED");
        let settled = Change::SourceChanged { source: d.clone() };
        let again = tokio::time::timeout(Duration::from_secs(30), source_rx.recv()).await;
        assert_eq!(again.ok().flatten(), Some(settled.clone()), "the sources, once watched again");
        std::fs::write(&d, "{}").unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), source_rx.recv()).await;
        assert_eq!(seen.ok().flatten(), Some(settled), "a write of the source");
        println!("SOURCE WATCHED");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(CHILD, dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        said.push_str(&line);
        if line.contains("BOTH FAILED") {
            let pid = child.id().to_string();
            let raised =
                std::process::Command::new("prlimit").args(["--pid", &pid, "--nofile=1024:"]).status();
            assert!(raised.unwrap().success());
        }
        line.clear();
    }
    let end = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&end.stderr);
    assert!(end.status.success(), "{said}\n{err}");
    let file = said.lines().find(|l| l.contains("FILE: Too")).unwrap_or_else(|| panic!("{said}"));
    assert!(file.contains("Too many open files"), "{file}");
    assert!(file.contains("raise fs.inotify.max_user_instances with sysctl"), "{file}");
    assert!(file.contains("its limit is 3"), "{file}");
    assert!(file.contains("could not be read either, which points at the second"), "{file}");
    assert!(said.contains("FILE WATCHED") && said.contains("SOURCE WATCHED"), "{said}\n{err}");
}

/// Issue 12, fault 5: inotify watches an inode, so a declaration directory replaced under the
/// watcher used to be lost for good.
#[tokio::test]
async fn fault5_a_declaration_directory_removed_made_again_or_swapped_in_is_still_watched() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("declaration.d");
    std::fs::create_dir(&d).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let quiet_period = Duration::from_millis(50);
    let _task = source::spawn(vec![d.clone()], quiet_period, tx).unwrap();
    let settled = Change::SourceChanged { source: d.clone() };
    async fn next(rx: &mut mpsc::UnboundedReceiver<Change>, what: &str) -> Change {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(change)) => change,
            _ => panic!("nothing reported after {what}"),
        }
    }
    // Lets the settle that a step caused pass, then forgets it.
    async fn quiet(rx: &mut mpsc::UnboundedReceiver<Change>) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain(rx);
    }

    std::fs::remove_dir(&d).unwrap();
    assert_eq!(next(&mut rx, "the directory's removal").await, settled);
    std::fs::create_dir(&d).unwrap();
    assert_eq!(next(&mut rx, "the directory made again").await, settled);
    quiet(&mut rx).await;
    std::fs::write(d.join("a.json"), "{}").unwrap();
    assert_eq!(next(&mut rx, "a file written in the directory made again").await, settled);
    quiet(&mut rx).await;

    // Swapped in by two renames: the old directory moves aside, a new one takes its name.
    let new = dir.path().join("declaration.d.new");
    std::fs::create_dir(&new).unwrap();
    let sentinel = |name: &str| {
        let path = d.join(name);
        move || std::fs::write(path, "{}").unwrap()
    };
    nothing_before_the_sentinel(&mut rx, &d, quiet_period, sentinel("s1.json"), "a neighbour made").await;
    std::fs::rename(&d, dir.path().join("declaration.d.old")).unwrap();
    std::fs::rename(&new, &d).unwrap();
    assert_eq!(next(&mut rx, "the swap").await, settled);
    quiet(&mut rx).await;
    std::fs::write(dir.path().join("declaration.d.old/b.json"), "{}").unwrap();
    nothing_before_the_sentinel(
        &mut rx,
        &d,
        quiet_period,
        sentinel("s2.json"),
        "a write in the directory moved aside, which is no longer the source",
    )
    .await;
    std::fs::write(d.join("b.json"), "{}").unwrap();
    assert_eq!(next(&mut rx, "a file written in the directory swapped in").await, settled);
}

/// Coverage is counted in paths: a directory's paths are watched with it, and the paths of a
/// directory that does not exist yet are unwatched until it does and `set_paths` runs again.
#[tokio::test]
async fn coverage_counts_the_paths_of_watched_and_unwatched_directories() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    let paths = [a.join("1"), a.join("2"), a.join("2"), b.join("1")];
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut w = FileWatcher::new(tx);
    let failed = w.set_paths(&paths);
    assert_eq!(failed.len(), 1, "{failed:?}");
    let c = w.coverage();
    assert_eq!((c.watched, c.unwatched, c.unwatched_dirs, c.out_of_watches), (2, 1, 1, false));
    std::fs::create_dir(&b).unwrap();
    assert!(w.set_paths(&paths).is_empty());
    let c = w.coverage();
    assert_eq!((c.watched, c.unwatched, c.unwatched_dirs), (3, 0, 0));
    // A watched directory removed: its watch is lost, and its paths unwatched, at the next look.
    std::fs::remove_dir_all(&a).unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            w.rewatch();
            if w.coverage().unwatched == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok());
}
