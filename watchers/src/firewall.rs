//! nftables: whether one table moved, from `nft monitor`.
//!
//! `nft monitor` prints one line per change to the ruleset of the namespace it runs in (`add
//! rule inet mesh_host input ...`, `delete table inet mesh_host`). A line naming the watched
//! table becomes a [`Change::Firewall`], any other change a [`Change::Ruleset`]; the controller
//! decides what that means. Many lines come from one load; the work queue merges the keys they
//! make.
//!
//! When nft exits (it was killed, or the netlink socket overflowed), the task says
//! [`Change::Up`] `false`, starts it again after a capped exponential backoff, and once it runs
//! says `Up` `true` and [`Change::Resynced`]: whatever moved in between was not seen.
//!
//! It runs a program, which the root crate leaves to its `system` module: this crate has no such
//! module, and `nft monitor` only reads.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::Change;

const WATCHER: crate::Watcher = crate::Watcher::Firewall;

/// The first wait before starting nft again, and the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Starts the watcher of table `family name` (`inet mesh_host`) on the current tokio runtime.
/// The task ends when the receiving side of `tx` is dropped; its nft is killed with it.
pub fn spawn(family: &'static str, table: &'static str, tx: mpsc::UnboundedSender<Change>) -> JoinHandle<()> {
    tokio::spawn(run(format!(" {family} {table}"), tx))
}

/// Whether a line of `nft monitor` is about the table: `add rule inet mesh_host input ...`,
/// `delete table inet mesh_host`. `names` is `" inet mesh_host"`.
pub fn about(line: &str, names: &str) -> bool {
    line.find(names).is_some_and(|at| {
        let rest = &line[at + names.len()..];
        rest.is_empty() || rest.starts_with(' ')
    })
}

/// Whether a line of `nft monitor` is a change elsewhere in the ruleset: any line that is not a
/// comment (`# new generation 12 by process 99 (nft)`) nor empty.
pub fn elsewhere(line: &str) -> bool {
    let line = line.trim();
    !line.is_empty() && !line.starts_with('#')
}

/// Makes the child killed when the agent dies, however it dies: `kill_on_drop` covers a
/// clean exit, not a SIGKILL or a crash, after which an orphaned `nft monitor` would run on for
/// ever (one more at each restart) and keep whatever mounts its namespace copied alive.
#[allow(unsafe_code, reason = "pre_exec runs between fork and exec; see SAFETY")]
fn dies_with_its_parent(command: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: prctl and getppid are system calls, and nothing is allocated.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then nothing would ever signal.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the agent exited before nft monitor started"));
            }
            Ok(())
        });
    }
}

async fn run(names: String, tx: mpsc::UnboundedSender<Change>) {
    let mut wait = BACKOFF_FIRST;
    let mut started_before = false;
    loop {
        #[allow(
            clippy::disallowed_methods,
            reason = "the watchers crate has no system module; nft monitor only reads the ruleset"
        )]
        let mut command = tokio::process::Command::new("nft");
        command
            .args(["monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        dies_with_its_parent(&mut command);
        let child = command.spawn();
        match child {
            Ok(mut child) => {
                if tx.send(Change::Up { watcher: WATCHER, up: true }).is_err() {
                    return;
                }
                if started_before && tx.send(Change::Resynced { watcher: WATCHER }).is_err() {
                    return;
                }
                started_before = true;
                let stdout = child.stdout.take().expect("stdout was piped");
                let mut lines = BufReader::new(stdout).lines();
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        line = lines.next_line() => match line {
                            Ok(Some(line)) => {
                                wait = BACKOFF_FIRST;
                                let change = if about(&line, &names) {
                                    Some(Change::Firewall)
                                } else {
                                    elsewhere(&line).then_some(Change::Ruleset)
                                };
                                if change.is_some_and(|c| tx.send(c).is_err()) {
                                    return;
                                }
                            }
                            Ok(None) | Err(_) => break,
                        },
                    }
                }
                let _ = child.kill().await;
                tracing::warn!("nft monitor stopped; starting it again");
            }
            Err(e) => tracing::warn!(error = %e, "cannot start nft monitor"),
        }
        if tx.send(Change::Up { watcher: WATCHER, up: false }).is_err() {
            return;
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(BACKOFF_CAP);
    }
}

#[cfg(test)]
mod tests {
    use super::{about, elsewhere};

    #[test]
    fn only_lines_about_the_table_count() {
        let names = " inet mesh_host";
        assert!(about("delete rule inet mesh_host input handle 7", names));
        assert!(about("delete table inet mesh_host", names));
        assert!(about(
            "add chain inet mesh_host input { type filter hook input priority filter; policy drop; }",
            names
        ));
        assert!(!about("add rule inet mesh_host2 input tcp dport 1 accept", names));
        assert!(!about("add rule ip filter INPUT tcp dport 22 accept", names));
        assert!(!about("# new generation 12 by process 99 (nft)", names));
    }

    #[test]
    fn a_change_elsewhere_is_any_line_but_a_comment() {
        assert!(elsewhere("add rule ip filter ufw-user-input tcp dport 22 accept"));
        assert!(elsewhere("delete table ip guard"));
        assert!(!elsewhere("# new generation 12 by process 99 (nft)"));
        assert!(!elsewhere("   "));
    }
}
