//! `sparring run`: the CI gate. Starts a batch run (of a batch, a channel's
//! tests or one test) on a Sparring server, shows its progress, prints what
//! failed and why, and exits with the verdict:
//!
//! - 0: the batch run completed and every test met its pass threshold;
//! - 1: it completed and some test did not;
//! - 2: no verdict: bad arguments, an API error (credential, not found,
//!   insufficient credits, …), the batch run cancelled, or the wait given up
//!   (`--timeout`, an interrupt, the batch run unreadable).
//!
//! Interrupted (Ctrl-C, SIGTERM: a CI job cancelled), timed out, or unable to
//! read the batch run (5 minutes of failures, or an error that will not
//! pass), it cancels the batch run it started, so an abandoned pipeline spends no more credits;
//! `--keep-running` leaves it going instead. A start that fails the same way
//! is tried again with the same `Idempotency-Key`, so that one whose answer
//! was lost is not started twice.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use sparring_client::types;

use crate::remote::{api_error, Remote};
use crate::signals::Interrupts;

mod report;

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
    #[command(flatten)]
    remote: Remote,
    /// Kept with the batch run, e.g. `--metadata commit=$GIT_SHA`
    /// (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// Print the batch run's id and exit once it is started, without waiting.
    #[arg(long, conflicts_with_all = ["timeout", "keep_running"])]
    no_wait: bool,
    /// Stop waiting this many seconds after the command began (a start
    /// tried again counts), and cancel the batch run (exit 2).
    #[arg(long, value_name = "SECONDS", value_parser = timeout_seconds)]
    timeout: Option<u64>,
    /// When interrupted or timed out, leave the batch run going rather than
    /// cancel it.
    #[arg(long)]
    keep_running: bool,
    /// Print the batch run as JSON on stdout instead of the summary.
    #[arg(long)]
    json: bool,
    /// Also write a JUnit XML report here (one test case per test), for the
    /// CI system's test report; written whatever the exit code (checked
    /// before anything starts).
    #[arg(long, value_name = "PATH", conflicts_with = "no_wait")]
    junit: Option<std::path::PathBuf>,
}

