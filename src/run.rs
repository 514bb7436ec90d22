//! `sparring run`: the CI gate. Starts a batch run (of a batch, a channel's
//! tests or one test) on a Sparring server, shows its progress, prints what
//! failed and why, and exits with the verdict:
//!
//! - 0: the batch run completed and every test met its pass threshold;
//! - 1: it completed and some test did not;
//! - 2: no verdict: bad arguments, an API error (credential, not found,
//!   insufficient credits, …), the batch run cancelled, or the wait given up
//!   (`--timeout`, an interrupt).
//!
//! Interrupted (Ctrl-C, SIGTERM: a CI job cancelled) or timed out, it cancels
//! the batch run it started, so an abandoned pipeline spends no more credits;
//! `--keep-running` leaves it going instead.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use sparring_client::types;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Run this batch (`bat_…`).
    #[arg(long, conflicts_with = "channel")]
    batch: Option<String>,
    /// Run this channel's tests (`chn_…`); with `--test`, only those.
    #[arg(long)]
    channel: Option<String>,
    /// Run this test (`tst_…`). With `--channel`, one of its tests to run
    /// (repeatable).
    #[arg(long = "test", value_name = "TEST", conflicts_with = "batch")]
    tests: Vec<String>,
    /// The server (its `/v1` may be left out).
    #[arg(long, env = "SPARRING_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An API key of yours. Prefer the environment variable: a command's
    /// arguments can be read by other users of the machine.
    #[arg(long, env = "SPARRING_API_KEY", hide_env_values = true)]
    api_key: String,
    /// Kept with the batch run, e.g. `--metadata commit=$GIT_SHA`
    /// (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// Print the batch run's id and exit once it is started, without waiting.
    #[arg(long, conflicts_with_all = ["timeout", "keep_running"])]
    no_wait: bool,
    /// Stop waiting after this many seconds, and cancel the batch run (exit 2).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// When interrupted or timed out, leave the batch run going rather than
    /// cancel it.
    #[arg(long)]
    keep_running: bool,
    /// Print the batch run as JSON on stdout instead of the summary.
    #[arg(long)]
    json: bool,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// What to run.
enum Source {
    Batch(String),
    Channel(String, Vec<String>),
    Test(String),
}

impl RunArgs {
    fn source(&self) -> anyhow::Result<Source> {
        match (&self.batch, &self.channel, self.tests.as_slice()) {
            (Some(batch), None, []) => Ok(Source::Batch(batch.clone())),
            (None, Some(channel), tests) => Ok(Source::Channel(channel.clone(), tests.to_vec())),
            (None, None, [test]) => Ok(Source::Test(test.clone())),
            (None, None, []) => anyhow::bail!("say what to run: --batch, --channel or --test"),
            (None, None, _) => anyhow::bail!("--test more than once needs --channel (the channel of those tests)"),
            _ => anyhow::bail!("give one of --batch, --channel (with or without --test) or --test"),
        }
    }
}

/// How long to wait between two reads of the batch run.
const POLL: Duration = Duration::from_millis(500);
/// A line of progress when stderr is not a terminal (a CI log) this often,
/// changed or not: a batch run queued behind others, or a long conversation,
/// does not leave the log silent for minutes.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Reads of the batch run that fail in a row (the server restarting, the
/// network) before giving up.
const MAX_FAILED_POLLS: u32 = 8;

/// Cancels that fail in a row before giving up (1.5 s of pauses in all).
const MAX_FAILED_CANCELS: u32 = 3;

