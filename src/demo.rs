//! `sparring demo`: the whole product in one command. On a temporary data
//! dir it starts the server and two reference agents (one well-behaved, one
//! with `--bug wrong-day`), creates a project with personas, scenarios,
//! tests and a batch through the API (the generated client), runs the batch
//! with a live progress bar, and prints a results table and where to find
//! everything through the API.
//!
//! With `--llm-base-url` and `--llm-model` (an OpenAI-compatible endpoint;
//! key in `SPARRING_DEMO_LLM_API_KEY`), a simulated scenario and an LLM
//! judge are added.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use sparring_client::types;

use crate::agent::{self, AgentConfig, Bug, Fault};
use crate::remote::api_error;

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// An OpenAI-compatible endpoint (e.g. https://api.openai.com/v1) for a
    /// simulated caller and an LLM judge; its API key, if it needs one, in
    /// SPARRING_DEMO_LLM_API_KEY.
    #[arg(long, env = "SPARRING_DEMO_LLM_BASE_URL", value_parser = llm_base_url)]
    llm_base_url: Option<String>,
    /// The model to use with `--llm-base-url`.
    #[arg(long, env = "SPARRING_DEMO_LLM_MODEL", default_value = "gpt-4o-mini")]
    llm_model: String,
    /// Keep the server and agents running after the results, to explore the
    /// API, until Ctrl-C.
    #[arg(long)]
    keep_running: bool,
}

/// Refused before the demo starts anything, where the server refused it
/// once the project was made, in the client's words.
fn llm_base_url(url: &str) -> Result<String, String> {
    let url = url.trim();
    if crate::remote::is_http_url(url) {
        Ok(url.to_string())
    } else {
        Err("must look like https://host[:port][/path] (with http:// or https://)".to_string())
    }
}

fn body<T: DeserializeOwned>(v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).context("building a request body")
}

fn quiet_logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

fn agent_config(bug: Bug) -> AgentConfig {
    AgentConfig {
        bind: "127.0.0.1:0".parse().expect("a loopback address"),
        latency_ms: 120,
        jitter_ms: 120,
        seed: 7,
        error_rate: 0.0,
        bug,
        fault: Fault::None,
    }
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    // From before anything is made: Ctrl-C (or SIGTERM) stops the demo as
    // its end does, so that its data dir, which holds the secret key beside
    // a database with the LLM key sealed in it, is removed (a signal's
    // default action would kill the process and leave it).
    let mut interrupts = crate::signals::Interrupts::listen();
    // Readable by its owner only, as every data dir (see `create_data_dir`).
    let mut dir = tempfile::Builder::new();
    #[cfg(unix)]
    dir.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700));
    let dir = dir.tempdir().context("creating a temporary data dir")?;
    let config = sparring_impl::Config {
        bind: "127.0.0.1:0".parse()?,
        data_dir: dir.path().to_path_buf(),
        oidc: Vec::new(),
        oidc_refetch_interval: sparring_impl::oidc::REFETCH_INTERVAL,
        oidc_keys_max_age: sparring_impl::oidc::KEYS_MAX_AGE,
        secret_key_file: None,
        // Its reference agents listen on loopback.
        engine: sparring_impl::engine::worker::EngineConfig { allow_private_targets: true, ..Default::default() },
        starting_credits: sparring_impl::credits::DEFAULT_STARTING_CREDITS,
        body_idle_timeout: sparring_server::BODY_IDLE_TIMEOUT,
    };
    let server = sparring_impl::start(config, quiet_logger()).await?;
    let good = agent::serve(agent_config(Bug::None), quiet_logger()).await?;
    let buggy = agent::serve(agent_config(Bug::WrongDay), quiet_logger()).await?;
    let shown = tokio::select! {
        shown = show(&args, &server, good.local_addr(), buggy.local_addr(), dir.path()) => shown,
        signal = interrupts.recv() => Err(anyhow::anyhow!("interrupted ({signal}): the demo stops")),
    };
    if shown.is_ok() && args.keep_running {
        out!("\nThe server and agents keep running; Ctrl-C to stop.");
        interrupts.recv().await;
    }
    let stopped = async {
        good.close().await.map_err(|e| anyhow::anyhow!(e))?;
        buggy.close().await.map_err(|e| anyhow::anyhow!(e))?;
        server.shutdown().await
    };
    let stopped = stopped.await;
    dir.close().context("removing the demo's data dir")?;
    shown.and(stopped)
}

