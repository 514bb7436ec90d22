//! Calibration reviews: a fixed set of results that several reviewers label
//! blind, and how far the automated evaluators agree with them.
//!
//! Editors and owners create and close them; every member reads them. The
//! results are given by id or drawn as a seeded sample (see [`draw`]); a
//! result is in at most one open calibration at a time (409
//! `in_calibration`), so a review never has to choose between two, and a
//! reviewer's label counted in a complete one is final (409
//! `review_locked`). A sample passes over such results and draws the next
//! in its order instead (409 `nothing_to_draw` when none is left). The
//! reviewers must be members with the reviewer, editor or owner role.
//!
//! Metrics come from the reviews that carry the calibration's id, over two
//! kinds of subject: each result's overall verdict (the
//! automated label is `status == passed`; an `error` is not a pass), and
//! each evaluator's verdict on each result (the automated label is the
//! evaluation's `passed`, the human labels the reviews' label of that
//! name), read from `result_verdicts`, kept beside each result, never from
//! its document (see `AutomatedVerdicts`). See `metrics.rs` for the
//! majority and tie rule. An open calibration's are measured on read (so an
//! owner watching it sees them grow); a complete one's are measured once, in the transaction that
//! completes it (its last label, a close, or the membership change that
//! left no one to wait for: all through [`complete`]), kept in its row
//! (`calibrations.metrics`) and read from there: its labels are final, and
//! so are its metrics, whatever becomes of its results; and a page of
//! complete calibrations reads none of their results. An assigned reviewer
//! who is not an owner sees none of it while the calibration is open, nor
//! anyone who labels some of its results blind in another open one
//! (`blinded: true`).

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, Caller};

use super::blind;
use super::metrics::{self, Subject};
use crate::access::{self, Need, Role};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::runs::conversion;
use crate::{ids, AppState};

pub const MAX_RESULTS: usize = 500;
pub const MAX_REVIEWERS: usize = 50;

/// The seeded sample: the `size` ids with the smallest blake3 hash of (the
/// seed as 8 little-endian bytes, the id). The same seed over the same ids
/// always draws the same sample, whatever order they come in.
pub fn draw(ids: Vec<String>, size: usize, seed: i64) -> Vec<String> {
    let mut order = draw_order(ids, seed);
    order.truncate(size);
    order
}

/// Every id, in the order the seed draws them: by blake3 hash of (the seed
/// as 8 little-endian bytes, the id).
fn draw_order(ids: Vec<String>, seed: i64) -> Vec<String> {
    let mut keyed: Vec<([u8; 32], String)> = ids
        .into_iter()
        .map(|id| {
            let mut h = blake3::Hasher::new();
            h.update(&seed.to_le_bytes());
            h.update(id.as_bytes());
            (*h.finalize().as_bytes(), id)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, id)| id).collect()
}

/// Checks the shape of a request before the transaction: one way of giving
/// results, no id twice, the bounds of the spec.
fn check_shape(body: &types::CreateCalibrationRequest) -> Result<()> {
    match (body.test_result_ids.is_empty(), &body.sample) {
        (false, Some(_)) => return Err(Failure::invalid("sample", "give either test_result_ids or sample, not both")),
        (true, None) => {
            return Err(Failure::invalid(
                "test_result_ids",
                "give the results to label, as test_result_ids or as a sample to draw",
            ))
        }
        _ => {}
    }
    if let Some(sample) = &body.sample {
        match (&sample.batch_run_id, &sample.test_id) {
            (Some(_), Some(_)) => {
                return Err(Failure::invalid("sample", "draw from either a batch_run_id or a test_id, not both"))
            }
            (None, None) => {
                return Err(Failure::invalid("sample", "give the batch_run_id or the test_id to draw from"))
            }
            _ => {}
        }
        if sample.size.get() as usize > MAX_RESULTS {
            return Err(Failure::invalid("sample.size", format_args!("at most {MAX_RESULTS}")));
        }
    }
    if body.test_result_ids.len() > MAX_RESULTS {
        return Err(Failure::invalid(
            "test_result_ids",
            format_args!("at most {MAX_RESULTS} results, got {}", body.test_result_ids.len()),
        ));
    }
    if body.reviewer_ids.is_empty() || body.reviewer_ids.len() > MAX_REVIEWERS {
        return Err(Failure::invalid(
            "reviewer_ids",
            format_args!("1 to {MAX_REVIEWERS} reviewers, got {}", body.reviewer_ids.len()),
        ));
    }
    for (field, list) in [("test_result_ids", &body.test_result_ids), ("reviewer_ids", &body.reviewer_ids)] {
        let mut seen = std::collections::BTreeSet::new();
        for (i, id) in list.iter().enumerate() {
            if !seen.insert(id.as_str()) {
                return Err(Failure::invalid(&format!("{field}[{i}]"), format_args!("`{id}` is listed twice")));
            }
        }
    }
    Ok(())
}

