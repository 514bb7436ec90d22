//! Tenancy, for every operation of the spec (DESIGN §2–3): a user sees only
//! the projects they belong to and everything inside them, and anything of
//! another tenant's is "404, missing or not yours", answered exactly as for
//! an id that does not exist. The operations are read from
//! `spec/openapi.json` at run time, and each must be in this file's table
//! ([`scope`]), so that an operation added later is walked too.

mod common;

use std::collections::BTreeMap;

use common::engine::{channel, create, wait_for_end, Agent, Recorder};
use common::spec::{operations, Operation};
use common::{missing_id as fake, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// In every name and email of A's, so that a body naming A's data shows.
const MARK: &str = "alphamark";

/// Who an operation's subject belongs to, when B calls it with A's ids.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scope {
    /// A's (in A's project, or A's own): 404 `not_found`, as for an id that
    /// does not exist.
    Theirs,
    /// The caller's own (B's keys, B's projects and ledger, the lists of
    /// B's projects): allowed, and naming nothing of A's.
    Own,
    /// A list about a resource that the spec answers with an empty page,
    /// never a 404, for a non-member (the field of its items).
    Empty(&'static str),
}

/// Every operation of the spec, by its id. An operation missing here fails
/// the test: a new one must be placed deliberately.
fn scope(operation_id: &str) -> Option<Scope> {
    use Scope::*;
    Some(match operation_id {
        "list_activity" | "list_api_keys" | "create_api_key" | "list_batch_runs" | "list_batches" | "list_channels"
        | "list_integrations" | "list_personas" | "list_projects" | "create_project" | "get_queue_stats"
        | "list_reviews" | "list_calibrations" | "list_reviewers" | "list_scenarios" | "list_tests"
        | "list_transactions" => Own,
        "list_resource_activity" => Empty("activity"),
        "get_activity"
        | "revoke_api_key"
        | "rotate_api_key"
        | "list_batch_run_runs"
        | "get_batch_run"
        | "cancel_batch_run"
        | "list_batch_run_tests"
        | "create_batch"
        | "get_batch"
        | "replace_batch"
        | "delete_batch"
        | "run_batch"
        | "create_channel"
        | "get_channel"
        | "update_channel"
        | "delete_channel"
        | "run_channel"
        | "create_integration"
        | "get_integration"
        | "update_integration"
        | "delete_integration"
        | "list_integration_phone_numbers"
        | "create_persona"
        | "get_persona"
        | "update_persona"
        | "delete_persona"
        | "get_project"
        | "replace_project"
        | "delete_project"
        | "take_over_project_billing"
        | "list_project_members"
        | "add_project_member"
        | "update_project_member"
        | "remove_project_member"
        | "list_webhook_deliveries"
        | "create_review"
        | "create_calibration"
        | "get_calibration"
        | "close_calibration"
        | "delete_review"
        | "create_scenario"
        | "get_scenario"
        | "replace_scenario"
        | "delete_scenario"
        | "get_test_result_by_call"
        | "get_test_result"
        | "create_test"
        | "get_test"
        | "update_test"
        | "delete_test"
        | "list_test_results"
        | "run_test"
        | "get_transaction" => Theirs,
        _ => return None,
    })
}

/// A's resources, by what names them.
struct Ids {
    /// The same, as a body refers to them.
    refs: Refs,
    judge: String,
    /// The id for `{id}` under each collection path (`/tests`,
    /// `/reviews/calibration`, …).
    by_collection: BTreeMap<&'static str, String>,
    project: String,
    test: String,
    channel: String,
    scenario: String,
    persona: String,
    batch: String,
    batch_run: String,
    run: String,
    result: String,
    call: String,
    calibration: String,
    user: String,
    b_email: String,
}

impl Ids {
    /// Every id of A's, for the check that a body names none of them.
    fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self.by_collection.values().cloned().collect();
        all.extend([self.run.clone(), self.call.clone(), self.user.clone(), self.judge.clone()]);
        all
    }
}

