//! ufw, found in force on an adopted node: its state, the rules the host added to it, and the
//! rules in force, through the `ufw` program (and `iptables -S` for what is in force: `ufw
//! status` lists the rules ufw keeps, not the ones loaded).
//!
//! A rule is given as the words after `ufw` (`allow from 10.0.0.0/8 to any port 443 proto tcp`)
//! and a comment. ufw applies an added or deleted rule both at once to its saved rules
//! (permanent) and to the running filter (runtime).

use super::command::{self, run, run_str, Ran};

/// What ufw answered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ufw could not be run, or did not finish in time.
    #[error(transparent)]
    Command(#[from] command::Error),
    /// ufw ran and failed.
    #[error("`{command}` {how}")]
    Failed {
        /// The command line run.
        command: String,
        /// How it ended: its exit and what it printed.
        how: String,
    },
}

fn checked(argv: &[&str]) -> Result<Ran, Error> {
    let ran = run_str(argv, &[])?;
    if ran.success() {
        Ok(ran)
    } else {
        Err(Error::Failed { command: argv.join(" "), how: ran.describe() })
    }
}

/// Whether ufw is installed and its firewall is loaded ("Status: active").
///
/// `ufw status` is a Python program: some 100 ms of interpreter start-up, paid by every full
/// pass on an adopted node (where the firewall found is looked for even with no opening
/// declared), most of an adopted apply's fixed cost (issue 27). What it answers is decided by
/// one command it runs first: `iptables -L ufw-user-input -n` exiting 1 (no such chain) is
/// "Status: inactive" (ufw's `backend_iptables.get_status`). That command is run here first,
/// for a few milliseconds, and `ufw status` only when it does not settle the question (the
/// chain is there, or iptables failed otherwise): the answer is the same, and the usual case,
/// ufw installed and not enabled, no longer starts Python. The one difference: a ufw so broken
/// that `ufw status` fails, with its chains absent, used to make the firewall in force
/// unknowable; it is now found not in force, as it is (no ufw chain can filter anything).
pub fn active() -> Result<bool, Error> {
    if !super::command::exists("ufw") {
        return Ok(false);
    }
    if let Ok(ran) = run_str(&["iptables", "-L", "ufw-user-input", "-n"], &[]) {
        if ran.code == Some(1) {
            return Ok(false);
        }
    }
    let ran = checked(&["ufw", "status"])?;
    Ok(ran.stdout.lines().any(|l| l.trim() == "Status: active"))
}

/// The rules added to ufw, as `ufw show added` prints them (`ufw allow 53/udp comment 'x'`).
pub fn added() -> Result<Vec<String>, Error> {
    let ran = checked(&["ufw", "show", "added"])?;
    Ok(ran.stdout.lines().filter(|l| l.starts_with("ufw ")).map(str::to_owned).collect())
}

/// The user rules in force, as `iptables -S` prints them, IPv4 then IPv6.
pub fn in_force() -> Result<Vec<String>, Error> {
    let mut lines = Vec::new();
    for (program, chain) in [("iptables", "ufw-user-input"), ("ip6tables", "ufw6-user-input")] {
        let ran = run_str(&[program, "-S", chain], &[])?;
        // A chain that is not there holds nothing in force (ufw inactive).
        if ran.success() {
            lines.extend(ran.stdout.lines().filter(|l| l.starts_with("-A ")).map(str::to_owned));
        }
    }
    Ok(lines)
}

/// Adds a rule (`words` after `ufw`) with a comment.
pub fn add(words: &[String], comment: &str) -> Result<(), Error> {
    let mut argv = vec!["ufw".to_owned()];
    argv.extend(words.iter().cloned());
    argv.extend(["comment".to_owned(), comment.to_owned()]);
    let ran = run(&argv, &[])?;
    if ran.success() {
        Ok(())
    } else {
        Err(Error::Failed { command: argv.join(" "), how: ran.describe() })
    }
}

/// Deletes a rule given as the words after `ufw` (without its comment).
pub fn delete(words: &[String]) -> Result<(), Error> {
    let mut argv = vec!["ufw".to_owned(), "--force".to_owned(), "delete".to_owned()];
    argv.extend(words.iter().cloned());
    let ran = run(&argv, &[])?;
    if ran.success() {
        Ok(())
    } else {
        Err(Error::Failed { command: argv.join(" "), how: ran.describe() })
    }
}

/// Loads ufw's saved rules into the running filter again.
pub fn reload() -> Result<(), Error> {
    checked(&["ufw", "reload"]).map(drop)
}

/// The policy of the INPUT chain, IPv4 then IPv6, as `iptables -S INPUT` says it (`DROP`).
pub fn input_policies() -> Result<Vec<(&'static str, String)>, Error> {
    let mut found = Vec::new();
    for program in ["iptables", "ip6tables"] {
        let ran = checked(&[program, "-S", "INPUT"])?;
        let policy = ran.stdout.lines().find_map(|l| l.strip_prefix("-P INPUT ")).map(str::trim);
        match policy {
            Some(p) => found.push((program, p.to_owned())),
            None => {
                return Err(Error::Failed {
                    command: format!("{program} -S INPUT"),
                    how: "printed no policy".into(),
                })
            }
        }
    }
    Ok(found)
}

/// Sets the policy of the INPUT chain of `program` (`iptables` or `ip6tables`): one change,
/// in force at once.
pub fn set_input_policy(program: &str, policy: &str) -> Result<(), Error> {
    checked(&[program, "-P", "INPUT", policy]).map(drop)
}

/// Turns ufw on, now and at boot. The failpoint `ufw-enable` (tests only) makes it fail
/// without running ufw: the middle of the way back, after the host's rules are saved in ufw.
pub fn enable() -> Result<(), Error> {
    if super::fs::failpoint_named("ufw-enable") {
        return Err(Error::Failed {
            command: "ufw enable".into(),
            how: "failed at the failpoint ufw-enable".into(),
        });
    }
    checked(&["ufw", "--force", "enable"]).map(drop)
}

/// Turns ufw off, now and at boot. The failpoint `ufw-disable` (tests only) makes it fail
/// without running ufw: the middle of the flip, after the host's filter is loaded.
pub fn disable() -> Result<(), Error> {
    if super::fs::failpoint_named("ufw-disable") {
        return Err(Error::Failed {
            command: "ufw disable".into(),
            how: "failed at the failpoint ufw-disable".into(),
        });
    }
    checked(&["ufw", "disable"]).map(drop)
}