/// Runs `sparring run` and gives its exit code.
pub async fn main(args: RunArgs) -> ExitCode {
    match run(args).await {
        Ok(Verdict::Passed) => ExitCode::SUCCESS,
        Ok(Verdict::Failed) => ExitCode::from(1),
        Ok(Verdict::None) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

enum Verdict {
    Passed,
    Failed,
    None,
}

/// An API error as a person reads it: the status, the stable code and the
/// server's message.
fn api_error(e: sparring_client::Error<types::Error>) -> anyhow::Error {
    match e {
        sparring_client::Error::ErrorResponse(r) => {
            let status = r.status();
            let body = r.into_inner();
            anyhow::anyhow!("{} {}: {} (request {})", status.as_u16(), body.error_code, body.message, body.request_id)
        }
        sparring_client::Error::CommunicationError(e) => anyhow::Error::new(e).context("could not reach the server"),
        other => anyhow::anyhow!("{other}"),
    }
}

/// Whether a failed read of the batch run is worth another try.
fn transient(e: &sparring_client::Error<types::Error>) -> bool {
    match e {
        sparring_client::Error::ErrorResponse(r) => r.status().is_server_error(),
        sparring_client::Error::CommunicationError(_) | sparring_client::Error::ResponseBodyError(_) => true,
        sparring_client::Error::UnexpectedResponse(r) => r.status().is_server_error(),
        // Not JSON at all: a page of a proxy or load balancer in front of a
        // server that is away (JSON of another shape is not tried again).
        sparring_client::Error::InvalidResponsePayload(_, e) => {
            matches!(e.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof)
        }
        _ => false,
    }
}

fn base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if url.ends_with("/v1") {
        url.to_string()
    } else {
        format!("{url}/v1")
    }
}

async fn run(args: RunArgs) -> anyhow::Result<Verdict> {
    let source = args.source()?;
    let mut interrupts = Interrupts::listen();
    let api = sparring_client::Client::with_api_key(&base_url(&args.url), &args.api_key)
        .map_err(|e| anyhow::anyhow!("the API key cannot be sent as a header: {e}"))?;
    let metadata: serde_json::Map<String, serde_json::Value> =
        args.metadata.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
    let started = match &source {
        Source::Batch(id) => {
            api.run_batch().id(id).body(types::RunBatchRequest { metadata: metadata.clone() }).send().await
        }
        Source::Channel(id, tests) => {
            let body = types::RunChannelRequest { metadata: metadata.clone(), test_ids: tests.clone() };
            api.run_channel().id(id).body(body).send().await
        }
        Source::Test(id) => {
            api.run_test().id(id).body(types::RunTestRequest { metadata: metadata.clone() }).send().await
        }
    }
    .map_err(api_error)
    .context("starting the batch run")?
    .into_inner();
    if args.no_wait {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&started)?);
        } else {
            println!("{}", started.id);
        }
        return Ok(Verdict::Passed);
    }
    eprintln!("started batch run {} ({} runs)", started.id, started.counts.total);

    let ended = match wait(&api, &started, &args, &mut interrupts).await? {
        Waited::Ended(run) => run,
        Waited::GaveUp(why) => {
            if args.keep_running {
                eprintln!("{why}; batch run {} keeps running", started.id);
            } else {
                match cancel(&api, &started.id).await {
                    // It ended before the cancel (unseen: the last reads
                    // failed): its verdict stands.
                    Ok(run)
                        if !matches!(
                            run.status,
                            types::BatchRunStatus::Queued
                                | types::BatchRunStatus::Running
                                | types::BatchRunStatus::Cancelled
                        ) =>
                    {
                        eprintln!("{why}, but batch run {} had already ended: {}", started.id, run.status);
                        return finish(&api, &run, &args).await;
                    }
                    Ok(_) => eprintln!("{why}; cancelled batch run {}", started.id),
                    Err(e) => {
                        eprintln!("{why}; could not cancel batch run {}, it may still be running: {e:#}", started.id)
                    }
                }
            }
            return Ok(Verdict::None);
        }
    };
    finish(&api, &ended, &args).await
}

/// The verdict of a batch run that ended, and its summary (or JSON).
async fn finish(api: &sparring_client::Client, ended: &types::BatchRun, args: &RunArgs) -> anyhow::Result<Verdict> {
    let verdict = match (&ended.status, ended.passed) {
        (types::BatchRunStatus::Completed, Some(true)) => Verdict::Passed,
        (types::BatchRunStatus::Completed, Some(false)) => Verdict::Failed,
        _ => Verdict::None,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(ended)?);
    } else {
        summary(api, ended).await;
    }
    Ok(verdict)
}

/// Cancels the batch run, and gives it as the cancel left it. A failure that
/// may pass (the server restarting) is tried again, briefly: a CI runner
/// kills a cancelled job seconds after its SIGTERM. Cancelling twice is
/// harmless.
async fn cancel(api: &sparring_client::Client, id: &str) -> anyhow::Result<types::BatchRun> {
    let mut failed = 0;
    loop {
        match api.cancel_batch_run().id(id).send().await {
            Ok(run) => return Ok(run.into_inner()),
            Err(e) if transient(&e) && failed + 1 < MAX_FAILED_CANCELS => {
                failed += 1;
                tokio::time::sleep(POLL * failed).await;
            }
            Err(e) => return Err(api_error(e)),
        }
    }
}

enum Waited {
    Ended(Box<types::BatchRun>),
    GaveUp(String),
}