/// With arguments the parser refused (`args`, after the program's name):
/// if they are `run … --junit FILE`, writes FILE's report of a run not
/// started, saying `error`, best effort (the error itself is printed by
/// the parser).
pub fn report_bad_arguments(args: impl Iterator<Item = std::ffi::OsString>, error: &str) {
    let args: Vec<std::ffi::OsString> = args.collect();
    // The subcommand is the first argument not an option (none of the
    // global options takes a value).
    if args.iter().find(|a| !a.to_string_lossy().starts_with('-')).is_none_or(|a| a != "run") {
        return;
    }
    let mut path = None;
    for (i, arg) in args.iter().enumerate() {
        let text = arg.to_string_lossy();
        if text == "--" {
            break;
        }
        if text == "--junit" {
            path = args.get(i + 1).map(std::path::PathBuf::from);
        } else if let Some(p) = text.strip_prefix("--junit=") {
            path = Some(std::path::PathBuf::from(p));
        }
    }
    let Some(path) = path.filter(|p| !p.as_os_str().is_empty() && !p.to_string_lossy().starts_with('-')) else {
        return;
    };
    let first = error.lines().next().unwrap_or(error).trim_start_matches("error: ");
    if let Err(e) = report::write(&path, report::not_started(&format!("bad arguments: {first}"))) {
        say!("warning: {e:#}");
    }
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
        // An id from a CI variable that is not set arrives empty, and a
        // path with an empty segment is no operation of the API: said so,
        // rather than as a server that answers what the API never does.
        let named = self
            .batch
            .iter()
            .map(|id| ("--batch", id))
            .chain(self.channel.iter().map(|id| ("--channel", id)))
            .chain(self.tests.iter().map(|id| ("--test", id)));
        if let Some((flag, _)) = named.into_iter().find(|(_, id)| id.trim().is_empty()) {
            anyhow::bail!("{flag} is empty: give the id to run (is the variable that holds it set?)");
        }
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

/// `--timeout`: 0 would start a batch run only to cancel it.
fn timeout_seconds(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1 (seconds): 0 would start the batch run only to cancel it".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// How long to wait between two reads of the batch run.
const POLL: Duration = Duration::from_millis(500);
/// A line of progress when stderr is not a terminal (a CI log) this often,
/// changed or not: a batch run queued behind others, or a long conversation,
/// does not leave the log silent for minutes.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a read of the batch run may go unanswered before it counts as
/// failed and is tried again: the client's own 60 s would leave a CI log
/// silent for a minute at a time, and the give-up a minute late.
const READ_WITHIN: Duration = Duration::from_secs(10);
/// How long reads of the batch run may keep failing (a server restarting or
/// being deployed, a proxy in front of it, the network) before the command
/// gives up; it tries every 2 s meanwhile, and says so every `LOG_EVERY`.
const KEEP_TRYING_FOR: Duration = Duration::from_secs(300);

/// Cancels that fail in a row before giving up (1.5 s of pauses in all).
const MAX_FAILED_CANCELS: u32 = 3;
/// How long the cancel and the reads for the summary and the report may
/// take, in all, once the wait is given up: a CI runner kills a cancelled
/// job a few seconds after its SIGTERM, and the report must be written by
/// then (a request that hangs would otherwise take the client's 60 s).
const GIVE_UP_WITHIN: Duration = Duration::from_secs(5);

/// Runs `sparring run` and gives its exit code.
pub async fn main(args: RunArgs) -> ExitCode {
    match run(args).await {
        Ok(Verdict::Passed) => ExitCode::SUCCESS,
        Ok(Verdict::Failed) => ExitCode::from(1),
        Ok(Verdict::None) => ExitCode::from(2),
        Err(e) => {
            say!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

enum Verdict {
    Passed,
    Failed,
    None,
}

/// Whether a failed read of the batch run is worth another try.
fn transient(e: &sparring_client::Error<types::Error>) -> bool {
    match e {
        sparring_client::Error::ErrorResponse(r) => passes(r.status()),
        // A request that could not even be made (a URL reqwest refuses) fails
        // the same way every time.
        sparring_client::Error::CommunicationError(e) => !e.is_builder(),
        sparring_client::Error::ResponseBodyError(_) => true,
        sparring_client::Error::UnexpectedResponse(r) => passes(r.status()),
        // Not JSON at all: a page of a proxy or load balancer in front of a
        // server that is away (JSON of another shape is not tried again).
        sparring_client::Error::InvalidResponsePayload(_, e) => {
            matches!(e.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof)
        }
        _ => false,
    }
}

/// Whether an answer of this status may be different later: a server
/// error, or a "not now": 429 Too Many Requests (a gateway's or proxy's;
/// the API never answers it) or 408 Request Timeout (a proxy's, or the
/// API's own for a body that stopped coming, which may come whole when
/// sent again). Not 501 Not
/// Implemented: what the server has not built (a run over a `phone`
/// channel) it refuses the same way every time.
fn passes(status: http::StatusCode) -> bool {
    (status.is_server_error() && status != http::StatusCode::NOT_IMPLEMENTED) || matches!(status.as_u16(), 408 | 429)
}

/// The longest wait a `Retry-After` is followed for: a gateway asking for
/// more is still asked every this often.
const RETRY_AFTER_AT_MOST: Duration = Duration::from_secs(30);

/// How long the answer that failed `e` asks to wait before the next try
/// (its `Retry-After`, in seconds or as a date), at most
/// `RETRY_AFTER_AT_MOST`.
fn retry_after(e: &sparring_client::Error<types::Error>) -> Option<Duration> {
    let headers = match e {
        sparring_client::Error::ErrorResponse(r) => r.headers(),
        sparring_client::Error::UnexpectedResponse(r) => r.headers(),
        _ => return None,
    };
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    Some(sparring_impl::engine::retry_after_wait(value)?.min(RETRY_AFTER_AT_MOST))
}

async fn run(args: RunArgs) -> anyhow::Result<Verdict> {
    let mut interrupts = Interrupts::listen();
    // `--timeout` counts from here: a start tried again spends it too (one
    // too far to count is none).
    let deadline = args.timeout.and_then(|s| Instant::now().checked_add(Duration::from_secs(s)));
    // A report that cannot be written is found out before anything runs
    // (and is paid for); the one written now stands if the command is
    // killed before it writes its own.
    if let Some(path) = &args.junit {
        report::write(path, report::unfinished())
            .context("--junit: the report could not be written; nothing was started")?;
    }
    let ready = args.source().and_then(|source| Ok((source, args.remote.client()?)));
    let started = match ready {
        Ok((source, api)) => {
            let metadata: serde_json::Map<String, serde_json::Value> =
                args.metadata.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
            start(&api, &source, &metadata, deadline, &mut interrupts)
                .await
                .context("starting the batch run")
                .map(|started| (started, api))
        }
        Err(e) => Err(e),
    };
    let (started, api) = match started {
        Ok(started) => started,
        Err(e) => {
            // A pipeline publishes the report whatever happened: it says
            // why nothing ran (insufficient credits, a wrong id, a bad or
            // missing key) or that something may have.
            // A report that cannot be written is said beside the start's
            // error, never instead of it: the `Idempotency-Key` of a start
            // that may have happened is in that error alone.
            let unknown = e.downcast_ref::<StartUnknown>().is_some();
            if let Some(path) = &args.junit {
                let why = format!("{e:#}");
                let report = if unknown { report::start_unknown(&why) } else { report::not_started(&why) };
                if let Err(not_written) = report::write(path, report) {
                    say!("error: {not_written:#}");
                }
            }
            return Err(e);
        }
    };
    if args.no_wait {
        // Interrupted while the start was answered: what it started is
        // cancelled, as an interrupted wait's batch run is.
        if let Some(signal) = interrupts.received() {
            let why = format!("interrupted ({signal})");
            say!("{why}; cancelling batch run {}…", started.id);
            let by = Instant::now() + GIVE_UP_WITHIN;
            match cancel_within(&api, &started.id, by, &mut interrupts).await {
                Ok(Ok(_)) => say!("{why}; cancelled batch run {}", started.id),
                Ok(Err(e)) => {
                    say!("{why}; could not cancel batch run {}, it may still be running: {e:#}", started.id)
                }
                Err(_) => {}
            }
            return Ok(Verdict::None);
        }
        if args.json {
            out!("{}", serde_json::to_string_pretty(&started)?);
        } else {
            out!("{}", started.id);
        }
        return Ok(Verdict::Passed);
    }
    say!("started batch run {} ({} runs)", started.id, started.counts.total);

    let (ended, gave_up, by) = match wait(&api, &started, &args, deadline, &mut interrupts).await? {
        Waited::Ended(run) => (*run, None, None),
        Waited::GaveUp(why, last_seen) => {
            let mut last = *last_seen;
            // The cancel and the reads after it, in all.
            let by = Instant::now() + GIVE_UP_WITHIN;
            // What became of the batch run, said in the log and in the
            // report alike (the cancel answers `running` while runs in
            // flight stop: never reported as a batch run running on).
            let mut why = why;
            if args.keep_running {
                why = format!("{why}; batch run {} keeps running", started.id);
                say!("{why}");
            } else {
                say!("{why}; cancelling batch run {}…", started.id);
                let cancelled = match cancel_within(&api, &started.id, by, &mut interrupts).await {
                    Ok(cancelled) => cancelled,
                    // Told again to stop: the report as things stand, now.
                    Err(signal) => {
                        let why = format!(
                            "{why}; interrupted again ({signal}) while cancelling it, batch run {} may still be running",
                            started.id
                        );
                        let tests = Err(anyhow::anyhow!("not read: interrupted"));
                        return conclude(&last, &args, Some(&why), Some(tests));
                    }
                };
                match cancelled {
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
                        say!("{why}, but batch run {} had already ended: {}", started.id, run.status);
                        return finish(&api, &run, &args, None, Some(by), &mut interrupts).await;
                    }
                    Ok(run) => {
                        why = match run.status {
                            types::BatchRunStatus::Cancelled => format!("{why}; cancelled batch run {}", started.id),
                            _ => format!(
                                "{why}; cancelled batch run {}: its runs in flight stop at their next turn",
                                started.id
                            ),
                        };
                        say!("{why}");
                        last = run;
                    }
                    Err(e) => {
                        why =
                            format!("{why}; could not cancel batch run {}, it may still be running: {e:#}", started.id);
                        say!("{why}");
                    }
                }
            }
            (last, Some(why), Some(by))
        }
    };
    finish(&api, &ended, &args, gave_up, by, &mut interrupts).await
}

/// A start that ended without knowing whether an attempt reached the
/// server and started a batch run (and is paying for it): interrupted, or
/// given up with no answer that says.
#[derive(Debug)]
struct StartUnknown {
    /// How it ended: "interrupted (SIGINT) while starting", ….
    why: String,
    key: String,
}

impl std::fmt::Display for StartUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; a batch run may have been started: look in the project's batch runs (Idempotency-Key {})",
            self.why, self.key
        )
    }
}

impl std::error::Error for StartUnknown {}

/// How long a start may keep failing (see [`start`]) before the command
/// gives up: shorter than the wait's reads, since nothing runs yet and a
/// server that was never reached may be a wrong `--url`.
const START_TRYING_FOR: Duration = Duration::from_secs(60);
/// How long an interrupted start's attempt may still answer (a CI runner
/// kills a cancelled job seconds after its signal).
const INTERRUPTED_START_GRACE: Duration = Duration::from_secs(5);

/// Whether the failed start `e` may have reached the server, which may then
/// have started the batch run: every failure but a connection never made
/// and a gateway's 429 (which passes nothing on). A timeout, a connection
/// reset after the request went, a 5xx (a gateway that gave up waiting), an
/// answer that cannot be read may all come after the server started it.
fn may_have_reached(e: &sparring_client::Error<types::Error>) -> bool {
    match e {
        sparring_client::Error::CommunicationError(e) => !e.is_connect() && !e.is_builder(),
        sparring_client::Error::UnexpectedResponse(r) => r.status() != http::StatusCode::TOO_MANY_REQUESTS,
        _ => true,
    }
}

/// Whether `e`, the server's own refusal of a start, says what became of
/// every attempt with the same `Idempotency-Key`: the server looks the key
/// up (and answers with the batch run it started) before anything but the
/// credential, and the same request is refused the same way (a 4xx, or a
/// 501 `not_implemented`).
fn rules_on_the_key(e: &sparring_client::Error<types::Error>) -> bool {
    matches!(e, sparring_client::Error::ErrorResponse(r)
        if (r.status().is_client_error() && r.status() != http::StatusCode::UNAUTHORIZED)
            || r.status() == http::StatusCode::NOT_IMPLEMENTED)
}

/// Starts the batch run. An attempt that cannot reach the server or that it
/// fails (a deploy, a proxy, the network) is tried again every 2 s for up
/// to `START_TRYING_FOR` (or `--timeout`, if shorter), with the same
/// `Idempotency-Key`: if an attempt started the batch run and only its
/// answer was lost, the next one is answered with that batch run instead of
/// starting (and paying for) another. An attempt is cut at `deadline`
/// (`--timeout`), one begun at it or after within `GIVE_UP_WITHIN`. If the
/// time is up once an attempt that may have reached the server failed (one
/// that took it all: a gateway's or the client's timeout), one more attempt
/// with the key asks whether it started one; the wait then goes on, or
/// cancels it for the timeout. Without an answer, the start is
/// [`StartUnknown`], never "not started".
async fn start(
    api: &sparring_client::Client,
    source: &Source,
    metadata: &serde_json::Map<String, serde_json::Value>,
    deadline: Option<Instant>,
    interrupts: &mut Interrupts,
) -> anyhow::Result<types::BatchRun> {
    let key = format!("sparring-run-{}", uuid::Uuid::now_v7());
    let first = Instant::now();
    // Attempts begin until then (the last one at it), and after it only
    // the one that asks.
    let until = deadline.map_or(first + START_TRYING_FOR, |d| d.min(first + START_TRYING_FOR));
    // Whether a failed attempt may have started the batch run.
    let mut maybe_started = false;
    // Whether this is the attempt made once the time is up, to ask.
    let mut asking = false;
    let mut said: Option<Instant> = None;
    loop {
        let attempt = async {
            match source {
                Source::Batch(id) => {
                    let body = types::RunBatchRequest { metadata: metadata.clone() };
                    api.run_batch().id(id).idempotency_key(key.as_str()).body(body).send().await
                }
                Source::Channel(id, tests) => {
                    // No `--test`: every test of the channel.
                    let test_ids = (!tests.is_empty()).then(|| tests.clone());
                    let body = types::RunChannelRequest { metadata: metadata.clone(), test_ids };
                    api.run_channel().id(id).idempotency_key(key.as_str()).body(body).send().await
                }
                Source::Test(id) => {
                    let body = types::RunTestRequest { metadata: metadata.clone() };
                    api.run_test().id(id).idempotency_key(key.as_str()).body(body).send().await
                }
            }
        };
        let began = Instant::now();
        // Cut at the deadline; one begun at it or after (as the time is up,
        // or to ask), 5 s after that.
        let cut_at = match deadline {
            Some(d) if d <= began => Some(began + GIVE_UP_WITHIN),
            d => d,
        };
        let mut attempt = std::pin::pin!(attempt);
        let attempt = tokio::select! {
            attempt = &mut attempt => Some(attempt),
            () = past(cut_at) => None,
            // The server may be starting it: its answer, if it comes soon,
            // names the batch run, which the wait then cancels (or keeps).
            // A second signal stops waiting for it.
            signal = interrupts.recv() => {
                // Said at once: the answer may take the grace to come.
                say!(
                    "interrupted ({signal}) while starting; waiting up to {} s for the start's answer, to cancel \
                     what it started (again to stop now)",
                    INTERRUPTED_START_GRACE.as_secs()
                );
                let unknown = || StartUnknown { why: format!("interrupted ({signal}) while starting"), key: key.clone() };
                let answered = tokio::select! {
                    answered = tokio::time::timeout(INTERRUPTED_START_GRACE, attempt) => answered,
                    _ = interrupts.recv() => return Err(unknown().into()),
                };
                match answered {
                    Ok(Ok(started)) => {
                        interrupts.put_back(signal);
                        return Ok(started.into_inner());
                    }
                    // The server refused it, and so every attempt with
                    // its key; or this one, like all before it, never
                    // reached the server: nothing was started.
                    Ok(Err(e)) if rules_on_the_key(&e) || (!maybe_started && !may_have_reached(&e)) => {
                        let why = format!("interrupted ({signal}) while starting");
                        return Err(api_error(e).context(why));
                    }
                    _ => return Err(unknown().into()),
                }
            }
        };
        let (reached, asked_to_wait, failed) = match attempt {
            Some(Ok(started)) => return Ok(started.into_inner()),
            Some(Err(e)) if transient(&e) => (may_have_reached(&e), retry_after(&e), api_error(e)),
            Some(Err(e)) if maybe_started && !rules_on_the_key(&e) => {
                let why = format!(
                    "tried for {} s with no answer that tells (the last attempt: {:#})",
                    first.elapsed().as_secs(),
                    api_error(e)
                );
                return Err(StartUnknown { why, key: key.clone() }.into());
            }
            Some(Err(e)) => return Err(api_error(e)),
            // Cut: it may have been sent.
            None if cut_at == deadline => (true, None, anyhow::anyhow!("no answer by the end of --timeout")),
            None => (true, None, anyhow::anyhow!("no answer in {} s", GIVE_UP_WITHIN.as_secs())),
        };
        maybe_started |= reached;
        if asking {
            let why = format!(
                "tried for {} s with no answer that tells (the last attempt: {failed:#})",
                first.elapsed().as_secs()
            );
            return Err(StartUnknown { why, key: key.clone() }.into());
        }
        if Instant::now() >= until {
            if !maybe_started {
                return Err(failed);
            }
            say!(
                "starting the batch run failed ({failed:#}); asking once more, with the same Idempotency-Key, \
                 whether it was started"
            );
            asking = true;
            continue;
        }
        if said.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            said = Some(Instant::now());
            say!(
                "starting the batch run failed ({failed:#}); trying again (failing for {} s)",
                first.elapsed().as_secs()
            );
        }
        // The last attempt comes as the time is up, not 2 s before it.
        let pause =
            (POLL * 4).max(asked_to_wait.unwrap_or_default()).min(until.saturating_duration_since(Instant::now()));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            signal = interrupts.recv() => {
                let why = format!("interrupted ({signal}) while starting");
                if !maybe_started {
                    // Every attempt failed before it reached the server.
                    return Err(failed.context(format!("{why}; no attempt reached the server")));
                }
                return Err(StartUnknown { why, key: key.clone() }.into());
            }
        }
    }
}

