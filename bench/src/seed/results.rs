//! Test results, inserted by SQL into the engine's tables with the server
//! stopped: the API has no way to create them (the engine writes them when a
//! conversation ends).
//!
//! Each result is built as the typed `TestResult` the API returns (so a
//! field the spec does not have cannot slip in) and stored as the engine
//! stores it: the ids and filter columns in `test_results`, the whole
//! `TestResult` JSON in `document`. Each comes from a finished run of a
//! completed batch run (99 results per batch run), as the engine leaves
//! them.

use std::path::Path;

use anyhow::Context as _;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use sparring_server::types;

use super::{ProjectParts, Scale, Seeded};

const CALLER: [&str; 3] = [
    "Hi, I'd like to book a cleaning for next week, ideally in the morning before work.",
    "Tuesday would be best, but Wednesday works too if Tuesday is full. Around nine?",
    "Great. Can you also send me a text reminder the day before? My number is on file.",
];
const AGENT: [&str; 3] = [
    "Of course! I can help you book a cleaning. Let me check the schedule for next week's mornings.",
    "I have Tuesday at 9:00 or 9:30 with Dr. Alvarez, and Wednesday at 8:45. Which would you prefer?",
    "Your cleaning is confirmed for Tuesday at 9:00, and we'll text you a reminder on Monday afternoon.",
];

/// The metadata every seeded batch run was started with.
const METADATA: &str = r#"{"commit":"4f1c2e9","branch":"main"}"#;

/// Who and what one seeded conversation was.
struct Conversation<'a> {
    id: &'a str,
    project: &'a ProjectParts,
    test_id: &'a str,
    run_id: &'a str,
    batch_run_id: &'a str,
    call_id: &'a str,
    iteration: u32,
    passed: bool,
    turns: usize,
    started: DateTime<Utc>,
}

/// One finished conversation, as the API shows it.
fn document(c: &Conversation<'_>) -> anyhow::Result<types::TestResult> {
    let Conversation { id, project: p, test_id, run_id, batch_run_id, call_id, iteration, passed, turns, started } = *c;
    let mut at = 0i64;
    let mut transcript = Vec::with_capacity(turns);
    let mut latencies = Vec::new();
    for i in 0..turns {
        let (role, text, latency) = if i % 2 == 0 {
            ("caller", CALLER[(i / 2) % CALLER.len()], None)
        } else {
            let latency = 600 + ((i as i64 * 37 + iteration as i64 * 11) % 700);
            latencies.push(latency);
            ("agent", AGENT[(i / 2) % AGENT.len()], Some(latency))
        };
        let start = at + latency.unwrap_or(250);
        let end = start + 1500 + (text.len() as i64) * 40;
        transcript.push(json!({"role": role, "text": text, "start_ms": start, "end_ms": end, "latency_ms": latency}));
        at = end;
    }
    latencies.sort_unstable();
    let pct = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied();
    let ended = started + Duration::milliseconds(at);
    let score = if passed { 1.0 } else { 2.0 / 3.0 };
    let value = json!({
        "id": id,
        "project_id": p.id,
        "run_id": run_id,
        "batch_run_id": batch_run_id,
        "test_id": test_id,
        "call_id": call_id,
        "scenario_id": p.scenario_id,
        "scenario_version": 1,
        "persona_id": p.persona_id,
        "channel_id": p.channel_id,
        "iteration": iteration,
        "status": if passed { "passed" } else { "failed" },
        "blinded": null,
        "score": score,
        "failure_reason": if passed { None } else { Some("confirms: the agent never said \"confirmed\"") },
        "ended_reason": "caller_done",
        "started_at": started,
        "ended_at": ended,
        "duration_ms": at,
        "transcript": transcript,
        "tool_calls": [
            {"name": "check_schedule", "arguments": {"week": "next", "part_of_day": "morning"}, "turn": 1},
            {"name": "book_appointment", "arguments": {"day": "tuesday", "time": "09:00"}, "turn": 5}
        ],
        "metrics": {
            "turns": turns,
            "time_to_first_word_ms": latencies.first().map(|l| 250 + l),
            "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p95": pct(0.95), "max": latencies.last()}
        },
        "evaluations": [
            {"name": "confirms", "type": "contains", "passed": passed, "score": if passed { 1.0 } else { 0.0 },
             "reason": if passed { "the agent said \"confirmed\" in turn 6" } else { "the agent never said \"confirmed\"" },
             "critical": true, "source": "rule"},
            {"name": "no apology loop", "type": "not_contains", "passed": true, "score": 1.0, "reason": "",
             "critical": true, "source": "rule"},
            {"name": "snappy", "type": "max_latency_ms", "passed": true, "score": 1.0,
             "reason": format!("p95 latency {} ms ≤ 1500 ms", pct(0.95).unwrap_or(0)), "critical": true, "source": "rule"}
        ],
        "credits": 1 + at / 60_000,
        "metadata": serde_json::from_str::<serde_json::Value>(METADATA)?,
        "created_at": ended,
        "updated_at": ended,
    });
    serde_json::from_value(value).context("a seeded test result does not match the API's TestResult")
}

