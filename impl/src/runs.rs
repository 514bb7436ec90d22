//! Batch runs, the runs inside them and their test results, as the API
//! shows them; starting and cancelling batch runs.
//!
//! Starting (`POST /batches/{id}/run`, `/channels/{id}/run`,
//! `/tests/{id}/run`) is one write transaction: the tests are expanded into
//! runs (test × persona × iteration), the worst case is priced (every
//! conversation lasting its longest: the smallest of the scenario's, the
//! channel's and the project's limits, 1 credit per started minute) and
//! reserved from the credits of the project's payer (`credits::payer_of`,
//! fixed in `batch_runs.payer_id`, who gets the refund), whoever starts it,
//! and the batch run and its runs are written. The price is known from what tests and scenarios keep beside
//! their documents (`price`), before any document is read: when the credits
//! do not cover it, the batch run is recorded as `insufficient_credits` with
//! each test's name and pass threshold, nothing is queued, and the answer
//! is 402; such a batch run is no run of its batch (`Batch::last_run`). The
//! workers (see `engine::worker`) take it from there.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, Caller, Json};

use crate::access::{self, Need, Role};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, InvalidCursor, PageRequest, PageSql, AFTER};
use crate::{credits, ids, written, AppState};

/// Most runs one request may queue.
pub const MAX_RUNS_PER_REQUEST: usize = 10_000;
/// Largest `metadata` accepted, serialized.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// What a run request starts from.
struct Source {
    kind: types::BatchRunSource,
    resource_id: String,
    project_id: String,
    batch_id: Option<String>,
    channel_id: Option<String>,
    test_id: Option<String>,
    concurrency: u32,
    test_ids: Vec<String>,
}

fn metadata(given: Map<String, Value>) -> Result<Map<String, Value>> {
    let size = serde_json::to_string(&given).map(|s| s.len()).unwrap_or(usize::MAX);
    if size > MAX_METADATA_BYTES {
        return Err(Failure::invalid(
            "metadata",
            format_args!("at most {MAX_METADATA_BYTES} bytes of JSON, got {size}"),
        ));
    }
    // Kept with the batch run and its activity record, and shown in their
    // lists: as shallow as every free-form object.
    crate::validate::free_form("metadata", &given)?;
    Ok(given)
}

/// One test of a start, as priced: what its runs are made of.
struct Priced {
    test_id: String,
    scenario_id: String,
    /// Who calls, each in `iterations` runs (`None`: the scenario has no
    /// persona).
    personas: Vec<Option<String>>,
    iterations: u32,
    /// The longest its conversations may last, as priced.
    max_duration_s: u32,
}

/// What a start reads of a test to price it: columns kept beside its
/// document, never the document decoded. (`iterations`, added after the
/// document, is reached through the row's pages, copied, not parsed; an
/// index covering it would cost every create of a test a B-tree more.)
pub(crate) const PRICE_TEST_SQL: &str = "SELECT iterations, channel_id, scenario_id FROM tests WHERE id = ?1";
/// What a start reads of a scenario to price it, from `scenarios_priced`
/// alone (the row holds its steps).
pub(crate) const PRICE_SCENARIO_SQL: &str =
    "SELECT default_persona_id, max_duration_s FROM scenarios INDEXED BY scenarios_priced WHERE id = ?1";
/// What a batch run (`?1`) keeps of a test (`?2`) as it was when its runs
/// were queued: a change to the test while they wait does not change what
/// they run (its channel) or how they are judged (its evaluators, copied as
/// the JSON they are in its document).
pub(crate) const QUEUED_TEST_SQL: &str =
    "INSERT INTO batch_run_tests (batch_run_id, test_id, pass_threshold, channel_id, evaluators, name)
     SELECT ?1, id, pass_threshold, channel_id, json_extract(document, '$.evaluators'), name FROM tests WHERE id = ?2";
/// What a start refused for credits keeps of a test (`?2`): its name and
/// pass threshold, shown with the batch run (`?1`), from its columns too.
/// No channel and no evaluators: it queued no run to use them.
pub(crate) const REFUSED_TEST_SQL: &str = "INSERT INTO batch_run_tests (batch_run_id, test_id, pass_threshold, name)
     SELECT ?1, id, pass_threshold, name FROM tests WHERE id = ?2";