/// The open calibration review `result` is in, if any.
fn open_calibration_of(tx: &rusqlite::Transaction<'_>, result: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(
            "SELECT c.id FROM calibration_results cr
             JOIN calibrations c ON c.id = cr.calibration_id AND c.status = 'open'
             WHERE cr.test_result_id = ?1 LIMIT 1",
        )?
        .query_row(params![result], |r| r.get(0))
        .optional()?)
}

/// One of `reviewers` who labelled `result` in a complete calibration
/// review, and that review: `(reviewer, calibration)`. One review per
/// reviewer per result, and one counted toward a complete calibration is
/// final: that reviewer could never label the result in another, which
/// would stay open with them blind to it.
fn locked_label(
    tx: &rusqlite::Transaction<'_>,
    result: &str,
    reviewers: &[String],
) -> Result<Option<(String, String)>> {
    let mut locked = tx.prepare_cached(
        "SELECT c.id FROM reviews r JOIN calibrations c ON c.id = r.calibration_id AND c.status = 'complete'
         WHERE r.test_result_id = ?1 AND r.reviewer_id = ?2",
    )?;
    for reviewer in reviewers {
        if let Some(other) = locked.query_row(params![result, reviewer], |r| r.get::<_, String>(0)).optional()? {
            return Ok(Some((reviewer.clone(), other)));
        }
    }
    Ok(None)
}

