//! The declaration's source, as the daemon reads it: read (never by plain opens), digested so
//! that a full pass parses it only when it changed, verified when signed, parsed with its
//! declared bytes moved out of the heap (`contents`), refused or accepted, recorded as a
//! generation, and chosen against the rollback hold. `Source` owns all of that state; the
//! worker asks it for a declaration (`Source::load`) and puts what it gets in force.
//!
//! The rollback hold, in one place (`generations`'s module doc; docs/decisions.md,
//! "Generations and rollback"): while `hold.json` names a kept generation, the daemon applies
//! that generation's files, and goes on reading its source. A source whose digest is among the
//! kept generations (the declaration that was rolled back, or any older one) changes nothing;
//! one never seen before is a newer declaration, and once it parses it releases the hold and is
//! put in force as any new declaration is. Which of these a read leads to is `choose`, pure.

use std::path::PathBuf;
use std::sync::Arc;

use sha2::Digest as _;

use super::config::Config;
use super::health::Health;
use super::{contents, signed};
use crate::apply::Report;
use crate::declaration::{Declaration, Refused};
use crate::generations::{self, Generations, Hold};
use crate::telemetry::{events, Event as _, Metrics};

/// The declaration's source and what the daemon keeps of its reads.
pub(super) struct Source {
    /// The file or directory read (`--declaration`).
    path: PathBuf,
    /// The state directory: the content file, the generations, the signed high-water mark.
    state: PathBuf,
    /// With `--allowed-signers`: what a signed directory must verify against.
    trust: Option<signed::Trust>,
    /// Whether the directory's summary says who signed it (`Config::signed_summary`).
    summary: bool,
    /// The signed scope the last read verified (`verified`), until it is put in force.
    verified: Vec<signed::InForce>,
    /// How many generations are kept (`--keep-generations`).
    keep: usize,
    metrics: Arc<Metrics>,
    /// Written here: why nothing is in force, and the hold, for `/healthz`.
    health: Arc<Health>,
    /// A digest of what the last read found (its files' names and bytes, or the error, and the
    /// hold), so that a full pass reads the source again cheaply and parses it only when it
    /// changed.
    seen: Option<[u8; 32]>,
    /// The source did not exist at the last read: said once, when it went missing, not at
    /// every read until it appears.
    awaiting: bool,
    /// The daemon's content file for the declaration in force (`contents`), handed to each
    /// apply; replaced with the declaration.
    contents: Option<Arc<crate::system::ContentFile>>,
    /// The names of the files of the declaration in force (a source may name its files so
    /// that they say where they came from, as the fleet's cache does).
    names: Vec<String>,
    /// The generations kept under the state directory, and the rollback hold.
    generations: Generations,
    /// The generation of the declaration in force, when it could be recorded.
    generation: Option<u64>,
    /// A new generation whose first full pass has not ended yet: that pass notes its outcome.
    first_pass: Option<u64>,
}

/// A declaration a read of the source put in force, with where it stands among the generations.
pub(super) struct Loaded {
    pub declaration: Declaration,
    /// The generation in force, when it could be recorded.
    pub generation: Option<u64>,
    /// How a rollback holds the node, as `/healthz` and the fleet say it, or `None`.
    pub hold: Option<String>,
    /// The hold, when it was made by an automatic revert.
    pub reverted: Option<Hold>,
    /// Its signed scopes: who signed it, until when (none when unsigned, or not known, as for
    /// a generation held by a rollback).
    pub signed: Vec<signed::InForce>,
}

/// Where the source's declaration stands among the kept generations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Known {
    /// Kept, as this generation.
    Kept(u64),
    /// Never seen: a newer declaration.
    New,
    /// The generations could not be listed.
    Unknown,
}

/// What a read of the source leads to, given the hold (`choose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Choice {
    /// No hold: the source's declaration.
    Source,
    /// Held: the held generation's files instead; the generation the source holds, when it is
    /// known to be a kept one.
    Held { source_generation: Option<u64> },
    /// Held, and the source holds a declaration never seen: it releases the hold once it parses.
    Releases,
}

