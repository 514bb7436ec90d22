//! The engine end to end: real server, real SQLite, the real reference agent
//! (`sparring agent`, a child process) over loopback HTTP and WebSocket.
//! Only the LLM and the webhook receiver are the test's own loopback
//! stand-ins, speaking their real protocols.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::engine::{
    all_pages, channel, chat_llm, completion, create, held_receiver, wait_for_end, ws_recv, ws_send, Agent, Recorder,
    WsAgent, WsPeer,
};
use common::{error_body, TestServer};
use reqwest::Method;
use serde_json::{json, Value};
use sparring_impl::engine::webhooks::{REMOVED, UNDER_WAY};

/// Books Tuesday at 3 pm with the reference agent: passes against the real
/// agent, fails against `--bug wrong-day` (step 1's "right day") and
/// `--bug no-confirmation` (step 1's "confirms").
fn booking(project_id: &str, persona: &str) -> Value {
    json!({
        "project_id": project_id,
        "name": "book tuesday",
        "mode": "scripted",
        "default_persona_id": persona,
        "first_message": "Hi, I'd like to book an appointment.",
        "steps": [
            {"say": "Tuesday at 3 pm, please.", "expect": [
                {"type": "contains", "name": "confirms", "text": "confirmed"},
                {"type": "contains", "name": "right day", "text": "Tuesday"}
            ]},
            {"say": "That's all, goodbye.", "expect": [{"type": "agent_ended_call", "name": "hangs up"}]}
        ],
        "success_criteria": [{"type": "tool_called", "name": "books", "tool": "book_appointment"}],
        "max_duration_s": 60
    })
}

/// Two caller lines and no goodbye: the caller ends the call.
fn short_call(project_id: &str, persona: &str) -> Value {
    json!({
        "project_id": project_id,
        "name": "two lines",
        "mode": "scripted",
        "default_persona_id": persona,
        "first_message": "Hi, what are your opening hours?",
        "steps": [{"say": "Thanks. And can I book for Wednesday at 10am?", "expect": []}],
        "max_duration_s": 60
    })
}

fn test_body(project_id: &str, name: &str, channel: &str, scenario: &str, iterations: u32) -> Value {
    json!({"project_id": project_id, "name": name, "channel_id": channel, "scenario_id": scenario,
           "iterations": iterations})
}

struct Setup {
    persona: String,
}

async fn persona(s: &TestServer, key: &str, project_id: &str) -> Setup {
    let persona =
        create(s, key, "/v1/personas", json!({"project_id": project_id, "name": "Dana", "prompt": "A busy parent"}))
            .await;
    Setup { persona }
}

/// A new persona and the two-line scripted scenario it plays ([`short_call`]);
/// returns the scenario's id.
async fn short_scenario(s: &TestServer, key: &str, project_id: &str) -> String {
    let Setup { persona } = persona(s, key, project_id).await;
    create(s, key, "/v1/scenarios", short_call(project_id, &persona)).await
}

async fn results_of(s: &TestServer, key: &str, test_id: &str) -> Vec<Value> {
    all_pages(s, key, &format!("/v1/tests/{test_id}/results"), "test_results").await
}

fn ledger_balances(transactions: &[Value]) -> i64 {
    // Newest first: the balance is the first entry's `balance_after`, and
    // it equals the sum of every amount.
    let sum: i64 = transactions.iter().map(|t| t["amount"].as_i64().unwrap()).sum();
    let balance = transactions[0]["balance_after"].as_i64().unwrap();
    assert_eq!(sum, balance, "the balance is the sum of the ledger: {transactions:#?}");
    for t in transactions {
        assert!(t["balance_after"].as_i64().unwrap() >= 0, "never negative: {t}");
    }
    balance
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_passes_and_fails_for_real_reasons() {
    let good = Agent::start(&[]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("end to end").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let over_http = channel(&s, &t.editor, p, "http", &good.http_target()).await;
    let over_ws = channel(&s, &t.editor, p, "websocket", &good.ws_target()).await;
    let buggy = channel(&s, &t.editor, p, "http", &wrong_day.http_target()).await;
    let t1 = create(&s, &t.editor, "/v1/tests", test_body(p, "books over http", &over_http, &scenario, 2)).await;
    let t2 = create(&s, &t.editor, "/v1/tests", test_body(p, "books over websocket", &over_ws, &scenario, 1)).await;
    let t3 = create(&s, &t.editor, "/v1/tests", test_body(p, "books the right day", &buggy, &scenario, 2)).await;
    let batch =
        create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "nightly", "test_ids": [t1, t2, t3]}))
            .await;

    let metadata = json!({"git_commit": "0a1b2c3", "branch": "main"});
    let started = s
        .expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({"metadata": metadata})), 200)
        .await;
    assert_eq!(started["counts"]["total"], 5);
    assert_eq!(started["source"], "batch");
    assert_eq!(started["batch_id"], json!(batch));
    assert_eq!(started["metadata"], metadata);
    // 60 s at most each: 1 credit per conversation, reserved up front.
    assert_eq!(started["credits_reserved"], 5);
    assert_eq!(started["passed"], Value::Null);
    let id = started["id"].as_str().unwrap();

    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        done["counts"],
        json!({"total": 5, "queued": 0, "running": 0, "passed": 3, "failed": 2, "errored": 0, "cancelled": 0}),
        "{done:#}"
    );
    assert_eq!(done["pass_rate"], 0.6);
    assert_eq!(done["passed"], false, "a test below its threshold fails the batch run");
    assert_eq!(done["credits_charged"], 5);
    assert!(done["finished_at"].is_string() && done["started_at"].is_string());

    // The buggy agent's results fail for the real reason.
    let failed = results_of(&s, &t.viewer, &t3).await;
    assert_eq!(failed.len(), 2);
    for r in &failed {
        assert_eq!(r["status"], "failed", "{r:#}");
        let reason = r["failure_reason"].as_str().unwrap();
        assert!(reason.contains("right day") && reason.contains("Tuesday"), "{reason}");
        let right_day = r["evaluations"].as_array().unwrap().iter().find(|e| e["name"] == "step 1: right day").unwrap();
        assert_eq!(right_day["passed"], false);
        let confirms = r["evaluations"].as_array().unwrap().iter().find(|e| e["name"] == "step 1: confirms").unwrap();
        assert_eq!(confirms["passed"], true, "it does confirm, just the wrong day");
    }
    for (test, n) in [(&t1, 2), (&t2, 1)] {
        let passed = results_of(&s, &t.viewer, test).await;
        assert_eq!(passed.len(), n);
        for r in &passed {
            assert_eq!(r["status"], "passed", "{r:#}");
            assert_eq!(r["score"], 1.0);
            assert_eq!(r["failure_reason"], Value::Null);
            assert_eq!(r["ended_reason"], "agent_ended");
            assert_eq!(r["metadata"], metadata, "results keep the run's metadata");
            assert_eq!(r["scenario_version"], 1);
            assert_eq!(r["batch_run_id"], json!(id));
            assert_eq!(r["credits"], 1);
            let transcript = r["transcript"].as_array().unwrap();
            assert_eq!(transcript[0]["role"], "caller");
            assert_eq!(transcript[0]["text"], "Hi, I'd like to book an appointment.");
            assert_eq!(transcript[1]["role"], "agent");
            assert!(transcript[1]["latency_ms"].is_u64());
            assert_eq!(r["metrics"]["turns"], transcript.len());
            assert!(r["metrics"]["latency_ms"]["p95"].is_u64());
            assert!(r["metrics"]["time_to_first_word_ms"].is_u64());
            assert!(r["tool_calls"].as_array().unwrap().iter().any(|c| c["name"] == "book_appointment"), "{r:#}");
            // The same record by the call id we sent the agent.
            let call = r["call_id"].as_str().unwrap();
            let by_call =
                s.expect(Method::GET, &format!("/v1/test-results/by-call/{call}"), &t.viewer, None, 200).await;
            assert_eq!(&by_call, r);
            let by_id = s
                .expect(Method::GET, &format!("/v1/test-results/{}", r["id"].as_str().unwrap()), &t.viewer, None, 200)
                .await;
            assert_eq!(&by_id, r);
        }
    }
    // Every run ended once, with its result.
    let runs = all_pages(&s, &t.viewer, &format!("/v1/batch-runs/{id}/runs"), "runs").await;
    assert_eq!(runs.len(), 5);
    let statuses: BTreeMap<String, usize> = runs.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r["status"].as_str().unwrap().to_string()).or_default() += 1;
        m
    });
    assert_eq!(statuses, BTreeMap::from([("failed".into(), 2), ("passed".into(), 3)]));
    assert!(runs.iter().all(|r| r["test_result_id"].is_string() && r["attempt"] == 1));

    // The batch shows its last run; the owner's ledger (the owner pays,
    // whoever starts the run) shows the reservation, and no refund since
    // every conversation used its credit.
    let b = s.expect(Method::GET, &format!("/v1/batches/{batch}"), &t.viewer, None, 200).await;
    assert_eq!(b["last_run"], json!({"id": id, "status": "completed", "pass_rate": 0.6}));
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let kinds: Vec<&str> = ledger.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reservation", "grant"]);
    assert_eq!(ledger_balances(&ledger), 1000 - 5);
    let paid = s.expect(Method::GET, &format!("/v1/transactions?batch_run_id={id}"), &t.owner, None, 200).await;
    assert_eq!(paid["transactions"][0]["amount"], -5);
    let editors = all_pages(&s, &t.editor, "/v1/transactions", "transactions").await;
    assert_eq!(editors.len(), 1, "the editor who started it paid nothing: {editors:#?}");

    // Running only the passing tests passes: the CI gate says yes.
    let again = s.expect(Method::POST, &format!("/v1/tests/{t1}/run"), &t.editor, Some(json!({})), 200).await;
    let again = wait_for_end(&s, &t.viewer, again["id"].as_str().unwrap()).await;
    assert_eq!((again["status"].as_str(), again["passed"].as_bool()), (Some("completed"), Some(true)));
    assert_eq!(again["source"], "test");
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?batch_id={batch}"), &t.viewer, None, 200).await;
    assert_eq!(listed["batch_runs"].as_array().unwrap().len(), 1, "filtered by batch");
    let listed = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={p}"), &t.viewer, None, 200).await;
    assert_eq!(listed["batch_runs"].as_array().unwrap().len(), 2);
    assert_eq!(listed["batch_runs"][0]["id"], again["id"], "newest first");
}

