//! Why one resource could not be applied. Messages describe the machine, name the path, and
//! are lower-case, for a person reading a report.

use crate::declaration::Kind;
use crate::system::docker::DockerError;
use crate::system::{AccountError, CommandError, FsError, PackageError, SystemdError, UserError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Account(#[from] UserError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Accounts(#[from] AccountError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Runtime(#[from] DockerError),
    /// The read-back found something other than what was written.
    #[error("{path}: {what} is {found} after the host set it to {wanted}")]
    ReadBack { path: String, what: &'static str, wanted: String, found: String },
    #[error("{0}")]
    Refused(String),
    #[error("a {0} resource is not supported yet: this build of mesh-host has no applier for it")]
    Unsupported(Kind),
}

impl Error {
    /// Whether the machine changed between the host's write and its read-back: someone else
    /// wrote the same content in that instant. Not a fault of the host's, and retried as a
    /// contest is, not as a failure is.
    pub fn raced(&self) -> bool {
        matches!(self, Error::ReadBack { what: "the content" | "the file", .. })
    }
}