/// The results the request names or draws, checked against the project.
/// Named results that cannot be calibrated (in another open calibration,
/// or labelled for good by a chosen reviewer) refuse the request (409); a
/// sample passes over them and draws the next in its order, up to `size`.
fn results_of(
    tx: &rusqlite::Transaction<'_>,
    project_id: &str,
    body: &types::CreateCalibrationRequest,
) -> Result<Vec<String>> {
    let Some(sample) = &body.sample else {
        for (i, id) in body.test_result_ids.iter().enumerate() {
            access::require_reference(tx, "test_results", &format!("test_result_ids[{i}]"), id, project_id)?;
        }
        for result in &body.test_result_ids {
            if let Some(other) = open_calibration_of(tx, result)? {
                return Err(Failure::Conflict {
                    code: "in_calibration",
                    message: format!(
                        "test result `{result}` is already in open calibration review `{other}`; close that one first"
                    ),
                });
            }
        }
        for result in &body.test_result_ids {
            if let Some((reviewer, other)) = locked_label(tx, result, &body.reviewer_ids)? {
                return Err(Failure::Conflict {
                    code: "review_locked",
                    message: format!(
                        "reviewer `{reviewer}` labelled test result `{result}` in complete calibration \
                         review `{other}`, and those labels are final: leave that reviewer or that result out"
                    ),
                });
            }
        }
        return Ok(body.test_result_ids.clone());
    };
    let (table, column, field, source) = match (&sample.batch_run_id, &sample.test_id) {
        (Some(id), _) => ("batch_runs", "batch_run_id", "sample.batch_run_id", id),
        (None, Some(id)) => ("tests", "test_id", "sample.test_id", id),
        (None, None) => unreachable!("checked by check_shape"),
    };
    access::require_reference(tx, table, field, source, project_id)?;
    let all: Vec<String> = tx
        .prepare_cached(&format!("SELECT id FROM test_results WHERE {column} = ?1"))?
        .query_map(params![source], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if all.is_empty() {
        return Err(Failure::invalid(field, format_args!("`{source}` has no test results to draw from yet")));
    }
    let size = sample.size.get() as usize;
    let mut drawn = Vec::with_capacity(size.min(all.len()));
    for result in draw_order(all, sample.seed) {
        if drawn.len() == size {
            break;
        }
        if open_calibration_of(tx, &result)?.is_none() && locked_label(tx, &result, &body.reviewer_ids)?.is_none() {
            drawn.push(result);
        }
    }
    if drawn.is_empty() {
        return Err(Failure::Conflict {
            code: "nothing_to_draw",
            message: format!(
                "{field}: every test result of `{source}` is in an open calibration review, or was labelled \
                 by one of reviewer_ids in a complete one (those labels are final)"
            ),
        });
    }
    Ok(drawn)
}

/// `POST /reviews/calibration`.
pub async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateCalibrationRequest,
) -> Result<types::Calibration> {
    check_shape(&body)?;
    let id = ids::new_id("cal");
    state
        .store
        .write(move |tx| {
            let project_id = body.project_id.clone();
            access::require(tx, &caller.user_id, &project_id, Need::Edit)?;
            for (i, reviewer) in body.reviewer_ids.iter().enumerate() {
                match access::role_in(tx, reviewer, &project_id)? {
                    Some(role) if role >= Role::Reviewer => {}
                    _ => {
                        return Err(Failure::invalid(
                            &format!("reviewer_ids[{i}]"),
                            format_args!(
                                "`{reviewer}` is not a member of this project with the reviewer, editor or owner role"
                            ),
                        ))
                    }
                }
            }
            let results = results_of(tx, &project_id, &body)?;
            let sample = body.sample.as_ref().map(serde_json::to_string).transpose().map_err(|e| conversion(0, e))?;
            tx.execute(
                "INSERT INTO calibrations (id, project_id, created_by, status, sample, created_at)
                 VALUES (?1, ?2, ?3, 'open', ?4, ?5)",
                params![id, project_id, caller.user_id, sample, ids::format_time(&ids::now())],
            )?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO calibration_results (calibration_id, test_result_id, position) VALUES (?1, ?2, ?3)",
                )?;
                for (position, result) in results.iter().enumerate() {
                    insert.execute(params![id, result, position as i64])?;
                }
                let mut insert = tx.prepare_cached(
                    "INSERT INTO calibration_reviewers (calibration_id, user_id, position) VALUES (?1, ?2, ?3)",
                )?;
                for (position, reviewer) in body.reviewer_ids.iter().enumerate() {
                    insert.execute(params![id, reviewer, position as i64])?;
                }
            }
            activity::record(
                tx,
                &Actor::Caller(caller.clone()),
                Record {
                    action: "calibration.create",
                    resource_type: "calibration",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary: format!(
                        "created a calibration review of {} results by {} reviewers",
                        results.len(),
                        body.reviewer_ids.len()
                    ),
                    changes: json!({
                        "test_result_ids": results,
                        "reviewer_ids": body.reviewer_ids,
                        "sample": body.sample,
                    })
                    .into(),
                },
            )?;
            view(tx, &caller.user_id, &id)
        })
        .await
}

/// `GET /reviews/calibration/{id}`.
pub async fn get(state: &AppState, caller: Caller, path: p::GetCalibrationPath) -> Result<types::Calibration> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "calibrations", "calibration review", &path.id, Need::Read)?;
            view(tx, &caller.user_id, &path.id)
        })
        .await
}

/// The ids of a page of one project's calibration reviews (`?1`), newest
/// first, in the status `?2` (all when NULL), after the cursor `?3`, at
/// most `?4` (see [`PageSql`]): in order from `calibrations_by_project`,
/// no sort, and the walk stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT id FROM calibrations WHERE project_id = ?1 AND (?2 IS NULL OR status = ?2) {AFTER}
             ORDER BY id DESC LIMIT ?4"
        ),
        "AND id < ?3",
    )
});

/// `GET /reviews/calibration`: newest first.
pub async fn list(state: &AppState, caller: Caller, query: p::ListCalibrationsQuery) -> Result<types::CalibrationList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "cal").map_err(|e| Failure::invalid("cursor", e))?;
    let status = query.status.map(|s| s.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![status, page.after, page.fetch_limit()],
            )?;
            let page = page.finish(ids, Clone::clone);
            let calibrations = page.items.iter().map(|id| view(tx, &caller.user_id, id)).collect::<Result<Vec<_>>>()?;
            Ok(types::CalibrationList { calibrations, next_cursor: page.next_cursor })
        })
        .await
}