/// The tests of a start as priced, how many runs they make, and the credits
/// their worst case needs (every conversation at its longest: the least of
/// the scenario's, the channel's and the project's limits). Read from what
/// tests and scenarios keep beside their documents, never the documents:
/// whether the start is paid for is known before anything proportional to
/// them is read.
fn price(tx: &rusqlite::Transaction<'_>, project_id: &str, test_ids: &[String]) -> Result<(Vec<Priced>, usize, i64)> {
    let project_limit: u32 =
        tx.query_row("SELECT max_call_duration_s FROM projects WHERE id = ?1", params![project_id], |r| r.get(0))?;
    let mut priced = Vec::with_capacity(test_ids.len());
    let (mut runs, mut worst) = (0usize, 0i64);
    // Each scenario and channel read once however many tests share it.
    let mut scenarios: HashMap<String, (Option<String>, u32)> = HashMap::new();
    let mut channels: HashMap<String, (types::ChannelKind, u32)> = HashMap::new();
    for (i, test_id) in test_ids.iter().enumerate() {
        let field = format!("test_ids[{i}]");
        access::require_reference(tx, "tests", &field, test_id, project_id)?;
        let (iterations, channel_id, scenario_id): (u32, String, String) = tx
            .prepare_cached(PRICE_TEST_SQL)?
            .query_row(params![test_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        let (default_persona_id, scenario_limit) = match scenarios.get(&scenario_id) {
            Some(known) => known.clone(),
            None => {
                let known: (Option<String>, u32) = tx
                    .prepare_cached(PRICE_SCENARIO_SQL)?
                    .query_row(params![scenario_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                scenarios.insert(scenario_id.clone(), known.clone());
                known
            }
        };
        let (kind, channel_limit) = match channels.get(&channel_id) {
            Some(known) => *known,
            None => {
                let (kind, limit): (String, u32) = tx
                    .prepare_cached("SELECT kind, max_call_duration_s FROM channels WHERE id = ?1")?
                    .query_row(params![channel_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let known = (kind.parse::<types::ChannelKind>().map_err(|e| conversion(0, e))?, limit);
                channels.insert(channel_id.clone(), known);
                known
            }
        };
        if !matches!(kind, types::ChannelKind::Http | types::ChannelKind::Websocket) {
            return Err(Failure::Unsupported(format!(
                "test `{test_id}` uses channel `{channel_id}` of kind `{kind}`: calls over `phone` and `sip` \
                 channels are not built yet; use an `http` or `websocket` channel"
            )));
        }
        let named: Vec<String> = tx
            .prepare_cached("SELECT persona_id FROM test_personas WHERE test_id = ?1 ORDER BY position")?
            .query_map(params![test_id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let personas = if named.is_empty() { vec![default_persona_id] } else { named.into_iter().map(Some).collect() };
        let limit = scenario_limit.min(channel_limit).min(project_limit);
        let n = personas.len() * iterations as usize;
        runs += n;
        worst += n as i64 * credits::worst_case(limit);
        if runs > MAX_RUNS_PER_REQUEST {
            // Not a field of the request: the batch's or channel's tests.
            return Err(Failure::Invalid {
                code: "too_many_runs".into(),
                message: format!(
                    "these tests make more than {MAX_RUNS_PER_REQUEST} runs (tests × personas × iterations), more \
                     than one batch run holds; split them over several batches, or run fewer iterations"
                ),
            });
        }
        priced.push(Priced { test_id: test_id.clone(), scenario_id, personas, iterations, max_duration_s: limit });
    }
    if runs == 0 {
        return Err(Failure::Conflict { code: "nothing_to_run", message: "there are no tests to run".into() });
    }
    Ok((priced, runs, worst))
}

/// What a start's transaction did.
enum Started {
    New {
        run: types::BatchRun,
        enough: bool,
        worst: i64,
        short: String,
    },
    /// The request repeated one with the same `Idempotency-Key`: the batch
    /// run that one started, as the caller may see it now.
    Replayed(types::BatchRun),
}

/// How long an `Idempotency-Key` is remembered.
const IDEMPOTENCY_KEY_KEPT_MS: i64 = 24 * 60 * 60 * 1000;
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// A start's `Idempotency-Key` with the request it was sent with.
struct Idempotency {
    key: String,
    /// blake3 of the operation, its path id and its body as JSON.
    request: String,
}

impl Idempotency {
    /// The key given with `operation` on `path_id` with `body`, if one was:
    /// 1 to 255 visible ASCII characters.
    fn of(key: Option<String>, operation: &str, path_id: &str, body: &impl serde::Serialize) -> Result<Option<Self>> {
        let Some(key) = key else { return Ok(None) };
        // Said as what is wrong with it: a key of a good length with a
        // space in it is not "got 9 bytes".
        let wrong = if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_CHARS {
            Some(format!("got {} characters", key.len()))
        } else {
            key.bytes().position(|b| !b.is_ascii_graphic()).map(|at| format!("character {} is not", at + 1))
        };
        if let Some(wrong) = wrong {
            return Err(Failure::Invalid {
                code: "invalid_idempotency_key".into(),
                message: format!(
                    "header `Idempotency-Key` must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters \
                     (no spaces): {wrong}"
                ),
            });
        }
        // Cannot fail: a request body is JSON already.
        let body = serde_json::to_string(body)
            .map_err(|e| Failure::Invalid { code: "invalid_body".into(), message: e.to_string() })?;
        let mut hash = blake3::Hasher::new();
        for part in [operation, path_id, &body] {
            hash.update(&(part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        Ok(Some(Idempotency { key, request: hash.finalize().to_hex().to_string() }))
    }

    /// The batch run an earlier request with this key started, if one did
    /// within the last 24 hours; a 409 if that request was another.
    fn replay(&self, tx: &rusqlite::Transaction<'_>, user_id: &str) -> Result<Option<types::BatchRun>> {
        let oldest = ids::now().timestamp_millis() - IDEMPOTENCY_KEY_KEPT_MS;
        tx.prepare_cached("DELETE FROM idempotency_keys WHERE created_ms < ?1")?.execute(params![oldest])?;
        let earlier: Option<(String, String)> = tx
            .prepare_cached("SELECT request, batch_run_id FROM idempotency_keys WHERE user_id = ?1 AND key = ?2")?
            .query_row(params![user_id, self.key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((request, batch_run_id)) = earlier else { return Ok(None) };
        if request != self.request {
            return Err(Failure::Conflict {
                code: "idempotency_key_reused",
                message: format!(
                    "this Idempotency-Key started batch run {batch_run_id} with another request (operation, path \
                     or body); use a new key for a new start"
                ),
            });
        }
        access::require_resource(tx, user_id, "batch_runs", "batch run", &batch_run_id, Need::Read)?;
        Ok(Some(seen_by(tx, user_id, load_batch_run(tx, &batch_run_id)?)?))
    }

    /// Remembers that this key started `batch_run_id`.
    fn keep(&self, tx: &rusqlite::Transaction<'_>, user_id: &str, batch_run_id: &str) -> Result<()> {
        tx.prepare_cached(
            "INSERT INTO idempotency_keys (user_id, key, request, batch_run_id, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![user_id, self.key, self.request, batch_run_id, ids::now().timestamp_millis()])?;
        Ok(())
    }
}

/// A start's transaction once its source is known: prices its tests,
/// records the batch run (queued, or refused for credits) and, when the
/// credits cover it, reserves them and queues its runs.
fn begin(
    tx: &rusqlite::Transaction<'_>,
    caller: Caller,
    idempotency: Option<&Idempotency>,
    source: Source,
    metadata: Map<String, Value>,
    id: &str,
) -> Result<Started> {
    let (priced, n, worst) = price(tx, &source.project_id, &source.test_ids)?;
    let now = ids::now();
    let now_text = ids::format_time(&now);
    let now_ms = now.timestamp_millis();
    let payer = credits::payer_of(tx, &source.project_id)?;
    let balance = credits::balance(tx, &payer)?;
    let enough = balance >= worst;
    // Only the payer learns their balance.
    let short = if payer == caller.user_id {
        format!("you have {balance}")
    } else {
        "the project's owner, who pays for its runs, has fewer".to_string()
    };
    let status = if enough { "queued" } else { "insufficient_credits" };
    let n = n as i64;
    tx.execute(
        "INSERT INTO batch_runs (id, project_id, user_id, source, batch_id, channel_id, test_id, status,
                                 concurrency, total, queued, cancelled, metadata, credits_reserved,
                                 finished_at, created_at, updated_at, payer_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 0, ?12, ?13, ?14, ?15, ?15, ?16)",
        params![
            id,
            source.project_id,
            caller.user_id,
            source.kind.to_string(),
            source.batch_id,
            source.channel_id,
            source.test_id,
            status,
            source.concurrency,
            if enough { n } else { 0 },
            if enough { n } else { 0 },
            Value::Object(metadata.clone()).to_string(),
            if enough { worst } else { 0 },
            (!enough).then(|| now_text.clone()),
            now_text,
            payer,
        ],
    )?;
    // Paid: each test as its runs will run it, its channel and evaluators
    // too, copied row by row inside SQLite, never held here (a test's
    // evaluators may be a megabyte, and a batch holds a thousand tests).
    // Refused for credits: nothing was queued (and the start is free to
    // repeat), so only what it shows of each test, read beside the test's
    // document.
    let mut insert_test = tx.prepare_cached(if enough { QUEUED_TEST_SQL } else { REFUSED_TEST_SQL })?;
    for t in &priced {
        insert_test.execute(params![id, t.test_id])?;
    }
    if enough {
        credits::append(
            tx,
            &payer,
            types::TransactionKind::Reservation,
            -worst,
            &format!("reserved for {n} conversations of {}", credits::batch_run_named(tx, id, &source.project_id)?),
            Some(id),
        )?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, persona_id,
                               iteration, status, queued_at, queued_ms, created_at, updated_at, max_duration_s)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'queued', ?9, ?10, ?9, ?9, ?11)",
        )?;
        for t in &priced {
            for persona in &t.personas {
                for iteration in 1..=t.iterations {
                    insert.execute(params![
                        ids::new_id("run"),
                        id,
                        source.project_id,
                        caller.user_id,
                        t.test_id,
                        t.scenario_id,
                        persona,
                        iteration,
                        now_text,
                        now_ms,
                        t.max_duration_s
                    ])?;
                }
            }
        }
    }
    if let Some(idempotency) = idempotency {
        idempotency.keep(tx, &caller.user_id, id)?;
    }
    let resource_type = source.kind.to_string();
    let summary = if enough {
        format!("started batch run {id}: {n} conversations, {worst} credits reserved")
    } else {
        // Read by every member: no one's balance.
        format!("batch run {id} not started: {worst} credits needed, more than the project's owner has")
    };
    activity::record(
        tx,
        &Actor::Caller(caller),
        Record {
            action: &format!("{resource_type}.run"),
            resource_type: &resource_type,
            resource_id: &source.resource_id,
            project_id: Some(&source.project_id),
            summary,
            changes: json!({"batch_run_id": id, "status": status, "runs": n, "credits_needed": worst,
                            "metadata": metadata})
            .into(),
        },
    )?;
    let run = load_batch_run(tx, id)?;
    Ok(Started::New { run, enough, worst, short })
}

/// Starts a batch run: checks, prices, reserves and queues in one
/// transaction; wakes the workers after.
async fn start(
    state: &AppState,
    caller: Caller,
    idempotency: Option<Idempotency>,
    resolve: impl FnOnce(&rusqlite::Transaction<'_>, &str) -> Result<Source> + Send + 'static,
    metadata: Map<String, Value>,
) -> Result<types::BatchRun> {
    let id = ids::new_id("brn");
    let started = state
        .store
        .write(move |tx| {
            if let Some(idempotency) = &idempotency {
                if let Some(run) = idempotency.replay(tx, &caller.user_id)? {
                    return Ok(Started::Replayed(run));
                }
            }
            let source = resolve(tx, &caller.user_id)?;
            begin(tx, caller, idempotency.as_ref(), source, metadata, &id)
        })
        .await?;
    let (run, enough, worst, short) = match started {
        Started::New { run, enough, worst, short } => (run, enough, worst, short),
        Started::Replayed(run) if run.status == types::BatchRunStatus::InsufficientCredits => {
            return Err(Failure::InsufficientCredits(format!(
                "batch run {}, started by an earlier request with this Idempotency-Key, is recorded as \
                 insufficient_credits and nothing was queued",
                run.id
            )));
        }
        Started::Replayed(run) => return Ok(run),
    };
    if !enough {
        return Err(Failure::InsufficientCredits(format!(
            "the run needs up to {worst} credits (every conversation at its longest) and {short}; \
             batch run {} is recorded as insufficient_credits and nothing was queued",
            run.id
        )));
    }
    state.engine.wake();
    Ok(run)
}

pub async fn run_batch(
    state: &AppState,
    caller: Caller,
    path: p::RunBatchPath,
    headers: p::RunBatchHeaders,
    body: types::RunBatchRequest,
) -> Result<types::BatchRun> {
    let idempotency = Idempotency::of(headers.idempotency_key, "run_batch", &path.id, &body)?;
    let metadata = metadata(body.metadata)?;
    start(
        state,
        caller,
        idempotency,
        move |tx, user_id| {
            let (project_id, _) = access::require_resource(tx, user_id, "batches", "batch", &path.id, Need::Edit)?;
            let batch = crate::batches::load(tx, user_id, &path.id)?;
            Ok(Source {
                kind: types::BatchRunSource::Batch,
                resource_id: batch.id.clone(),
                project_id,
                batch_id: Some(batch.id),
                channel_id: None,
                test_id: None,
                concurrency: batch.concurrency.get(),
                test_ids: batch.test_ids,
            })
        },
        metadata,
    )
    .await
}

fn project_concurrency(tx: &rusqlite::Transaction<'_>, project_id: &str) -> Result<u32> {
    Ok(tx.query_row("SELECT default_concurrency FROM projects WHERE id = ?1", params![project_id], |r| r.get(0))?)
}

pub async fn run_channel(
    state: &AppState,
    caller: Caller,
    path: p::RunChannelPath,
    headers: p::RunChannelHeaders,
    body: types::RunChannelRequest,
) -> Result<types::BatchRun> {
    let idempotency = Idempotency::of(headers.idempotency_key, "run_channel", &path.id, &body)?;
    let metadata = metadata(body.metadata)?;
    // Absent (or null): every test of the channel. An empty list is a
    // selection of nothing (a CI filter that matched no test), refused
    // rather than read as all of them, and paid for.
    let named = body.test_ids;
    match named.as_ref().map(Vec::len) {
        Some(0) => {
            return Err(Failure::invalid(
                "test_ids",
                "an empty list selects no test; leave test_ids out to run all of the channel's",
            ))
        }
        // As many as a batch holds.
        Some(n) if n > crate::batches::MAX_TESTS => {
            return Err(Failure::invalid(
                "test_ids",
                format_args!("at most {} tests, got {n}", crate::batches::MAX_TESTS),
            ))
        }
        _ => {}
    }
    start(
        state,
        caller,
        idempotency,
        move |tx, user_id| {
            let (project_id, _) = access::require_resource(tx, user_id, "channels", "channel", &path.id, Need::Edit)?;
            let test_ids: Vec<String> = if let Some(named) = &named {
                let mut seen = std::collections::HashSet::with_capacity(named.len());
                for (i, test_id) in named.iter().enumerate() {
                    let field = format!("test_ids[{i}]");
                    // As in a batch: each test once (a repeat would run, and
                    // be paid for, twice).
                    if !seen.insert(test_id.as_str()) {
                        return Err(Failure::invalid(&field, format_args!("`{test_id}` is listed twice")));
                    }
                    access::require_reference(tx, "tests", &field, test_id, &project_id)?;
                    let channel: String =
                        tx.query_row("SELECT channel_id FROM tests WHERE id = ?1", params![test_id], |r| r.get(0))?;
                    if channel != path.id {
                        return Err(Failure::invalid(
                            &field,
                            format_args!("test `{test_id}` uses channel `{channel}`, not `{}`", path.id),
                        ));
                    }
                }
                named.clone()
            } else {
                tx.prepare_cached("SELECT id FROM tests WHERE channel_id = ?1 ORDER BY id")?
                    .query_map(params![path.id], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?
            };
            Ok(Source {
                kind: types::BatchRunSource::Channel,
                resource_id: path.id.clone(),
                concurrency: project_concurrency(tx, &project_id)?,
                project_id,
                batch_id: None,
                channel_id: Some(path.id),
                test_id: None,
                test_ids,
            })
        },
        metadata,
    )
    .await
}

pub async fn run_test(
    state: &AppState,
    caller: Caller,
    path: p::RunTestPath,
    headers: p::RunTestHeaders,
    body: types::RunTestRequest,
) -> Result<types::BatchRun> {
    let idempotency = Idempotency::of(headers.idempotency_key, "run_test", &path.id, &body)?;
    let metadata = metadata(body.metadata)?;
    start(
        state,
        caller,
        idempotency,
        move |tx, user_id| {
            let (project_id, _) = access::require_resource(tx, user_id, "tests", "test", &path.id, Need::Edit)?;
            Ok(Source {
                kind: types::BatchRunSource::Test,
                resource_id: path.id.clone(),
                concurrency: project_concurrency(tx, &project_id)?,
                project_id,
                batch_id: None,
                channel_id: None,
                test_id: Some(path.id.clone()),
                test_ids: vec![path.id],
            })
        },
        metadata,
    )
    .await
}

/// `POST /batch-runs/{id}/cancel`: queued runs end now, running ones at
/// their next turn. A batch run that has ended, or was cancelled already
/// and is still stopping, is answered as it is, with no record.
pub async fn cancel(state: &AppState, caller: Caller, path: p::CancelBatchRunPath) -> Result<types::BatchRun> {
    let id = path.id;
    let (run, running) = state
        .store
        .write(move |tx| {
            access::require_resource(tx, &caller.user_id, "batch_runs", "batch run", &id, Need::Edit)?;
            let user_id = caller.user_id.clone();
            let before = load_batch_run(tx, &id)?;
            if !matches!(before.status, types::BatchRunStatus::Queued | types::BatchRunStatus::Running) {
                return Ok::<_, Failure>((seen_by(tx, &user_id, before)?, Vec::new()));
            }
            // Cancelled already, its running runs still stopping: nothing
            // changes, nothing is recorded. Its running runs are told again
            // (in memory only), in case one was claimed as the first cancel
            // told them.
            if crate::engine::queue::cancel_requested(tx, &id)? {
                let running = crate::engine::queue::running(tx, &id)?;
                return Ok((seen_by(tx, &user_id, before)?, running));
            }
            let running = crate::engine::queue::cancel(tx, &id)?;
            let after = load_batch_run(tx, &id)?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "batch_run.cancel",
                    resource_type: "batch_run",
                    resource_id: &id,
                    project_id: Some(&after.project_id),
                    summary: format!(
                        "cancelled batch run {id}: {} queued runs cancelled, {} running runs stopping",
                        after.counts.cancelled - before.counts.cancelled,
                        running.len()
                    ),
                    changes: json!({"status": {"from": before.status, "to": after.status}}).into(),
                },
            )?;
            Ok((seen_by(tx, &user_id, after)?, running))
        })
        .await?;
    state.engine.cancel_runs(&running);
    Ok(run)
}

// Reading.

const BATCH_RUN_COLUMNS: &str = "id, project_id, source, batch_id, channel_id, test_id, status, total, queued, \
                                 running, passed, failed, errored, cancelled, verdict, metadata, credits_reserved, \
                                 credits_charged, started_at, finished_at, created_at, updated_at";

/// What a queued or running run is bound to until it ends.
pub(crate) enum BoundTo<'a> {
    Scenario(&'a str),
    Persona(&'a str),
    /// The channel its test had when it was queued.
    Channel(&'a str),
    /// An `llm_judge` integration in its test's evaluators as queued.
    Judge(&'a str),
}

/// Refuses (409 `runs_active`) the deletion of what runs of the project
/// still waiting or running will load when they start or judge: they keep
/// their scenario, personas, channel and evaluators as queued, and one that
/// finds them gone would end in an error no one asked for. What tests refer
/// to now is the caller's `in_use` check; this one is for what they referred
/// to when their runs were queued.
pub(crate) fn refuse_if_runs_bound(
    tx: &rusqlite::Connection,
    project_id: &str,
    what: &str,
    to: BoundTo<'_>,
) -> Result<()> {
    let (sql, id) = bound_sql(to);
    let active: i64 = tx.prepare_cached(&sql)?.query_row(params![project_id, id], |r| r.get(0))?;
    if active > 0 {
        return Err(Failure::runs_active(
            format_args!("{what} `{id}` is bound to {active} runs"),
            "cancel their batch runs",
        ));
    }
    Ok(())
}

/// The statement counting the unfinished runs of project `?1` bound to
/// `?2` (see [`refuse_if_runs_bound`]), and the id bound as `?2`.
fn bound_sql(to: BoundTo<'_>) -> (String, &str) {
    // What the tests were queued with (`t`) is looked at once per test of
    // an active batch run, in a subquery run once: a test's evaluators may
    // be a megabyte, and a batch run holds up to 10,000 runs of one test.
    let of_tests = |condition: &str| {
        format!(
            "(r.batch_run_id, r.test_id) IN (
                 SELECT t.batch_run_id, t.test_id FROM batch_runs tb
                 JOIN batch_run_tests t ON t.batch_run_id = tb.id
                 WHERE tb.status IN ('queued', 'running') AND tb.project_id = ?1 AND {condition})"
        )
    };
    let (condition, id) = match to {
        BoundTo::Scenario(id) => ("r.scenario_id = ?2".to_string(), id),
        BoundTo::Persona(id) => ("r.persona_id = ?2".to_string(), id),
        BoundTo::Channel(id) => (of_tests("t.channel_id = ?2"), id),
        BoundTo::Judge(id) => (
            of_tests(
                "EXISTS (SELECT 1 FROM json_each(t.evaluators) e WHERE json_extract(e.value, '$.integration_id') = ?2)",
            ),
            id,
        ),
    };
    // Active batch runs first (a partial index), then their unfinished runs.
    let sql = format!(
        "SELECT count(*) FROM batch_runs b
         JOIN runs r ON r.batch_run_id = b.id AND r.status IN ('queued', 'running')
         WHERE b.status IN ('queued', 'running') AND b.project_id = ?1 AND {condition}"
    );
    (sql, id)
}

pub(crate) fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

pub(crate) fn time(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<chrono::DateTime<chrono::Utc>> {
    let s: String = row.get(i)?;
    ids::parse_time(&s).ok_or_else(|| conversion(i, "not a time"))
}

pub(crate) fn optional_time(
    row: &rusqlite::Row<'_>,
    i: usize,
) -> rusqlite::Result<Option<chrono::DateTime<chrono::Utc>>> {
    let s: Option<String> = row.get(i)?;
    Ok(s.and_then(|s| ids::parse_time(&s)))
}

/// Passed over finished (not cancelled) runs; `None` while none finished.
pub fn pass_rate(passed: i64, failed: i64, errored: i64) -> Option<f64> {
    let finished = passed + failed + errored;
    (finished > 0).then(|| passed as f64 / finished as f64)
}

fn batch_run_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::BatchRun> {
    let count = |i: usize| row.get::<_, i64>(i).map(|n| n.max(0));
    // How runs ended: hidden from a blind reviewer by `blind::apply_to_batch_run`.
    let ended = |i: usize| count(i).map(Some);
    let source: String = row.get(2)?;
    let status: String = row.get(6)?;
    let metadata: String = row.get(15)?;
    let (passed, failed, errored) = (row.get::<_, i64>(10)?, row.get::<_, i64>(11)?, row.get::<_, i64>(12)?);
    Ok(types::BatchRun {
        id: row.get(0)?,
        project_id: row.get(1)?,
        source: source.parse().map_err(|e| conversion(2, e))?,
        batch_id: row.get(3)?,
        channel_id: row.get(4)?,
        test_id: row.get(5)?,
        status: status.parse().map_err(|e| conversion(6, e))?,
        counts: types::BatchRunCounts {
            total: count(7)?,
            queued: count(8)?,
            running: count(9)?,
            passed: ended(10)?,
            failed: ended(11)?,
            errored: ended(12)?,
            cancelled: count(13)?,
        },
        pass_rate: pass_rate(passed, failed, errored),
        passed: row.get::<_, Option<bool>>(14)?,
        blinded: None,
        metadata: match serde_json::from_str(&metadata) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        },
        credits_reserved: count(16)?,
        credits_charged: count(17)?,
        started_at: optional_time(row, 18)?,
        finished_at: optional_time(row, 19)?,
        created_at: time(row, 20)?,
        updated_at: time(row, 21)?,
    })
}

pub(crate) fn load_batch_run(tx: &rusqlite::Connection, id: &str) -> Result<types::BatchRun> {
    tx.prepare_cached(&format!("SELECT {BATCH_RUN_COLUMNS} FROM batch_runs WHERE id = ?1"))?
        .query_row(params![id], batch_run_from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("batch run", id))
}

/// A batch run as `user_id` may see it (see `reviews::blind`).
fn seen_by(tx: &rusqlite::Connection, user_id: &str, mut run: types::BatchRun) -> Result<types::BatchRun> {
    crate::reviews::blind::apply_to_batch_run(tx, user_id, &mut run)?;
    Ok(run)
}

/// `Batch::last_run`: the newest batch run of the batch that was queued
/// (one refused for credits ran nothing: it is no run of the batch), its
/// pass rate hidden from `user_id` if they label one of its results blind.
pub(crate) fn last_run_of_batch(
    tx: &rusqlite::Connection,
    user_id: &str,
    batch_id: &str,
) -> Result<Option<types::BatchLastRun>> {
    let last = tx
        .prepare_cached(
            "SELECT id, status, passed, failed, errored FROM batch_runs
             WHERE batch_id = ?1 AND status != 'insufficient_credits' ORDER BY id DESC LIMIT 1",
        )?
        .query_row(params![batch_id], |r| {
            let status: String = r.get(1)?;
            Ok(types::BatchLastRun {
                id: r.get(0)?,
                status: status.parse().map_err(|e| conversion(1, e))?,
                pass_rate: pass_rate(r.get(2)?, r.get(3)?, r.get(4)?),
            })
        })
        .optional()?;
    Ok(match last {
        Some(last) if crate::reviews::blind::blinding_batch_run(tx, user_id, &last.id)?.is_some() => {
            Some(types::BatchLastRun { pass_rate: None, ..last })
        }
        last => last,
    })
}

pub async fn get_batch_run(state: &AppState, caller: Caller, path: p::GetBatchRunPath) -> Result<types::BatchRun> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "batch_runs", "batch run", &path.id, Need::Read)?;
            seen_by(tx, &caller.user_id, load_batch_run(tx, &path.id)?)
        })
        .await
}

/// The ids of a page of one project's batch runs (`?1`), newest first, of
/// the batch `?2` and in the status `?3` (all when NULL), after the cursor
/// `?4`, at most `?5` (see [`PageSql`]): in order from
/// `batch_runs_by_project`, no sort, and the walk stops at the limit.
pub(crate) static BATCH_RUNS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT id FROM batch_runs
             WHERE project_id = ?1 AND (?2 IS NULL OR batch_id = ?2) AND (?3 IS NULL OR status = ?3) {AFTER}
             ORDER BY id DESC LIMIT ?5"
        ),
        "AND id < ?4",
    )
});

pub async fn list_batch_runs(
    state: &AppState,
    caller: Caller,
    query: p::ListBatchRunsQuery,
) -> Result<types::BatchRunList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "brn").map_err(|e| Failure::invalid("cursor", e))?;
    let status = query.status.map(|s| s.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                BATCH_RUNS_SQL.of(&page),
                &page,
                params![query.batch_id, status, page.after, page.fetch_limit()],
            )?;
            let rows = ids.iter().map(|id| load_batch_run(tx, id)).collect::<Result<Vec<_>>>()?;
            let mut page = page.finish(rows, |b| b.id.clone());
            // Almost always nobody labels blind: one query says so.
            if !crate::reviews::blind::blind_map(tx, &caller.user_id)?.is_empty() {
                for run in &mut page.items {
                    crate::reviews::blind::apply_to_batch_run(tx, &caller.user_id, run)?;
                }
            }
            Ok(types::BatchRunList { batch_runs: page.items, next_cursor: page.next_cursor })
        })
        .await
}