/// Shows progress until the batch run ends, the timeout passes or the
/// process is told to stop.
async fn wait(
    api: &sparring_client::Client,
    started: &types::BatchRun,
    args: &RunArgs,
    interrupts: &mut Interrupts,
) -> anyhow::Result<Waited> {
    let deadline = args.timeout.map(|s| Instant::now() + Duration::from_secs(s));
    let mut progress = Progress::new(started);
    let mut failed_polls = 0;
    let mut current = started.clone();
    loop {
        if !matches!(current.status, types::BatchRunStatus::Queued | types::BatchRunStatus::Running) {
            progress.finish(&current);
            return Ok(Waited::Ended(Box::new(current)));
        }
        let pause = POLL * 2u32.pow(failed_polls.min(4));
        // The pause and the read: a read that hangs (a server overloaded)
        // holds up neither an interrupt nor the timeout.
        let read = async {
            tokio::time::sleep(pause).await;
            api.get_batch_run().id(&started.id).send().await
        };
        let read = tokio::select! {
            read = read => read,
            () = past(deadline) => {
                progress.abandon();
                return Ok(Waited::GaveUp(format!("timed out after {} s", args.timeout.unwrap_or_default())));
            }
            signal = interrupts.recv() => {
                progress.abandon();
                return Ok(Waited::GaveUp(format!("interrupted ({signal})")));
            }
        };
        match read {
            Ok(run) => {
                failed_polls = 0;
                current = run.into_inner();
                progress.show(&current);
            }
            Err(e) if transient(&e) && failed_polls + 1 < MAX_FAILED_POLLS => {
                failed_polls += 1;
                progress.note(&format!("reading the batch run failed ({}); trying again", api_error(e)));
            }
            Err(e) => {
                progress.abandon();
                return Err(api_error(e).context(format!("reading batch run {}", started.id)));
            }
        }
    }
}

/// Resolves once `deadline` has passed; never without one.
async fn past(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The signals that ask the process to stop. Listened to from before the
/// batch run is started, so that one arriving at any moment after is seen.
struct Interrupts {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    fn listen() -> Interrupts {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Interrupts { signals: signal(SignalKind::interrupt()).ok().zip(signal(SignalKind::terminate()).ok()) }
        }
        #[cfg(not(unix))]
        Interrupts {}
    }

    /// Resolves when one arrives, with its name.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some((int, term)) = &mut self.signals {
            return tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// Progress on stderr: a bar on a terminal, otherwise (a CI log) a line
/// every `LOG_EVERY`.
struct Progress {
    id: String,
    bar: Option<indicatif::ProgressBar>,
    /// When the last line was written.
    last_line: Option<Instant>,
}

/// Null counts are hidden from a blind reviewer.
fn shown(n: Option<i64>) -> String {
    n.map_or_else(|| "?".to_string(), |n| n.to_string())
}

/// How the runs stand: "3 passed, 1 failed, 0 errors, 0 cancelled; 2
/// running, 4 queued".
fn counts_detail(run: &types::BatchRun) -> String {
    let c = &run.counts;
    format!(
        "{} passed, {} failed, {} errors, {} cancelled; {} running, {} queued",
        shown(c.passed),
        shown(c.failed),
        shown(c.errored),
        c.cancelled,
        c.running,
        c.queued
    )
}

fn counts_line(run: &types::BatchRun) -> String {
    let c = &run.counts;
    format!("{}/{} ended: {}", c.total - c.queued - c.running, c.total, counts_detail(run))
}

impl Progress {
    fn new(run: &types::BatchRun) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(run.counts.total.max(0) as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
                    .expect("a valid template"),
            );
            bar
        });
        let mut progress = Progress { id: run.id.clone(), bar, last_line: None };
        progress.show(run);
        progress
    }

    fn show(&mut self, run: &types::BatchRun) {
        match &self.bar {
            Some(bar) => {
                let c = &run.counts;
                bar.set_position((c.total - c.queued - c.running).max(0) as u64);
                bar.set_message(counts_detail(run));
            }
            None => {
                if self.last_line.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    eprintln!("{}: {}", self.id, counts_line(run));
                    self.last_line = Some(Instant::now());
                }
            }
        }
    }

    fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&mut self, run: &types::BatchRun) {
        match &self.bar {
            Some(bar) => {
                bar.set_message(counts_detail(run));
                bar.finish();
            }
            None => eprintln!("{}: {}: {}", self.id, run.status, counts_line(run)),
        }
    }

    fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

