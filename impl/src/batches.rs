//! Batches: suites of tests run together, at most `concurrency` calls at
//! once.
//!
//! `test_ids` are tests of the batch's project (a 400 naming `test_ids[i]`
//! otherwise), none twice, at most [`MAX_TESTS`], kept in order in
//! `batch_tests`. `PUT` replaces the whole editable part (absent optional
//! fields reset to their defaults). `last_run` summarizes the newest batch
//! run of the batch (null before the first).
//!
//! Viewers and reviewers read; editors and owners create, replace and
//! delete.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, Caller};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::{ids, validate, AppState};

pub const MAX_TESTS: usize = 1000;
pub const MAX_CONCURRENCY: u32 = 1000;

/// The editable part of a batch, checked.
#[derive(Clone)]
struct BatchInput {
    name: String,
    description: String,
    test_ids: Vec<String>,
    /// `None`: the project's `default_concurrency`, looked up in the
    /// transaction by [`BatchInput::resolve`].
    concurrency: Option<u32>,
}

impl BatchInput {
    fn parse(
        name: &str,
        description: Option<&str>,
        test_ids: &[String],
        concurrency: Option<u32>,
    ) -> Result<BatchInput> {
        let name = validate::name("name", name)?;
        let description = validate::text("description", description.unwrap_or(""), validate::MAX_DESCRIPTION)?;
        if test_ids.len() > MAX_TESTS {
            return Err(Failure::invalid(
                "test_ids",
                format_args!("at most {MAX_TESTS} tests, got {}", test_ids.len()),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, id) in test_ids.iter().enumerate() {
            if !seen.insert(id.as_str()) {
                return Err(Failure::invalid(&format!("test_ids[{i}]"), format_args!("`{id}` is listed twice")));
            }
        }
        let concurrency = concurrency.map(|c| validate::range("concurrency", c, 1, MAX_CONCURRENCY)).transpose()?;
        Ok(BatchInput { name, description, test_ids: test_ids.to_vec(), concurrency })
    }

    /// In the transaction: every test must be of `project_id`, and an absent
    /// `concurrency` becomes the project's default.
    fn resolve(&mut self, tx: &rusqlite::Transaction<'_>, project_id: &str) -> Result<u32> {
        for (i, id) in self.test_ids.iter().enumerate() {
            access::require_reference(tx, "tests", &format!("test_ids[{i}]"), id, project_id)?;
        }
        let concurrency = match self.concurrency {
            Some(c) => c,
            None => {
                tx.query_row("SELECT default_concurrency FROM projects WHERE id = ?1", params![project_id], |r| {
                    r.get(0)
                })?
            }
        };
        self.concurrency = Some(concurrency);
        Ok(concurrency)
    }

    /// The batch as the activity log shows it (every editable field).
    fn shown(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert("description".into(), json!(self.description));
        m.insert("test_ids".into(), json!(self.test_ids));
        m.insert("concurrency".into(), json!(self.concurrency));
        m
    }
}

fn write_tests(tx: &rusqlite::Transaction<'_>, batch_id: &str, test_ids: &[String]) -> Result<()> {
    tx.execute("DELETE FROM batch_tests WHERE batch_id = ?1", params![batch_id])?;
    let mut insert = tx.prepare_cached("INSERT INTO batch_tests (batch_id, position, test_id) VALUES (?1, ?2, ?3)")?;
    for (position, id) in test_ids.iter().enumerate() {
        insert.execute(params![batch_id, position as i64, id])?;
    }
    Ok(())
}

// Reading.

const COLUMNS: &str = "b.id, b.project_id, b.name, b.description, b.concurrency, b.created_at, b.updated_at";

/// A batch without its tests (see [`with_tests`]).
fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Batch> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let concurrency: u32 = row.get(4)?;
    Ok(types::Batch {
        id: row.get(0)?,
        project_id: row.get(1)?,
        name: row.get(2)?,
        description: row.get(3)?,
        test_ids: Vec::new(),
        concurrency: std::num::NonZeroU32::new(concurrency).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(4, rusqlite::types::Type::Integer, "zero concurrency".into())
        })?,
        // Filled in by `with_tests`.
        last_run: None,
        created_at: time(5)?,
        updated_at: time(6)?,
    })
}

/// `batch` with its tests and its last run as `user_id` may see it.
fn with_tests(tx: &rusqlite::Connection, user_id: &str, mut batch: types::Batch) -> Result<types::Batch> {
    batch.test_ids = tx
        .prepare_cached("SELECT test_id FROM batch_tests WHERE batch_id = ?1 ORDER BY position")?
        .query_map(params![batch.id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    batch.last_run = crate::runs::last_run_of_batch(tx, user_id, &batch.id)?;
    Ok(batch)
}

/// Batch `id` as `user_id` may see it.
pub(crate) fn load(tx: &rusqlite::Connection, user_id: &str, id: &str) -> Result<types::Batch> {
    let batch = tx
        .prepare_cached(&format!("SELECT {COLUMNS} FROM batches b WHERE b.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("batch", id))?;
    with_tests(tx, user_id, batch)
}

/// The ids of a page of one project's batches (`?1`), newest first, after
/// the cursor `?2`, at most `?3` (see [`PageSql`]): in order from
/// `batches_by_project`, no sort, and the walk stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!("SELECT b.id FROM batches b WHERE b.project_id = ?1 {AFTER} ORDER BY b.id DESC LIMIT ?3"),
        "AND b.id < ?2",
    )
});

pub async fn list(state: &AppState, caller: Caller, query: p::ListBatchesQuery) -> Result<types::BatchList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "bat").map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![page.after, page.fetch_limit()],
            )?;
            let page = page.finish(ids, String::clone);
            let batches = page.items.iter().map(|id| load(tx, &caller.user_id, id)).collect::<Result<Vec<_>>>()?;
            Ok(types::BatchList { batches, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreateBatchRequest) -> Result<types::Batch> {
    let input = BatchInput::parse(
        &body.name,
        body.description.as_deref().map(String::as_str),
        &body.test_ids,
        body.concurrency.map(std::num::NonZeroU32::get),
    )?;
    let id = ids::new_id("bat");
    let project_id = body.project_id;
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &project_id, Need::Edit)?;
            let user_id = caller.user_id.clone();
            let mut input = input.clone();
            let concurrency = input.resolve(tx, &project_id)?;
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO batches (id, project_id, name, description, concurrency, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                params![id, project_id, input.name, input.description, concurrency, now],
            )?;
            write_tests(tx, &id, &input.test_ids)?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "batch.create",
                    resource_type: "batch",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary: format!("created batch \"{}\" of {} tests", input.name, input.test_ids.len()),
                    changes: Value::Object(input.shown()).into(),
                },
            )?;
            load(tx, &user_id, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetBatchPath) -> Result<types::Batch> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "batches", "batch", &path.id, Need::Read)?;
            load(tx, &caller.user_id, &path.id)
        })
        .await
}

