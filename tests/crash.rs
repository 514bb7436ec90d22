//! A crash in the middle of a batch run: the server is a child process,
//! killed with SIGKILL while conversations are in flight, and restarted on
//! the same data dir. Every run must end exactly once, the counts must match
//! the runs, and the credit ledger must balance.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::engine::{held_receiver, wait_for_end_at, Agent};
use common::process::serve_with;
use serde_json::{json, Value};

fn first_key(stdout: &str) -> String {
    let i = stdout.find("spk_").expect("the first start prints a key");
    stdout[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect()
}

struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.base)).header("x-api-key", &self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        body
    }

    async fn create(&self, path: &str, body: Value) -> String {
        self.send(reqwest::Method::POST, path, Some(body)).await["id"].as_str().unwrap().to_string()
    }

    async fn all(&self, path: &str, field: &str) -> Vec<Value> {
        let mut items = Vec::new();
        // The first page has no cursor (an empty one is refused).
        let mut cursor = String::new();
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let page = self.send(reqwest::Method::GET, &format!("{path}{sep}limit=200{cursor}"), None).await;
            items.extend(page[field].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => return items,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_resumes_every_run_exactly_once() {
    let agent = Agent::start(&["--latency-ms", "150"]);
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with(dir.path(), &["--lease-seconds", "2"]);
    let api = Api { http: reqwest::Client::new(), base: server.base.clone(), key: first_key(&server.proc.stdout()) };

    let project = api.create("/v1/projects", json!({"name": "crash"})).await;
    let persona = api.create("/v1/personas", json!({"project_id": project, "name": "Dana"})).await;
    let scenario = api
        .create(
            "/v1/scenarios",
            json!({"project_id": project, "name": "three lines", "mode": "scripted", "default_persona_id": persona,
                   "first_message": "Hi, I'd like to book an appointment.",
                   "steps": [{"say": "Thursday at 10am, please.", "expect": []},
                             {"say": "Thanks.", "expect": []}],
                   "max_duration_s": 120}),
        )
        .await;
    let channel = api
        .create(
            "/v1/channels",
            json!({"project_id": project, "name": "agent", "kind": "http", "target": agent.http_target()}),
        )
        .await;
    let test = api
        .create(
            "/v1/tests",
            json!({"project_id": project, "name": "many", "channel_id": channel, "scenario_id": scenario,
                   "iterations": 40}),
        )
        .await;
    let batch = api
        .create("/v1/batches", json!({"project_id": project, "name": "b", "test_ids": [test], "concurrency": 6}))
        .await;
    let run = api.send(reqwest::Method::POST, &format!("/v1/batches/{batch}/run"), Some(json!({}))).await;
    let id = run["id"].as_str().unwrap().to_string();

    // Kill it mid-way: some runs finished, some in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = api.send(reqwest::Method::GET, &format!("/v1/batch-runs/{id}"), None).await;
        let finished = now["counts"]["passed"].as_i64().unwrap() + now["counts"]["failed"].as_i64().unwrap();
        if finished >= 8 && now["counts"]["running"].as_i64().unwrap() > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the batch run never got going: {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = server.proc.child.id().to_string();
    assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    drop(server);

    let server = serve_with(dir.path(), &["--lease-seconds", "2"]);
    let api = Api { base: server.base.clone(), ..api };
    let done = wait_for_end_at(&api.base, &api.key, &id).await;
    assert_eq!(done["status"], "completed", "{done:#}");

    // Every run ended exactly once, with exactly one result.
    let runs = api.all(&format!("/v1/batch-runs/{id}/runs"), "runs").await;
    assert_eq!(runs.len(), 40);
    let results = api.all(&format!("/v1/tests/{test}/results"), "test_results").await;
    let result_runs: HashSet<&str> = results.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(result_runs.len(), results.len(), "no run has two results");
    let mut by_status: BTreeMap<String, i64> = BTreeMap::new();
    for r in &runs {
        let status = r["status"].as_str().unwrap();
        *by_status.entry(status.to_string()).or_default() += 1;
        match r["test_result_id"].as_str() {
            Some(result) => {
                assert!(result_runs.contains(r["id"].as_str().unwrap()), "{r}");
                assert!(results.iter().any(|x| x["id"] == result && x["run_id"] == r["id"]));
            }
            None => assert_eq!(status, "error", "only a run that never got to talk has no result: {r}"),
        }
    }
    assert!(runs.iter().any(|r| r["attempt"] == 2), "the runs in flight were retried");
    let counts = &done["counts"];
    for (status, field) in
        [("passed", "passed"), ("failed", "failed"), ("error", "errored"), ("cancelled", "cancelled")]
    {
        assert_eq!(counts[field].as_i64().unwrap(), by_status.get(status).copied().unwrap_or(0), "{status}: {done:#}");
    }
    assert_eq!(counts["total"], 40);
    assert_eq!(counts["passed"], 40, "the retried runs passed too: {done:#}");

    // The ledger balances: reserved once, charged per result, the rest refunded.
    let charged: i64 = results.iter().map(|r| r["credits"].as_i64().unwrap()).sum();
    assert_eq!(done["credits_charged"].as_i64().unwrap(), charged);
    let ledger = api.all("/v1/transactions", "transactions").await;
    let kinds: Vec<&str> = ledger.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["refund", "reservation", "grant"]);
    let sum: i64 = ledger.iter().map(|t| t["amount"].as_i64().unwrap()).sum();
    assert_eq!(sum, ledger[0]["balance_after"].as_i64().unwrap());
    assert_eq!(sum, 1000 - charged);
}

/// Runs of a cancelled batch run that are mid-turn when the server stops
/// cleanly end `cancelled`, as they would have at their next turn: they are
/// not queued again and held from the start after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_cancelled_mid_turn_stay_cancelled_across_a_clean_restart() {
    // The first turn must still be in flight when the server stops, however
    // slow the machine: a turn that ends first ends its run at once, charged
    // for its call (with 3 s turns, a loaded machine once got there first). The
    // test does not wait for the turn, so a long one costs nothing.
    let agent = Agent::start(&["--latency-ms", "30000"]);
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve_with(dir.path(), &[]);
    let api = Api { http: reqwest::Client::new(), base: server.base.clone(), key: first_key(&server.proc.stdout()) };
    let project = api.create("/v1/projects", json!({"name": "cancel"})).await;
    let persona = api.create("/v1/personas", json!({"project_id": project, "name": "Dana"})).await;
    let scenario = api
        .create(
            "/v1/scenarios",
            json!({"project_id": project, "name": "two lines", "mode": "scripted", "default_persona_id": persona,
                   "first_message": "Hi, what are your opening hours?",
                   "steps": [{"say": "Thanks, goodbye.", "expect": []}], "max_duration_s": 60}),
        )
        .await;
    let channel = api
        .create(
            "/v1/channels",
            json!({"project_id": project, "name": "slow", "kind": "http", "target": agent.http_target(),
                   "turn_timeout_ms": 60000}),
        )
        .await;
    let test = api
        .create(
            "/v1/tests",
            json!({"project_id": project, "name": "t", "channel_id": channel, "scenario_id": scenario,
                   "iterations": 2}),
        )
        .await;
    let run = api.send(reqwest::Method::POST, &format!("/v1/tests/{test}/run"), Some(json!({}))).await;
    let id = run["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = api.send(reqwest::Method::GET, &format!("/v1/batch-runs/{id}"), None).await;
        if now["counts"]["running"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the runs never started: {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = api.send(reqwest::Method::POST, &format!("/v1/batch-runs/{id}/cancel"), None).await;
    assert_eq!(cancelled["counts"]["running"], 2, "{cancelled:#}");
    // Stopped while both first turns (30 s each) are still in flight.
    server.stop();
    drop(server);

    let server = serve_with(dir.path(), &[]);
    let done = wait_for_end_at(&server.base, &api.key, &id).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    assert_eq!(
        (&done["counts"]["cancelled"], &done["counts"]["passed"], &done["credits_charged"]),
        (&json!(2), &json!(0), &json!(0)),
        "{done:#}"
    );
    let api = Api { base: server.base.clone(), ..api };
    let runs = api.all(&format!("/v1/batch-runs/{id}/runs"), "runs").await;
    assert!(runs.iter().all(|r| r["status"] == "cancelled" && r["test_result_id"].is_null()), "{runs:#?}");
    // The reservation came back whole.
    let ledger = api.all("/v1/transactions", "transactions").await;
    assert_eq!(ledger[0]["balance_after"], 1000, "{ledger:#?}");
}

/// A server killed (SIGKILL) while sixteen clients write as fast as it
/// answers has, after a restart, every write it acknowledged: a write is
/// answered only once its group's transaction committed. Killed and
/// restarted four times, each at whatever moment its 150th write of the
/// round is seen, so that a write answered before its commit reached the
/// database (an acknowledgement from memory, a commit put off) is caught
/// at one of them. A kill leaves the kernel's page cache to be written;
/// that a commit is also synced to the disk is `synchronous = FULL` in WAL
/// mode, which `store::tests::every_connection_commits_in_wal_with_full_sync`
/// checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_a_kill_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve_with(dir.path(), &[]);
    let mut api =
        Api { http: reqwest::Client::new(), base: server.base.clone(), key: first_key(&server.proc.stdout()) };
    let project = api.create("/v1/projects", json!({"name": "kill"})).await;
    let persona = api.create("/v1/personas", json!({"project_id": project, "name": "Dana"})).await;
    let scenario = api
        .create(
            "/v1/scenarios",
            json!({"project_id": project, "name": "one line", "mode": "scripted", "default_persona_id": persona,
                   "first_message": "Hi.", "steps": [{"say": "Bye.", "expect": []}], "max_duration_s": 60}),
        )
        .await;
    // Never called: only written.
    let channel = api
        .create(
            "/v1/channels",
            json!({"project_id": project, "name": "agent", "kind": "http", "target": "http://127.0.0.1:9/turn"}),
        )
        .await;
    let template = json!({"project_id": project, "channel_id": channel, "scenario_id": scenario});

    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let rounds = 4;
    for round in 0..rounds {
        // Each writer sends what it saw acknowledged.
        let (seen, mut acks) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let writers: Vec<_> = (0..16)
            .map(|w| {
                let (http, url, key) = (api.http.clone(), format!("{}/v1/tests", api.base), api.key.clone());
                let (seen, template) = (seen.clone(), template.clone());
                tokio::spawn(async move {
                    for i in 0.. {
                        let name = format!("r{round}-w{w}-{i}");
                        let mut body = template.clone();
                        body["name"] = json!(name);
                        // Once the server is gone, the request (or its answer) fails.
                        let sent = http.post(&url).header("x-api-key", &key).json(&body).send().await;
                        let Ok(resp) = sent else { return };
                        let status = resp.status();
                        let Ok(test) = resp.json::<Value>().await else { return };
                        assert!(status.is_success(), "{status} {test}");
                        seen.send((test["id"].as_str().unwrap().to_string(), name)).unwrap();
                    }
                })
            })
            .collect();
        drop(seen);
        let first = tokio::time::timeout(Duration::from_secs(60), async {
            for _ in 0..150 {
                let ack = acks.recv().await.unwrap_or_else(|| panic!("round {round}: every writer stopped"));
                acknowledged.push(ack);
            }
        });
        first.await.unwrap_or_else(|_| panic!("round {round}: the writes never got going"));
        let pid = server.proc.child.id().to_string();
        assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
        for w in writers {
            w.await.unwrap();
        }
        // What was acknowledged between the 150th answer and the kill.
        while let Ok(ack) = acks.try_recv() {
            acknowledged.push(ack);
        }

        server = serve_with(dir.path(), &[]);
        api.base = server.base.clone();
        let stored: BTreeMap<String, String> = api
            .all(&format!("/v1/tests?project_id={project}"), "tests")
            .await
            .into_iter()
            .map(|t| (t["id"].as_str().unwrap().to_string(), t["name"].as_str().unwrap().to_string()))
            .collect();
        let lost: Vec<_> = acknowledged.iter().filter(|(id, name)| stored.get(id) != Some(name)).collect();
        assert!(
            lost.is_empty(),
            "round {round}: {} of {} acknowledged writes lost: {lost:?}",
            lost.len(),
            acknowledged.len()
        );
        // Writes committed but not answered before a kill may be there
        // too (one a writer at most); nothing else is.
        let most = acknowledged.len() + 16 * (round + 1);
        assert!(stored.len() <= most, "round {round}: {} stored, {} acknowledged", stored.len(), acknowledged.len());
    }
}

/// A project made of `project` (its webhook set), with a test run once on
/// a channel to `closed`: nothing is there, so the run ends at once, in
/// error, and its batch run's end is a delivery. Gives the project's id.
async fn ended_with_a_webhook(api: &Api, closed: &common::ClosedPort, project: Value) -> String {
    let project = api.create("/v1/projects", project).await;
    let persona = api.create("/v1/personas", json!({"project_id": project, "name": "Dana"})).await;
    let scenario = api
        .create(
            "/v1/scenarios",
            json!({"project_id": project, "name": "two lines", "mode": "scripted", "default_persona_id": persona,
                   "first_message": "Hi.", "steps": [{"say": "Bye.", "expect": []}], "max_duration_s": 60}),
        )
        .await;
    let channel = api
        .create(
            "/v1/channels",
            json!({"project_id": project, "name": "closed", "kind": "http", "target": closed.http_target()}),
        )
        .await;
    let test = api
        .create(
            "/v1/tests",
            json!({"project_id": project, "name": "t", "channel_id": channel, "scenario_id": scenario}),
        )
        .await;
    let run = api.send(reqwest::Method::POST, &format!("/v1/tests/{test}/run"), Some(json!({}))).await;
    wait_for_end_at(&api.base, &api.key, run["id"].as_str().unwrap()).await;
    project
}

/// A webhook attempt waiting for its receiver's answer when the server is
/// stopped (SIGTERM) is let finish, and recorded: the receiver that took
/// the event and answered `200` during the stop does not get it again
/// after the restart, and the delivery reads `delivered`, one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_attempt_under_way_at_a_clean_stop_is_recorded_not_sent_again() {
    let (url, mut arrivals, answers) = held_receiver().await;
    let closed = common::ClosedPort::new();
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve_with(dir.path(), &[]);
    let api = Api { http: reqwest::Client::new(), base: server.base.clone(), key: first_key(&server.proc.stdout()) };
    let project = ended_with_a_webhook(
        &api,
        &closed,
        json!({"name": "hooked", "webhook_url": url, "webhook_secret": "whsec_abc"}),
    )
    .await;
    let arrived = tokio::time::timeout(Duration::from_secs(30), arrivals.recv()).await;
    assert_eq!(arrived.expect("the webhook was never sent").as_deref(), Some("/hook"));

    // Stopped while the receiver holds the request; it answers a second
    // into the stop.
    server.proc.signal("TERM");
    tokio::time::sleep(Duration::from_secs(1)).await;
    answers.send(200).unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let status = server.proc.wait_exit();
        (status, server.proc.stderr())
    })
    .await
    .unwrap();
    assert!(status.0.success(), "the server did not stop cleanly ({})\n{}", status.0, status.1);

    let server = serve_with(dir.path(), &[]);
    let api = Api { base: server.base.clone(), ..api };
    let deliveries = api.all(&format!("/v1/projects/{project}/webhook-deliveries"), "webhook_deliveries").await;
    assert_eq!(deliveries.len(), 1, "{deliveries:#?}");
    let d = &deliveries[0];
    assert_eq!(
        (&d["status"], &d["attempts"], &d["last_response_status"]),
        (&json!("delivered"), &json!(1), &json!(200)),
        "{d:#}"
    );
    // A delivery left pending would be sent again within a poll (0.5 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(arrivals.try_recv().is_err(), "sent again after the restart");
}