/// `GET /batch-runs/{id}/tests`: how each test did, judged by the test as it
/// was when the batch run started, with the first failures' reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_says_how_each_test_did() {
    let good = Agent::start(&["--latency-ms", "100"]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("per test").await;
    let other = s.team("someone else").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let over_http = channel(&s, &t.editor, p, "http", &good.http_target()).await;
    let buggy = channel(&s, &t.editor, p, "http", &wrong_day.http_target()).await;
    let passing = create(&s, &t.editor, "/v1/tests", test_body(p, "books", &over_http, &scenario, 2)).await;
    let failing = create(&s, &t.editor, "/v1/tests", test_body(p, "books the right day", &buggy, &scenario, 4)).await;
    let batch = create(
        &s,
        &t.editor,
        "/v1/batches",
        json!({"project_id": p, "name": "nightly", "test_ids": [passing, failing]}),
    )
    .await;
    let started = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let id = started["id"].as_str().unwrap();
    let path = format!("/v1/batch-runs/{id}/tests");

    // Changed while it runs: the batch run keeps the name and the threshold
    // it started with (at 0 the failing test would pass).
    let change = json!({"name": "renamed", "pass_threshold": 0.0});
    s.expect(Method::PATCH, &format!("/v1/tests/{failing}"), &t.editor, Some(change), 200).await;
    let running = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
    let done = wait_for_end(&s, &t.viewer, id).await;
    if running["tests"].as_array().unwrap().iter().any(|t| t["counts"]["queued"] != 0 || t["counts"]["running"] != 0) {
        assert!(running["tests"].as_array().unwrap().iter().all(|t| t["passed"].is_null()), "{running:#}");
    }
    assert_eq!((done["status"].as_str(), done["passed"].as_bool()), (Some("completed"), Some(false)), "{done:#}");

    let listed = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
    assert!(listed["blinded"].is_null() && listed["next_cursor"].is_null(), "{listed:#}");
    let tests = listed["tests"].as_array().unwrap();
    let ids: Vec<&str> = tests.iter().map(|t| t["test_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [failing.as_str(), passing.as_str()], "newest first");
    let (f, ok) = (&tests[0], &tests[1]);
    assert_eq!((f["name"].as_str(), f["pass_threshold"].as_f64()), (Some("books the right day"), Some(1.0)));
    assert_eq!(
        f["counts"],
        json!({"total": 4, "queued": 0, "running": 0, "passed": 0, "failed": 4, "errored": 0, "cancelled": 0})
    );
    assert_eq!((f["pass_rate"].as_f64(), f["passed"].as_bool()), (Some(0.0), Some(false)), "{f:#}");
    assert_eq!(
        ok["counts"],
        json!({"total": 2, "queued": 0, "running": 0, "passed": 2, "failed": 0, "errored": 0, "cancelled": 0})
    );
    assert_eq!((ok["name"].as_str(), ok["pass_rate"].as_f64()), (Some("books"), Some(1.0)));
    assert_eq!((ok["passed"].as_bool(), ok["failures"].as_array().map(Vec::len)), (Some(true), Some(0)));

    // Three of the four failures, in the order their runs were queued, each
    // with its result's reason and the run it ended.
    let mut results: Vec<Value> = results_of(&s, &t.viewer, &failing).await;
    results.sort_by(|a, b| a["run_id"].as_str().cmp(&b["run_id"].as_str()));
    let failures = f["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3, "{f:#}");
    for (failure, result) in failures.iter().zip(&results) {
        assert_eq!(failure["test_result_id"], result["id"], "{failure:#}");
        assert_eq!(failure["run_id"], result["run_id"], "{failure:#}");
        assert_eq!(
            (failure["status"].as_str(), &failure["failure_reason"]),
            (Some("failed"), &result["failure_reason"])
        );
        assert!(failure["failure_reason"].as_str().unwrap().contains("right day"), "{failure:#}");
    }

    // Paged, by a cursor of its own.
    let first = s.expect(Method::GET, &format!("{path}?limit=1"), &t.viewer, None, 200).await;
    assert_eq!(first["tests"][0]["test_id"], json!(failing));
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = s.expect(Method::GET, &format!("{path}?limit=1&cursor={cursor}"), &t.viewer, None, 200).await;
    assert_eq!((&second["tests"][0]["test_id"], &second["next_cursor"]), (&json!(passing), &Value::Null));
    let refused = s.expect(Method::GET, &format!("{path}?cursor={id}"), &t.viewer, None, 400).await;
    assert_eq!(refused["error_code"], "invalid_cursor", "{refused:#}");
    // Not someone else's.
    let hidden = s.expect(Method::GET, &path, &other.owner, None, 404).await;
    assert_eq!(hidden["error_code"], "not_found");
}

/// A page of a batch run's tests names up to three failures of each of up
/// to 200 tests: their reasons are kept with the runs, not read out of
/// their results' documents, each up to a call's record in size (600 of
/// them, 2 MB each, were 1.2 GB read and parsed on the request's thread to
/// answer 140 KB). Here the documents are emptied under the server: the
/// reasons are still those the results were written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tests_failures_are_listed_without_reading_their_results() {
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("failures from the runs").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let buggy = channel(&s, &t.editor, p, "http", &wrong_day.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "books the right day", &buggy, &scenario, 2)).await;
    let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = started["id"].as_str().unwrap();
    assert_eq!(wait_for_end(&s, &t.viewer, id).await["counts"]["failed"], 2);
    let mut results: Vec<Value> = results_of(&s, &t.viewer, &test).await;
    results.sort_by(|a, b| a["run_id"].as_str().cmp(&b["run_id"].as_str()));

    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(db.execute("UPDATE test_results SET document = '{}' WHERE batch_run_id = ?1", [id]).unwrap(), 2);

    let listed = s.expect(Method::GET, &format!("/v1/batch-runs/{id}/tests"), &t.viewer, None, 200).await;
    let failures = listed["tests"][0]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{listed:#}");
    for (failure, result) in failures.iter().zip(&results) {
        assert_eq!((&failure["run_id"], &failure["test_result_id"]), (&result["run_id"], &result["id"]));
        assert_eq!(failure["failure_reason"], result["failure_reason"], "{failure:#}");
        assert!(failure["failure_reason"].as_str().unwrap().contains("right day"), "{failure:#}");
    }
}

/// A run cancelled mid-conversation keeps a result (an error, "cancelled
/// after N turns") but it is a cancelled run, not one that failed or ended
/// in error: it is not among a test's failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_is_not_among_a_tests_failures() {
    let wrong_day = Agent::start(&["--bug", "wrong-day", "--latency-ms", "700"]);
    let s = TestServer::start().await;
    let t = s.team("cancelled is not failed").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let buggy = channel(&s, &t.editor, p, "http", &wrong_day.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "books the right day", &buggy, &scenario, 2)).await;
    let batch = json!({"project_id": p, "name": "one at a time", "test_ids": [test], "concurrency": 1});
    let batch = create(&s, &t.editor, "/v1/batches", batch).await;
    let started = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let id = started["id"].as_str().unwrap();
    // The first run failed; the second is talking: cancel it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
        if now["counts"]["failed"] == 1 && now["counts"]["running"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "never one failed and one running: {now:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.expect(Method::POST, &format!("/v1/batch-runs/{id}/cancel"), &t.editor, None, 200).await;
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!((done["counts"]["failed"].as_i64(), done["counts"]["cancelled"].as_i64()), (Some(1), Some(1)));
    // The cancelled run kept a result.
    assert_eq!(results_of(&s, &t.viewer, &test).await.len(), 2);

    let listed = s.expect(Method::GET, &format!("/v1/batch-runs/{id}/tests"), &t.viewer, None, 200).await;
    let failures = listed["tests"][0]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "the failed run only: {listed:#}");
    assert_eq!(failures[0]["status"], "failed", "{listed:#}");
    assert!(failures[0]["failure_reason"].as_str().unwrap().contains("right day"), "{listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_failure_is_an_error_with_a_reason() {
    let five_hundred = Agent::start(&["--error-rate", "1.0"]);
    let bad_json = Agent::start(&["--fault", "bad-json"]);
    let hangs = Agent::start(&["--fault", "hang"]);
    let drops = Agent::start(&["--fault", "disconnect"]);
    let closed = common::ClosedPort::new();
    let s = TestServer::start().await;
    let t = s.team("failures").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let cases: Vec<(&str, String, &[&str])> = vec![
        ("http", closed.http_target(), &["connect"]),
        ("http", five_hundred.http_target(), &["500"]),
        ("http", bad_json.http_target(), &["json"]),
        ("http", hangs.http_target(), &["3000 ms"]),
        ("websocket", drops.ws_target(), &["closed"]),
        ("websocket", hangs.ws_target(), &["3000 ms"]),
    ];
    let mut tests = Vec::new();
    for (i, (kind, target, _)) in cases.iter().enumerate() {
        let ch = channel(&s, &t.editor, p, kind, target).await;
        tests.push(create(&s, &t.editor, "/v1/tests", test_body(p, &format!("case {i}"), &ch, &scenario, 1)).await);
    }
    let batch =
        create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "faults", "test_ids": tests})).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    assert_eq!(done["counts"]["errored"], 6, "{done:#}");
    assert_eq!(done["passed"], false);
    for (test, (kind, target, words)) in tests.iter().zip(&cases) {
        let results = results_of(&s, &t.viewer, test).await;
        assert_eq!(results.len(), 1);
        let r = &results[0];
        assert_eq!(r["status"], "error", "{kind} {target}: {r:#}");
        assert_eq!(r["ended_reason"], "agent_error");
        let reason = r["failure_reason"].as_str().unwrap().to_lowercase();
        for word in *words {
            assert!(reason.contains(word), "{kind} {target}: {reason:?} should say {word:?}");
        }
        assert!(reason.contains("turn"), "the reason names the turn: {reason}");
    }
}

/// A call to an agent that never takes the connection (its address does
/// not answer) reached no one and costs nothing, over http and websocket,
/// though the turn timeout ended it; an agent that takes the connection and
/// never answers costs its started minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_connection_is_never_made_costs_nothing() {
    let unanswered = common::UnansweredPort::new().await;
    let taker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = taker.local_addr().unwrap();
    let taking = tokio::spawn(async move {
        let mut taken = Vec::new();
        while let Ok((stream, _)) = taker.accept().await {
            taken.push(stream);
        }
    });
    let s = TestServer::start().await;
    let t = s.team("never connected").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let port = unanswered.port;
    let cases = [
        ("http", format!("http://127.0.0.1:{port}/http"), "could not connect to the agent", 0),
        ("websocket", format!("ws://127.0.0.1:{port}/ws"), "could not connect to the agent", 0),
        ("http", format!("http://{silent}/http"), "did not answer turn 0 within 500 ms", 1),
        (
            "websocket",
            format!("ws://{silent}/ws"),
            "did not accept the websocket connection for turn 0 within 500 ms",
            1,
        ),
    ];
    let mut tests = Vec::new();
    for (i, (kind, target, _, _)) in cases.iter().enumerate() {
        let body = json!({"project_id": p, "name": format!("case {i}"), "kind": kind, "target": target,
                          "turn_timeout_ms": 500});
        let ch = create(&s, &t.editor, "/v1/channels", body).await;
        tests.push(create(&s, &t.editor, "/v1/tests", test_body(p, &format!("case {i}"), &ch, &scenario, 1)).await);
    }
    let batch =
        create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "unreached", "test_ids": tests})).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    taking.abort();
    assert_eq!((done["counts"]["errored"].as_i64(), done["credits_charged"].as_i64()), (Some(4), Some(2)), "{done:#}");
    for (test, (kind, target, words, credits)) in tests.iter().zip(&cases) {
        let r = &results_of(&s, &t.viewer, test).await[0];
        assert_eq!((r["status"].as_str(), r["ended_reason"].as_str()), (Some("error"), Some("agent_error")), "{r:#}");
        let reason = r["failure_reason"].as_str().unwrap();
        assert!(reason.contains(words), "{kind} {target}: {reason:?} should say {words:?}");
        assert_eq!(r["credits"], *credits, "{kind} {target}: {r:#}");
    }
}

/// A run's `call_id` names the call it made: a run whose channel refused
/// the connection made none, and has none once it ended, nor has its result
/// (which says why): no agent was ever sent an id to find it by; a run that
/// talked to the agent keeps the id the agent was sent, the one its result
/// has and is found by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_made_no_call_has_no_call_id() {
    let agent = Agent::start(&[]);
    let closed = common::ClosedPort::new();
    let s = TestServer::start().await;
    let t = s.team("call ids").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let refused = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let reached = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let refused = create(&s, &t.editor, "/v1/tests", test_body(p, "refused", &refused, &scenario, 1)).await;
    let reached = create(&s, &t.editor, "/v1/tests", test_body(p, "reached", &reached, &scenario, 1)).await;
    let batch = json!({"project_id": p, "name": "both", "test_ids": [refused, reached]});
    let batch = create(&s, &t.editor, "/v1/batches", batch).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, None, 200).await;
    let id = run["id"].as_str().unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!((done["counts"]["passed"].as_i64(), done["counts"]["errored"].as_i64()), (Some(1), Some(1)), "{done:#}");
    let runs = all_pages(&s, &t.viewer, &format!("/v1/batch-runs/{id}/runs"), "runs").await;
    let of = |test: &str| runs.iter().find(|r| r["test_id"] == test).unwrap().clone();
    let (unreached, talked) = (of(&refused), of(&reached));
    assert_eq!(unreached["status"], "error", "{unreached:#}");
    assert!(unreached["call_id"].is_null(), "no call was made: {unreached:#}");
    let result = unreached["test_result_id"].as_str().unwrap();
    let result = s.expect(Method::GET, &format!("/v1/test-results/{result}"), &t.viewer, None, 200).await;
    assert!(result["failure_reason"].as_str().unwrap().contains("Connection refused"), "{result:#}");
    assert!(result["call_id"].is_null(), "no agent was sent a call id: {result:#}");
    let listed = results_of(&s, &t.viewer, &refused).await;
    assert!(listed[0]["call_id"].is_null(), "{listed:#?}");
    assert_eq!(talked["status"], "passed", "{talked:#}");
    let call_id = talked["call_id"].as_str().expect("a call was made");
    let result = talked["test_result_id"].as_str().unwrap();
    let result = s.expect(Method::GET, &format!("/v1/test-results/{result}"), &t.viewer, None, 200).await;
    assert_eq!(result["call_id"].as_str(), Some(call_id), "{result:#}");
    let found = s.expect(Method::GET, &format!("/v1/test-results/by-call/{call_id}"), &t.viewer, None, 200).await;
    assert_eq!(found["id"], result["id"], "{found:#}");
}

/// A channel pointed at the reference agent's address rather than its
/// `/http` path: the agent answers 404 with a pretty-printed JSON body. The
/// failure reason quotes that body on one line, so a one-line view of it
/// (`sparring run`'s table) shows the agent's message, not a lone `{`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_error_body_is_quoted_on_one_line() {
    let agent = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("one line").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.base).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "wrong path", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let result = &results_of(&s, &t.viewer, &test).await[0];
    let reason = result["failure_reason"].as_str().unwrap();
    assert!(reason.contains("HTTP 404: {") && reason.contains("\"message\": \"Not Found\""), "{reason:?}");
    assert!(!reason.contains('\n'), "the reason is one line: {reason:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_overlap_up_to_the_batch_concurrency() {
    let agent = Agent::start(&["--latency-ms", "300"]);
    let s = TestServer::start().await;
    let t = s.team("concurrency").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "many", &ch, &scenario, 12)).await;
    let batch = create(
        &s,
        &t.editor,
        "/v1/batches",
        json!({"project_id": p, "name": "three at once", "test_ids": [test], "concurrency": 3}),
    )
    .await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    assert_eq!(done["counts"]["passed"], 12, "{done:#}");
    let stats = agent.stats().await;
    assert_eq!(stats["calls_started"], 12);
    assert_eq!(stats["peak_active_calls"], 3, "three at once, never more: {stats}");
    assert_eq!(stats["active_calls"], 0, "every call was ended");
}

/// A batch's `concurrency` is the batch's: two batch runs of one batch
/// under way at once (started by two members) make no more calls at once
/// together than the batch allows, not that many each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batch_runs_of_one_batch_share_its_concurrency() {
    let agent = Agent::start(&["--latency-ms", "300"]);
    let s = TestServer::start().await;
    let t = s.team("shared concurrency").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "many", &ch, &scenario, 6)).await;
    let batch = create(
        &s,
        &t.editor,
        "/v1/batches",
        json!({"project_id": p, "name": "two at once", "test_ids": [test], "concurrency": 2}),
    )
    .await;
    let path = format!("/v1/batches/{batch}/run");
    let first = s.expect(Method::POST, &path, &t.editor, Some(json!({})), 200).await;
    let second = s.expect(Method::POST, &path, &t.owner, Some(json!({})), 200).await;
    for run in [&first, &second] {
        let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        assert_eq!(done["counts"]["passed"], 6, "{done:#}");
    }
    let stats = agent.stats().await;
    assert_eq!(stats["calls_started"], 12);
    assert_eq!(stats["peak_active_calls"], 2, "two at once across both batch runs, never more: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_share_the_workers_fairly() {
    let agent = Agent::start(&["--latency-ms", "200"]);
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.workers = 2).await;
    let a = s.team("first user").await;
    let b = s.team("second user").await;
    let mut batches = Vec::new();
    for (team, n) in [(&a, 6), (&b, 2)] {
        let p = &team.project_id;
        let Setup { persona } = persona(&s, &team.editor, p).await;
        let scenario = create(&s, &team.editor, "/v1/scenarios", short_call(p, &persona)).await;
        let ch = channel(&s, &team.editor, p, "http", &agent.http_target()).await;
        let test = create(&s, &team.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, n)).await;
        batches.push(
            create(&s, &team.editor, "/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [test]})).await,
        );
    }
    let run_a =
        s.expect(Method::POST, &format!("/v1/batches/{}/run", batches[0]), &a.editor, Some(json!({})), 200).await;
    let run_b =
        s.expect(Method::POST, &format!("/v1/batches/{}/run", batches[1]), &b.editor, Some(json!({})), 200).await;
    let (ida, idb) = (run_a["id"].as_str().unwrap(), run_b["id"].as_str().unwrap());
    wait_for_end(&s, &a.viewer, ida).await;
    wait_for_end(&s, &b.viewer, idb).await;
    let starts = |runs: &[Value]| -> Vec<String> {
        let mut v: Vec<String> = runs.iter().map(|r| r["started_at"].as_str().unwrap().to_string()).collect();
        v.sort();
        v
    };
    let a_starts = starts(&all_pages(&s, &a.viewer, &format!("/v1/batch-runs/{ida}/runs"), "runs").await);
    let b_starts = starts(&all_pages(&s, &b.viewer, &format!("/v1/batch-runs/{idb}/runs"), "runs").await);
    let b_last = b_starts.last().unwrap();
    let a_before = a_starts.iter().filter(|s| *s < b_last).count();
    // First come, first served would start all six of the first user's runs
    // before the second user's; fair shares start the second user's as soon
    // as slots free up.
    assert!(
        a_before <= 4,
        "{a_before} of the first user's runs started before the second user's last: {a_starts:?} {b_starts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_queued_runs_at_once_and_running_ones_at_their_next_turn() {
    let agent = Agent::start(&["--latency-ms", "700"]);
    let s = TestServer::start().await;
    let t = s.team("cancel").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "slow", &ch, &scenario, 10)).await;
    let batch = create(
        &s,
        &t.editor,
        "/v1/batches",
        json!({"project_id": p, "name": "b", "test_ids": [test], "concurrency": 2}),
    )
    .await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    // Wait until two are talking: claimed (`running`), and their calls
    // begun at the agent. A run claimed whose call has not begun when the
    // cancel comes ends before its call, charged nothing (see
    // `engine::worker::hold`), and the ledger below expects two calls.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
        let stats = agent.stats().await;
        if now["counts"]["running"] == 2 && stats["active_calls"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "never two running: {now} {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Viewers and reviewers may not cancel; outsiders do not see it.
    for (key, status) in [(&t.viewer, 403), (&t.reviewer, 403), (&t.outsider, 404)] {
        let (got, _) =
            error_body(s.send_json(Method::POST, &format!("/v1/batch-runs/{id}/cancel"), key, None).await).await;
        assert_eq!(got, status);
    }
    let cancelled = s.expect(Method::POST, &format!("/v1/batch-runs/{id}/cancel"), &t.editor, None, 200).await;
    assert_eq!(cancelled["counts"]["queued"], 0, "queued runs stop at once: {cancelled:#}");
    assert_eq!(cancelled["counts"]["cancelled"], 8);
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    assert_eq!(done["passed"], false);
    assert_eq!(done["counts"]["cancelled"], 10, "the two running ones stopped at their next turn: {done:#}");
    // Cancelling again changes nothing.
    let again = s.expect(Method::POST, &format!("/v1/batch-runs/{id}/cancel"), &t.editor, None, 200).await;
    assert_eq!(again["counts"], done["counts"]);
    // Refunds follow: what was charged is what the two conversations used.
    let charged = done["credits_charged"].as_i64().unwrap();
    assert_eq!(charged, 2);
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let kinds: Vec<&str> = ledger.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["refund", "reservation", "grant"]);
    assert_eq!(ledger[0]["amount"], 10 - charged);
    assert_eq!(ledger_balances(&ledger), 1000 - charged);
}