/// The tests of batch run `?1` (`t`, `batch_run_tests`) with their runs
/// counted by state (`a`: `total`, `queued`, `running`, `passed`, `failed`,
/// `errored`, `cancelled`; NULL for a test without runs). The runs are read
/// in one pass: joined to each test, the batch run's runs were read once per
/// test, over a second in the writer at the end of a batch run of 1,000
/// tests.
pub(crate) const TESTS_WITH_COUNTS: &str = "batch_run_tests t LEFT JOIN (
        SELECT test_id, count(*) AS total, sum(status = 'queued') AS queued, sum(status = 'running') AS running,
               sum(status = 'passed') AS passed, sum(status = 'failed') AS failed, sum(status = 'error') AS errored,
               sum(status = 'cancelled') AS cancelled
        FROM runs WHERE batch_run_id = ?1 GROUP BY test_id
    ) a ON a.test_id = t.test_id
    WHERE t.batch_run_id = ?1";

/// A page of a batch run's tests (see [`PageSql`]), with their runs counted
/// as in [`TESTS_WITH_COUNTS`]: the tests are walked in order from the
/// batch run's (`batch_run_tests`' key, from the cursor on) and each one's
/// runs read from `runs_by_test`, grouped as they come, so the walk stops
/// at the page's end. Counting every run of the batch run first (as
/// `TESTS_WITH_COUNTS` does, for the end of a batch run, which needs them
/// all) made each page cost the whole batch run.
pub(crate) static BATCH_RUN_TESTS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT t.test_id, t.name, t.pass_threshold, count(r.id), coalesce(sum(r.status = 'queued'), 0),
                    coalesce(sum(r.status = 'running'), 0), coalesce(sum(r.status = 'passed'), 0),
                    coalesce(sum(r.status = 'failed'), 0), coalesce(sum(r.status = 'error'), 0),
                    coalesce(sum(r.status = 'cancelled'), 0)
             FROM batch_run_tests t
             LEFT JOIN runs r ON r.batch_run_id = t.batch_run_id AND r.test_id = t.test_id
             WHERE t.batch_run_id = ?1 {AFTER}
             GROUP BY t.test_id ORDER BY t.test_id DESC LIMIT ?3"
        ),
        "AND t.test_id < ?2",
    )
});

