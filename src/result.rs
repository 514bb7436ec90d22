//! `sparring result`: one conversation in a terminal — the verdict and why,
//! the transcript with each agent reply's latency, the tool calls and every
//! evaluation. What a person reads after `sparring run` names a failed
//! result.

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::Args;
use sparring_client::types;

use crate::remote::{api_error, Remote};

#[derive(Args, Clone, Debug)]
pub struct ResultArgs {
    /// A test result id (`trs_…`), or the call id the agent was sent (the
    /// `x-sparring-call-id` header; a telephony provider's call id).
    id: String,
    #[command(flatten)]
    remote: Remote,
    /// Print the test result as JSON instead.
    #[arg(long)]
    json: bool,
}

pub async fn main(args: ResultArgs) -> anyhow::Result<()> {
    if args.id.trim().is_empty() {
        anyhow::bail!("give the id of a test result (`trs_…`) or a call id");
    }
    let api = args.remote.client()?;
    let result = if args.id.starts_with("trs_") {
        api.get_test_result().id(&args.id).send().await
    } else {
        api.get_test_result_by_call().call_id(&args.id).send().await
    };
    let result = match result {
        Ok(result) => result.into_inner(),
        Err(e) => {
            // Not a call either: an id of ours of another kind (the `run_…`
            // beside a failure in `sparring run`'s report, say) is named,
            // with where its results are.
            let not_found =
                matches!(&e, sparring_client::Error::ErrorResponse(r) if r.status() == http::StatusCode::NOT_FOUND);
            if let Some((kind, look)) = other_kind(&args.id).filter(|_| not_found) {
                anyhow::bail!("`{}` is the id of {kind}, not of a test result (`trs_…`) or a call: {look}", args.id);
            }
            return Err(api_error(e).context(format!("reading test result {}", args.id)));
        }
    };
    let text = if args.json { serde_json::to_string_pretty(&result)? + "\n" } else { show(&result) };
    crate::remote::write_stdout(format_args!("{text}")).context("writing the result")
}

/// The kind of one of the API's ids other than a test result's, by its
/// prefix, and where the results it leads to are.
fn other_kind(id: &str) -> Option<(&'static str, String)> {
    let (prefix, _) = id.split_once('_')?;
    let of_runs = |brn: &str| format!("a run's result is its `test_result_id` in `GET /v1/batch-runs/{brn}/runs`");
    let of_tests = "a test's results are listed by `GET /v1/tests/tst_…/results`".to_string();
    Some(match prefix {
        "run" => ("a run", of_runs("brn_…")),
        "brn" => ("a batch run", of_runs(id)),
        "tst" => ("a test", format!("its results are listed by `GET /v1/tests/{id}/results`")),
        "bat" => ("a batch", of_runs("brn_…")),
        "cal" => ("a calibration review", "its results are its `test_result_ids`".to_string()),
        "rev" => ("a review", "its result is its `test_result_id`".to_string()),
        "chn" => ("a channel", of_tests),
        "scn" => ("a scenario", of_tests),
        "per" => ("a persona", of_tests),
        "prj" => ("a project", of_tests),
        "int" => ("an integration", of_tests),
        "usr" => ("a user", of_tests),
        "key" => ("an API key", of_tests),
        "txn" => ("a transaction", of_tests),
        "act" => ("an activity record", of_tests),
        "whd" => ("a webhook delivery", of_tests),
        _ => return None,
    })
}

fn seconds(ms: i64) -> String {
    format!("{:.2}s", ms as f64 / 1000.0)
}

fn ms(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v} ms"))
}

/// The result as text.
pub fn show(r: &types::TestResult) -> String {
    let mut out = String::new();
    let verdict = match (&r.status, r.score) {
        (Some(status), Some(score)) => format!("{} (score {score:.2})", status.to_string().to_uppercase()),
        (Some(status), None) => status.to_string().to_uppercase(),
        (None, _) => "verdict hidden".to_string(),
    };
    let _ = writeln!(out, "result {}: {verdict}", r.id);
    if let Some(reason) = &r.failure_reason {
        let _ = writeln!(out, "why: {reason}");
    }
    if let Some(blinded) = &r.blinded {
        let _ = writeln!(out, "hidden: {}", blinded.reason);
        // Their evaluations are hidden, but a review labels them by name.
        if !blinded.evaluator_names.is_empty() {
            let _ = writeln!(out, "to label: {}", blinded.evaluator_names.join("; "));
        }
    }
    let _ = writeln!(
        out,
        "test {}, iteration {}; scenario {} v{}; persona {}; channel {}",
        r.test_id,
        r.iteration,
        r.scenario_id,
        r.scenario_version,
        r.persona_id.as_deref().unwrap_or("-"),
        r.channel_id
    );
    let call = match &r.call_id {
        Some(id) => format!("call {id}"),
        None => "no call (the agent was never reached)".to_string(),
    };
    let _ = writeln!(
        out,
        "{call}: {} turns in {}, ended: {}; {} credit{}; batch run {}",
        r.metrics.turns,
        seconds(r.duration_ms),
        r.ended_reason,
        r.credits,
        if r.credits == 1 { "" } else { "s" },
        r.batch_run_id
    );
    let l = &r.metrics.latency_ms;
    let _ = writeln!(
        out,
        "agent latency: p50 {}, p90 {}, p95 {}, max {}; first words after {}",
        ms(l.p50),
        ms(l.p90),
        ms(l.p95),
        ms(l.max),
        ms(r.metrics.time_to_first_word_ms)
    );

    let _ = writeln!(out, "\ntranscript:");
    let mut tools = r.tool_calls.iter().peekable();
    for (i, turn) in r.transcript.iter().enumerate() {
        let latency = turn.latency_ms.map(|l| format!("{l} ms")).unwrap_or_default();
        let head = format!("{:>8}  {:<6}  {latency:>8}", seconds(turn.start_ms), turn.role.to_string());
        let mut lines = turn.text.lines();
        let _ = writeln!(out, "{head}  {}", lines.next().unwrap_or_default());
        for line in lines {
            let _ = writeln!(out, "{:width$}  {line}", "", width = head.chars().count());
        }
        // The tool calls of this turn (by its index in the transcript).
        while let Some(call) = tools.next_if(|c| usize::try_from(c.turn).is_ok_and(|t| t <= i)) {
            let arguments = serde_json::Value::Object(call.arguments.clone());
            let _ = writeln!(out, "{:>8}  {:<6}  {:>8}  {}({arguments})", "", "tool", "", call.name);
        }
    }
    for call in tools {
        let arguments = serde_json::Value::Object(call.arguments.clone());
        let _ = writeln!(out, "{:>8}  {:<6}  {:>8}  {}({arguments}), turn {}", "", "tool", "", call.name, call.turn);
    }

    if !r.evaluations.is_empty() {
        let _ = writeln!(out, "\nevaluations:");
        let width = r.evaluations.iter().map(|e| e.name.chars().count()).max().unwrap_or(0).min(40);
        for e in &r.evaluations {
            let mark = if e.passed { "pass" } else { "FAIL" };
            let critical = if e.critical { "" } else { " (not critical)" };
            let _ = writeln!(
                out,
                "  {mark}  {:<width$}  {} ({}){critical}: {}",
                e.name,
                e.type_,
                e.source,
                e.reason.lines().next().unwrap_or_default()
            );
        }
    }
    // The agent's words and the reasons quoting them go to a terminal.
    crate::remote::printable(&out)
}