/// An attempt counts from when its request is sent, durably: a server
/// killed (SIGKILL) during each attempt, again and again, sends the event
/// at most as many times as the spec promises attempts (6), and the
/// delivery then ends `failed`, not sent once more at every restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_attempt_cut_off_by_a_kill_counts() {
    // Takes every request and never answers it: each attempt is under way
    // when the server is killed.
    let (url, mut arrivals, _never_answered) = held_receiver().await;
    let closed = common::ClosedPort::new();
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve_with(dir.path(), &[]);
    let api = Api { http: reqwest::Client::new(), base: server.base.clone(), key: first_key(&server.proc.stdout()) };
    let project = ended_with_a_webhook(&api, &closed, json!({"name": "killed", "webhook_url": url})).await;

    let deliveries = format!("/v1/projects/{project}/webhook-deliveries");
    let mut requests = 0;
    let mut api = api;
    let ended = 'rounds: {
        for round in 0..10 {
            // A request arrives, or the delivery ends without one.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if arrivals.try_recv().is_ok() {
                    requests += 1;
                    break;
                }
                let d = api.all(&deliveries, "webhook_deliveries").await.remove(0);
                if d["status"] != "pending" {
                    break 'rounds d;
                }
                assert!(Instant::now() < deadline, "round {round}: neither sent nor ended: {d:#}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(requests <= 6, "round {round}: sent {requests} times; the spec promises 6 attempts in all");
            // The attempt under way is counted already: a kill now costs it.
            let d = api.all(&deliveries, "webhook_deliveries").await.remove(0);
            assert_eq!((&d["status"], &d["attempts"]), (&json!("pending"), &json!(requests)), "round {round}: {d:#}");
            assert!(Command::new("kill")
                .args(["-KILL", &server.proc.child.id().to_string()])
                .status()
                .unwrap()
                .success());
            server.proc.wait_exit();
            drop(server);
            // The retry's delay has passed (10 min at the longest).
            let store = sparring_impl::open_store(dir.path()).unwrap();
            store
                .write::<_, sparring_impl::store::StoreError, _>(|tx| {
                    tx.execute("UPDATE webhook_deliveries SET next_attempt_ms = 0 WHERE status = 'pending'", [])?;
                    Ok(())
                })
                .await
                .unwrap();
            drop(store);
            server = serve_with(dir.path(), &[]);
            api = Api { base: server.base.clone(), ..api };
        }
        panic!("still pending after 10 kills, sent {requests} times");
    };
    assert_eq!(requests, 6, "{ended:#}");
    assert_eq!((&ended["status"], &ended["attempts"]), (&json!("failed"), &json!(6)), "{ended:#}");
    assert_eq!(ended["last_error"], json!(sparring_impl::engine::webhooks::LAST_CUT_OFF), "{ended:#}");
    // A delivery still due would be sent within a poll (0.5 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(arrivals.try_recv().is_err(), "sent after the delivery ended");
}
