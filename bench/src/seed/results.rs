//! Test results, inserted by SQL into the engine's tables with the server
//! stopped: the API has no way to create them (the engine writes them when a
//! conversation ends).
//!
//! Each result is built as the typed `TestResult` the API returns (so a
//! field the spec does not have cannot slip in) and stored as the engine
//! stores it: the ids and filter columns in `test_results`, the whole
//! `TestResult` JSON in `document`. Each comes from a finished run of a
//! completed batch run (100 results per batch run), as the engine leaves
//! them.

use std::path::Path;

use anyhow::Context as _;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use sparring_server::types;

use super::{ProjectParts, Scale, Seeded};

/// Results per batch run.
const PER_BATCH_RUN: usize = 100;
/// Rows per transaction.
const PER_TRANSACTION: usize = 5_000;

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

/// One finished conversation of `test_id`, as the API shows it.
fn document(
    id: &str,
    p: &ProjectParts,
    test_id: &str,
    run_id: &str,
    batch_run_id: &str,
    call_id: &str,
    iteration: u32,
    passed: bool,
    turns: usize,
    started: DateTime<Utc>,
) -> anyhow::Result<types::TestResult> {
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
        "created_at": ended,
        "updated_at": ended,
    });
    serde_json::from_value(value).context("a seeded test result does not match the API's TestResult")
}

/// Inserts `scale.results` results, spread evenly over the seeded tests.
/// `None` when this build has no engine tables (no `test_results`).
pub fn insert(data_dir: &Path, seeded: &Seeded, scale: &Scale) -> anyhow::Result<Option<Vec<String>>> {
    let store = sparring_impl::open_store(data_dir)?;
    let has_table = store.write_blocking(|tx| {
        tx.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'test_results'", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(sparring_impl::store::StoreError::from)
    })?;
    if has_table == 0 {
        return Ok(None);
    }
    anyhow::bail!("seeding test results is written once the engine's tables land (see bench/src/seed/results.rs)")
}