/// How each test of a batch run did: its runs by state, the pass threshold
/// kept when the batch run started, the verdict once it completed (as
/// `queue::end` reaches the batch run's), and up to three failures with
/// their reasons.
pub async fn list_tests(
    state: &AppState,
    caller: Caller,
    path: p::ListBatchRunTestsPath,
    query: p::ListBatchRunTestsQuery,
) -> Result<types::BatchRunTestList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "tst").map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "batch_runs", "batch run", &path.id, Need::Read)?;
            let cursor_sql = "SELECT 1 FROM batch_run_tests WHERE test_id = ?1 AND batch_run_id = ?2";
            require_cursor_of(tx, cursor_sql, &path.id, &page)?;
            let run = seen_by(tx, &caller.user_id, load_batch_run(tx, &path.id)?)?;
            let completed = matches!(run.status, types::BatchRunStatus::Completed);
            let rows = tx
                .prepare_cached(BATCH_RUN_TESTS_SQL.of(&page))?
                .query_map(params![path.id, page.after, page.fetch_limit()], |r| {
                    let count = |i: usize| r.get::<_, i64>(i).map(|n| n.max(0));
                    let (passed, failed, errored) = (count(6)?, count(7)?, count(8)?);
                    let (total, threshold): (i64, f64) = (count(3)?, r.get(2)?);
                    Ok(types::BatchRunTest {
                        test_id: r.get(0)?,
                        name: r.get(1)?,
                        pass_threshold: threshold,
                        counts: types::BatchRunCounts {
                            total,
                            queued: count(4)?,
                            running: count(5)?,
                            passed: Some(passed),
                            failed: Some(failed),
                            errored: Some(errored),
                            cancelled: count(9)?,
                        },
                        pass_rate: pass_rate(passed, failed, errored),
                        // The batch run's own verdict is this, over every test.
                        passed: completed
                            .then(|| crate::engine::evaluate::test_passed(passed as u32, total as u32, threshold)),
                        failures: Vec::new(),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut page = page.finish(rows, |t| t.test_id.clone());
            if run.blinded.is_some() {
                for test in &mut page.items {
                    crate::reviews::blind::hide_endings(&mut test.counts);
                    test.pass_rate = None;
                    test.passed = None;
                }
            } else {
                let failed: Vec<&str> = page
                    .items
                    .iter()
                    .filter(|t| t.counts.failed.unwrap_or(0) + t.counts.errored.unwrap_or(0) > 0)
                    .map(|t| t.test_id.as_str())
                    .collect();
                let mut failures = first_failures(tx, &path.id, &failed)?;
                for test in &mut page.items {
                    test.failures = failures.remove(&test.test_id).unwrap_or_default();
                }
            }
            Ok(types::BatchRunTestList { tests: page.items, next_cursor: page.next_cursor, blinded: run.blinded })
        })
        .await
}

/// The first three runs of each of `test_ids` in the batch run that failed
/// or ended in error, with their results' reasons, or, for a run that ended
/// in error without a conversation (its lease expired on every attempt),
/// the run's own. Both are kept with the run (`runs.error`): a page names
/// up to 600 failures, and their documents (each up to a call's record)
/// are read only for a run that ended before its result's reason was kept
/// there. A run cancelled mid-conversation keeps a result
/// whose status is `error` ("cancelled after N turns"), so the run's own
/// status says which ones failed.
fn first_failures(
    tx: &rusqlite::Connection,
    batch_run_id: &str,
    test_ids: &[&str],
) -> Result<BTreeMap<String, Vec<types::BatchRunTestFailure>>> {
    let mut failures: BTreeMap<String, Vec<types::BatchRunTestFailure>> = BTreeMap::new();
    if test_ids.is_empty() {
        return Ok(failures);
    }
    let rows = tx
        .prepare_cached(
            "SELECT r.test_id, r.id, r.test_result_id, r.status,
                    coalesce(r.error, json_extract(t.document, '$.failure_reason'))
             FROM runs r JOIN (
                 SELECT id, row_number() OVER (PARTITION BY test_id ORDER BY id) AS n FROM runs
                 WHERE batch_run_id = ?1 AND status IN ('failed', 'error')
                   AND test_id IN (SELECT value FROM json_each(?2))
             ) k ON k.id = r.id
             LEFT JOIN test_results t ON t.id = r.test_result_id
             WHERE k.n <= 3 ORDER BY r.test_id, r.id",
        )?
        .query_map(params![batch_run_id, serde_json::to_string(test_ids).unwrap_or_default()], |r| {
            let status: String = r.get(3)?;
            Ok((
                r.get::<_, String>(0)?,
                types::BatchRunTestFailure {
                    run_id: r.get(1)?,
                    test_result_id: r.get(2)?,
                    status: status.parse().map_err(|e| conversion(3, e))?,
                    failure_reason: r.get(4)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (test_id, failure) in rows {
        failures.entry(test_id).or_default().push(failure);
    }
    Ok(failures)
}

/// A page after a cursor of a list of one batch run's or test's items:
/// the cursor must be one of those items (`sql` finds it, `?1`, as an item
/// of `parent`, `?2`). One issued by the same list of another batch run or
/// test is refused as every list refuses another list's cursor, not read
/// as a place in time (a page of this list's items older than it: some
/// skipped, or none and no cursor, as if the end were reached).
fn require_cursor_of(tx: &rusqlite::Connection, sql: &str, parent: &str, page: &PageRequest) -> Result<()> {
    let Some(after) = &page.after else { return Ok(()) };
    match tx.prepare_cached(sql)?.query_row(params![after, parent], |_| Ok(())).optional()? {
        Some(()) => Ok(()),
        None => Err(Failure::invalid("cursor", InvalidCursor)),
    }
}

const RUN_COLUMNS: &str =
    "id, project_id, batch_run_id, test_id, scenario_id, persona_id, iteration, status, attempt, \
                           call_id, test_result_id, queued_at, started_at, finished_at, created_at, updated_at";

fn run_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Run> {
    let status: String = row.get(7)?;
    let positive =
        |i: usize| row.get::<_, u32>(i).and_then(|n| std::num::NonZeroU32::new(n).ok_or_else(|| conversion(i, "zero")));
    Ok(types::Run {
        id: row.get(0)?,
        project_id: row.get(1)?,
        batch_run_id: row.get(2)?,
        test_id: row.get(3)?,
        scenario_id: row.get(4)?,
        persona_id: row.get(5)?,
        iteration: positive(6)?,
        status: Some(status.parse().map_err(|e| conversion(7, e))?),
        attempt: positive(8)?,
        call_id: row.get(9)?,
        test_result_id: row.get(10)?,
        queued_at: time(row, 11)?,
        started_at: optional_time(row, 12)?,
        finished_at: optional_time(row, 13)?,
        created_at: time(row, 14)?,
        updated_at: time(row, 15)?,
    })
}

/// A page of a batch run's runs (see [`PageSql`]).
pub(crate) static RUNS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE batch_run_id = ?1 AND (?2 IS NULL OR status = ?2) {AFTER}
               AND (?2 IS NULL OR test_result_id IS NULL OR test_result_id NOT IN ({}))
             ORDER BY id DESC LIMIT ?4",
            crate::reviews::blind::blind_results("?5")
        ),
        "AND id < ?3",
    )
});

pub async fn list_runs(
    state: &AppState,
    caller: Caller,
    path: p::ListBatchRunRunsPath,
    query: p::ListBatchRunRunsQuery,
) -> Result<types::RunList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "run").map_err(|e| Failure::invalid("cursor", e))?;
    let status = query.status.map(|s| s.to_string());
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "batch_runs", "batch run", &path.batch_id, Need::Read)?;
            require_cursor_of(tx, "SELECT 1 FROM runs WHERE id = ?1 AND batch_run_id = ?2", &path.batch_id, &page)?;
            // A run whose result the caller labels blind does not say how
            // it ended, and a list filtered by status leaves it out in the
            // query itself, so that neither the page's length nor its cursor
            // tells that it matched.
            let rows = tx
                .prepare_cached(RUNS_SQL.of(&page))?
                .query_map(
                    params![path.batch_id, status, page.after, page.fetch_limit(), caller.user_id],
                    run_from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let page = page.finish(rows, |r| r.id.clone());
            let blind = crate::reviews::blind::blind_map(tx, &caller.user_id)?;
            let mut runs = page.items;
            for run in &mut runs {
                if run.test_result_id.as_ref().is_some_and(|id| blind.contains_key(id)) {
                    run.status = None;
                }
            }
            Ok(types::RunList { runs, next_cursor: page.next_cursor })
        })
        .await
}