/// Which declaration a read puts in force: `held`, the generation a rollback holds, if any;
/// `known`, where the source's declaration stands among the kept generations. When they cannot
/// be listed, the hold is kept: the source may be the declaration that was rolled back.
pub(super) fn choose(held: Option<u64>, known: Known) -> Choice {
    match (held, known) {
        (None, _) => Choice::Source,
        (Some(_), Known::New) => Choice::Releases,
        (Some(_), Known::Kept(n)) => Choice::Held { source_generation: Some(n) },
        (Some(_), Known::Unknown) => Choice::Held { source_generation: None },
    }
}

/// A choice with what it needs: the hold, and the held generation's files.
enum Chosen {
    Source,
    Held { hold: Hold, files: Vec<(String, Vec<u8>)>, source_generation: Option<u64> },
    Releases(Hold),
}

impl Source {
    pub(super) fn new(config: &Config, metrics: Arc<Metrics>, health: Arc<Health>) -> Source {
        Source {
            path: config.declaration.clone(),
            state: config.state.clone(),
            trust: config.trust.clone(),
            summary: config.signed_summary,
            verified: Vec::new(),
            keep: config.keep_generations,
            metrics,
            health,
            seen: None,
            awaiting: false,
            contents: None,
            names: Vec::new(),
            generations: Generations::of(&config.state),
            generation: None,
            first_pass: None,
        }
    }

    /// The content file of the declaration in force, for each apply.
    pub(super) fn contents(&self) -> Option<Arc<crate::system::ContentFile>> {
        self.contents.clone()
    }

    /// The names of the files of the declaration in force.
    pub(super) fn names(&self) -> &[String] {
        &self.names
    }

