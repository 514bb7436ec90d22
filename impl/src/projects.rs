//! Projects and their members.
//!
//! Anyone signed in can create a project and becomes its owner. Members see
//! the project and everything in it; editors change it; owners also manage
//! members and webhooks and delete it. A project always keeps at least one
//! owner. Deleting a project removes everything in it in one transaction
//! (the schema cascades).
//!
//! This module is also the pattern the other resource modules follow: parse
//! the request into checked values before the transaction, then in one
//! write transaction check access, change, and record the activity.

use rusqlite::{params, OptionalExtension as _};
use serde_json::{json, Value};
use sparring_server::{params as p, types, BodyFields, Caller};
use std::sync::LazyLock;

use crate::access::{self, Need, Role};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{PageRequest, PageSql, AFTER};
use crate::{ids, validate, AppState};

pub const DEFAULT_MAX_CALL_DURATION_S: u32 = 600;
pub const DEFAULT_CONCURRENCY: u32 = 10;
const MAX_WEBHOOK_SECRET: usize = 200;
const MASKED: &str = "***";

/// The editable part of a project, checked.
struct ProjectInput {
    name: String,
    description: String,
    webhook_url: Option<String>,
    /// `None`: keep the stored secret; `Some(None)`: clear it.
    webhook_secret: Option<Option<String>>,
    max_call_duration_s: u32,
    default_concurrency: u32,
}

impl ProjectInput {
    fn parse(
        name: &str,
        description: Option<&str>,
        webhook_url: Option<&str>,
        webhook_secret: Option<&str>,
        settings: Option<&types::ProjectSettings>,
    ) -> Result<ProjectInput> {
        let webhook_secret = match webhook_secret {
            None => None,
            Some("") => Some(None),
            Some(s) => Some(Some(validate::text("webhook_secret", s, MAX_WEBHOOK_SECRET)?)),
        };
        let (max_call_duration_s, default_concurrency) = match settings {
            Some(s) => (
                validate::range("settings.max_call_duration_s", s.max_call_duration_s.get(), 1, 3600)?,
                validate::range(
                    "settings.default_concurrency",
                    s.default_concurrency.get(),
                    1,
                    crate::batches::MAX_CONCURRENCY,
                )?,
            ),
            None => (DEFAULT_MAX_CALL_DURATION_S, DEFAULT_CONCURRENCY),
        };
        Ok(ProjectInput {
            name: validate::name("name", name)?,
            description: validate::text("description", description.unwrap_or(""), validate::MAX_DESCRIPTION)?,
            webhook_url: webhook_url.map(|u| validate::url("webhook_url", u, &["http", "https"])).transpose()?,
            webhook_secret,
            max_call_duration_s,
            default_concurrency,
        })
    }

    /// Every field, as the create's activity record shows them (the secret
    /// masked).
    fn changes(&self) -> serde_json::Value {
        let mut c = json!({
            "name": self.name,
            "description": self.description,
            "webhook_url": self.webhook_url,
            "settings": {"max_call_duration_s": self.max_call_duration_s, "default_concurrency": self.default_concurrency},
        });
        if let Some(secret) = &self.webhook_secret {
            c["webhook_secret"] = json!(secret.as_ref().map(|_| MASKED));
        }
        c
    }

    /// The fields that differ from `before`, as the activity log shows
    /// them; empty when this is the project as it is. Of `settings`, only
    /// the settings that changed. A secret given is a change (it cannot be
    /// compared), shown masked; clearing one counts only if there was one.
    fn changes_from(&self, before: &types::Project) -> serde_json::Map<String, serde_json::Value> {
        let mut c = serde_json::Map::new();
        if before.name != self.name {
            c.insert("name".into(), json!(self.name));
        }
        if before.description != self.description {
            c.insert("description".into(), json!(self.description));
        }
        if before.webhook_url != self.webhook_url {
            c.insert("webhook_url".into(), json!(self.webhook_url));
        }
        let mut settings = serde_json::Map::new();
        if before.settings.max_call_duration_s.get() != self.max_call_duration_s {
            settings.insert("max_call_duration_s".into(), json!(self.max_call_duration_s));
        }
        if before.settings.default_concurrency.get() != self.default_concurrency {
            settings.insert("default_concurrency".into(), json!(self.default_concurrency));
        }
        if !settings.is_empty() {
            c.insert("settings".into(), settings.into());
        }
        match &self.webhook_secret {
            Some(Some(_)) => {
                c.insert("webhook_secret".into(), json!(MASKED));
            }
            Some(None) if before.webhook_secret_configured => {
                c.insert("webhook_secret".into(), serde_json::Value::Null);
            }
            _ => {}
        }
        c
    }
}