/// Tests per seeded batch run; each runs its tests' 3 iterations.
const TESTS_PER_BATCH_RUN: usize = 33;
const ITERATIONS: u32 = 3;
/// Batch runs per transaction.
const BATCH_RUNS_PER_TRANSACTION: usize = 50;

/// One finished run and its result.
struct Finished {
    run_id: String,
    result: types::TestResult,
    document: String,
}

/// A completed batch run as the engine leaves it.
struct BatchRun {
    id: String,
    project: usize,
    started: DateTime<Utc>,
    runs: Vec<Finished>,
}

fn t(at: &DateTime<Utc>) -> String {
    sparring_impl::ids::format_time(at)
}

fn write_batch_run(
    tx: &rusqlite::Transaction<'_>,
    user_id: &str,
    p: &ProjectParts,
    b: &BatchRun,
) -> rusqlite::Result<()> {
    let passed = b.runs.iter().filter(|r| r.result.status == Some(types::TestResultStatus::Passed)).count() as i64;
    let total = b.runs.len() as i64;
    let charged: i64 = b.runs.iter().map(|r| r.result.credits).sum();
    let finished = b.runs.iter().map(|r| r.result.ended_at).max().unwrap_or(b.started);
    tx.prepare_cached(
        "INSERT INTO batch_runs (id, project_id, user_id, source, channel_id, status, concurrency, total, queued,
                                 running, passed, failed, errored, cancelled, verdict, metadata, credits_reserved,
                                 credits_charged, started_at, finished_at, created_at, updated_at)
         VALUES (?1, ?2, ?3, 'channel', ?4, 'completed', 10, ?5, 0, 0, ?6, ?7, 0, 0, ?8, ?9, ?10, ?11, ?12, ?13, ?12, ?13)",
    )?
    .execute(rusqlite::params![
        b.id,
        p.id,
        user_id,
        p.channel_id,
        total,
        passed,
        total - passed,
        passed == total,
        METADATA,
        total * 10,
        charged,
        t(&b.started),
        t(&finished),
    ])?;
    let mut tests = tx.prepare_cached(
        "INSERT OR IGNORE INTO batch_run_tests (batch_run_id, test_id, pass_threshold) VALUES (?1, ?2, 0.67)",
    )?;
    let mut run = tx.prepare_cached(
        "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, persona_id, iteration, status,
                           attempt, call_id, test_result_id, queued_at, queued_ms, started_at, started_ms,
                           finished_at, finished_ms, credits, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 1, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?12, ?16)",
    )?;
    // The engine's own insert (engine/queue.rs `finish`).
    let mut result = tx.prepare_cached(
        "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status, created_at, document)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for f in &b.runs {
        let r = &f.result;
        let status = r.status.expect("a seeded result has its automated verdict").to_string();
        tests.execute(rusqlite::params![b.id, r.test_id])?;
        run.execute(rusqlite::params![
            f.run_id,
            b.id,
            p.id,
            user_id,
            r.test_id,
            r.scenario_id,
            r.persona_id,
            r.iteration.get(),
            status,
            r.call_id,
            r.id,
            t(&b.started),
            b.started.timestamp_millis(),
            t(&r.started_at),
            r.started_at.timestamp_millis(),
            t(&r.ended_at),
            r.ended_at.timestamp_millis(),
            r.credits,
        ])?;
        result.execute(rusqlite::params![
            r.id,
            r.project_id,
            r.run_id,
            r.batch_run_id,
            r.test_id,
            r.call_id,
            status,
            t(&r.created_at),
            f.document,
        ])?;
    }
    Ok(())
}

