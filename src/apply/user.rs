//! `user`: a local account, present. Fields left out of the declaration are left as the
//! machine has them; fields declared are compared on every pass and put back.
//!
//! Two things are refused rather than changed: a different uid (renumbering an account leaves
//! every file it owns to a number that may later be someone else's) and, for an account that
//! exists, `system` (it only chooses the uid range at creation). Supplementary groups are added,
//! never taken away: a group an administrator added by hand may be how they log in
//! (docs/systemd.md, "user").

use super::{begin, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{Kind, Resource, User};
use crate::system::accounts::{self, Account, Changes, NewAccount};

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, u: &User) -> Result<Step, Error> {
    let name = u.name.as_str();
    // Whether the host made this account as declared now: a difference then is someone's hand.
    let recorded = ctx
        .store
        .get(r.id.as_str())
        .is_some_and(|rec| rec.kind == Kind::User && *rec.target == *name && rec.declared == r.digest);
    let groups: Vec<&str> = u.groups.iter().map(|g| g.as_str()).collect();
    // Supplementary groups must exist already: there is no group resource, and making a group
    // from a typo would give an account a membership nobody meant (docs/systemd.md, "user").
    for g in &groups {
        if !accounts::group_exists(g)? {
            return Err(Error::NoGroup { user: name.to_owned(), group: (*g).to_owned() });
        }
    }
    let dry_run = ctx.opts.dry_run;

    let Some(found) = accounts::lookup(name)? else {
        let detail = if recorded { "it had been removed on the machine; added again" } else { "added" };
        let action = if recorded { Verb::Corrected } else { Verb::Created };
        if dry_run {
            return Ok(Step::Done(begin(r, action, Some(detail.into())), None));
        }
        ensure_group(u)?;
        let (home, shell) = (u.home.as_ref().map(|h| h.to_string()), u.shell.as_ref().map(|s| s.to_string()));
        accounts::add(&NewAccount {
            name,
            system: u.system,
            uid: u.uid,
            group: u.group.as_ref().map(|g| g.as_str()),
            groups: &groups,
            home: home.as_deref(),
            shell: shell.as_deref(),
        })?;
        read_back(u, name)?;
        return Ok(Step::Done(begin(r, action, Some(detail.into())), Some(Facts::default())));
    };

    if let Some(uid) = u.uid {
        if uid != found.uid {
            return Err(Error::Renumber { user: name.to_owned(), found: found.uid, declared: uid });
        }
    }
    let (changes, said) = differences(u, &found, &groups);
    if changes.is_empty() {
        return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(Facts::default())));
    }
    let (action, detail) = if recorded {
        (Verb::Corrected, format!("changed on the machine since the host set it: {}", said.join(", ")))
    } else {
        (Verb::Updated, said.join(", "))
    };
    if dry_run {
        return Ok(Step::Done(begin(r, action, Some(detail)), None));
    }
    ensure_group(u)?;
    accounts::modify(name, &changes)?;
    read_back(u, name)?;
    Ok(Step::Done(begin(r, action, Some(detail)), Some(Facts::default())))
}

/// What differs between the declaration and the account: the changes to make, and how each is
/// said in the report.
fn differences(u: &User, found: &Account, groups: &[&str]) -> (Changes, Vec<String>) {
    let mut c = Changes::default();
    let mut said = Vec::new();
    if let Some(g) = &u.group {
        if g.as_str() != found.group {
            c.group = Some(g.to_string());
            said.push(format!("group {} to {g}", found.group));
        }
    }
    for g in groups {
        if !found.groups.contains(*g) {
            c.add_groups.push((*g).to_owned());
        }
    }
    if !c.add_groups.is_empty() {
        said.push(format!("added to {}", c.add_groups.join(", ")));
    }
    if let Some(h) = &u.home {
        if h.to_string() != found.home {
            c.home = Some(h.to_string());
            said.push(format!("home {} to {h}", found.home));
        }
    }
    if let Some(s) = &u.shell {
        if s.to_string() != found.shell {
            c.shell = Some(s.to_string());
            said.push(format!("shell {} to {s}", found.shell));
        }
    }
    (c, said)
}

/// The declared primary group is made when absent: it is the account's own.
fn ensure_group(u: &User) -> Result<(), Error> {
    if let Some(g) = &u.group {
        if !accounts::group_exists(g.as_str())? {
            accounts::add_group(g.as_str(), u.system)?;
        }
    }
    Ok(())
}

/// Reads the account again and checks every declared field took.
fn read_back(u: &User, name: &str) -> Result<(), Error> {
    let groups: Vec<&str> = u.groups.iter().map(|g| g.as_str()).collect();
    let found = accounts::lookup(name)?.ok_or_else(|| Error::AccountMissing { user: name.to_owned() })?;
    if let Some(uid) = u.uid.filter(|uid| *uid != found.uid) {
        return Err(Error::AccountUid { user: name.to_owned(), wanted: uid, found: found.uid });
    }
    let (left, said) = differences(u, &found, &groups);
    if !left.is_empty() {
        return Err(Error::AccountDiffers { user: name.to_owned(), left: said.join(", ") });
    }
    Ok(())
}