pub(crate) fn webhook_secret_context(project_id: &str) -> String {
    format!("project:{project_id}:webhook_secret")
}

const COLUMNS: &str = "p.id, p.name, p.description, p.webhook_url, p.webhook_secret IS NOT NULL, \
                       p.max_call_duration_s, p.default_concurrency, p.created_at, p.updated_at, m.role, \
                       p.billing_user_id";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Project> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let count = |i: usize| -> rusqlite::Result<std::num::NonZeroU32> {
        let n: u32 = row.get(i)?;
        Ok(std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN))
    };
    let role: String = row.get(9)?;
    Ok(types::Project {
        id: row.get(0)?,
        name: row.get(1)?,
        description: row.get(2)?,
        webhook_url: row.get(3)?,
        webhook_secret_configured: row.get(4)?,
        settings: types::ProjectSettings { max_call_duration_s: count(5)?, default_concurrency: count(6)? },
        created_at: time(7)?,
        updated_at: time(8)?,
        role: wire_role(Role::parse(&role).unwrap_or(Role::Viewer)),
        billing_user_id: row.get(10)?,
    })
}

fn wire_role(role: Role) -> types::ProjectRole {
    match role {
        Role::Owner => types::ProjectRole::Owner,
        Role::Editor => types::ProjectRole::Editor,
        Role::Reviewer => types::ProjectRole::Reviewer,
        Role::Viewer => types::ProjectRole::Viewer,
    }
}

fn role_of(role: types::ProjectRole) -> Role {
    match role {
        types::ProjectRole::Owner => Role::Owner,
        types::ProjectRole::Editor => Role::Editor,
        types::ProjectRole::Reviewer => Role::Reviewer,
        types::ProjectRole::Viewer => Role::Viewer,
    }
}

/// The project as `user_id` sees it (their role included).
fn load(tx: &rusqlite::Connection, user_id: &str, project_id: &str) -> Result<types::Project> {
    tx.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM projects p JOIN project_members m ON m.project_id = p.id AND m.user_id = ?2 WHERE p.id = ?1"
    ))?
    .query_row(params![project_id, user_id], from_row)
    .optional()?
    .ok_or_else(|| Failure::not_found("project", project_id))
}

/// A page of `GET /v1/projects` (see [`PageSql`]): the caller's
/// memberships in order from `project_members_by_user`, each joined to its
/// project, no sort, and the walk stops at the limit. (Ordered by `p.id`,
/// the same value, the planner does not see that the index gives that
/// order: it read and sorted every project of the caller's for each page.)
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT {COLUMNS} FROM projects p JOIN project_members m ON m.project_id = p.id AND m.user_id = ?1
             {AFTER} ORDER BY m.project_id DESC LIMIT ?3"
        ),
        "WHERE m.project_id < ?2",
    )
});