/// Inserts `scale.results` results, spread evenly over the seeded tests:
/// completed batch runs of 33 tests × 3 iterations, each project in turn,
/// ten minutes apart, ending now. `None` when this build has no engine
/// tables (no `test_results`).
pub fn insert(data_dir: &Path, seeded: &Seeded, scale: &Scale) -> anyhow::Result<Option<Vec<String>>> {
    use sparring_impl::store::StoreError;
    let store = sparring_impl::open_store(data_dir)?;
    let (has_table, user_id) = store.write_blocking(|tx| {
        let n = tx.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'test_results'",
            [],
            |r| r.get::<_, i64>(0),
        )?;
        let user: String =
            tx.query_row("SELECT id FROM users WHERE oidc_subject = ?1", [&seeded.subject], |r| r.get(0))?;
        Ok::<_, StoreError>((n, user))
    })?;
    if has_table == 0 {
        return Ok(None);
    }
    let per_batch_run = TESTS_PER_BATCH_RUN * ITERATIONS as usize;
    let batch_runs = scale.results.div_ceil(per_batch_run);
    let first_start = Utc::now() - Duration::minutes(10 * batch_runs as i64);
    let mut ids = Vec::with_capacity(scale.results);
    let mut b = 0;
    while ids.len() < scale.results {
        let mut chunk = Vec::new();
        while chunk.len() < BATCH_RUNS_PER_TRANSACTION && ids.len() < scale.results {
            let project = b % seeded.projects.len();
            let p = &seeded.projects[project];
            anyhow::ensure!(!p.test_ids.is_empty(), "project {} has no tests to have results", p.id);
            let id = sparring_impl::ids::new_id("brn");
            let started = first_start + Duration::minutes(10 * b as i64);
            let first_test = (b / seeded.projects.len()) * TESTS_PER_BATCH_RUN;
            let mut runs = Vec::new();
            'tests: for j in 0..TESTS_PER_BATCH_RUN {
                let test_id = &p.test_ids[(first_test + j) % p.test_ids.len()];
                for iteration in 1..=ITERATIONS {
                    if ids.len() == scale.results {
                        break 'tests;
                    }
                    let result_id = sparring_impl::ids::new_id("trs");
                    let run_id = sparring_impl::ids::new_id("run");
                    let call_id = sparring_impl::ids::new_id("call");
                    // One conversation in seven fails its `confirms` check.
                    let passed = (ids.len() % 7) != 3;
                    let at = started + Duration::seconds(20 * (j as i64) + iteration as i64);
                    let result = document(&Conversation {
                        id: &result_id,
                        project: p,
                        test_id,
                        run_id: &run_id,
                        batch_run_id: &id,
                        call_id: &call_id,
                        iteration,
                        passed,
                        turns: scale.turns,
                        started: at,
                    })?;
                    let document = serde_json::to_string(&result)?;
                    ids.push(result_id);
                    runs.push(Finished { run_id, result, document });
                }
            }
            chunk.push(BatchRun { id, project, started, runs });
            b += 1;
        }
        store.write_blocking(|tx| {
            for batch_run in &chunk {
                write_batch_run(tx, &user_id, &seeded.projects[batch_run.project], batch_run)?;
            }
            Ok::<_, StoreError>(())
        })?;
    }
    drop(store);
    // Everything into the database file and the WAL emptied, as a server
    // that has been running for a while would have it: otherwise the run's
    // server starts on a 64 MiB WAL, reads through it, and its first write
    // triggers a checkpoint of all of it in the middle of a measurement.
    let conn = rusqlite::Connection::open(data_dir.join(sparring_impl::DATABASE_FILE))?;
    let (busy, _, _): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    anyhow::ensure!(busy == 0, "could not checkpoint the seeded database: it is still in use");
    Ok(Some(ids))
}
