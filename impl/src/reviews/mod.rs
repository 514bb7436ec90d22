//! Human review (DESIGN §6): people label test results, one review per
//! person per result (a second one replaces the first, keeping its id).
//!
//! Reviewers, editors and owners of the result's project write reviews;
//! viewers read them; anyone else gets 404. Only its author deletes a
//! review. A review that counts toward a complete calibration is final (409
//! `review_locked`): the calibration's metrics must not move after it
//! closed.
//!
//! When an assigned reviewer reviews a result of an open calibration, the
//! review carries that calibration's id and counts toward it; the last label
//! it needs completes it. A review given before the calibration existed
//! counts only once it is given again (its author may not have been blind).
//! An assigned reviewer who leaves the project or becomes a viewer can give
//! no more labels and is no longer waited for: the labels of the others
//! complete it, or that membership change does if they are all in.
//!
//! `calibration.rs` holds the calibrations and their metrics, `blind.rs`
//! what an assigned reviewer may not see, `metrics.rs` the pure math, and
//! `reviewers.rs` the statistics per reviewer.

pub mod blind;
pub mod calibration;
pub mod metrics;
pub mod reviewers;

use std::collections::BTreeSet;
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde_json::json;
use sparring_server::{params as p, types, Caller};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::runs::{conversion, time};
use crate::{ids, validate, AppState};

pub const MAX_NOTES: usize = 10_000;
/// As many labels as a result can have evaluations: its scenario's
/// evaluators and its test's.
pub const MAX_LABELS: usize = crate::scenarios::MAX_SCENARIO_EVALUATORS + crate::evaluators::MAX_EVALUATORS;
/// The most of a label's name a message quotes: a name is bounded only by
/// the body, and the longest an evaluator has ("step N: " and a name of at
/// most 100 characters) is still quoted whole.
const QUOTED_NAME: usize = 120;

/// A label's name as a message quotes it: at most [`QUOTED_NAME`]
/// characters, marked when cut.
fn quoted(name: &str) -> String {
    crate::engine::llm::clip(name, QUOTED_NAME)
}

/// What the automated evaluation said of a result: its overall verdict
/// (`status == passed`; an `error` is no pass) and each evaluation's.
/// Calibration metrics and reviewer statistics compare labels with these,
/// for hundreds of results a request, and a review's labels are checked
/// against their names in the writer: they are read from `result_verdicts`
/// ([`AutomatedVerdicts::kept`]), kept beside each result when it is stored
/// ([`keep_verdicts`]), never from its document (the whole conversation),
/// but by migration 0021's step, which runs before there is that table.
pub(crate) struct AutomatedVerdicts {
    pub passed: bool,
    pub evaluations: Vec<EvaluatorVerdict>,
}

/// One evaluation's verdict, as a document and `result_verdicts` hold it.
#[derive(serde::Deserialize)]
pub(crate) struct EvaluatorVerdict {
    pub name: String,
    pub passed: bool,
}

/// The automated labels of the result `?1`, kept beside it.
pub(crate) const VERDICTS_SQL: &str = "SELECT passed, evaluations FROM result_verdicts WHERE test_result_id = ?1";

impl AutomatedVerdicts {
    /// From a stored `TestResult` document, without building the rest of
    /// it: the transcript, most of a document's bytes, is skipped, not kept.
    pub fn of(document: &str) -> Result<AutomatedVerdicts> {
        #[derive(serde::Deserialize)]
        struct Document {
            status: Option<types::TestResultStatus>,
            evaluations: Vec<EvaluatorVerdict>,
        }
        let d: Document = serde_json::from_str(document).map_err(|e| Failure::Store(conversion(0, e).into()))?;
        Ok(AutomatedVerdicts { passed: d.status == Some(types::TestResultStatus::Passed), evaluations: d.evaluations })
    }