    /// Reads the source and returns what it holds when it parses, to be put in force; `None`
    /// when nothing new is (the source unchanged, awaited, or refused, each said here).
    /// `in_force`: whether a declaration is in force, which a refusal keeps. With `force`
    /// false, a source that reads exactly as last time (the same files and bytes, or the same
    /// error, and the same hold) is left at that: a full pass costs a read and a digest, not a
    /// parse, and an unchanged bad declaration is not refused again at every resync.
    ///
    /// The source is read through `system::read_source`, never by plain opens: a FIFO or a
    /// device planted at the path or in the directory is refused at once and named, where an
    /// ordinary open would block the worker for good, and `/dev/zero` cannot eat memory
    /// (issue 12, fault 2).
    ///
    /// And strictly (`system::strict`, docs/decisions.md, "Strict sources"): a source that
    /// anyone but root or the agent can change, or under a directory they can, is refused as a
    /// bad declaration is, naming the path and the fix, and the declaration in force is kept.
    pub(super) fn load(&mut self, force: bool, in_force: bool) -> Option<Loaded> {
        let read = crate::system::read_strict_source(&self.path, &crate::system::Trusted::agent());
        // With `--allowed-signers`, the manifest and signatures beside the files.
        let signed = self.trust.as_ref().map(|_| signed::read(&self.path));
        // The hold is read with the source, so that making or releasing one is a change too.
        let hold = self.read_hold();
        let seen = fingerprint(&read, signed.as_ref(), hold.as_ref().map(|h| h.generation));
        if !force && self.seen == Some(seen) {
            return None;
        }
        self.seen = Some(seen);
        let kept = if in_force { "the declaration in force is kept" } else { "no declaration is in force" };
        let files = match read {
            // Not there (yet): a fresh install whose declaration the control plane has not
            // written, or a source moved away. Waited for, said once, and not a refusal: the
            // watcher follows the name, so it is read the moment it appears (issue 13).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.await_declaration("does not exist yet", in_force);
                return None;
            }
            // The packaged directory, still empty: the same wait. Emptied under a declaration
            // in force, it is refused instead (below), since that is more likely a deployment
            // gone wrong than a wish to remove everything.
            Ok(files) if files.is_empty() && !in_force => {
                self.await_declaration("holds no *.json file yet", in_force);
                return None;
            }
            Ok(files) => files,
            Err(e) => {
                let message = format!("cannot read the declaration {}: {e}", self.path.display());
                self.refused(message, kept, in_force);
                return None;
            }
        };
        self.awaiting = false;
        if !self.verified(&files, signed.as_ref(), kept, in_force) {
            return None;
        }
        let named: Vec<(String, Vec<u8>)> =
            files.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
        // Held by a rollback: the held generation's files are parsed instead.
        let mut chosen = self.chosen(hold, &named);
        let named = match &mut chosen {
            Chosen::Held { files, .. } => std::mem::take(files),
            Chosen::Source | Chosen::Releases(_) => named,
        };
        match self.parse_moving_bodies(&named) {
            Ok(declaration) => {
                self.names = named.iter().map(|(name, _)| name.clone()).collect();
                let (generation, hold, reverted) = self.in_force_generation(chosen, &named);
                let resources = declaration.resources.len();
                events::DeclarationAccepted { resources }.emit(&self.metrics);
                status(&format!("enforcing {resources} resources from {}", self.path.display()));
                self.health.set_not_in_force(None);
                let signed = self.signed_in_force(hold.is_some());
                Some(Loaded { declaration, generation, hold, reverted, signed })
            }
            // Refused whole, and the declaration in force stays in force: a half-written file,
            // or a bad one, must not undo a working machine.
            Err(refused) => {
                self.refused(refused.to_string(), kept, in_force);
                None
            }
        }
    }

    /// With `--allowed-signers`, whether the files read verify against the directory's signed
    /// manifest (`signed`, read with them), before anything of them is parsed; the high-water
    /// mark is persisted when they do, before they can be put in force. A refusal is said and
    /// counted by its reason, and the declaration in force stays.
    fn verified(
        &mut self,
        files: &[(PathBuf, Vec<u8>)],
        read: Option<&std::io::Result<signed::SignedFiles>>,
        kept: &str,
        in_force: bool,
    ) -> bool {
        let (Some(trust), Some(read)) = (&self.trust, read) else { return true };
        let accepted = match signed::check(trust, &self.path, files, read, &self.state) {
            Ok(accepted) => accepted,
            Err(refusal) => {
                events::DeclarationUntrusted {
                    reason: refusal.reason.label(),
                    message: &refusal.message,
                    kept,
                }
                .emit(&self.metrics);
                self.not_in_force(&refusal.message, in_force);
                return false;
            }
        };
        if let Err(e) = signed::persist(&self.state, &accepted) {
            let message = format!("{e}; the signed declaration is not put in force without it");
            self.refused(message, kept, in_force);
            return false;
        }
        self.verified = vec![signed::InForce::of(&accepted)];
        if accepted.first_seen {
            tracing::info!(
                version = accepted.manifest.version,
                expires = accepted.manifest.expires,
                signed_by = %accepted.signed_by.join(", "),
                "signed declaration verified"
            );
        }
        true
    }

    /// Who signed the declaration being put in force, told to `/healthz` and the gauge: the
    /// local directory's manifest as `verified` found it, or the summary of a directory with a
    /// verifier of its own; nothing for a generation a rollback holds (its signers are not
    /// kept with it), nor for an unsigned declaration.
    fn signed_in_force(&mut self, held: bool) -> Vec<signed::InForce> {
        let verified = std::mem::take(&mut self.verified);
        let signed = match (held, self.trust.is_some(), self.summary) {
            (true, _, _) => Vec::new(),
            (false, true, _) => verified,
            (false, false, true) => signed::read_summary(&self.path),
            (false, false, false) => Vec::new(),
        };
        self.health.set_signed(signed.clone());
        let gauge = &self.metrics.declaration_expires;
        gauge.clear();
        for s in &signed {
            let at = gauge.get_or_create(&vec![("scope", s.kind())]);
            let earliest = match at.get() {
                0 => s.expires,
                was => (was as u64).min(s.expires),
            };
            at.set(earliest as i64);
        }
        signed
    }

    /// The source is not there to read (`what` says how): said once, until it is, and
    /// reported on `/healthz` and to systemd while nothing is in force.
    fn await_declaration(&mut self, what: &str, in_force: bool) {
        let source = self.path.display().to_string();
        let kept = if in_force { "the declaration in force is kept" } else { "no declaration is in force" };
        if !std::mem::replace(&mut self.awaiting, true) {
            events::DeclarationAwaited { source: &source, what, kept }.emit(&self.metrics);
        }
        if !in_force {
            let why = format!("waiting for {source}, which {what}; a declaration written there is applied");
            status(&format!("no declaration in force: {why}"));
            self.health.set_not_in_force(Some(why));
        }
    }

    /// The source refused: said and counted, and noted while nothing is in force.
    fn refused(&self, message: String, kept: &str, in_force: bool) {
        events::DeclarationRefused { message: &message, kept }.emit(&self.metrics);
        self.not_in_force(&message, in_force);
    }

    /// Notes, for `/healthz`, why the source was refused, while no declaration is in force: the
    /// first line of the message, cut, since a refusal can list many problems.
    fn not_in_force(&self, message: &str, in_force: bool) {
        if in_force {
            return;
        }
        let mut line = message.lines().next().unwrap_or_default().to_owned();
        if line.len() > 300 {
            let mut end = 300;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            line.push_str("...");
        }
        let why = format!(
            "{line}; the log says more, and a valid declaration written to {} is applied",
            self.path.display()
        );
        status(&format!("no declaration in force: {line}"));
        self.health.set_not_in_force(Some(why));
    }

    /// Parses the declaration's sources, moving the declared bytes of its files out of the heap
    /// into a content file in the state directory as it goes (`contents`). Where that cannot be
    /// done, they stay in memory, which works the same.
    fn parse_moving_bodies(&mut self, named: &[(String, Vec<u8>)]) -> Result<Declaration, Refused> {
        let dir = crate::store::state_dir(&self.state);
        // The old file stays open until the new one is made: the new one never takes its inode.
        let (d, file) = contents::parse_moving(named, dir)?;
        match file {
            Ok((file, files)) => {
                tracing::info!(
                    files,
                    bytes = file.len(),
                    directory = %dir.display(),
                    "declared content kept in an unlinked file in the state directory"
                );
                self.contents = Some(Arc::new(file));
            }
            Err(e) => {
                self.contents = None;
                tracing::warn!(
                    error = %e,
                    directory = %dir.display(),
                    "cannot keep declared content in a file in the state directory; it is held in memory instead"
                )
            }
        }
        events::ContentHeld {
            in_file: self.contents.as_ref().map_or(0, |f| f.len()),
            in_memory: d.inline_bytes() as u64,
        }
        .emit(&self.metrics);
        Ok(d)
    }

    /// The hold as `hold.json` says now; one that cannot be read is said and taken as none,
    /// since the source is then the only declaration the daemon can trust.
    fn read_hold(&self) -> Option<Hold> {
        match self.generations.hold() {
            Ok(hold) => hold,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the rollback hold; the source's declaration is applied");
                None
            }
        }
    }

    /// Which declaration this read of the source puts in force (`choose`), with the held
    /// generation's files read when it is that one.
    fn chosen(&self, hold: Option<Hold>, source: &[(String, Vec<u8>)]) -> Chosen {
        let Some(hold) = hold else { return Chosen::Source };
        let known = match self.generations.with_digest(&generations::digest(source)) {
            Ok(Some(n)) => Known::Kept(n),
            Ok(None) => Known::New,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the generations; the hold is kept");
                Known::Unknown
            }
        };
        match choose(Some(hold.generation), known) {
            Choice::Source => Chosen::Source,
            Choice::Releases => Chosen::Releases(hold),
            Choice::Held { source_generation } => match self.generations.files(hold.generation) {
                Ok(files) => {
                    let files = files.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
                    Chosen::Held { hold, files, source_generation }
                }
                Err(e) => {
                    tracing::warn!(generation = hold.generation, error = %e, "cannot read the held generation; the source's declaration is applied");
                    Chosen::Source
                }
            },
        }
    }

    /// After a declaration parsed: the generation it is recorded as (or the held one), the
    /// hold released when a newer declaration came, and where it all shows (`/healthz`, the
    /// metrics, the log). `files` are those just parsed, as their source named them. Returns
    /// the generation in force, the hold as it is said, and the hold when a revert made it.
    fn in_force_generation(
        &mut self,
        chosen: Chosen,
        files: &[(String, Vec<u8>)],
    ) -> (Option<u64>, Option<String>, Option<Hold>) {
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
                if self.health.held().is_some() {
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
        (number, said, reverted)
    }

    /// Records the source's declaration as a generation (a new one when its digest is new).
    fn record_generation(&mut self, files: &[(String, Vec<u8>)]) -> Option<u64> {
        let source = self.path.display().to_string();
        match self.generations.accept(&source, files, self.keep) {
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
        let failed = report.error.as_ref().map(|e| e.failures.len());
        let outcome = generations::FirstPass::of(failed, report.error.as_ref().is_some_and(|e| e.refused));
        if let Err(e) = self.generations.first_pass(n, outcome) {
            tracing::warn!(generation = n, error = %e, "cannot note how the generation's first pass ended");
        }
    }
}

/// The hold as `/healthz` and the log say it.
fn describe_hold(h: &Hold) -> String {
    h.describe(&super::drift::utc(h.since * 1000))
}

/// Tells systemd what the agent is doing, for `systemctl status` ("Status:"). Nothing when not
/// run by systemd.
pub(super) fn status(what: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(what)]);
}

