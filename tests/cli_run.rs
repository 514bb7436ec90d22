//! `sparring run`, the CI gate: the real binary against the real server on an
//! ephemeral port, running conversations with the real reference agent
//! (`sparring agent`, a child process). Its exit code is the verdict: 0
//! passed, 1 failed, 2 no verdict. And `sparring result`, which shows one of
//! the conversations.

mod common;

use common::engine::{create, Agent};
use common::process::Proc;
use common::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

/// Books Tuesday at 3 pm: passes against the reference agent, fails against
/// `--bug wrong-day` (the "right day" check).
fn booking(project_id: &str, persona: &str) -> Value {
    json!({
        "project_id": project_id, "name": "book tuesday", "mode": "scripted", "default_persona_id": persona,
        "first_message": "Hi, I'd like to book an appointment.",
        "steps": [{"say": "Tuesday at 3 pm, please.", "expect": [
            {"type": "contains", "name": "right day", "text": "Tuesday"}]}],
        "max_duration_s": 60
    })
}

/// A project with a channel to each agent and a test on each.
struct Suite {
    project_id: String,
    good_channel: String,
    bad_channel: String,
    good_test: String,
    bad_test: String,
}

async fn suite(s: &TestServer, key: &str, project_id: &str, good: &Agent, bad: &Agent) -> Suite {
    let p = project_id;
    let persona = create(s, key, "/v1/personas", json!({"project_id": p, "name": "Dana", "prompt": "A parent"})).await;
    let scenario = create(s, key, "/v1/scenarios", booking(p, &persona)).await;
    let channel = |name: &str, agent: &Agent| json!({"project_id": p, "name": name, "kind": "http", "target": agent.http_target(), "turn_timeout_ms": 5000});
    let good_channel = create(s, key, "/v1/channels", channel("good", good)).await;
    let bad_channel = create(s, key, "/v1/channels", channel("bad", bad)).await;
    let test = |name: &str, channel: &str, iterations: u32| {
        json!({"project_id": p, "name": name, "channel_id": channel, "scenario_id": scenario,
               "iterations": iterations})
    };
    let good_test = create(s, key, "/v1/tests", test("books over http", &good_channel, 2)).await;
    let bad_test = create(s, key, "/v1/tests", test("books the right day", &bad_channel, 2)).await;
    Suite { project_id: project_id.to_string(), good_channel, bad_channel, good_test, bad_test }
}

/// `sparring run ARGS` against `s` with the key in the environment, to its
/// end: the exit code, stdout and stderr.
fn run(s: &TestServer, key: &str, args: &[&str]) -> (Option<i32>, String, String) {
    run_at(&s.base, key, args)
}