/// A websocket agent that answers each caller line only once the test
/// opens its gate (sends `true`), and counts the calls it is given.
async fn gated_agent() -> (tokio::sync::watch::Sender<bool>, WsAgent, tokio::sync::watch::Receiver<usize>) {
    let (gate, opened) = tokio::sync::watch::channel(false);
    let (seen, calls) = tokio::sync::watch::channel(0);
    let agent = WsAgent::start(move |mut peer| {
        let mut opened = opened.clone();
        seen.send_modify(|n| *n += 1);
        async move {
            while let Some(frame) = ws_recv(&mut peer).await {
                if frame["type"] == "message" {
                    let _ = opened.wait_for(|open| *open).await;
                    ws_send(&mut peer, json!({"type": "message", "role": "assistant", "content": "Sure."})).await;
                    ws_send(&mut peer, json!({"type": "turn_end"})).await;
                }
            }
        }
    })
    .await;
    (gate, agent, calls)
}

/// A channel to a [`gated_agent`] that waits for it as long as a test may.
async fn gated_channel(s: &TestServer, key: &str, project_id: &str, agent: &WsAgent) -> String {
    let ch = json!({"project_id": project_id, "name": "gated", "kind": "websocket", "target": agent.target,
                    "turn_timeout_ms": 120_000});
    create(s, key, "/v1/channels", ch).await
}

/// A second cancel while the running runs are still stopping changes
/// nothing: it answers the batch run as it is and records nothing, as a
/// second revoke of a key does. The one cancel has one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_stopping_batch_run_again_records_nothing() {
    // Until the gate opens the calls are running, and a cancel leaves them
    // stopping.
    let (gate, agent, calls) = gated_agent().await;
    let s = TestServer::start().await;
    let t = s.team("cancel twice").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = gated_channel(&s, &t.editor, p, &agent).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "held", &ch, &scenario, 2)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    // A run is running before it calls the agent: both are once it has
    // both calls.
    let both = async { calls.clone().wait_for(|n| *n >= 2).await.is_ok() };
    assert!(tokio::time::timeout(Duration::from_secs(30), both).await.unwrap_or(false), "never two calls");
    let cancel = format!("/v1/batch-runs/{id}/cancel");
    let cancels = format!("/v1/activity?project_id={p}&action=batch_run.cancel");
    let first = s.expect(Method::POST, &cancel, &t.editor, None, 200).await;
    assert_eq!((first["status"].as_str(), first["counts"]["running"].as_i64()), (Some("running"), Some(2)));
    let recorded = all_pages(&s, &t.viewer, &cancels, "activity").await;
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    // Again, while both are still stopping (the agent has not answered).
    let again = s.expect(Method::POST, &cancel, &t.editor, None, 200).await;
    assert_eq!(again, first, "the batch run as it is");
    assert_eq!(all_pages(&s, &t.viewer, &cancels, "activity").await, recorded, "no second record");
    // Once they stop it is cancelled; a cancel then records nothing either.
    gate.send(true).unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!((done["status"].as_str(), done["counts"]["cancelled"].as_i64()), (Some("cancelled"), Some(2)));
    let last = s.expect(Method::POST, &cancel, &t.editor, None, 200).await;
    assert_eq!(last, done);
    assert_eq!(all_pages(&s, &t.viewer, &cancels, "activity").await, recorded);
}

/// A run claimed as its batch run is cancelled (the claim committed, its
/// worker not yet listening for the cancel) does not hold its call: seen as
/// the cancel leaves the database then, with the flag set and the run
/// still queued, when a worker claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_claimed_as_its_batch_run_is_cancelled_holds_no_call() {
    let (gate, agent, calls) = gated_agent().await;
    let s = TestServer::start().await;
    let t = s.team("claimed as cancelled").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = gated_channel(&s, &t.editor, p, &agent).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "two", &ch, &scenario, 2)).await;
    let batch = json!({"project_id": p, "name": "one at a time", "test_ids": [test], "concurrency": 1});
    let batch = create(&s, &t.editor, "/v1/batches", batch).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, None, 200).await;
    let id = run["id"].as_str().unwrap();
    // (The value is read inside: a `Ref` kept would block the agent's
    // next count.)
    let first = async { calls.clone().wait_for(|n| *n > 0).await.is_ok() };
    let first = tokio::time::timeout(Duration::from_secs(30), first).await;
    assert_eq!(first, Ok(true), "the first run never called");
    // The first run holds its call at the gate, the second waits its turn.
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute("UPDATE batch_runs SET cancel_requested = 1 WHERE id = ?1", [id]).unwrap();
    gate.send(true).unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!(*calls.borrow(), 1, "the second run made no call");
    assert_eq!(done["counts"]["cancelled"], 1, "{done:#}");
    let runs = all_pages(&s, &t.viewer, &format!("/v1/batch-runs/{id}/runs?status=cancelled"), "runs").await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert!(runs[0]["test_result_id"].is_null(), "no result: {runs:#?}");
    assert!(runs[0]["call_id"].is_null(), "no call, no call id: {runs:#?}");
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let charged: i64 = done["credits_charged"].as_i64().unwrap();
    assert_eq!(charged, 1, "the first call only: {done:#} {ledger:#?}");
}

/// A run is paid by the project's payer, whoever starts it: its creator,
/// then the owner who took billing over, from the next run on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_paid_by_the_owner_who_took_billing_over() {
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 5).await;
    let t = s.team("billing").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    // Every conversation ends at once in an agent error, charged 1 credit.
    let failing = Recorder::start(|_, _| (500, "down".to_string())).await;
    let ch = channel(&s, &t.editor, p, "http", &format!("{}/http", failing.base)).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "paid", &ch, &scenario, 1)).await;
    async fn run(s: &TestServer, test: &str, key: &str, viewer: &str) -> String {
        let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), key, Some(json!({})), 200).await;
        let id = started["id"].as_str().unwrap().to_string();
        assert_eq!(wait_for_end(s, viewer, &id).await["credits_charged"], 1);
        id
    }
    let first = run(&s, &test, &t.editor, &t.viewer).await;
    let members = s.expect(Method::GET, &format!("/v1/projects/{p}/members"), &t.owner, None, 200).await;
    let editor_id = members["members"].as_array().unwrap().iter().find(|m| m["role"] == "editor").unwrap()["user_id"]
        .as_str()
        .unwrap()
        .to_string();
    let member = format!("/v1/projects/{p}/members/{editor_id}");
    s.expect(Method::PATCH, &member, &t.owner, Some(json!({"role": "owner"})), 200).await;
    s.expect(Method::POST, &format!("/v1/projects/{p}/billing"), &t.editor, None, 200).await;
    let second = run(&s, &test, &t.owner, &t.viewer).await;
    let paid = |ledger: &[Value]| -> Vec<String> {
        ledger
            .iter()
            .filter_map(|e| e["batch_run_id"].as_str().map(str::to_string))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect()
    };
    let owners = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let editors = all_pages(&s, &t.editor, "/v1/transactions", "transactions").await;
    assert_eq!(paid(&owners), vec![first], "the creator paid the first run only: {owners:#?}");
    assert_eq!(paid(&editors), vec![second], "the new payer paid the second: {editors:#?}");
    assert_eq!((ledger_balances(&owners), ledger_balances(&editors)), (4, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_are_reserved_once_and_never_go_below_zero() {
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 5).await;
    let t = s.team("credits").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    // An agent that answers every turn with an error: every conversation
    // ends at once in error, and was a call (one that never reached an
    // agent costs nothing: `a_server_for_public_targets_does_not_call_into_its_own_network`).
    let failing = Recorder::start(|_, _| (500, "down".to_string())).await;
    let ch = channel(&s, &t.editor, p, "http", &format!("{}/http", failing.base)).await;
    let big = create(&s, &t.editor, "/v1/tests", test_body(p, "big", &ch, &scenario, 6)).await;
    let (status, e) =
        error_body(s.send_json(Method::POST, &format!("/v1/tests/{big}/run"), &t.editor, Some(json!({}))).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (402, "insufficient_credits"));
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("6 credits") && message.contains("the project's owner"), "{e}");
    assert!(!message.contains("you have") && !message.contains(" 5"), "the owner's balance is theirs: {e}");
    // The payer is told their balance; the activity log, which every member
    // reads, tells no one's.
    let (_, e) =
        error_body(s.send_json(Method::POST, &format!("/v1/tests/{big}/run"), &t.owner, Some(json!({}))).await).await;
    assert!(e["message"].as_str().unwrap().contains("you have 5"), "{e}");
    let feed = all_pages(&s, &t.viewer, &format!("/v1/activity?project_id={p}&action=test.run"), "activity").await;
    assert_eq!(feed.len(), 2);
    for record in &feed {
        let summary = record["summary"].as_str().unwrap();
        assert!(summary.contains("6 credits needed") && !summary.contains(" 5"), "every member reads it: {summary}");
    }
    let refused = s.expect(Method::GET, "/v1/batch-runs?status=insufficient_credits", &t.viewer, None, 200).await;
    let refused = &refused["batch_runs"][0];
    assert_eq!(refused["counts"]["total"], 0, "nothing queued");
    assert_eq!(refused["credits_reserved"], 0);
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    assert_eq!(ledger.len(), 1, "only the starting grant");

    // Five requests at once for 2 credits each against a balance of 5:
    // exactly two are accepted.
    let small = create(&s, &t.editor, "/v1/tests", test_body(p, "small", &ch, &scenario, 2)).await;
    let path = format!("/v1/tests/{small}/run");
    let requests = (0..5).map(|_| s.send_json(Method::POST, &path, &t.editor, Some(json!({}))));
    let answers = futures::future::join_all(requests).await;
    let mut accepted = Vec::new();
    let mut refusals = 0;
    for resp in answers {
        match resp.status().as_u16() {
            200 => accepted.push(resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()),
            402 => refusals += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((accepted.len(), refusals), (2, 3));
    for id in &accepted {
        let done = wait_for_end(&s, &t.viewer, id).await;
        assert_eq!(done["counts"]["errored"], 2);
        assert_eq!(done["credits_charged"], 2, "an agent error still cost its started minute");
    }
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    assert_eq!(ledger_balances(&ledger), 1);
    // Another user's ledger entry is not found, not even by the member who
    // started the run it paid for.
    let theirs = ledger[0]["id"].as_str().unwrap();
    for key in [&t.viewer, &t.editor] {
        let (status, _) = error_body(s.get(&format!("/v1/transactions/{theirs}"), key).await).await;
        assert_eq!(status, 404);
    }
    let own = s.expect(Method::GET, &format!("/v1/transactions/{theirs}"), &t.owner, None, 200).await;
    assert_eq!(own, ledger[0]);

    // Of two owners, the one who has been a member longest pays, also when
    // the other starts the run; a refund goes back to whoever paid.
    let second = s.key_for_user("second-owner@example.com").await;
    let add = json!({"email": "second-owner@example.com", "role": "owner"});
    s.expect(Method::POST, &format!("/v1/projects/{p}/members"), &t.owner, Some(add), 200).await;
    let one = create(&s, &t.editor, "/v1/tests", test_body(p, "one", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{one}/run"), &second, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    assert_eq!(ledger_balances(&all_pages(&s, &t.owner, "/v1/transactions", "transactions").await), 0);
    let seconds = all_pages(&s, &second, "/v1/transactions", "transactions").await;
    assert_eq!(seconds.len(), 1, "the second owner paid nothing: {seconds:#?}");
}

/// A payer's ledger says which project each batch run's entries were for.
/// A batch run goes with its project when that is deleted (and is out of
/// reach of a former payer who left it), and then an entry that named only
/// its `brn_…` told its payer nothing of what they had paid for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_entry_names_the_project_its_batch_run_was_in() {
    let s = TestServer::start().await;
    let t = s.team("checkout agent").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    // Nothing there: each run ends at once, costing nothing, so the
    // reservation comes back whole as a refund.
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "unreached", &ch, &scenario, 2)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    assert_eq!(wait_for_end(&s, &t.viewer, id).await["credits_charged"], 0);
    s.expect(Method::DELETE, &format!("/v1/projects/{p}"), &t.owner, None, 200).await;
    let (status, _) = error_body(s.get(&format!("/v1/batch-runs/{id}"), &t.owner).await).await;
    assert_eq!(status, 404, "the batch run went with its project");

    let entries = all_pages(&s, &t.owner, &format!("/v1/transactions?batch_run_id={id}"), "transactions").await;
    let kinds: Vec<&str> = entries.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["refund", "reservation"], "{entries:#?}");
    for entry in &entries {
        let description = entry["description"].as_str().unwrap();
        assert!(description.contains(id), "{description}");
        assert!(
            description.contains("\"checkout agent\"") && description.contains(p.as_str()),
            "the entry names the project it paid for: {description}"
        );
    }
}

/// A start refused for credits is recorded (its batch run, its tests'
/// names and thresholds) but keeps nothing for runs it never queued: it
/// kept a copy of every test's evaluators (up to about a megabyte a test,
/// a thousand tests a batch), so that each refused start, free to repeat,
/// grew the database by as much as the tests themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_credits_keeps_no_copy_of_its_tests() {
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 0).await;
    let t = s.team("refused").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    // 100 evaluators of 2,000 characters: 200 KB of them.
    let evaluators: Vec<Value> =
        (0..100).map(|i| json!({"type": "contains", "name": format!("says {i}"), "text": "y".repeat(2000)})).collect();
    let body = json!({"project_id": p, "name": "big", "channel_id": ch, "scenario_id": scenario,
                      "evaluators": evaluators});
    let test = create(&s, &t.editor, "/v1/tests", body).await;
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    let pages = || db.query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0)).unwrap();
    let page_size: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let before = pages();
    for _ in 0..10 {
        let (status, e) =
            error_body(s.send_json(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({}))).await)
                .await;
        assert_eq!((status, e["error_code"].as_str()), (402, Some("insufficient_credits")), "{e}");
    }
    let grown = (pages() - before) * page_size;
    assert!(grown < 200_000, "ten refused starts grew the database by {grown} bytes");
    // What a refused start shows of its tests is still there.
    let refused = s.expect(Method::GET, "/v1/batch-runs?status=insufficient_credits", &t.viewer, None, 200).await;
    assert_eq!(refused["batch_runs"].as_array().unwrap().len(), 10);
    let id = refused["batch_runs"][0]["id"].as_str().unwrap();
    let tests = s.expect(Method::GET, &format!("/v1/batch-runs/{id}/tests"), &t.viewer, None, 200).await;
    let shown = &tests["tests"][0];
    assert_eq!((shown["name"].as_str(), shown["pass_threshold"].as_f64()), (Some("big"), Some(1.0)), "{tests:#}");
    assert_eq!((shown["counts"]["total"].as_i64(), &shown["passed"]), (Some(0), &Value::Null), "{tests:#}");
}