/// The verdict of a batch run as last seen (`gave_up` says why the wait
/// ended before it did), its summary or JSON, and the JUnit report. The
/// tests are read by `by`, if given; a signal meanwhile stops reading them.
async fn finish(
    api: &sparring_client::Client,
    ended: &types::BatchRun,
    args: &RunArgs,
    mut gave_up: Option<String>,
    by: Option<Instant>,
    interrupts: &mut Interrupts,
) -> anyhow::Result<Verdict> {
    // The summary and the report need the tests; JSON alone does not.
    let tests = match (args.json, &args.junit) {
        (true, None) => None,
        _ => Some(tokio::select! {
            tests = tests_of(api, ended) => tests,
            () = past(by) => Err(anyhow::anyhow!("its tests were not read within {} s", GIVE_UP_WITHIN.as_secs())),
            signal = interrupts.recv() => {
                say!("interrupted ({signal}) while reading the tests of batch run {}", ended.id);
                gave_up = Some(match gave_up {
                    Some(why) => format!("{why}; interrupted again ({signal})"),
                    None => format!("interrupted ({signal}); the batch run is {}", ended.status),
                });
                Err(anyhow::anyhow!("not read: interrupted"))
            }
        }),
    };
    conclude(ended, args, gave_up.as_deref(), tests)
}

