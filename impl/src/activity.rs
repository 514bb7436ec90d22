//! The activity log: one record per successful mutation, written in the
//! same transaction as the change, so a change and its record exist together
//! or not at all.

use rusqlite::params;

use crate::auth::Actor;
use crate::ids;
use crate::store::StoreError;

pub struct Record<'a> {
    pub action: &'a str,
    pub resource_type: &'a str,
    pub resource_id: &'a str,
    pub project_id: Option<&'a str>,
    pub summary: String,
    /// The fields that changed. Never a secret: mask before passing.
    pub changes: Changes,
}

/// A record's changes, already written as JSON: a write that has them
/// before its transaction writes them there, on the request's thread, and
/// leaves the single writer thread only the insert.
#[derive(Clone)]
pub struct Changes(String);

impl Changes {
    /// `value` written as JSON (an object: the fields that changed).
    pub fn of<T: serde::Serialize>(value: &T) -> serde_json::Result<Changes> {
        serde_json::to_string(value).map(Changes)
    }
}

impl From<serde_json::Value> for Changes {
    fn from(value: serde_json::Value) -> Changes {
        // A `Value` always serializes (its keys are strings).
        Changes(serde_json::to_string(&value).expect("a JSON value serializes"))
    }
}

pub fn record(tx: &rusqlite::Transaction<'_>, actor: &Actor, r: Record<'_>) -> Result<(), StoreError> {
    record_about(tx, actor, None, r)
}

/// [`record`], about the user `subject` (outside any project, when it is not
/// the actor: an administrator's grant of their credits), who reads it as
/// they read their own records.
pub fn record_about(
    tx: &rusqlite::Transaction<'_>,
    actor: &Actor,
    subject: Option<&str>,
    r: Record<'_>,
) -> Result<(), StoreError> {
    // Every mutation runs this: prepared once per connection.
    tx.prepare_cached(
        "INSERT INTO activity (id, actor_user_id, credential, api_key_id, action, resource_type, resource_id,
                               project_id, summary, changes, created_at, subject_user_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        ids::new_id("act"),
        actor.user_id(),
        actor.credential_kind(),
        actor.api_key_id(),
        r.action,
        r.resource_type,
        r.resource_id,
        r.project_id,
        r.summary,
        r.changes.0,
        ids::format_time(&ids::now()),
        subject,
    ])?;
    Ok(())
}

// Reading the log. A record is visible to its actor, to the user it is
// about (`subject_user_id`: as its actor), and to the members of its
// project (of a deleted project, to its members when it was deleted); to
// anyone else it does not exist.

use rusqlite::OptionalExtension as _;
use sparring_server::{params as p, types, Caller};

use crate::failure::{Failure, Result};
use crate::pagination::{PageRequest, PageRows, PageSql, AFTER};
use crate::store::Store;

const COLUMNS: &str = "a.id, a.actor_user_id, a.credential, a.api_key_id, a.action, a.resource_type, a.resource_id, \
                       a.project_id, a.summary, a.changes, a.created_at";

/// Who may see a record: `?1` is the caller's user id. Its actor, the user
/// it is about, and the members of its project, but for what would give away, to a member
/// labelling blind, what the calibration hides (`reviews::blind`).
static VISIBLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "((a.actor_user_id = ?1 OR a.subject_user_id = ?1 OR a.project_id IN (SELECT project_id FROM project_members WHERE user_id = ?1)
            OR a.project_id IN (SELECT project_id FROM former_members WHERE user_id = ?1))
          AND NOT {})",
        *crate::reviews::blind::HIDDEN_ACTIVITY
    )
});

/// The projects whose records the caller reads as a member (`?1`), now or
/// when it was deleted; only `?2` when given.
const READABLE_PROJECTS: &str =
    "SELECT project_id FROM project_members WHERE user_id = ?1 AND (?2 IS NULL OR project_id = ?2)
     UNION SELECT project_id FROM former_members WHERE user_id = ?1 AND (?2 IS NULL OR project_id = ?2)";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Activity> {
    let credential: String = row.get(2)?;
    let changes: String = row.get(9)?;
    let created: String = row.get(10)?;
    Ok(types::Activity {
        id: row.get(0)?,
        actor: types::ActivityActor {
            user_id: row.get(1)?,
            credential: match credential.as_str() {
                "api_key" => types::CredentialKind::ApiKey,
                "id_token" => types::CredentialKind::IdToken,
                _ => types::CredentialKind::System,
            },
            api_key_id: row.get(3)?,
        },
        action: row.get(4)?,
        resource_type: row.get(5)?,
        resource_id: row.get(6)?,
        project_id: row.get(7)?,
        summary: row.get(8)?,
        changes: serde_json::from_str(&changes).unwrap_or_default(),
        created_at: ids::parse_time(&created).unwrap_or_default(),
    })
}

/// A record from a row of [`COLUMNS`], and about how many bytes it takes.
fn sized_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(types::Activity, usize)> {
    let text = |i: usize| match row.get_ref(i) {
        Ok(rusqlite::types::ValueRef::Text(t)) => t.len(),
        _ => 0,
    };
    let size = text(8) + text(9);
    Ok((from_row(row)?, size))
}

