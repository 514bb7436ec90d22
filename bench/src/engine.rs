//! `sparring-bench engine`: how many conversations the engine holds at
//! once, and what it costs.
//!
//! For each agent reply latency asked for (500 ms and 0 ms by default):
//!
//! 1. a fresh data dir (its database made here) with one user (`sparring admin create-key`) and
//!    enough credits (`sparring admin grant-credits`);
//! 2. the reference agent (`sparring agent --latency-ms L`) and `sparring
//!    serve` with room for every conversation at once (`--workers`,
//!    `--max-calls-per-user`), both release builds, as child processes;
//! 3. through the API: a project, an http channel to the agent, a persona,
//!    a scripted scenario of 5 caller turns, tests of 100 iterations each
//!    (the most a test has) making up `conversations`, and a batch of them
//!    with `concurrency` = `conversations`;
//! 4. the batch is run and its batch run polled until it ends. Measured:
//!    wall time from the run request to the end, against the ideal (every
//!    conversation at once, each taking its replies × the latency); agent
//!    replies per second; the most calls the agent saw at once (its own
//!    count, `GET /stats`); the server's peak RSS and CPU time; and the
//!    per-turn latency Sparring recorded against the agent's set latency
//!    (what the measurement itself adds).
//!
//! Every conversation must pass: a run that loses or fails conversations
//! is reported as such, not as a figure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};

use crate::process::{free_port, Log, Server};

#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The `sparring` binary (a release build).
    #[arg(long)]
    sparring: PathBuf,
    /// Where the data dirs and logs go (emptied first).
    #[arg(long, default_value = "target/bench-engine")]
    work_dir: PathBuf,
    /// Conversations per batch run (a multiple of 100).
    #[arg(long, default_value_t = 1000)]
    conversations: u32,
    /// The agent's reply latencies to measure, in ms.
    #[arg(long, value_delimiter = ',', default_value = "500,0")]
    latencies: Vec<u64>,
    /// Where to write the figures as JSON (besides printing them).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Iterations per test: the most a test may have.
const ITERATIONS: u32 = 100;

/// Caller lines per conversation: the first message and four steps.
const CALLER_TURNS: u64 = 5;

/// What one batch run measured.
#[derive(Debug, serde::Serialize)]
pub struct Figures {
    pub latency_ms: u64,
    pub conversations: u64,
    pub passed: u64,
    pub not_passed: u64,
    /// Agent replies per conversation (its greeting and one per caller
    /// line), from the agent's own count.
    pub replies_per_conversation: f64,
    pub wall_s: f64,
    /// Every conversation at once, each its replies × the latency.
    pub ideal_s: f64,
    pub replies_per_s: f64,
    pub conversations_per_s: f64,
    pub peak_concurrent_calls: i64,
    pub server_peak_rss_mb: f64,
    pub server_cpu_s: f64,
    pub server_cpu_ms_per_conversation: f64,
    /// Per-turn latency Sparring recorded (a sample: the first test's
    /// results), p50 and p99, ms.
    pub recorded_latency_p50_ms: i64,
    pub recorded_latency_p99_ms: i64,
}