/// The demo itself, on a server and agents that run: a project, a batch run
/// with a live progress bar, and a results table.
async fn show(
    args: &DemoArgs,
    server: &sparring_impl::RunningServer,
    good: std::net::SocketAddr,
    buggy: std::net::SocketAddr,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let key = server.first_start_key.clone().context("a fresh data dir has an admin key")?;
    let base = format!("http://{}", server.local_addr());
    out!("Sparring demo");
    out!("  server           {base}  (data in {})", dir.display());
    out!("  reference agent  http://{good}  (books appointments)");
    out!("  buggy agent      http://{buggy}  (--bug wrong-day: confirms the wrong day)\n");

    let api = sparring_client::Client::with_api_key(&format!("{base}/v1"), &key).map_err(|e| anyhow::anyhow!(e))?;
    let project = api
        .create_project()
        .body(body::<types::CreateProjectRequest>(
            json!({"name": "Bright Smile Dental", "description": "sparring demo"}),
        )?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let p = project.id.clone();
    let channel = |name: &str, kind: &str, target: String| {
        body::<types::CreateChannelRequest>(json!({"project_id": p, "name": name, "kind": kind, "target": target,
                                                   "turn_timeout_ms": 5000}))
    };
    let http = api
        .create_channel()
        .body(channel("agent over http", "http", format!("http://{good}/http"))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let ws = api
        .create_channel()
        .body(channel("agent over websocket", "websocket", format!("ws://{good}/ws"))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let bad = api
        .create_channel()
        .body(channel("buggy agent", "http", format!("http://{buggy}/http"))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let mut personas = Vec::new();
    for (name, prompt) in [
        ("Dana", "A busy parent who wants the earliest afternoon slot."),
        ("Sam", "A retiree who speaks slowly and double-checks details."),
    ] {
        let persona = api
            .create_persona()
            .body(body::<types::CreatePersonaRequest>(json!({"project_id": p, "name": name, "prompt": prompt,
                                                               "language": "en-US"}))?)
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        personas.push(persona.id);
    }
    let booking = api
        .create_scenario()
        .body(body::<types::CreateScenarioRequest>(json!({
            "project_id": p, "name": "Book Tuesday at 3 pm", "mode": "scripted", "default_persona_id": personas[0],
            "first_message": "Hi, I'd like to book an appointment.",
            "steps": [
                {"say": "Tuesday at 3 pm, please.", "expect": [
                    {"type": "contains", "name": "confirms", "text": "confirmed"},
                    {"type": "contains", "name": "right day", "text": "Tuesday"}]},
                {"say": "That's all, goodbye.", "expect": [{"type": "agent_ended_call", "name": "hangs up"}]}
            ],
            "success_criteria": [{"type": "tool_called", "name": "books", "tool": "book_appointment",
                                  "arguments": {"day": "Tuesday"}},
                                 {"type": "max_latency_ms", "name": "answers fast", "percentile": "p95", "ms": 1000}],
            "max_duration_s": 60
        }))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let hours = api
        .create_scenario()
        .body(body::<types::CreateScenarioRequest>(json!({
            "project_id": p, "name": "Opening hours", "mode": "scripted", "default_persona_id": personas[1],
            "steps": [{"say": "When are you open?", "expect": [
                {"type": "contains", "name": "gives hours", "text": "Monday to Friday"}]}],
            "max_duration_s": 60
        }))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let test = |name: &str, channel: &str, scenario: &str, persona_ids: Value, iterations: u32| {
        body::<types::CreateTestRequest>(json!({"project_id": p, "name": name, "channel_id": channel,
                                                 "scenario_id": scenario, "persona_ids": persona_ids,
                                                 "iterations": iterations}))
    };
    let mut tests = vec![
        test("Books over http", &http.id, &booking.id, json!(personas), 5)?,
        test("Books over websocket", &ws.id, &booking.id, json!([]), 5)?,
        test("Answers opening hours", &http.id, &hours.id, json!([]), 5)?,
        test("Books the right day (buggy agent)", &bad.id, &booking.id, json!([]), 5)?,
    ];
    if let Some(base_url) = &args.llm_base_url {
        let mut config = json!({"project_id": p, "provider": "openai_compatible", "name": "demo LLM",
                                "config": {"base_url": base_url, "model": args.llm_model}});
        if let Ok(key) = std::env::var("SPARRING_DEMO_LLM_API_KEY") {
            config["credentials"] = json!({"api_key": key});
        }
        let llm = api
            .create_integration()
            .body(body::<types::CreateIntegrationRequest>(config)?)
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        let simulated = api
            .create_scenario()
            .body(body::<types::CreateScenarioRequest>(json!({
                "project_id": p, "name": "Simulated booking", "mode": "simulated", "default_persona_id": personas[0],
                "goal": "Book a dental appointment on a weekday afternoon, then hang up.", "integration_id": llm.id,
                "success_criteria": [{"type": "llm_judge", "name": "booked politely", "integration_id": llm.id,
                                      "prompt": "Did the agent confirm a booking with a day and a time, politely?"}],
                "max_turns": 12, "max_duration_s": 120
            }))?)
            .send()
            .await
            .map_err(api_error)?
            .into_inner();
        tests.push(test("Simulated caller books", &http.id, &simulated.id, json!([]), 2)?);
    } else {
        out!("(no --llm-base-url: the simulated-caller scenario and the LLM judge are left out)\n");
    }
    let mut test_ids = Vec::new();
    let mut names = BTreeMap::new();
    for t in tests {
        let made = api.create_test().body(t).send().await.map_err(api_error)?.into_inner();
        names.insert(made.id.clone(), made.name.clone());
        test_ids.push(made.id);
    }
    let batch = api
        .create_batch()
        .body(body::<types::CreateBatchRequest>(json!({"project_id": p, "name": "demo suite", "test_ids": test_ids,
                                                         "concurrency": 10}))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();
    let run = api
        .run_batch()
        .id(&batch.id)
        .body(body::<types::RunBatchRequest>(json!({"metadata": {"source": "sparring demo"}}))?)
        .send()
        .await
        .map_err(api_error)?
        .into_inner();

    // Live progress.
    let bar = indicatif::ProgressBar::new(run.counts.total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    let done = loop {
        let now = api.get_batch_run().id(&run.id).send().await.map_err(api_error)?.into_inner();
        let c = &now.counts;
        bar.set_position((c.total - c.queued - c.running).max(0) as u64);
        // Null only for a blind reviewer.
        let shown = |n: Option<i64>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
        bar.set_message(format!(
            "{} running, {} passed, {} failed, {} errors",
            c.running,
            shown(c.passed),
            shown(c.failed),
            shown(c.errored)
        ));
        if !matches!(now.status, types::BatchRunStatus::Queued | types::BatchRunStatus::Running) {
            bar.finish();
            break now;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    };

    // A row counts conversations: a test's iterations times its personas.
    out!("\n{:<36} {:>10} {:>9} {:>8}  failure reasons", "test", "calls", "pass rate", "p95 ms");
    let mut a_failure = None;
    for id in &test_ids {
        let results =
            api.list_test_results().id(id).limit(200).send().await.map_err(api_error)?.into_inner().test_results;
        if a_failure.is_none() {
            a_failure =
                results.iter().find(|r| r.status != Some(types::TestResultStatus::Passed)).map(|r| r.id.clone());
        }
        let passed = results.iter().filter(|r| r.status == Some(types::TestResultStatus::Passed)).count();
        let mut latencies: Vec<i64> =
            results.iter().flat_map(|r| r.transcript.iter().filter_map(|t| t.latency_ms)).collect();
        latencies.sort_unstable();
        let p95 = match latencies.len() {
            0 => "-".to_string(),
            n => latencies[(n * 95).div_ceil(100) - 1].to_string(),
        };
        let mut reasons: Vec<String> = results.iter().filter_map(|r| r.failure_reason.clone()).collect();
        reasons.sort();
        reasons.dedup();
        let rate = if results.is_empty() { 0.0 } else { passed as f64 / results.len() as f64 };
        out!(
            "{:<36} {:>10} {:>8.0}% {:>8}  {}",
            names[id],
            results.len(),
            rate * 100.0,
            p95,
            reasons.first().map(|r| crate::run::first_line(r)).unwrap_or_default()
        );
    }
    out!(
        "\nbatch run {}: {}, pass rate {:.0}%, passed: {} (the CI gate), {} credits charged",
        done.id,
        done.status,
        done.pass_rate.unwrap_or(0.0) * 100.0,
        done.passed.unwrap_or(false),
        done.credits_charged
    );
    out!("\nEverything through the API (x-api-key: {key}):");
    for path in [
        format!("/v1/batch-runs/{}", done.id),
        format!("/v1/batch-runs/{}/runs", done.id),
        format!("/v1/batch-runs/{}/tests", done.id),
        format!("/v1/tests/{}/results", test_ids[3]),
        "/v1/transactions".to_string(),
        format!("/v1/activity?project_id={p}"),
        "/v1/queue/stats".to_string(),
    ] {
        // Quoted: zsh (macOS's shell) would take the `?` of a query for a
        // glob and refuse the line ("no matches found").
        out!("  curl -s -H 'x-api-key: {key}' '{base}{path}'");
    }
    out!("\nThe same batch as a CI gate (exit 0 if it passes, 1 if not; see README):");
    out!("  SPARRING_API_KEY={key} sparring run --url {base} --batch {}", batch.id);
    if let Some(result) = a_failure {
        out!("\nA failed conversation, read in a terminal (transcript, latencies, evaluations):");
        out!("  SPARRING_API_KEY={key} sparring result --url {base} {result}");
    }
    if !args.keep_running {
        out!("\n(The demo's server stops now; run with --keep-running to explore it.)");
    }
    Ok(())
}