/// A start is priced from what a test and a scenario keep beside their
/// documents: every create and change of them keeps it, so a start prices
/// the test as it is now (iterations, threshold, the scenario's limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_is_priced_from_the_test_and_scenario_as_they_are() {
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 0).await;
    let t = s.team("priced as changed").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", short_call(p, &persona)).await;
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, 1)).await;
    let needed = |e: &Value| e["message"].as_str().unwrap().split(" credits").next().unwrap().to_string();
    let path = format!("/v1/tests/{test}/run");
    let (status, e) = error_body(s.send_json(Method::POST, &path, &t.editor, None).await).await;
    assert_eq!((status, needed(&e)), (402, "the run needs up to 1".to_string()), "{e}");
    let change = json!({"iterations": 3, "pass_threshold": 0.5});
    s.expect(Method::PATCH, &format!("/v1/tests/{test}"), &t.editor, Some(change), 200).await;
    let mut longer = short_call(p, &persona);
    longer["max_duration_s"] = json!(150);
    longer.as_object_mut().unwrap().remove("project_id");
    s.expect(Method::PUT, &format!("/v1/scenarios/{scenario}"), &t.editor, Some(longer), 200).await;
    // 3 runs of at most 150 s: 3 started minutes each.
    let (status, e) = error_body(s.send_json(Method::POST, &path, &t.editor, None).await).await;
    assert_eq!((status, needed(&e)), (402, "the run needs up to 9".to_string()), "{e}");
    let refused = all_pages(&s, &t.viewer, "/v1/batch-runs?status=insufficient_credits", "batch_runs").await;
    let tests = format!("/v1/batch-runs/{}/tests", refused[0]["id"].as_str().unwrap());
    let shown = s.expect(Method::GET, &tests, &t.viewer, None, 200).await;
    assert_eq!(shown["tests"][0]["pass_threshold"].as_f64(), Some(0.5), "{shown:#}");
}

/// A start refused for credits ran nothing: it is listed as the batch run
/// it is (`insufficient_credits`), but it is no run of its batch. The
/// batch's `last_run` stays the last batch run that was queued, and is
/// null for a batch whose every start was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_credits_is_not_its_batchs_last_run() {
    let agent = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 1).await;
    let t = s.team("last run").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "once", &ch, &scenario, 1)).await;
    let ran = create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "ran", "test_ids": [test]})).await;
    let never =
        create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "never", "test_ids": [test]})).await;
    let first = s.expect(Method::POST, &format!("/v1/batches/{ran}/run"), &t.editor, None, 200).await;
    let first = first["id"].as_str().unwrap();
    wait_for_end(&s, &t.viewer, first).await;
    // The one credit is spent: every start from now on is refused.
    for batch in [&ran, &never] {
        let (status, e) =
            error_body(s.send_json(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, None).await).await;
        assert_eq!((status, e["error_code"].as_str()), (402, Some("insufficient_credits")), "{e}");
    }
    let refused = all_pages(&s, &t.viewer, "/v1/batch-runs?status=insufficient_credits", "batch_runs").await;
    assert_eq!(refused.len(), 2, "{refused:#?}");
    let ran = s.expect(Method::GET, &format!("/v1/batches/{ran}"), &t.viewer, None, 200).await;
    assert_eq!((ran["last_run"]["id"].as_str(), ran["last_run"]["status"].as_str()), (Some(first), Some("completed")));
    let never = s.expect(Method::GET, &format!("/v1/batches/{never}"), &t.viewer, None, 200).await;
    assert_eq!(never["last_run"], Value::Null, "{never:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_caller_and_an_llm_judge_talk_to_a_chat_completions_endpoint() {
    let agent = Agent::start(&[]);
    // The LLM: under /caller it plays the caller (two lines, then done);
    // under /judge it judges (passes unless told to talk nonsense).
    let llm = chat_llm(r#"{"passed": true, "reason": "the booking was confirmed"}"#).await;
    let s = TestServer::start().await;
    let t = s.team("simulated").await;
    let p = &t.project_id;
    let integration = |name: &str, path: &str| {
        json!({"project_id": p, "provider": "openai_compatible", "name": name,
               "config": {"base_url": format!("{}/{path}", llm.base), "model": "test-model"},
               "credentials": {"api_key": format!("sk-{path}-secret")}})
    };
    let caller = create(&s, &t.editor, "/v1/integrations", integration("caller", "caller")).await;
    let judge = create(&s, &t.editor, "/v1/integrations", integration("judge", "judge")).await;
    let nonsense = create(&s, &t.editor, "/v1/integrations", integration("nonsense", "nonsense")).await;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let scenario = |judge: &str| {
        json!({"project_id": p, "name": "simulated booking", "mode": "simulated", "default_persona_id": persona,
               "goal": "Book an appointment for Tuesday afternoon", "integration_id": caller,
               "success_criteria": [{"type": "llm_judge", "name": "booked", "integration_id": judge,
                                     "prompt": "Did the agent confirm a booking?"}]})
    };
    let judged = create(&s, &t.editor, "/v1/scenarios", scenario(&judge)).await;
    let garbled = create(&s, &t.editor, "/v1/scenarios", scenario(&nonsense)).await;
    let good = create(&s, &t.editor, "/v1/tests", test_body(p, "judged", &ch, &judged, 1)).await;
    let bad = create(&s, &t.editor, "/v1/tests", test_body(p, "garbled", &ch, &garbled, 1)).await;
    for (test, status) in [(&good, "passed"), (&bad, "error")] {
        let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
        wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        let r = &results_of(&s, &t.viewer, test).await[0];
        assert_eq!(r["status"], status, "{r:#}");
        let transcript = r["transcript"].as_array().unwrap();
        let caller_lines: Vec<&str> =
            transcript.iter().filter(|t| t["role"] == "caller").map(|t| t["text"].as_str().unwrap()).collect();
        assert_eq!(caller_lines[0], "I'd like to book an appointment on Tuesday at 3 pm.");
        assert_eq!(r["ended_reason"], "caller_done");
        let verdict = &r["evaluations"][0];
        assert_eq!(verdict["source"], "llm");
        if status == "passed" {
            assert_eq!(verdict["passed"], true);
            assert_eq!(verdict["reason"], "the booking was confirmed");
        } else {
            assert_eq!(verdict["passed"], false, "an unparseable verdict is never a pass");
            assert!(r["failure_reason"].as_str().unwrap().contains("judge error"), "{r:#}");
        }
    }
    // The caller model was prompted with the goal; the judge saw the
    // transcript; each got its own key.
    let received = llm.received();
    let to_caller: Vec<_> = received.iter().filter(|r| r.path == "/caller/chat/completions").collect();
    assert!(to_caller[0].body.contains("Tuesday afternoon"), "{}", to_caller[0].body);
    assert_eq!(to_caller[0].header("authorization"), Some("Bearer sk-caller-secret"));
    let to_judge: Vec<_> = received.iter().filter(|r| r.path == "/judge/chat/completions").collect();
    assert_eq!(to_judge.len(), 1);
    assert!(to_judge[0].body.contains("Did the agent confirm a booking?"));
    assert!(to_judge[0].body.contains("I'd like to book an appointment on Tuesday at 3 pm."));
    assert_eq!(to_judge[0].header("authorization"), Some("Bearer sk-judge-secret"));
    // Keys never come out.
    assert!(!s.log.contents().contains("-secret"), "a key in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_and_retried_until_delivered() {
    use hmac::{Hmac, Mac};
    // Fails twice, then accepts.
    let receiver = Recorder::start(|_, i| if i < 2 { (500, "{}".into()) } else { (200, "{}".into()) }).await;
    let s = TestServer::start().await;
    let t = s.team("webhooks").await;
    let p = &t.project_id;
    s.expect(
        Method::PUT,
        &format!("/v1/projects/{p}"),
        &t.owner,
        Some(json!({"name": "webhooks", "webhook_url": format!("{}/hook", receiver.base), "webhook_secret": "whsec_abc"})),
        200,
    )
    .await;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    // Wait for the third attempt (retries after 1 s and 5 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivery = loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), &t.editor, None, 200).await;
        let d = list["webhook_deliveries"][0].clone();
        if d["status"] == "delivered" {
            break d;
        }
        assert!(Instant::now() < deadline, "not delivered: {list:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(delivery["attempts"], 3);
    assert_eq!(delivery["last_response_status"], 200);
    assert_eq!(delivery["batch_run_id"], json!(id));
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    for r in &received {
        assert_eq!(r.path, "/hook");
        // What a receiver does, as the spec (list_webhook_deliveries) and
        // the README say: `t=<unix seconds>,v1=<hex>`, the hex the
        // HMAC-SHA256 of `t`, "." and the body as received, keyed with the
        // secret's UTF-8 bytes; compared in constant time; `t` near now.
        let signature = r.header("x-sparring-signature").unwrap();
        let fields: BTreeMap<&str, &str> = signature.split(',').map(|f| f.split_once('=').unwrap()).collect();
        let (t, v1) = (fields["t"], fields["v1"]);
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice("whsec_abc".as_bytes()).unwrap();
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(r.body.as_bytes());
        let v1: Vec<u8> = (0..v1.len()).step_by(2).map(|i| u8::from_str_radix(&v1[i..i + 2], 16).unwrap()).collect();
        assert!(mac.verify_slice(&v1).is_ok(), "the receiver can verify the signature: {signature}");
        let age = chrono::Utc::now().timestamp() - t.parse::<i64>().unwrap();
        assert!((0..300).contains(&age), "each attempt is signed when it is made: {age} s old");
        // The same delivery id on every attempt (to drop a repeat), the
        // event named in a header too.
        assert_eq!(r.header("x-sparring-delivery"), delivery["id"].as_str());
        assert_eq!(r.header("x-sparring-event"), Some("batch_run.completed"));
        // Who sends it, and which version, as the spec says.
        let agent = format!("sparring-webhooks/{}", env!("CARGO_PKG_VERSION"));
        assert_eq!(r.header("user-agent"), Some(agent.as_str()));
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["event"], "batch_run.completed");
        assert_eq!(body["batch_run"]["id"], json!(id));
        assert_eq!(body["batch_run"]["counts"], done["counts"]);
    }
    // Owners and editors read deliveries; reviewers and viewers may not.
    for (key, status) in [(&t.viewer, 403), (&t.reviewer, 403), (&t.outsider, 404)] {
        let (got, _) = error_body(s.get(&format!("/v1/projects/{p}/webhook-deliveries"), key).await).await;
        assert_eq!(got, status);
    }
    assert!(!s.log.contents().contains("whsec_abc"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_run_and_read_runs() {
    // An agent that answers: a result names its call (and is found by it)
    // only when the agent was reached.
    let agent = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("run roles").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, 1)).await;
    let batch = create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [test]})).await;
    let mut started = Vec::new();
    for path in [format!("/v1/batches/{batch}/run"), format!("/v1/channels/{ch}/run"), format!("/v1/tests/{test}/run")]
    {
        for (role, key) in t.all() {
            let want = match role {
                "owner" | "editor" => 200,
                "outsider" => 404,
                _ => 403,
            };
            let resp = s.send_json(Method::POST, &path, key, Some(json!({}))).await;
            assert_eq!(resp.status().as_u16(), want, "{role} POST {path}");
            if want == 200 {
                started.push(resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
            }
        }
    }
    let id = &started[0];
    wait_for_end(&s, &t.viewer, id).await;
    let result = &results_of(&s, &t.viewer, &test).await[0];
    let reads = [
        format!("/v1/batch-runs/{id}"),
        format!("/v1/batch-runs/{id}/runs"),
        format!("/v1/tests/{test}/results"),
        format!("/v1/test-results/{}", result["id"].as_str().unwrap()),
        format!("/v1/test-results/by-call/{}", result["call_id"].as_str().unwrap()),
    ];
    for path in &reads {
        for (role, key) in t.all() {
            let want = if role == "outsider" { 404 } else { 200 };
            assert_eq!(s.get(path, key).await.status().as_u16(), want, "{role} GET {path}");
        }
    }
    // A member removed reads none of it from the next request on, though
    // the server knew their role from the reads just made.
    let members = s.expect(Method::GET, &format!("/v1/projects/{p}/members"), &t.owner, None, 200).await;
    let viewer = members["members"].as_array().unwrap().iter().find(|m| m["role"] == "viewer").unwrap();
    let viewer_id = viewer["user_id"].as_str().unwrap();
    s.expect(Method::DELETE, &format!("/v1/projects/{p}/members/{viewer_id}"), &t.owner, None, 200).await;
    for path in &reads {
        assert_eq!(s.get(path, &t.viewer).await.status().as_u16(), 404, "removed viewer GET {path}");
    }
    // Lists never show another project's runs.
    let theirs = s.expect(Method::GET, "/v1/batch-runs", &t.outsider, None, 200).await;
    assert_eq!(theirs["batch_runs"], json!([]));
    // A channel run of named tests refuses a test of another channel.
    let other = channel(&s, &t.editor, p, "http", "http://127.0.0.1:9/http").await;
    let (status, e) = error_body(
        s.send_json(Method::POST, &format!("/v1/channels/{other}/run"), &t.editor, Some(json!({"test_ids": [test]})))
            .await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_test_ids"));
    let (status, e) =
        error_body(s.send_json(Method::POST, &format!("/v1/channels/{other}/run"), &t.editor, Some(json!({}))).await)
            .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "nothing_to_run"));
    // Queue statistics: the caller's share is the caller's.
    let stats = s.expect(Method::GET, "/v1/queue/stats", &t.outsider, None, 200).await;
    assert_eq!(stats["mine"], json!({"queued": 0, "running": 0}));
    assert!(stats["workers"].as_i64().unwrap() > 0);
    let seen: HashSet<&str> = started.iter().map(String::as_str).collect();
    assert_eq!(seen.len(), 6);
}