fn decode_result(document: &[u8]) -> Result<types::TestResult> {
    serde_json::from_slice(document).map_err(|e| Failure::Store(conversion(0, e).into()))
}

/// What a result is read by: its id, or its call's id.
#[derive(Clone, Copy)]
enum ResultBy {
    Id = 0,
    Call = 1,
}

impl ResultBy {
    /// What a 404 says was not found.
    fn what(self) -> &'static str {
        match self {
            ResultBy::Id => "test result",
            ResultBy::Call => "test result for call",
        }
    }

    /// The caller's role in the project of the result found by `value`:
    /// outsiders get the same 404 as for a result that does not exist.
    fn member_role(self, tx: &rusqlite::Connection, user_id: &str, project_id: &str, value: &str) -> Result<Role> {
        access::role_in(tx, user_id, project_id)?.ok_or_else(|| Failure::not_found(self.what(), value))
    }
}

/// The statement that finds a result's document, project and id (by id or
/// by call id: `?1`; in `ResultBy`'s order). Its rows are
/// [`document_row`]s.
const DOCUMENT_SQL: [&str; 2] = [
    "SELECT document, project_id, id FROM test_results WHERE id = ?1",
    "SELECT document, project_id, id FROM test_results WHERE call_id = ?1",
];

/// A row of [`DOCUMENT_SQL`]: the result's JSON document as stored, its
/// project and its id.
fn document_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Vec<u8>, String, String)> {
    // The document's bytes: its text was encoded by serde_json, and is
    // answered (or decoded) as it is without a separate UTF-8 check.
    Ok((r.get_ref(0)?.as_bytes()?.to_vec(), r.get(1)?, r.get(2)?))
}

