//! What happened to each resource, in the closed vocabulary of the spec.

use serde::Serialize;

use crate::declaration::Kind;

/// The outcome words (the report's `action`; `Verb` in the code, so as not to be mistaken for
/// the `action` resource type). `Corrected` is its own word and not a kind of `Updated`: it means the
/// machine had drifted from what the host last wrote, so someone changed it by hand. Being
/// unable to tell those apart is how a person ends up fixing the same file every five minutes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verb {
    /// It was not there, and the host made it.
    Created,
    /// It differed from the declaration (the declaration changed), and the host changed it.
    Updated,
    /// It was as declared; nothing was done.
    Unchanged,
    /// It had drifted from what the host last wrote, so someone changed it by hand; the host put it
    /// back.
    Corrected,
    /// No longer declared, and the host removed what it had made.
    Removed,
    /// Left exactly as it is, on purpose: a directory with data inside, a `create-once` file
    /// already there, a network still in use.
    Kept,
    /// No longer declared, and its record dropped with nothing undone: a package, an access, an
    /// action.
    Forgotten,
    /// Found present on an adopted node, its module not taken yet: reported as found, never
    /// recorded and never removed.
    Held,
    /// Only `plan` says it: whether the machine would move depends on running something `plan`
    /// does not run without `--run-verify` (an action's `verify`). Never in an apply's report.
    Undecided,
}

impl Verb {
    /// Every word, in the order the spec lists them, then `undecided`, which only `plan` says.
    pub const ALL: [Verb; 9] = [
        Verb::Created,
        Verb::Updated,
        Verb::Unchanged,
        Verb::Corrected,
        Verb::Removed,
        Verb::Kept,
        Verb::Forgotten,
        Verb::Held,
        Verb::Undecided,
    ];

    /// The word as a report spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Created => "created",
            Verb::Updated => "updated",
            Verb::Unchanged => "unchanged",
            Verb::Corrected => "corrected",
            Verb::Removed => "removed",
            Verb::Kept => "kept",
            Verb::Forgotten => "forgotten",
            Verb::Held => "held",
            Verb::Undecided => "undecided",
        }
    }

    /// What `plan` says instead: the same word, in the conditional.
    pub fn planned(self) -> &'static str {
        match self {
            Verb::Created => "would create",
            Verb::Updated => "would update",
            Verb::Unchanged => "unchanged",
            Verb::Corrected => "would correct",
            Verb::Removed => "would remove",
            Verb::Kept => "would keep",
            Verb::Forgotten => "would forget",
            Verb::Held => "would hold",
            Verb::Undecided => "would run verify to decide",
        }
    }

    /// Whether the machine moved. Keeping, holding and forgetting leave it as it was.
    pub fn moved(self) -> bool {
        match self {
            Verb::Created | Verb::Updated | Verb::Corrected | Verb::Removed => true,
            Verb::Unchanged | Verb::Kept | Verb::Forgotten | Verb::Held | Verb::Undecided => false,
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to one resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The resource's id.
    pub id: String,
    /// The resource's type.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// What it names on the machine: a path, a unit, a name, a port.
    pub target: String,
    /// What happened to it.
    pub action: Verb,
    /// A sentence for a person, where it helps ("mode 0644 to 0600"); null otherwise.
    pub detail: Option<String>,
    /// For a file whose content was corrected: what the hand-edit left, as a diff or as why
    /// none is kept. For the drift history only: not in the report, which is printed where a
    /// diff of a correction is no one's business (a terminal's scrollback, a CI log).
    #[serde(skip)]
    pub hand_edit: Option<HandEdit>,
}

/// What a hand-edit did to a file's content, as the drift history keeps it: a unified diff from
/// the declared content (what the host put back) to what the hand-edit left, bounded in size, or
/// why there is none. Never a secret: made only where `plan` may show a diff too
/// (`file::hidden`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandEdit {
    /// The diff, at most [`HandEdit::MAX`] bytes and a line saying it was cut.
    Diff(String),
    /// Why no diff is kept: `it carries a secret`, `the file on the machine is not
    /// world-readable, mode 0600`, a side too large, or not text.
    Omitted(String),
}

impl HandEdit {
    /// The most bytes of diff kept: enough for the lines a hand changes in a configuration file,
    /// while a thousand corrections keep the history to a few megabytes.
    pub const MAX: usize = 4096;
    /// The largest content, on either side, a diff is made of: above it the diff is omitted, so
    /// a correction never spends more than a small diff's time on it.
    pub const LARGEST: usize = 64 * 1024;
}

/// One resource that failed, with why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// The resource's id.
    pub id: String,
    /// The resource's type.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// What it names on the machine.
    pub target: String,
    /// Why it failed, as a person reads it.
    pub message: String,
    /// The read-back found a change made by someone else after the host's write.
    #[serde(skip)]
    pub raced: bool,
}

/// Why an apply failed: the gate that closed the pass (else the first failure), how many others,
/// and whether it was a gate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PassFailed {
    /// The id of the gate whose failure stopped the pass, or of the first resource that failed
    /// when no gate did.
    pub resource: String,
    /// Why it failed, as a person reads it.
    pub message: String,
    /// How many more resources failed, besides this one.
    pub others: usize,
    /// The failure was a gate (an action or run-once step), so nothing after it was attempted.
    pub gated: bool,
    /// The whole declaration was refused on this machine before anything was attempted (a
    /// firewall found in force on an adopted node that the host cannot manage): nothing of it
    /// may be applied while this stands, by a full pass or by a reconcile of one key.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// Every failure, the first included: an extension of the spec's report, so a person does
    /// not have to re-run to learn what else broke.
    pub failures: Vec<Failure>,
}

impl std::fmt::Display for PassFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "applying {:?}: {}", self.resource, self.message)?;
        match self.others {
            0 => {}
            1 => f.write_str(", and one other resource also failed")?,
            n => write!(f, ", and {n} other resources also failed")?,
        }
        if self.gated {
            f.write_str("; it is a gate, so nothing after it was attempted")?;
        }
        Ok(())
    }
}

/// What an apply did, in the order it did it; `error` when anything failed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Each resource's outcome, in the order it was applied.
    pub outcomes: Vec<Outcome>,
    /// Why the apply failed, or `None` when nothing did.
    pub error: Option<PassFailed>,
    /// Why the state store could not be written after the pass, when it could not: what the
    /// pass did is on the machine, but not recorded (the next pass reads it from the machine).
    /// Not a resource's failure, so not in `error`; the apply still exits 1.
    #[serde(rename = "store-error", skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
}

impl Report {
    /// Whether anything failed: a resource, or recording what was done.
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.store_error.is_some()
    }

    /// Whether anything on the machine moved.
    pub fn changed(&self) -> bool {
        self.outcomes.iter().any(|o| o.action.moved())
    }

    /// How many outcomes of each action, in the order of `Verb::ALL`, zeros left out.
    pub fn counts(&self) -> Vec<(Verb, usize)> {
        Verb::ALL
            .into_iter()
            .map(|a| (a, self.outcomes.iter().filter(|o| o.action == a).count()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}