/// A channel run names each test once, as a batch does: a repeat would run,
/// and be paid for, twice. An empty list names none (a CI filter that
/// matched nothing): refused, where absent or null runs every test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_run_refuses_a_test_named_twice_or_none() {
    let agent = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("twice").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let a = create(&s, &t.editor, "/v1/tests", test_body(p, "a", &ch, &scenario, 1)).await;
    let b = create(&s, &t.editor, "/v1/tests", test_body(p, "b", &ch, &scenario, 1)).await;
    let path = format!("/v1/channels/{ch}/run");
    for twice in [json!([a, a, b]), json!([a, b, a])] {
        let resp = s.send_json(Method::POST, &path, &t.editor, Some(json!({"test_ids": twice}))).await;
        let (status, e) = error_body(resp).await;
        assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_test_ids")), "{twice}: {e}");
        assert!(e["message"].as_str().unwrap().contains("listed twice"), "{e}");
    }
    // At most as many as a batch holds; the count is checked before any id.
    let too_many: Vec<String> = (0..1001).map(|i| format!("tst_{i:026}")).collect();
    let resp = s.send_json(Method::POST, &path, &t.editor, Some(json!({"test_ids": too_many}))).await;
    let (status, e) = error_body(resp).await;
    assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_test_ids")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("at most 1000 tests, got 1001"), "{e}");
    let resp = s.send_json(Method::POST, &path, &t.editor, Some(json!({"test_ids": []}))).await;
    let (status, e) = error_body(resp).await;
    assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_test_ids")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("an empty list selects no test"), "{e}");
    let none = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={p}"), &t.editor, None, 200).await;
    assert_eq!(none["batch_runs"], json!([]), "nothing was queued");
    let all = s.expect(Method::POST, &path, &t.editor, Some(json!({"test_ids": null})), 200).await;
    assert_eq!((&all["counts"]["total"], &all["credits_reserved"]), (&json!(2), &json!(2)));
    wait_for_end(&s, &t.viewer, all["id"].as_str().unwrap()).await;
    let once = s.expect(Method::POST, &path, &t.editor, Some(json!({"test_ids": [b]})), 200).await;
    assert_eq!((&once["counts"]["total"], &once["credits_reserved"]), (&json!(1), &json!(1)));
    wait_for_end(&s, &t.viewer, once["id"].as_str().unwrap()).await;
}

/// A run's conversation lasts no longer than was priced when its credits
/// were reserved: a limit raised while it waits in the queue would make it
/// cost more than the reservation covers (one lowered still applies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_keeps_the_limit_it_was_priced_at() {
    let quick = Agent::start(&["--latency-ms", "1500"]);
    let slow = Agent::start(&["--latency-ms", "20000"]);
    let s = TestServer::start().await;
    let t = s.team("priced").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let limited = |name: &str, target: String| {
        json!({"project_id": p, "name": name, "kind": "http", "target": target, "turn_timeout_ms": 60000,
               "max_call_duration_s": 2})
    };
    let first = create(&s, &t.editor, "/v1/channels", limited("first", quick.http_target())).await;
    let second = create(&s, &t.editor, "/v1/channels", limited("second", slow.http_target())).await;
    let t1 = create(&s, &t.editor, "/v1/tests", test_body(p, "first", &first, &scenario, 1)).await;
    let t2 = create(&s, &t.editor, "/v1/tests", test_body(p, "second", &second, &scenario, 1)).await;
    let batch = json!({"project_id": p, "name": "one at a time", "test_ids": [t1, t2], "concurrency": 1});
    let batch = create(&s, &t.editor, "/v1/batches", batch).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    // While the first conversation talks, the second waits: its channel's
    // limit goes from 2 s to 10 minutes.
    let raise = json!({"max_call_duration_s": 600});
    s.expect(Method::PATCH, &format!("/v1/channels/{second}"), &t.editor, Some(raise), 200).await;
    let now = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
    assert_eq!(now["counts"]["queued"], 1, "the second run was still queued: {now:#}");
    let done = wait_for_end(&s, &t.viewer, id).await;
    let result = &results_of(&s, &t.viewer, &t2).await[0];
    // The agent takes 20 s to answer: the call ends at its priced 2 s.
    assert_eq!(result["ended_reason"], "max_duration", "{result:#}");
    assert!(result["duration_ms"].as_i64().unwrap() < 10_000, "{result:#}");
    assert!(done["credits_charged"].as_i64() <= done["credits_reserved"].as_i64(), "{done:#}");
}

/// Write-only secrets echoed back in an error (a gateway in front of the
/// agent repeating the request's headers, an LLM endpoint repeating its
/// key) never reach a result, which every member of the project reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_echoed_in_an_error_never_reach_a_result() {
    let gateway = Recorder::start(|req, _| {
        let key = req.header("x-agent-key").unwrap_or_default().to_string();
        (403, json!({"error": format!("key {key} is not allowed")}).to_string())
    })
    .await;
    let llm = Recorder::start(|req, _| {
        let auth = req.header("authorization").unwrap_or_default().to_string();
        (401, json!({"error": {"message": format!("invalid credentials: {auth}")}}).to_string())
    })
    .await;
    let agent = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("echoes").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let (header_value, api_key) = ("agent-key-very-secret-0815", "sk-live-very-secret-4711");

    let behind_gateway = json!({"project_id": p, "name": "gw", "kind": "http", "target": format!("{}/http", gateway.base),
                                "headers": {"x-agent-key": header_value}});
    let gw = create(&s, &t.editor, "/v1/channels", behind_gateway).await;
    let scripted = create(&s, &t.editor, "/v1/scenarios", short_call(p, &persona)).await;
    let through_gateway = create(&s, &t.editor, "/v1/tests", test_body(p, "gateway", &gw, &scripted, 1)).await;

    let caller = json!({"project_id": p, "provider": "openai_compatible", "name": "caller",
                        "config": {"base_url": llm.base, "model": "m"}, "credentials": {"api_key": api_key}});
    let caller = create(&s, &t.editor, "/v1/integrations", caller).await;
    let simulated = json!({"project_id": p, "name": "sim", "mode": "simulated", "default_persona_id": persona,
                           "goal": "Book an appointment", "integration_id": caller});
    let simulated = create(&s, &t.editor, "/v1/scenarios", simulated).await;
    let direct = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let with_llm = create(&s, &t.editor, "/v1/tests", test_body(p, "llm", &direct, &simulated, 1)).await;

    for (test, secret, echoed_by) in [(&through_gateway, header_value, &gateway), (&with_llm, api_key, &llm)] {
        let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
        wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        assert!(!echoed_by.received().is_empty(), "the secret was sent, and echoed");
        let result = &results_of(&s, &t.viewer, test).await[0];
        let reason = result["failure_reason"].as_str().unwrap();
        assert!(reason.contains("[redacted]") && !result.to_string().contains(secret), "{result:#}");
    }
}

/// The failure reason stored for one run of a scripted test on an http
/// channel sending `header_value` as `authorization` to an agent that
/// answers every request with `respond(header_value)`, as a viewer reads it.
async fn reason_echoing(header_value: &'static str, respond: fn(&str) -> (u16, String)) -> String {
    let agent = Recorder::start(move |req, _| respond(req.header("authorization").unwrap_or_default())).await;
    let s = TestServer::start().await;
    let t = s.team("echoes").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let channel = json!({"project_id": p, "name": "echo", "kind": "http", "target": format!("{}/http", agent.base),
                         "headers": {"authorization": header_value}});
    let channel = create(&s, &t.editor, "/v1/channels", channel).await;
    let scripted = create(&s, &t.editor, "/v1/scenarios", short_call(p, &persona)).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "echo", &channel, &scripted, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let received = agent.received();
    assert_eq!(received[0].header("authorization"), Some(header_value), "the secret was sent, and echoed");
    let result = &results_of(&s, &t.viewer, &test).await[0];
    result["failure_reason"].as_str().unwrap_or_else(|| panic!("no failure reason: {result:#}")).to_string()
}

/// No run of 8 characters of `secret` is in `reason`.
fn assert_hidden(reason: &str, secret: &str) {
    let chars: Vec<char> = secret.chars().collect();
    for run in chars.windows(8).map(String::from_iter) {
        assert!(!reason.contains(&run), "`{run}` of the secret is in the reason: {reason}");
    }
}

/// An agent that echoes a channel's header value in its normal replies, in
/// what it says and in a tool call's name and arguments, does not put it in
/// the result every member reads: the transcript, the tool calls and what
/// the evaluators quote from them hold `[redacted]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_in_an_agent_s_replies_is_kept_out_of_the_result() {
    const SECRET: &str = "Bearer sk-live-9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";
    let agent = Recorder::start(|req, _| {
        let echoed = req.header("authorization").unwrap_or_default().to_string();
        let reply = json!({
            "messages": [{"role": "assistant", "content": format!("Booked. (debug: {echoed})")}],
            "tool_calls": [{"name": format!("lookup {echoed}"),
                            "arguments": {"auth": echoed.clone(), "nested": [{"k": echoed.clone()}], echoed: 1}}],
        });
        (200, reply.to_string())
    })
    .await;
    let s = TestServer::start().await;
    let t = s.team("echoes").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let channel = json!({"project_id": p, "name": "echo", "kind": "http", "target": format!("{}/http", agent.base),
                         "headers": {"authorization": SECRET}});
    let channel = create(&s, &t.editor, "/v1/channels", channel).await;
    let scripted = create(&s, &t.editor, "/v1/scenarios", short_call(p, &persona)).await;
    let mut body = test_body(p, "echo", &channel, &scripted, 1);
    // A rule that fails, quoting the agent's words in its reason.
    body["evaluators"] = json!([{"type": "not_contains", "name": "no debug output", "text": "debug"}]);
    let test = create(&s, &t.editor, "/v1/tests", body).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    assert_eq!(agent.received()[0].header("authorization"), Some(SECRET), "the secret was sent, and echoed");
    let result = &results_of(&s, &t.viewer, &test).await[0];
    let said = result["transcript"].as_array().unwrap().iter().find(|turn| turn["role"] == "agent");
    let said = said.unwrap_or_else(|| panic!("no agent turn: {result:#}"))["text"].as_str().unwrap();
    assert_eq!(said, "Booked. (debug: [redacted])");
    let call = &result["tool_calls"][0];
    assert_eq!(call["name"], "lookup [redacted]", "{call:#}");
    assert_eq!(call["arguments"], json!({"auth": "[redacted]", "nested": [{"k": "[redacted]"}], "[redacted]": 1}));
    let rule = result["evaluations"].as_array().unwrap().iter().find(|e| e["name"] == "no debug output").unwrap();
    assert_eq!(rule["passed"], false, "{rule:#}");
    assert_hidden(&result.to_string(), SECRET);
}

/// An echoed secret is redacted before the error body is clipped for the
/// reason: a clip falling inside the secret leaves none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_across_the_clip_of_an_error_body_is_hidden() {
    const SECRET: &str = "Bearer sk-live-5f0c2a9e41d7b3c86e0f9a1d2b4c6e8f";
    // The body's 300th character, where it is clipped, is 35 characters
    // into the echoed value.
    let reason = reason_echoing(SECRET, |echoed| {
        (500, format!("{} upstream refused; authorization: {echoed} (request logged)", "x".repeat(231)))
    })
    .await;
    assert!(reason.contains("HTTP 500") && reason.contains("[redacted]"), "{reason}");
    assert_hidden(&reason, SECRET);
}

/// A secret holding `"` and `\` echoed in a JSON error body, where it is
/// escaped, is hidden all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_escaped_in_a_json_error_body_is_hidden() {
    const SECRET: &str = r#"tok"quoted\backslashed-secret-0815"#;
    let reason = reason_echoing(SECRET, |echoed| {
        (400, json!({"error": {"message": format!("the header authorization: {echoed} is not accepted")}}).to_string())
    })
    .await;
    assert!(reason.contains("HTTP 400") && reason.contains("[redacted]"), "{reason}");
    assert_hidden(&reason, SECRET);
}

/// A websocket agent (or a gateway in front of it) that echoes a header
/// value as a frame's `type` gets an error naming the unknown type: the
/// value is redacted before that name is clipped, so none of it is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_as_a_websocket_frame_type_is_hidden() {
    const SECRET: &str = "Bearer sk-live-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
    let agent = WsAgent::start(|mut peer| async move {
        while let Some(frame) = ws_recv(&mut peer).await {
            if frame["type"] == "message" {
                ws_send(&mut peer, json!({"type": SECRET})).await;
            }
        }
    })
    .await;
    let s = TestServer::start().await;
    let t = s.team("echoes").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = json!({"project_id": p, "name": "echo", "kind": "websocket", "target": agent.target,
                    "headers": {"authorization": SECRET}});
    let ch = create(&s, &t.editor, "/v1/channels", ch).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "echo", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let result = &results_of(&s, &t.viewer, &test).await[0];
    let reason = result["failure_reason"].as_str().unwrap_or_else(|| panic!("no failure reason: {result:#}"));
    assert!(reason.contains("unknown type") && reason.contains("[redacted]"), "{reason}");
    assert_hidden(reason, SECRET);
}

