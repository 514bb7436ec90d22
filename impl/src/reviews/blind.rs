//! Blind labelling: while a calibration is open, a reviewer assigned to it
//! who is not an owner of its project labels its results without seeing the
//! automated verdicts or the other reviewers' labels.
//!
//! Every read that returns a `TestResult` goes through [`apply`] (results
//! are hidden one by one, and a list filtered by `status` leaves blind
//! results out, since matching the filter would reveal the status); `GET
//! /reviews` leaves out other reviewers' reviews of blind results (see
//! [`blind_results`]); a calibration hides its metrics from its blind
//! reviewers (`calibration.rs`); a batch run holding a blind result does not
//! say how its runs ended ([`apply_to_batch_run`]: its counts would give the
//! verdicts away), nor does the activity log ([`HIDDEN_ACTIVITY`]). Owners
//! see everything: they are who the calibration is for.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rusqlite::{params, OptionalExtension as _};
use sparring_server::types;

use crate::failure::Result;
use crate::store::{Action, Store, Watched};

/// SQL for `(test_result_id, calibration_id)`: the results the user whose
/// id is the parameter `user` (e.g. `?1`) labels blind right now, and the
/// open calibration that makes them blind. Every other blindness query is
/// built on this one.
pub fn blind_pairs(user: &str) -> String {
    format!(
        "SELECT cr.test_result_id, c.id AS calibration_id FROM calibration_results cr
         JOIN calibrations c ON c.id = cr.calibration_id AND c.status = 'open'
         JOIN calibration_reviewers v ON v.calibration_id = c.id AND v.user_id = {user}
         JOIN project_members m ON m.project_id = c.project_id AND m.user_id = {user} AND m.role != 'owner'"
    )
}

/// SQL for the ids of the test results the user whose id is the parameter
/// `user` (e.g. `?1`) labels blind right now.
pub fn blind_results(user: &str) -> String {
    format!("SELECT test_result_id FROM ({})", blind_pairs(user))
}

/// The open calibration in which `user_id` labels `result_id` blind, if any.
pub fn blinding_calibration(tx: &rusqlite::Connection, user_id: &str, result_id: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(&format!(
            "SELECT calibration_id FROM ({}) WHERE test_result_id = ?1 LIMIT 1",
            blind_pairs("?2")
        ))?
        .query_row(params![result_id, user_id], |r| r.get(0))
        .optional()?)
}

/// Every result `user_id` labels blind right now, with its calibration: one
/// query for a whole page of a list (empty for almost everyone).
pub fn blind_map(tx: &rusqlite::Connection, user_id: &str) -> Result<HashMap<String, String>> {
    Ok(tx
        .prepare_cached(&blind_pairs("?1"))?
        .query_map(params![user_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?)
}

/// Hides the automated verdicts of `result` from `user_id` if they label it
/// blind.
pub fn apply(tx: &rusqlite::Transaction<'_>, user_id: &str, result: &mut types::TestResult) -> Result<()> {
    if let Some(calibration_id) = blinding_calibration(tx, user_id, &result.id)? {
        hide(result, calibration_id);
    }
    Ok(())
}

/// The automated verdicts out (`status`, `score`, `failure_reason`, each
/// evaluation), the evaluator names kept (they are what the reviewer
/// labels), and `blinded` saying why.
pub fn hide(result: &mut types::TestResult, calibration_id: String) {
    let evaluator_names = result.evaluations.drain(..).map(|e| e.name).collect();
    result.status = None;
    result.score = None;
    result.failure_reason = None;
    result.blinded = Some(types::TestResultBlinding {
        reason: format!(
            "you are labelling this result blind in calibration review `{calibration_id}`: the automated verdicts \
             are hidden until it is complete"
        ),
        calibration_id,
        evaluator_names,
    });
}

/// The open calibration in which `user_id` labels one of the results of
/// batch run `batch_run_id` blind, if any.
pub fn blinding_batch_run(tx: &rusqlite::Connection, user_id: &str, batch_run_id: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(&format!(
            "SELECT b.calibration_id FROM ({}) b JOIN test_results t ON t.id = b.test_result_id
             WHERE t.batch_run_id = ?1 LIMIT 1",
            blind_pairs("?2")
        ))?
        .query_row(params![batch_run_id, user_id], |r| r.get(0))
        .optional()?)
}

/// Hides how runs ended (passed, failed, errored) in `counts`; how many
/// there are, queued, running and cancelled stays.
pub fn hide_endings(counts: &mut types::BatchRunCounts) {
    counts.passed = None;
    counts.failed = None;
    counts.errored = None;
}

/// Hides how the runs of `run` ended from `user_id` if they label one of
/// its results blind.
pub fn apply_to_batch_run(tx: &rusqlite::Connection, user_id: &str, run: &mut types::BatchRun) -> Result<()> {
    if let Some(calibration_id) = blinding_batch_run(tx, user_id, &run.id)? {
        hide_endings(&mut run.counts);
        run.pass_rate = None;
        run.passed = None;
        run.blinded = Some(types::BatchRunBlinding {
            reason: format!(
                "you are labelling a result of this batch run blind in calibration review `{calibration_id}`: how \
                 its runs ended is hidden until it is complete"
            ),
            calibration_id,
        });
    }
    Ok(())
}

/// SQL that is true for an activity record (`a`) the user whose id is the
/// parameter `?1` may not see while labelling blind: someone else's review
/// of a result they label blind, and the end of a batch run holding one
/// (its summary counts the verdicts). Never NULL.
pub static HIDDEN_ACTIVITY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "coalesce((a.resource_type = 'review' AND a.actor_user_id IS NOT ?1
                   AND json_extract(a.changes, '$.test_result_id') IN ({blind}))
                  OR (a.action = 'batch_run.complete'
                      AND a.resource_id IN (SELECT t.batch_run_id FROM test_results t WHERE t.id IN ({blind}))),
                  0)",
        blind = blind_results("?1")
    )
});

