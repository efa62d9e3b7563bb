//! The pass's connections to the machine's managers (systemd, the container runtime, the
//! package manager, the keyring): `Managers` for one pass, and `Session`, what a daemon keeps of
//! them between passes. Apart from the pass because a `Session` outlives it, and neither knows
//! anything of what a pass applies.

use std::sync::Arc;

use super::Error;
use crate::secrets::Keyring;
use crate::system::docker::{self, Docker};
use crate::system::{Packages, Systemd};

/// The connections and caches of one pass to the machine's managers, each made when the first
/// resource needs it (or kept from an earlier pass, see `Session`): a declaration of files
/// alone never touches the bus.
pub(super) struct Managers {
    systemd: Option<Systemd>,
    pub(super) packages: Packages,
    /// The container runtime, or why none answered. Unlike the bus, a failure is kept for the
    /// pass: a socket whose server hangs would otherwise hold every container for the probe's
    /// whole timeout, and a hundred containers on a machine without a runtime should fail fast.
    docker: Option<Result<Docker, Arc<docker::Error>>>,
    /// The node's keyring, read when the first secret of the pass is opened, or why it could
    /// not be: `None` for no key file. Never kept between passes (`Session` does not hold it),
    /// so a daemon holds the private key only while a pass needs it.
    pub(super) keyring: Option<Result<Option<Arc<Keyring>>, Arc<str>>>,
}

impl Managers {
    /// The pass's systemd connection, made on first use. A failure to connect is returned
    /// each time it is asked for, so every service names the bus it could not reach.
    pub(super) fn systemd(&mut self, bus: Option<&str>) -> Result<&Systemd, Error> {
        if self.systemd.is_none() {
            self.systemd = Some(Systemd::connect(bus)?);
        }
        Ok(self.systemd.as_ref().expect("just connected"))
    }

    /// The pass's container runtime, connected on first use. A handle (cheap to clone), so an
    /// applier can hold it while it reads the rest of the context.
    pub(super) fn docker(&mut self, socket: Option<&str>) -> Result<Docker, Error> {
        let connected =
            self.docker.get_or_insert_with(|| crate::system::docker::connect(socket).map_err(Arc::new));
        connected.clone().map_err(Error::Runtime)
    }
}

/// Connections to the machine's managers kept from one pass to the next. The daemon keeps one,
/// so a reconcile of one unit or container does not connect anew (a D-Bus connection and its
/// Subscribe, a runtime's ping); a command makes a fresh one for its single pass. A pass that
/// failed at all drops them, so a manager restarted under the daemon is connected to again on
/// the retry rather than failing on a dead connection.
#[derive(Default)]
pub struct Session {
    systemd: Option<Systemd>,
    docker: Option<Docker>,
}

impl Session {
    pub(super) fn start(&mut self) -> Managers {
        Managers {
            systemd: self.systemd.take(),
            packages: Packages::default(),
            docker: self.docker.take().map(Ok),
            keyring: None,
        }
    }

    pub(super) fn end(&mut self, machine: Managers, failed: bool) {
        if !failed {
            self.systemd = machine.systemd;
            self.docker = machine.docker.and_then(Result::ok);
        }
    }
}