/// A channel's header values go only where they were set: the engine
/// follows an agent's redirect within its origin, not to another one (the
/// 3xx answer is then the turn's error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_values_do_not_follow_a_redirect_to_another_origin() {
    let elsewhere = Recorder::start(|_, _| (200, "{}".to_string())).await;
    let away = format!("{}/collect", elsewhere.base);
    let gateway = Recorder::start(move |req, _| match req.path.as_str() {
        "/moved" => (307, "/final".to_string()),
        "/final" => (403, json!({"error": "not today"}).to_string()),
        _ => (307, away.clone()),
    })
    .await;
    let s = TestServer::start().await;
    let t = s.team("redirects").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    for (path, status) in [("/moved", 403), ("/away", 307)] {
        let target = format!("{}{path}", gateway.base);
        let body = json!({"project_id": p, "name": path, "kind": "http", "target": target,
                          "headers": {"x-agent-key": "agent-key-very-secret-0815"}});
        let ch = create(&s, &t.editor, "/v1/channels", body).await;
        let test = create(&s, &t.editor, "/v1/tests", test_body(p, path, &ch, &scenario, 1)).await;
        let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
        wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        let result = &results_of(&s, &t.viewer, &test).await[0];
        let reason = result["failure_reason"].as_str().unwrap();
        assert!(reason.contains(&format!("HTTP {status}")), "{path}: {reason}");
    }
    let finals: Vec<_> = gateway.received().into_iter().filter(|r| r.path == "/final").collect();
    assert_eq!(finals.len(), 1, "a redirect within the origin is followed");
    assert_eq!(finals[0].header("x-agent-key"), Some("agent-key-very-secret-0815"));
    assert!(elsewhere.received().is_empty(), "nothing went to another origin: {:?}", elsewhere.received());
}

/// A project with a webhook at `url` and a test of it whose agent, at
/// `closed`, cannot be reached, so its runs end at once: (team, test id).
async fn hooked_project(s: &TestServer, closed: &common::ClosedPort, name: &str, url: &str) -> (common::Team, String) {
    let t = s.team(name).await;
    let p = &t.project_id;
    let hook = json!({"name": name, "webhook_url": url, "webhook_secret": "whsec_abc"});
    s.expect(Method::PUT, &format!("/v1/projects/{p}"), &t.owner, Some(hook), 200).await;
    let scenario = short_scenario(s, &t.editor, p).await;
    let ch = channel(s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(s, &t.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, 1)).await;
    (t, test)
}

/// Runs `test` to its end; the batch run's id.
async fn run_to_end(s: &TestServer, t: &common::Team, test: &str) -> String {
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap().to_string();
    wait_for_end(s, &t.viewer, &id).await;
    id
}

/// Whether the delivery's last attempt ended (its outcome recorded), rather
/// than being counted and under way.
fn ended(d: &Value) -> bool {
    d["last_error"] != json!(UNDER_WAY)
}

/// The project's (only) webhook delivery once `settled` says so.
async fn delivery_when(s: &TestServer, t: &common::Team, what: &str, settled: impl Fn(&Value) -> bool) -> Value {
    let p = &t.project_id;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), &t.editor, None, 200).await;
        let d = list["webhook_deliveries"][0].clone();
        if !d.is_null() && settled(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "{what}: {list:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Attempts run side by side: while one project's receiver takes the
/// request and never answers, another project's delivery is sent and
/// recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_holds_up_no_other_project() {
    // Accepts connections, reads nothing, answers nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}/hook", silent.local_addr().unwrap());
    let (reached, mut reached_rx) = tokio::sync::mpsc::unbounded_channel();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
            let _ = reached.send(());
        }
    });
    let answering = Recorder::start(|_, _| (200, "{}".into())).await;
    let s = TestServer::start().await;
    let closed = common::ClosedPort::new();
    let (a, a_test) = hooked_project(&s, &closed, "silent receiver", &silent_url).await;
    let (b, b_test) = hooked_project(&s, &closed, "answering receiver", &format!("{}/hook", answering.base)).await;

    run_to_end(&s, &a, &a_test).await;
    tokio::time::timeout(Duration::from_secs(30), reached_rx.recv()).await.expect("A's webhook was never sent");
    // A's attempt now waits (up to its 10 s timeout) for an answer.
    let b_run = run_to_end(&s, &b, &b_test).await;
    let b_delivery = delivery_when(&s, &b, "B's webhook not delivered", |d| d["status"] != "pending").await;
    assert_eq!(b_delivery["status"], "delivered", "{b_delivery:#}");
    assert_eq!(b_delivery["batch_run_id"], json!(b_run));
    // B's delivery did not wait for A's attempt, which is still under way:
    // counted since its request was sent, with no outcome yet.
    let a_delivery = delivery_when(&s, &a, "A's delivery", |_| true).await;
    assert_eq!((&a_delivery["status"], &a_delivery["attempts"]), (&json!("pending"), &json!(1)), "{a_delivery:#}");
    assert_eq!(a_delivery["last_error"], json!(UNDER_WAY), "{a_delivery:#}");
    assert_eq!(answering.received().len(), 1);
    holder.abort();
}

/// Every attempt goes to the project's webhook as it is then: after the URL
/// is changed, the retries go to the new URL (which the record shows);
/// after it is removed, the delivery ends `failed` without another attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_follow_the_project_s_webhook_url() {
    let old_moved = Recorder::start(|_, _| (500, "{}".into())).await;
    let old_removed = Recorder::start(|_, _| (500, "{}".into())).await;
    let new = Recorder::start(|_, _| (200, "{}".into())).await;
    let s = TestServer::start().await;
    let closed = common::ClosedPort::new();
    let (moved, moved_test) = hooked_project(&s, &closed, "moved", &format!("{}/hook", old_moved.base)).await;
    let (removed, removed_test) = hooked_project(&s, &closed, "removed", &format!("{}/hook", old_removed.base)).await;
    let moved_run = run_to_end(&s, &moved, &moved_test).await;
    run_to_end(&s, &removed, &removed_test).await;
    // After the second failed attempt, the next one is 5 s away: time to
    // change the webhooks in between.
    let twice = |d: &Value| d["attempts"].as_i64().unwrap_or(0) >= 2 && ended(d);
    delivery_when(&s, &moved, "moved: two attempts", twice).await;
    delivery_when(&s, &removed, "removed: two attempts", twice).await;
    let new_url = format!("{}/elsewhere", new.base);
    let (m, r) = (&moved.project_id, &removed.project_id);
    // Another origin: its secret given again, as a move requires.
    let body = json!({"name": "moved", "webhook_url": new_url, "webhook_secret": "whsec_abc"});
    s.expect(Method::PUT, &format!("/v1/projects/{m}"), &moved.owner, Some(body), 200).await;
    let body = json!({"name": "removed", "webhook_url": null});
    s.expect(Method::PUT, &format!("/v1/projects/{r}"), &removed.owner, Some(body), 200).await;
    let (sent_moved, sent_removed) = (old_moved.received().len(), old_removed.received().len());
    // Ended by the write that removed the URL, not left due until its next
    // attempt (seconds away).
    let d = delivery_when(&s, &removed, "removed", |_| true).await;
    assert_eq!((&d["status"], &d["attempts"]), (&json!("failed"), &json!(2)), "{d:#}");

    let settled = |d: &Value| d["status"] != "pending";
    let d = delivery_when(&s, &moved, "moved: still pending", settled).await;
    assert_eq!((&d["status"], &d["attempts"], &d["url"]), (&json!("delivered"), &json!(3), &json!(new_url)), "{d:#}");
    let received = new.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/elsewhere");
    assert!(received[0].header("x-sparring-signature").is_some());
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(body["batch_run"]["id"], json!(moved_run));

    let d = delivery_when(&s, &removed, "removed", |_| true).await;
    assert_eq!(d["status"], "failed", "{d:#}");
    assert_eq!(d["attempts"], 2, "no attempt once the URL was removed: {d:#}");
    assert_eq!(d["last_error"], json!(sparring_impl::engine::webhooks::REMOVED));
    assert_eq!(d["last_response_status"], 500, "what the last attempt got stays: {d:#}");
    assert_eq!(d["next_attempt_at"], Value::Null);

    assert_eq!(old_moved.received().len(), sent_moved, "sent to the old URL after it changed");
    assert_eq!(old_removed.received().len(), sent_removed, "sent after the URL was removed");
}

/// A receiver that answers a redirect has not taken the event: the redirect
/// is not followed (a `301`, `302` or `303` would turn the `POST` into a
/// bodiless `GET`, whose `200` said nothing of the event; a `307` or `308`
/// would send it to another URL than the one set), and the attempt fails,
/// saying where the receiver pointed, to be retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receiver_s_redirect_is_a_failed_attempt() {
    let receiver = Recorder::start(|req, _| match req.path.as_str() {
        "/landing" => (200, "{}".into()),
        path => (path.trim_start_matches("/hook").parse().unwrap(), "/landing".into()),
    })
    .await;
    let s = TestServer::start().await;
    let closed = common::ClosedPort::new();
    for status in [301, 302, 303, 307, 308] {
        let url = format!("{}/hook{status}", receiver.base);
        let (t, test) = hooked_project(&s, &closed, &format!("redirects {status}"), &url).await;
        run_to_end(&s, &t, &test).await;
        let d = delivery_when(&s, &t, "never attempted", |d| d["attempts"] != 0 && ended(d)).await;
        assert_eq!((&d["status"], &d["last_response_status"]), (&json!("pending"), &json!(status)), "{d:#}");
        let error = d["last_error"].as_str().unwrap_or_default();
        assert!(error.contains(&format!("HTTP {status}")) && error.contains("/landing"), "{status}: {d:#}");
        assert_eq!(d["url"], json!(url));
    }
    let landed: Vec<_> = receiver.received().into_iter().filter(|r| r.path == "/landing").collect();
    assert!(landed.is_empty(), "a redirect was followed: {landed:?}");
}

/// An attempt under way when the project's webhook URL is removed is
/// recorded as made: the write that removed the URL ended the delivery
/// `failed`, "not sent", but it was sent. Answered 2xx, it was delivered;
/// otherwise it failed with what it got, no other attempt following.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_under_way_as_the_url_is_removed_is_recorded_as_made() {
    let s = TestServer::start().await;
    let closed = common::ClosedPort::new();
    for (answer, status, error) in [
        (200, "delivered", Value::Null),
        (
            500,
            "failed",
            json!(format!(
                "the receiver answered HTTP 500 Internal Server Error; {}",
                sparring_impl::engine::webhooks::REMOVED_DURING
            )),
        ),
    ] {
        let (url, mut arrivals, answers) = held_receiver().await;
        let (t, test) = hooked_project(&s, &closed, &format!("answers {answer}"), &url).await;
        run_to_end(&s, &t, &test).await;
        let arrived = tokio::time::timeout(Duration::from_secs(30), arrivals.recv()).await;
        assert_eq!(arrived.expect("the webhook was never sent").as_deref(), Some("/hook"));
        // The receiver has the request, and has not answered.
        let p = &t.project_id;
        let body = json!({"name": "removed", "webhook_url": null});
        s.expect(Method::PUT, &format!("/v1/projects/{p}"), &t.owner, Some(body), 200).await;
        let d = delivery_when(&s, &t, "ended by the removal", |d| d["status"] == "failed").await;
        assert_eq!(d["last_error"], json!(sparring_impl::engine::webhooks::REMOVED), "{d:#}");
        answers.send(answer).unwrap();

        let d = delivery_when(&s, &t, "the attempt recorded", |d| d["last_error"] != json!(REMOVED)).await;
        assert_eq!((&d["status"], &d["attempts"]), (&json!(status), &json!(1)), "{d:#}");
        assert_eq!((&d["last_response_status"], &d["last_error"]), (&json!(answer), &error), "{d:#}");
        assert_eq!((&d["url"], &d["next_attempt_at"]), (&json!(url), &Value::Null), "{d:#}");
        // A retry would have been due 1 s after the failed attempt.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(arrivals.try_recv().is_err(), "sent again after the URL was removed");
    }
}

/// An attempt reads the project's webhook, then makes its connection, which
/// can take seconds: the URL removed (or the project deleted) meanwhile,
/// the connection, once made, carries nothing, and the delivery reads as
/// the removal left it, not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_not_sent_on_a_connection_made_after_its_url_went() {
    let s = TestServer::start().await;
    let closed = common::ClosedPort::new();
    let went = |deleted: bool| {
        let (s, closed) = (&s, &closed);
        async move {
            let mut receiver = common::UnansweredPort::new().await;
            let url = format!("http://127.0.0.1:{}/hook", receiver.port);
            let (t, test) = hooked_project(s, closed, if deleted { "deleted" } else { "removed" }, &url).await;
            run_to_end(s, &t, &test).await;
            // The attempt read the webhook and is connecting.
            let deadline = Instant::now() + Duration::from_secs(30);
            while receiver.connecting() == 0 {
                assert!(Instant::now() < deadline, "no connection was begun to the webhook's receiver");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let p = &t.project_id;
            if deleted {
                s.expect(Method::DELETE, &format!("/v1/projects/{p}"), &t.owner, None, 200).await;
            } else {
                let body = json!({"name": "removed", "webhook_url": null});
                s.expect(Method::PUT, &format!("/v1/projects/{p}"), &t.owner, Some(body), 200).await;
            }
            let made = tokio::time::timeout(Duration::from_secs(15), receiver.next()).await;
            let mut stream = made.expect("the connection was never made");
            let mut got = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(15), async {
                use tokio::io::AsyncReadExt as _;
                stream.read_to_end(&mut got).await
            })
            .await;
            assert!(
                got.is_empty(),
                "sent after the webhook went (deleted: {deleted}): {}",
                String::from_utf8_lossy(&got)
            );
            read.expect("the connection was left open").unwrap();
            if !deleted {
                let d = delivery_when(s, &t, "removed", |d| d["status"] != "pending").await;
                assert_eq!((&d["status"], &d["attempts"]), (&json!("failed"), &json!(0)), "{d:#}");
                assert_eq!(d["last_error"], json!(sparring_impl::engine::webhooks::REMOVED));
            }
        }
    };
    tokio::join!(went(false), went(true));
}