fn run_admin(sparring: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(sparring).arg("admin").args(args).output().context("running sparring admin")?;
    anyhow::ensure!(
        out.status.success(),
        "sparring admin {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// A small JSON client of the API for the setup.
struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req =
            self.http.request(method.clone(), format!("{}/v1{path}", self.base)).header("x-api-key", &self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{method} {path}: {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(reqwest::Method::GET, path, None).await
    }
}

fn id(v: &Value) -> anyhow::Result<String> {
    v["id"].as_str().map(str::to_string).with_context(|| format!("no id in {v}"))
}

/// Creates the project, channel, persona, scenario, tests and batch; returns
/// the batch id and the tests' ids.
async fn setup(api: &Api, agent: &str, conversations: u32) -> anyhow::Result<(String, Vec<String>)> {
    let p = id(&api.post("/projects", json!({"name": "engine bench"})).await?)?;
    let channel = id(&api
        .post(
            "/channels",
            json!({"project_id": p, "name": "reference agent", "kind": "http", "target": format!("{agent}/http")}),
        )
        .await?)?;
    let persona = id(&api
        .post("/personas", json!({"project_id": p, "name": "Dana", "prompt": "A patient who wants a Tuesday slot."}))
        .await?)?;
    let scenario = id(&api
        .post(
            "/scenarios",
            json!({
                "project_id": p, "name": "Hours, then book Tuesday at 3 pm", "mode": "scripted",
                "default_persona_id": persona,
                "first_message": "Hi, I'd like to book an appointment.",
                "steps": [
                    {"say": "When are you open?", "expect": [{"type": "contains", "name": "hours", "text": "Monday to Friday"}]},
                    {"say": "Tuesday, please.", "expect": []},
                    {"say": "At 3 pm.", "expect": [{"type": "contains", "name": "confirms", "text": "confirmed"}]},
                    {"say": "That's all, goodbye.", "expect": [{"type": "agent_ended_call", "name": "hangs up"}]}
                ],
                "success_criteria": [{"type": "tool_called", "name": "books", "tool": "book_appointment",
                                      "arguments": {"day": "Tuesday"}}],
                "max_duration_s": 60
            }),
        )
        .await?)?;
    anyhow::ensure!(
        conversations.is_multiple_of(ITERATIONS) && conversations > 0,
        "--conversations must be a multiple of 100"
    );
    let mut tests = Vec::new();
    for i in 0..conversations / ITERATIONS {
        tests.push(id(&api
            .post(
                "/tests",
                json!({"project_id": p, "name": format!("booking {i}"), "channel_id": channel,
                       "scenario_id": scenario, "iterations": ITERATIONS}),
            )
            .await?)?);
    }
    let batch = id(&api
        .post(
            "/batches",
            json!({"project_id": p, "name": "engine bench", "test_ids": tests, "concurrency": conversations}),
        )
        .await?)?;
    Ok((batch, tests))
}

fn percentile(sorted: &[i64], p: usize) -> i64 {
    match sorted.len() {
        0 => 0,
        n => sorted[((n * p).div_ceil(100)).max(1) - 1],
    }
}

async fn agent_stats(http: &reqwest::Client, agent: &str) -> anyhow::Result<Value> {
    Ok(http.get(format!("{agent}/stats")).send().await?.error_for_status()?.json().await?)
}

/// One batch run against an agent with this latency.
async fn measure(o: &Options, latency_ms: u64) -> anyhow::Result<Figures> {
    let dir = o.work_dir.join(format!("latency-{latency_ms}ms"));
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&dir)?;
    let data = data_dir.to_str().context("a UTF-8 work dir")?;
    // The database as `serve` makes it: the admin commands need an existing one.
    drop(sparring_impl::open_store(&data_dir)?);
    let key =
        run_admin(&o.sparring, &["create-key", "--data-dir", data, "--user", "bench@example.com", "--label", "bench"])?;
    let credits = (o.conversations * 10).to_string();
    run_admin(
        &o.sparring,
        &["grant-credits", "--data-dir", data, "--user", "bench@example.com", "--amount", &credits],
    )?;

    let agent_port = free_port()?;
    let mut agent_cmd = Command::new(&o.sparring);
    agent_cmd.args(["agent", "--bind", &format!("127.0.0.1:{agent_port}"), "--latency-ms", &latency_ms.to_string()]);
    let agent_server = Server::spawn(
        "sparring agent",
        agent_cmd,
        format!("127.0.0.1:{agent_port}").parse()?,
        Log::File(&dir.join("agent.log")),
        "/stats",
    )
    .await?;
    let agent = format!("http://{}", agent_server.addr);

    let port = free_port()?;
    let room = o.conversations.to_string();
    let mut serve = Command::new(&o.sparring);
    serve.args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--data-dir", data]).args([
        "--workers",
        &room,
        "--max-calls-per-user",
        &room,
        "--log-format",
        "json",
        // The reference agent listens on loopback.
        "--allow-private-targets",
    ]);
    let server = Server::spawn(
        "sparring serve",
        serve,
        format!("127.0.0.1:{port}").parse()?,
        Log::File(&dir.join("server.log")),
        "/v1/openapi.json",
    )
    .await?;
    let api = Api { http: reqwest::Client::new(), base: format!("http://{}", server.addr), key };
    let (batch, tests) = setup(&api, &agent, o.conversations).await?;

    let before = agent_stats(&api.http, &agent).await?;
    server.reset_peak()?;
    let cpu_before = server.cpu_seconds()?;
    let started = Instant::now();
    let run = api.post(&format!("/batches/{batch}/run"), json!({"metadata": {"source": "engine bench"}})).await?;
    let run_id = id(&run)?;
    let total = run["counts"]["total"].as_u64().unwrap_or(0);
    let mut last_print = Instant::now();
    let done = loop {
        let now = api.get(&format!("/batch-runs/{run_id}")).await?;
        let status = now["status"].as_str().unwrap_or_default().to_string();
        if status != "queued" && status != "running" {
            break now;
        }
        if last_print.elapsed() > Duration::from_secs(2) {
            let c = &now["counts"];
            eprintln!(
                "    {:>5.1} s: {} running, {} passed of {total}",
                started.elapsed().as_secs_f64(),
                c["running"],
                c["passed"]
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall = started.elapsed().as_secs_f64();
    let cpu = server.cpu_seconds()? - cpu_before;
    let peak_rss_kib = server.peak_rss_kib()?;
    let after = agent_stats(&api.http, &agent).await?;

    let counts = &done["counts"];
    let passed = counts["passed"].as_u64().unwrap_or(0);
    let replies = after["turns"].as_u64().unwrap_or(0) - before["turns"].as_u64().unwrap_or(0);
    let calls = after["calls_started"].as_u64().unwrap_or(0) - before["calls_started"].as_u64().unwrap_or(0);
    let per_conversation = replies as f64 / calls.max(1) as f64;

    // The latency Sparring recorded per turn, on one test's conversations.
    let results = api.get(&format!("/tests/{}/results?limit=200", tests[0])).await?;
    let mut latencies: Vec<i64> = results["test_results"]
        .as_array()
        .context("no test_results")?
        .iter()
        .flat_map(|r| r["transcript"].as_array().into_iter().flatten())
        .filter_map(|t| t["latency_ms"].as_i64())
        .collect();
    latencies.sort_unstable();

    let sample = results["test_results"].as_array().and_then(|r| r.iter().find(|r| r["status"] != "passed")).cloned();
    if let Some(r) = sample {
        eprintln!("    a conversation that did not pass: {}", r["failure_reason"]);
    }
    drop(server);
    drop(agent_server);
    Ok(Figures {
        latency_ms,
        conversations: total,
        passed,
        not_passed: total - passed,
        replies_per_conversation: per_conversation,
        wall_s: wall,
        ideal_s: per_conversation * latency_ms as f64 / 1e3,
        replies_per_s: replies as f64 / wall,
        conversations_per_s: total as f64 / wall,
        peak_concurrent_calls: after["peak_active_calls"].as_i64().unwrap_or(0),
        server_peak_rss_mb: peak_rss_kib as f64 / 1024.0,
        server_cpu_s: cpu,
        server_cpu_ms_per_conversation: cpu * 1e3 / total.max(1) as f64,
        recorded_latency_p50_ms: percentile(&latencies, 50),
        recorded_latency_p99_ms: percentile(&latencies, 99),
    })
}

pub fn render(figures: &[Figures]) -> String {
    let mut out = String::from(
        "| agent latency | conversations (passed) | wall s | ideal s | wall / ideal | replies/s | conversations/s \
         | peak concurrent calls | recorded turn latency p50 / p99 ms | server CPU ms/conversation | server peak RSS MB |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for f in figures {
        let ratio = if f.ideal_s > 0.0 { format!("{:.2}", f.wall_s / f.ideal_s) } else { "–".into() };
        out.push_str(&format!(
            "| {} ms | {} ({}) | {:.2} | {:.2} | {ratio} | {:.0} | {:.0} | {} | {} / {} | {:.1} | {:.0} |\n",
            f.latency_ms,
            f.conversations,
            f.passed,
            f.wall_s,
            f.ideal_s,
            f.replies_per_s,
            f.conversations_per_s,
            f.peak_concurrent_calls,
            f.recorded_latency_p50_ms,
            f.recorded_latency_p99_ms,
            f.server_cpu_ms_per_conversation,
            f.server_peak_rss_mb
        ));
    }
    out
}

pub async fn run(o: Options) -> anyhow::Result<()> {
    let sparring = std::fs::canonicalize(&o.sparring).with_context(|| format!("{}", o.sparring.display()))?;
    let o = Options { sparring, ..o };
    if o.work_dir.exists() {
        std::fs::remove_dir_all(&o.work_dir).with_context(|| format!("emptying {}", o.work_dir.display()))?;
    }
    let mut all = Vec::new();
    for &latency in &o.latencies {
        println!("{} conversations of {CALLER_TURNS} caller turns, agent latency {latency} ms …", o.conversations);
        let f = measure(&o, latency).await.with_context(|| format!("agent latency {latency} ms"))?;
        println!(
            "  {} passed of {} in {:.2} s (ideal {:.2} s), {:.0} replies/s, peak {} calls at once, peak RSS {:.0} MB",
            f.passed,
            f.conversations,
            f.wall_s,
            f.ideal_s,
            f.replies_per_s,
            f.peak_concurrent_calls,
            f.server_peak_rss_mb
        );
        all.push(f);
    }
    println!("\n{}", render(&all));
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_vec_pretty(&all)?)?;
    }
    let lost: u64 = all.iter().map(|f| f.not_passed).sum();
    anyhow::ensure!(lost == 0, "{lost} conversations did not pass: the figures above do not count");
    Ok(())
}
