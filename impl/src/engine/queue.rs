//! The run queue, in the database (DESIGN §5.2). Every function here runs
//! inside one write transaction of the caller's, so a claim, a finish, a
//! requeue or a cancel moves a run and its batch run's counts together.
//!
//! - **Claim**: a queued run becomes `running` with a lease (owner, expiry).
//!   Which one: among batch runs with queued work that are under their
//!   `concurrency` and whose user is under the per-user limit, the user with
//!   the fewest running runs goes first (fair between users), then the
//!   oldest batch run; inside it, runs go in the order they were queued.
//!   A batch's `concurrency` is the batch's: the running runs of every batch
//!   run of one batch count against it together (each batch run is held to
//!   the limit it was started with), so two batch runs of a batch under way
//!   at once make no more calls at once than one would.
//! - **Renew**: the owner pushes forward the leases of the runs it is still
//!   talking in (not every lease in its name: see [`renew`]).
//! - **Finish**: only the lease holder of the same attempt may finish a run,
//!   so a run is never finished twice, even if its lease expired and another
//!   worker took it over.
//! - **Requeue**: a run whose lease expired goes back to `queued` with
//!   `attempt + 1`; after [`MAX_ATTEMPTS`] it is `error`.
//! - When a batch run's last run ends, it is completed (or cancelled): its
//!   verdict is decided, unused credits are refunded, and a webhook delivery
//!   is queued if the project has a webhook.

use std::collections::HashMap;

use rusqlite::{params, OptionalExtension as _};
use serde_json::json;
use sparring_server::types;

use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::Result;
use crate::{credits, ids};

pub const MAX_ATTEMPTS: u32 = 3;

/// A run a worker took, with what it needs to start.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub run_id: String,
    pub batch_run_id: String,
    pub project_id: String,
    pub user_id: String,
    pub test_id: String,
    pub scenario_id: String,
    pub persona_id: Option<String>,
    pub iteration: u32,
    pub attempt: u32,
    pub call_id: String,
}

struct Active {
    id: String,
    user_id: String,
    /// What its `concurrency` limits: its batch (`b:` and the batch id)
    /// when it runs one, itself (`r:` and its id) otherwise.
    limited: String,
    running: i64,
    concurrency: i64,
    queued: i64,
}

pub fn now_ms() -> i64 {
    ids::now().timestamp_millis()
}

