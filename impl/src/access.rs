//! Who may do what in a project.
//!
//! Roles, from least to most: `viewer` (read), `reviewer` (read, write
//! reviews), `editor` (create, change, run), `owner` (everything: members,
//! webhooks, deleting the project, billing). A user sees only the projects
//! they belong to; anything else is "not found" (404), never a hint that it
//! exists. A member whose role is not enough gets 403.

use rusqlite::{params, OptionalExtension as _};

use crate::failure::{Failure, Result};

/// SQL: the projects the user `?1` is a member of; only `?2` among them
/// when `?2` is not NULL.
pub const MEMBER_PROJECTS: &str =
    "SELECT project_id FROM project_members WHERE user_id = ?1 AND (?2 IS NULL OR project_id = ?2)";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    Reviewer,
    Editor,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Reviewer => "reviewer",
            Role::Editor => "editor",
            Role::Owner => "owner",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "viewer" => Role::Viewer,
            "reviewer" => Role::Reviewer,
            "editor" => Role::Editor,
            "owner" => Role::Owner,
            _ => return None,
        })
    }
}

/// What an operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Read,
    Review,
    Edit,
    Own,
}

impl Need {
    fn least_role(self) -> Role {
        match self {
            Need::Read => Role::Viewer,
            Need::Review => Role::Reviewer,
            Need::Edit => Role::Editor,
            Need::Own => Role::Owner,
        }
    }
}

/// The caller's role in a project, if they are a member.
pub fn role_in(tx: &rusqlite::Connection, user_id: &str, project_id: &str) -> Result<Option<Role>> {
    let role: Option<String> = tx
        .prepare_cached("SELECT role FROM project_members WHERE project_id = ?1 AND user_id = ?2")?
        .query_row(params![project_id, user_id], |r| r.get(0))
        .optional()?;
    Ok(role.as_deref().and_then(Role::parse))
}

/// The caller's role in `project_id`, if it is at least what `need` needs:
/// 404 for a non-member (or no such project), 403 for too small a role.
pub fn require(tx: &rusqlite::Connection, user_id: &str, project_id: &str, need: Need) -> Result<Role> {
    let role = role_in(tx, user_id, project_id)?.ok_or_else(|| Failure::not_found("project", project_id))?;
    check(role, need)?;
    Ok(role)
}

pub fn check(role: Role, need: Need) -> Result<()> {
    if role < need.least_role() {
        return Err(Failure::Forbidden(format!(
            "your role in this project is {}; this needs {} or higher",
            role.as_str(),
            need.least_role().as_str()
        )));
    }
    Ok(())
}

/// For a resource in a project-scoped `table` (`channels`, `tests`, …): its
/// project and the caller's role there, if `need` is met. A resource in a
/// project the caller is not in is "not found", as if it did not exist.
pub fn require_resource(
    tx: &rusqlite::Connection,
    user_id: &str,
    table: &'static str,
    what: &str,
    id: &str,
    need: Need,
) -> Result<(String, Role)> {
    let found: Option<(String, Option<String>)> = tx
        .prepare_cached(&format!(
            "SELECT t.project_id, m.role FROM {table} t
             LEFT JOIN project_members m ON m.project_id = t.project_id AND m.user_id = ?2
             WHERE t.id = ?1"
        ))?
        .query_row(params![id, user_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((project_id, Some(role))) = found else {
        return Err(Failure::not_found(what, id));
    };
    let role = Role::parse(&role).ok_or_else(|| Failure::not_found(what, id))?;
    check(role, need)?;
    Ok((project_id, role))
}

/// A reference from a request body to another resource (`channel_id`, …):
/// it must exist and be in `project_id`. Both failures are 400 naming the
/// field; neither says whether the id exists elsewhere.
pub fn require_reference(
    tx: &rusqlite::Transaction<'_>,
    table: &'static str,
    field: &str,
    id: &str,
    project_id: &str,
) -> Result<()> {
    let in_project: Option<bool> = tx
        .prepare_cached(&format!("SELECT project_id = ?2 FROM {table} WHERE id = ?1"))?
        .query_row(params![id, project_id], |r| r.get(0))
        .optional()?;
    match in_project {
        Some(true) => Ok(()),
        _ => Err(Failure::invalid(field, format_args!("`{id}` is not a resource of this project"))),
    }
}

/// 409 `name_taken` if another row of `table` in `project_id` (other than
/// `except`) has this name; `a_kind` names one ("a persona").
pub fn check_name_free(
    tx: &rusqlite::Transaction<'_>,
    table: &'static str,
    a_kind: &str,
    project_id: &str,
    name: &str,
    except: &str,
) -> Result<()> {
    let other: Option<String> = tx
        .prepare_cached(&format!("SELECT id FROM {table} WHERE project_id = ?1 AND name = ?2 AND id <> ?3 LIMIT 1"))?
        .query_row(params![project_id, name, except], |r| r.get(0))
        .optional()?;
    match other {
        None => Ok(()),
        Some(other) => Err(Failure::Conflict {
            code: "name_taken",
            message: format!("name: {a_kind} named \"{name}\" already exists in this project (`{other}`)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_by_what_they_allow() {
        assert!(check(Role::Viewer, Need::Read).is_ok());
        assert!(check(Role::Viewer, Need::Review).is_err());
        assert!(check(Role::Reviewer, Need::Review).is_ok());
        assert!(check(Role::Reviewer, Need::Edit).is_err());
        assert!(check(Role::Editor, Need::Edit).is_ok());
        assert!(check(Role::Editor, Need::Own).is_err());
        assert!(check(Role::Owner, Need::Own).is_ok());
        for r in ["viewer", "reviewer", "editor", "owner"] {
            assert_eq!(Role::parse(r).unwrap().as_str(), r);
        }
    }
}