/// A page of records, from the records read: their `changes` are up to a
/// request body each, so the page ends early after the record that takes
/// it past `pagination::PAGE_BYTES` when another follows.
fn page_of(page: &PageRequest, read: PageRows<(types::Activity, usize)>) -> types::ActivityList {
    let page = page.finish_sized(read.rows, |(_, size)| *size, |(a, _)| a.id.clone());
    types::ActivityList { activity: page.items.into_iter().map(|(a, _)| a).collect(), next_cursor: page.next_cursor }
}

fn page_request(query_limit: Option<i32>, cursor: Option<&str>) -> Result<PageRequest> {
    PageRequest::parse(query_limit, cursor, "act").map_err(|e| Failure::invalid("cursor", e))
}

/// Where a visible record comes from: the caller made it, it is about
/// them, or it is in a project the caller is a member of.
#[derive(Clone, Copy)]
enum Source {
    /// `?1`'s own records (`activity_by_actor`), in the project `?2` if it
    /// is not NULL.
    Actor,
    /// The records of the project `?2` (`activity_by_project`).
    Project,
    /// The records about `?1` (`activity_by_subject`), in the project `?2`
    /// if it is not NULL.
    Subject,
}

/// The SQL of one source's share of a page of `GET /activity`: the ids of
/// its records visible to `?1` that pass the filters (`?3` resource type,
/// `?4` action, `?5` since, `?6` until, all NULL when not given), newest
/// first, after the cursor `?7` when there is one, at most `?8`. Its index
/// gives them in order: no sort, and the walk stops at the limit. A page
/// after a cursor starts that index at it (see [`PageSql`]), so a page deep
/// in the log does not walk the records before it.
fn source_sql(source: Source) -> PageSql {
    let source = match source {
        Source::Actor => "a.actor_user_id = ?1 AND (?2 IS NULL OR a.project_id = ?2)",
        Source::Project => "a.project_id = ?2",
        Source::Subject => "a.subject_user_id = ?1 AND (?2 IS NULL OR a.project_id = ?2)",
    };
    PageSql::new(
        &format!(
            "SELECT a.id FROM activity a WHERE {source} AND NOT {hidden}
               AND (?3 IS NULL OR a.resource_type = ?3) AND (?4 IS NULL OR a.action = ?4)
               AND (?5 IS NULL OR a.created_at >= ?5) AND (?6 IS NULL OR a.created_at < ?6) {AFTER}
             ORDER BY a.id DESC LIMIT ?8",
            hidden = *crate::reviews::blind::HIDDEN_ACTIVITY,
        ),
        "AND a.id < ?7",
    )
}

/// [`source_sql`] for each source.
static SOURCE_SQL: std::sync::LazyLock<[PageSql; 3]> =
    std::sync::LazyLock::new(|| [Source::Actor, Source::Project, Source::Subject].map(source_sql));