/// A test result as the caller may see it: the stored document as it is
/// (encoded from a `TestResult` when the run ended), or, for a result the
/// caller labels blind (see `reviews::blind`), decoded and hidden.
///
/// The most read document of all (a dashboard's, a pipeline's) is nearly
/// always one statement, read without a transaction around it
/// ([`Store::read_row`]): the caller's role comes from `test_cache`, and
/// the result is in no open calibration (`reviews::blind::
/// InOpenCalibrations`), so no caller labels it blind. What is not kept is
/// read, and kept for the next reads.
async fn readable_result(
    state: &AppState,
    user_id: &str,
    by: ResultBy,
    value: &str,
) -> Result<Json<types::TestResult>> {
    let (roles, open) = (&state.test_cache, &state.in_open_calibrations);
    // Taken before reading, for what the reads below keep.
    let (roles_then, open_then) = (roles.generation(), open.generation());
    let (document, project_id, result_id) = state
        .store
        .read_row::<_, Failure, _, _>(DOCUMENT_SQL[by as usize], params![value], document_row)?
        .ok_or_else(|| Failure::not_found(by.what(), value))?;
    let (role, held) = (roles.role(user_id, &project_id), open.holds(&result_id));
    let blinding = match (role, held) {
        (Some(role), Some(false)) => {
            access::check(role, Need::Read)?;
            None
        }
        _ => {
            state
                .store
                .read(|tx| {
                    let role = match role {
                        Some(role) => role,
                        None => {
                            let role = by.member_role(tx, user_id, &project_id, value)?;
                            roles.keep_role(roles_then, user_id, &project_id, role);
                            role
                        }
                    };
                    access::check(role, Need::Read)?;
                    let held = match held {
                        Some(held) => held,
                        None => open.load(tx, open_then, &result_id)?,
                    };
                    if held {
                        crate::reviews::blind::blinding_calibration(tx, user_id, &result_id)
                    } else {
                        Ok(None)
                    }
                })
                .await?
        }
    };
    match blinding {
        None => Ok(Json::written_bytes(document)),
        Some(calibration_id) => {
            let mut result = decode_result(&document)?;
            crate::reviews::blind::hide(&mut result, calibration_id);
            Ok(result.into())
        }
    }
}

pub async fn get_test_result(
    state: &AppState,
    caller: Caller,
    path: p::GetTestResultPath,
) -> Result<Json<types::TestResult>> {
    readable_result(state, &caller.user_id, ResultBy::Id, &path.id).await
}

pub async fn get_test_result_by_call(
    state: &AppState,
    caller: Caller,
    path: p::GetTestResultByCallPath,
) -> Result<Json<types::TestResult>> {
    readable_result(state, &caller.user_id, ResultBy::Call, &path.call_id).await
}

/// A page of a test's results (see [`PageSql`]).
pub(crate) static TEST_RESULTS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT document, id FROM test_results
             WHERE test_id = ?1 AND (?2 IS NULL OR status = ?2) {AFTER}
               AND (?2 IS NULL OR id NOT IN ({}))
             ORDER BY id DESC LIMIT ?4",
            crate::reviews::blind::blind_results("?5")
        ),
        "AND id < ?3",
    )
});

pub async fn list_test_results(
    state: &AppState,
    caller: Caller,
    path: p::ListTestResultsPath,
    query: p::ListTestResultsQuery,
) -> Result<Json<types::TestResultList>> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "trs").map_err(|e| Failure::invalid("cursor", e))?;
    let status = query.status.map(|s| s.to_string());
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "tests", "test", &path.id, Need::Read)?;
            require_cursor_of(tx, "SELECT 1 FROM test_results WHERE id = ?1 AND test_id = ?2", &path.id, &page)?;
            // The stored documents as they are, but for blind results:
            // hidden one by one, and left out of a list filtered by status
            // (matching the filter would reveal it) in the query itself, so
            // that neither the page's length nor its cursor tells.
            // A page stops early, with its cursor, once its documents pass
            // `pagination::PAGE_BYTES`: each may be up to a call's record in size.
            // A page cut early names a next page only if a row follows it
            // (one more step of the statement, that row left out).
            let mut statement = tx.prepare_cached(TEST_RESULTS_SQL.of(&page))?;
            let mut found =
                statement.query(params![path.id, status, page.after, page.fetch_limit(), caller.user_id])?;
            let (mut rows, mut bytes, mut full) = (Vec::new(), 0, false);
            while let Some(row) = found.next()? {
                if bytes > pagination::PAGE_BYTES {
                    full = true;
                    break;
                }
                let row: (String, String) = (row.get(1)?, row.get(0)?);
                bytes += row.1.len();
                rows.push(row);
            }
            drop(found);
            drop(statement);
            let id_of = |(id, _): &(String, String)| id.clone();
            let page = if full { page.finish_early(rows, id_of) } else { page.finish(rows, id_of) };
            let mut blind = crate::reviews::blind::blind_map(tx, &caller.user_id)?;
            let mut test_results = Vec::with_capacity(page.items.len());
            for (id, document) in page.items {
                match blind.remove(&id) {
                    None => test_results.push(document),
                    Some(calibration_id) => {
                        let mut result = decode_result(document.as_bytes())?;
                        crate::reviews::blind::hide(&mut result, calibration_id);
                        test_results
                            .push(serde_json::to_string(&result).map_err(|e| Failure::Store(conversion(0, e).into()))?);
                    }
                }
            }
            let items = test_results.iter().map(String::as_str);
            Ok(Json::written(written::page("test_results", items, page.next_cursor.as_deref())))
        })
        .await
}