/// A minimal valid body for each operation that takes one, aimed at A's
/// data (B adding themselves to A's project as its owner, …).
fn body(operation_id: &str, ids: &Ids) -> Option<Value> {
    let (p, test, ch, scn) = (&ids.project, &ids.test, &ids.channel, &ids.scenario);
    let scenario = json!({"name": "taken", "mode": "scripted", "first_message": "Hi",
                          "steps": [{"say": "Bye", "expect": []}], "default_persona_id": ids.persona});
    let with_project = |mut v: Value| {
        v["project_id"] = json!(p);
        v
    };
    Some(match operation_id {
        "create_api_key" => json!({"label": "bravo"}),
        "rotate_api_key" | "run_batch" | "run_test" => json!({}),
        "run_channel" => json!({"test_ids": [test]}),
        "create_batch" => json!({"project_id": p, "name": "taken", "test_ids": [test]}),
        "replace_batch" => json!({"name": "taken", "test_ids": [test]}),
        "create_channel" => json!({"project_id": p, "name": "taken", "kind": "http",
                                   "target": "https://agent.example.com/turn"}),
        "create_integration" => json!({"project_id": p, "provider": "openai_compatible", "name": "taken",
                                       "config": {"base_url": "https://llm.example.com/v1", "model": "m"}}),
        "update_channel" | "update_integration" | "update_persona" | "update_test" => json!({"name": "taken"}),
        "create_persona" => json!({"project_id": p, "name": "taken"}),
        "create_project" | "replace_project" => json!({"name": "taken"}),
        "add_project_member" => json!({"email": ids.b_email, "role": "owner"}),
        "update_project_member" => json!({"role": "viewer"}),
        "create_review" => json!({"test_result_id": ids.result, "verdict": "fail"}),
        "create_calibration" => json!({"project_id": p, "test_result_ids": [ids.result], "reviewer_ids": [ids.user]}),
        "create_scenario" => with_project(scenario),
        "replace_scenario" => scenario,
        "create_test" => json!({"project_id": p, "name": "taken", "channel_id": ch, "scenario_id": scn}),
        _ => return None,
    })
}

/// The id each query filter names, for the list operations.
fn filter_value<'a>(name: &str, ids: &'a Ids) -> Option<&'a str> {
    Some(match name {
        "project_id" => &ids.project,
        "batch_id" => &ids.batch,
        "channel_id" => &ids.channel,
        "scenario_id" => &ids.scenario,
        "test_result_id" => &ids.result,
        "calibration_id" => &ids.calibration,
        "reviewer_id" => &ids.user,
        "batch_run_id" => &ids.batch_run,
        _ => return None,
    })
}

impl Operation {
    fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// `/v1` + the path with its parameters filled with A's ids: `{id}` by
    /// the collection it is under.
    fn path_for(&self, ids: &Ids) -> String {
        let mut out = String::from("/v1");
        let mut rest = self.path.as_str();
        while let Some(start) = rest.find('{') {
            let end = rest[start..].find('}').unwrap() + start;
            let name = &rest[start + 1..end];
            let before = &rest[..start];
            out.push_str(before);
            let collection = out.trim_start_matches("/v1").trim_end_matches('/').to_string();
            let value = match name {
                "id" | "batchId" => ids
                    .by_collection
                    .get(collection.as_str())
                    .unwrap_or_else(|| panic!("{}: no id of A's under {collection}", self.id))
                    .clone(),
                "userId" => ids.user.clone(),
                "callId" => ids.call.clone(),
                "resourceType" => "test".to_string(),
                "resourceId" => ids.test.clone(),
                other => panic!("{}: no value for the path parameter {other}", self.id),
            };
            out.push_str(&value);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }
}

fn replace_all(text: &str, pairs: &[(String, String)]) -> String {
    pairs.iter().fold(text.to_string(), |t, (from, to)| t.replace(from.as_str(), to.as_str()))
}

/// `(status, body)` of a request, the body as text.
async fn send(s: &TestServer, key: &str, method: &Method, path: &str, body: Option<&Value>) -> (u16, String) {
    let resp = s.send_json(method.clone(), path, key, body.cloned()).await;
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// Everything A can read of their data through the spec's reads, volatile
/// fields (`last_used_at`, queue stats) left out: equal before and after
/// what B sent means nothing B sent was applied.
async fn snapshot(s: &TestServer, a: &str, ops: &[Operation], ids: &Ids) -> BTreeMap<String, Value> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("last_used_at");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut all = BTreeMap::new();
    for op in ops.iter().filter(|o| o.method == Method::GET && o.id != "get_queue_stats") {
        let mut paths = vec![op.path_for(ids)];
        if op.query.iter().any(|q| q == "project_id") {
            paths.push(format!("{}?project_id={}", paths[0], ids.project));
        }
        for path in paths {
            let (status, text) = send(s, a, &Method::GET, &path, None).await;
            let mut v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            strip(&mut v);
            if let Value::Object(m) = &mut v {
                m.remove("request_id");
            }
            all.insert(path, json!({"status": status, "body": v}));
        }
    }
    all
}

fn diff(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) -> Vec<String> {
    before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}:\n  before {v}\n  after  {}", after.get(k).cloned().unwrap_or_default()))
        .collect()
}