/// A webhook whose project's secret cannot be opened (the server's secret
/// key was replaced by another) is not sent unsigned, where the receiver
/// could not tell it from a forgery: the attempt fails, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_never_sent_unsigned_when_its_secret_cannot_be_opened() {
    let receiver = Recorder::start(|_, _| (200, "{}".into())).await;
    let s = TestServer::start().await;
    let t = s.team("unsigned").await;
    let p = &t.project_id;
    let hook =
        json!({"name": "unsigned", "webhook_url": format!("{}/hook", receiver.base), "webhook_secret": "whsec_abc"});
    s.expect(Method::PUT, &format!("/v1/projects/{p}"), &t.owner, Some(hook), 200).await;
    // The sealed secret no longer opens.
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let project = p.clone();
    store
        .write::<_, sparring_impl::store::StoreError, _>(move |tx| {
            tx.execute("UPDATE projects SET webhook_secret = zeroblob(64) WHERE id = ?1", [project])?;
            Ok(())
        })
        .await
        .unwrap();
    let scenario = short_scenario(&s, &t.editor, p).await;
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "t", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivery = loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), &t.editor, None, 200).await;
        let d = list["webhook_deliveries"][0].clone();
        if d["attempts"].as_i64().unwrap_or(0) >= 1 {
            break d;
        }
        assert!(Instant::now() < deadline, "never attempted: {list:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(delivery["status"], "pending", "retried later: {delivery:#}");
    assert!(delivery["last_error"].as_str().unwrap().contains("cannot be opened"), "{delivery:#}");
    assert!(receiver.received().is_empty(), "sent unsigned: {:?}", receiver.received());
}

/// A websocket agent's turn is held to the size an http reply is held to
/// (1 MiB): an agent that floods its turn, in one frame or in many, ends
/// the call in `agent_error` instead of growing the engine's memory and the
/// stored transcript without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_turn_larger_than_a_reply_may_be_is_an_agent_error() {
    // Answers the caller's opening line with `frames` message frames of
    // `size` bytes each, then ends its turn.
    fn flood(frames: usize, size: usize) -> impl Fn(WsPeer) -> futures::future::BoxFuture<'static, ()> {
        move |mut peer| {
            Box::pin(async move {
                while let Some(frame) = ws_recv(&mut peer).await {
                    if frame["type"] == "message" {
                        let words = "a".repeat(size);
                        for _ in 0..frames {
                            ws_send(&mut peer, json!({"type": "message", "role": "assistant", "content": words})).await;
                        }
                        ws_send(&mut peer, json!({"type": "turn_end"})).await;
                    }
                }
            })
        }
    }
    let many = WsAgent::start(flood(48, 64 * 1024)).await;
    let one = WsAgent::start(flood(1, 3 << 20)).await;
    let s = TestServer::start().await;
    let t = s.team("floods").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    for (name, agent) in [("many frames", &many), ("one frame", &one)] {
        let ch = channel(&s, &t.editor, p, "websocket", &agent.target).await;
        let test = create(&s, &t.editor, "/v1/tests", test_body(p, name, &ch, &scenario, 1)).await;
        let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
        wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        let result = &results_of(&s, &t.viewer, &test).await[0];
        let said: usize =
            result["transcript"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap().len()).sum();
        assert_eq!(
            (result["status"].as_str(), result["ended_reason"].as_str()),
            (Some("error"), Some("agent_error")),
            "{name}: {} bytes of transcript, failure {:?}",
            said,
            result["failure_reason"]
        );
        let reason = result["failure_reason"].as_str().unwrap();
        assert!(reason.contains("turn 0") && reason.contains("larger than"), "{name}: {reason}");
        assert!(said < 1 << 20, "{name}: nothing of the flood is kept: {said} bytes");
    }
}

/// `time_to_first_word_ms` is when the agent's first words came, not the
/// first frame of the turn they are in: an agent that reports a tool call
/// (as the reference agent does, before its words) and speaks once the
/// tool is done has said nothing until then. The turn's latency is still
/// the first frame's (channels.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_to_first_word_waits_for_words_not_a_tool_call() {
    let agent = WsAgent::start(|mut peer| async move {
        while let Some(frame) = ws_recv(&mut peer).await {
            if frame["type"] == "message" {
                ws_send(&mut peer, json!({"type": "tool_call", "name": "check_hours", "arguments": {}})).await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                ws_send(&mut peer, json!({"type": "message", "role": "assistant", "content": "We open at 8."})).await;
                ws_send(&mut peer, json!({"type": "turn_end"})).await;
            }
        }
    })
    .await;
    let s = TestServer::start().await;
    let t = s.team("first words").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "websocket", &agent.target).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "tool first", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let result = &results_of(&s, &t.viewer, &test).await[0];
    assert_eq!(result["ended_reason"], "caller_done", "{result:#}");
    let first = &result["transcript"][1];
    assert_eq!(first["text"], "We open at 8.");
    assert!(first["latency_ms"].as_i64().unwrap() < 1000, "latency is to the first frame: {first}");
    let said_at = result["transcript"][0]["start_ms"].as_i64().unwrap();
    let ttfw = result["metrics"]["time_to_first_word_ms"].as_i64().unwrap();
    assert!(ttfw >= said_at + 1500, "the first words came 1.5 s after the tool call, at {ttfw} ms: {result:#}");
}

/// The simulated caller's LLM is held to a size as the agent is: an answer
/// of megabytes is the LLM failing (a caller error), never a "line" that is
/// read whole into memory and then sent to the agent, which would be blamed
/// when it refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_answer_of_the_callers_llm_is_a_caller_error_not_the_agents() {
    let agent = Agent::start(&[]);
    let llm = Recorder::start(|_, _| {
        let said = json!({"say": "Tuesday at 3 pm ".repeat(256 * 1024), "done": false});
        (200, completion(&said.to_string()))
    })
    .await;
    let s = TestServer::start().await;
    let t = s.team("verbose llm").await;
    let p = &t.project_id;
    let caller = json!({"project_id": p, "provider": "openai_compatible", "name": "caller",
                        "config": {"base_url": llm.base, "model": "m"}});
    let caller = create(&s, &t.editor, "/v1/integrations", caller).await;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let simulated = json!({"project_id": p, "name": "sim", "mode": "simulated", "default_persona_id": persona,
                           "goal": "Book an appointment", "integration_id": caller});
    let simulated = create(&s, &t.editor, "/v1/scenarios", simulated).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "verbose", &ch, &simulated, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    let result = &results_of(&s, &t.viewer, &test).await[0];
    let reason = result["failure_reason"].as_str().unwrap_or_default();
    assert_eq!(
        (result["status"].as_str(), result["ended_reason"].as_str()),
        (Some("error"), Some("caller_done")),
        "{reason}"
    );
    assert!(reason.starts_with("the simulated caller's LLM failed") && reason.contains("larger than"), "{reason}");
    let said: usize = result["transcript"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap().len()).sum();
    assert!(said < 1 << 20, "nothing of it was said: {said} bytes");
}

/// A test changed while its runs wait in the queue: they call the channel
/// and are judged by the evaluators it had when they were queued, as they
/// keep its scenario, personas and iterations; runs queued after the change
/// use the changed test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_runs_keep_the_test_as_it_was_queued() {
    let good = Agent::start(&["--latency-ms", "300"]);
    let wrong_day = Agent::start(&["--bug", "wrong-day"]);
    // One conversation at a time: the later runs wait in the queue.
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.workers = 1).await;
    let t = s.team("as queued").await;
    let p = &t.project_id;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let scenario = create(&s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let over_http = channel(&s, &t.editor, p, "http", &good.http_target()).await;
    let buggy = channel(&s, &t.editor, p, "http", &wrong_day.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "books", &over_http, &scenario, 3)).await;

    let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let change = json!({"channel_id": buggy,
                        "evaluators": [{"type": "contains", "name": "added later", "text": "never said"}]});
    s.expect(Method::PATCH, &format!("/v1/tests/{test}"), &t.editor, Some(change), 200).await;
    let done = wait_for_end(&s, &t.viewer, started["id"].as_str().unwrap()).await;
    assert_eq!((done["counts"]["passed"].as_i64(), done["passed"].as_bool()), (Some(3), Some(true)), "{done:#}");
    let results = results_of(&s, &t.viewer, &test).await;
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r["channel_id"], json!(over_http), "{r:#}");
        assert!(r["evaluations"].as_array().unwrap().iter().all(|e| e["name"] != "added later"), "{r:#}");
    }

    // Queued after the change: the changed test.
    let again = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.viewer, again["id"].as_str().unwrap()).await;
    assert_eq!((done["counts"]["failed"].as_i64(), done["passed"].as_bool()), (Some(3), Some(false)), "{done:#}");
    let results = results_of(&s, &t.viewer, &test).await;
    let later: Vec<&Value> = results.iter().filter(|r| r["batch_run_id"] == again["id"]).collect();
    assert_eq!(later.len(), 3);
    for r in later {
        assert_eq!(r["channel_id"], json!(buggy), "{r:#}");
        assert!(r["evaluations"].as_array().unwrap().iter().any(|e| e["name"] == "added later"), "{r:#}");
    }
}