pub async fn list(state: &AppState, caller: Caller, query: p::ListProjectsQuery) -> Result<types::ProjectList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "prj").map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            let rows = tx
                .prepare_cached(LIST_SQL.of(&page))?
                .query_map(params![caller.user_id, page.after, page.fetch_limit()], from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let page = page.finish(rows, |p| p.id.clone());
            Ok(types::ProjectList { projects: page.items, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreateProjectRequest) -> Result<types::Project> {
    let input = ProjectInput::parse(
        &body.name,
        body.description.as_deref().map(|s| s.as_str()),
        body.webhook_url.as_deref().map(|s| s.as_str()),
        body.webhook_secret.as_deref().map(|s| s.as_str()),
        body.settings.as_ref(),
    )?;
    if let Some(url) = &input.webhook_url {
        crate::engine::outbound::check_given(state.engine.allows_private_targets(), "webhook_url", url)?;
    }
    let id = ids::new_id("prj");
    let sealed = match &input.webhook_secret {
        Some(Some(secret)) => Some(state.secrets.seal(secret.as_bytes(), &webhook_secret_context(&id))),
        _ => None,
    };
    state
        .store
        .write(move |tx| {
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO projects (id, name, description, webhook_url, webhook_secret, max_call_duration_s,
                                       default_concurrency, created_at, updated_at, billing_user_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9)",
                params![
                    id,
                    input.name,
                    input.description,
                    input.webhook_url,
                    sealed,
                    input.max_call_duration_s,
                    input.default_concurrency,
                    now,
                    caller.user_id
                ],
            )?;
            tx.execute(
                "INSERT INTO project_members (project_id, user_id, role, added_at) VALUES (?1, ?2, 'owner', ?3)",
                params![id, caller.user_id, now],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller.clone()),
                Record {
                    action: "project.create",
                    resource_type: "project",
                    resource_id: &id,
                    project_id: Some(&id),
                    summary: format!("created project \"{}\"", input.name),
                    changes: input.changes().into(),
                },
            )?;
            load(tx, &caller.user_id, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetProjectPath) -> Result<types::Project> {
    state.store.read(move |tx| load(tx, &caller.user_id, &path.id)).await
}

/// `PUT`: replaces the editable part. Editors may change everything but the
/// webhook, which is the owners'. A body that is the project as it is writes
/// nothing.
pub async fn replace(
    state: &AppState,
    caller: Caller,
    path: p::ReplaceProjectPath,
    body: types::ReplaceProjectRequest,
) -> Result<types::Project> {
    let input = ProjectInput::parse(
        &body.name,
        body.description.as_deref().map(|s| s.as_str()),
        body.webhook_url.as_deref().map(|s| s.as_str()),
        body.webhook_secret.as_deref().map(|s| s.as_str()),
        body.settings.as_ref(),
    )?;
    let sealed = match &input.webhook_secret {
        Some(Some(secret)) => Some(state.secrets.seal(secret.as_bytes(), &webhook_secret_context(&path.id))),
        _ => None,
    };
    let allow_private = state.engine.allows_private_targets();
    state
        .store
        .write(move |tx| {
            let role = access::require(tx, &caller.user_id, &path.id, Need::Edit)?;
            let before = load(tx, &caller.user_id, &path.id)?;
            let webhook_changes = before.webhook_url != input.webhook_url || input.webhook_secret.is_some();
            if let Some(url) = input.webhook_url.as_ref().filter(|u| before.webhook_url.as_ref() != Some(u)) {
                crate::engine::outbound::check_given(allow_private, "webhook_url", url)?;
            }
            if webhook_changes {
                access::check(role, Need::Own)
                    .map_err(|_| Failure::Forbidden("only owners change a project's webhook".into()))?;
            }
            // Only what differs from the project as it is is recorded; the
            // project as it is: nothing written, nothing recorded.
            let changes = input.changes_from(&before);
            if changes.is_empty() {
                return Ok(before);
            }
            // A secret stored with no URL, or with the URL cleared since,
            // was set for no origin: a URL set now needs it given again too.
            if let (Some(url), None, true) =
                (&input.webhook_url, &input.webhook_secret, before.webhook_secret_configured)
            {
                let from = match &before.webhook_url {
                    Some(was) if validate::same_destination(was, url) => None,
                    Some(was) => Some(format!("moves from `{was}` to `{url}`, another origin")),
                    None => Some(format!("is set to `{url}` where there was none")),
                };
                if let Some(from) = from {
                    return Err(Failure::invalid(
                        "webhook_secret",
                        format_args!(
                            "the webhook {from}: give `webhook_secret` again (or an empty string for none), \
                             since a stored secret only signs for where it was set"
                        ),
                    ));
                }
            }
            let now = ids::format_time(&ids::now());
            tx.execute(
                "UPDATE projects SET name = ?2, description = ?3, webhook_url = ?4, max_call_duration_s = ?5,
                        default_concurrency = ?6, updated_at = ?7 WHERE id = ?1",
                params![
                    path.id,
                    input.name,
                    input.description,
                    input.webhook_url,
                    input.max_call_duration_s,
                    input.default_concurrency,
                    now
                ],
            )?;
            if let Some(secret) = &input.webhook_secret {
                let value = secret.as_ref().and(sealed.as_ref());
                tx.execute("UPDATE projects SET webhook_secret = ?2 WHERE id = ?1", params![path.id, value])?;
            }
            if before.webhook_url.is_some() && input.webhook_url.is_none() {
                crate::engine::webhooks::abandon_pending_of(tx, &path.id)?;
            }
            activity::record(
                tx,
                &Actor::Caller(caller.clone()),
                Record {
                    action: "project.update",
                    resource_type: "project",
                    resource_id: &path.id,
                    project_id: Some(&path.id),
                    summary: format!(
                        "updated project \"{}\" ({})",
                        input.name,
                        changes.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                    ),
                    changes: serde_json::Value::Object(changes).into(),
                },
            )?;
            load(tx, &caller.user_id, &path.id)
        })
        .await
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteProjectPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &path.id, Need::Own)?;
            let name: String =
                tx.query_row("SELECT name FROM projects WHERE id = ?1", params![path.id], |r| r.get(0))?;
            let active: i64 = tx.query_row(
                "SELECT count(*) FROM batch_runs WHERE project_id = ?1 AND status IN ('queued', 'running')",
                params![path.id],
                |r| r.get(0),
            )?;
            if active > 0 {
                return Err(Failure::runs_active(
                    format_args!("project `{}` has {active} batch runs", path.id),
                    "cancel them",
                ));
            }
            // Its members keep reading its activity records.
            tx.execute(
                "INSERT OR IGNORE INTO former_members (user_id, project_id)
                 SELECT user_id, project_id FROM project_members WHERE project_id = ?1",
                params![path.id],
            )?;
            // Everything in the project goes with it (ON DELETE CASCADE).
            tx.execute("DELETE FROM projects WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "project.delete",
                    resource_type: "project",
                    resource_id: &path.id,
                    project_id: Some(&path.id),
                    summary: format!("deleted project \"{name}\" and everything in it"),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

// Members.

const MEMBER_COLUMNS: &str = "u.id, u.email, u.name, m.role, m.added_at";

fn member_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::ProjectMember> {
    let role: String = row.get(3)?;
    let added: String = row.get(4)?;
    Ok(types::ProjectMember {
        user_id: row.get(0)?,
        email: row.get(1)?,
        name: row.get(2)?,
        role: wire_role(Role::parse(&role).unwrap_or(Role::Viewer)),
        added_at: ids::parse_time(&added).unwrap_or_default(),
    })
}

fn load_member(tx: &rusqlite::Transaction<'_>, project_id: &str, user_id: &str) -> Result<types::ProjectMember> {
    tx.prepare_cached(&format!(
        "SELECT {MEMBER_COLUMNS} FROM project_members m JOIN users u ON u.id = m.user_id
         WHERE m.project_id = ?1 AND m.user_id = ?2"
    ))?
    .query_row(params![project_id, user_id], member_from_row)
    .optional()?
    .ok_or_else(|| Failure::NotFound(format!("user `{user_id}` is not a member of this project")))
}

fn owners(tx: &rusqlite::Transaction<'_>, project_id: &str) -> Result<i64> {
    Ok(tx.query_row(
        "SELECT count(*) FROM project_members WHERE project_id = ?1 AND role = 'owner'",
        params![project_id],
        |r| r.get(0),
    )?)
}

/// The project's payer stays an owner and a member until another owner
/// takes billing over: no one is made to pay by someone stepping down.
fn stays_for_billing(tx: &rusqlite::Transaction<'_>, project_id: &str, user_id: &str) -> Result<()> {
    if crate::credits::payer_of(tx, project_id)? == user_id {
        return Err(Failure::Conflict {
            code: "billing_owner",
            message: format!(
                "`{user_id}` pays for this project's runs (`billing_user_id`) and stays an owner until another \
                 owner takes billing over (`POST /v1/projects/{project_id}/billing`)"
            ),
        });
    }
    Ok(())
}

/// `POST /projects/{id}/billing`: the calling owner becomes the payer.
/// Runs already started stay with the payer they reserved from.
pub async fn take_over_billing(
    state: &AppState,
    caller: Caller,
    path: p::TakeOverProjectBillingPath,
) -> Result<types::Project> {
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &path.id, Need::Own)?;
            let before = crate::credits::payer_of(tx, &path.id)?;
            if before == caller.user_id {
                return load(tx, &caller.user_id, &path.id);
            }
            tx.execute(
                "UPDATE projects SET billing_user_id = ?2, updated_at = ?3 WHERE id = ?1",
                params![path.id, caller.user_id, ids::format_time(&ids::now())],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller.clone()),
                Record {
                    action: "project.billing",
                    resource_type: "project",
                    resource_id: &path.id,
                    project_id: Some(&path.id),
                    summary: format!("took over billing from `{before}`"),
                    changes: json!({"billing_user_id": {"from": before, "to": caller.user_id}}).into(),
                },
            )?;
            load(tx, &caller.user_id, &path.id)
        })
        .await
}