    /// As `result_verdicts` keeps them for the result `result_id` (one
    /// primary-key read, [`VERDICTS_SQL`]); `None` when it keeps none (the
    /// result is gone, or its document was not JSON when migration 0022 ran).
    pub fn kept(tx: &rusqlite::Connection, result_id: &str) -> Result<Option<AutomatedVerdicts>> {
        let kept: Option<(bool, String)> = tx
            .prepare_cached(VERDICTS_SQL)?
            .query_row(params![result_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((passed, evaluations)) = kept else { return Ok(None) };
        let evaluations = serde_json::from_str(&evaluations).map_err(|e| Failure::Store(conversion(1, e).into()))?;
        Ok(Some(AutomatedVerdicts { passed, evaluations }))
    }
}

/// Keeps the automated verdicts of `result` beside it (`result_verdicts`:
/// its overall verdict, and each evaluation's name and `passed`), in the
/// transaction that stores it: what calibration metrics and reviewer
/// statistics compare labels with, without reading the result's document.
pub(crate) fn keep_verdicts(tx: &rusqlite::Transaction<'_>, result: &types::TestResult) -> rusqlite::Result<()> {
    let evaluations: Vec<serde_json::Value> =
        result.evaluations.iter().map(|e| json!({"name": e.name, "passed": e.passed})).collect();
    tx.prepare_cached("INSERT INTO result_verdicts (test_result_id, passed, evaluations) VALUES (?1, ?2, ?3)")?
        .execute(params![
            result.id,
            result.status == Some(types::TestResultStatus::Passed),
            serde_json::Value::from(evaluations).to_string()
        ])?;
    Ok(())
}

const COLUMNS: &str = "r.id, r.project_id, r.test_result_id, r.reviewer_id, r.verdict, r.evaluations, r.notes, \
                       r.calibration_id, r.created_at, r.updated_at";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Review> {
    let verdict: String = row.get(4)?;
    let labels: String = row.get(5)?;
    Ok(types::Review {
        id: row.get(0)?,
        project_id: row.get(1)?,
        test_result_id: row.get(2)?,
        reviewer_id: row.get(3)?,
        verdict: verdict.parse().map_err(|e| conversion(4, e))?,
        evaluations: serde_json::from_str(&labels).map_err(|e| conversion(5, e))?,
        notes: row.get(6)?,
        calibration_id: row.get(7)?,
        created_at: time(row, 8)?,
        updated_at: time(row, 9)?,
    })
}

fn load(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<types::Review> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM reviews r WHERE r.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("review", id))
}

/// The labels of a review, checked: names not blank, none twice.
fn parse_labels(labels: &[types::ReviewLabel]) -> Result<Vec<types::ReviewLabel>> {
    if labels.len() > MAX_LABELS {
        return Err(Failure::invalid("evaluations", format_args!("at most {MAX_LABELS} labels, got {}", labels.len())));
    }
    let mut seen = BTreeSet::new();
    for (i, label) in labels.iter().enumerate() {
        if label.name.trim().is_empty() {
            return Err(Failure::invalid(&format!("evaluations[{i}].name"), "must not be empty"));
        }
        if !seen.insert(label.name.as_str()) {
            return Err(Failure::invalid(
                &format!("evaluations[{i}].name"),
                format_args!("`{}` is labelled twice", quoted(&label.name)),
            ));
        }
    }
    Ok(labels.to_vec())
}

/// The open calibration in which `user_id` is assigned to `result_id`, if
/// any (owners included: their labels count, they just are not blind).
fn assigned_open_calibration(tx: &rusqlite::Transaction<'_>, user_id: &str, result_id: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(
            "SELECT c.id FROM calibration_results cr
             JOIN calibrations c ON c.id = cr.calibration_id AND c.status = 'open'
             JOIN calibration_reviewers v ON v.calibration_id = c.id AND v.user_id = ?2
             WHERE cr.test_result_id = ?1 LIMIT 1",
        )?
        .query_row(params![result_id, user_id], |r| r.get(0))
        .optional()?)
}

fn locked(review_id: &str, calibration_id: &str) -> Failure {
    Failure::Conflict {
        code: "review_locked",
        message: format!(
            "review `{review_id}` counts toward calibration review `{calibration_id}`, which is complete: its labels \
             are final"
        ),
    }
}