/// [`finish`] with the tests read (`None` if not needed): the summary or
/// JSON first, so that a report that cannot be written leaves the verdict
/// said (and the exit code).
fn conclude(
    ended: &types::BatchRun,
    args: &RunArgs,
    gave_up: Option<&str>,
    tests: Option<anyhow::Result<Vec<types::BatchRunTest>>>,
) -> anyhow::Result<Verdict> {
    let verdict = match (gave_up, &ended.status, ended.passed) {
        (None, types::BatchRunStatus::Completed, Some(true)) => Verdict::Passed,
        (None, types::BatchRunStatus::Completed, Some(false)) => Verdict::Failed,
        _ => Verdict::None,
    };
    let report = args.junit.as_ref().map(|_| match &tests {
        Some(tests) => report::junit(ended, tests.as_ref().map_err(|e| format!("{e:#}")), gave_up),
        None => report::junit(ended, Err("not read".to_string()), gave_up),
    });
    if args.json {
        out!("{}", serde_json::to_string_pretty(ended)?);
    } else if gave_up.is_none() {
        summary(ended, tests.unwrap_or_else(|| Err(anyhow::anyhow!("not read"))));
    }
    if let (Some(path), Some(report)) = (&args.junit, report) {
        if let Err(e) = report::write(path, report) {
            say!("error: {e:#} (only the report: the verdict above stands)");
        }
    }
    Ok(verdict)
}