/// A server that may call only public addresses (the default of `sparring
/// serve`) calls no agent, LLM or webhook receiver on loopback: one named by
/// address is refused when it is given, one named by a host name that
/// resolves there is not called, and the result or delivery says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_for_public_targets_does_not_call_into_its_own_network() {
    let agent =
        Recorder::start(|_, _| (200, json!({"messages": [{"role": "assistant", "content": "hi"}]}).to_string())).await;
    let ws = Agent::start(&[]);
    let receiver = Recorder::start(|_, _| (200, "{}".into())).await;
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.allow_private_targets = false).await;
    let t = s.team("public only").await;
    let p = &t.project_id;
    let by_name = |url: &str| url.replace("127.0.0.1", "localhost");

    // By address: refused as given, naming the field, for each kind of URL.
    let at_agent = json!({"project_id": p, "name": "agent", "kind": "http", "target": format!("{}/http", agent.base)});
    let llm = json!({"project_id": p, "provider": "openai_compatible", "name": "llm",
                     "config": {"base_url": "http://[::1]:9/v1", "model": "m"}});
    let hook = json!({"name": "public only", "webhook_url": format!("{}/hook", receiver.base)});
    let project = format!("/v1/projects/{p}");
    for (method, path, body, field) in [
        (Method::POST, "/v1/channels", at_agent, "target"),
        (Method::POST, "/v1/integrations", llm, "config.base_url"),
        (Method::PUT, project.as_str(), hook, "webhook_url"),
    ] {
        let (status, e) = error_body(s.send_json(method, path, &t.owner, Some(body)).await).await;
        assert_eq!(status, 400, "{path}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}: ")) && message.contains("private or local"), "{e}");
        assert!(message.contains("--allow-private-targets"), "says how to allow it: {e}");
    }
    let public = channel(&s, &t.editor, p, "http", "https://agent.example.com/turn").await;
    let path = format!("/v1/channels/{public}");
    let moved = s.send_json(Method::PATCH, &path, &t.editor, Some(json!({"target": "http://10.0.0.7/turn"}))).await;
    assert_eq!(error_body(moved).await.0, 400);

    // By a name resolving to loopback: accepted, and not called.
    let hook = json!({"name": "public only", "webhook_url": by_name(&format!("{}/hook", receiver.base))});
    s.expect(Method::PUT, &project, &t.owner, Some(hook), 200).await;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let over_http = channel(&s, &t.editor, p, "http", &by_name(&format!("{}/http", agent.base))).await;
    let over_ws = channel(&s, &t.editor, p, "websocket", &by_name(&ws.ws_target())).await;
    for ch in [&over_http, &over_ws] {
        let test = create(&s, &t.editor, "/v1/tests", test_body(p, &format!("via {ch}"), ch, &scenario, 1)).await;
        let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
        let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
        let result = &results_of(&s, &t.viewer, &test).await[0];
        assert_eq!((result["status"].as_str(), result["ended_reason"].as_str()), (Some("error"), Some("agent_error")));
        // No call was made: nothing charged, the reservation refunded.
        assert_eq!((result["credits"].as_i64(), done["credits_charged"].as_i64()), (Some(0), Some(0)), "{done:#}");
        let reason = result["failure_reason"].as_str().unwrap();
        assert!(reason.contains("`localhost` resolves only to private or local addresses"), "{reason}");
        assert!(reason.contains("--allow-private-targets"), "says how to allow it: {reason}");
    }
    assert!(agent.received().is_empty(), "the agent was called");

    // The webhook of each batch run's end: not sent either, and said so.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), &t.owner, None, 200).await;
        let tried = list["webhook_deliveries"].as_array().unwrap().iter().filter(|d| d["attempts"] != 0).count();
        if tried == 2 {
            for d in list["webhook_deliveries"].as_array().unwrap() {
                let error = d["last_error"].as_str().unwrap();
                assert!(error.contains("`localhost` resolves only to private or local addresses"), "{d:#}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no attempt: {list:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(receiver.received().is_empty(), "the receiver was called");
}

/// A run whose end could not be written (a failed write: here a trigger
/// refuses it once) is left by its worker to expire and be retried. It must
/// not be renewed in the worker's name for as long as the server runs: its
/// batch run would never end, its reservation never be refunded, and it
/// would hold a slot of its user's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_could_not_be_written_is_retried_and_refunded() {
    let agent = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.lease = Duration::from_secs(1)).await;
    let t = s.team("lost end").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "once", &ch, &scenario, 1)).await;

    // The next write that ends a run fails, once.
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch(
        "CREATE TABLE lost_ends (n INTEGER NOT NULL);
         CREATE TRIGGER lose_the_end BEFORE UPDATE OF status ON runs
         WHEN OLD.status = 'running' AND NEW.status NOT IN ('running', 'queued')
              AND (SELECT count(*) FROM lost_ends) = 0
         BEGIN SELECT RAISE(ABORT, 'the disk is full'); END;",
    )
    .unwrap();
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.log.contents().contains("recording a run's end failed") {
        assert!(Instant::now() < deadline, "the end was never refused: {}", s.log.contents());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The disk has room again.
    db.execute_batch("INSERT INTO lost_ends VALUES (1); DROP TRIGGER lose_the_end;").unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let now = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), &t.viewer, None, 200).await;
        if !matches!(now["status"].as_str(), Some("queued" | "running")) {
            break now;
        }
        assert!(Instant::now() < deadline, "the run whose end was lost is never retried: {now:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["counts"]["passed"], 1, "{done:#}");
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let kinds: Vec<&str> = ledger.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reservation", "grant"], "a one-minute run uses its whole reservation: {ledger:#?}");
    assert_eq!(ledger_balances(&ledger), 999);
}

/// `POST …/run` with an `Idempotency-Key`, answered with status and body.
async fn start_keyed(s: &TestServer, key: &str, path: &str, idempotency_key: &[u8], body: Value) -> (u16, Value) {
    let resp = s
        .http
        .post(s.url(path))
        .header("x-api-key", key)
        .header("idempotency-key", reqwest::header::HeaderValue::from_bytes(idempotency_key).unwrap())
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// A run start's body may be left out (`curl -X POST …/run`): it is `{}`,
/// the same request to its idempotency key too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_a_body_is_a_start_with_an_empty_one() {
    let s = TestServer::start().await;
    let t = s.team("no body").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "bare", &ch, &scenario, 1)).await;
    let batch = create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [test]})).await;
    for path in [format!("/v1/tests/{test}/run"), format!("/v1/batches/{batch}/run"), format!("/v1/channels/{ch}/run")]
    {
        let key = format!("bare-{}", path.replace('/', "-"));
        let resp = s
            .http
            .post(s.url(&path))
            .header("x-api-key", &t.editor)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let started: Value = resp.json().await.unwrap();
        assert_eq!((status, started["status"].as_str()), (200, Some("queued")), "{path}: {started}");
        let (status, again) = start_keyed(&s, &t.editor, &path, key.as_bytes(), json!({})).await;
        assert_eq!((status, &again["id"]), (200, &started["id"]), "{path}: `{{}}` is the same request: {again}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_repeated_with_its_idempotency_key_starts_nothing_more() {
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 10).await;
    let t = s.team("retries").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    // An agent that is not there: every conversation ends at once in error.
    let closed = common::ClosedPort::new();
    let ch = channel(&s, &t.editor, p, "http", &closed.http_target()).await;
    let two = create(&s, &t.editor, "/v1/tests", test_body(p, "two", &ch, &scenario, 2)).await;
    let other = create(&s, &t.editor, "/v1/tests", test_body(p, "other", &ch, &scenario, 1)).await;
    let path = format!("/v1/tests/{two}/run");
    let body = json!({"metadata": {"commit": "abc"}});
    let key = b"ci-4711-attempt";

    // The first start, then five repeats at once (as a client retrying
    // after lost answers would send them) and one through the generated
    // client: all get the one batch run.
    let (status, first) = start_keyed(&s, &t.editor, &path, key, body.clone()).await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let repeats = (0..5).map(|_| start_keyed(&s, &t.editor, &path, key, body.clone()));
    for (status, again) in futures::future::join_all(repeats).await {
        assert_eq!((status, again["id"].as_str()), (200, Some(id.as_str())), "{again}");
    }
    let typed = s
        .client(&t.editor)
        .run_test()
        .id(&two)
        .idempotency_key("ci-4711-attempt")
        .body(serde_json::from_value::<sparring_client::types::RunTestRequest>(body.clone()).unwrap())
        .send()
        .await
        .unwrap()
        .into_inner();
    assert_eq!(typed.id, id);
    let listed = all_pages(&s, &t.viewer, &format!("/v1/batch-runs?project_id={p}"), "batch_runs").await;
    assert_eq!(listed.len(), 1, "one batch run: {listed:#?}");
    let ledger = all_pages(&s, &t.owner, "/v1/transactions", "transactions").await;
    let kinds: Vec<&str> = ledger.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    // Reserved once (and, as its agent is not there, refunded whole when it ends).
    assert_eq!(kinds.iter().filter(|k| **k == "reservation").count(), 1, "credits reserved once: {ledger:#?}");
    let feed = all_pages(&s, &t.viewer, &format!("/v1/activity?project_id={p}&action=test.run"), "activity").await;
    assert_eq!(feed.len(), 1, "one start recorded");

    // The key names that request only: another body, path or operation is
    // refused, and starts nothing.
    let batch = create(&s, &t.editor, "/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [two]})).await;
    for (path, body) in [
        (path.clone(), json!({"metadata": {"commit": "def"}})),
        (path.clone(), json!({})),
        (format!("/v1/tests/{other}/run"), body.clone()),
        (format!("/v1/batches/{batch}/run"), body.clone()),
        (format!("/v1/channels/{ch}/run"), json!({"metadata": {"commit": "abc"}, "test_ids": [two]})),
    ] {
        let (status, e) = start_keyed(&s, &t.editor, &path, key, body).await;
        assert_eq!((status, e["error_code"].as_str()), (409, Some("idempotency_key_reused")), "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains(&id), "it names the batch run the key started: {e}");
    }
    assert_eq!(all_pages(&s, &t.viewer, &format!("/v1/batch-runs?project_id={p}"), "batch_runs").await.len(), 1);

    // Keys are each user's own: the owner's same key starts another run.
    let (status, theirs) = start_keyed(&s, &t.owner, &path, key, body.clone()).await;
    assert_eq!(status, 200, "{theirs}");
    assert_ne!(theirs["id"].as_str(), Some(id.as_str()));
    // Without a key every request starts a batch run, as before.
    let unkeyed = s.expect(Method::POST, &format!("/v1/tests/{other}/run"), &t.editor, Some(json!({})), 200).await;
    let again = s.expect(Method::POST, &format!("/v1/tests/{other}/run"), &t.editor, Some(json!({})), 200).await;
    assert_ne!(unkeyed["id"], again["id"]);
    // 10 credits: 2 + 2 + 1 + 1 reserved, 4 left (minus what errored
    // runs cost once they end, which can only lower it).

    // A start refused for credits is refused again, and recorded once.
    let big = create(&s, &t.editor, "/v1/tests", test_body(p, "big", &ch, &scenario, 20)).await;
    let big_path = format!("/v1/tests/{big}/run");
    let (status, e) = start_keyed(&s, &t.editor, &big_path, b"big-1", json!({})).await;
    assert_eq!((status, e["error_code"].as_str()), (402, Some("insufficient_credits")), "{e}");
    let (status, again) = start_keyed(&s, &t.editor, &big_path, b"big-1", json!({})).await;
    assert_eq!((status, again["error_code"].as_str()), (402, Some("insufficient_credits")), "{again}");
    let refused = all_pages(&s, &t.viewer, "/v1/batch-runs?status=insufficient_credits", "batch_runs").await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(again["message"].as_str().unwrap().contains(refused[0]["id"].as_str().unwrap()), "{again}");

    // Malformed keys are refused before anything is looked at.
    for (bad, why) in [
        (&b""[..], ": got 0 characters"),
        (b"has space", ": character 4 is not"),
        (&[b'k'; 256], ": got 256 characters"),
        (b"tab\there", ": character 4 is not"),
    ] {
        let (status, e) = start_keyed(&s, &t.editor, &format!("/v1/tests/{other}/run"), bad, json!({})).await;
        assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_idempotency_key")), "{bad:?}: {e}");
        assert!(e["message"].as_str().unwrap().ends_with(why), "{bad:?}: {e}");
    }
    let (status, e) = start_keyed(&s, &t.editor, &format!("/v1/tests/{other}/run"), b"caf\xc3\xa9", json!({})).await;
    assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_header")), "{e}");
    let twice = s
        .http
        .post(s.url(&format!("/v1/tests/{other}/run")))
        .header("x-api-key", &t.editor)
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (status, e) = error_body(twice).await;
    assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_header")), "{e}");
    // A header the operation does not name is left alone, whatever its bytes.
    let odd = s
        .http
        .post(s.url(&format!("/v1/tests/{other}/run")))
        .header("x-api-key", &t.editor)
        .header("x-trace", reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap())
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status(), 200);

    // A key is remembered for 24 hours; after that it starts anew.
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute("UPDATE idempotency_keys SET created_ms = created_ms - 86400001", []).unwrap();
    let (status, later) = start_keyed(&s, &t.editor, &format!("/v1/tests/{other}/run"), key, json!({})).await;
    assert_eq!(status, 200, "{later}");
    assert_ne!(later["id"].as_str(), Some(id.as_str()));
    let kept: i64 = db.query_row("SELECT count(*) FROM idempotency_keys", [], |r| r.get(0)).unwrap();
    assert_eq!(kept, 1, "the expired keys are gone, the new one kept");
}

/// A server stopped while a run's conversation is over and its judge is
/// still deciding lets the judge answer (within the stop's wait) and
/// records the run's end: the run is not put back in the queue, to be held
/// again, its agent called a second time, after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_being_judged_when_the_server_stops_is_recorded_not_run_again() {
    let agent = Agent::start(&[]);
    let (judge_url, mut arrivals, answers) = held_receiver().await;
    let mut s = TestServer::start().await;
    let t = s.team("judged at the stop").await;
    let p = &t.project_id;
    let judge = json!({"project_id": p, "provider": "openai_compatible", "name": "judge",
                       "config": {"base_url": judge_url, "model": "m"}});
    let judge = create(&s, &t.editor, "/v1/integrations", judge).await;
    let Setup { persona } = persona(&s, &t.editor, p).await;
    let mut scenario = short_call(p, &persona);
    scenario["success_criteria"] =
        json!([{"type": "llm_judge", "name": "judged", "integration_id": judge, "prompt": "Did it go well?"}]);
    let scenario = create(&s, &t.editor, "/v1/scenarios", scenario).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "judged", &ch, &scenario, 1)).await;
    let run = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap().to_string();
    // The conversation is over: its judge has been asked.
    let asked = tokio::time::timeout(Duration::from_secs(60), arrivals.recv()).await.expect("the judge is asked");
    assert!(asked.is_some());
    let base = s.base.clone();
    let judged_during_the_stop = async move {
        // The stop is under way once the API takes no more connections
        // (each probe on a connection of its own); the judge answers a
        // little after that.
        let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        while http.get(format!("{base}/v1/queue/stats")).send().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        answers.send(500).unwrap();
    };
    tokio::join!(s.stop(), judged_during_the_stop);
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    let (status, result, attempt): (String, Option<String>, i64) = db
        .query_row("SELECT status, test_result_id, attempt FROM runs WHERE batch_run_id = ?1", [&id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!((status.as_str(), result.is_some(), attempt), ("error", true, 1), "recorded, not queued again");
    let batch_run: String = db.query_row("SELECT status FROM batch_runs WHERE id = ?1", [&id], |r| r.get(0)).unwrap();
    assert_eq!(batch_run, "completed");
}

/// A run whose task panics (a fault of the service, made here by the
/// test's name with the test builds' `fault-injection`) ends as an error
/// that says so, charged nothing, and gives its worker back: with one
/// worker, the test run after it runs. Before, the run stayed `running`
/// (its lease renewed as long as the server ran, its batch run never
/// ending) and held the only worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_task_panics_ends_as_an_error_and_frees_its_worker() {
    use sparring_impl::engine::worker::{PANICKED, PANIC_AFTER_THE_CALL};
    let agent = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.workers = 1).await;
    let t = s.team("panics").await;
    let p = &t.project_id;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let faulty = test_body(p, &format!("{PANIC_AFTER_THE_CALL}: once"), &ch, &scenario, 1);
    let faulty = create(&s, &t.editor, "/v1/tests", faulty).await;
    let fine = create(&s, &t.editor, "/v1/tests", test_body(p, "fine", &ch, &scenario, 1)).await;
    let before = ledger_balances(&all_pages(&s, &t.owner, "/v1/transactions", "transactions").await);

    let started = s.expect(Method::POST, &format!("/v1/tests/{faulty}/run"), &t.editor, None, 200).await;
    let id = started["id"].as_str().unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!(
        (done["status"].as_str(), done["counts"]["errored"].as_i64(), done["credits_charged"].as_i64()),
        (Some("completed"), Some(1), Some(0)),
        "{done:#}"
    );
    let tests = s.expect(Method::GET, &format!("/v1/batch-runs/{id}/tests"), &t.viewer, None, 200).await;
    let failure = &tests["tests"][0]["failures"][0];
    assert_eq!((failure["status"].as_str(), failure["failure_reason"].as_str()), (Some("error"), Some(PANICKED)));
    let runs = all_pages(&s, &t.viewer, &format!("/v1/batch-runs/{id}/runs"), "runs").await;
    assert!(runs[0]["test_result_id"].is_null() && runs[0]["call_id"].is_string(), "{runs:#?}");
    let after = ledger_balances(&all_pages(&s, &t.owner, "/v1/transactions", "transactions").await);
    assert_eq!(after, before, "its reservation was given back whole");

    let again = s.expect(Method::POST, &format!("/v1/tests/{fine}/run"), &t.editor, None, 200).await;
    let done = wait_for_end(&s, &t.viewer, again["id"].as_str().unwrap()).await;
    assert_eq!(done["counts"]["passed"].as_i64(), Some(1), "the one worker ran it: {done:#}");
}

/// The engine's own tasks start again when they panic (a fault of the
/// service, made here with the test builds' `fault-injection`). Here the
/// lease keeper panics at its first tick, the dispatcher just after it
/// claimed the run, and the webhook sender once it found the run's
/// delivery due. The run ends all the same: the claim the dispatcher
/// dropped expires and the lease keeper, started again, queues it again;
/// the dispatcher, started again, runs it; and the sender, started again,
/// delivers its webhook. Before, each task ended at its panic: the run
/// stayed claimed for as long as the server ran, and no webhook was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_tasks_start_again_after_they_panic() {
    use sparring_impl::engine::worker::{DISPATCHER, LEASE_KEEPER, WEBHOOK_SENDER};
    let receiver = Recorder::start(|_, _| (200, "{}".into())).await;
    let agent = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| {
        c.engine.lease = Duration::from_secs(1);
        for task in [LEASE_KEEPER, DISPATCHER, WEBHOOK_SENDER] {
            c.engine.faults.arm(task);
        }
    })
    .await;
    let t = s.team("panicking tasks").await;
    let p = &t.project_id;
    let hook = json!({"name": "panicking tasks", "webhook_url": format!("{}/hook", receiver.base)});
    s.expect(Method::PUT, &format!("/v1/projects/{p}"), &t.owner, Some(hook), 200).await;
    let scenario = short_scenario(&s, &t.editor, p).await;
    let ch = channel(&s, &t.editor, p, "http", &agent.http_target()).await;
    let test = create(&s, &t.editor, "/v1/tests", test_body(p, "survives", &ch, &scenario, 1)).await;

    let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, None, 200).await;
    let id = started["id"].as_str().unwrap();
    let done = wait_for_end(&s, &t.viewer, id).await;
    assert_eq!((done["status"].as_str(), done["counts"]["passed"].as_i64()), (Some("completed"), Some(1)), "{done:#}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.received().is_empty() {
        assert!(Instant::now() < deadline, "the webhook was never sent: {}", s.log.contents());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body: Value = serde_json::from_str(&receiver.received()[0].body).unwrap();
    assert_eq!(body["batch_run"]["id"], json!(id));

    // Each panicked once, and the log says which started again.
    let restarted: Vec<String> = s
        .log
        .contents()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|record| record["msg"] == "an engine task panicked; it starts again")
        .map(|record| record["task"].as_str().unwrap().to_string())
        .collect();
    let mut restarted: Vec<&str> = restarted.iter().map(String::as_str).collect();
    restarted.sort_unstable();
    assert_eq!(restarted, [DISPATCHER, LEASE_KEEPER, WEBHOOK_SENDER]);
}
