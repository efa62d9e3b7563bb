//! Why a declaration was refused, named the way a compiler names a line.

use std::fmt;

/// One thing wrong with a declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The document the problem is in, when the declaration came from several named ones.
    pub source: Option<String>,
    /// The resource's position in `resources`, when the problem is inside one.
    pub index: Option<usize>,
    /// The resource's id, when it has a readable one.
    pub id: Option<String>,
    /// The field, as a path inside the resource (`mode`, `restart-on[1]`, `secrets.db`).
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}: ")?;
        }
        match (self.index, &self.id) {
            (Some(i), Some(id)) => write!(f, "resources[{i}] (id {id:?})")?,
            (Some(i), None) => write!(f, "resources[{i}]")?,
            (None, _) => f.write_str("declaration")?,
        }
        if let Some(field) = &self.field {
            write!(f, ", field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A declaration refused whole. Every problem found is listed, not only the first, so one
/// round trip through the control plane fixes them all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    pub problems: Vec<Problem>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "the declaration was refused ({n} problem{}); nothing on the machine was touched",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}