/// A page of a project's members (`?1`), newest first: added last first,
/// then by user id, after the cursor's time `?2` and user `?3`, at most
/// `?4` (see [`PageSql`]). Read in order from `project_members_by_added`
/// from the cursor on (a row value is a range on it): no sort of every
/// member for each page.
pub(crate) static MEMBERS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT {MEMBER_COLUMNS} FROM project_members m JOIN users u ON u.id = m.user_id
             WHERE m.project_id = ?1 {AFTER}
             ORDER BY m.added_at DESC, m.user_id DESC LIMIT ?4"
        ),
        "AND (m.added_at, m.user_id) < (?2, ?3)",
    )
});

pub async fn list_members(
    state: &AppState,
    caller: Caller,
    path: p::ListProjectMembersPath,
    query: p::ListProjectMembersQuery,
) -> Result<types::ProjectMemberList> {
    // Newest first: the member added last first, whenever their account
    // was made.
    let (page, after) = PageRequest::parse_timed(query.limit, query.cursor.as_deref(), "usr")
        .map_err(|e| Failure::invalid("cursor", e))?;
    let (after_added, after_user) = after.unzip();
    state
        .store
        .read(move |tx| {
            access::require(tx, &caller.user_id, &path.id, Need::Read)?;
            let rows = tx
                .prepare_cached(MEMBERS_SQL.of(&page))?
                .query_map(params![path.id, after_added, after_user, page.fetch_limit()], member_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let page = page.finish(rows, |m| PageRequest::timed_cursor(&m.added_at, &m.user_id));
            Ok(types::ProjectMemberList { members: page.items, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn add_member(
    state: &AppState,
    caller: Caller,
    path: p::AddProjectMemberPath,
    body: types::AddProjectMemberRequest,
) -> Result<types::ProjectMember> {
    let role = role_of(body.role);
    let who = match (body.email, body.user_id) {
        // The rule `sparring admin create-key --user` makes users by.
        (Some(email), None) => Who::Email(crate::users::email(&email).map_err(|e| Failure::invalid("email", e))?),
        (None, Some(user_id)) => Who::Id(user_id),
        _ => return Err(Failure::invalid("email", "give exactly one of `email` and `user_id`")),
    };
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &path.id, Need::Own)?;
            // The spec's 404: the request is well formed, the user is not
            // there. By id, only someone the caller shares a project with:
            // an id is no address, and a stranger's would answer with their
            // email.
            let found = match &who {
                Who::Email(email) => tx
                    .query_row("SELECT id FROM users WHERE email = ?1 COLLATE NOCASE", params![email], |r| r.get(0))
                    .optional()?
                    .ok_or_else(|| {
                        Failure::NotFound(format!(
                            "no user `{email}`; a user is made by their first sign-in with an ID token, \
                             or by `sparring admin create-key --user EMAIL --label LABEL`"
                        ))
                    }),
                Who::Id(id) => tx
                    .query_row(
                        "SELECT u.id FROM users u WHERE u.id = ?1 AND EXISTS (
                             SELECT 1 FROM project_members mine
                             JOIN project_members theirs ON theirs.project_id = mine.project_id
                             WHERE mine.user_id = ?2 AND theirs.user_id = u.id)",
                        params![id, caller.user_id],
                        |r| r.get(0),
                    )
                    .optional()?
                    .ok_or_else(|| {
                        Failure::NotFound(format!(
                            "no user `{id}` who shares a project with you; add anyone else by their `email`"
                        ))
                    }),
            };
            let user_id: String = found?;
            if access::role_in(tx, &user_id, &path.id)?.is_some() {
                return Err(Failure::Conflict {
                    code: "already_member",
                    message: format!("user `{user_id}` is already a member; change their role instead"),
                });
            }
            tx.execute(
                "INSERT INTO project_members (project_id, user_id, role, added_at) VALUES (?1, ?2, ?3, ?4)",
                params![path.id, user_id, role.as_str(), ids::format_time(&ids::now())],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "project_member.add",
                    resource_type: "project_member",
                    resource_id: &user_id,
                    project_id: Some(&path.id),
                    summary: format!("added `{user_id}` as {}", role.as_str()),
                    changes: json!({"user_id": user_id, "role": role.as_str()}).into(),
                },
            )?;
            load_member(tx, &path.id, &user_id)
        })
        .await
}

enum Who {
    Email(String),
    Id(String),
}

pub async fn update_member(
    state: &AppState,
    caller: Caller,
    path: p::UpdateProjectMemberPath,
    body: types::UpdateProjectMemberRequest,
    _fields: BodyFields,
) -> Result<types::ProjectMember> {
    let role = role_of(body.role);
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &path.id, Need::Own)?;
            let before = access::role_in(tx, &path.user_id, &path.id)?
                .ok_or_else(|| Failure::NotFound(format!("user `{}` is not a member of this project", path.user_id)))?;
            // The role they have already: nothing changes, nothing to record.
            if before == role {
                return load_member(tx, &path.id, &path.user_id);
            }
            if before == Role::Owner && role != Role::Owner && owners(tx, &path.id)? == 1 {
                return Err(Failure::Conflict {
                    code: "last_owner",
                    message: "a project keeps at least one owner; make someone else owner first".into(),
                });
            }
            if role != Role::Owner {
                stays_for_billing(tx, &path.id, &path.user_id)?;
            }
            tx.execute(
                "UPDATE project_members SET role = ?3 WHERE project_id = ?1 AND user_id = ?2",
                params![path.id, path.user_id, role.as_str()],
            )?;
            let completed = if role < Role::Reviewer {
                crate::reviews::calibration::stop_waiting_for(tx, &path.id, &path.user_id)?
            } else {
                Vec::new()
            };
            let mut changes = json!({"role": {"from": before.as_str(), "to": role.as_str()}});
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "project_member.update",
                    resource_type: "project_member",
                    resource_id: &path.user_id,
                    project_id: Some(&path.id),
                    summary: format!(
                        "changed the role of `{}` from {} to {}{}",
                        path.user_id,
                        before.as_str(),
                        role.as_str(),
                        calibrations_completed(&completed, &mut changes)
                    ),
                    changes: changes.into(),
                },
            )?;
            load_member(tx, &path.id, &path.user_id)
        })
        .await
}

