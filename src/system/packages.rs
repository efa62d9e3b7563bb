//! Packages, through the machine's own package manager: apt and dpkg on Debian and its kin,
//! dnf and rpm where those are what the machine has. Install only: the host never upgrades or
//! removes a package.

use super::command::{self, Ran};

/// A failure to install or read a package, naming it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The package manager could not be run, or did not finish in time.
    #[error(transparent)]
    Run(#[from] command::Error),
    /// The machine has no package manager the host knows; holds the package's name.
    #[error("this machine has neither apt (dpkg) nor dnf (rpm), so the package {0} cannot be installed")]
    NoManager(String),
    /// The package manager ran and failed to install the package.
    #[error("installing {package} with {manager} failed: {how}")]
    Install {
        /// The package's name.
        package: String,
        /// The manager (`apt` or `dnf`).
        manager: &'static str,
        /// How it ended: its exit and what it printed.
        how: String,
    },
    /// The package database could not be asked.
    #[error("cannot read whether {package} is installed: {how}")]
    Query {
        /// The package's name.
        package: String,
        /// How the query ended.
        how: String,
    },
}

/// The package manager this machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manager {
    /// apt, with dpkg to read what is installed.
    Apt,
    /// dnf, with rpm to read what is installed.
    Dnf,
}

impl Manager {
    /// The manager's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Manager::Apt => "apt",
            Manager::Dnf => "dnf",
        }
    }
}

/// The package manager of this machine, found once per pass; apt's lists refreshed at most once
/// per pass.
#[derive(Default)]
pub struct Packages {
    manager: Option<Manager>,
    /// Whether `apt-get update` ran in this pass, and how it failed if it did.
    updated: Option<Result<(), String>>,
}

/// apt is told never to ask: no terminal questions (the frontend), the packaged version of a
/// configuration file kept as the machine has it (confdef, confold), and the dpkg lock waited
/// for rather than failing when unattended-upgrades happens to hold it.
const APT_QUIET: &[&str] = &[
    "-y",
    "-q",
    "-o",
    "Dpkg::Options::=--force-confdef",
    "-o",
    "Dpkg::Options::=--force-confold",
    "-o",
    "DPkg::Lock::Timeout=300",
];

impl Packages {
    /// The machine's package manager, found at the first call of a pass.
    pub fn manager(&mut self, package: &str) -> Result<Manager, Error> {
        if let Some(m) = self.manager {
            return Ok(m);
        }
        let m = if command::exists("dpkg-query") && command::exists("apt-get") {
            Manager::Apt
        } else if command::exists("rpm") && command::exists("dnf") {
            Manager::Dnf
        } else {
            return Err(Error::NoManager(package.to_owned()));
        };
        self.manager = Some(m);
        Ok(m)
    }

    /// Whether the package database says the package is installed.
    pub fn installed(&mut self, package: &str) -> Result<bool, Error> {
        match self.manager(package)? {
            Manager::Apt => {
                // dpkg's own database, not apt's idea of it: "ii" is wanted install, installed.
                // A package dpkg has never heard of exits 1 with a message, which is a "no".
                let ran = command::run_str(&["dpkg-query", "-W", "-f=${db:Status-Abbrev}", package], &[])?;
                if ran.success() {
                    Ok(ran.stdout.starts_with("ii"))
                } else if ran.stderr.contains("no packages found") {
                    Ok(false)
                } else {
                    Err(Error::Query { package: package.to_owned(), how: ran.describe() })
                }
            }
            Manager::Dnf => {
                let ran = command::run_str(&["rpm", "-q", "--quiet", package], &[])?;
                Ok(ran.success())
            }
        }
    }

    /// Installs a package that is absent. With apt, the lists are refreshed first, once per
    /// pass: on a machine that has been up a while they name versions the mirrors no longer
    /// hold, and on a new one they may be empty.
    pub fn install(&mut self, package: &str) -> Result<(), Error> {
        let env = [("DEBIAN_FRONTEND", "noninteractive"), ("NEEDRESTART_MODE", "l")];
        match self.manager(package)? {
            Manager::Apt => {
                if self.updated.is_none() {
                    let mut argv = vec!["apt-get"];
                    argv.extend_from_slice(APT_QUIET);
                    argv.push("update");
                    let ran = command::run_str(&argv, &env)?;
                    // A refresh that fails (one unreachable mirror, a machine offline with a
                    // local cache) does not stop the install: the package may be known already.
                    // Its failure is said if the install then fails too.
                    self.updated = Some(if ran.success() { Ok(()) } else { Err(ran.describe()) });
                }
                let mut argv = vec!["apt-get"];
                argv.extend_from_slice(APT_QUIET);
                // Never an upgrade, even of a package that is half there.
                argv.extend_from_slice(&["--no-upgrade", "install", package]);
                let ran = command::run_str(&argv, &env)?;
                let update = match &self.updated {
                    Some(Err(how)) => format!(" (refreshing the package lists had failed first: {how})"),
                    _ => String::new(),
                };
                check(ran, |how| Error::Install {
                    package: package.to_owned(),
                    manager: "apt-get",
                    how: format!("{how}{update}"),
                })
            }
            Manager::Dnf => {
                let ran = command::run_str(&["dnf", "install", "-y", "-q", package], &[])?;
                check(ran, |how| Error::Install { package: package.to_owned(), manager: "dnf", how })
            }
        }
    }
}

fn check(ran: Ran, err: impl FnOnce(String) -> Error) -> Result<(), Error> {
    if ran.success() {
        Ok(())
    } else {
        Err(err(ran.describe()))
    }
}