/// `POST /reviews`: creates the caller's review of a result, or replaces it.
pub async fn create(state: &AppState, caller: Caller, body: types::CreateReviewRequest) -> Result<types::Review> {
    let labels = parse_labels(&body.evaluations)?;
    let notes = validate::text("notes", body.notes.as_deref().map(String::as_str).unwrap_or(""), MAX_NOTES)?;
    let verdict = body.verdict.to_string();
    let result_id = body.test_result_id;
    state
        .store
        .write(move |tx| {
            // The result's project and evaluators, not its document: this
            // runs in the one writer every write waits for, and the document
            // is the whole conversation.
            let project_id: String = tx
                .prepare_cached("SELECT project_id FROM test_results WHERE id = ?1")?
                .query_row(params![result_id], |r| r.get(0))
                .optional()?
                .ok_or_else(|| Failure::not_found("test result", &result_id))?;
            let role = access::role_in(tx, &caller.user_id, &project_id)?
                .ok_or_else(|| Failure::not_found("test result", &result_id))?;
            access::check(role, Need::Review)?;
            let evaluations = AutomatedVerdicts::kept(tx, &result_id)?.map(|v| v.evaluations).unwrap_or_default();
            for (i, label) in labels.iter().enumerate() {
                if !evaluations.iter().any(|e| e.name == label.name) {
                    let names: Vec<&str> = evaluations.iter().map(|e| e.name.as_str()).collect();
                    return Err(Failure::invalid(
                        &format!("evaluations[{i}].name"),
                        format_args!(
                            "`{}` is not an evaluator of this result (its evaluators: {})",
                            quoted(&label.name),
                            if names.is_empty() { "none".to_string() } else { names.join(", ") }
                        ),
                    ));
                }
            }
            let existing: Option<(String, Option<String>, Option<String>)> = tx
                .prepare_cached(
                    "SELECT r.id, r.calibration_id, c.status FROM reviews r
                     LEFT JOIN calibrations c ON c.id = r.calibration_id
                     WHERE r.test_result_id = ?1 AND r.reviewer_id = ?2",
                )?
                .query_row(params![result_id, caller.user_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            if let Some((id, Some(calibration_id), Some(status))) = &existing {
                if status == "complete" {
                    return Err(locked(id, calibration_id));
                }
            }
            let calibration_id = assigned_open_calibration(tx, &caller.user_id, &result_id)?;
            let now = ids::format_time(&ids::now());
            let labels_json = serde_json::to_string(&labels).map_err(|e| conversion(5, e))?;
            let (id, action) =
                match existing {
                    Some((id, _, _)) => {
                        tx.execute(
                            "UPDATE reviews SET verdict = ?2, evaluations = ?3, notes = ?4, calibration_id = ?5,
                                            updated_at = ?6
                         WHERE id = ?1",
                            params![id, verdict, labels_json, notes, calibration_id, now],
                        )?;
                        (id, "review.update")
                    }
                    None => {
                        let id = ids::new_id("rev");
                        tx.execute(
                        "INSERT INTO reviews (id, project_id, test_result_id, reviewer_id, verdict, evaluations, notes,
                                              calibration_id, created_at, updated_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)",
                        params![id, project_id, result_id, caller.user_id, verdict, labels_json, notes,
                                calibration_id, now],
                    )?;
                        (id, "review.create")
                    }
                };
            let completed = match &calibration_id {
                Some(c) => calibration::complete_if_done(tx, c)?,
                None => false,
            };
            let mut summary = format!("reviewed test result {result_id}: {verdict}");
            if let (true, Some(c)) = (completed, &calibration_id) {
                summary.push_str(&format!(", the last label calibration review {c} needed"));
            }
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action,
                    resource_type: "review",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary,
                    changes: json!({
                        "test_result_id": result_id,
                        "verdict": verdict,
                        "evaluations": labels,
                        "notes": notes,
                        "calibration_id": calibration_id,
                        "calibration_completed": completed,
                    })
                    .into(),
                },
            )?;
            load(tx, &id)
        })
        .await
}