pub async fn queue_stats(state: &AppState, caller: Caller) -> Result<types::QueueStats> {
    let workers = state.engine.workers();
    let busy = state.engine.busy();
    state
        .store
        .read(move |tx| {
            let hour_ago = ids::now().timestamp_millis() - 3_600_000;
            let (queued, running, oldest): (i64, i64, Option<String>) = tx.query_row(
                "SELECT (SELECT count(*) FROM runs WHERE status = 'queued'),
                        (SELECT count(*) FROM runs WHERE status = 'running'),
                        (SELECT queued_at FROM runs WHERE status = 'queued' ORDER BY queued_ms LIMIT 1)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let (completed, failed): (i64, i64) = tx.query_row(
                "SELECT count(*), coalesce(sum(status IN ('failed', 'error')), 0) FROM runs
                 WHERE finished_ms >= ?1 AND status IN ('passed', 'failed', 'error')",
                params![hour_ago],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let avg_wait: Option<f64> = tx.query_row(
                "SELECT avg(started_ms - queued_ms) FROM runs WHERE started_ms >= ?1",
                params![hour_ago],
                |r| r.get(0),
            )?;
            let (mine_queued, mine_running): (i64, i64) = tx.query_row(
                "SELECT coalesce(sum(status = 'queued'), 0), coalesce(sum(status = 'running'), 0) FROM runs
                 WHERE user_id = ?1 AND status IN ('queued', 'running')",
                params![caller.user_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let n = |v: i64| v.max(0);
            Ok(types::QueueStats {
                queued: n(queued),
                running: n(running),
                workers: workers as i32,
                available_slots: workers.saturating_sub(busy) as i32,
                oldest_queued_at: oldest.and_then(|s| ids::parse_time(&s)),
                completed_last_hour: n(completed),
                failed_last_hour: n(failed),
                avg_wait_ms_last_hour: avg_wait.map(|w| w.max(0.0).round() as i64),
                mine: types::QueueShare { queued: n(mine_queued), running: n(mine_running) },
            })
        })
        .await
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use crate::failure::Failure;

    /// A store holding the batch run `brn_1` of `tests` tests (`tst_0000`
    /// on), each with 4 runs: run `i` (1 to 4) of test `t` has the id
    /// `id(t, i)` and the status `status(i)`.
    fn a_batch_run(
        tests: usize,
        id: impl Fn(usize, usize) -> String,
        status: impl Fn(usize) -> &'static str,
    ) -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'u', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, metadata,
                                             created_at, updated_at)
                     VALUES ('brn_1', 'prj_1', 'usr_1', 'batch', 'running', 10, '{}', 't', 't');",
                )?;
                for t in 0..tests {
                    let test = format!("tst_{t:04}");
                    tx.execute(
                        "INSERT INTO batch_run_tests (batch_run_id, test_id, pass_threshold) VALUES ('brn_1', ?1, 1)",
                        params![test],
                    )?;
                    for i in 1..=4 {
                        tx.execute(
                            "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration,
                                               status, attempt, queued_at, queued_ms, created_at, updated_at)
                             VALUES (?1, 'brn_1', 'prj_1', 'usr_1', ?2, 'scn_1', ?3, ?4, 1, 't', 0, 't', 't')",
                            params![id(t, i), test, i as i64, status(i)],
                        )?;
                    }
                }
                Ok(())
            })
            .unwrap();
        (dir, store)
    }

    /// SQLite's virtual machine steps (which no machine's noise moves) to
    /// count the runs of a batch run of `tests` tests with 4 runs each, as
    /// the end of a batch run does.
    fn steps_to_count(tests: usize) -> i32 {
        // Each test's runs queued one after another.
        let (_dir, store) = a_batch_run(tests, |t, i| format!("run_{t:04}_{i}"), |_| "passed");
        store
            .read_blocking::<_, Failure, _>(|tx| {
                let mut count = tx.prepare(&format!(
                    "SELECT t.test_id, coalesce(a.total, 0), coalesce(a.passed, 0) FROM {}",
                    super::TESTS_WITH_COUNTS
                ))?;
                let rows: Vec<(String, i64, i64)> = count
                    .query_map(params!["brn_1"], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?;
                assert_eq!(rows.len(), tests);
                assert!(rows.iter().all(|(_, total, passed)| (*total, *passed) == (4, 4)), "{rows:?}");
                Ok(count.get_status(rusqlite::StatementStatus::VmStep))
            })
            .unwrap()
    }

    /// A run that ended in error without a conversation (its worker lost on
    /// every attempt) has no result: it is listed with the run's own reason.
    #[test]
    fn a_run_without_a_result_is_a_failure_with_its_own_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let failures = store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'u', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, total, passed,
                                             errored, metadata, created_at, updated_at)
                     VALUES ('brn_1', 'prj_1', 'usr_1', 'test', 'completed', 10, 2, 1, 1, '{}', 't', 't');
                     INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration, status,
                                       attempt, error, queued_at, queued_ms, created_at, updated_at)
                     VALUES ('run_1', 'brn_1', 'prj_1', 'usr_1', 'tst_1', 'scn_1', 1, 'passed', 1, NULL, 't', 0, 't', 't'),
                            ('run_2', 'brn_1', 'prj_1', 'usr_1', 'tst_1', 'scn_1', 2, 'error', 3,
                             'the worker holding it was lost 3 times', 't', 0, 't', 't');",
                )?;
                super::first_failures(tx, "brn_1", &["tst_1"])
            })
            .unwrap();
        let failures = &failures["tst_1"];
        assert_eq!(failures.len(), 1, "{failures:?}");
        let f = &failures[0];
        assert_eq!((f.run_id.as_str(), f.test_result_id.as_deref()), ("run_2", None));
        assert_eq!(f.failure_reason.as_deref(), Some("the worker holding it was lost 3 times"));
        assert_eq!(f.status, sparring_server::types::TestResultStatus::Error);
    }

    /// A start reads each scenario its tests share once: a scenario may be
    /// as large as a request body, and a batch of 1,000 tests of one ~1 MB
    /// scenario had the single writer decode it 1,000 times (seconds in
    /// which no one's write went through), also for a start refused for
    /// credits.
    #[test]
    fn a_start_reads_a_shared_scenario_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let steps: Vec<_> = (0..20).map(|i| serde_json::json!({"say": format!("line {i}"), "expect": []})).collect();
        let scenario = serde_json::json!({"description": "", "first_message": "hi", "steps": steps, "goal": null,
                                          "success_criteria": [], "max_turns": 20, "max_duration_s": 60, "tags": []});
        let tests = 300;
        let (planned, worst, reads) = store
            .write_blocking::<_, Failure, _>(|tx| {
                a_project_with_a_channel(tx)?;
                tx.execute(
                    "INSERT INTO scenarios VALUES ('scn_1', 'prj_1', 's', 'scripted', 'per_1', 1, ?1, 't', 't', 60)",
                    params![scenario.to_string()],
                )?;
                let mut ids = Vec::new();
                for i in 0..tests {
                    let id = format!("tst_{i:04}");
                    tx.execute(
                        "INSERT INTO tests (id, project_id, name, channel_id, scenario_id, document, created_at,
                                            updated_at, iterations, pass_threshold)
                         VALUES (?1, 'prj_1', ?1, 'chn_1', 'scn_1',
                                 '{\"description\": \"\", \"iterations\": 2, \"evaluators\": [],
                                   \"pass_threshold\": 1.0, \"tags\": []}', 't', 't', 2, 1.0)",
                        params![id],
                    )?;
                    ids.push(id);
                }
                let (_, planned, worst) = super::price(tx, "prj_1", &ids)?;
                let reads = tx.prepare_cached(super::PRICE_SCENARIO_SQL)?.get_status(rusqlite::StatementStatus::Run);
                Ok((planned, worst, reads))
            })
            .unwrap();
        assert_eq!((planned, worst), (2 * tests, 2 * tests as i64), "two one-minute runs per test");
        assert_eq!(reads, 1, "the scenario of {tests} tests read once");
    }

    /// `usr_1`, who pays for `prj_1` (and has no credits), with its persona
    /// `per_1` and its http channel `chn_1`.
    fn a_project_with_a_channel(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'u', 't');
             INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', 'usr_1');
             INSERT INTO personas VALUES ('per_1', 'prj_1', 'caller', '{}', 't', 't');
             INSERT INTO channels VALUES ('chn_1', 'prj_1', 'web', 'http', 'https://a.example', NULL, '[]',
                                          NULL, 1000, 600, 't', 't');",
        )
    }

    /// A project of `usr_1`, who pays for it and has no credits, with a
    /// channel and a scenario (120 s at most) and `tests` tests of 3
    /// iterations and a pass threshold of 0.5 (`tst_0000`, …), whose own
    /// and scenario's documents are `document`.
    fn project_with_tests(tx: &rusqlite::Transaction<'_>, tests: usize, document: &str) -> rusqlite::Result<()> {
        a_project_with_a_channel(tx)?;
        tx.execute(
            "INSERT INTO scenarios (id, project_id, name, mode, default_persona_id, version, document, created_at,
                                    updated_at, max_duration_s)
             VALUES ('scn_1', 'prj_1', 's', 'scripted', 'per_1', 1, ?1, 't', 't', 120)",
            params![document],
        )?;
        for i in 0..tests {
            tx.execute(
                "INSERT INTO tests (id, project_id, name, channel_id, scenario_id, document, created_at, updated_at,
                                    iterations, pass_threshold)
                 VALUES (?1, 'prj_1', ?1, 'chn_1', 'scn_1', ?2, 't', 't', 3, 0.5)",
                params![format!("tst_{i:04}"), document],
            )?;
        }
        Ok(())
    }

    fn channel_run(tests: usize) -> super::Source {
        super::Source {
            kind: sparring_server::types::BatchRunSource::Channel,
            resource_id: "chn_1".into(),
            project_id: "prj_1".into(),
            batch_id: None,
            channel_id: Some("chn_1".into()),
            test_id: None,
            concurrency: 10,
            test_ids: (0..tests).map(|i| format!("tst_{i:04}")).collect(),
        }
    }

    fn payer() -> sparring_server::Caller {
        sparring_server::Caller {
            user_id: "usr_1".into(),
            credential: sparring_server::Credential::ApiKey { key_id: "key_1".into() },
        }
    }

    /// A start the credits do not cover is priced and recorded from what
    /// the rows of its tests and scenarios hold beside their documents
    /// (iterations, thresholds, limits), never from the documents: a
    /// test's evaluators may be a megabyte, a batch holds a thousand tests,
    /// and such a start, free to repeat, had the one writer decode every
    /// one of them before it could say no. Here no document could be
    /// decoded (none is JSON), and the start is refused and recorded all
    /// the same: the batch run, and each test's name and threshold.
    #[test]
    fn a_start_refused_for_credits_reads_no_document() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let (enough, worst, kept) = store
            .write_blocking::<_, Failure, _>(|tx| {
                project_with_tests(tx, 5, "not JSON")?;
                let started = super::begin(tx, payer(), None, channel_run(5), Default::default(), "brn_1")?;
                let super::Started::New { enough, worst, .. } = started else { panic!("not a replay") };
                let kept: Vec<(String, String, f64, Option<String>)> = tx
                    .prepare(
                        "SELECT test_id, name, pass_threshold, evaluators FROM batch_run_tests
                         WHERE batch_run_id = 'brn_1' ORDER BY test_id",
                    )?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok((enough, worst, kept))
            })
            .unwrap();
        // 5 tests × 3 runs of at most 2 minutes.
        assert_eq!((enough, worst), (false, 30));
        assert_eq!(kept.len(), 5, "{kept:?}");
        for (i, (test_id, name, threshold, evaluators)) in kept.iter().enumerate() {
            let id = format!("tst_{i:04}");
            assert_eq!((test_id, name, *threshold, evaluators), (&id, &id, 0.5, &None));
        }
        // Each finds its row by id: a scenario's from its covering index
        // alone, a test's from the table (its columns, not its document
        // decoded: that the documents above are not JSON shows).
        let plans = store
            .read_blocking::<_, Failure, _>(|tx| {
                let mut plans = Vec::new();
                for sql in [super::PRICE_TEST_SQL, super::PRICE_SCENARIO_SQL, super::REFUSED_TEST_SQL] {
                    plans.push(crate::pagination::tests::plan(tx, sql)?.join("; "));
                }
                Ok(plans)
            })
            .unwrap();
        assert!(plans[1].contains("USING COVERING INDEX"), "{}", plans[1]);
        for plan in [&plans[0], &plans[2]] {
            assert!(plan.starts_with("SEARCH tests USING INDEX") && plan.contains("(id=?)"), "{plan}");
        }
    }

    /// A paid start queues each test's evaluators as they are (for its runs
    /// to be judged by, whatever changes after) without holding them: it
    /// held every test's at once until the last was read, so one request's
    /// memory grew with the whole suite (a thousand tests of up to about a
    /// megabyte of evaluators each). Here 20 tests of 200 KB of evaluators:
    /// the start never holds as much as one test's at once.
    #[test]
    fn a_paid_start_holds_no_suite_of_evaluators() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let evaluators: Vec<_> = (0..100)
            .map(|i| {
                serde_json::json!({"type": "contains", "name": format!("says {i}"), "text": "y".repeat(2000),
                                   "case_sensitive": false, "critical": true})
            })
            .collect();
        let evaluators = serde_json::Value::Array(evaluators);
        let document = serde_json::json!({"description": "", "iterations": 3, "evaluators": evaluators,
                                          "pass_threshold": 0.5, "tags": []})
        .to_string();
        let one_test = evaluators.to_string().len();
        let (queued, held) = store
            .write_blocking::<_, Failure, _>(|tx| {
                project_with_tests(tx, 20, &document)?;
                crate::credits::append(
                    tx,
                    "usr_1",
                    sparring_server::types::TransactionKind::Grant,
                    1000,
                    "credits",
                    None,
                )?;
                let (started, held) = crate::allocator::counting::peak_of(|| {
                    super::begin(tx, payer(), None, channel_run(20), Default::default(), "brn_1")
                });
                let super::Started::New { enough, .. } = started? else { panic!("not a replay") };
                assert!(enough);
                let queued: Vec<String> = tx
                    .prepare("SELECT evaluators FROM batch_run_tests WHERE batch_run_id = 'brn_1'")?
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok((queued, held))
            })
            .unwrap();
        assert_eq!(queued.len(), 20);
        for kept in &queued {
            let kept: serde_json::Value = serde_json::from_str(kept).unwrap();
            assert_eq!(kept, evaluators, "each test's evaluators as queued");
        }
        assert!(held < one_test, "the start held {held} bytes at once; one test's evaluators are {one_test}");
    }

    /// SQLite's steps (which no machine's noise moves) to find whether an
    /// integration judges the 500 unfinished runs of a batch run of one
    /// test holding `evaluators` evaluators.
    fn steps_to_find_a_judge(evaluators: usize) -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        let list: Vec<_> = (0..evaluators)
            .map(|i| serde_json::json!({"type": "contains", "name": format!("e{i}"), "text": "x"}))
            .collect();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'u', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', 'usr_1');
                     INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, total, queued,
                                             metadata, created_at, updated_at)
                     VALUES ('brn_1', 'prj_1', 'usr_1', 'test', 'running', 10, 500, 500, '{}', 't', 't');",
                )?;
                tx.execute(
                    "INSERT INTO batch_run_tests (batch_run_id, test_id, pass_threshold, channel_id, evaluators)
                     VALUES ('brn_1', 'tst_1', 1, 'chn_1', ?1)",
                    params![serde_json::Value::Array(list.clone()).to_string()],
                )?;
                for i in 1..=500 {
                    tx.execute(
                        "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration,
                                           status, queued_at, queued_ms, created_at, updated_at)
                         VALUES (?1, 'brn_1', 'prj_1', 'usr_1', 'tst_1', 'scn_1', ?2, 'queued', 't', 0, 't', 't')",
                        params![format!("run_{i:04}"), i],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                super::refuse_if_runs_bound(tx, "prj_1", "integration", super::BoundTo::Judge("int_1"))?;
                let (sql, _) = super::bound_sql(super::BoundTo::Judge("int_1"));
                Ok(tx.prepare_cached(&sql)?.get_status(rusqlite::StatementStatus::VmStep))
            })
            .unwrap()
    }

    /// Deleting an integration looks for judges among the evaluators the
    /// tests of unfinished runs were queued with: once per test, not once
    /// per run. (A test of 100 evaluators with long prompts holds about a
    /// megabyte of them; with 1,000 runs queued, one delete had the writer
    /// parse a gigabyte, 3 s in which no one's write went through.)
    #[test]
    fn a_judge_is_looked_for_once_per_test_not_per_run() {
        let (few, many) = (steps_to_find_a_judge(2), steps_to_find_a_judge(100));
        // Fifty times the evaluators: as much more work as they are read
        // once, not fifty times the work of reading them for every run.
        assert!(f64::from(many) < 2.0 * f64::from(few), "{few} steps for 2 evaluators, {many} for 100");
    }

    /// SQLite's virtual machine steps to read a page of `limit` tests of a
    /// batch run of `tests` tests with 4 runs each (all passed), after the
    /// cursor `after` (a test's index) or from the first test: the page's
    /// tests and their counts as they were read, and the steps.
    fn steps_for_a_page(tests: usize, after: Option<usize>, limit: usize) -> (Vec<(String, i64, i64)>, i32) {
        // Runs of every test queued together, as a start queues them: each
        // test's runs far apart in `runs_by_batch_run`.
        let (_dir, store) =
            a_batch_run(tests, |t, i| format!("run_{i}_{t:04}"), |i| if i == 4 { "failed" } else { "passed" });
        let page = crate::pagination::PageRequest { limit, after: after.map(|t| format!("tst_{t:04}")) };
        store
            .read_blocking::<_, Failure, _>(move |tx| {
                let mut read = tx.prepare(super::BATCH_RUN_TESTS_SQL.of(&page))?;
                let rows: Vec<(String, i64, i64)> = read
                    .query_map(params!["brn_1", page.after, page.fetch_limit()], |r| {
                        Ok((r.get(0)?, r.get(3)?, r.get(6)?))
                    })?
                    .collect::<Result<_, _>>()?;
                Ok((rows, read.get_status(rusqlite::StatementStatus::VmStep)))
            })
            .unwrap()
    }

    /// A page of a batch run's tests costs about its size, wherever it is
    /// and however large the batch run: it counted every run of the batch
    /// run for each page.
    #[test]
    fn a_page_of_a_batch_runs_tests_costs_its_page() {
        // The first page, and one after a cursor deep in the list.
        for after in [None, Some(50)] {
            let (small_rows, small) = steps_for_a_page(100, after, 10);
            let (large_rows, large) = steps_for_a_page(1000, after, 10);
            // Newest first, from the cursor on, each with its own runs.
            let first = after.unwrap_or(100);
            let expected: Vec<(String, i64, i64)> =
                (first - 11..first).rev().map(|t| (format!("tst_{t:04}"), 4, 3)).collect();
            assert_eq!(small_rows, expected);
            if after.is_some() {
                assert_eq!(large_rows, expected);
            }
            assert!(f64::from(large) < 1.2 * f64::from(small), "{small} steps in 100 tests, {large} in 1,000");
        }
    }

    /// The plan of a page of a batch run's tests: its tests from the key of
    /// `batch_run_tests`, each one's runs from `runs_by_test`, grouped in
    /// that order; nothing sorted, nothing scanned, no count of the whole
    /// batch run's runs put aside first.
    #[test]
    fn a_page_of_a_batch_runs_tests_walks_its_indexes() {
        crate::pagination::tests::on_schema(|tx| {
            for after in [false, true] {
                let steps = crate::pagination::tests::plan(tx, super::BATCH_RUN_TESTS_SQL.of_cursor(after))?;
                let runs = "SEARCH r USING INDEX runs_by_test (batch_run_id=? AND test_id=?) LEFT-JOIN";
                assert!(steps.iter().any(|s| s == runs), "{steps:#?}");
                for bad in ["TEMP B-TREE", "SCAN", "MATERIALIZE", "CO-ROUTINE"] {
                    assert!(!steps.iter().any(|s| s.contains(bad)), "{bad}: {steps:#?}");
                }
            }
            Ok(())
        });
    }

    #[test]
    fn a_batch_runs_tests_are_counted_in_one_pass_over_its_runs() {
        let (small, large) = (steps_to_count(100), steps_to_count(200));
        // Twice the tests, twice the work (not four times: each test reading
        // every run).
        assert!(f64::from(large) < 2.5 * f64::from(small), "{small} steps for 100 tests, {large} for 200");
    }
}