/// Cancels batch run `id`: the cancel's answer, or why there is none by
/// `by`; or, told again to stop meanwhile (said so), `Err` with the signal
/// (it may still be running).
async fn cancel_within(
    api: &sparring_client::Client,
    id: &str,
    by: Instant,
    interrupts: &mut crate::signals::Interrupts,
) -> Result<anyhow::Result<types::BatchRun>, &'static str> {
    tokio::select! {
        cancelled = tokio::time::timeout_at(by.into(), cancel(api, id)) => Ok(cancelled.unwrap_or_else(|_| {
            Err(anyhow::anyhow!("the server did not answer within {} s", GIVE_UP_WITHIN.as_secs()))
        })),
        signal = interrupts.recv() => {
            say!("interrupted again ({signal}); stopped cancelling batch run {id}, it may still be running");
            Err(signal)
        }
    }
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
    /// Why, and the batch run as last seen.
    GaveUp(String, Box<types::BatchRun>),
}

/// Shows progress until the batch run ends, the timeout passes (at
/// `deadline`) or the process is told to stop.
async fn wait(
    api: &sparring_client::Client,
    started: &types::BatchRun,
    args: &RunArgs,
    deadline: Option<Instant>,
    interrupts: &mut Interrupts,
) -> anyhow::Result<Waited> {
    let mut progress = Progress::new(started);
    let mut failed_polls = 0;
    // How long the last failed read's answer asked to wait (`Retry-After`).
    let mut asked_to_wait: Option<Duration> = None;
    // Since when the reads fail, and when that was last said.
    let mut failing: Option<(Instant, Instant)> = None;
    let mut current = started.clone();
    loop {
        if !matches!(current.status, types::BatchRunStatus::Queued | types::BatchRunStatus::Running) {
            progress.finish(&current);
            return Ok(Waited::Ended(Box::new(current)));
        }
        let pause = (POLL * 2u32.pow(failed_polls.min(2))).max(asked_to_wait.take().unwrap_or_default());
        // The pause and the read: a read that hangs (a server overloaded)
        // holds up neither an interrupt nor the timeout.
        let read = async {
            tokio::time::sleep(pause).await;
            let sent = Instant::now();
            let read = tokio::time::timeout(READ_WITHIN, api.get_batch_run().id(&started.id).send()).await;
            (sent, read)
        };
        let (sent, read) = tokio::select! {
            read = read => read,
            () = past(deadline) => {
                progress.abandon();
                let why = format!("timed out after {} s", args.timeout.unwrap_or_default());
                return Ok(Waited::GaveUp(why, Box::new(current)));
            }
            signal = interrupts.recv() => {
                progress.abandon();
                return Ok(Waited::GaveUp(format!("interrupted ({signal})"), Box::new(current)));
            }
        };
        // A read unanswered within `READ_WITHIN` failed as one that could
        // not be made would, and is tried again.
        let read = read.map_err(|_| Unread::Unanswered).and_then(|r| r.map_err(|e| Unread::Failed(Box::new(e))));
        match read {
            Ok(run) => {
                failed_polls = 0;
                failing = None;
                current = run.into_inner();
                progress.show(&current);
            }
            Err(e) if e.transient() && failing.is_none_or(|(since, _)| since.elapsed() < KEEP_TRYING_FOR) => {
                failed_polls += 1;
                asked_to_wait = e.retry_after();
                // Failing since the first failed read was sent.
                let (since, said) = failing.get_or_insert((sent, sent));
                if failed_polls == 1 || said.elapsed() >= LOG_EVERY {
                    *said = Instant::now();
                    progress.note(&format!(
                        "reading the batch run failed ({:#}); trying again (failing for {} s)",
                        e.into_error(),
                        since.elapsed().as_secs()
                    ));
                }
            }
            // Reads that keep failing, or one that will not pass (the key
            // revoked): given up like a timeout, so the batch run is
            // cancelled (no abandoned job spends credits) and the JSON and
            // the report still say how it stood.
            Err(e) => {
                progress.abandon();
                let why = format!("reading batch run {} failed: {:#}", started.id, e.into_error());
                return Ok(Waited::GaveUp(why, Box::new(current)));
            }
        }
    }
}