/// `GET /activity`: newest first, filtered by project, resource type,
/// action and time.
///
/// A page is merged from one walk per source (the caller's own records, those
/// about them, and each project they are a member of; only the project when
/// one is asked for and they are in it), each stopped at the page's size once that many
/// records pass the filters: with no filter, or a filter most records pass,
/// a page reads about its size per source, however long the log. (One
/// statement with `actor OR project IN (…)` read every record the caller
/// may see, and sorted them all, for every page; see BENCHMARKS.md.) A
/// filter few records pass walks each source to its end, and the caller's
/// own records in their projects twice, once per source.
pub async fn list(store: &Store, caller: Caller, query: p::ListActivityQuery) -> Result<types::ActivityList> {
    let page = page_request(query.limit, query.cursor.as_deref())?;
    if let (Some(since), Some(until)) = (&query.since, &query.until) {
        if since > until {
            return Err(Failure::invalid("since", "must not be after `until`"));
        }
    }
    let since = query.since.as_ref().map(ids::format_time);
    let until = query.until.as_ref().map(ids::format_time);
    store
        .read(move |tx| {
            // The projects whose records the caller sees as a member: all of
            // theirs, or the one asked for if they are in it.
            let projects = tx
                .prepare_cached(READABLE_PROJECTS)?
                .query_map(params![caller.user_id, query.project_id], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let limit = page.fetch_limit();
            let sql = &*SOURCE_SQL;
            let mut ids = Vec::new();
            // A project asked for whose member the caller is holds their own
            // records there too: it is the only source then.
            let own = (query.project_id.is_none() || projects.is_empty()).then_some(query.project_id.as_deref());
            let sources = own
                .into_iter()
                .flat_map(|project| [(Source::Actor, project), (Source::Subject, project)])
                .chain(projects.iter().map(|p| (Source::Project, Some(p.as_str()))));
            for (source, project) in sources {
                let mut statement = tx.prepare_cached(sql[source as usize].of(&page))?;
                let found = statement.query_map(
                    params![
                        caller.user_id,
                        project,
                        query.resource_type,
                        query.action,
                        since,
                        until,
                        page.after,
                        limit
                    ],
                    |r| r.get::<_, String>(0),
                )?;
                for id in found {
                    ids.push(id?);
                }
            }
            // Newest first; a record of the caller's in one of their
            // projects came from both sources.
            ids.sort_unstable_by(|a, b| b.cmp(a));
            ids.dedup();
            ids.truncate(page.limit + 1);
            let mut by_id = tx.prepare_cached(&format!("SELECT {COLUMNS} FROM activity a WHERE a.id = ?1"))?;
            let mut read = PageRows::default();
            for id in &ids {
                let (record, size) = by_id.query_row([id], sized_row)?;
                if !read.read((record, size), size) {
                    break;
                }
            }
            Ok(page_of(&page, read))
        })
        .await
}

pub async fn get(store: &Store, caller: Caller, path: p::GetActivityPath) -> Result<types::Activity> {
    store
        .read(move |tx| {
            tx.prepare_cached(&format!("SELECT {COLUMNS} FROM activity a WHERE a.id = ?2 AND {}", *VISIBLE))?
                .query_row(params![caller.user_id, path.id], from_row)
                .optional()?
                .ok_or_else(|| Failure::not_found("activity record", &path.id))
        })
        .await
}

/// The SQL of a page of one resource's history, oldest or newest first
/// (see [`PageSql`]): a page after a cursor starts `activity_by_resource`
/// at it.
fn resource_sql(ascending: bool) -> PageSql {
    let (order, cmp) = if ascending { ("ASC", ">") } else { ("DESC", "<") };
    PageSql::new(
        &format!(
            "SELECT {COLUMNS} FROM activity a WHERE {}
               AND a.resource_type = ?2 AND a.resource_id = ?3 {AFTER}
             ORDER BY a.id {order} LIMIT ?5",
            *VISIBLE
        ),
        &format!("AND a.id {cmp} ?4"),
    )
}

/// [`resource_sql`], built once: newest first, then oldest first.
static RESOURCE_SQL: std::sync::LazyLock<[PageSql; 2]> = std::sync::LazyLock::new(|| [false, true].map(resource_sql));

/// The history of one resource, oldest or newest first.
pub async fn list_for_resource(
    store: &Store,
    caller: Caller,
    path: p::ListResourceActivityPath,
    query: p::ListResourceActivityQuery,
) -> Result<types::ActivityList> {
    let page = page_request(query.limit, query.cursor.as_deref())?;
    let ascending = matches!(query.order, Some(types::SortOrder::Asc));
    store
        .read(move |tx| {
            let sql = RESOURCE_SQL[usize::from(ascending)].of(&page);
            let mut statement = tx.prepare_cached(sql)?;
            let mut rows = statement.query(params![
                caller.user_id,
                path.resource_type,
                path.resource_id,
                page.after,
                page.fetch_limit()
            ])?;
            let mut read = PageRows::default();
            while let Some(row) = rows.next()? {
                let (record, size) = sized_row(row)?;
                if !read.read((record, size), size) {
                    break;
                }
            }
            Ok(page_of(&page, read))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagination::tests::{on_schema, plan};

    /// Each source of a page of `GET /activity` is read in order from its
    /// index, the cursor as a range on it: no sort, and no walk of the
    /// records before the cursor or after the limit (see `source_sql`). A
    /// condition that stopped the index from serving the order would show
    /// here as a sort.
    #[test]
    fn each_source_of_a_page_is_read_in_index_order() {
        on_schema(|tx| {
            for (source, index, column) in [
                (Source::Actor, "activity_by_actor", "actor_user_id"),
                (Source::Project, "activity_by_project", "project_id"),
                (Source::Subject, "activity_by_subject", "subject_user_id"),
            ] {
                for (after, range) in [(false, ""), (true, " AND id<?")] {
                    let sql = source_sql(source).of_cursor(after).to_string();
                    let plan = plan(tx, &sql)?;
                    assert_eq!(plan[0], format!("SEARCH a USING INDEX {index} ({column}=?{range})"), "{sql}");
                    assert!(plan.iter().all(|step| !step.contains("TEMP B-TREE")), "{plan:#?}");
                }
            }
            Ok(())
        });
    }

    /// A page of one resource's history is read in order from
    /// `activity_by_resource`, from its cursor on when it has one.
    #[test]
    fn a_resource_history_is_read_from_its_cursor_in_index_order() {
        on_schema(|tx| {
            for ascending in [false, true] {
                for after in [false, true] {
                    let sql = resource_sql(ascending).of_cursor(after).to_string();
                    let plan = plan(tx, &sql)?;
                    let range = match (after, ascending) {
                        (false, _) => "",
                        (true, true) => " AND id>?",
                        (true, false) => " AND id<?",
                    };
                    let search =
                        format!("SEARCH a USING INDEX activity_by_resource (resource_type=? AND resource_id=?{range})");
                    assert_eq!(plan[0], search, "{sql}");
                    assert!(plan.iter().all(|step| !step.contains("TEMP B-TREE")), "{plan:#?}");
                }
            }
            Ok(())
        });
    }
}