/// The calibration reviews a member who can no longer label completed (see
/// `reviews::calibration::stop_waiting_for`): added to `changes`, and the
/// words for the summary ("" for none).
fn calibrations_completed(completed: &[String], changes: &mut Value) -> String {
    if completed.is_empty() {
        return String::new();
    }
    changes["calibrations_completed"] = json!(completed);
    format!("; calibration reviews no longer waiting for their labels, now complete: {}", completed.join(", "))
}

/// Owners remove anyone; any member may leave.
pub async fn remove_member(
    state: &AppState,
    caller: Caller,
    path: p::RemoveProjectMemberPath,
) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let need = if path.user_id == caller.user_id { Need::Read } else { Need::Own };
            access::require(tx, &caller.user_id, &path.id, need)?;
            let before = access::role_in(tx, &path.user_id, &path.id)?
                .ok_or_else(|| Failure::NotFound(format!("user `{}` is not a member of this project", path.user_id)))?;
            if before == Role::Owner && owners(tx, &path.id)? == 1 {
                return Err(Failure::Conflict {
                    code: "last_owner",
                    message: "a project keeps at least one owner; make someone else owner first".into(),
                });
            }
            stays_for_billing(tx, &path.id, &path.user_id)?;
            tx.execute(
                "DELETE FROM project_members WHERE project_id = ?1 AND user_id = ?2",
                params![path.id, path.user_id],
            )?;
            let completed = crate::reviews::calibration::stop_waiting_for(tx, &path.id, &path.user_id)?;
            let mut changes = json!({"role": {"from": before.as_str(), "to": null}});
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "project_member.remove",
                    resource_type: "project_member",
                    resource_id: &path.user_id,
                    project_id: Some(&path.id),
                    summary: format!(
                        "removed `{}` ({}){}",
                        path.user_id,
                        before.as_str(),
                        calibrations_completed(&completed, &mut changes)
                    ),
                    changes: changes.into(),
                },
            )?;
            Ok(types::Deleted { id: path.user_id, deleted: true })
        })
        .await
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use crate::pagination::PageRequest;
    use crate::store::{Store, StoreError};

    /// SQLite's virtual machine steps to read a page of 10 members of a
    /// project of `members` members, each added a second after the one
    /// before, from the first or after the cursor of the member `after`
    /// (counted from the first added): the page's users, as read, and the
    /// steps.
    fn steps_for_a_page(members: usize, after: Option<usize>) -> (Vec<String>, i32) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                tx.execute_batch("INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);")?;
                for i in 0..members {
                    let user = format!("usr_{i:032}");
                    tx.execute(
                        "INSERT INTO users (id, email, name, created_at) VALUES (?1, ?2, 'u', 't')",
                        params![user, format!("{i}@example.com")],
                    )?;
                    let added = chrono::DateTime::from_timestamp(1_800_000_000 + i as i64, 0).unwrap();
                    tx.execute(
                        "INSERT INTO project_members (project_id, user_id, role, added_at) VALUES ('prj_1', ?1, 'viewer', ?2)",
                        params![user, crate::ids::format_time(&added)],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        // The cursor as the list issues it.
        let cursor = after.map(|i| {
            let added = chrono::DateTime::from_timestamp(1_800_000_000 + i as i64, 0).unwrap();
            let cursor = PageRequest::timed_cursor(&added, &format!("usr_{i:032}"));
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, cursor)
        });
        let (page, after) = PageRequest::parse_timed(Some(10), cursor.as_deref(), "usr").unwrap();
        let (after_added, after_user) = after.unzip();
        store
            .read_blocking::<_, StoreError, _>(move |tx| {
                let mut read = tx.prepare(super::MEMBERS_SQL.of(&page))?;
                let users: Vec<String> = read
                    .query_map(params!["prj_1", after_added, after_user, page.fetch_limit()], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok((users, read.get_status(rusqlite::StatementStatus::VmStep)))
            })
            .unwrap()
    }

    /// A page of a project's members costs about its size, wherever it is
    /// and however many members the project has: every member was sorted
    /// for each page.
    #[test]
    fn a_page_of_members_costs_its_page() {
        for after in [None, Some(50)] {
            let (small_users, small) = steps_for_a_page(100, after);
            let (large_users, large) = steps_for_a_page(1000, after);
            // Newest first (added last first), from the cursor on.
            let first = after.unwrap_or(100);
            let expected: Vec<String> = (first - 11..first).rev().map(|i| format!("usr_{i:032}")).collect();
            assert_eq!(small_users, expected);
            if after.is_some() {
                assert_eq!(large_users, expected);
            }
            assert!(f64::from(large) < 1.2 * f64::from(small), "{small} steps in 100 members, {large} in 1,000");
        }
    }

    /// A page of members, first or after a cursor, is read in order from
    /// `project_members_by_added`: nothing sorted. (`pagination::tests`
    /// pins where a page after a cursor starts it.)
    #[test]
    fn a_page_of_members_sorts_nothing() {
        crate::pagination::tests::on_schema(|tx| {
            for after in [false, true] {
                let steps = crate::pagination::tests::plan(tx, super::MEMBERS_SQL.of_cursor(after))?;
                assert!(
                    steps.iter().any(|s| s.starts_with("SEARCH m USING INDEX project_members_by_added")),
                    "{steps:#?}"
                );
                assert!(!steps.iter().any(|s| s.contains("TEMP B-TREE") || s.contains("SCAN")), "{steps:#?}");
            }
            Ok(())
        });
    }
}