/// A read of the batch run that failed.
enum Unread {
    /// No answer within `READ_WITHIN`.
    Unanswered,
    Failed(Box<sparring_client::Error<types::Error>>),
}

impl Unread {
    fn transient(&self) -> bool {
        match self {
            Unread::Unanswered => true,
            Unread::Failed(e) => transient(e),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Unread::Unanswered => None,
            Unread::Failed(e) => retry_after(e),
        }
    }

    fn into_error(self) -> anyhow::Error {
        match self {
            Unread::Unanswered => anyhow::anyhow!("no answer within {} s", READ_WITHIN.as_secs()),
            Unread::Failed(e) => api_error(*e),
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
                    say!("{}: {}", self.id, counts_line(run));
                    self.last_line = Some(Instant::now());
                }
            }
        }
    }

    fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => say!("{text}"),
        }
    }

    fn finish(&mut self, run: &types::BatchRun) {
        match &self.bar {
            Some(bar) => {
                bar.set_message(counts_detail(run));
                bar.finish();
            }
            None => say!("{}: {}: {}", self.id, run.status, counts_line(run)),
        }
    }

    fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

/// The batch run's tests as the server judged them (every page), and
/// whether how they ended is hidden from the caller.
async fn tests_of(api: &sparring_client::Client, run: &types::BatchRun) -> anyhow::Result<Vec<types::BatchRunTest>> {
    let mut tests = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut page = api.list_batch_run_tests().id(&run.id).limit(std::num::NonZeroU32::new(200).unwrap());
        if let Some(c) = &cursor {
            page = page.cursor(c);
        }
        let page = page.send().await.map_err(api_error).context("listing the batch run's tests")?.into_inner();
        tests.extend(page.tests);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(tests),
        }
    }
}