/// One test's runs in the batch run.
#[derive(Default)]
struct TestRuns {
    total: u32,
    passed: u32,
    /// The result of one run that failed or ended in error, to show why.
    failure: Option<String>,
}

/// The batch run's verdict, and per test how its runs ended and why one
/// failed. The verdict is known already: a table that cannot be read (the
/// server gone since) is said on stderr and left out.
async fn summary(api: &sparring_client::Client, run: &types::BatchRun) {
    let per_test = match runs_per_test(api, run).await {
        Ok(per_test) => per_test,
        Err(e) => {
            eprintln!("no per-test summary: {e:#}");
            BTreeMap::new()
        }
    };

    let hidden = run.passed.is_none() && run.blinded.is_some();
    if !hidden && !per_test.is_empty() {
        let mut rows = Vec::new();
        for (test_id, t) in &per_test {
            // A test deleted since is shown by its id.
            let test = api.get_test().id(test_id).send().await.ok().map(|t| t.into_inner());
            let name = test.as_ref().map_or_else(|| test_id.clone(), |t| t.name.clone());
            let threshold = test.as_ref().map(|t| t.pass_threshold);
            let met = threshold.map(|th| sparring_impl::engine::evaluate::test_passed(t.passed, t.total, th));
            let why = match (&t.failure, met) {
                (Some(result_id), Some(false) | None) => {
                    let reason = api
                        .get_test_result()
                        .id(result_id)
                        .send()
                        .await
                        .ok()
                        .and_then(|r| r.into_inner().failure_reason)
                        .unwrap_or_default();
                    format!("{}  ({result_id})", first_line(&reason))
                }
                _ => String::new(),
            };
            rows.push((name, t, threshold, met, why));
        }
        let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(4).clamp(4, 48);
        println!("{:<width$}  {:>9}  {:>6}  {:<4}  why", "test", "passed", "needs", "met");
        for (name, t, threshold, met, why) in rows {
            let needs = threshold.map_or_else(|| "?".to_string(), |th| format!("{:.0}%", th * 100.0));
            let met = match met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "?",
            };
            let passed = format!("{}/{}", t.passed, t.total);
            let row = format!("{:<width$}  {passed:>9}  {needs:>6}  {met:<4}  {why}", truncate(&name, width));
            println!("{}", row.trim_end());
        }
        println!();
    }
    let verdict = match (&run.status, run.passed) {
        (types::BatchRunStatus::Completed, Some(true)) => "PASSED".to_string(),
        (types::BatchRunStatus::Completed, Some(false)) => "FAILED: some test did not meet its pass threshold".into(),
        (types::BatchRunStatus::Completed, None) => format!(
            "no verdict: how its runs ended is hidden from you{}",
            run.blinded.as_ref().map(|b| format!(" ({})", b.reason)).unwrap_or_default()
        ),
        (status, _) => format!("no verdict: the batch run is {status}"),
    };
    println!(
        "batch run {}: {verdict}; pass rate {}, {} credits charged",
        run.id,
        run.pass_rate.map_or_else(|| "-".to_string(), |r| format!("{:.0}%", r * 100.0)),
        run.credits_charged
    );
}

/// How each test's runs ended.
async fn runs_per_test(
    api: &sparring_client::Client,
    run: &types::BatchRun,
) -> anyhow::Result<BTreeMap<String, TestRuns>> {
    let mut per_test: BTreeMap<String, TestRuns> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut page = api.list_batch_run_runs().batch_id(&run.id).limit(std::num::NonZeroU32::new(200).unwrap());
        if let Some(c) = &cursor {
            page = page.cursor(c);
        }
        let page = page.send().await.map_err(api_error).context("listing the batch run's runs")?.into_inner();
        for r in &page.runs {
            let t = per_test.entry(r.test_id.clone()).or_default();
            match r.status {
                Some(types::RunStatus::Cancelled) => {}
                Some(types::RunStatus::Passed) => {
                    t.total += 1;
                    t.passed += 1;
                }
                Some(types::RunStatus::Failed | types::RunStatus::Error) => {
                    t.total += 1;
                    if t.failure.is_none() {
                        t.failure.clone_from(&r.test_result_id);
                    }
                }
                _ => t.total += 1,
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(per_test),
        }
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let kept: String = text.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// The first line of a failure reason, short enough for a table.
pub fn first_line(reason: &str) -> String {
    truncate(reason.lines().next().unwrap_or_default(), 100)
}