/// `DELETE /reviews/{id}`: the caller's own review.
pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteReviewPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            type Found = (String, String, String, Option<String>, Option<String>);
            let found: Option<Found> = tx
                .prepare_cached(
                    "SELECT r.project_id, r.reviewer_id, r.test_result_id, r.calibration_id, c.status FROM reviews r
                     LEFT JOIN calibrations c ON c.id = r.calibration_id WHERE r.id = ?1",
                )?
                .query_row(params![path.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
                .optional()?;
            let Some((project_id, reviewer_id, result_id, calibration_id, status)) = found else {
                return Err(Failure::not_found("review", &path.id));
            };
            let role = access::role_in(tx, &caller.user_id, &project_id)?
                .ok_or_else(|| Failure::not_found("review", &path.id))?;
            if reviewer_id != caller.user_id {
                // Someone else's review of a result the caller labels blind
                // is not theirs to know about.
                if blind::blinding_calibration(tx, &caller.user_id, &result_id)?.is_some() {
                    return Err(Failure::not_found("review", &path.id));
                }
                return Err(Failure::Forbidden("only its author may delete a review".into()));
            }
            access::check(role, Need::Review)?;
            if let (Some(calibration_id), Some("complete")) = (&calibration_id, status.as_deref()) {
                return Err(locked(&path.id, calibration_id));
            }
            tx.execute("DELETE FROM reviews WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "review.delete",
                    resource_type: "review",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted their review of test result {result_id}"),
                    changes: json!({"deleted": true, "test_result_id": result_id}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

/// The ids of a page of one project's reviews (`?1`) that the caller
/// (`?2`) may see, newest first, of the test result `?3`, by the reviewer
/// `?4`, in the calibration `?5`, with the verdict `?6` (each all when
/// NULL), after the cursor `?7`, at most `?8` (see [`PageSql`]), read from
/// the index of the filter named `by` (see [`page_sql`]), or, without one,
/// in order from `reviews_by_project`: no sort, and the walk stops at the
/// limit.
fn list_sql(by: Option<&str>) -> PageSql {
    let filter = |column: &str, param: &str| {
        if by == Some(column) {
            format!("r.{column} = {param}")
        } else {
            format!("({param} IS NULL OR r.{column} = {param})")
        }
    };
    // A result's few reviews are found by its key, the project (`+`: no
    // index's) only checking them; a reviewer's and a calibration's
    // indexes hold the project after them, so that the walk of a project
    // where they have no review reads none of theirs elsewhere.
    let project = if by == Some("test_result_id") { "+r.project_id = ?1" } else { "r.project_id = ?1" };
    PageSql::new(
        &format!(
            "SELECT r.id FROM reviews r
             WHERE {project} AND {} AND {} AND {} AND (?6 IS NULL OR r.verdict = ?6) {AFTER}
               AND (r.reviewer_id = ?2 OR r.test_result_id NOT IN ({}))
             ORDER BY r.id DESC LIMIT ?8",
            filter("test_result_id", "?3"),
            filter("reviewer_id", "?4"),
            filter("calibration_id", "?5"),
            blind::blind_results("?2")
        ),
        "AND r.id < ?7",
    )
}

/// A page of reviews without a filter that finds them.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(None));
/// …of one result: its few reviews (one per reviewer) by the
/// `(test_result_id, reviewer_id)` key, sorted.
static BY_RESULT_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(Some("test_result_id")));
/// …in one calibration, in order from `reviews_by_calibration`.
static BY_CALIBRATION_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(Some("calibration_id")));
/// …by one reviewer, in order from `reviews_by_reviewer`.
static BY_REVIEWER_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(Some("reviewer_id")));

/// The statement of a page of reviews filtered by these: read by the
/// filter that finds the fewest (a result has a review per reviewer at
/// most), so that a page costs about what passes its filters, not a walk of
/// every review of the project to find them.
fn page_sql(test_result_id: Option<&str>, reviewer_id: Option<&str>, calibration_id: Option<&str>) -> &'static PageSql {
    match (test_result_id, calibration_id, reviewer_id) {
        (Some(_), _, _) => &BY_RESULT_SQL,
        (None, Some(_), _) => &BY_CALIBRATION_SQL,
        (None, None, Some(_)) => &BY_REVIEWER_SQL,
        (None, None, None) => &LIST_SQL,
    }
}

