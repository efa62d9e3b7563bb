//! Generations in the daemon: which declaration a read of the source puts in force when a
//! rollback holds the node, the generation recorded for each declaration accepted, and how its
//! first pass ended (`generations`'s module doc; docs/decisions.md, "Generations and
//! rollback").
//!
//! The rule, in one place: while `hold.json` names a kept generation, the daemon applies that
//! generation's files, and goes on reading its source. A source whose digest is among the kept
//! generations (the declaration that was rolled back, or any older one) changes nothing; one
//! never seen before is a newer declaration, and once it parses it releases the hold and is put
//! in force as any new declaration is.

use super::worker::Worker;
use crate::apply::Report;
use crate::generations::{self, Hold};
use crate::telemetry::{events, Event as _};

/// What a read of the source leads to, given the hold.
pub(super) enum Chosen {
    /// No hold: the source's declaration.
    Source,
    /// Held: the held generation's files (named by their paths under it) instead, and the
    /// generation the source holds, if it is a kept one.
    Held { hold: Hold, files: Vec<(String, Vec<u8>)>, source_generation: Option<u64> },
    /// Held, and the source holds a declaration never seen: it releases the hold once it parses.
    Releases(Hold),
}

impl Worker {
    /// The hold as `hold.json` says now; one that cannot be read is said and taken as none,
    /// since the source is then the only declaration the daemon can trust.
    pub(super) fn read_hold(&self) -> Option<Hold> {
        match self.generations.hold() {
            Ok(hold) => hold,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the rollback hold; the source's declaration is applied");
                None
            }
        }
    }

    /// Decides which declaration this read of the source puts in force (`Chosen`).
    pub(super) fn choose(&self, hold: Option<Hold>, source: &[(String, Vec<u8>)]) -> Chosen {
        let Some(hold) = hold else { return Chosen::Source };
        let seen = match self.generations.with_digest(&generations::digest(source)) {
            Ok(seen) => seen,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the generations; the hold is kept");
                None
            }
        };
        let Some(source_generation) = seen else { return Chosen::Releases(hold) };
        match self.generations.files(hold.generation) {
            Ok(files) => {
                let files = files.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
                Chosen::Held { hold, files, source_generation: Some(source_generation) }
            }
            Err(e) => {
                tracing::warn!(generation = hold.generation, error = %e, "cannot read the held generation; the source's declaration is applied");
                Chosen::Source
            }
        }
    }

    /// After a declaration parsed: the generation it is recorded as (or the held one), the
    /// hold released when a newer declaration came, and where it all shows (`/healthz`, the
    /// metrics, the log). `files` are those just parsed, as their source named them.
    pub(super) fn in_force_generation(&mut self, chosen: Chosen, files: &[(String, Vec<u8>)]) {
        let (number, hold) = match chosen {
            Chosen::Held { hold, source_generation, .. } => {
                if let Err(e) = self.generations.set_in_force(hold.generation) {
                    tracing::warn!(error = %e, "cannot mark the generation in force");
                }
                let pending = source_generation.filter(|n| *n != hold.generation);
                let how = describe_hold(&hold);
                events::GenerationHeld { generation: hold.generation, how: &how, source: pending }
                    .emit(&self.metrics);
                (Some(hold.generation), Some(hold))
            }
            Chosen::Releases(hold) => {
                if let Err(e) = self.generations.release() {
                    tracing::warn!(error = %e, "cannot remove the rollback hold");
                }
                events::GenerationReleased {
                    generation: hold.generation,
                    by: "a newer declaration from the source",
                }
                .emit(&self.metrics);
                (self.record_generation(files), None)
            }
            Chosen::Source => {
                if self.health.note().is_some() {
                    events::GenerationReleased {
                        generation: self.generation.unwrap_or(0),
                        by: "the operator (`mesh-host rollback --release`)",
                    }
                    .emit(&self.metrics);
                }
                (self.record_generation(files), None)
            }
        };
        self.generation = number;
        let reverted = hold.clone().filter(|h| h.reverted.is_some());
        events::GenerationInForce { number, held: hold.is_some(), reverted: reverted.is_some() }
            .emit(&self.metrics);
        let said = hold.map(|h| describe_hold(&h));
        self.health.set_held(said.clone());
        // For the fleet's status, which carries them to etcd.
        self.publish_generation(number, said, reverted);
    }

    /// Records the source's declaration as a generation (a new one when its digest is new).
    fn record_generation(&mut self, files: &[(String, Vec<u8>)]) -> Option<u64> {
        let source = self.config.declaration.display().to_string();
        match self.generations.accept(&source, files, self.config.keep_generations) {
            Ok(accepted) => {
                if accepted.new {
                    self.first_pass = Some(accepted.number);
                    events::GenerationRecorded { number: accepted.number, source: &source }
                        .emit(&self.metrics);
                }
                Some(accepted.number)
            }
            Err(e) => {
                // A record, not a gate: the declaration is applied all the same.
                tracing::warn!(error = %e, "cannot record the declaration as a generation; it is applied all the same");
                None
            }
        }
    }

    /// After a full pass: the first pass of a new generation notes how it ended.
    pub(super) fn note_first_pass(&mut self, report: &Report) {
        let Some(n) = self.first_pass.take() else { return };
        if let Err(e) = self.generations.first_pass(n, outcome(report)) {
            tracing::warn!(generation = n, error = %e, "cannot note how the generation's first pass ended");
        }
    }
}

/// How a pass ended, as a generation's record says it.
pub fn outcome(report: &Report) -> generations::FirstPass {
    let failed = report.error.as_ref().map(|e| e.failures.len());
    generations::FirstPass::of(failed, report.error.as_ref().is_some_and(|e| e.refused))
}

/// The hold as `/healthz` and the log say it.
fn describe_hold(h: &Hold) -> String {
    h.describe(&super::drift::utc(h.since * 1000))
}
