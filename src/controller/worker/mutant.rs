//! The fleet harness's mutants of the worker (feature `robust-mutant`, never in a release;
//! tests/robust/, docs/testing.md): each does nothing unless `MESH_HOST_MUTANT` names it.

use super::Worker;
use crate::apply::{self, Options, Report};

impl Worker {
    /// The fleet harness's `status` mutant (feature `robust-mutant`, never in a release; I8 in
    /// tests/robust/): with `MESH_HOST_MUTANT` naming `status`, a new declaration is told to
    /// the status writer as applied and converged 3 s before its pass writes anything, so the
    /// node's status runs ahead of its files. Unset, nothing happens.
    pub(super) fn status_ahead(&self) {
        if std::env::var("MESH_HOST_MUTANT").is_ok_and(|m| m.split(',').any(|m| m == "status")) {
            self.report.publish(&Report::default(), true, self.source.names());
            std::thread::sleep(std::time::Duration::from_secs(3));
        }
    }

    /// The fleet harness's `flap` mutant (feature `robust-mutant`, never in a release; I10 in
    /// tests/robust/): with `MESH_HOST_MUTANT` naming `flap`, a new declaration is applied, then
    /// the one before it again, 0.4 s apart, before the pass applies the new one for good: in,
    /// back and in again for one change. Unset, nothing happens.
    pub(super) fn flap(&mut self, options: &Options) {
        if !std::env::var("MESH_HOST_MUTANT").is_ok_and(|m| m.split(',').any(|m| m == "flap")) {
            return;
        }
        let (Some(new), Some((old, contents))) = (self.declaration.clone(), self.previous.clone()) else {
            return;
        };
        let before = Options { contents, ..options.clone() };
        for (d, options) in [(new, options), (old, &before)] {
            let _ = apply::apply_in(&mut self.session, &d, &mut self.store, options);
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
    }
}