/// Checks one answer B got: `Err` says what is wrong.
fn check_refused(status: u16, text: &str, want_status: u16, want_code: &str) -> Result<(), String> {
    if status != want_status {
        return Err(format!("{status} (want {want_status}): {text}"));
    }
    let body: Value = serde_json::from_str(text).map_err(|_| format!("not JSON: {text}"))?;
    for field in ["error_code", "message", "request_id"] {
        if !body[field].is_string() {
            return Err(format!("the error body lacks {field}: {text}"));
        }
    }
    if body["error_code"] != want_code {
        return Err(format!("error_code {} (want {want_code}): {text}", body["error_code"]));
    }
    Ok(())
}

/// `(error_code, message)` of an error body with the ids of `pairs` put back.
fn error_words(text: &str, pairs: &[(String, String)]) -> Value {
    let body: Value = serde_json::from_str(text).unwrap_or_default();
    json!([body["error_code"], replace_all(body["message"].as_str().unwrap_or_default(), pairs)])
}

/// A's data, made through the API: a project with a webhook and one of
/// every kind of resource, a batch run's conversation against the
/// reference agent with its result, a review and a calibration of it.
async fn make_a(s: &TestServer, a: &str, agent: &Agent, hook: &Recorder, b_email: &str) -> Ids {
    let p = s.create_project(a, &format!("{MARK} project")).await;
    let hook_body = json!({"name": format!("{MARK} project"), "webhook_url": format!("{}/hook", hook.base),
                           "webhook_secret": "whsec_alpha"});
    s.expect(Method::PUT, &format!("/v1/projects/{p}"), a, Some(hook_body), 200).await;
    let integration = create(
        s,
        a,
        "/v1/integrations",
        json!({"project_id": p, "provider": "twilio", "name": format!("{MARK} line"),
               "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
               "phone_numbers": [{"number": "+14155550100", "label": "main", "direction": "both"}]}),
    )
    .await;
    let judge = create(
        s,
        a,
        "/v1/integrations",
        json!({"project_id": p, "provider": "openai_compatible", "name": format!("{MARK} judge"),
               "config": {"base_url": "https://llm.example.com/v1", "model": "m"}}),
    )
    .await;
    let persona = create(s, a, "/v1/personas", json!({"project_id": p, "name": format!("{MARK} Dana")})).await;
    let scenario = create(
        s,
        a,
        "/v1/scenarios",
        json!({"project_id": p, "name": format!("{MARK} booking"), "mode": "scripted", "default_persona_id": persona,
               "first_message": "Hi, I'd like to book an appointment.",
               "steps": [{"say": "Tuesday at 3 pm, please.",
                          "expect": [{"type": "contains", "name": "confirms", "text": "confirmed"}]},
                         {"say": "That's all, goodbye.", "expect": []}],
               "max_duration_s": 60}),
    )
    .await;
    let ch = channel(s, a, &p, "http", &agent.http_target()).await;
    let test = create(
        s,
        a,
        "/v1/tests",
        json!({"project_id": p, "name": format!("{MARK} books"), "channel_id": ch, "scenario_id": scenario}),
    )
    .await;
    let batch =
        create(s, a, "/v1/batches", json!({"project_id": p, "name": format!("{MARK} nightly"), "test_ids": [test]}))
            .await;
    let started = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), a, Some(json!({})), 200).await;
    let batch_run = started["id"].as_str().unwrap().to_string();
    let done = wait_for_end(s, a, &batch_run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let runs = s.expect(Method::GET, &format!("/v1/batch-runs/{batch_run}/runs"), a, None, 200).await;
    let run = runs["runs"][0]["id"].as_str().unwrap().to_string();
    let results = s.expect(Method::GET, &format!("/v1/tests/{test}/results"), a, None, 200).await;
    let result = results["test_results"][0]["id"].as_str().unwrap().to_string();
    let call = results["test_results"][0]["call_id"].as_str().unwrap().to_string();
    let members = s.expect(Method::GET, &format!("/v1/projects/{p}/members"), a, None, 200).await;
    let user = members["members"][0]["user_id"].as_str().unwrap().to_string();
    let review = create(s, a, "/v1/reviews", json!({"test_result_id": result, "verdict": "pass"})).await;
    let calibration = create(
        s,
        a,
        "/v1/reviews/calibration",
        json!({"project_id": p, "test_result_ids": [result], "reviewer_ids": [user]}),
    )
    .await;
    // The webhook delivery of the batch run, delivered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), a, None, 200).await;
        if list["webhook_deliveries"][0]["status"] == "delivered" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not delivered: {list:#}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let first = |v: Value, field: &str| v[field][0]["id"].as_str().unwrap().to_string();
    let key = first(s.expect(Method::GET, "/v1/api-keys", a, None, 200).await, "keys");
    let activity =
        first(s.expect(Method::GET, &format!("/v1/activity?project_id={p}"), a, None, 200).await, "activity");
    let transaction = first(s.expect(Method::GET, "/v1/transactions", a, None, 200).await, "transactions");
    let by_collection = BTreeMap::from([
        ("/activity", activity),
        ("/api-keys", key),
        ("/batch-runs", batch_run.clone()),
        ("/batches", batch.clone()),
        ("/channels", ch.clone()),
        ("/integrations", integration.clone()),
        ("/personas", persona.clone()),
        ("/projects", p.clone()),
        ("/reviews/calibration", calibration.clone()),
        ("/reviews", review.clone()),
        ("/scenarios", scenario.clone()),
        ("/test-results", result.clone()),
        ("/tests", test.clone()),
        ("/transactions", transaction),
    ]);
    let refs = Refs {
        persona: persona.clone(),
        scenario: scenario.clone(),
        channel: ch.clone(),
        test: test.clone(),
        result: result.clone(),
        batch_run: batch_run.clone(),
        judge: judge.clone(),
        phone: integration,
        user: user.clone(),
    };
    Ids {
        refs,
        judge,
        by_collection,
        project: p,
        test,
        channel: ch,
        scenario,
        persona,
        batch,
        batch_run,
        run,
        result,
        call,
        calibration,
        user,
        b_email: b_email.to_string(),
    }
}

/// The requests B sends for one operation: the operation with A's ids in
/// its path and body, and, for a list, once more per id filter it has.
fn requests(op: &Operation, ids: &Ids) -> Vec<(String, Option<Value>)> {
    let path = op.path_for(ids);
    let body = if op.has_body {
        Some(body(&op.id, ids).unwrap_or_else(|| panic!("{}: no body in this file's table", op.id)))
    } else {
        None
    };
    let mut all = vec![(path.clone(), body)];
    if op.method == Method::GET {
        for q in &op.query {
            if let Some(value) = filter_value(q, ids) {
                all.push((format!("{path}?{q}={value}"), None));
            }
        }
    }
    all
}

/// A page of nothing: `{<field>: [], next_cursor: null}`.
fn is_empty_page(text: &str) -> bool {
    let v: Value = serde_json::from_str(text).unwrap_or_default();
    let Some(m) = v.as_object() else { return false };
    m.get("next_cursor") == Some(&Value::Null)
        && m.iter().filter(|(k, _)| *k != "next_cursor").all(|(_, v)| v.as_array().is_some_and(Vec::is_empty))
}

/// What a request body may refer to: A's, B's own, or ids that do not exist.
#[derive(Clone, Debug)]
struct Refs {
    persona: String,
    scenario: String,
    channel: String,
    test: String,
    result: String,
    batch_run: String,
    /// An `openai_compatible` integration (an LLM judge, a simulated caller).
    judge: String,
    /// A telephony integration.
    phone: String,
    user: String,
}

impl Refs {
    fn fake(&self) -> Refs {
        Refs {
            persona: fake(&self.persona),
            scenario: fake(&self.scenario),
            channel: fake(&self.channel),
            test: fake(&self.test),
            result: fake(&self.result),
            batch_run: fake(&self.batch_run),
            judge: fake(&self.judge),
            phone: fake(&self.phone),
            user: fake(&self.user),
        }
    }
}

/// B's own project and what is in it.
struct Own {
    project: String,
    scenario: String,
    channel: String,
    /// A `phone` channel, through B's telephony integration.
    phone_channel: String,
    test: String,
    batch: String,
    result: String,
    user: String,
}

/// The writes in B's own project that refer to other resources, each
/// referring to `r`'s: with B's own they succeed; with A's they must be
/// refused exactly as with ids that do not exist (a reference in a body is
/// 400 `invalid_<field>`, "not a resource of this project", see
/// `access::require_reference`).
fn cross_references(o: &Own, r: &Refs) -> Vec<(&'static str, Method, String, Value)> {
    let bp = &o.project;
    let judge = json!([{"type": "llm_judge", "name": "judged", "integration_id": r.judge, "prompt": "Booked?"}]);
    let test = |extra: Value| {
        let mut v = json!({"project_id": bp, "name": "cross", "channel_id": o.channel, "scenario_id": o.scenario});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    let scripted = |extra: Value| {
        let mut v = json!({"project_id": bp, "name": "cross", "mode": "scripted", "first_message": "Hi",
                           "steps": [{"say": "Bye", "expect": []}]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    let replace = |extra: Value| {
        let mut v = scripted(extra);
        v.as_object_mut().unwrap().remove("project_id");
        v
    };
    let calibration = |extra: Value| {
        let mut v = json!({"project_id": bp, "reviewer_ids": [o.user]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    };
    let (tests, batches, channels, scenarios) = ("/v1/tests", "/v1/batches", "/v1/channels", "/v1/scenarios");
    vec![
        (
            "create_batch",
            Method::POST,
            batches.into(),
            json!({"project_id": bp, "name": "cross", "test_ids": [r.test]}),
        ),
        (
            "replace_batch",
            Method::PUT,
            format!("{batches}/{}", o.batch),
            json!({"name": "cross", "test_ids": [r.test]}),
        ),
        ("run_channel", Method::POST, format!("{channels}/{}/run", o.channel), json!({"test_ids": [r.test]})),
        (
            "create_channel",
            Method::POST,
            channels.into(),
            json!({"project_id": bp, "name": "cross", "kind": "phone", "target": "+14155550101",
                "integration_id": r.phone}),
        ),
        (
            "update_channel",
            Method::PATCH,
            format!("{channels}/{}", o.phone_channel),
            json!({"integration_id": r.phone}),
        ),
        ("create_test", Method::POST, tests.into(), test(json!({"channel_id": r.channel}))),
        ("create_test", Method::POST, tests.into(), test(json!({"scenario_id": r.scenario}))),
        ("create_test", Method::POST, tests.into(), test(json!({"persona_ids": [r.persona]}))),
        ("create_test", Method::POST, tests.into(), test(json!({"evaluators": judge}))),
        ("update_test", Method::PATCH, format!("{tests}/{}", o.test), json!({"channel_id": r.channel})),
        ("update_test", Method::PATCH, format!("{tests}/{}", o.test), json!({"scenario_id": r.scenario})),
        ("update_test", Method::PATCH, format!("{tests}/{}", o.test), json!({"persona_ids": [r.persona]})),
        ("update_test", Method::PATCH, format!("{tests}/{}", o.test), json!({"evaluators": judge})),
        ("create_scenario", Method::POST, scenarios.into(), scripted(json!({"default_persona_id": r.persona}))),
        ("create_scenario", Method::POST, scenarios.into(), scripted(json!({"success_criteria": judge}))),
        (
            "create_scenario",
            Method::POST,
            scenarios.into(),
            scripted(json!({"steps": [{"say": "Bye", "expect": judge}]})),
        ),
        (
            "create_scenario",
            Method::POST,
            scenarios.into(),
            json!({"project_id": bp, "name": "cross", "mode": "simulated", "goal": "book", "integration_id": r.judge}),
        ),
        (
            "replace_scenario",
            Method::PUT,
            format!("{scenarios}/{}", o.scenario),
            replace(json!({"default_persona_id": r.persona})),
        ),
        (
            "create_calibration",
            Method::POST,
            "/v1/reviews/calibration".into(),
            calibration(json!({"test_result_ids": [r.result]})),
        ),
        (
            "create_calibration",
            Method::POST,
            "/v1/reviews/calibration".into(),
            calibration(json!({"sample": {"batch_run_id": r.batch_run, "size": 1, "seed": 1}})),
        ),
        (
            "create_calibration",
            Method::POST,
            "/v1/reviews/calibration".into(),
            calibration(json!({"sample": {"test_id": r.test, "size": 1, "seed": 1}})),
        ),
        // A reviewer who is not a member of B's project: refused, the same
        // for A as for a user who does not exist.
        (
            "create_calibration",
            Method::POST,
            "/v1/reviews/calibration".into(),
            json!({"project_id": bp, "test_result_ids": [o.result], "reviewer_ids": [r.user]}),
        ),
    ]
}

/// B's own project, with one of each resource and a result.
async fn make_own(s: &TestServer, b: &str, agent: &Agent) -> (Own, Refs) {
    let p = s.create_project(b, "bravo project").await;
    let llm = json!({"project_id": p, "provider": "openai_compatible", "name": "judge",
                     "config": {"base_url": "https://llm.example.com/v1", "model": "m"}});
    let judge = create(s, b, "/v1/integrations", llm).await;
    let phone = create(
        s,
        b,
        "/v1/integrations",
        json!({"project_id": p, "provider": "twilio", "name": "line",
               "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"}}),
    )
    .await;
    let persona = create(s, b, "/v1/personas", json!({"project_id": p, "name": "Bo"})).await;
    let scenario = create(
        s,
        b,
        "/v1/scenarios",
        json!({"project_id": p, "name": "bye", "mode": "scripted", "first_message": "Hi", "default_persona_id": persona,
               "steps": [{"say": "That's all, goodbye.", "expect": []}]}),
    )
    .await;
    let ch = channel(s, b, &p, "http", &agent.http_target()).await;
    let test =
        create(s, b, "/v1/tests", json!({"project_id": p, "name": "t", "channel_id": ch, "scenario_id": scenario}))
            .await;
    let batch = create(s, b, "/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [test]})).await;
    let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), b, Some(json!({})), 200).await;
    let batch_run = started["id"].as_str().unwrap().to_string();
    let done = wait_for_end(s, b, &batch_run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let results = s.expect(Method::GET, &format!("/v1/tests/{test}/results"), b, None, 200).await;
    let result = results["test_results"][0]["id"].as_str().unwrap().to_string();
    let members = s.expect(Method::GET, &format!("/v1/projects/{p}/members"), b, None, 200).await;
    let user = members["members"][0]["user_id"].as_str().unwrap().to_string();
    let refs = Refs {
        persona: persona.clone(),
        scenario: scenario.clone(),
        channel: ch.clone(),
        test: test.clone(),
        result: result.clone(),
        batch_run,
        judge,
        phone,
        user: user.clone(),
    };
    let phone_channel = create(
        s,
        b,
        "/v1/channels",
        json!({"project_id": p, "name": "line", "kind": "phone", "target": "+14155550102", "integration_id": refs.phone}),
    )
    .await;
    (Own { project: p, scenario, channel: ch, phone_channel, test, batch, result, user }, refs)
}

/// B, not a member of A's project, sends every operation of the spec with
/// A's ids: what B gets wrong, and how many requests were sent.
async fn walk_as_outsider(s: &TestServer, b: &str, ops: &[Operation], ids: &Ids, who: &str) -> (Vec<String>, usize) {
    let a_ids = ids.all();
    let to_fake: Vec<(String, String)> = a_ids.iter().map(|id| (id.clone(), fake(id))).collect();
    let from_fake: Vec<(String, String)> = to_fake.iter().map(|(a, f)| (f.clone(), a.clone())).collect();
    // Names nothing of A's but what the request named.
    let names_nothing_of_a = |text: &str, sent: &str| names_nothing_of(&a_ids, text, sent);
    let mut failures = Vec::new();
    let mut walked = 0;
    for op in ops {
        let scope = scope(&op.id).unwrap();
        for (path, body) in requests(op, ids) {
            walked += 1;
            let what = format!("{} {path} ({}) {who}", op.method, op.id);
            let sent = format!("{path} {}", body.clone().unwrap_or_default());
            let (status, text) = send(s, b, &op.method, &path, body.as_ref()).await;
            let filtered = path.contains('?');
            let outcome = match (scope, filtered) {
                (Scope::Theirs, _) | (Scope::Own, true) if filtered && status == 200 => {
                    // A list of B's own, filtered by A's id: an empty page.
                    if is_empty_page(&text) {
                        Ok(())
                    } else {
                        Err(format!("not an empty page: {text}"))
                    }
                }
                (Scope::Theirs, _) | (Scope::Own, true) => check_refused(status, &text, 404, "not_found"),
                (Scope::Own, false) => {
                    if (200..300).contains(&status) {
                        Ok(())
                    } else {
                        Err(format!("{status} for the caller's own: {text}"))
                    }
                }
                (Scope::Empty(field), _) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    if status == 200 && v[field] == json!([]) {
                        Ok(())
                    } else {
                        Err(format!("{status}, not an empty list: {text}"))
                    }
                }
            };
            let mut outcome = outcome.and_then(|()| names_nothing_of_a(&text, &sent));
            // Answered exactly as for ids that do not exist.
            let fake_path = replace_all(&path, &to_fake);
            let fake_body =
                body.as_ref().map(|b| serde_json::from_str::<Value>(&replace_all(&b.to_string(), &to_fake)).unwrap());
            if outcome.is_ok() && (filtered || scope != Scope::Own) && (fake_path != path || fake_body != body) {
                let (fake_status, fake_text) = send(s, b, &op.method, &fake_path, fake_body.as_ref()).await;
                let same = fake_status == status
                    && (status == 200 || error_words(&fake_text, &from_fake) == error_words(&text, &[]));
                if !same {
                    outcome =
                        Err(format!("answered unlike for ids that do not exist ({fake_status} {fake_text}): {text}"));
                }
            }
            if let Err(e) = outcome {
                failures.push(format!("{what}: {e}"));
            }
        }
    }
    (failures, walked)
}

/// Names nothing of A's but what the request (`sent`) named.
fn names_nothing_of(a_ids: &[String], text: &str, sent: &str) -> Result<(), String> {
    if text.to_lowercase().contains(MARK) {
        return Err(format!("names A's data: {text}"));
    }
    match a_ids.iter().find(|id| text.contains(id.as_str()) && !sent.contains(id.as_str())) {
        Some(id) => Err(format!("names A's {id}: {text}")),
        None => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_reaches_nothing_of_a_project_through_any_operation() {
    let ops = operations();
    let uncovered: Vec<&str> = ops.iter().filter(|o| scope(&o.id).is_none()).map(|o| o.id.as_str()).collect();
    assert!(uncovered.is_empty(), "operations of the spec not in this file's table: {uncovered:?}");

    let agent = Agent::start(&[]);
    let hook = Recorder::start(|_, _| (200, "{}".into())).await;
    let s = TestServer::start().await;
    let a = s.key_for_user(&format!("{MARK}-owner@example.com")).await;
    let b_email = "bravo@example.com".to_string();
    let b = s.key_for_user(&b_email).await;
    let ids = make_a(&s, &a, &agent, &hook, &b_email).await;

    let a_ids = ids.all();
    let to_fake: Vec<(String, String)> = a_ids.iter().map(|id| (id.clone(), fake(id))).collect();
    let from_fake: Vec<(String, String)> = to_fake.iter().map(|(a, f)| (f.clone(), a.clone())).collect();
    let names_nothing_of_a = |text: &str, sent: &str| names_nothing_of(&a_ids, text, sent);

    let before = snapshot(&s, &a, &ops, &ids).await;
    let (mut failures, walked) = walk_as_outsider(&s, &b, &ops, &ids, "as a non-member").await;
    let after = snapshot(&s, &a, &ops, &ids).await;
    let changed = diff(&before, &after);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(changed.is_empty(), "what B sent changed A's data:\n{}", changed.join("\n"));
    assert!(walked > ops.len(), "{walked} requests for {} operations", ops.len());

    // B's own project, its writes referring to A's resources: refused as
    // for ids that do not exist, where the same write referring to B's own
    // succeeds.
    let (own, own_refs) = make_own(&s, &b, &agent).await;
    let before = snapshot(&s, &a, &ops, &ids).await;
    let theirs = cross_references(&own, &ids.refs);
    let nowhere = cross_references(&own, &ids.refs.fake());
    let control = cross_references(&own, &own_refs);
    for (((op, method, path, body), (_, _, _, fake_body)), (_, _, _, own_body)) in
        theirs.iter().zip(&nowhere).zip(&control)
    {
        let what = format!("{method} {path} ({op}) with {body}");
        let (status, text) = send(&s, &b, method, path, Some(own_body)).await;
        if !(200..300).contains(&status) {
            failures.push(format!("{what}: B's own reference refused, so the case proves nothing: {status} {text}"));
            continue;
        }
        if *op == "create_calibration" {
            // Its results may be in one open calibration at a time.
            let made: Value = serde_json::from_str(&text).unwrap();
            let close = format!("/v1/reviews/calibration/{}/close", made["id"].as_str().unwrap());
            s.expect(Method::POST, &close, &b, None, 200).await;
        }
        let (status, text) = send(&s, &b, method, path, Some(body)).await;
        let (fake_status, fake_text) = send(&s, &b, method, path, Some(fake_body)).await;
        let sent = body.to_string();
        let code: Value = serde_json::from_str::<Value>(&text).unwrap_or_default()["error_code"].clone();
        let outcome = match (status, code.as_str()) {
            (400, Some(code)) if code.starts_with("invalid_") => check_refused(status, &text, 400, code),
            (404, _) => check_refused(status, &text, 404, "not_found"),
            _ => Err(format!("{status}, not refused as a reference that is not there: {text}")),
        };
        let outcome = outcome.and_then(|()| names_nothing_of_a(&text, &sent)).and_then(|()| {
            if fake_status == status && error_words(&fake_text, &from_fake) == error_words(&text, &[]) {
                Ok(())
            } else {
                Err(format!("answered unlike for ids that do not exist ({fake_status} {fake_text}): {status} {text}"))
            }
        });
        if let Err(e) = outcome {
            failures.push(format!("{what}: {e}"));
        }
    }
    let after = snapshot(&s, &a, &ops, &ids).await;
    let changed = diff(&before, &after);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(changed.is_empty(), "what B sent in B's project changed A's data:\n{}", changed.join("\n"));

    // B a viewer of A's project: every change refused (the documented 403,
    // or 404 for what is A's alone), and nothing changed.
    s.expect(
        Method::POST,
        &format!("/v1/projects/{}/members", ids.project),
        &a,
        Some(json!({"email": b_email, "role": "viewer"})),
        200,
    )
    .await;
    // Reads: everything in the project, but the webhook deliveries (owners
    // and editors only) and what is A's alone (A's ledger).
    for op in ops.iter().filter(|o| !o.is_write() && scope(&o.id) == Some(Scope::Theirs)) {
        let path = op.path_for(&ids);
        let (status, text) = send(&s, &b, &op.method, &path, None).await;
        let outcome = match op.id.as_str() {
            "list_webhook_deliveries" => check_refused(status, &text, 403, "forbidden"),
            "get_transaction" => check_refused(status, &text, 404, "not_found"),
            _ if status == 200 => Ok(()),
            _ => Err(format!("{status}: {text}")),
        };
        if let Err(e) = outcome {
            failures.push(format!("GET {path} ({}) as a viewer: {e}", op.id));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    let before = snapshot(&s, &a, &ops, &ids).await;
    let changes = walk_changes(&s, &b, &ops, &ids, "viewer", &mut failures).await;
    let after = snapshot(&s, &a, &ops, &ids).await;
    let changed = diff(&before, &after);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(changed.is_empty(), "what B sent as a viewer changed A's data:\n{}", changed.join("\n"));
    assert!(changes >= 30, "{changes} changes walked");

    // B a reviewer: the same, but for reviewing (which is theirs to do).
    let b_user = own_refs.user.clone();
    let member = format!("/v1/projects/{}/members/{b_user}", ids.project);
    s.expect(Method::PATCH, &member, &a, Some(json!({"role": "reviewer"})), 200).await;
    let before = snapshot(&s, &a, &ops, &ids).await;
    walk_changes(&s, &b, &ops, &ids, "reviewer", &mut failures).await;
    let after = snapshot(&s, &a, &ops, &ids).await;
    let changed = diff(&before, &after);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(changed.is_empty(), "what B sent as a reviewer changed A's data:\n{}", changed.join("\n"));

    // B removed: a non-member again, at once, though B has just read all of
    // it; and none of A's activity records, B's membership's included.
    s.expect(Method::DELETE, &member, &a, None, 200).await;
    let before = snapshot(&s, &a, &ops, &ids).await;
    let (mut failures, _) = walk_as_outsider(&s, &b, &ops, &ids, "as a removed member").await;
    let records = common::items_of_pages(&s, &a, "/v1/activity", "activity").await;
    assert!(records.len() >= 10, "A's activity: {records:#?}");
    for record in &records {
        let id = record["id"].as_str().unwrap();
        let (status, text) = send(&s, &b, &Method::GET, &format!("/v1/activity/{id}"), None).await;
        if let Err(e) = check_refused(status, &text, 404, "not_found") {
            failures.push(format!("GET /v1/activity/{id} ({}) as a removed member: {e}", record["action"]));
        }
        let about = format!(
            "/v1/activity/resource/{}/{}",
            record["resource_type"].as_str().unwrap(),
            record["resource_id"].as_str().unwrap()
        );
        let (status, text) = send(&s, &b, &Method::GET, &about, None).await;
        if status != 200 || !is_empty_page(&text) {
            failures.push(format!("GET {about} as a removed member: {status} {text}"));
        }
    }
    let after = snapshot(&s, &a, &ops, &ids).await;
    let changed = diff(&before, &after);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(changed.is_empty(), "what B sent once removed changed A's data:\n{}", changed.join("\n"));
}

/// B, a `role` (viewer, reviewer) of A's project, sends every change of the
/// spec to A's data: each refused with the documented 403 `forbidden`, or
/// 404 for what is A's alone (A's API keys). Returns how many were sent.
async fn walk_changes(
    s: &TestServer,
    b: &str,
    ops: &[Operation],
    ids: &Ids,
    role: &str,
    failures: &mut Vec<String>,
) -> usize {
    let mut changes = 0;
    for op in ops.iter().filter(|o| o.is_write() && scope(&o.id) == Some(Scope::Theirs)) {
        if role == "reviewer" && op.id == "create_review" {
            continue;
        }
        for (path, body) in requests(op, ids) {
            changes += 1;
            let (status, text) = send(s, b, &op.method, &path, body.as_ref()).await;
            let outcome = if op.statuses.iter().any(|s| s == "403") {
                check_refused(status, &text, 403, "forbidden")
            } else {
                check_refused(status, &text, 404, "not_found")
            };
            if let Err(e) = outcome {
                failures.push(format!("{} {path} ({}) as a {role}: {e}", op.method, op.id));
            }
        }
    }
    changes
}