/// Claims up to `n` runs for `owner`.
pub fn claim(
    tx: &rusqlite::Transaction<'_>,
    owner: &str,
    n: usize,
    per_user: i64,
    lease_ms: i64,
) -> rusqlite::Result<Vec<Claimed>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut active: Vec<Active> = tx
        .prepare_cached(
            "SELECT id, user_id, running, concurrency, queued, batch_id FROM batch_runs
             WHERE status IN ('queued', 'running') ORDER BY id",
        )?
        .query_map([], |r| {
            let id: String = r.get(0)?;
            let batch_id: Option<String> = r.get(5)?;
            Ok(Active {
                limited: match batch_id {
                    Some(batch_id) => format!("b:{batch_id}"),
                    None => format!("r:{id}"),
                },
                id,
                user_id: r.get(1)?,
                running: r.get(2)?,
                concurrency: r.get(3)?,
                queued: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut user_running: HashMap<String, i64> = HashMap::new();
    let mut limited_running: HashMap<String, i64> = HashMap::new();
    for a in &active {
        *user_running.entry(a.user_id.clone()).or_default() += a.running;
        *limited_running.entry(a.limited.clone()).or_default() += a.running;
    }
    let now = ids::now();
    let now_text = ids::format_time(&now);
    let now_ms = now.timestamp_millis();
    let mut claimed = Vec::new();
    while claimed.len() < n {
        let pick = active
            .iter_mut()
            .filter(|a| {
                a.queued > 0 && limited_running[&a.limited] < a.concurrency && user_running[&a.user_id] < per_user
            })
            // The user with the fewest runs under way, and of theirs the
            // batch run with the fewest (the oldest of those): a user's
            // quick run started beside their own big batch run gets the
            // next slot they free, rather than wait for every run of the
            // big one to be claimed.
            .min_by(|a, b| {
                (user_running[&a.user_id], a.running, &a.id).cmp(&(user_running[&b.user_id], b.running, &b.id))
            });
        let Some(batch_run) = pick else { break };
        let next = tx
            .prepare_cached(
                "SELECT id, project_id, user_id, test_id, scenario_id, persona_id, iteration, attempt FROM runs
                 WHERE batch_run_id = ?1 AND status = 'queued' ORDER BY id LIMIT 1",
            )?
            .query_row(params![batch_run.id], |r| {
                Ok(Claimed {
                    run_id: r.get(0)?,
                    batch_run_id: batch_run.id.clone(),
                    project_id: r.get(1)?,
                    user_id: r.get(2)?,
                    test_id: r.get(3)?,
                    scenario_id: r.get(4)?,
                    persona_id: r.get(5)?,
                    iteration: r.get(6)?,
                    attempt: r.get(7)?,
                    call_id: ids::new_id("call"),
                })
            })
            .optional()?;
        let Some(run) = next else {
            // The counts said there was one; trust the rows.
            batch_run.queued = 0;
            continue;
        };
        tx.prepare_cached(
            "UPDATE runs SET status = 'running', lease_owner = ?2, lease_expires_ms = ?3, call_id = ?4,
                             started_at = ?5, started_ms = ?6, updated_at = ?5
             WHERE id = ?1",
        )?
        .execute(params![run.run_id, owner, now_ms + lease_ms, run.call_id, now_text, now_ms])?;
        tx.prepare_cached(
            "UPDATE batch_runs SET queued = queued - 1, running = running + 1, status = 'running',
                                   started_at = coalesce(started_at, ?2), updated_at = ?2
             WHERE id = ?1",
        )?
        .execute(params![batch_run.id, now_text])?;
        batch_run.queued -= 1;
        batch_run.running += 1;
        *user_running.get_mut(&batch_run.user_id).expect("every active user is counted") += 1;
        *limited_running.get_mut(&batch_run.limited).expect("every active limit is counted") += 1;
        claimed.push(run);
    }
    Ok(claimed)
}

/// Pushes forward the leases `owner` holds of these runs: those a task of
/// its own is still holding. A run the database says `owner` holds but no
/// task does (its task failed to load it or to record its end) is left to
/// expire, so that it is requeued and its batch run can end (and refund),
/// rather than stay `running` for as long as the process lives.
pub fn renew(
    tx: &rusqlite::Transaction<'_>,
    owner: &str,
    run_ids: &[String],
    lease_ms: i64,
) -> rusqlite::Result<usize> {
    let mut renew = tx.prepare_cached(
        "UPDATE runs SET lease_expires_ms = ?3 WHERE id = ?2 AND status = 'running' AND lease_owner = ?1",
    )?;
    let until = now_ms() + lease_ms;
    let mut n = 0;
    for id in run_ids {
        n += renew.execute(params![owner, id, until])?;
    }
    Ok(n)
}

/// How a run ended.
pub struct Finish<'a> {
    pub status: types::RunStatus,
    /// The result to store (absent when the conversation never happened).
    pub result: Option<&'a types::TestResult>,
    /// Why a run without a result ended (with a result, its
    /// `failure_reason` is kept with the run).
    pub error: Option<&'a str>,
    pub credits: i64,
    /// Whether a call was made: a connection to the agent, which was sent
    /// the claim's call id. A run that made none (cancelled or unable to
    /// start before its call, or its channel never connected) keeps no
    /// `call_id`: there was no call to name.
    pub call_made: bool,
}

/// Ends a claimed run. Returns false (and changes nothing) when the run is
/// no longer this worker's: its lease expired and it was requeued or taken
/// over, or it was already finished.
pub fn finish(tx: &rusqlite::Transaction<'_>, owner: &str, run: &Claimed, end: Finish<'_>) -> Result<bool> {
    let held: Option<bool> = tx
        .prepare_cached("SELECT status = 'running' AND lease_owner = ?2 AND attempt = ?3 FROM runs WHERE id = ?1")?
        .query_row(params![run.run_id, owner, run.attempt], |r| r.get(0))
        .optional()?;
    if held != Some(true) {
        return Ok(false);
    }
    let now = ids::now();
    let now_text = ids::format_time(&now);
    if let Some(result) = end.result {
        let document =
            serde_json::to_string(result).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        tx.prepare_cached(
            "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status, created_at, document)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            result.id,
            result.project_id,
            result.run_id,
            result.batch_run_id,
            result.test_id,
            result.call_id,
            result.status.unwrap_or(types::TestResultStatus::Error).to_string(),
            ids::format_time(&result.created_at),
            document
        ])?;
        crate::reviews::keep_verdicts(tx, result)?;
    }
    // Why it failed is kept with the run too: a batch run's failures per
    // test (`runs::first_failures`) read it from here, not out of the
    // result's document (up to a call's record in size).
    let error = end.error.or_else(|| end.result.and_then(|r| r.failure_reason.as_deref()));
    tx.prepare_cached(
        "UPDATE runs SET status = ?2, test_result_id = ?3, error = ?4, credits = ?5, lease_owner = NULL,
                         lease_expires_ms = NULL, finished_at = ?6, finished_ms = ?7, updated_at = ?6,
                         call_id = CASE WHEN ?8 THEN call_id END
         WHERE id = ?1",
    )?
    .execute(params![
        run.run_id,
        end.status.to_string(),
        end.result.map(|r| r.id.clone()),
        error,
        end.credits,
        now_text,
        now.timestamp_millis(),
        end.call_made
    ])?;
    let counter = counter_of(end.status);
    tx.prepare_cached(&format!(
        "UPDATE batch_runs SET running = running - 1, {counter} = {counter} + 1,
                               credits_charged = credits_charged + ?2, updated_at = ?3
         WHERE id = ?1"
    ))?
    .execute(params![run.batch_run_id, end.credits, now_text])?;
    maybe_complete(tx, &run.batch_run_id)?;
    Ok(true)
}

fn counter_of(status: types::RunStatus) -> &'static str {
    match status {
        types::RunStatus::Passed => "passed",
        types::RunStatus::Failed => "failed",
        types::RunStatus::Cancelled => "cancelled",
        // Queued and running never end a run; count them as errors rather
        // than lose them.
        types::RunStatus::Error | types::RunStatus::Queued | types::RunStatus::Running => "errored",
    }
}