/// `PUT`: replaces the editable part (absent optional fields reset to their
/// defaults). Runs already started keep what they were started with. A
/// body that is the batch as it is writes nothing.
pub async fn replace(
    state: &AppState,
    caller: Caller,
    path: p::ReplaceBatchPath,
    body: types::ReplaceBatchRequest,
) -> Result<types::Batch> {
    let input = BatchInput::parse(
        &body.name,
        body.description.as_deref().map(String::as_str),
        &body.test_ids,
        body.concurrency.map(std::num::NonZeroU32::get),
    )?;
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "batches", "batch", &path.id, Need::Edit)?;
            let mut input = input.clone();
            let concurrency = input.resolve(tx, &project_id)?;
            let user_id = caller.user_id.clone();
            let before = load(tx, &user_id, &path.id)?;
            // What changed: the fields whose value differs from before.
            let before_shown = match serde_json::to_value(&before) {
                Ok(Value::Object(m)) => m,
                _ => Map::new(),
            };
            let changes: Map<String, Value> =
                input.shown().into_iter().filter(|(k, v)| before_shown.get(k) != Some(v)).collect();
            // The batch it already is: nothing written, nothing recorded.
            if changes.is_empty() {
                return Ok(before);
            }
            tx.execute(
                "UPDATE batches SET name = ?2, description = ?3, concurrency = ?4, updated_at = ?5 WHERE id = ?1",
                params![path.id, input.name, input.description, concurrency, ids::format_time(&ids::now())],
            )?;
            write_tests(tx, &path.id, &input.test_ids)?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "batch.update",
                    resource_type: "batch",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("replaced batch \"{}\" ({} tests)", input.name, input.test_ids.len()),
                    changes: Value::Object(changes).into(),
                },
            )?;
            load(tx, &user_id, &path.id)
        })
        .await
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteBatchPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "batches", "batch", &path.id, Need::Edit)?;
            // A batch with an active (queued or running) run stays; finished
            // runs keep their record without the batch.
            let active: i64 = tx.query_row(
                "SELECT count(*) FROM batch_runs WHERE batch_id = ?1 AND status IN ('queued', 'running')",
                params![path.id],
                |r| r.get(0),
            )?;
            if active > 0 {
                return Err(Failure::runs_active(
                    format_args!("batch `{}` has {active} batch runs", path.id),
                    "cancel them",
                ));
            }
            let name: String =
                tx.query_row("SELECT name FROM batches WHERE id = ?1", params![path.id], |r| r.get(0))?;
            // Its list of tests goes with it (ON DELETE CASCADE); the tests stay.
            tx.execute("DELETE FROM batches WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "batch.delete",
                    resource_type: "batch",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted batch \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

#[cfg(test)]
mod unit {
    use super::*;

    fn invalid(r: Result<BatchInput>) -> String {
        match r {
            Err(Failure::Invalid { code, message }) => format!("{code}: {message}"),
            Err(other) => panic!("expected invalid, got {other:?}"),
            Ok(_) => panic!("expected invalid, got a batch"),
        }
    }

    #[test]
    fn tests_and_concurrency_are_bounded() {
        let ids = |n: usize| (0..n).map(|i| format!("tst_{i}")).collect::<Vec<_>>();
        let ok = BatchInput::parse("nightly", None, &ids(3), Some(10)).unwrap();
        assert_eq!(ok.test_ids, ids(3));
        assert_eq!(ok.description, "");
        assert!(BatchInput::parse("nightly", None, &ids(MAX_TESTS), Some(1)).is_ok());
        assert!(
            invalid(BatchInput::parse("n", None, &ids(MAX_TESTS + 1), None)).starts_with("invalid_test_ids: test_ids:")
        );
        let twice = vec!["tst_a".to_string(), "tst_b".to_string(), "tst_a".to_string()];
        assert!(invalid(BatchInput::parse("n", None, &twice, None)).starts_with("invalid_test_ids: test_ids[2]:"));
        assert!(BatchInput::parse("n", None, &[], Some(MAX_CONCURRENCY)).is_ok());
        assert!(
            invalid(BatchInput::parse("n", None, &[], Some(MAX_CONCURRENCY + 1))).starts_with("invalid_concurrency:")
        );
        assert!(invalid(BatchInput::parse(" ", None, &[], None)).starts_with("invalid_name: name:"));
    }
}