/// A digest of a read of the declaration source: each file's name, length and bytes, or the
/// error, and the generation held, if any. Two reads that digest the same found the same thing.
fn fingerprint(
    read: &std::io::Result<Vec<(PathBuf, Vec<u8>)>>,
    signed: Option<&std::io::Result<signed::SignedFiles>>,
    held: Option<u64>,
) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    if let Some(n) = held {
        h.update(b"held\0");
        h.update(n.to_le_bytes());
    }
    // A signed directory's manifest and signatures: signing again changes only them.
    match signed {
        None => {}
        Some(Ok(None)) => h.update(b"unsigned\0"),
        Some(Ok(Some((manifest, signatures)))) => {
            for (name, bytes) in
                std::iter::once(("manifest", manifest)).chain(signatures.iter().map(|(n, b)| (n.as_str(), b)))
            {
                h.update(name.as_bytes());
                h.update(b"\0");
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        Some(Err(e)) => {
            h.update(b"signed error\0");
            h.update(e.to_string().as_bytes());
        }
    }
    match read {
        Ok(files) => {
            for (path, bytes) in files {
                h.update(b"file\0");
                h.update(path.as_os_str().as_encoded_bytes());
                h.update(b"\0");
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        Err(e) => {
            h.update(b"error\0");
            h.update(e.to_string().as_bytes());
        }
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hold against every place the source's declaration can stand.
    #[test]
    fn the_choice_against_the_hold() {
        let table = [
            (None, Known::New, Choice::Source),
            (None, Known::Kept(3), Choice::Source),
            (None, Known::Unknown, Choice::Source),
            // The rolled-back declaration, or an older one: the held generation stays.
            (Some(2), Known::Kept(3), Choice::Held { source_generation: Some(3) }),
            (Some(2), Known::Kept(2), Choice::Held { source_generation: Some(2) }),
            (Some(3), Known::Kept(1), Choice::Held { source_generation: Some(1) }),
            // A newer declaration releases the hold once it parses.
            (Some(2), Known::New, Choice::Releases),
            // The generations cannot be listed: the hold is kept, as the log says.
            (Some(2), Known::Unknown, Choice::Held { source_generation: None }),
        ];
        for (held, known, choice) in table {
            assert_eq!(choose(held, known), choice, "held {held:?}, source {known:?}");
        }
    }

    #[test]
    fn a_read_digests_the_same_only_when_it_found_the_same() {
        let files = |b: &[u8]| Ok(vec![(PathBuf::from("/d/a.json"), b.to_vec())]);
        let a = fingerprint(&files(b"{}"), None, None);
        assert_eq!(a, fingerprint(&files(b"{}"), None, None));
        assert_ne!(a, fingerprint(&files(b"{ }"), None, None), "other bytes");
        assert_ne!(a, fingerprint(&files(b"{}"), None, Some(1)), "a hold made");
        assert_ne!(fingerprint(&files(b"{}"), None, Some(1)), fingerprint(&files(b"{}"), None, Some(2)));
        let missing = Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_ne!(a, fingerprint(&missing, None, None), "an error");
        assert_ne!(a, fingerprint(&files(b"{}"), Some(&Ok(None)), None), "unsigned, when signing is asked");
    }
}