/// The results in open calibrations, kept in memory: only those can be
/// blind to anyone, so reading any other result (the most read document of
/// all) needs no query for its blinding.
///
/// Kept correct as `test_cache` is: a calibration's creation (its results
/// with it), its closing, or its deletion (by its project's, in cascade)
/// empties what is kept after the change commits and before it is
/// answered, and a read that raced with such a change does not keep what
/// it found. Calibrations change only by the server's own writes.
#[derive(Clone)]
pub struct InOpenCalibrations {
    /// `None` until read, and after a change.
    kept: Arc<Watched<Option<HashSet<String>>>>,
}

/// The changes that make what is kept stale.
const WATCHED: &[(&str, &[Action])] = &[
    ("calibrations", &[Action::SQLITE_INSERT, Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
    ("calibration_results", &[Action::SQLITE_INSERT, Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
];

/// More results in open calibrations than this and none are kept (each
/// read then asks the database, as it would without this).
const MAX_KEPT: usize = 100_000;

impl InOpenCalibrations {
    /// Kept correct by `store`'s writes.
    pub fn watching(store: &Store) -> InOpenCalibrations {
        InOpenCalibrations { kept: Watched::new(store, WATCHED) }
    }

    /// Whether `result_id` is in an open calibration, if that is known.
    pub fn holds(&self, result_id: &str) -> Option<bool> {
        self.kept.read(|kept| kept.as_ref().map(|ids| ids.contains(result_id)))
    }

    /// To take before [`InOpenCalibrations::load`] reads the database.
    pub fn generation(&self) -> u64 {
        self.kept.generation()
    }

    /// Reads the results in open calibrations and keeps them, unless a
    /// change came since `generation` (or there are too many), and says
    /// whether `result_id` is among them.
    pub fn load(&self, tx: &rusqlite::Connection, generation: u64, result_id: &str) -> Result<bool> {
        let ids = tx
            .prepare_cached(
                "SELECT cr.test_result_id FROM calibration_results cr
                 JOIN calibrations c ON c.id = cr.calibration_id AND c.status = 'open'
                 LIMIT ?1",
            )?
            .query_map([MAX_KEPT as i64 + 1], |r| r.get(0))?
            .collect::<rusqlite::Result<HashSet<String>>>()?;
        // Too many to read them all: as if it were held (the full check).
        let held = ids.len() > MAX_KEPT || ids.contains(result_id);
        self.keep(generation, ids);
        Ok(held)
    }

    fn keep(&self, generation: u64, ids: HashSet<String>) {
        if ids.len() <= MAX_KEPT {
            self.kept.keep(generation, |kept| *kept = Some(ids));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(of: &[&str]) -> HashSet<String> {
        of.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_is_kept_says_which_results_are_in_open_calibrations() {
        let open = InOpenCalibrations { kept: Arc::default() };
        assert_eq!(open.holds("trs_1"), None, "nothing known before a read");
        open.keep(open.generation(), ids(&["trs_1"]));
        assert_eq!((open.holds("trs_1"), open.holds("trs_2")), (Some(true), Some(false)));
    }

    #[test]
    fn a_read_that_began_before_a_change_is_not_kept() {
        let open = InOpenCalibrations { kept: Arc::default() };
        let before = open.generation();
        open.keep(before, ids(&[]));
        open.kept.reset();
        assert_eq!(open.holds("trs_1"), None, "a change empties what is kept");
        open.keep(before, ids(&[]));
        assert_eq!(open.holds("trs_1"), None, "read before the change: it may not have seen it");
        open.keep(open.generation(), ids(&["trs_1"]));
        assert_eq!(open.holds("trs_1"), Some(true));
    }

    #[test]
    fn too_many_are_not_kept() {
        let open = InOpenCalibrations { kept: Arc::default() };
        let many = (0..=MAX_KEPT).map(|i| format!("trs_{i}")).collect();
        open.keep(open.generation(), many);
        assert_eq!(open.holds("trs_1"), None);
    }
}