/// `GET /reviews`: the reviews in the caller's projects, newest first,
/// without other people's reviews of the results the caller labels blind.
pub async fn list(state: &AppState, caller: Caller, query: p::ListReviewsQuery) -> Result<types::ReviewList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "rev").map_err(|e| Failure::invalid("cursor", e))?;
    let verdict = query.verdict.map(|v| v.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                page_sql(
                    query.test_result_id.as_deref(),
                    query.reviewer_id.as_deref(),
                    query.calibration_id.as_deref(),
                )
                .of(&page),
                &page,
                params![
                    caller.user_id,
                    query.test_result_id,
                    query.reviewer_id,
                    query.calibration_id,
                    verdict,
                    page.after,
                    page.fetch_limit()
                ],
            )?;
            let mut by_id = tx.prepare_cached(&format!("SELECT {COLUMNS} FROM reviews r WHERE r.id = ?1"))?;
            let rows = ids.iter().map(|id| by_id.query_row([id], from_row)).collect::<rusqlite::Result<Vec<_>>>()?;
            let page = page.finish(rows, |r| r.id.clone());
            Ok(types::ReviewList { reviews: page.items, next_cursor: page.next_cursor })
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Failure;

    /// SQLite's virtual machine steps (which no machine's noise moves) to
    /// read the first page of one project's reviews filtered by `filter`
    /// (`test_result_id`, `reviewer_id` or `calibration_id`), which two
    /// reviews pass, in a project holding `others` other reviews (by the
    /// same reviewers, of other results, outside the calibration).
    fn steps_of_a_filtered_page(filter: &str, others: usize) -> i32 {
        steps_of_a_filtered_walk(filter, others, "prj_1")
    }

    /// The same page's walk of `project`: `prj_1`, which holds the
    /// reviews, or `prj_2`, which holds none, as a page across the
    /// caller's projects walks each of them (`pagination::merge_walks`).
    fn steps_of_a_filtered_walk(filter: &str, others: usize, project: &'static str) -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(move |tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_a', 'a', 't'), ('usr_b', 'b', 't'),
                                                                     ('usr_c', 'c', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL),
                                                 ('prj_2', 'q', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO project_members (project_id, user_id, role, added_at)
                     VALUES ('prj_1', 'usr_a', 'reviewer', 't'), ('prj_1', 'usr_b', 'reviewer', 't'),
                            ('prj_1', 'usr_c', 'reviewer', 't'), ('prj_2', 'usr_c', 'reviewer', 't');
                     INSERT INTO calibrations (id, project_id, created_by, status, created_at)
                     VALUES ('cal_1', 'prj_1', 'usr_c', 'complete', 't');",
                )?;
                let mut result = tx.prepare(
                    "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                               created_at, document)
                     VALUES (?1, 'prj_1', ?1, 'brn_1', 'tst_1', ?1, 'passed', 't', '{}')",
                )?;
                let mut review = tx.prepare(
                    "INSERT INTO reviews (id, project_id, test_result_id, reviewer_id, verdict, evaluations, notes,
                                          calibration_id, created_at, updated_at)
                     VALUES ('rev_' || ?1 || ?2, 'prj_1', ?1, ?2, 'pass', '[]', '', ?3, 't', 't')",
                )?;
                // The two that pass: the reviewer `usr_a`'s two reviews of
                // `trs_0`, `trs_1`, in `cal_1`; `trs_0` reviewed by no one else.
                for i in 0..2 {
                    let id = format!("trs_{i}");
                    result.execute(params![id])?;
                    review.execute(params![id, "usr_a", "cal_1"])?;
                }
                // Walking `prj_2`, the others are `usr_a`'s reviews in
                // `cal_1`, all in `prj_1`; walking `prj_1`, other people's.
                for i in 0..others {
                    let id = format!("trs_x{i:06}");
                    result.execute(params![id])?;
                    match project {
                        "prj_1" => review.execute(params![id, ["usr_b", "usr_c"][i % 2], None::<String>])?,
                        _ => review.execute(params![id, "usr_a", "cal_1"])?,
                    };
                }
                Ok(())
            })
            .unwrap();
        store
            .read_blocking::<_, Failure, _>(|tx| {
                let page = PageRequest::parse(Some(50), None, "rev").unwrap();
                let (result, reviewer, calibration) = match filter {
                    "test_result_id" => (Some("trs_0"), None, None),
                    "reviewer_id" => (None, Some("usr_a"), None),
                    _ => (None, None, Some("cal_1")),
                };
                let mut read = tx.prepare(page_sql(result, reviewer, calibration).of(&page))?;
                let ids = read
                    .query_map(
                        params![project, "usr_c", result, reviewer, calibration, None::<String>, page.after, 51],
                        |r| r.get::<_, String>(0),
                    )?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let want = match (project, filter) {
                    ("prj_2", _) => 0,
                    (_, "test_result_id") => 1,
                    _ => 2,
                };
                assert_eq!(ids.len(), want, "{filter}: {ids:?}");
                Ok(read.get_status(rusqlite::StatementStatus::VmStep))
            })
            .unwrap()
    }

    /// Each filter's statement reads its index from the cursor on (a
    /// result's few reviews by their key), not the project's.
    #[test]
    fn a_filtered_page_of_reviews_reads_its_filters_index() {
        crate::pagination::tests::on_schema(|tx| {
            for (sql, step) in [
                (&BY_RESULT_SQL, "SEARCH r USING INDEX sqlite_autoindex_reviews_2 (test_result_id=?)"),
                (
                    &BY_CALIBRATION_SQL,
                    "SEARCH r USING INDEX reviews_by_calibration (calibration_id=? AND project_id=? AND id<?)",
                ),
                (
                    &BY_REVIEWER_SQL,
                    "SEARCH r USING INDEX reviews_by_reviewer (reviewer_id=? AND project_id=? AND id<?)",
                ),
            ] {
                let plan = crate::pagination::tests::plan(tx, sql.of_cursor(true))?;
                assert!(plan.iter().any(|s| s == step), "{step}\n{plan:#?}");
                assert!(!plan.iter().any(|s| s.contains("reviews_by_project")), "{plan:#?}");
            }
            Ok(())
        });
    }

    /// A page of reviews of one result, by one reviewer or in one
    /// calibration costs about what it holds, however many other reviews
    /// the project has: not a walk of all of them to find those few.
    #[test]
    fn a_filtered_page_of_reviews_reads_only_what_passes_its_filter() {
        for filter in ["test_result_id", "reviewer_id", "calibration_id"] {
            let (few, many) = (steps_of_a_filtered_page(filter, 10), steps_of_a_filtered_page(filter, 2_000));
            assert_eq!(few, many, "{filter}: {few} steps beside 10 other reviews, {many} beside 2,000");
        }
    }

    /// A page across the caller's projects walks each of them: the walk of
    /// a project where the reviewer or the calibration has no review costs
    /// the same however many they have in another. Read from (reviewer_id,
    /// id) or (calibration_id, id), it read every one of them to find none.
    #[test]
    fn a_filtered_walk_of_a_project_without_them_reads_none_of_their_reviews_elsewhere() {
        for filter in ["reviewer_id", "calibration_id"] {
            let few = steps_of_a_filtered_walk(filter, 10, "prj_2");
            let many = steps_of_a_filtered_walk(filter, 2_000, "prj_2");
            assert_eq!(few, many, "{filter}: {few} steps beside 10 reviews elsewhere, {many} beside 2,000");
        }
    }
}