/// The batch run id the command said it started.
fn started_id(stderr: &str) -> String {
    let at = stderr.find("started batch run brn_").unwrap_or_else(|| panic!("no batch run started: {stderr}"));
    stderr[at + "started batch run ".len()..].split_whitespace().next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_code_is_the_verdict_and_the_summary_says_what_failed() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("gate").await;
    let suite = suite(&s, &t.owner, &t.project_id, &good, &wrong_day).await;
    let p = &suite.project_id;
    let passing =
        create(&s, &t.owner, "/v1/batches", json!({"project_id": p, "name": "good", "test_ids": [suite.good_test]}))
            .await;
    let failing = create(
        &s,
        &t.owner,
        "/v1/batches",
        json!({"project_id": p, "name": "both", "test_ids": [suite.good_test, suite.bad_test]}),
    )
    .await;

    // An editor runs them, from CI, with the commit in the metadata.
    let (code, stdout, stderr) = run(&s, &t.editor, &["--batch", &passing, "--metadata", "commit=0a1b2c3"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let row = stdout.lines().find(|l| l.starts_with("books over http")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains("2/2") && row.contains("100%") && row.contains("yes"), "{row}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
    // Not a terminal: progress is lines on stderr, ending with the counts.
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("{id}: completed: 2/2 ended: 2 passed, 0 failed, 0 errors")), "{stderr}");
    let stored = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
    assert_eq!(stored["metadata"], json!({"commit": "0a1b2c3"}));
    assert_eq!(stored["batch_id"], json!(passing));
    assert_eq!(stored["passed"], true);

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let (code, stdout, stderr) =
        run(&s, &t.editor, &["--batch", &failing, "--junit", junit.to_str().unwrap(), "--metadata", "commit=4d5e6f"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let bad = stdout.lines().find(|l| l.starts_with("books the right day")).unwrap_or_else(|| panic!("{stdout}"));
    // Why, from a failed result, and which one to read.
    assert!(bad.contains("0/2") && bad.contains("NO") && bad.contains("right day"), "{bad}");
    assert!(bad.contains("(trs_"), "{bad}");
    let good_row = stdout.lines().find(|l| l.starts_with("books over http")).unwrap();
    assert!(good_row.contains("2/2") && good_row.contains("yes"), "{good_row}");
    assert!(stdout.contains(": FAILED: some test did not meet its pass threshold; pass rate 50%"), "{stdout}");
    let id = started_id(&stderr);
    let stored = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
    assert_eq!(stored["passed"], false);

    // The JUnit report: a case per test, the failing one with its results.
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(r#"<testsuites name="sparring" tests="2" failures="1" errors="0""#), "{xml}");
    assert!(xml.contains(&format!(r#"<testsuite name="sparring batch run {id}""#)), "{xml}");
    assert!(xml.contains(r#"<property name="metadata.commit" value="4d5e6f"/>"#), "{xml}");
    let case = |name: &str| {
        let at = xml.find(&format!(r#"<testcase name="{name}""#)).unwrap_or_else(|| panic!("no {name}: {xml}"));
        xml[at..at + xml[at..].find("</testcase>").unwrap()].to_string()
    };
    let failed = case("books the right day");
    assert!(
        failed.contains(r#"<failure message="0/2 runs passed, 100% needed" type="below_pass_threshold">"#),
        "{failed}"
    );
    assert_eq!(failed.matches("trs_").count(), 2, "each failed result: {failed}");
    assert!(failed.contains("right day") && failed.contains(&suite.bad_test), "{failed}");
    let passed = case("books over http");
    assert!(!passed.contains("<failure") && !passed.contains("<error") && passed.contains("2/2"), "{passed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_or_a_channel_runs_and_json_is_the_batch_run() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &wrong_day).await;

    let (code, stdout, stderr) = run(&s, &key, &["--test", &suite.good_test, "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let run_: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(run_["source"], "test");
    assert_eq!(run_["test_id"], json!(suite.good_test));
    assert_eq!((run_["status"].as_str(), run_["passed"].as_bool()), (Some("completed"), Some(true)), "{run_:#}");
    assert_eq!(run_["counts"]["passed"], 2);

    // The failing channel: all its tests, then one named.
    let (code, stdout, _) = run(&s, &key, &["--channel", &suite.bad_channel, "--json"]);
    assert_eq!(code, Some(1), "{stdout}");
    let run_: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((run_["source"].as_str(), run_["passed"].as_bool()), (Some("channel"), Some(false)), "{run_:#}");
    assert_eq!(run_["counts"]["failed"], 2);
    let (code, stdout, _) = run(&s, &key, &["--channel", &suite.good_channel, "--test", &suite.good_test, "--json"]);
    assert_eq!(code, Some(0), "{stdout}");
    let run_: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((run_["channel_id"].as_str(), run_["counts"]["total"].as_i64()), (Some(&*suite.good_channel), Some(2)));

    // --no-wait: the id alone, for a script to follow.
    let (code, stdout, stderr) = run(&s, &key, &["--test", &suite.bad_test, "--no-wait"]);
    assert_eq!(code, Some(0), "{stderr}");
    let id = stdout.trim();
    assert!(id.starts_with("brn_") && !id.contains(char::is_whitespace), "{stdout}");
    let stored = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &key, None, 200).await;
    assert_eq!(stored["test_id"], json!(suite.bad_test));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_verdict_the_exit_code_is_2_and_the_error_says_why() {
    let good = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 1).await;
    let key = s.key_for_user("poor@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    let outsider = s.key_for_user("outsider@example.com").await;

    // A key stored from a file, with its line break: trimmed.
    let key_from_a_file = format!("{key}\n");
    let cases: [(&str, Vec<&str>, &str); 11] = [
        ("spk_not_a_key", vec!["--test", &suite.good_test], "401 "),
        (&outsider, vec!["--test", &suite.good_test], "404 not_found"),
        (&key_from_a_file, vec!["--test", &suite.good_test], "402 insufficient_credits"),
        ("spk_\u{1}x", vec!["--test", &suite.good_test], "character a header cannot carry"),
        // A timeout too far to count is none (not a panic).
        (&outsider, vec!["--test", &suite.good_test, "--timeout", "18446744073709551615"], "404 not_found"),
        // Two conversations of at most a minute, one credit left.
        (&key, vec!["--test", &suite.good_test], "402 insufficient_credits"),
        (&key, vec!["--batch", "bat_0", "--test", &suite.good_test], "--batch"),
        (&key, vec!["--test", &suite.good_test, "--test", &suite.bad_test], "needs --channel"),
        // An id from a CI variable that is not set: said so, not taken for
        // a proxy in front of the server.
        (&key, vec!["--batch", ""], "--batch is empty"),
        (&key, vec!["--test", " "], "--test is empty"),
        (&key, vec!["--channel", &suite.good_channel, "--test", ""], "--test is empty"),
    ];
    for (k, args, says) in cases {
        let (code, stdout, stderr) = run(&s, k, &args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(says), "{args:?}: expected {says:?} in: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }

    // Insufficient credits, with a report asked for: it says so.
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let (code, _, stderr) = run(&s, &key, &["--test", &suite.good_test, "--junit", junit.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(r#"tests="1" failures="0" errors="1""#), "{xml}");
    assert!(xml.contains("no batch run started: starting the batch run: 402 insufficient_credits"), "{xml}");

    // No key (a pull request from a fork gets empty secrets): said how to
    // give one, in the report too.
    let j = junit.to_str().unwrap();
    let mut p = Proc::spawn_with_env(
        &["run", "--url", &s.base, "--test", &suite.good_test, "--junit", j],
        &[("SPARRING_API_KEY", "")],
    );
    assert_eq!(p.wait_exit().code(), Some(2));
    assert!(p.stderr().contains("no API key: set SPARRING_API_KEY"), "{}", p.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("no batch run started: no API key: set SPARRING_API_KEY"), "{xml}");
    // Arguments that do not say what to run: the report says so too.
    let (code, _, stderr) = run(&s, &key, &["--test", &suite.good_test, "--test", &suite.bad_test, "--junit", j]);
    assert_eq!(code, Some(2), "{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("no batch run started: --test more than once needs --channel"), "{xml}");
    // And so do arguments the parser itself refuses (a malformed value,
    // two sources at once), with `--junit FILE` or `--junit=FILE`.
    for (args, says) in [
        (vec!["--test", &suite.good_test, "--metadata", "novalue", "--junit", j], "novalue"),
        (vec!["--timeout", "soon", "--test", &suite.good_test, "--junit", j], "soon"),
        // It would start a batch run only to cancel it.
        (vec!["--timeout", "0", "--test", &suite.good_test, "--junit", j], "must be at least 1 (seconds)"),
        (vec!["--batch", "bat_x", "--test", &suite.good_test, &format!("--junit={j}")], "--batch"),
    ] {
        std::fs::remove_file(&junit).unwrap();
        let (code, _, stderr) = run(&s, &key, &args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let xml = std::fs::read_to_string(&junit).unwrap_or_else(|e| panic!("{args:?}: no report ({e}): {stderr}"));
        assert!(xml.contains("no batch run started: bad arguments: ") && xml.contains(says), "{args:?}: {xml}");
    }

    // A report that cannot be written: found out before anything starts.
    let nowhere = dir.path().join("no/such/dir/report.xml");
    let (code, _, stderr) = run(&s, &outsider, &["--test", &suite.good_test, "--junit", nowhere.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("the report could not be written; nothing was started"), "{stderr}");
    assert!(!stderr.contains("404"), "it was not started: {stderr}");
    // What failed is named: the file made beside it first.
    let made = format!("creating {}/.report.xml.", nowhere.parent().unwrap().display());
    assert!(stderr.contains(&made) && stderr.contains("No such file or directory"), "{stderr}");

    // A URL without its scheme: said at once, not tried for a minute.
    for url in ["not a url", "localhost:8080", "sparring.example.com"] {
        let at = std::time::Instant::now();
        let (code, _, stderr) = run_at(url, &key, &["--test", &suite.good_test]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("--url/SPARRING_URL must look like https://host[:port]"), "{url}: {stderr}");
        assert!(at.elapsed() < std::time::Duration::from_secs(10), "{url}: {:?}", at.elapsed());
    }
    // Something else answers at the URL: said so.
    let other = Front::start(&s.base, |_, _| {
        Some(Answer::With(404, "application/json", r#"{"request_id": "x", "message": "Not Found"}"#))
    })
    .await;
    let (code, _, stderr) = run_at(&other.base, &key, &["--test", &suite.good_test]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is --url a Sparring server, and is it up?"), "{stderr}");
    assert!(stderr.contains(r#"it began `{"request_id": "x", "message": "Not Found"}`"#), "{stderr}");

    // The server is not there: tried again until the timeout, then said.
    let at = std::time::Instant::now();
    let mut p = Proc::spawn_with_env(
        &["run", "--url", "http://127.0.0.1:9", "--test", &suite.good_test, "--timeout", "3"],
        &[("SPARRING_API_KEY", &key)],
    );
    assert_eq!(p.wait_exit().code(), Some(2));
    assert!(at.elapsed() < std::time::Duration::from_secs(20), "{:?}: {}", at.elapsed(), p.stderr());
    // The whole timeout, not 2 s short of it.
    assert!(at.elapsed() >= std::time::Duration::from_secs(3), "gave up after {:?}: {}", at.elapsed(), p.stderr());
    let said = p.stderr();
    assert!(said.contains("trying again"), "{said}");
    // With the cause, not only "could not reach the server".
    let retry = said.lines().find(|l| l.contains("trying again")).unwrap();
    assert!(retry.contains("Connection refused"), "{retry}");
    assert!(said.contains("error: starting the batch run: could not reach the server"), "{said}");
}

/// A test over a `phone` channel is answered `501 not_implemented`: a
/// refusal that no retry changes, said at once with the server's reason,
/// not tried for a minute and then said to have perhaps started a batch
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_server_does_not_implement_is_refused_at_once() {
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let p = s.create_project(&key, "phones").await;
    let telephony = json!({"project_id": p, "provider": "twilio", "name": "tel",
                           "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"}});
    let tel = create(&s, &key, "/v1/integrations", telephony).await;
    let phone = json!({"project_id": p, "name": "phone", "kind": "phone", "target": "+14155550123",
                       "integration_id": tel});
    let channel = create(&s, &key, "/v1/channels", phone).await;
    let persona = create(&s, &key, "/v1/personas", json!({"project_id": p, "name": "Dana"})).await;
    let scenario = create(&s, &key, "/v1/scenarios", booking(&p, &persona)).await;
    let test = json!({"project_id": p, "name": "calls", "channel_id": channel, "scenario_id": scenario});
    let test = create(&s, &key, "/v1/tests", test).await;

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let at = std::time::Instant::now();
    let (code, stdout, stderr) = run(&s, &key, &["--test", &test, "--junit", junit.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert!(at.elapsed() < std::time::Duration::from_secs(10), "{:?}: {stderr}", at.elapsed());
    assert!(stderr.contains("error: starting the batch run: 501 not_implemented"), "{stderr}");
    assert!(!stderr.contains("trying again") && !stderr.contains("may have been started"), "{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("no batch run started: starting the batch run: 501 not_implemented"), "{xml}");
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={p}"), &key, None, 200).await;
    assert_eq!(listed["batch_runs"], json!([]), "{listed}");
}

/// An agent that takes 2 s to answer, so the batch run is still going when
/// the command is stopped.
async fn slow_suite(s: &TestServer, key: &str, slow: &Agent) -> String {
    let project = s.create_project(key, "slow").await;
    suite(s, key, &project, slow, slow).await.good_test
}

async fn status_of(s: &TestServer, key: &str, id: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let run = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), key, None, 200).await;
        let status = run["status"].as_str().unwrap().to_string();
        // A cancelled batch run ends once its running conversations reach
        // their next turn.
        if status != "running" || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_given_up_is_cancelled_unless_told_to_keep_it() {
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;

    // The CI job is cancelled: SIGTERM.
    let mut p = Proc::spawn_with_env(&["run", "--url", &s.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    p.expect("the batch run to start", |o| o.stderr.contains("started batch run brn_"));
    let id = started_id(&p.stderr());
    let code = p.terminate().code();
    assert_eq!(code, Some(2), "{}", p.stderr());
    assert!(p.stderr().contains(&format!("interrupted (SIGTERM); cancelled batch run {id}")), "{}", p.stderr());
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");

    // Timed out: cancelled, and said so in the JSON and the report.
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let (code, stdout, stderr) =
        run(&s, &key, &["--test", &test, "--timeout", "1", "--json", "--junit", junit.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 1 s; cancelled batch run {id}")), "{stderr}");
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");
    let seen: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(seen["id"], json!(id));
    // The conversation in flight (the agent takes 2 s a turn) stops at its
    // next turn: the cancel answers `running`, and the log and the report
    // say it is stopping, not that it runs on.
    assert_eq!(seen["status"], "running", "as the cancel left it: {seen:#}");
    let said = format!("timed out after 1 s; cancelled batch run {id}: its runs in flight stop at their next turn");
    assert!(stderr.contains(&said), "{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(r#"tests="1" failures="0" errors="1""#), "{xml}");
    assert!(xml.contains(&format!(r#"<error message="no verdict: {said}""#)), "{xml}");
    assert!(!xml.contains("is running"), "{xml}");

    // Left going: it ends on its own, and passes.
    let (code, _, stderr) = run(&s, &key, &["--test", &test, "--timeout", "1", "--keep-running"]);
    assert_eq!(code, Some(2), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 1 s; batch run {id} keeps running")), "{stderr}");
    let done = common::engine::wait_for_end(&s, &key, &id).await;
    assert_eq!((done["status"].as_str(), done["passed"].as_bool()), (Some("completed"), Some(true)), "{done:#}");
}

/// How the server's front answers a request instead of passing it on.
#[derive(Clone)]
enum Answer {
    /// This status with this `content-type` and body, as a load balancer
    /// answers while the server behind it is away.
    With(u16, &'static str, &'static str),
    /// Nothing, ever: an overloaded server.
    Hang,
    /// The request passed on and answered by the server, then this status
    /// with an HTML page instead of the answer: a gateway that gave up on
    /// the server (a timeout) after the request reached it.
    Lost(u16),
    /// The request passed on and answered by the server, the answer held
    /// back this long: a slow network.
    Late(std::time::Duration),
    /// The request passed on and answered by the server, then, this long
    /// after, this status with an HTML page: a gateway with a long timeout.
    LostAfter(u16, std::time::Duration),
    /// This redirect status, to this `Location`.
    Redirect(u16, String),
    /// This status, as a gateway says "not now" (429, 408), with this
    /// `Retry-After` if any.
    NotNow(u16, Option<&'static str>),
}

/// A loopback stand-in for a load balancer in front of the real server: it
/// passes every request through to `upstream`, unless `fail(method, path)`
/// answers it first (a server failing).
struct Front {
    base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type FailFn = dyn Fn(&Method, &str) -> Option<Answer> + Send + Sync;

impl Front {
    async fn start(upstream: &str, fail: impl Fn(&Method, &str) -> Option<Answer> + Send + Sync + 'static) -> Front {
        use http_body_util::BodyExt as _;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let fail: Arc<FailFn> = Arc::new(fail);
        let upstream = upstream.to_string();
        let http = reqwest::Client::new();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (fail, upstream, http) = (fail.clone(), upstream.clone(), http.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (fail, upstream, http) = (fail.clone(), upstream.clone(), http.clone());
                        async move {
                            let method = req.method().clone();
                            let path = req.uri().path().to_string();
                            let target = format!("{upstream}{}", req.uri());
                            let headers = req.headers().clone();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let answer = fail(&method, &path);
                            let (status, content_type, body) = match answer {
                                Some(Answer::With(status, content_type, body)) => {
                                    (status, content_type.to_string(), bytes::Bytes::from_static(body.as_bytes()))
                                }
                                Some(Answer::NotNow(status, retry_after)) => {
                                    let mut answer =
                                        hyper::Response::builder().status(status).header("content-type", "text/plain");
                                    if let Some(after) = retry_after {
                                        answer = answer.header("retry-after", after);
                                    }
                                    let page = bytes::Bytes::from_static(b"Too Many Requests");
                                    return Ok(answer.body(http_body_util::Full::new(page)).unwrap());
                                }
                                Some(Answer::Redirect(status, location)) => {
                                    return Ok(hyper::Response::builder()
                                        .status(status)
                                        .header("location", location)
                                        .body(http_body_util::Full::new(bytes::Bytes::new()))
                                        .unwrap());
                                }
                                Some(Answer::Hang) => std::future::pending().await,
                                None | Some(Answer::Lost(_)) | Some(Answer::Late(_)) | Some(Answer::LostAfter(..)) => {
                                    let mut forward = http.request(method, target).body(body);
                                    for name in ["x-api-key", "content-type", "idempotency-key"] {
                                        if let Some(v) = headers.get(name) {
                                            forward = forward.header(name, v.as_bytes());
                                        }
                                    }
                                    let resp = forward.send().await.unwrap();
                                    if let Some(Answer::Late(delay)) = answer {
                                        tokio::time::sleep(delay).await;
                                    }
                                    if let Some(Answer::LostAfter(_, delay)) = answer {
                                        tokio::time::sleep(delay).await;
                                    }
                                    if let Some(Answer::Lost(status) | Answer::LostAfter(status, _)) = answer {
                                        let page = bytes::Bytes::from_static(b"<h1>504 Gateway Time-out</h1>");
                                        return Ok(hyper::Response::builder()
                                            .status(status)
                                            .header("content-type", "text/html")
                                            .body(http_body_util::Full::new(page))
                                            .unwrap());
                                    }
                                    let status = resp.status().as_u16();
                                    let content_type = resp
                                        .headers()
                                        .get("content-type")
                                        .map(|v| v.to_str().unwrap().to_string())
                                        .unwrap_or_default();
                                    (status, content_type, resp.bytes().await.unwrap())
                                }
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .header("content-type", content_type)
                                    .body(http_body_util::Full::new(body))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Front { base, task }
    }
}

/// A loopback HTTP server standing for another host: it answers every
/// request 404 (the API's error shape) and records, per request, its path
/// and whether it carried an `x-api-key`.
struct Recorder {
    base: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let log = log.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        log.lock()
                            .unwrap()
                            .push((req.uri().path().to_string(), req.headers().contains_key("x-api-key")));
                        let body = r#"{"error_code": "not_found", "message": "elsewhere", "request_id": "req_x"}"#;
                        let answer = hyper::Response::builder()
                            .status(404)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(bytes::Bytes::from_static(body.as_bytes())))
                            .unwrap();
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Recorder { base, seen, task }
    }

    fn seen(&self) -> Vec<(String, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

/// `sparring run ARGS` against `url` with the key in the environment.
fn run_at(url: &str, key: &str, args: &[&str]) -> (Option<i32>, String, String) {
    command_at("run", url, key, args)
}

/// `sparring COMMAND --url URL ARGS` with the key in the environment, to its
/// end; it must never print the key.
fn command_at(command: &str, url: &str, key: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec![command, "--url", url];
    all.extend_from_slice(args);
    let mut p = Proc::spawn_with_env(&all, &[("SPARRING_API_KEY", key)]);
    let status = p.wait_exit();
    let (stdout, stderr) = (p.stdout(), p.stderr());
    assert!(!stdout.contains(key) && !stderr.contains(key), "the key was printed:\n{stdout}\n{stderr}");
    (status.code(), stdout, stderr)
}

/// `sparring` with `args` and `key`, its stdout closed before it writes
/// anything (a reader that stopped early: `| head -n1`).
async fn with_stdout_closed(args: &[&str], key: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::process::BIN);
    cmd.args(args).env_remove("SPARRING_URL").env("SPARRING_API_KEY", key);
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap()
}

/// Whether `path` is the batch run itself (`/v1/batch-runs/brn_…`), not its
/// runs or its cancel.
fn is_batch_run(method: &Method, path: &str) -> bool {
    method == Method::GET && path.starts_with("/v1/batch-runs/brn_") && path.matches('/').count() == 3
}

/// Whether this is the start of a batch run (`POST …/run`).
fn is_start(method: &Method, path: &str) -> bool {
    method == Method::POST && path.ends_with("/run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_that_cannot_be_read_keeps_the_verdict() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &wrong_day).await;
    // The batch run ends; then the server goes away before its runs are read.
    let front = Front::start(&s.base, |method, path| {
        (method == Method::GET && path.ends_with("/tests")).then_some(Answer::With(503, "text/html", "<h1>503</h1>"))
    })
    .await;

    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.good_test]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
    assert!(stderr.contains("503"), "the summary says why it is missing: {stderr}");
    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.bad_test]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains(": FAILED"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_by_a_5xx_page_is_tried_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    // A proxy's own error page, not the API's JSON, for the first eight
    // reads (~14 s: a server being deployed).
    let reads = AtomicUsize::new(0);
    let front = Front::start(&s.base, move |method, path| {
        (is_batch_run(method, path) && reads.fetch_add(1, Ordering::SeqCst) < 8).then_some(Answer::With(
            500,
            "text/html",
            "<html><body>500 Internal Server Error</body></html>",
        ))
    })
    .await;

    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.good_test]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("trying again"), "{stderr}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
}

/// A gateway's "not now" (429 Too Many Requests, 408 Request Timeout) is a
/// read that failed for now, not the end of the wait: tried again, after
/// the `Retry-After` it gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_a_gateway_refuses_for_now_is_tried_again_when_it_says() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    let reads = Arc::new(Mutex::new(Vec::new()));
    let seen = reads.clone();
    let front = Front::start(&s.base, move |method, path| {
        if !is_batch_run(method, path) {
            return None;
        }
        let mut reads = seen.lock().unwrap();
        reads.push(Instant::now());
        match reads.len() {
            1 => Some(Answer::NotNow(429, Some("3"))),
            2 => Some(Answer::NotNow(408, None)),
            3 => Some(Answer::NotNow(429, None)),
            _ => None,
        }
    })
    .await;

    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.good_test]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
    assert!(stderr.contains("429 Too Many Requests") && stderr.contains("trying again"), "{stderr}");
    assert!(!stderr.contains("cancelling"), "{stderr}");
    let reads = reads.lock().unwrap().clone();
    assert!(reads.len() > 3, "{reads:?}");
    // Without a `Retry-After`, the next read would come 1 s later.
    assert!(reads[1] - reads[0] >= Duration::from_secs(3), "{:?} after a Retry-After of 3 s", reads[1] - reads[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_answer_was_lost_is_tried_again_and_runs_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    // The first two starts reach the server, which starts the batch run,
    // but the gateway in front of it answers 504: the job cannot tell.
    let starts = AtomicUsize::new(0);
    let front = Front::start(&s.base, move |method, path| {
        (is_start(method, path) && starts.fetch_add(1, Ordering::SeqCst) < 2).then_some(Answer::Lost(504))
    })
    .await;

    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.good_test]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("starting the batch run failed") && stderr.contains("trying again"), "{stderr}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
    let id = started_id(&stderr);
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={project}"), &key, None, 200).await;
    let ids: Vec<&str> = listed["batch_runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [id.as_str()], "one batch run, not one per attempt");
    let ledger = s.expect(Method::GET, "/v1/transactions", &key, None, 200).await;
    let reservations = ledger["transactions"].as_array().unwrap().iter().filter(|t| t["kind"] == "reservation");
    assert_eq!(reservations.count(), 1, "{ledger}");
}

/// A start whose attempt outlasts the time it may take (a gateway's
/// timeout longer than `--timeout`; a minute, the client's own) is not
/// given up as "not started": the attempt is cut at the timeout, and one
/// more with the same `Idempotency-Key` learns the batch run it started,
/// which is then cancelled for the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_outlasts_the_timeout_is_asked_about_and_what_it_started_cancelled() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let test = suite(&s, &key, &project, &slow, &slow).await.good_test;
    // The first start reaches the server, which starts the batch run; the
    // gateway answers 504 only 30 s later.
    let starts = AtomicUsize::new(0);
    let front = Front::start(&s.base, move |method, path| {
        (is_start(method, path) && starts.fetch_add(1, Ordering::SeqCst) == 0)
            .then_some(Answer::LostAfter(504, Duration::from_secs(30)))
    })
    .await;

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let at = Instant::now();
    let (code, _, stderr) =
        run_at(&front.base, &key, &["--test", &test, "--timeout", "3", "--junit", junit.to_str().unwrap()]);
    assert!(at.elapsed() < Duration::from_secs(15), "{:?} with --timeout 3: {stderr}", at.elapsed());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("asking once more, with the same Idempotency-Key"), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 3 s; cancelled batch run {id}")), "{stderr}");
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={project}"), &key, None, 200).await;
    assert_eq!(listed["batch_runs"].as_array().unwrap().len(), 1, "one batch run: {listed:#}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(&format!(r#"<testsuite name="sparring batch run {id}""#)), "{xml}");
    assert!(xml.contains("no verdict: timed out after 3 s"), "{xml}");
}

/// A start that may have reached the server and is never answered, the
/// attempt that asks after it neither: said as a start whose outcome is
/// unknown, with its `Idempotency-Key`, never as one that did not happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_never_answered_is_said_unknown_with_its_key() {
    use std::time::{Duration, Instant};
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let test = suite(&s, &key, &project, &good, &good).await.good_test;
    // Every start reaches the server; no answer comes back in time.
    let front = Front::start(&s.base, move |method, path| {
        is_start(method, path).then_some(Answer::LostAfter(504, Duration::from_secs(600)))
    })
    .await;

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let at = Instant::now();
    let (code, _, stderr) =
        run_at(&front.base, &key, &["--test", &test, "--timeout", "2", "--junit", junit.to_str().unwrap()]);
    assert!(at.elapsed() < Duration::from_secs(15), "{:?} with --timeout 2: {stderr}", at.elapsed());
    assert_eq!(code, Some(2), "{stderr}");
    let said = "a batch run may have been started: look in the project's batch runs (Idempotency-Key sparring-run-";
    assert!(stderr.contains(said), "{stderr}");
    let at = stderr.find("(Idempotency-Key ").unwrap() + "(Idempotency-Key ".len();
    let idempotency_key = &stderr[at..at + stderr[at..].find(')').unwrap()];
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(r#"type="start_unknown""#) && xml.contains(idempotency_key), "{xml}");
    assert!(!xml.contains("no batch run started"), "{xml}");
    // It had started one.
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={project}"), &key, None, 200).await;
    assert_eq!(listed["batch_runs"].as_array().unwrap().len(), 1, "{listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_counts_the_starts_tried_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    // The first two starts meet a server that is away: the third, 4 s in,
    // starts the batch run.
    let starts = AtomicUsize::new(0);
    let front = Front::start(&s.base, move |method, path| {
        (is_start(method, path) && starts.fetch_add(1, Ordering::SeqCst) < 2).then_some(Answer::With(
            503,
            "text/html",
            "<h1>503 Service Unavailable</h1>",
        ))
    })
    .await;

    let at = Instant::now();
    let (code, _, stderr) = run_at(&front.base, &key, &["--test", &test, "--timeout", "5"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("trying again"), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 5 s; cancelled batch run {id}")), "{stderr}");
    assert!(at.elapsed() < Duration::from_millis(7500), "{:?} with --timeout 5: {stderr}", at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_while_the_start_is_answered_cancels_what_it_started() {
    use std::time::Duration;
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let test = suite(&s, &key, &project, &slow, &slow).await.good_test;
    // The server starts the batch run; its answer takes 3 s to come back.
    let front =
        Front::start(&s.base, |method, path| is_start(method, path).then_some(Answer::Late(Duration::from_secs(3))))
            .await;

    // The CI job is cancelled while the answer is on its way.
    let mut p = Proc::spawn_with_env(&["run", "--url", &front.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    let listed = format!("/v1/batch-runs?project_id={project}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let id = loop {
        let runs = s.expect(Method::GET, &listed, &key, None, 200).await;
        if let Some(id) = runs["batch_runs"][0]["id"].as_str() {
            break id.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no batch run started: {}", p.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let code = p.terminate().code();
    assert_eq!(code, Some(2), "{}", p.stderr());
    assert!(p.stderr().contains(&format!("interrupted (SIGTERM); cancelled batch run {id}")), "{}", p.stderr());
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");
}

/// Interrupted while a start's answer is on its way, and that answer is the
/// server's refusal (which holds for every attempt with its key): nothing
/// was started, and it says why, not where to look for a batch run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_start_the_server_refuses_says_why_and_nothing_started() {
    use std::time::Duration;
    let good = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 1).await;
    let key = s.key_for_user("poor@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let test = suite(&s, &key, &project, &good, &good).await.good_test;
    let (seen, mut sent) = tokio::sync::mpsc::unbounded_channel();
    let front = Front::start(&s.base, move |method, path| {
        is_start(method, path).then(|| {
            let _ = seen.send(());
            Answer::Late(Duration::from_secs(2))
        })
    })
    .await;

    let mut p = Proc::spawn_with_env(&["run", "--url", &front.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    if tokio::time::timeout(Duration::from_secs(30), sent.recv()).await.is_err() {
        panic!("no start: {}", p.stderr());
    }
    assert_eq!(p.terminate().code(), Some(2), "{}", p.stderr());
    let said = "interrupted (SIGTERM) while starting: 402 insufficient_credits";
    assert!(p.stderr().contains(said), "{}", p.stderr());
    assert!(!p.stderr().contains("may have been started"), "{}", p.stderr());
}

/// With `--no-wait` too, an interrupt while the start is answered cancels
/// what it started (exit 2), rather than leave it running and say it
/// started (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_while_the_start_is_answered_cancels_what_it_started_without_waiting_too() {
    use std::time::Duration;
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let test = suite(&s, &key, &project, &slow, &slow).await.good_test;
    // The server starts the batch run; its answer takes 3 s to come back.
    let front =
        Front::start(&s.base, |method, path| is_start(method, path).then_some(Answer::Late(Duration::from_secs(3))))
            .await;

    let args = ["run", "--url", &front.base, "--test", &test, "--no-wait"];
    let mut p = Proc::spawn_with_env(&args, &[("SPARRING_API_KEY", &key)]);
    let listed = format!("/v1/batch-runs?project_id={project}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let id = loop {
        let runs = s.expect(Method::GET, &listed, &key, None, 200).await;
        if let Some(id) = runs["batch_runs"][0]["id"].as_str() {
            break id.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no batch run started: {}", p.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let code = p.terminate().code();
    assert_eq!(code, Some(2), "{}\n{}", p.stdout(), p.stderr());
    assert!(p.stderr().contains(&format!("interrupted (SIGTERM); cancelled batch run {id}")), "{}", p.stderr());
    assert!(p.stdout().is_empty(), "not said started: {}", p.stdout());
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_or_the_timeout_is_not_held_up_by_a_read_that_hangs() {
    use std::time::{Duration, Instant};
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    // The server stops answering reads of the batch run; a cancel still gets
    // through.
    let front = Front::start(&s.base, |method, path| is_batch_run(method, path).then_some(Answer::Hang)).await;

    // The CI job is cancelled while a read hangs: the runner kills the job
    // a few seconds after its SIGTERM.
    let mut p = Proc::spawn_with_env(&["run", "--url", &front.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    p.expect("the batch run to start", |o| o.stderr.contains("started batch run brn_"));
    let id = started_id(&p.stderr());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at = Instant::now();
    let code = p.terminate().code();
    assert!(at.elapsed() < Duration::from_secs(5), "{:?} after SIGTERM: {}", at.elapsed(), p.stderr());
    assert_eq!(code, Some(2), "{}", p.stderr());
    assert!(p.stderr().contains(&format!("interrupted (SIGTERM); cancelled batch run {id}")), "{}", p.stderr());
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");

    // A read that hangs fails once it is 10 s unanswered, and is said in
    // the CI log (the client's own timeout, 60 s, left it silent that long).
    let mut p = Proc::spawn_with_env(&["run", "--url", &front.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    p.expect("a read said unanswered", |o| {
        o.stderr.contains("reading the batch run failed (no answer within 10 s); trying again (failing for 1")
    });
    // Its runs may have ended meanwhile (passed), or be cancelled now.
    let code = p.terminate().code();
    assert!(matches!(code, Some(0 | 2)), "{code:?}: {}", p.stderr());

    // The timeout holds too.
    let at = Instant::now();
    let (code, _, stderr) = run_at(&front.base, &key, &["--test", &test, "--timeout", "2"]);
    assert!(at.elapsed() < Duration::from_secs(8), "{:?} with --timeout 2: {stderr}", at.elapsed());
    assert_eq!(code, Some(2), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 2 s; cancelled batch run {id}")), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ci_log_gets_a_line_every_10_s_while_nothing_changes() {
    use std::time::{Duration, Instant};
    // One conversation of ~30 s (two replies): its counts change once, when
    // it starts.
    let slow = Agent::start(&["--latency-ms", "15000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let p = s.create_project(&key, "slow").await;
    let persona =
        create(&s, &key, "/v1/personas", json!({"project_id": p, "name": "Dana", "prompt": "A parent"})).await;
    let scenario = create(&s, &key, "/v1/scenarios", booking(&p, &persona)).await;
    let channel = create(
        &s,
        &key,
        "/v1/channels",
        json!({"project_id": p, "name": "slow", "kind": "http", "target": slow.http_target(), "turn_timeout_ms": 20000}),
    )
    .await;
    let test = create(
        &s,
        &key,
        "/v1/tests",
        json!({"project_id": p, "name": "slow", "channel_id": channel, "scenario_id": scenario, "iterations": 1}),
    )
    .await;

    let mut proc = Proc::spawn_with_env(&["run", "--url", &s.base, "--test", &test], &[("SPARRING_API_KEY", &key)]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut arrived: Vec<Instant> = Vec::new();
    let status = loop {
        if proc.child.try_wait().unwrap().is_some() {
            let status = proc.wait_exit();
            arrived.resize(proc.stderr().lines().count(), Instant::now());
            break status;
        }
        arrived.resize(proc.stderr().lines().count(), Instant::now());
        assert!(Instant::now() < deadline, "{}", proc.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", proc.stderr());
    let longest = arrived.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    let took = arrived.last().unwrap().duration_since(arrived[0]);
    assert!(took > Duration::from_secs(25), "the run took {took:?}: {}", proc.stderr());
    assert!(longest < Duration::from_secs(15), "silent for {longest:?} in a CI log:\n{}", proc.stderr());
    assert!(arrived.len() < 10, "too many lines:\n{}", proc.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_fails_is_tried_again_then_said_with_the_batch_run() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    let is_cancel = |method: &Method, path: &str| method == Method::POST && path.ends_with("/cancel");

    // The server is away for a moment when the cancel is sent.
    let cancels = AtomicUsize::new(0);
    let front = Front::start(&s.base, move |method, path| {
        (is_cancel(method, path) && cancels.fetch_add(1, Ordering::SeqCst) < 2).then_some(Answer::With(
            503,
            "text/html",
            "<h1>503 Service Unavailable</h1>",
        ))
    })
    .await;
    let (code, _, stderr) = run_at(&front.base, &key, &["--test", &test, "--timeout", "1"]);
    assert_eq!(code, Some(2), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 1 s; cancelled batch run {id}")), "{stderr}");
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");

    // It stays away: the log says why it gave up and which batch run may
    // still be spending credits.
    let front = Front::start(&s.base, move |method, path| {
        is_cancel(method, path).then_some(Answer::With(503, "text/html", "<h1>503 Service Unavailable</h1>"))
    })
    .await;
    let (code, _, stderr) = run_at(&front.base, &key, &["--test", &test, "--timeout", "1"]);
    assert_eq!(code, Some(2), "{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains(&format!("timed out after 1 s; could not cancel batch run {id}")), "{stderr}");
    // The proxy's page is shown by its first words (the client keeps no
    // status for an answer it cannot read).
    assert!(stderr.contains("<h1>503 Service Unavailable</h1>"), "{stderr}");
    let run_ = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &key, None, 200).await;
    assert_ne!(run_["status"], "cancelled", "{run_:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_that_ended_before_the_cancel_keeps_its_verdict() {
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    // Reads of the batch run fail while it runs to its end (in about a
    // second); the timeout then sends the cancel, which finds it completed.
    let front = Front::start(&s.base, |method, path| {
        is_batch_run(method, path).then_some(Answer::With(503, "text/html", "<h1>503 Service Unavailable</h1>"))
    })
    .await;

    let (code, stdout, stderr) = run_at(&front.base, &key, &["--test", &suite.good_test, "--timeout", "4"]);
    let id = started_id(&stderr);
    let stored = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &key, None, 200).await;
    assert_eq!((stored["status"].as_str(), stored["passed"].as_bool()), (Some("completed"), Some(true)));
    assert!(!stderr.contains("cancelled batch run"), "it was not cancelled: {stderr}");
    assert!(stderr.contains(&format!("batch run {id} had already ended")), "{stderr}");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(": PASSED;"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparring_result_shows_a_conversation_and_why_it_failed() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("result").await;
    let other = s.team("elsewhere").await;
    let suite = suite(&s, &t.owner, &t.project_id, &good, &wrong_day).await;
    let (code, _, ran) = run(&s, &t.editor, &["--test", &suite.bad_test]);
    assert_eq!(code, Some(1), "{ran}");
    let results = s.expect(Method::GET, &format!("/v1/tests/{}/results", suite.bad_test), &t.viewer, None, 200).await;
    let result = &results["test_results"][0];
    let id = result["id"].as_str().unwrap();

    let (code, stdout, stderr) = command_at("result", &s.base, &t.viewer, &[id]);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with(&format!("result {id}: FAILED (score ")), "{stdout}");
    let reason = result["failure_reason"].as_str().unwrap();
    assert_eq!(lines[1], format!("why: {reason}"), "{stdout}");
    // Every turn of the transcript, in order, an agent's with its latency.
    let transcript = result["transcript"].as_array().unwrap();
    let at = lines.iter().position(|l| *l == "transcript:").unwrap();
    let mut turns = lines[at + 1..].iter().filter(|l| l.contains(" caller ") || l.contains(" agent "));
    for turn in transcript {
        let line = turns.next().unwrap_or_else(|| panic!("{turn} missing: {stdout}"));
        let text = turn["text"].as_str().unwrap().lines().next().unwrap();
        assert!(line.contains(text), "{line} for {turn}");
        if turn["role"] == "agent" {
            assert!(line.contains(&format!(" {} ms ", turn["latency_ms"])), "{line} for {turn}");
        }
    }
    for call in result["tool_calls"].as_array().unwrap() {
        let line = " tool  ".to_string();
        assert!(
            stdout.lines().any(|l| l.contains(&line) && l.contains(&format!(" {}(", call["name"].as_str().unwrap()))),
            "{stdout}"
        );
    }
    let failed = lines.iter().find(|l| l.contains("FAIL  step 1: right day")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(failed.contains("contains (rule)"), "{failed}");

    // By the call id the agent was sent, and as JSON: the API's document.
    let (code, stdout, stderr) =
        command_at("result", &s.base, &t.viewer, &[result["call_id"].as_str().unwrap(), "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(&serde_json::from_str::<Value>(&stdout).unwrap(), result);

    // A reader that stops before the end (`| head -n1`, here before the
    // first line) is no failure.
    for json in [false, true] {
        let mut args = vec!["result", "--url", &s.base, id];
        args.extend(json.then_some("--json"));
        let out = with_stdout_closed(&args, &t.viewer).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "--json {json}: {stderr}");
        assert!(stderr.is_empty(), "--json {json}: {stderr}");
    }

    // Someone else's: not found, and said so.
    let (code, stdout, stderr) = command_at("result", &s.base, &other.owner, &[id]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stderr.contains("404 not_found"), "{stderr}");

    // An id of another kind (the run `sparring run` names beside a failure,
    // a test) is said to be one, with where its results are: it was looked
    // up as a call id, "no test result for call with id `run_…`".
    let brn = started_id(&ran);
    let runs = s.expect(Method::GET, &format!("/v1/batch-runs/{brn}/runs"), &t.viewer, None, 200).await;
    let run_id = runs["runs"][0]["id"].as_str().unwrap();
    for (other_id, kind, look) in [
        (run_id, "a run", "GET /v1/batch-runs/brn_…/runs".to_string()),
        (&suite.bad_test, "a test", format!("GET /v1/tests/{}/results", suite.bad_test)),
    ] {
        let (code, _, stderr) = command_at("result", &s.base, &t.viewer, &[other_id]);
        assert_eq!(code, Some(1), "{stderr}");
        let said = format!("`{other_id}` is the id of {kind}, not of a test result (`trs_…`) or a call: ");
        assert!(stderr.contains(&said) && stderr.contains(&look), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_that_cannot_be_read_is_given_up_cancelled_and_reported() {
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    // Reads of the batch run get an error that will not pass (as after 5
    // minutes of failures); a cancel still gets through.
    let front = Front::start(&s.base, |method, path| {
        is_batch_run(method, path).then_some(Answer::With(
            404,
            "application/json",
            r#"{"error_code": "not_found", "message": "no batch run here", "request_id": "req_front"}"#,
        ))
    })
    .await;

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let (code, stdout, stderr) =
        run_at(&front.base, &key, &["--test", &test, "--json", "--junit", junit.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let id = started_id(&stderr);
    assert!(stderr.contains("404 not_found: no batch run here"), "{stderr}");
    // Not left spending credits.
    assert!(stderr.contains(&format!("cancelled batch run {id}")), "{stderr}");
    assert_eq!(status_of(&s, &key, &id).await, "cancelled");
    // The JSON and the report, as on any other give-up.
    let seen: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(seen["id"], json!(id));
    let xml = std::fs::read_to_string(&junit).unwrap_or_else(|e| panic!("no report ({e}): {stderr}"));
    assert!(xml.contains(r#"tests="1" failures="0" errors="1""#), "{xml}");
    assert!(xml.contains(r#"<error message="no verdict: reading batch run "#), "{xml}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_cancelled_by_someone_else_is_no_verdict_in_the_report_even_without_its_tests() {
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    // Its tests cannot be read at the end.
    let front = Front::start(&s.base, |method, path| {
        (method == Method::GET && path.ends_with("/tests")).then_some(Answer::With(503, "text/html", "<h1>503</h1>"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let mut p = Proc::spawn_with_env(
        &["run", "--url", &front.base, "--test", &test, "--junit", junit.to_str().unwrap()],
        &[("SPARRING_API_KEY", &key)],
    );
    p.expect("the batch run to start", |o| o.stderr.contains("started batch run brn_"));
    let id = started_id(&p.stderr());
    // Someone cancels it (from the dashboard): it ends cancelled, `passed`
    // false, which is no verdict (exit 2), not a failed test.
    s.expect(Method::POST, &format!("/v1/batch-runs/{id}/cancel"), &key, None, 200).await;
    let code = p.wait_exit().code();
    assert_eq!(code, Some(2), "{}\n{}", p.stdout(), p.stderr());
    assert!(p.stdout().contains("no verdict: the batch run is cancelled"), "{}", p.stdout());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains(r#"tests="1" failures="0" errors="1""#), "{xml}");
    assert!(xml.contains(r#"<error message="no verdict: the batch run is cancelled""#), "{xml}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_up_says_so_and_ends_within_seconds_when_the_server_stops_answering() {
    use std::time::{Duration, Instant};
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let test = slow_suite(&s, &key, &slow).await;
    // The batch run starts; then nothing is answered, the cancel and the
    // reads for the report neither.
    let front = Front::start(&s.base, |method, path| (!is_start(method, path)).then_some(Answer::Hang)).await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let spawn = || {
        let args = ["run", "--url", &front.base, "--test", &test, "--junit", junit.to_str().unwrap()];
        let p = Proc::spawn_with_env(&args, &[("SPARRING_API_KEY", &key)]);
        p.expect("the batch run to start", |o| o.stderr.contains("started batch run brn_"));
        p
    };

    // The CI job is cancelled: it says at once what it does, and the
    // report is written before a runner's SIGKILL (seconds later).
    let mut p = spawn();
    let id = started_id(&p.stderr());
    let at = Instant::now();
    p.signal("INT");
    let cancelling = format!("interrupted (SIGINT); cancelling batch run {id}…");
    p.expect("the cancel said", |o| o.stderr.contains(&cancelling));
    assert!(at.elapsed() < Duration::from_secs(2), "said after {:?}", at.elapsed());
    let code = p.wait_exit().code();
    assert!(at.elapsed() < Duration::from_secs(9), "{:?} after SIGINT: {}", at.elapsed(), p.stderr());
    assert_eq!(code, Some(2), "{}", p.stderr());
    assert!(
        p.stderr().contains(&format!("could not cancel batch run {id}, it may still be running")),
        "{}",
        p.stderr()
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    let said = format!("no verdict: interrupted (SIGINT); could not cancel batch run {id}, it may still be running");
    assert!(xml.contains(&format!(r#"<error message="{said}"#)), "{xml}");

    // Told twice: the report from what is known, and out at once.
    let mut p = spawn();
    let id = started_id(&p.stderr());
    p.signal("INT");
    p.expect("the cancel said", |o| o.stderr.contains(&format!("cancelling batch run {id}…")));
    let at = Instant::now();
    p.signal("TERM");
    let code = p.wait_exit().code();
    assert!(at.elapsed() < Duration::from_secs(2), "{:?} after the second signal: {}", at.elapsed(), p.stderr());
    assert_eq!(code, Some(2), "{}", p.stderr());
    assert!(p.stderr().contains("interrupted again (SIGTERM)"), "{}", p.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("interrupted again (SIGTERM) while cancelling it"), "{xml}");
    assert!(xml.contains(&format!(r#"<testsuite name="sparring batch run {id}""#)), "{xml}");
}

/// A suite whose `sparring run --test` start reaches a gateway that never
/// answers it: the two tests of an interrupted start.
struct StartNeverAnswered {
    _good: Agent,
    _s: TestServer,
    key: String,
    suite: Suite,
    front: Front,
    reached: tokio::sync::watch::Receiver<bool>,
}

impl StartNeverAnswered {
    async fn new() -> StartNeverAnswered {
        let good = Agent::start(&[]);
        let s = TestServer::start().await;
        let key = s.key_for_user("ci@example.com").await;
        let project = s.create_project(&key, "ci").await;
        let suite = suite(&s, &key, &project, &good, &good).await;
        let (seen, reached) = tokio::sync::watch::channel(false);
        let front = Front::start(&s.base, move |method, path| {
            is_start(method, path).then(|| seen.send_replace(true)).map(|_| Answer::Hang)
        })
        .await;
        StartNeverAnswered { _good: good, _s: s, key, suite, front, reached }
    }

    /// `sparring run` of the suite's good test through the gateway, with
    /// `more` arguments, once its start has reached the gateway.
    async fn run(&mut self, more: &[&str]) -> Proc {
        let mut args = vec!["run", "--url", &self.front.base, "--test", &self.suite.good_test];
        args.extend_from_slice(more);
        let p = Proc::spawn_with_env(&args, &[("SPARRING_API_KEY", &self.key)]);
        let start = async { self.reached.wait_for(|r| *r).await.is_ok() };
        let started = tokio::time::timeout(std::time::Duration::from_secs(30), start).await.unwrap_or(false);
        assert!(started, "no start: {}", p.stderr());
        p
    }
}

/// An interrupt during a start that is not answered is said at once,
/// while the start's answer is still waited for (up to 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_start_is_said_at_once() {
    let mut h = StartNeverAnswered::new().await;
    let mut p = h.run(&[]).await;
    p.signal("INT");
    p.expect("the interrupt said", |o| o.stderr.contains("interrupted (SIGINT) while starting; waiting up to 5 s"));
    assert!(p.child.try_wait().unwrap().is_none(), "said before the wait for the answer: {}", p.stderr());
    assert_eq!(p.wait_exit().code(), Some(2), "{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_start_says_where_to_look_for_what_it_may_have_started() {
    let mut h = StartNeverAnswered::new().await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let mut p = h.run(&["--junit", junit.to_str().unwrap()]).await;
    // Twice: the second does not wait for the start's answer.
    p.signal("INT");
    p.signal("INT");
    assert_eq!(p.wait_exit().code(), Some(2), "{}", p.stderr());
    let said = "a batch run may have been started: look in the project's batch runs (Idempotency-Key sparring-run-";
    assert!(p.stderr().contains(said), "{}", p.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("batch runs (Idempotency-Key sparring-run-") && xml.contains(r#"type="start_unknown""#),
        "{xml}"
    );
    assert!(!xml.contains("no batch run started"), "{xml}");
}

/// Interrupted while it tries again to reach a server that no attempt
/// reached (connection refused): nothing can have been started, and it says
/// so, not to look for a batch run that cannot exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_start_that_never_reached_the_server_says_nothing_started() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let j = junit.to_str().unwrap();
    let args = ["run", "--url", "http://127.0.0.1:9", "--test", "tst_x", "--junit", j];
    let mut p = Proc::spawn_with_env(&args, &[("SPARRING_API_KEY", "spk_x")]);
    p.expect("a start tried again", |o| o.stderr.contains("trying again"));
    assert_eq!(p.terminate().code(), Some(2), "{}", p.stderr());
    assert!(p.stderr().contains("interrupted (SIGTERM) while starting"), "{}", p.stderr());
    assert!(!p.stderr().contains("may have been started"), "{}", p.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("no batch run started: ") && xml.contains(r#"type="not_started""#), "{xml}");
}

/// A start that failed is said even when the report saying so cannot be
/// written: for one that may have started a batch run, its
/// `Idempotency-Key` is the only way to find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_cannot_be_written_after_a_failed_start_leaves_the_start_said() {
    let mut h = StartNeverAnswered::new().await;
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    let junit = reports.join("report.xml");
    let mut p = h.run(&["--junit", junit.to_str().unwrap()]).await;
    // The report's directory is gone (a workspace cleaned), then the job is
    // cancelled, twice.
    std::fs::remove_dir_all(&reports).unwrap();
    p.signal("INT");
    p.signal("INT");
    assert_eq!(p.wait_exit().code(), Some(2), "{}", p.stderr());
    let stderr = p.stderr();
    assert!(stderr.contains("writing the JUnit report to"), "{stderr}");
    let said = "a batch run may have been started: look in the project's batch runs (Idempotency-Key sparring-run-";
    assert!(stderr.contains(said), "{stderr}");
}

/// A reader that closes stdout early (`sparring run … | head -n1`, here
/// before anything is printed) loses what was printed, not the exit code nor
/// the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_leaves_the_verdict_and_the_report() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &wrong_day).await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let j = junit.to_str().unwrap();
    for (args, code) in [
        (vec!["--test", &suite.good_test, "--junit", j], 0),
        (vec!["--test", &suite.bad_test, "--junit", j], 1),
        (vec!["--test", &suite.bad_test, "--json", "--junit", j], 1),
    ] {
        let out = with_stdout_closed(&[&["run", "--url", &s.base][..], &args].concat(), &key).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        let id = started_id(&stderr);
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(xml.contains(&format!(r#"<testsuite name="sparring batch run {id}""#)), "{args:?}: {xml}");
        assert!(!xml.contains("unfinished"), "{args:?}: {xml}");
    }
}

/// `sparring` with `args` and `key`, its stdout and stderr (one pipe, as
/// with `2>&1 | head -n1`) closed before it writes anything.
async fn with_output_closed(args: &[&str], key: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::process::BIN);
    cmd.args(args).env_remove("SPARRING_URL").env("SPARRING_API_KEY", key);
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap()
}

/// A reader that closed stderr too (`sparring run … 2>&1 | head -n1`): the
/// progress and the messages are lost, never the exit code, the report or
/// the cancel of a batch run given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_leaves_the_verdict_the_report_and_the_cancel() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let slow = Agent::start(&["--latency-ms", "2000"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &wrong_day).await;
    let slow_test = slow_suite(&s, &key, &slow).await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let j = junit.to_str().unwrap();
    let id_in = |xml: &str| {
        let at = xml.find("sparring batch run brn_").unwrap_or_else(|| panic!("no batch run: {xml}"));
        xml[at + "sparring batch run ".len()..].split('"').next().unwrap().to_string()
    };
    for (args, code) in [
        (vec!["--test", &suite.good_test, "--junit", j], 0),
        (vec!["--test", &suite.bad_test, "--junit", j], 1),
        (vec!["--test", &slow_test, "--timeout", "1", "--junit", j], 2),
    ] {
        let out = with_output_closed(&[&["run", "--url", &s.base][..], &args].concat(), &key).await;
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(!xml.contains("unfinished"), "{args:?}: {xml}");
        let id = id_in(&xml);
        if code == 2 {
            assert!(xml.contains("no verdict: timed out after 1 s"), "{xml}");
            assert_eq!(status_of(&s, &key, &id).await, "cancelled");
        }
    }
    // Refused: exit 2 all the same.
    let out = with_output_closed(&["run", "--url", &s.base, "--test", &suite.good_test], "spk_not_a_key").await;
    assert_eq!(out.status.code(), Some(2));
}

/// The other client commands fail with exit 1 when stderr is closed too:
/// the error's message was written with `eprintln!`, which panicked (101).
#[tokio::test]
async fn a_closed_stderr_leaves_a_failing_command_its_exit_code() {
    let nothing = common::ClosedPort::new();
    let url = format!("http://127.0.0.1:{}", nothing.port);
    let out = with_output_closed(&["result", "trs_nothing", "--url", &url], "spk_x").await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // And with stderr open, the same failure says why.
    let out = std::process::Command::new(common::process::BIN)
        .args(["result", "trs_nothing", "--url", &url])
        .env_remove("SPARRING_URL")
        .env("SPARRING_API_KEY", "spk_x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_cannot_be_written_at_the_end_leaves_the_verdict() {
    let good = Agent::start(&["--latency-ms", "500"]);
    let s = TestServer::start().await;
    let key = s.key_for_user("ci@example.com").await;
    let project = s.create_project(&key, "ci").await;
    let suite = suite(&s, &key, &project, &good, &good).await;
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    let junit = reports.join("report.xml");
    let args = ["run", "--url", &s.base, "--test", &suite.good_test, "--junit", junit.to_str().unwrap()];
    let mut p = Proc::spawn_with_env(&args, &[("SPARRING_API_KEY", &key)]);
    p.expect("the batch run to start", |o| o.stderr.contains("started batch run brn_"));
    // Its directory is gone by the end (a workspace cleaned).
    std::fs::remove_dir_all(&reports).unwrap();
    let code = p.wait_exit().code();
    assert_eq!(code, Some(0), "the verdict stands: {}\n{}", p.stdout(), p.stderr());
    assert!(p.stdout().contains(": PASSED;"), "{}", p.stdout());
    assert!(p.stderr().contains("only the report"), "{}", p.stderr());
}

/// The report is replaced whole, never rewritten in place: a command killed
/// while it writes its report (here by the file size limit, SIGXFSZ, as
/// the report it replaces the "unfinished" one with grows past it) leaves
/// the report that was there, whole, not a cut-off XML file.
#[cfg(unix)]
#[test]
fn a_kill_while_the_report_is_written_leaves_the_one_before_whole() {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let j = junit.to_str().unwrap();
    // No key: the "unfinished" report, then the longer "not started" one.
    let args = ["run", "--url", "http://127.0.0.1:1", "--test", "tst_x", "--junit", j];
    let run = |limit: Option<u64>| {
        let mut cmd = std::process::Command::new(common::process::BIN);
        cmd.args(args).env("SPARRING_API_KEY", "").env_remove("SPARRING_URL");
        if let Some(limit) = limit {
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    rlimit::setrlimit(rlimit::Resource::CORE, 0, 0)?;
                    rlimit::setrlimit(rlimit::Resource::FSIZE, limit, limit)
                });
            }
        }
        cmd.output().unwrap()
    };
    let out = run(None);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let whole = std::fs::read_to_string(&junit).unwrap();
    assert!(whole.contains(r#"type="not_started""#), "{whole}");

    // Files may grow to one byte short of that report: the "unfinished"
    // one is written, the one after it is cut off.
    std::fs::remove_file(&junit).unwrap();
    let out = run(Some(whole.len() as u64 - 1));
    assert_eq!(out.status.signal(), Some(25), "not killed by SIGXFSZ: {}", String::from_utf8_lossy(&out.stderr));
    let left = std::fs::read_to_string(&junit).unwrap();
    assert!(left.contains(r#"type="unfinished""#) && left.trim_end().ends_with("</testsuites>"), "{left}");
}

/// The API key goes to `--url` only: a redirect (here to another port, as
/// to another host, or from `https://` to `http://`) is not followed, and
/// the command says what answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_never_sent_where_a_redirect_points() {
    let elsewhere = Recorder::start().await;
    let to = elsewhere.base.clone();
    let front =
        Front::start("http://127.0.0.1:9", move |_, path| Some(Answer::Redirect(307, format!("{to}{path}")))).await;
    let key = "spk_not_for_elsewhere";

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("report.xml");
    let (code, stdout, stderr) = run_at(&front.base, key, &["--test", "tst_x", "--junit", junit.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let said =
        format!("307 Temporary Redirect, a redirect to `{}/v1/tests/tst_x/run`, which is not followed", elsewhere.base);
    assert!(stderr.contains(&said), "{stderr}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("no batch run started: starting the batch run: the server answered 307"), "{xml}");
    let (code, _, stderr) = command_at("result", &front.base, key, &["trs_x"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("which is not followed"), "{stderr}");

    assert_eq!(elsewhere.seen().iter().filter(|(_, keyed)| *keyed).count(), 0, "{:?}", elsewhere.seen());
}