/// `POST /reviews/calibration/{id}/close`: closing a complete one changes
/// nothing (and records nothing).
pub async fn close(state: &AppState, caller: Caller, path: p::CloseCalibrationPath) -> Result<types::Calibration> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) = access::require_resource(
                tx,
                &caller.user_id,
                "calibrations",
                "calibration review",
                &path.id,
                Need::Edit,
            )?;
            let status: String =
                tx.query_row("SELECT status FROM calibrations WHERE id = ?1", params![path.id], |r| r.get(0))?;
            if status == "open" {
                let (done, total) = progress(tx, &path.id)?;
                complete(tx, &path.id)?;
                activity::record(
                    tx,
                    &Actor::Caller(caller.clone()),
                    Record {
                        action: "calibration.close",
                        resource_type: "calibration",
                        resource_id: &path.id,
                        project_id: Some(&project_id),
                        summary: format!("closed a calibration review with {done} of {total} labels given"),
                        changes: json!({"status": "complete"}).into(),
                    },
                )?;
            }
            view(tx, &caller.user_id, &path.id)
        })
        .await
}

/// `(labels given, labels needed)`.
fn progress(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<(i64, i64)> {
    Ok(tx
        .prepare_cached(
            "SELECT (SELECT count(*) FROM reviews WHERE calibration_id = ?1),
                    (SELECT count(*) FROM calibration_results WHERE calibration_id = ?1)
                  * (SELECT count(*) FROM calibration_reviewers WHERE calibration_id = ?1)",
        )?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Completes the open calibration `id` if no label is missing from an
/// assigned reviewer who can still give it (a member of its project with the
/// reviewer, editor or owner role): one who left the project or became a
/// viewer is not waited for, or the calibration would stay open, its results
/// blind to the others, for ever. True if it did. Runs in the transaction of
/// the review that gave the last label, or of the membership change that
/// left no one else to wait for ([`stop_waiting_for`]).
pub fn complete_if_done(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<bool> {
    // A review carries the calibration's id only if an assigned reviewer
    // gave it of one of its results, one per reviewer per result: none is
    // missing when those of the reviewers who can still label number
    // results × those reviewers.
    let missing: i64 = tx
        .prepare_cached(
            "WITH able AS (
                 SELECT v.user_id FROM calibration_reviewers v
                 JOIN calibrations c ON c.id = v.calibration_id
                 JOIN project_members m ON m.project_id = c.project_id AND m.user_id = v.user_id
                                       AND m.role IN ('reviewer', 'editor', 'owner')
                 WHERE v.calibration_id = ?1)
             SELECT (SELECT count(*) FROM calibration_results WHERE calibration_id = ?1) * (SELECT count(*) FROM able)
                  - (SELECT count(*) FROM reviews WHERE calibration_id = ?1 AND reviewer_id IN (SELECT user_id FROM able))",
        )?
        .query_row(params![id], |r| r.get(0))?;
    if missing > 0 {
        return Ok(false);
    }
    complete(tx, id)
}

/// Completes the calibration `id` if it is open, and keeps its metrics as
/// they are now (see [`keep`]). True if it did. The one way a calibration
/// completes.
fn complete(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<bool> {
    let changed = tx
        .prepare_cached(
            "UPDATE calibrations SET status = 'complete', closed_at = ?2 WHERE id = ?1 AND status = 'open'",
        )?
        .execute(params![id, ids::format_time(&ids::now())])?;
    if changed == 1 {
        keep(tx, Verdicts::Kept, id)?;
    }
    Ok(changed == 1)
}

/// Measures the calibration `id` from its labels and results as they are
/// now, and keeps that in its row (`calibrations.metrics`), which every
/// read of it answers from once it is complete.
fn keep(tx: &rusqlite::Connection, verdicts: Verdicts, id: &str) -> Result<()> {
    let measured = measure(tx, verdicts, &result_ids(tx, id)?, &labels(tx, id)?)?;
    let text = serde_json::to_string(&Kept::of(&measured)).map_err(|e| conversion(0, e))?;
    tx.prepare_cached("UPDATE calibrations SET metrics = ?2 WHERE id = ?1")?.execute(params![id, text])?;
    Ok(())
}

/// Migration 0021's step: the calibrations complete before it keep their
/// metrics as their labels and results give them then. One whose metrics
/// cannot be measured (a result's document that is not a result, which
/// nothing writes) is left without, and measured on read as before, rather
/// than stop every start.
pub(crate) fn keep_all(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let complete: Vec<String> = tx
        .prepare("SELECT id FROM calibrations WHERE status = 'complete' AND metrics IS NULL")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in complete {
        match keep(tx, Verdicts::InDocuments, &id) {
            Ok(()) => {}
            Err(Failure::Store(crate::store::StoreError::Sqlite(rusqlite::Error::FromSqlConversionFailure(..)))) => {}
            Err(Failure::Store(crate::store::StoreError::Sqlite(e))) => return Err(e),
            Err(e) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    format!("the metrics of calibration `{id}`: {e}").into(),
                ))
            }
        }
    }
    Ok(())
}

/// After `user_id` left project `project_id` or became a viewer there: the
/// open calibrations they are assigned to no longer wait for them, and those
/// with no other label missing complete now. Their ids.
pub fn stop_waiting_for(tx: &rusqlite::Transaction<'_>, project_id: &str, user_id: &str) -> Result<Vec<String>> {
    let open: Vec<String> = tx
        .prepare_cached(
            "SELECT c.id FROM calibrations c JOIN calibration_reviewers v ON v.calibration_id = c.id AND v.user_id = ?2
             WHERE c.project_id = ?1 AND c.status = 'open' ORDER BY c.id",
        )?
        .query_map(params![project_id, user_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut completed = Vec::new();
    for id in open {
        if complete_if_done(tx, &id)? {
            completed.push(id);
        }
    }
    Ok(completed)
}

struct Label {
    result_id: String,
    verdict_pass: bool,
    evaluations: Vec<types::ReviewLabel>,
}

/// The results of the calibration `id`, in order.
fn result_ids(tx: &rusqlite::Connection, id: &str) -> Result<Vec<String>> {
    Ok(tx
        .prepare_cached("SELECT test_result_id FROM calibration_results WHERE calibration_id = ?1 ORDER BY position")?
        .query_map(params![id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
}

/// The labels that count toward the calibration `id`, in the order of its
/// reviewers.
fn labels(tx: &rusqlite::Connection, id: &str) -> Result<Vec<Label>> {
    Ok(tx
        .prepare_cached(
            "SELECT r.test_result_id, r.verdict, r.evaluations FROM reviews r
             JOIN calibration_reviewers v ON v.calibration_id = r.calibration_id AND v.user_id = r.reviewer_id
             WHERE r.calibration_id = ?1 ORDER BY v.position",
        )?
        .query_map(params![id], |r| {
            let verdict: String = r.get(1)?;
            let evaluations: String = r.get(2)?;
            Ok(Label {
                result_id: r.get(0)?,
                verdict_pass: verdict == "pass",
                evaluations: serde_json::from_str(&evaluations).map_err(|e| conversion(2, e))?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?)
}

/// How many labels count toward the calibration `id`: as many as
/// [`labels`] reads.
fn labels_done(tx: &rusqlite::Connection, id: &str) -> Result<i64> {
    Ok(tx
        .prepare_cached(
            "SELECT count(*) FROM reviews r
             JOIN calibration_reviewers v ON v.calibration_id = r.calibration_id AND v.user_id = r.reviewer_id
             WHERE r.calibration_id = ?1",
        )?
        .query_row(params![id], |r| r.get(0))?)
}

/// A complete calibration's metrics as its row keeps them: the wire's, each
/// rate written as text. serde_json reads a number back as an `f64` that
/// may be one unit in the last place off the one it wrote (without its
/// `float_roundtrip` feature); Rust's own parsing of Rust's own text gives
/// the same `f64` back, so a kept metric is read exactly as measured.
#[derive(Serialize, Deserialize)]
struct Kept {
    overall: KeptMetrics,
    per_evaluator: Vec<(String, KeptMetrics)>,
    disagreements: Vec<types::CalibrationDisagreement>,
}

#[derive(Serialize, Deserialize)]
struct KeptMetrics {
    #[serde(with = "exact")]
    agreement_rate: Option<f64>,
    #[serde(with = "exact")]
    cohens_kappa: Option<f64>,
    #[serde(with = "exact")]
    fleiss_kappa: Option<f64>,
    #[serde(with = "exact")]
    true_positive_rate: Option<f64>,
    #[serde(with = "exact")]
    true_negative_rate: Option<f64>,
    undefined_reasons: Map<String, Value>,
}

/// An `Option<f64>` as the text Rust writes it (`{:?}`, the shortest that
/// reads back the same), and read back with Rust's parser.
mod exact {
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        value.map(|v| format!("{v:?}")).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<String>::deserialize(d)?.map(|t| t.parse().map_err(D::Error::custom)).transpose()
    }
}

impl KeptMetrics {
    fn of(m: &types::CalibrationMetrics) -> KeptMetrics {
        KeptMetrics {
            agreement_rate: m.agreement_rate,
            cohens_kappa: m.cohens_kappa,
            fleiss_kappa: m.fleiss_kappa,
            true_positive_rate: m.true_positive_rate,
            true_negative_rate: m.true_negative_rate,
            undefined_reasons: m.undefined_reasons.clone(),
        }
    }

    fn wire(self) -> types::CalibrationMetrics {
        types::CalibrationMetrics {
            agreement_rate: self.agreement_rate,
            cohens_kappa: self.cohens_kappa,
            fleiss_kappa: self.fleiss_kappa,
            true_positive_rate: self.true_positive_rate,
            true_negative_rate: self.true_negative_rate,
            undefined_reasons: self.undefined_reasons,
        }
    }
}

impl Kept {
    fn of((overall, per_evaluator, disagreements): &Measured) -> Kept {
        Kept {
            overall: KeptMetrics::of(overall),
            per_evaluator: per_evaluator.iter().map(|e| (e.name.clone(), KeptMetrics::of(&e.metrics))).collect(),
            disagreements: disagreements.clone(),
        }
    }

    fn measured(self) -> Measured {
        (
            self.overall.wire(),
            self.per_evaluator
                .into_iter()
                .map(|(name, metrics)| types::CalibrationEvaluatorMetrics { name, metrics: metrics.wire() })
                .collect(),
            self.disagreements,
        )
    }
}

fn wire_metrics(m: &metrics::Metrics) -> types::CalibrationMetrics {
    types::CalibrationMetrics {
        agreement_rate: m.agreement_rate,
        cohens_kappa: m.cohens_kappa,
        fleiss_kappa: m.fleiss_kappa,
        true_positive_rate: m.true_positive_rate,
        true_negative_rate: m.true_negative_rate,
        undefined_reasons: m.undefined.iter().map(|(k, v)| (k.to_string(), Value::String(v.clone()))).collect(),
    }
}

/// Every metric null, each with `reason`.
fn hidden_metrics(reason: &str) -> types::CalibrationMetrics {
    let names = ["agreement_rate", "cohens_kappa", "fleiss_kappa", "true_positive_rate", "true_negative_rate"];
    types::CalibrationMetrics {
        agreement_rate: None,
        cohens_kappa: None,
        fleiss_kappa: None,
        true_positive_rate: None,
        true_negative_rate: None,
        undefined_reasons: names
            .iter()
            .map(|n| (n.to_string(), Value::String(reason.to_string())))
            .collect::<Map<_, _>>(),
    }
}

/// The calibration `id` as `user_id` may see it.
pub(crate) fn view(tx: &rusqlite::Connection, user_id: &str, id: &str) -> Result<types::Calibration> {
    type Row = (String, String, Option<String>, String, Option<String>, Option<String>);
    let (project_id, status, sample, created_at, closed_at, kept): Row = tx
        .prepare_cached(
            "SELECT project_id, status, sample, created_at, closed_at, metrics FROM calibrations WHERE id = ?1",
        )?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?
        .ok_or_else(|| Failure::not_found("calibration review", id))?;
    let result_ids = result_ids(tx, id)?;
    let reviewer_ids: Vec<String> = tx
        .prepare_cached("SELECT user_id FROM calibration_reviewers WHERE calibration_id = ?1 ORDER BY position")?
        .query_map(params![id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let open = status == "open";
    let caller_role = access::role_in(tx, user_id, &project_id)?;
    let labelling_this = open && reviewer_ids.iter().any(|r| r == user_id) && caller_role != Some(Role::Owner);
    // Another calibration (say an earlier, complete one over the same
    // results) would otherwise show the automated verdicts of results the
    // caller labels blind in an open one.
    let blind_elsewhere = || -> Result<bool> {
        let blind = blind::blind_map(tx, user_id)?;
        Ok(result_ids.iter().any(|r| blind.contains_key(r)))
    };
    let blinded = labelling_this || blind_elsewhere()?;
    let labels_total = (result_ids.len() * reviewer_ids.len()) as i64;
    let progress = types::CalibrationProgress { labels_done: labels_done(tx, id)?, labels_total };

    let (overall, per_evaluator, disagreements) = if blinded {
        let reason = if labelling_this {
            "hidden while you label this calibration review blind; shown once it is complete"
        } else {
            "hidden while you label some of its results blind in another calibration review; shown once that one is \
             complete"
        };
        (hidden_metrics(reason), Vec::new(), Vec::new())
    } else if let (false, Some(kept)) = (open, kept) {
        serde_json::from_str::<Kept>(&kept).map_err(|e| conversion(5, e))?.measured()
    } else {
        measure(tx, Verdicts::Kept, &result_ids, &labels(tx, id)?)?
    };
    let time = |s: &str| ids::parse_time(s).ok_or_else(|| Failure::Store(conversion(0, "not a time").into()));
    Ok(types::Calibration {
        id: id.to_string(),
        project_id,
        test_result_ids: result_ids,
        reviewer_ids,
        status: if open { types::CalibrationStatus::Open } else { types::CalibrationStatus::Complete },
        sample: sample.as_deref().map(serde_json::from_str).transpose().map_err(|e| conversion(2, e))?,
        progress,
        overall,
        per_evaluator,
        disagreements,
        blinded,
        created_at: time(&created_at)?,
        closed_at: closed_at.as_deref().map(time).transpose()?,
    })
}

type Measured =
    (types::CalibrationMetrics, Vec<types::CalibrationEvaluatorMetrics>, Vec<types::CalibrationDisagreement>);

/// Where [`measure`] finds the automated verdicts of a result.
#[derive(Clone, Copy)]
enum Verdicts {
    /// `result_verdicts`, kept beside each result: one short row a result,
    /// for every read and every completion.
    Kept,
    /// The results' documents (each a whole conversation): migration 0021's
    /// step alone, which runs against its own schema, before
    /// `result_verdicts` exists.
    InDocuments,
}

/// The metrics of the labels so far: overall, then per evaluator in the
/// order the results name them. A result that is gone is left out.
fn measure(tx: &rusqlite::Connection, verdicts: Verdicts, result_ids: &[String], labels: &[Label]) -> Result<Measured> {
    let mut by_result: HashMap<&str, Vec<&Label>> = HashMap::new();
    for label in labels {
        by_result.entry(label.result_id.as_str()).or_default().push(label);
    }
    let mut overall: Vec<Subject> = Vec::new();
    let mut overall_ids: Vec<&str> = Vec::new();
    // Evaluator name → (its subjects, their result ids), in first-seen order.
    let mut evaluators: Vec<(String, Vec<Subject>, Vec<&str>)> = Vec::new();
    let automated = |result_id: &str| -> Result<Option<super::AutomatedVerdicts>> {
        match verdicts {
            Verdicts::Kept => super::AutomatedVerdicts::kept(tx, result_id),
            Verdicts::InDocuments => tx
                .prepare_cached("SELECT document FROM test_results WHERE id = ?1")?
                .query_row(params![result_id], |r| r.get::<_, String>(0))
                .optional()?
                .map(|document| super::AutomatedVerdicts::of(&document))
                .transpose(),
        }
    };
    for result_id in result_ids {
        let Some(result) = automated(result_id)? else { continue };
        let given = by_result.get(result_id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        overall.push(Subject { automated: result.passed, human: given.iter().map(|l| l.verdict_pass).collect() });
        overall_ids.push(result_id);
        for evaluation in &result.evaluations {
            let human = given
                .iter()
                .filter_map(|l| l.evaluations.iter().find(|e| e.name == evaluation.name).map(|e| e.passed))
                .collect();
            let subject = Subject { automated: evaluation.passed, human };
            match evaluators.iter_mut().find(|(name, _, _)| *name == evaluation.name) {
                Some((_, subjects, ids)) => {
                    subjects.push(subject);
                    ids.push(result_id);
                }
                None => evaluators.push((evaluation.name.clone(), vec![subject], vec![result_id])),
            }
        }
    }
    let mut disagreements = Vec::new();
    let m = metrics::evaluate(&overall);
    for &(i, human) in &m.disagreements {
        disagreements.push(types::CalibrationDisagreement {
            test_result_id: overall_ids[i].to_string(),
            evaluator: None,
            human_label: human,
            automated_label: overall[i].automated,
        });
    }
    let mut per_evaluator = Vec::new();
    for (name, subjects, ids) in &evaluators {
        let e = metrics::evaluate(subjects);
        for &(i, human) in &e.disagreements {
            disagreements.push(types::CalibrationDisagreement {
                test_result_id: ids[i].to_string(),
                evaluator: Some(name.clone()),
                human_label: human,
                automated_label: subjects[i].automated,
            });
        }
        per_evaluator.push(types::CalibrationEvaluatorMetrics { name: name.clone(), metrics: wire_metrics(&e) });
    }
    Ok((wire_metrics(&m), per_evaluator, disagreements))
}

#[cfg(test)]
mod unit {
    use super::*;

    /// A kept metric reads back as the very `f64` that was measured, bit
    /// for bit (these are numbers serde_json's own float parsing reads back
    /// one unit in the last place off).
    #[test]
    fn kept_metrics_read_back_exactly() {
        let values = [0.9122217316509271, -0.11255220830414857, -0.19104585650967235, 1.0 / 3.0, -1.0 / 11.0];
        let metrics = |v: f64| types::CalibrationMetrics {
            agreement_rate: Some(v),
            cohens_kappa: Some(-v),
            fleiss_kappa: Some(v / 7.0),
            true_positive_rate: None,
            true_negative_rate: Some(v * 3.0),
            undefined_reasons: [("true_positive_rate".to_string(), Value::String("why".into()))].into_iter().collect(),
        };
        for v in values {
            let measured: Measured = (
                metrics(v),
                vec![types::CalibrationEvaluatorMetrics { name: "e".into(), metrics: metrics(v * v) }],
                vec![types::CalibrationDisagreement {
                    test_result_id: "trs_1".into(),
                    evaluator: Some("e".into()),
                    human_label: false,
                    automated_label: true,
                }],
            );
            let text = serde_json::to_string(&Kept::of(&measured)).unwrap();
            let back = serde_json::from_str::<Kept>(&text).unwrap().measured();
            let bits = |m: &types::CalibrationMetrics| {
                [m.agreement_rate, m.cohens_kappa, m.fleiss_kappa, m.true_positive_rate, m.true_negative_rate]
                    .map(|x| x.map(f64::to_bits))
            };
            assert_eq!(bits(&back.0), bits(&measured.0), "{text}");
            assert_eq!(bits(&back.1[0].metrics), bits(&measured.1[0].metrics), "{text}");
            assert_eq!(back.1[0].name, "e");
            assert_eq!(back.0.undefined_reasons, measured.0.undefined_reasons);
            assert_eq!(serde_json::to_value(&back.2).unwrap(), serde_json::to_value(&measured.2).unwrap());
        }
    }

    #[test]
    fn the_sample_depends_on_the_seed_and_the_ids_not_their_order() {
        let ids: Vec<String> = (0..50).map(|i| format!("trs_{i:03}")).collect();
        let a = draw(ids.clone(), 10, 7);
        let mut reversed = ids.clone();
        reversed.reverse();
        assert_eq!(a, draw(reversed, 10, 7));
        assert_eq!(a.len(), 10);
        assert_ne!(a, draw(ids.clone(), 10, 8), "another seed draws another sample");
        let mut unique = a.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 10);
        // Asking for more than there is draws everything.
        assert_eq!(draw(ids.clone(), 80, 7).len(), 50);
        // The first of the sample is the id with the smallest hash.
        let smallest = ids
            .iter()
            .min_by_key(|id| {
                let mut h = blake3::Hasher::new();
                h.update(&7i64.to_le_bytes());
                h.update(id.as_bytes());
                *h.finalize().as_bytes()
            })
            .unwrap();
        assert_eq!(&a[0], smallest);
    }
}