/// Runs whose lease expired before `before_ms` go back to the queue with one
/// more attempt, or end in `error` after [`MAX_ATTEMPTS`], or end
/// `cancelled` when their batch run was cancelled. Returns how many moved.
pub fn requeue_expired(tx: &rusqlite::Transaction<'_>, before_ms: i64) -> Result<usize> {
    let expired: Vec<(String, String, u32, bool)> = tx
        .prepare_cached(
            "SELECT r.id, r.batch_run_id, r.attempt, b.cancel_requested FROM runs r
             JOIN batch_runs b ON b.id = r.batch_run_id
             WHERE r.status = 'running' AND r.lease_expires_ms < ?1",
        )?
        .query_map(params![before_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let now = ids::now();
    let now_text = ids::format_time(&now);
    for (run_id, batch_run_id, attempt, cancelled) in &expired {
        if *cancelled || *attempt >= MAX_ATTEMPTS {
            let (status, counter, error) = if *cancelled {
                ("cancelled", "cancelled", "cancelled while its worker was gone".to_string())
            } else {
                (
                    "error",
                    "errored",
                    format!("the server running it stopped {MAX_ATTEMPTS} times before the conversation ended"),
                )
            };
            end_held(tx, run_id, batch_run_id, (status, counter), &error, now)?;
        } else {
            tx.prepare_cached(
                "UPDATE runs SET status = 'queued', attempt = attempt + 1, lease_owner = NULL, lease_expires_ms = NULL,
                                 call_id = NULL, started_at = NULL, started_ms = NULL, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![run_id, now_text])?;
            tx.prepare_cached(
                "UPDATE batch_runs SET running = running - 1, queued = queued + 1, updated_at = ?2 WHERE id = ?1",
            )?
            .execute(params![batch_run_id, now_text])?;
        }
        maybe_complete(tx, batch_run_id)?;
    }
    Ok(expired.len())
}

/// Ends a running run that will have no result (`status`, counted in its
/// batch run's `counter`), saying why in its `error`. The caller then calls
/// [`maybe_complete`].
fn end_held(
    tx: &rusqlite::Transaction<'_>,
    run_id: &str,
    batch_run_id: &str,
    (status, counter): (&str, &str),
    error: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let now_text = ids::format_time(&now);
    tx.prepare_cached(
        "UPDATE runs SET status = ?2, error = ?3, lease_owner = NULL, lease_expires_ms = NULL,
                         finished_at = ?4, finished_ms = ?5, updated_at = ?4
         WHERE id = ?1",
    )?
    .execute(params![run_id, status, error, now_text, now.timestamp_millis()])?;
    tx.prepare_cached(&format!(
        "UPDATE batch_runs SET running = running - 1, {counter} = {counter} + 1, updated_at = ?2 WHERE id = ?1"
    ))?
    .execute(params![batch_run_id, now_text])?;
    Ok(())
}

/// Cancels a batch run: its queued runs end `cancelled` now; returns the
/// ids of its running runs, which stop at their next turn.
pub fn cancel(tx: &rusqlite::Transaction<'_>, batch_run_id: &str) -> Result<Vec<String>> {
    let now = ids::now();
    let now_text = ids::format_time(&now);
    let n = tx
        .prepare_cached(
            "UPDATE runs SET status = 'cancelled', error = 'cancelled before it started', finished_at = ?2,
                             finished_ms = ?3, updated_at = ?2
             WHERE batch_run_id = ?1 AND status = 'queued'",
        )?
        .execute(params![batch_run_id, now_text, now.timestamp_millis()])?;
    tx.prepare_cached(
        "UPDATE batch_runs SET cancel_requested = 1, queued = queued - ?2, cancelled = cancelled + ?2, updated_at = ?3
         WHERE id = ?1",
    )?
    .execute(params![batch_run_id, n as i64, now_text])?;
    let running = running(tx, batch_run_id)?;
    maybe_complete(tx, batch_run_id)?;
    Ok(running)
}

/// The ids of the batch run's running runs.
pub fn running(tx: &rusqlite::Connection, batch_run_id: &str) -> rusqlite::Result<Vec<String>> {
    tx.prepare_cached("SELECT id FROM runs WHERE batch_run_id = ?1 AND status = 'running'")?
        .query_map(params![batch_run_id], |r| r.get(0))?
        .collect()
}

/// Whether the batch run `id` has been asked to stop.
pub fn cancel_requested(tx: &rusqlite::Connection, batch_run_id: &str) -> rusqlite::Result<bool> {
    tx.prepare_cached("SELECT cancel_requested FROM batch_runs WHERE id = ?1")?
        .query_row(params![batch_run_id], |r| r.get(0))
        .optional()
        .map(|c| c.unwrap_or(true))
}

/// When nothing of the batch run is queued or running any more: decide its
/// verdict, refund unused credits, record it, and queue its webhook.
fn maybe_complete(tx: &rusqlite::Transaction<'_>, batch_run_id: &str) -> Result<()> {
    struct Ending {
        status: String,
        /// Who the credits were reserved from.
        payer_id: String,
        project_id: String,
        unfinished: i64,
        cancel_requested: bool,
        reserved: i64,
        charged: i64,
    }
    let row = tx
        .prepare_cached(
            "SELECT status, coalesce(payer_id, user_id), project_id, queued + running, cancel_requested,
                    credits_reserved, credits_charged
             FROM batch_runs WHERE id = ?1",
        )?
        .query_row(params![batch_run_id], |r| {
            Ok(Ending {
                status: r.get(0)?,
                payer_id: r.get(1)?,
                project_id: r.get(2)?,
                unfinished: r.get(3)?,
                cancel_requested: r.get(4)?,
                reserved: r.get(5)?,
                charged: r.get(6)?,
            })
        })
        .optional()?;
    let Some(Ending { status, payer_id, project_id, unfinished, cancel_requested, reserved, charged }) = row else {
        return Ok(());
    };
    let unused = reserved - charged;
    if unfinished > 0 || !(status == "queued" || status == "running") {
        return Ok(());
    }
    // Every test met its threshold over the runs it had.
    let tests: Vec<(i64, i64, f64)> = tx
        .prepare_cached(&format!(
            "SELECT coalesce(a.passed, 0), coalesce(a.total, 0), t.pass_threshold FROM {}",
            crate::runs::TESTS_WITH_COUNTS
        ))?
        .query_map(params![batch_run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let verdict = !cancel_requested
        && tests
            .iter()
            .all(|(passed, total, threshold)| super::evaluate::test_passed(*passed as u32, *total as u32, *threshold));
    let final_status = if cancel_requested { "cancelled" } else { "completed" };
    let now_text = ids::format_time(&ids::now());
    tx.prepare_cached(
        "UPDATE batch_runs SET status = ?2, verdict = ?3, finished_at = ?4, updated_at = ?4 WHERE id = ?1",
    )?
    .execute(params![batch_run_id, final_status, verdict, now_text])?;
    if unused > 0 {
        credits::append(
            tx,
            &payer_id,
            types::TransactionKind::Refund,
            unused,
            &format!(
                "unused part of the reservation of {} ({reserved} reserved, {charged} used)",
                credits::batch_run_named(tx, batch_run_id, &project_id)?
            ),
            Some(batch_run_id),
        )?;
    }
    let run = crate::runs::load_batch_run(tx, batch_run_id)?;
    activity::record(
        tx,
        &Actor::System,
        Record {
            action: "batch_run.complete",
            resource_type: "batch_run",
            resource_id: batch_run_id,
            project_id: Some(&project_id),
            summary: format!(
                "batch run {batch_run_id} {final_status}: {} passed, {} failed, {} errors, {} cancelled; {}",
                run.counts.passed.unwrap_or_default(),
                run.counts.failed.unwrap_or_default(),
                run.counts.errored.unwrap_or_default(),
                run.counts.cancelled,
                if verdict { "passed" } else { "did not pass" }
            ),
            changes: json!({"status": final_status, "passed": verdict, "credits_charged": charged,
                            "credits_refunded": unused.max(0)})
            .into(),
        },
    )?;
    super::webhooks::enqueue(tx, &project_id, &run)?;
    Ok(())
}

/// On a clean shutdown: the runs `owner` holds go back to the queue with the
/// same attempt (they did not fail; the server stopped), but for those of a
/// cancelled batch run, which end `cancelled` (as they would have at their
/// next turn).
pub fn release(tx: &rusqlite::Transaction<'_>, owner: &str) -> Result<usize> {
    let held: Vec<(String, String, bool)> = tx
        .prepare_cached(
            "SELECT r.id, r.batch_run_id, b.cancel_requested FROM runs r JOIN batch_runs b ON b.id = r.batch_run_id
             WHERE r.status = 'running' AND r.lease_owner = ?1",
        )?
        .query_map(params![owner], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let now = ids::now();
    let now_text = ids::format_time(&now);
    for (run_id, batch_run_id, cancelled) in &held {
        if *cancelled {
            let why = "cancelled; the server stopped before its next turn";
            end_held(tx, run_id, batch_run_id, ("cancelled", "cancelled"), why, now)?;
            maybe_complete(tx, batch_run_id)?;
            continue;
        }
        tx.prepare_cached(
            "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_ms = NULL, call_id = NULL,
                             started_at = NULL, started_ms = NULL, updated_at = ?2
             WHERE id = ?1",
        )?
        .execute(params![run_id, now_text])?;
        tx.prepare_cached(
            "UPDATE batch_runs SET running = running - 1, queued = queued + 1, updated_at = ?2 WHERE id = ?1",
        )?
        .execute(params![batch_run_id, now_text])?;
    }
    Ok(held.len())
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::{claim, finish, Claimed, Finish};
    use crate::failure::Failure;
    use sparring_server::types;

    /// A store holding a project of the users `usr_a` and `usr_b`.
    fn a_store() -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_a', 'a', 't'), ('usr_b', 'b', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);",
                )?;
                Ok(())
            })
            .unwrap();
        (dir, store)
    }

    /// Queues the batch run `id` of `user`, `runs` runs at most
    /// `concurrency` at once.
    fn queue(store: &crate::store::Store, id: &str, user: &str, runs: usize, concurrency: i64) {
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute(
                    "INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, total, queued,
                                             metadata, created_at, updated_at)
                     VALUES (?1, 'prj_1', ?2, 'test', 'queued', ?3, ?4, ?4, '{}', 't', 't')",
                    params![id, user, concurrency, runs as i64],
                )?;
                let mut insert = tx.prepare(
                    "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration,
                                       status, queued_at, queued_ms, created_at, updated_at)
                     VALUES (?1, ?2, 'prj_1', ?3, 'tst_1', 'scn_1', ?4, 'queued', 't', 0, 't', 't')",
                )?;
                for i in 0..runs {
                    insert.execute(params![format!("run_{id}_{i:05}"), id, user, i as i64 + 1])?;
                }
                Ok(())
            })
            .unwrap();
    }

    fn claim_n(store: &crate::store::Store, n: usize, per_user: i64) -> Vec<Claimed> {
        store.write_blocking::<_, Failure, _>(|tx| Ok(claim(tx, "wrk_1", n, per_user, 60_000)?)).unwrap()
    }

    /// Ends a claimed run, passed: its slot is free.
    fn passed(store: &crate::store::Store, run: &Claimed) {
        store
            .write_blocking::<_, Failure, _>(|tx| {
                let end =
                    Finish { status: types::RunStatus::Passed, result: None, error: None, credits: 1, call_made: true };
                assert!(finish(tx, "wrk_1", run, end)?);
                Ok(())
            })
            .unwrap();
    }

    fn of(claimed: &[Claimed], user: &str) -> usize {
        claimed.iter().filter(|c| c.user_id == user).count()
    }

    /// One user's batch run of 10,000 runs, queued first, does not keep
    /// another user's one run waiting: counted in claims, not timed. With
    /// four workers free, the other's run is among the first four claimed;
    /// with every worker taken by the first user, it is the next one
    /// claimed, as soon as one of those runs ends; and one user never holds
    /// more than the per-user limit, whatever its batch's concurrency.
    #[test]
    fn a_users_big_batch_does_not_starve_anothers_run() {
        let (_dir, store) = a_store();
        queue(&store, "brn_1a", "usr_a", 10_000, 1000);
        queue(&store, "brn_2b", "usr_b", 1, 10);
        let first = claim_n(&store, 4, 128);
        assert_eq!((of(&first, "usr_a"), of(&first, "usr_b")), (3, 1));

        let (_dir, store) = a_store();
        queue(&store, "brn_1a", "usr_a", 10_000, 1000);
        let taken = claim_n(&store, 4, 128);
        assert_eq!(of(&taken, "usr_a"), 4, "every worker taken by the first user");
        queue(&store, "brn_2b", "usr_b", 1, 10);
        passed(&store, &taken[0]);
        let next = claim_n(&store, 1, 128);
        assert_eq!(of(&next, "usr_b"), 1, "the freed worker goes to the user with nothing running");

        let (_dir, store) = a_store();
        queue(&store, "brn_1a", "usr_a", 10_000, 1000);
        queue(&store, "brn_2b", "usr_b", 1, 10);
        let all = claim_n(&store, 300, 128);
        assert_eq!((of(&all, "usr_a"), of(&all, "usr_b")), (128, 1), "the per-user limit holds");
        let counts: (i64, i64) = store
            .read_blocking::<_, Failure, _>(|tx| {
                Ok(tx.query_row("SELECT queued, running FROM batch_runs WHERE id = 'brn_1a'", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?)
            })
            .unwrap();
        assert_eq!(counts, (10_000 - 128, 128));
    }

    /// Nor does a user's own big batch run keep their quick one waiting:
    /// with every slot of theirs taken by the big one, queued first, the
    /// quick one's run is the next claimed when one frees; and two batch
    /// runs of one user share the slots that user has.
    #[test]
    fn a_users_big_batch_run_does_not_starve_their_own_quick_one() {
        let (_dir, store) = a_store();
        queue(&store, "brn_1big", "usr_a", 10_000, 1000);
        let taken = claim_n(&store, 4, 4);
        assert_eq!(taken.len(), 4, "the user's limit taken by the big one");
        queue(&store, "brn_2quick", "usr_a", 1, 10);
        assert!(claim_n(&store, 4, 4).is_empty(), "the user's limit holds");
        passed(&store, &taken[0]);
        let next = claim_n(&store, 4, 4);
        let batch_runs: Vec<&str> = next.iter().map(|c| c.batch_run_id.as_str()).collect();
        assert_eq!(batch_runs, ["brn_2quick"], "the slot freed goes to the batch run with nothing running");

        let (_dir, store) = a_store();
        queue(&store, "brn_1big", "usr_a", 10_000, 1000);
        queue(&store, "brn_2other", "usr_a", 10_000, 1000);
        let both = claim_n(&store, 10, 128);
        let of_batch_run = |id: &str| both.iter().filter(|c| c.batch_run_id == id).count();
        assert_eq!((of_batch_run("brn_1big"), of_batch_run("brn_2other")), (5, 5));
    }
}