/// Runs that ended (not cancelled) and those of them that passed; `None`
/// when how they ended is hidden.
fn passed_of(counts: &types::BatchRunCounts) -> Option<(i64, i64)> {
    let ended = counts.total - counts.queued - counts.running - counts.cancelled;
    counts.passed.map(|passed| (passed, ended))
}

/// The batch run's verdict, and per test how its runs ended, judged by the
/// pass threshold the batch run kept, and why one failed. The verdict is
/// known already: a table that cannot be read (the server gone since) is
/// said on stderr and left out.
fn summary(run: &types::BatchRun, tests: anyhow::Result<Vec<types::BatchRunTest>>) {
    let tests = tests.unwrap_or_else(|e| {
        say!("no per-test summary: {e:#}");
        Vec::new()
    });
    if run.blinded.is_none() && !tests.is_empty() {
        let name = |t: &types::BatchRunTest| t.name.clone().unwrap_or_else(|| t.test_id.clone());
        let width = tests.iter().map(|t| name(t).chars().count()).max().unwrap_or(4).clamp(4, 48);
        out!("{:<width$}  {:>9}  {:>6}  {:<4}  why", "test", "passed", "needs", "met");
        for t in &tests {
            let passed = passed_of(&t.counts).map_or_else(|| "?".to_string(), |(p, n)| format!("{p}/{n}"));
            let needs = format!("{:.0}%", t.pass_threshold * 100.0);
            let met = match t.passed {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "?",
            };
            let why = match (t.passed, t.failures.first()) {
                (Some(false) | None, Some(f)) => {
                    let which = f.test_result_id.as_deref().unwrap_or(&f.run_id);
                    format!("{}  ({which})", first_line(f.failure_reason.as_deref().unwrap_or_default()))
                }
                _ => String::new(),
            };
            let row = format!("{:<width$}  {passed:>9}  {needs:>6}  {met:<4}  {why}", truncate(&name(t), width));
            out!("{}", row.trim_end());
        }
        if let Some(id) = tests.iter().flat_map(|t| &t.failures).find_map(|f| f.test_result_id.as_ref()) {
            out!("(to read a conversation: sparring result {id})");
        }
        out!();
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
    out!(
        "batch run {}: {verdict}; pass rate {}, {} credits charged",
        run.id,
        run.pass_rate.map_or_else(|| "-".to_string(), |r| format!("{:.0}%", r * 100.0)),
        run.credits_charged
    );
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let kept: String = text.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// The first line of a failure reason, short enough for a table, and safe
/// for a terminal (it may quote the agent).
pub fn first_line(reason: &str) -> String {
    truncate(&crate::remote::printable(reason.lines().next().unwrap_or_default()), 100)
}
