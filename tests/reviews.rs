//! Human review and calibration (DESIGN §6), end to end: a real server, real
//! SQLite, results of real conversations with the reference agent
//! (`sparring agent`, and `--bug wrong-day` for results that fail for a real
//! reason), and people labelling them through the API.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::engine::{all_pages, channel, create, wait_for_end, Agent};
use common::{error_body, Team, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// The two evaluators of the booking scenario, in result order.
const CONFIRMS: &str = "step 1: confirms";
const RIGHT_DAY: &str = "step 1: right day";

/// Books Tuesday at 3 pm. Against the real agent both evaluators pass;
/// against `--bug wrong-day` it confirms Wednesday: "confirms" passes and
/// "right day" fails, so the result fails.
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
            {"say": "That's all, goodbye.", "expect": []}
        ],
        "max_duration_s": 60
    })
}

/// The results of one batch run in a project: one test against the real
/// agent (`good` iterations), one against the wrong-day agent (`bad`).
struct Ran {
    batch_run_id: String,
    passing_test: String,
    failing_test: String,
    /// As the owner sees them, by test.
    passed: Vec<Value>,
    failed: Vec<Value>,
}

async fn run_batch(s: &TestServer, t: &Team, good: &Agent, bad: &Agent, good_n: u32, bad_n: u32) -> Ran {
    let p = &t.project_id;
    let persona =
        create(s, &t.editor, "/v1/personas", json!({"project_id": p, "name": "Dana", "prompt": "A busy parent"})).await;
    let scenario = create(s, &t.editor, "/v1/scenarios", booking(p, &persona)).await;
    let good_channel = channel(s, &t.editor, p, "http", &good.http_target()).await;
    let bad_channel = channel(s, &t.editor, p, "http", &bad.http_target()).await;
    let passing_test = create(
        s,
        &t.editor,
        "/v1/tests",
        json!({"project_id": p, "name": "books", "channel_id": good_channel, "scenario_id": scenario,
               "iterations": good_n}),
    )
    .await;
    let failing_test = create(
        s,
        &t.editor,
        "/v1/tests",
        json!({"project_id": p, "name": "books the right day", "channel_id": bad_channel, "scenario_id": scenario,
               "iterations": bad_n}),
    )
    .await;
    let batch = create(
        s,
        &t.editor,
        "/v1/batches",
        json!({"project_id": p, "name": "nightly", "test_ids": [passing_test, failing_test]}),
    )
    .await;
    let started = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let batch_run_id = started["id"].as_str().unwrap().to_string();
    let done = wait_for_end(s, &t.owner, &batch_run_id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["counts"]["passed"], good_n, "{done:#}");
    assert_eq!(done["counts"]["failed"], bad_n, "{done:#}");
    let passed = all_pages(s, &t.owner, &format!("/v1/tests/{passing_test}/results"), "test_results").await;
    let failed = all_pages(s, &t.owner, &format!("/v1/tests/{failing_test}/results"), "test_results").await;
    // The automated labels every calculation below relies on.
    for r in &passed {
        assert_eq!(r["status"], "passed", "{r:#}");
        assert_eq!(evaluations(r), vec![(CONFIRMS.to_string(), true), (RIGHT_DAY.to_string(), true)], "{r:#}");
    }
    for r in &failed {
        assert_eq!(r["status"], "failed", "{r:#}");
        assert_eq!(evaluations(r), vec![(CONFIRMS.to_string(), true), (RIGHT_DAY.to_string(), false)], "{r:#}");
    }
    assert_eq!((passed.len(), failed.len()), (good_n as usize, bad_n as usize));
    Ran { batch_run_id, passing_test, failing_test, passed, failed }
}

/// `(name, passed)` of a result's automated evaluations, in order.
fn evaluations(result: &Value) -> Vec<(String, bool)> {
    result["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["passed"].as_bool().unwrap()))
        .collect()
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

fn ids(items: &Value) -> Vec<String> {
    items.as_array().unwrap().iter().map(id).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// The project's members as the owner sees them.
async fn members(s: &TestServer, t: &Team) -> Vec<Value> {
    all_pages(s, &t.owner, &format!("/v1/projects/{}/members", t.project_id), "members").await
}

/// The user id of the (only) member with `role`.
async fn user_with_role(s: &TestServer, t: &Team, role: &str) -> String {
    let all = members(s, t).await;
    let found: Vec<&Value> = all.iter().filter(|m| m["role"] == role).collect();
    assert_eq!(found.len(), 1, "one {role}: {all:#?}");
    found[0]["user_id"].as_str().unwrap().to_string()
}

/// A new user added to the team's project with `role`: `(key, user id)`.
async fn add_member(s: &TestServer, t: &Team, email: &str, role: &str) -> (String, String) {
    let key = s.key_for_user(email).await;
    s.expect(
        Method::POST,
        &format!("/v1/projects/{}/members", t.project_id),
        &t.owner,
        Some(json!({"email": email, "role": role})),
        200,
    )
    .await;
    let user = members(s, t).await.into_iter().find(|m| m["email"] == email).unwrap();
    (key, user["user_id"].as_str().unwrap().to_string())
}

fn verdict(passed: bool) -> &'static str {
    if passed {
        "pass"
    } else {
        "fail"
    }
}

fn review_body(result_id: &str, passed: bool, labels: &[(&str, bool)], notes: &str) -> Value {
    let labels: Vec<Value> = labels.iter().map(|(name, passed)| json!({"name": name, "passed": passed})).collect();
    json!({"test_result_id": result_id, "verdict": verdict(passed), "evaluations": labels, "notes": notes})
}

/// Reviews `result_id` as `key`, expecting success.
async fn review(s: &TestServer, key: &str, result_id: &str, passed: bool, labels: &[(&str, bool)]) -> Value {
    let got = s.expect(Method::POST, "/v1/reviews", key, Some(review_body(result_id, passed, labels, "")), 200).await;
    assert_eq!(got["test_result_id"], result_id);
    assert_eq!(got["verdict"], verdict(passed));
    got
}

/// Sends and expects an error body with `status`; returns the body.
async fn refused(s: &TestServer, method: Method, path: &str, key: &str, body: Option<Value>, status: u16) -> Value {
    let (got, e) = error_body(s.send_json(method.clone(), path, key, body).await).await;
    assert_eq!(got, status, "{method} {path}: {e}");
    e
}

async fn forbidden(s: &TestServer, method: Method, path: &str, key: &str, body: Option<Value>) {
    let e = refused(s, method, path, key, body, 403).await;
    assert_eq!(e["error_code"], "forbidden", "{e}");
}

fn calibration_by_ids(project_id: &str, results: &[&str], reviewers: &[&str]) -> Value {
    json!({"project_id": project_id, "test_result_ids": results, "reviewer_ids": reviewers})
}

fn calibration_by_sample(project_id: &str, sample: Value, reviewers: &[&str]) -> Value {
    json!({"project_id": project_id, "sample": sample, "reviewer_ids": reviewers})
}

async fn get_calibration(s: &TestServer, key: &str, id: &str) -> Value {
    s.expect(Method::GET, &format!("/v1/reviews/calibration/{id}"), key, None, 200).await
}

async fn close(s: &TestServer, key: &str, id: &str) -> Value {
    let closed = s.expect(Method::POST, &format!("/v1/reviews/calibration/{id}/close"), key, None, 200).await;
    assert_eq!(closed["status"], "complete", "{closed:#}");
    assert!(closed["closed_at"].is_string(), "{closed:#}");
    closed
}

async fn reviews(s: &TestServer, key: &str, query: &str) -> Vec<Value> {
    let path = if query.is_empty() { "/v1/reviews".to_string() } else { format!("/v1/reviews?{query}") };
    all_pages(s, key, &path, "reviews").await
}

/// (verdict, "confirms", "right day") per result.
type Labels = [(bool, bool, bool); 4];

/// `key` labels the first `upto` of `subjects` with `labels`; each review
/// counts toward `calibration`.
async fn label(
    s: &TestServer,
    key: &str,
    calibration: &str,
    subjects: [&str; 4],
    labels: Labels,
    upto: usize,
) -> Vec<Value> {
    let mut made = Vec::new();
    for (subject, (v, confirms, day)) in subjects.iter().zip(labels).take(upto) {
        let r = review(s, key, subject, v, &[(CONFIRMS, confirms), (RIGHT_DAY, day)]).await;
        assert_eq!(r["calibration_id"], calibration, "{r:#}");
        made.push(r);
    }
    made
}

async fn reviewers(s: &TestServer, key: &str, project_id: &str) -> Vec<Value> {
    all_pages(s, key, &format!("/v1/reviews/reviewers?project_id={project_id}"), "reviewers").await
}

fn find<'a>(items: &'a [Value], field: &str, value: &str) -> &'a Value {
    items.iter().find(|i| i[field] == value).unwrap_or_else(|| panic!("no {field} = {value} in {items:#?}"))
}

const METRICS: [&str; 5] =
    ["agreement_rate", "cohens_kappa", "fleiss_kappa", "true_positive_rate", "true_negative_rate"];

fn close_to(got: &Value, expected: f64, what: &str) {
    let g = got.as_f64().unwrap_or_else(|| panic!("{what}: expected {expected}, got {got}"));
    assert!((g - expected).abs() < 1e-9, "{what}: expected {expected}, got {g}");
}

/// `expected` in the order of [`METRICS`]; `None` = undefined, which is
/// null with a reason.
fn assert_metrics(got: &Value, expected: [Option<f64>; 5], what: &str) {
    for (name, want) in METRICS.iter().zip(expected) {
        match want {
            Some(x) => {
                close_to(&got[name], x, &format!("{what} {name}"));
                assert!(got["undefined_reasons"].get(name).is_none(), "{what}: {name} is defined: {got:#}");
            }
            None => {
                assert!(got[name].is_null(), "{what}: {name} should be undefined: {got:#}");
                let reason = got["undefined_reasons"][name].as_str();
                assert!(reason.is_some_and(|r| !r.trim().is_empty()), "{what}: a reason for {name}: {got:#}");
            }
        }
    }
}

/// What a blinded reviewer reads of a result of an open calibration.
fn assert_blind(r: &Value, calibration: &str) {
    assert!(r["status"].is_null(), "{r:#}");
    assert!(r["score"].is_null(), "{r:#}");
    assert!(r["failure_reason"].is_null(), "{r:#}");
    assert_eq!(r["evaluations"], json!([]), "{r:#}");
    assert_eq!(r["blinded"]["calibration_id"], calibration, "{r:#}");
    assert!(r["blinded"]["reason"].as_str().is_some_and(|s| !s.is_empty()), "{r:#}");
    assert_eq!(r["blinded"]["evaluator_names"], json!([CONFIRMS, RIGHT_DAY]), "{r:#}");
    // The conversation itself is what they label.
    assert!(!r["transcript"].as_array().unwrap().is_empty(), "{r:#}");
}

/// Batch run `id` (one run passed, one failed) as `key` sees it, by id, in
/// the list and as its batch's last run: how its runs ended hidden when
/// `blind_in` names the calibration that hides it, shown otherwise.
async fn assert_batch_run_blind(s: &TestServer, key: &str, id: &str, blind_in: Option<&str>) {
    let by_id = s.expect(Method::GET, &format!("/v1/batch-runs/{id}"), key, None, 200).await;
    let project = by_id["project_id"].as_str().unwrap();
    let listed = all_pages(s, key, &format!("/v1/batch-runs?project_id={project}"), "batch_runs").await;
    let listed = find(&listed, "id", id).clone();
    let batch_path = format!("/v1/batches/{}", by_id["batch_id"].as_str().unwrap());
    let last_run = s.expect(Method::GET, &batch_path, key, None, 200).await["last_run"].clone();
    assert_eq!(last_run["id"], id);
    for run in [&by_id, &listed] {
        let c = &run["counts"];
        assert_eq!(
            (&c["total"], &c["queued"], &c["running"], &c["cancelled"]),
            (&json!(2), &json!(0), &json!(0), &json!(0))
        );
        match blind_in {
            Some(calibration) => {
                assert_eq!((&c["passed"], &c["failed"], &c["errored"]), (&Value::Null, &Value::Null, &Value::Null));
                assert_eq!((&run["pass_rate"], &run["passed"]), (&Value::Null, &Value::Null), "{run:#}");
                assert_eq!(run["blinded"]["calibration_id"], calibration, "{run:#}");
                assert!(run["blinded"]["reason"].as_str().unwrap().contains(calibration), "{run:#}");
            }
            None => {
                assert_eq!((&c["passed"], &c["failed"], &c["errored"]), (&json!(1), &json!(1), &json!(0)));
                assert_eq!((&run["pass_rate"], &run["passed"]), (&json!(0.5), &json!(false)), "{run:#}");
                assert!(run["blinded"].is_null(), "{run:#}");
            }
        }
    }
    let rate = if blind_in.is_some() { Value::Null } else { json!(0.5) };
    assert_eq!(last_run["pass_rate"], rate, "{last_run:#}");

    // Per test: one passed, the other failed, with its result.
    let per_test = s.expect(Method::GET, &format!("/v1/batch-runs/{id}/tests"), key, None, 200).await;
    let tests = per_test["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 2, "{per_test:#}");
    for test in tests {
        let c = &test["counts"];
        assert_eq!((&c["total"], &c["cancelled"]), (&json!(1), &json!(0)), "{test:#}");
        match blind_in {
            Some(calibration) => {
                assert_eq!(per_test["blinded"]["calibration_id"], calibration, "{per_test:#}");
                assert_eq!((&c["passed"], &c["failed"], &c["errored"]), (&Value::Null, &Value::Null, &Value::Null));
                assert_eq!((&test["pass_rate"], &test["passed"]), (&Value::Null, &Value::Null), "{test:#}");
                assert_eq!(test["failures"], json!([]), "a failed result's id would give its verdict away");
            }
            None => {
                assert!(per_test["blinded"].is_null(), "{per_test:#}");
                let passed = test["passed"].as_bool().unwrap();
                assert_eq!(c["passed"], json!(u8::from(passed)), "{test:#}");
                assert_eq!(test["failures"].as_array().unwrap().len(), usize::from(!passed), "{test:#}");
            }
        }
    }
}

fn assert_sees_all(r: &Value, status: &str) {
    assert_eq!(r["status"], status, "{r:#}");
    assert!(r["score"].is_number(), "{r:#}");
    assert_eq!(r["evaluations"].as_array().unwrap().len(), 2, "{r:#}");
    assert!(r["blinded"].is_null(), "{r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_matrix_for_every_review_operation() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("review roles").await;
    let other = s.team("elsewhere").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (r0, r1) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;

    // POST /reviews: reviewers, editors and owners; not viewers (403) nor
    // outsiders (404).
    let mut by_role = BTreeMap::new();
    for (role, key) in t.all() {
        let body = Some(review_body(&r0, true, &[(CONFIRMS, true)], role));
        match role {
            "viewer" => forbidden(&s, Method::POST, "/v1/reviews", key, body).await,
            "outsider" => {
                refused(&s, Method::POST, "/v1/reviews", key, body, 404).await;
            }
            _ => {
                let made = s.expect(Method::POST, "/v1/reviews", key, body, 200).await;
                assert_eq!(made["notes"], role);
                assert_eq!(made["project_id"], p.as_str());
                assert!(made["calibration_id"].is_null(), "{made:#}");
                by_role.insert(role, id(&made));
            }
        }
    }
    assert_eq!(by_role.len(), 3);

    // GET /reviews: any member; an outsider naming the project gets 404, and
    // another project's member sees none of it unfiltered.
    for (role, key) in t.all() {
        let path = format!("/v1/reviews?project_id={p}");
        if role == "outsider" {
            refused(&s, Method::GET, &path, key, None, 404).await;
        } else {
            let listed = s.expect(Method::GET, &path, key, None, 200).await;
            assert_eq!(listed["reviews"].as_array().unwrap().len(), 3, "{role}: {listed:#}");
        }
    }
    for key in [&t.outsider, &other.owner] {
        let listed = s.expect(Method::GET, "/v1/reviews", key, None, 200).await;
        assert_eq!(listed["reviews"], json!([]), "{listed:#}");
    }

    // DELETE /reviews/{id}: only its author; another member 403, outsider 404.
    let reviewers_review = format!("/v1/reviews/{}", by_role["reviewer"]);
    refused(&s, Method::DELETE, &reviewers_review, &t.outsider, None, 404).await;
    for key in [&t.viewer, &t.editor, &t.owner] {
        forbidden(&s, Method::DELETE, &reviewers_review, key, None).await;
    }
    for (role, key) in [("reviewer", &t.reviewer), ("editor", &t.editor), ("owner", &t.owner)] {
        let gone = s.expect(Method::DELETE, &format!("/v1/reviews/{}", by_role[role]), key, None, 200).await;
        assert_eq!(gone, json!({"id": by_role[role], "deleted": true}));
    }
    assert_eq!(reviews(&s, &t.owner, &format!("project_id={p}")).await, Vec::<Value>::new());
    // Leave one review for the listings below.
    review(&s, &t.reviewer, &r0, true, &[]).await;

    // POST /reviews/calibration: editors and owners.
    let body = calibration_by_ids(p, &[&r0, &r1], &[&reviewer_id]);
    refused(&s, Method::POST, "/v1/reviews/calibration", &t.outsider, Some(body.clone()), 404).await;
    for key in [&t.viewer, &t.reviewer] {
        forbidden(&s, Method::POST, "/v1/reviews/calibration", key, Some(body.clone())).await;
    }
    let by_editor = s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body.clone()), 200).await;
    let c1 = id(&by_editor);
    assert_eq!(by_editor["status"], "open");

    // POST /reviews/calibration/{id}/close: editors and owners.
    let close_path = format!("/v1/reviews/calibration/{c1}/close");
    refused(&s, Method::POST, &close_path, &t.outsider, None, 404).await;
    for key in [&t.viewer, &t.reviewer] {
        forbidden(&s, Method::POST, &close_path, key, None).await;
    }
    assert_eq!(get_calibration(&s, &t.owner, &c1).await["status"], "open", "a refused close changes nothing");
    close(&s, &t.owner, &c1).await;
    let by_owner = s.expect(Method::POST, "/v1/reviews/calibration", &t.owner, Some(body), 200).await;
    let c2 = id(&by_owner);
    let closed = close(&s, &t.editor, &c2).await;
    // Closing a complete one: 200, unchanged.
    let again = close(&s, &t.owner, &c2).await;
    assert_eq!(again["closed_at"], closed["closed_at"]);

    // GET /reviews/calibration/{id} and the list: any member.
    for (role, key) in t.all() {
        let one = format!("/v1/reviews/calibration/{c1}");
        let list = format!("/v1/reviews/calibration?project_id={p}");
        if role == "outsider" {
            refused(&s, Method::GET, &one, key, None, 404).await;
            refused(&s, Method::GET, &list, key, None, 404).await;
        } else {
            assert_eq!(s.expect(Method::GET, &one, key, None, 200).await["id"], c1.as_str());
            let listed = s.expect(Method::GET, &list, key, None, 200).await;
            assert_eq!(ids(&listed["calibrations"]), [c2.clone(), c1.clone()], "{role}: newest first");
        }
    }
    refused(&s, Method::GET, &format!("/v1/reviews/calibration/{c1}"), &other.owner, None, 404).await;
    for key in [&t.outsider, &other.owner] {
        let listed = s.expect(Method::GET, "/v1/reviews/calibration", key, None, 200).await;
        assert_eq!(listed["calibrations"], json!([]), "{listed:#}");
    }

    // GET /reviews/reviewers: any member; viewers are not reviewers.
    let ours: BTreeSet<String> = members(&s, &t)
        .await
        .iter()
        .filter(|m| m["role"] != "viewer")
        .map(|m| m["user_id"].as_str().unwrap().to_string())
        .collect();
    for (role, key) in t.all() {
        let path = format!("/v1/reviews/reviewers?project_id={p}");
        if role == "outsider" {
            refused(&s, Method::GET, &path, key, None, 404).await;
        } else {
            let listed = s.expect(Method::GET, &path, key, None, 200).await;
            let got: BTreeSet<String> =
                listed["reviewers"].as_array().unwrap().iter().map(|r| r["user_id"].as_str().unwrap().into()).collect();
            assert_eq!(got, ours, "{role}: {listed:#}");
        }
    }
    for key in [&t.outsider, &other.owner] {
        let listed = s.expect(Method::GET, "/v1/reviews/reviewers", key, None, 200).await;
        assert!(
            listed["reviewers"].as_array().unwrap().iter().all(|r| !ours.contains(r["user_id"].as_str().unwrap())),
            "{listed:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blind_labelling_before_and_after_close() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("blind").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (rp, rf) = (&ran.passed[0], &ran.failed[0]);
    let (rp_id, rf_id) = (id(rp), id(rf));
    let owner_id = user_with_role(&s, &t, "owner").await;
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;

    // Before the calibration the reviewer sees everything, by either route.
    // The server then knows the reviewer's role and that no calibration
    // holds these results, and must still blind them once one does.
    for (r, status) in [(rp, "passed"), (rf, "failed")] {
        for path in [
            format!("/v1/test-results/{}", id(r)),
            format!("/v1/test-results/by-call/{}", r["call_id"].as_str().unwrap()),
        ] {
            assert_sees_all(&s.expect(Method::GET, &path, &t.reviewer, None, 200).await, status);
        }
    }

    // The reviewer and the owner label both results; the editor and the
    // viewer are not assigned.
    let cal = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_ids(p, &[&rp_id, &rf_id], &[&reviewer_id, &owner_id])),
            200,
        )
        .await;
    let c = id(&cal);
    assert_eq!(cal["test_result_ids"], json!([rp_id, rf_id]));
    assert_eq!(cal["reviewer_ids"], json!([reviewer_id, owner_id]));
    assert_eq!(cal["sample"], Value::Null);
    assert_eq!(cal["progress"], json!({"labels_done": 0, "labels_total": 4}));
    assert!(cal["closed_at"].is_null());

    // The assigned reviewer reads every result of it blind, by every route.
    for (r, test, status) in [(rp, &ran.passing_test, "passed"), (rf, &ran.failing_test, "failed")] {
        let by_id = s.expect(Method::GET, &format!("/v1/test-results/{}", id(r)), &t.reviewer, None, 200).await;
        assert_blind(&by_id, &c);
        let call = r["call_id"].as_str().unwrap();
        let by_call = s.expect(Method::GET, &format!("/v1/test-results/by-call/{call}"), &t.reviewer, None, 200).await;
        assert_blind(&by_call, &c);
        let listed = all_pages(&s, &t.reviewer, &format!("/v1/tests/{test}/results"), "test_results").await;
        assert_eq!(listed.len(), 1);
        assert_blind(&listed[0], &c);
        // Filtering by the hidden status would tell it: blind results are
        // left out.
        let filtered =
            all_pages(&s, &t.reviewer, &format!("/v1/tests/{test}/results?status={status}"), "test_results").await;
        assert_eq!(filtered, Vec::<Value>::new(), "{status}");
        // The owner (assigned, but an owner) and the members who are not
        // assigned see everything.
        for key in [&t.owner, &t.editor, &t.viewer] {
            let seen = s.expect(Method::GET, &format!("/v1/test-results/{}", id(r)), key, None, 200).await;
            assert_sees_all(&seen, status);
            let filtered =
                all_pages(&s, key, &format!("/v1/tests/{test}/results?status={status}"), "test_results").await;
            assert_eq!(filtered.len(), 1, "{status}");
        }
    }

    // The batch run's runs do not say how the blind ones ended either, and
    // a status filter leaves them out; to the others they do.
    let runs_path = format!("/v1/batch-runs/{}/runs", ran.batch_run_id);
    let runs = all_pages(&s, &t.reviewer, &runs_path, "runs").await;
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["status"].is_null()), "{runs:#?}");
    assert_eq!(all_pages(&s, &t.reviewer, &format!("{runs_path}?status=passed"), "runs").await, Vec::<Value>::new());
    let runs = all_pages(&s, &t.owner, &runs_path, "runs").await;
    let mut statuses: Vec<&str> = runs.iter().map(|r| r["status"].as_str().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, ["failed", "passed"]);
    // Nor does the batch run, by any route: its counts would tell.
    assert_batch_run_blind(&s, &t.reviewer, &ran.batch_run_id, Some(&c)).await;
    for key in [&t.owner, &t.editor, &t.viewer] {
        assert_batch_run_blind(&s, key, &ran.batch_run_id, None).await;
    }

    // The owner's review counts toward the calibration; the editor's (not
    // assigned) does not.
    let by_owner = review(&s, &t.owner, &rp_id, true, &[(CONFIRMS, true), (RIGHT_DAY, true)]).await;
    assert_eq!(by_owner["calibration_id"], c.as_str());
    let by_editor = review(&s, &t.editor, &rp_id, true, &[]).await;
    assert!(by_editor["calibration_id"].is_null(), "{by_editor:#}");

    // The reviewer sees nobody else's review of the calibration's results.
    assert_eq!(reviews(&s, &t.reviewer, &format!("test_result_id={rp_id}")).await, Vec::<Value>::new());
    assert_eq!(reviews(&s, &t.reviewer, &format!("project_id={p}")).await, Vec::<Value>::new());
    assert_eq!(reviews(&s, &t.reviewer, "").await, Vec::<Value>::new());
    assert_eq!(reviews(&s, &t.reviewer, &format!("calibration_id={c}")).await, Vec::<Value>::new());
    let by_reviewer = review(&s, &t.reviewer, &rp_id, true, &[(CONFIRMS, true), (RIGHT_DAY, true)]).await;
    assert_eq!(by_reviewer["calibration_id"], c.as_str());
    assert_eq!(ids(&json!(reviews(&s, &t.reviewer, &format!("test_result_id={rp_id}")).await)), [id(&by_reviewer)]);
    assert_eq!(ids(&json!(reviews(&s, &t.reviewer, &format!("project_id={p}")).await)), [id(&by_reviewer)]);
    // The others see all three, newest first.
    let all_three = [id(&by_reviewer), id(&by_editor), id(&by_owner)];
    for key in [&t.owner, &t.editor, &t.viewer] {
        assert_eq!(ids(&json!(reviews(&s, key, &format!("test_result_id={rp_id}")).await)), all_three);
    }
    assert_eq!(
        ids(&json!(reviews(&s, &t.owner, &format!("calibration_id={c}")).await)),
        [id(&by_reviewer), id(&by_owner)]
    );

    // Nor does the activity log: others' reviews of the blind results, and
    // the batch run's end (its summary counts the verdicts), are not there
    // for the reviewer; their own review is.
    let hidden = [id(&by_owner), id(&by_editor)];
    let ended = |feed: &[Value]| feed.iter().any(|a| a["action"] == "batch_run.complete");
    let feed = all_pages(&s, &t.reviewer, &format!("/v1/activity?project_id={p}"), "activity").await;
    let reviewed: Vec<String> =
        feed.iter().filter(|a| a["resource_type"] == "review").map(|a| a["resource_id"].to_string()).collect();
    assert_eq!(reviewed, [json!(id(&by_reviewer)).to_string()], "{feed:#?}");
    assert!(!ended(&feed), "{feed:#?}");
    for review_id in &hidden {
        let path = format!("/v1/activity/resource/review/{review_id}");
        let history = s.expect(Method::GET, &path, &t.reviewer, None, 200).await;
        assert_eq!(history["activity"], json!([]), "{history:#}");
        let record = s.expect(Method::GET, &path, &t.owner, None, 200).await["activity"][0].clone();
        let by_id = format!("/v1/activity/{}", id(&record));
        assert_eq!(refused(&s, Method::GET, &by_id, &t.reviewer, None, 404).await["error_code"], "not_found");
    }
    for key in [&t.owner, &t.editor, &t.viewer] {
        let feed = all_pages(&s, key, &format!("/v1/activity?project_id={p}"), "activity").await;
        assert_eq!(feed.iter().filter(|a| a["resource_type"] == "review").count(), 3, "{feed:#?}");
        assert!(ended(&feed), "{feed:#?}");
    }

    // The calibration, to the reviewer: no metric, nothing that tells.
    let blind = get_calibration(&s, &t.reviewer, &c).await;
    assert_eq!(blind["blinded"], true, "{blind:#}");
    assert_eq!(blind["status"], "open");
    assert_metrics(&blind["overall"], [None; 5], "blind overall");
    assert_eq!(blind["per_evaluator"], json!([]));
    assert_eq!(blind["disagreements"], json!([]));
    let listed = all_pages(&s, &t.reviewer, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["blinded"], true, "the list blinds too: {:#}", listed[0]);
    assert_metrics(&listed[0]["overall"], [None; 5], "blind overall, listed");
    assert_eq!(listed[0]["per_evaluator"], json!([]));
    assert_eq!(listed[0]["disagreements"], json!([]));
    // To the owner and to members not assigned: the metrics so far. Only
    // rp has labels (two passes, the automated verdict passed): agreement
    // 1/1, TPR 1/1; no human fail (TNR undefined), one class only (Cohen's
    // and Fleiss' kappa undefined).
    for key in [&t.owner, &t.editor, &t.viewer] {
        let open = get_calibration(&s, key, &c).await;
        assert_eq!(open["blinded"], false, "{open:#}");
        assert_eq!(open["progress"], json!({"labels_done": 2, "labels_total": 4}));
        assert_metrics(&open["overall"], [Some(1.0), None, None, Some(1.0), None], "open overall");
    }

    // Reviewer statistics leave out reviews of a still-open calibration.
    let stats = reviewers(&s, &t.owner, p).await;
    let of_reviewer = find(&stats, "user_id", &reviewer_id);
    assert_eq!(of_reviewer["reviews_count"], 1);
    assert!(of_reviewer["agreement_with_automated"].is_null(), "{of_reviewer:#}");
    assert!(of_reviewer["agreement_with_peers"].is_null(), "{of_reviewer:#}");
    let editor_id = user_with_role(&s, &t, "editor").await;
    let of_editor = find(&stats, "user_id", &editor_id);
    assert_eq!(of_editor["reviews_count"], 1);
    close_to(&of_editor["agreement_with_automated"], 1.0, "editor, verdict pass on a passed result");
    assert!(of_editor["agreement_with_peers"].is_null(), "the only peers' labels are in the open calibration");

    // Closed: the reviewer sees everything.
    close(&s, &t.editor, &c).await;
    let seen = s.expect(Method::GET, &format!("/v1/test-results/{rp_id}"), &t.reviewer, None, 200).await;
    assert_sees_all(&seen, "passed");
    let call = rf["call_id"].as_str().unwrap();
    let seen = s.expect(Method::GET, &format!("/v1/test-results/by-call/{call}"), &t.reviewer, None, 200).await;
    assert_sees_all(&seen, "failed");
    let listed =
        all_pages(&s, &t.reviewer, &format!("/v1/tests/{}/results?status=passed", ran.passing_test), "test_results")
            .await;
    assert_eq!(listed.len(), 1);
    let runs = all_pages(&s, &t.reviewer, &runs_path, "runs").await;
    assert!(runs.iter().all(|r| r["status"].is_string()), "{runs:#?}");
    assert_batch_run_blind(&s, &t.reviewer, &ran.batch_run_id, None).await;
    let feed = all_pages(&s, &t.reviewer, &format!("/v1/activity?project_id={p}"), "activity").await;
    assert_eq!(feed.iter().filter(|a| a["resource_type"] == "review").count(), 3, "{feed:#?}");
    assert!(ended(&feed), "{feed:#?}");
    assert_eq!(ids(&json!(reviews(&s, &t.reviewer, &format!("test_result_id={rp_id}")).await)), all_three);
    let done = get_calibration(&s, &t.reviewer, &c).await;
    assert_eq!((done["blinded"].as_bool(), done["status"].as_str()), (Some(false), Some("complete")));
    assert_metrics(&done["overall"], [Some(1.0), None, None, Some(1.0), None], "closed overall");
    let stats = reviewers(&s, &t.owner, p).await;
    let of_reviewer = find(&stats, "user_id", &reviewer_id);
    // Verdict and two evaluator labels, all equal to the automated ones.
    close_to(&of_reviewer["agreement_with_automated"], 1.0, "reviewer after close");
    // Peers on rp: the owner (verdict, both evaluators) and the editor
    // (verdict): 3 + 1 pairs, all equal.
    close_to(&of_reviewer["agreement_with_peers"], 1.0, "reviewer peers after close");
}

/// A list filtered by status leaves out what a blind reviewer may not see
/// without telling it by its length or its cursor: a page of hidden items
/// would be empty and still point past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_page_does_not_point_past_blind_items() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("blind pages").await;
    let ran = run_batch(&s, &t, &good, &bad, 2, 1).await;
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let passed: Vec<String> = ran.passed.iter().map(id).collect();
    let passed: Vec<&str> = passed.iter().map(String::as_str).collect();
    s.expect(
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_ids(&t.project_id, &passed, &[&reviewer_id])),
        200,
    )
    .await;
    let results = format!("/v1/tests/{}/results?status=passed", ran.passing_test);
    let runs = format!("/v1/batch-runs/{}/runs?status=passed", ran.batch_run_id);
    for limit in [1, 2, 50] {
        let page = s.expect(Method::GET, &format!("{results}&limit={limit}"), &t.reviewer, None, 200).await;
        assert_eq!(page, json!({"test_results": [], "next_cursor": null}), "limit {limit}");
        let page = s.expect(Method::GET, &format!("{runs}&limit={limit}"), &t.reviewer, None, 200).await;
        assert_eq!(page, json!({"runs": [], "next_cursor": null}), "limit {limit}");
    }
    // What is not blind is listed as before, page by page.
    let failed = s
        .expect(
            Method::GET,
            &format!("/v1/batch-runs/{}/runs?status=failed&limit=1", ran.batch_run_id),
            &t.reviewer,
            None,
            200,
        )
        .await;
    assert_eq!(failed["runs"].as_array().unwrap().len(), 1, "{failed:#}");
    assert!(failed["next_cursor"].is_null(), "{failed:#}");
    // Those who are not blind see the passed ones, one page at a time.
    for key in [&t.owner, &t.viewer] {
        let page = s.expect(Method::GET, &format!("{results}&limit=1"), key, None, 200).await;
        assert_eq!(page["test_results"].as_array().unwrap().len(), 1, "{page:#}");
        assert!(page["next_cursor"].is_string(), "{page:#}");
        assert_eq!(all_pages(&s, key, &runs, "runs").await.len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_end_to_end() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("calibration").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 3, 3).await;
    let brn = &ran.batch_run_id;
    let passed: BTreeSet<String> = ran.passed.iter().map(id).collect();
    let failed: BTreeSet<String> = ran.failed.iter().map(id).collect();
    let every: BTreeSet<String> = passed.union(&failed).cloned().collect();

    // Three reviewers: the team's, and two more with the reviewer role.
    let k1 = t.reviewer.clone();
    let r1 = user_with_role(&s, &t, "reviewer").await;
    let (k2, r2) = add_member(&s, &t, "second-reviewer@example.com", "reviewer").await;
    let (k3, r3) = add_member(&s, &t, "third-reviewer@example.com", "reviewer").await;
    let reviewer_ids = [r1.as_str(), r2.as_str(), r3.as_str()];

    // A sample larger than the batch run draws all of it; closed without a
    // label, it is complete with every metric undefined.
    let sample = json!({"batch_run_id": brn, "size": 100, "seed": 9});
    let all = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_sample(p, sample.clone(), &reviewer_ids)),
            200,
        )
        .await;
    assert_eq!(strings(&all["test_result_ids"]).into_iter().collect::<BTreeSet<_>>(), every);
    assert_eq!(all["test_result_ids"].as_array().unwrap().len(), 6);
    assert_eq!(all["sample"]["batch_run_id"], brn.as_str());
    assert_eq!((all["sample"]["size"].as_i64(), all["sample"]["seed"].as_i64()), (Some(100), Some(9)));
    assert_eq!(all["progress"], json!({"labels_done": 0, "labels_total": 18}));
    let empty = close(&s, &t.editor, &id(&all)).await;
    assert_eq!(empty["progress"]["labels_done"], 0);
    assert_metrics(&empty["overall"], [None; 5], "no labels");

    // A sample of 4 of the 6: find a seed that draws two passed and two
    // failed results (60% of draws do), closing each try.
    let mut chosen = None;
    for seed in 1..=40i64 {
        let body = calibration_by_sample(p, json!({"batch_run_id": brn, "size": 4, "seed": seed}), &reviewer_ids);
        let tried = s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200).await;
        let drawn = strings(&tried["test_result_ids"]);
        assert_eq!(drawn.len(), 4);
        assert_eq!(drawn.iter().collect::<BTreeSet<_>>().len(), 4, "distinct: {drawn:?}");
        assert!(drawn.iter().all(|d| every.contains(d)), "from the batch run: {drawn:?}");
        close(&s, &t.editor, &id(&tried)).await;
        if drawn.iter().filter(|d| passed.contains(*d)).count() == 2 {
            chosen = Some((seed, drawn));
            break;
        }
    }
    let (seed, drawn) = chosen.expect("some seed in 40 draws two of each");
    // The same seed draws the same results.
    let body = calibration_by_sample(p, json!({"batch_run_id": brn, "size": 4, "seed": seed}), &reviewer_ids);
    let cal = s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200).await;
    let c = id(&cal);
    assert_eq!(strings(&cal["test_result_ids"]), drawn, "seed {seed} again");
    assert_eq!(cal["reviewer_ids"], json!(reviewer_ids));
    assert_eq!(cal["status"], "open");
    assert_eq!(cal["progress"], json!({"labels_done": 0, "labels_total": 12}));

    let pass: Vec<&String> = drawn.iter().filter(|d| passed.contains(*d)).collect();
    let fail: Vec<&String> = drawn.iter().filter(|d| failed.contains(*d)).collect();
    let (p0, p1, f0, f1) = (pass[0].as_str(), pass[1].as_str(), fail[0].as_str(), fail[1].as_str());

    // The automated labels (checked in `run_batch`), T = passed:
    //                 p0 p1 f0 f1
    //   overall        T  T  F  F
    //   confirms       T  T  T  T
    //   right day      T  T  F  F
    // The human labels: R1 and R2 give the automated verdicts, R3 flips
    // them on p0 and f0; per evaluator:
    //                 R1: p0 p1 f0 f1   R2: same as R1   R3: p0 p1 f0 f1
    //   verdict            T  T  F  F                        F  T  T  F
    //   confirms           T  T  T  T                        T  T  F  T
    //   right day          T  F  F  F                        F  T  T  F
    let agreeing: Labels = [(true, true, true), (true, true, false), (false, true, false), (false, true, false)];
    let flipping: Labels = [(false, true, false), (true, true, true), (true, false, true), (false, true, false)];
    let subjects = [p0, p1, f0, f1];
    let mut made: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    made.insert("R1", label(&s, &k1, &c, subjects, agreeing, 4).await);

    // While it is open, R1 is blind to the metrics and to the others' labels,
    // and their statistics leave these reviews out.
    let stats = reviewers(&s, &t.owner, p).await;
    let of_r1 = find(&stats, "user_id", &r1);
    assert_eq!(of_r1["reviews_count"], 4);
    assert!(of_r1["last_review_at"].is_string());
    assert!(of_r1["agreement_with_automated"].is_null() && of_r1["agreement_with_peers"].is_null(), "{of_r1:#}");
    made.insert("R2", label(&s, &k2, &c, subjects, agreeing, 4).await);
    made.insert("R3", label(&s, &k3, &c, subjects, flipping, 3).await);
    for key in [&k1, &k2, &k3] {
        let blind = get_calibration(&s, key, &c).await;
        assert_eq!(blind["blinded"], true);
        assert_metrics(&blind["overall"], [None; 5], "blind");
        let mine = reviews(&s, key, &format!("calibration_id={c}")).await;
        assert!(mine.len() == 4 || (key == &k3 && mine.len() == 3), "only their own: {mine:#?}");
    }
    let open = get_calibration(&s, &t.owner, &c).await;
    assert_eq!((open["status"].as_str(), open["closed_at"].is_null()), (Some("open"), true));
    assert_eq!(open["progress"], json!({"labels_done": 11, "labels_total": 12}));

    // The last label completes it.
    let last = review(&s, &k3, f1, false, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
    assert_eq!(last["calibration_id"], c.as_str());
    made.get_mut("R3").unwrap().push(last);
    let done = get_calibration(&s, &t.owner, &c).await;
    assert_eq!(done["status"], "complete", "{done:#}");
    assert!(done["closed_at"].is_string());
    assert_eq!(done["progress"], json!({"labels_done": 12, "labels_total": 12}));
    assert_eq!(done["blinded"], false);
    assert_eq!(reviews(&s, &t.owner, &format!("calibration_id={c}")).await.len(), 12);

    // Overall. Subjects (pass, fail) counts: p0 (2,1), p1 (3,0), f0 (1,2),
    // f1 (0,3); majorities T T F F = the automated labels: tp 2, tn 2.
    //   agreement = 4/4 = 1; Cohen: po 1, pe = ½·½ + ½·½ = ½, κ = (1-½)/(1-½) = 1
    //   TPR = 2/2 = 1, TNR = 2/2 = 1
    //   Fleiss: P_i = (Σn²-3)/6 = 1/3, 1, 1/3, 1 → P̄ = 2/3; pooled pass
    //   6/12 → P̄e = ¼ + ¼ = ½; κ = (2/3 - ½)/(1 - ½) = 1/3
    assert_metrics(&done["overall"], [Some(1.0), Some(1.0), Some(1.0 / 3.0), Some(1.0), Some(1.0)], "overall");

    // "step 1: confirms". Counts: p0 (3,0), p1 (3,0), f0 (2,1), f1 (3,0);
    // majorities all T, automated all T.
    //   agreement = 1; Cohen: po 1, pe = 1·1 = 1 → undefined
    //   TPR = 4/4 = 1; TNR: no human fail → undefined
    //   Fleiss: P_i = 1, 1, 1/3, 1 → P̄ = 5/6; pooled pass 11/12 →
    //   P̄e = 121/144 + 1/144 = 61/72; κ = (60/72 - 61/72)/(11/72) = -1/11
    // "step 1: right day". Counts: p0 (2,1), p1 (1,2), f0 (1,2), f1 (0,3);
    // majorities T F F F vs automated T T F F: tp 1 (p0), fp 1 (p1), tn 2.
    //   agreement = 3/4; Cohen: po ¾, human pass ¼, automated pass ½,
    //   pe = ¼·½ + ¾·½ = ½, κ = (¾ - ½)/(1 - ½) = ½
    //   TPR = 1/1 = 1; TNR = 2/3 (p1 is automated pass)
    //   Fleiss: P_i = 1/3, 1/3, 1/3, 1 → P̄ = ½; pooled pass 4/12 →
    //   P̄e = 1/9 + 4/9 = 5/9; κ = (½ - 5/9)/(4/9) = -1/8
    let per = done["per_evaluator"].as_array().unwrap();
    assert_eq!(per.iter().map(|e| e["name"].as_str().unwrap()).collect::<Vec<_>>(), [CONFIRMS, RIGHT_DAY]);
    assert_metrics(&per[0]["metrics"], [Some(1.0), None, Some(-1.0 / 11.0), Some(1.0), None], CONFIRMS);
    assert_metrics(
        &per[1]["metrics"],
        [Some(0.75), Some(0.5), Some(-1.0 / 8.0), Some(1.0), Some(2.0 / 3.0)],
        RIGHT_DAY,
    );
    // The one place the human majority and automation differ.
    assert_eq!(
        done["disagreements"],
        json!([{"test_result_id": p1, "evaluator": RIGHT_DAY, "human_label": false, "automated_label": true}])
    );
    // Now complete, R1 sees the same.
    let seen = get_calibration(&s, &k1, &c).await;
    assert_eq!(seen["blinded"], false);
    assert_eq!((&seen["overall"], &seen["per_evaluator"]), (&done["overall"], &done["per_evaluator"]));

    // Reviewer statistics. Labels per reviewer: 4 results × (verdict + 2
    // evaluators) = 12.
    //   vs automated: R1 and R2 differ only on right day of p1 → 11/12;
    //   R3 differs on verdict p0, f0, confirms f0, right day p0, f0 → 7/12.
    //   vs peers (24 pairs each): R1-R2 equal on 12/12; R1-R3 and R2-R3
    //   equal on verdict p1, f1; confirms p0, p1, f1; right day f1 → 6/12.
    //   R1 = R2 = (12 + 6)/24 = 3/4; R3 = (6 + 6)/24 = 1/2.
    let stats = reviewers(&s, &t.viewer, p).await;
    let owner_id = user_with_role(&s, &t, "owner").await;
    let editor_id = user_with_role(&s, &t, "editor").await;
    let listed: BTreeSet<&str> = stats.iter().map(|r| r["user_id"].as_str().unwrap()).collect();
    assert_eq!(listed, BTreeSet::from([owner_id.as_str(), editor_id.as_str(), r1.as_str(), r2.as_str(), r3.as_str()]));
    for (who, user, automated, peers) in
        [("R1", &r1, 11.0 / 12.0, 0.75), ("R2", &r2, 11.0 / 12.0, 0.75), ("R3", &r3, 7.0 / 12.0, 0.5)]
    {
        let st = find(&stats, "user_id", user);
        assert_eq!(st["reviews_count"], 4, "{who}: {st:#}");
        close_to(&st["agreement_with_automated"], automated, &format!("{who} vs automated"));
        close_to(&st["agreement_with_peers"], peers, &format!("{who} vs peers"));
        let latest = made[who]
            .iter()
            .map(|r| chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap()).unwrap())
            .max()
            .unwrap();
        let last = chrono::DateTime::parse_from_rfc3339(st["last_review_at"].as_str().unwrap()).unwrap();
        assert_eq!(last, latest, "{who}: {st:#}");
    }
    assert_eq!(find(&stats, "user_id", &r2)["email"], "second-reviewer@example.com");
    for user in [&owner_id, &editor_id] {
        let st = find(&stats, "user_id", user);
        assert_eq!(st["reviews_count"], 0, "{st:#}");
        assert!(st["agreement_with_automated"].is_null() && st["agreement_with_peers"].is_null(), "{st:#}");
        assert!(st["last_review_at"].is_null(), "{st:#}");
    }

    // Complete: the labels that count toward it are locked.
    let e =
        refused(&s, Method::POST, "/v1/reviews", &k3, Some(review_body(p0, true, &[], "changed my mind")), 409).await;
    assert_eq!(e["error_code"], "review_locked");
    let e = refused(&s, Method::DELETE, &format!("/v1/reviews/{}", id(&made["R3"][0])), &k3, None, 409).await;
    assert_eq!(e["error_code"], "review_locked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_replacement_deletion_locks_and_activity() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("rules").await;
    let o = s.team("other").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 2, 2).await;
    let theirs = run_batch(&s, &o, &good, &bad, 1, 1).await;
    let (rp0, rp1, rf0, rf1) = (id(&ran.passed[0]), id(&ran.passed[1]), id(&ran.failed[0]), id(&ran.failed[1]));
    let ro = id(&theirs.passed[0]);
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let editor_id = user_with_role(&s, &t, "editor").await;
    let viewer_id = user_with_role(&s, &t, "viewer").await;
    let other_owner_id = {
        let all = all_pages(&s, &o.owner, &format!("/v1/projects/{}/members", o.project_id), "members").await;
        find(&all, "role", "owner")["user_id"].as_str().unwrap().to_string()
    };
    // Every successful review mutation, in order, for the activity check.
    let mut expected: Vec<(String, &str)> = Vec::new();

    // Bad reviews, each refused with the field named.
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews",
        &t.reviewer,
        Some(review_body(&rp0, true, &[("no such evaluator", true)], "")),
        400,
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("evaluations[0]"), "{e}");
    // A name that is no evaluator's is quoted, not echoed whole: a label's
    // name is bounded only by the body's.
    let long = "x".repeat(100_000);
    for labels in [vec![(long.as_str(), true)], vec![(long.as_str(), true), (long.as_str(), false)]] {
        let body = review_body(&rp0, true, &labels, "");
        let e = refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(body), 400).await;
        let message = e["message"].as_str().unwrap();
        assert!(message.starts_with("evaluations[") && message.contains(&format!("`{}…`", "x".repeat(120))), "{e}");
        assert!(!message.contains(&"x".repeat(121)), "{e}");
    }
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews",
        &t.reviewer,
        Some(review_body(&rp0, true, &[(CONFIRMS, true), (RIGHT_DAY, true), (CONFIRMS, false)], "")),
        400,
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("evaluations"), "{e}");
    refused(
        &s,
        Method::POST,
        "/v1/reviews",
        &t.reviewer,
        Some(json!({"test_result_id": rp0, "verdict": "maybe", "evaluations": []})),
        400,
    )
    .await;
    refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(json!({"verdict": "pass"})), 400).await;
    // Unknown, and another project's result: not found.
    let e = refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(review_body("trs_nothere", true, &[], "")), 404)
        .await;
    assert_eq!(e["error_code"], "not_found");
    refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(review_body(&ro, true, &[], "")), 404).await;

    // A second review of the same result replaces the first.
    let first = s
        .expect(
            Method::POST,
            "/v1/reviews",
            &t.reviewer,
            Some(review_body(&rp0, true, &[(CONFIRMS, true)], "first look")),
            200,
        )
        .await;
    expected.push((id(&first), "review.create"));
    assert_eq!(first["reviewer_id"], reviewer_id.as_str());
    assert_eq!(first["evaluations"], json!([{"name": CONFIRMS, "passed": true}]));
    assert!(first["calibration_id"].is_null());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = s
        .expect(
            Method::POST,
            "/v1/reviews",
            &t.reviewer,
            Some(review_body(&rp0, false, &[(RIGHT_DAY, false)], "second look")),
            200,
        )
        .await;
    expected.push((id(&second), "review.update"));
    assert_eq!(second["id"], first["id"], "the same review");
    assert_eq!((second["verdict"].as_str(), second["notes"].as_str()), (Some("fail"), Some("second look")));
    assert_eq!(second["evaluations"], json!([{"name": RIGHT_DAY, "passed": false}]));
    assert_eq!(second["created_at"], first["created_at"]);
    let parse = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    assert!(parse(&second["updated_at"]) > parse(&first["updated_at"]), "{first:#} {second:#}");
    assert_eq!(reviews(&s, &t.owner, &format!("test_result_id={rp0}")).await, vec![second.clone()]);

    // Delete: the author only; once gone, gone.
    let owners = review(&s, &t.owner, &rp0, true, &[]).await;
    expected.push((id(&owners), "review.create"));
    forbidden(&s, Method::DELETE, &format!("/v1/reviews/{}", id(&owners)), &t.reviewer, None).await;
    refused(&s, Method::DELETE, &format!("/v1/reviews/{}", id(&owners)), &o.owner, None, 404).await;
    let gone = s.expect(Method::DELETE, &format!("/v1/reviews/{}", id(&owners)), &t.owner, None, 200).await;
    expected.push((id(&owners), "review.delete"));
    assert_eq!(gone, json!({"id": id(&owners), "deleted": true}));
    refused(&s, Method::DELETE, &format!("/v1/reviews/{}", id(&owners)), &t.owner, None, 404).await;
    assert_eq!(reviews(&s, &t.owner, &format!("test_result_id={rp0}")).await, vec![second.clone()]);

    // Filters and pages.
    let on_rf0 = review(&s, &t.reviewer, &rf0, false, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
    expected.push((id(&on_rf0), "review.create"));
    let by_editor = review(&s, &t.editor, &rp0, true, &[(CONFIRMS, true), (RIGHT_DAY, true)]).await;
    expected.push((id(&by_editor), "review.create"));
    let newest_first = [id(&by_editor), id(&on_rf0), id(&second)];
    for (query, want) in [
        (format!("project_id={p}"), newest_first.to_vec()),
        (format!("reviewer_id={reviewer_id}"), vec![id(&on_rf0), id(&second)]),
        (format!("reviewer_id={editor_id}"), vec![id(&by_editor)]),
        (format!("test_result_id={rp0}"), vec![id(&by_editor), id(&second)]),
        ("verdict=pass".to_string(), vec![id(&by_editor)]),
        ("verdict=fail".to_string(), vec![id(&on_rf0), id(&second)]),
        (format!("project_id={p}&verdict=fail&reviewer_id={reviewer_id}&test_result_id={rf0}"), vec![id(&on_rf0)]),
    ] {
        assert_eq!(ids(&json!(reviews(&s, &t.viewer, &query).await)), want, "{query}");
    }
    let page = s.expect(Method::GET, &format!("/v1/reviews?project_id={p}&limit=2"), &t.viewer, None, 200).await;
    assert_eq!(ids(&page["reviews"]), newest_first[..2]);
    let cursor = page["next_cursor"].as_str().expect("a next page");
    let page = s
        .expect(Method::GET, &format!("/v1/reviews?project_id={p}&limit=2&cursor={cursor}"), &t.viewer, None, 200)
        .await;
    assert_eq!(ids(&page["reviews"]), newest_first[2..]);
    assert!(page["next_cursor"].is_null());
    refused(&s, Method::GET, "/v1/reviews?verdict=maybe", &t.viewer, None, 400).await;

    // Bad calibrations.
    let both = json!({"project_id": p, "test_result_ids": [rp1], "sample": {"test_id": ran.passing_test, "size": 1,
                      "seed": 1}, "reviewer_ids": [reviewer_id]});
    let neither = json!({"project_id": p, "reviewer_ids": [reviewer_id]});
    for body in [both, neither] {
        refused(&s, Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 400).await;
    }
    for (reviewers, field) in [
        (vec![viewer_id.as_str()], "reviewer_ids[0]"),
        (vec![reviewer_id.as_str(), other_owner_id.as_str()], "reviewer_ids[1]"),
        (vec![reviewer_id.as_str(), "usr_nobody"], "reviewer_ids[1]"),
    ] {
        let e = refused(
            &s,
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_ids(p, &[&rp1], &reviewers)),
            400,
        )
        .await;
        assert!(e["message"].as_str().unwrap().contains(field), "{field}: {e}");
    }
    for results in [vec![rp1.as_str(), ro.as_str()], vec![rp1.as_str(), "trs_nothere"]] {
        let e = refused(
            &s,
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_ids(p, &results, &[&reviewer_id])),
            400,
        )
        .await;
        assert!(e["message"].as_str().unwrap().contains("test_result_ids[1]"), "{e}");
    }
    refused(
        &s,
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_ids(&o.project_id, &[&ro], &[&reviewer_id])),
        404,
    )
    .await;

    // C1 over rp1 and rf1, labelled by the reviewer and the editor.
    let c1 = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_ids(p, &[&rp1, &rf1], &[&reviewer_id, &editor_id])),
            200,
        )
        .await;
    let c1 = id(&c1);
    // A result is in at most one open calibration (a sample passes over it:
    // a_sample_draws_from_the_results_that_can_be_calibrated).
    let body = calibration_by_ids(p, &[&rp0, &rf1], &[&reviewer_id]);
    let e = refused(&s, Method::POST, "/v1/reviews/calibration", &t.owner, Some(body), 409).await;
    assert_eq!(e["error_code"], "in_calibration", "{e}");
    let mut c1_reviews = Vec::new();
    for (key, result, passed) in
        [(&t.reviewer, &rp1, true), (&t.editor, &rp1, true), (&t.editor, &rf1, false), (&t.reviewer, &rf1, false)]
    {
        let before = get_calibration(&s, &t.owner, &c1).await;
        assert_eq!(before["status"], "open");
        let r = review(&s, key, result, passed, &[]).await;
        assert_eq!(r["calibration_id"], c1.as_str());
        expected.push((id(&r), "review.create"));
        c1_reviews.push(r);
        let after = get_calibration(&s, &t.owner, &c1).await;
        assert_eq!(after["progress"]["labels_done"], c1_reviews.len(), "{after:#}");
    }
    let complete = get_calibration(&s, &t.owner, &c1).await;
    assert_eq!(complete["status"], "complete", "the last label completes it: {complete:#}");
    assert_eq!(ids(&json!(reviews(&s, &t.owner, &format!("calibration_id={c1}")).await)).len(), 4);
    // Locked now: neither replaced nor deleted, by its author.
    let e = refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(review_body(&rp1, false, &[], "")), 409).await;
    assert_eq!(e["error_code"], "review_locked");
    let e = refused(&s, Method::DELETE, &format!("/v1/reviews/{}", id(&c1_reviews[0])), &t.reviewer, None, 409).await;
    assert_eq!(e["error_code"], "review_locked");
    // Closing it again changes nothing.
    let again = close(&s, &t.editor, &c1).await;
    assert_eq!(again["closed_at"], complete["closed_at"]);
    // Someone not assigned may still review its results, outside it.
    let late = review(&s, &t.owner, &rp1, true, &[]).await;
    assert!(late["calibration_id"].is_null());
    expected.push((id(&late), "review.create"));

    // Not rp0 and rp1 for the reviewer, whose label of rp1 is final in C1:
    // they could never label it again, and the calibration would never
    // complete.
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_ids(p, &[&rp0, &rp1], &[&reviewer_id])),
        409,
    )
    .await;
    assert_eq!(e["error_code"], "review_locked", "{e}");
    assert!(e["message"].as_str().unwrap().contains(&c1), "{e}");
    // A sample of a test, larger than it: both its results, for the owner;
    // closed early, the label given is locked and the other result is free
    // again.
    let sample = json!({"test_id": ran.passing_test, "size": 50, "seed": 1});
    let owner_id = user_with_role(&s, &t, "owner").await;
    let c2 = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.editor,
            Some(calibration_by_sample(p, sample.clone(), &[&owner_id])),
            200,
        )
        .await;
    let drawn: BTreeSet<String> = strings(&c2["test_result_ids"]).into_iter().collect();
    assert_eq!(drawn, BTreeSet::from([rp0.clone(), rp1.clone()]));
    assert_eq!(c2["sample"]["test_id"], ran.passing_test.as_str());
    assert!(c2["sample"]["batch_run_id"].is_null());
    let c2 = id(&c2);
    // rp1: the owner's earlier review was outside any calibration; the new
    // one replaces it and counts toward C2.
    let counted = review(&s, &t.owner, &rp1, true, &[]).await;
    assert_eq!(counted["id"], late["id"]);
    assert_eq!(counted["calibration_id"], c2.as_str());
    expected.push((id(&counted), "review.update"));
    assert_eq!(get_calibration(&s, &t.owner, &c2).await["progress"], json!({"labels_done": 1, "labels_total": 2}));
    let closed = close(&s, &t.owner, &c2).await;
    assert_eq!(closed["progress"], json!({"labels_done": 1, "labels_total": 2}));
    let e = refused(&s, Method::POST, "/v1/reviews", &t.owner, Some(review_body(&rp1, false, &[], "")), 409).await;
    assert_eq!(e["error_code"], "review_locked");
    // Drawn again with the same seed: the same results (for the owner, who
    // labelled no result of the failing test: the editor's label of rf1 is
    // final in C1, and the draw may be rf1).
    let c3 = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.owner,
            Some(calibration_by_sample(p, json!({"test_id": ran.failing_test, "size": 1, "seed": 77}), &[&owner_id])),
            200,
        )
        .await;
    close(&s, &t.owner, &id(&c3)).await;
    let c4 = s
        .expect(
            Method::POST,
            "/v1/reviews/calibration",
            &t.owner,
            Some(calibration_by_sample(p, json!({"test_id": ran.failing_test, "size": 1, "seed": 77}), &[&owner_id])),
            200,
        )
        .await;
    assert_eq!(c4["test_result_ids"], c3["test_result_ids"]);
    assert_eq!(c4["test_result_ids"].as_array().unwrap().len(), 1);
    let c4 = id(&c4);
    let calibrations =
        all_pages(&s, &t.viewer, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    assert_eq!(ids(&json!(calibrations)), [c4.clone(), id(&c3), c2.clone(), c1.clone()], "newest first");
    let open =
        all_pages(&s, &t.viewer, &format!("/v1/reviews/calibration?project_id={p}&status=open"), "calibrations").await;
    assert_eq!(ids(&json!(open)), std::slice::from_ref(&c4));

    // One activity record per successful mutation, none for a refused one.
    let records =
        all_pages(&s, &t.owner, &format!("/v1/activity?project_id={p}&resource_type=review"), "activity").await;
    let got: Vec<(String, String)> = records
        .iter()
        .rev()
        .map(|r| (r["resource_id"].as_str().unwrap().to_string(), r["action"].as_str().unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = expected.iter().map(|(i, a)| (i.clone(), a.to_string())).collect();
    assert_eq!(got, want);
    for r in &records {
        assert_eq!(r["resource_type"], "review");
        assert_eq!(r["project_id"], p.as_str());
    }
    let records =
        all_pages(&s, &t.owner, &format!("/v1/activity?project_id={p}&resource_type=calibration"), "activity").await;
    let of = |cal: &String, action: &str| {
        records.iter().filter(|r| r["resource_id"] == cal.as_str() && r["action"] == action).count()
    };
    for cal in [&c1, &c2, &id(&c3), &c4] {
        assert_eq!(of(cal, "calibration.create"), 1, "{cal}: {records:#?}");
    }
    assert_eq!(records.iter().filter(|r| r["action"] == "calibration.create").count(), 4, "{records:#?}");
    for cal in [&c2, &id(&c3)] {
        assert_eq!(of(cal, "calibration.close"), 1, "{cal}: {records:#?}");
    }
    assert_eq!(of(&c4, "calibration.close"), 0);
}

/// A seeded sample draws from the results that can be calibrated: it leaves
/// out a result in another open calibration review, and one a chosen
/// reviewer labelled in a complete one (their label is final), and takes the
/// next in the draw's order instead, so a sample of N is N whenever N can
/// be. Fewer remaining give all of them; none gives 409 `nothing_to_draw`.
/// Results named one by one are still refused (409) for either reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_draws_from_the_results_that_can_be_calibrated() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("sampling").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 3, 2).await;
    let brn = &ran.batch_run_id;
    let owner_id = user_with_role(&s, &t, "owner").await;
    let editor_id = user_with_role(&s, &t, "editor").await;
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let start = |body: Value| s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200);
    let sample = |size: u32, seed: i64| json!({"batch_run_id": brn, "size": size, "seed": seed});

    // The draw's whole order for seed 5, from nothing held back.
    let whole = start(calibration_by_sample(p, sample(5, 5), &[&owner_id])).await;
    let order = strings(&whole["test_result_ids"]);
    assert_eq!(order.len(), 5);
    close(&s, &t.editor, &id(&whole)).await;

    // The first two of that order, in an open calibration for the editor.
    let held = id(&start(calibration_by_ids(p, &[&order[0], &order[1]], &[&editor_id])).await);
    // Named, they are refused as before.
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_ids(p, &[&order[1], &order[2]], &[&reviewer_id])),
        409,
    )
    .await;
    assert_eq!(e["error_code"], "in_calibration", "{e}");
    // Drawn, they are passed over: a sample of 2 is the next two.
    let two = start(calibration_by_sample(p, sample(2, 5), &[&reviewer_id])).await;
    assert_eq!(strings(&two["test_result_ids"]), order[2..4]);
    assert_eq!(two["sample"], sample(2, 5), "the sample asked for is kept as asked");
    close(&s, &t.editor, &id(&two)).await;
    // More than remain: all that remain.
    let rest = start(calibration_by_sample(p, sample(5, 5), &[&reviewer_id])).await;
    assert_eq!(strings(&rest["test_result_ids"]), order[2..]);
    // None remain: refused, and nothing made.
    let before = all_pages(&s, &t.owner, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_sample(p, sample(1, 5), &[&reviewer_id])),
        409,
    )
    .await;
    assert_eq!(e["error_code"], "nothing_to_draw", "{e}");
    assert!(e["message"].as_str().unwrap().contains(brn.as_str()), "{e}");
    let after = all_pages(&s, &t.owner, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    assert_eq!(after.len(), before.len());
    close(&s, &t.editor, &id(&rest)).await;

    // The editor labels the held two: complete, and those labels are final.
    review(&s, &t.editor, &order[0], true, &[]).await;
    review(&s, &t.editor, &order[1], true, &[]).await;
    assert_eq!(get_calibration(&s, &t.owner, &held).await["status"], "complete");
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews/calibration",
        &t.editor,
        Some(calibration_by_ids(p, &[&order[0]], &[&editor_id])),
        409,
    )
    .await;
    assert_eq!(e["error_code"], "review_locked", "{e}");
    // A sample for the editor (and another reviewer) passes over them; one
    // for the reviewer alone draws them again.
    let for_editor = start(calibration_by_sample(p, sample(2, 5), &[&reviewer_id, &editor_id])).await;
    assert_eq!(strings(&for_editor["test_result_ids"]), order[2..4]);
    close(&s, &t.editor, &id(&for_editor)).await;
    let for_reviewer = start(calibration_by_sample(p, sample(2, 5), &[&reviewer_id])).await;
    assert_eq!(strings(&for_reviewer["test_result_ids"]), order[..2]);
}

/// A result labelled blind in an open calibration stays blind in every other
/// calibration over it too: an earlier, complete one would otherwise show
/// its automated verdict (in `disagreements` and the metrics). Others see
/// that one whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_calibration_does_not_unblind_results_of_an_open_one() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("blind elsewhere").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (rp, rf) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let editor_id = user_with_role(&s, &t, "editor").await;
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;

    // First: the editor labels both, against the automated verdicts; complete.
    let first = calibration_by_ids(p, &[&rp, &rf], &[&editor_id]);
    let first = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(first), 200).await);
    review(&s, &t.editor, &rp, false, &[]).await;
    review(&s, &t.editor, &rf, true, &[]).await;
    let done = get_calibration(&s, &t.reviewer, &first).await;
    assert_eq!((done["status"].as_str(), done["blinded"].as_bool()), (Some("complete"), Some(false)));
    assert_eq!(done["disagreements"].as_array().unwrap().len(), 2, "{done:#}");

    // The editor's labels of them are final: a calibration that asks the
    // editor again could never complete, so it is refused, and nothing made.
    let before = all_pages(&s, &t.owner, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    let again = calibration_by_ids(p, &[&rf], &[&reviewer_id, &editor_id]);
    let (status, e) =
        error_body(s.send_json(Method::POST, "/v1/reviews/calibration", &t.editor, Some(again)).await).await;
    assert_eq!((status, e["error_code"].as_str()), (409, Some("review_locked")), "{e}");
    assert!(e["message"].as_str().unwrap().contains(&first), "{e}");
    let after = all_pages(&s, &t.owner, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    assert_eq!(after.len(), before.len());

    // Then the same results, for the reviewer to label blind.
    let second = calibration_by_ids(p, &[&rp, &rf], &[&reviewer_id]);
    let second = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(second), 200).await);
    let seen = s.expect(Method::GET, &format!("/v1/test-results/{rf}"), &t.reviewer, None, 200).await;
    assert_blind(&seen, &second);
    let listed = all_pages(&s, &t.reviewer, &format!("/v1/reviews/calibration?project_id={p}"), "calibrations").await;
    for hidden in [get_calibration(&s, &t.reviewer, &first).await, find(&listed, "id", &first).clone()] {
        assert_eq!(hidden["blinded"], true, "{hidden:#}");
        assert_eq!((&hidden["disagreements"], &hidden["per_evaluator"]), (&json!([]), &json!([])), "{hidden:#}");
        assert_metrics(&hidden["overall"], [None; 5], "the complete one, to the blind reviewer");
    }
    for key in [&t.owner, &t.editor, &t.viewer] {
        let whole = get_calibration(&s, key, &first).await;
        assert_eq!(whole["disagreements"].as_array().unwrap().len(), 2, "{whole:#}");
    }
    // Nor do the reviewers' statistics tell it: the editor's labels of
    // those results (both against the machine) count for no one's agreement
    // the blind reviewer reads; to the others they do.
    let editor_agreement = |listed: &[Value]| find(listed, "user_id", &editor_id)["agreement_with_automated"].clone();
    assert_eq!(editor_agreement(&reviewers(&s, &t.reviewer, p).await), Value::Null);
    assert_eq!(editor_agreement(&reviewers(&s, &t.owner, p).await), json!(0.0));
    // Once the second is complete, the first is whole again for the reviewer.
    review(&s, &t.reviewer, &rp, true, &[]).await;
    review(&s, &t.reviewer, &rf, false, &[]).await;
    assert_eq!(get_calibration(&s, &t.reviewer, &first).await["disagreements"].as_array().unwrap().len(), 2);
    assert_eq!(editor_agreement(&reviewers(&s, &t.reviewer, p).await), json!(0.0));
}

/// A reviewer who leaves the project, or becomes a viewer, mid-calibration
/// can never give their labels: the calibration stops waiting for them and
/// completes once the reviewers who still can have labelled every result
/// (by their last label, or by the change that leaves no one else to wait
/// for), instead of staying open, its results blind to the others, for
/// ever. Their labels given before count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_who_leaves_mid_calibration_is_not_waited_for() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("leaving").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 2, 2).await;
    let (p0, p1, f0, f1) = (id(&ran.passed[0]), id(&ran.passed[1]), id(&ran.failed[0]), id(&ran.failed[1]));
    let r1 = user_with_role(&s, &t, "reviewer").await;
    let (k2, r2) = add_member(&s, &t, "leaves@example.com", "reviewer").await;
    let (_k3, r3) = add_member(&s, &t, "demoted@example.com", "reviewer").await;
    let (_k4, r4) = add_member(&s, &t, "removed@example.com", "reviewer").await;
    let member = |user: &str| format!("/v1/projects/{p}/members/{user}");

    // C1: three reviewers. R2 labels one result, then leaves; R3 becomes a
    // viewer; R1 is still labelling, so C1 waits for R1 alone.
    let c1 = calibration_by_ids(p, &[&p0, &f0], &[&r1, &r2, &r3]);
    let c1 = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(c1), 200).await);
    review(&s, &k2, &p0, false, &[]).await;
    s.expect(Method::DELETE, &member(&r2), &k2, None, 200).await;
    s.expect(Method::PATCH, &member(&r3), &t.owner, Some(json!({"role": "viewer"})), 200).await;
    assert_eq!(get_calibration(&s, &t.owner, &c1).await["status"], "open");
    review(&s, &t.reviewer, &p0, true, &[]).await;
    assert_eq!(get_calibration(&s, &t.owner, &c1).await["status"], "open", "R1 has not labelled f0 yet");
    // R1's last label is the last one anyone who can label owes.
    review(&s, &t.reviewer, &f0, false, &[]).await;
    let done = get_calibration(&s, &t.owner, &c1).await;
    assert_eq!(done["status"], "complete", "{done:#}");
    assert!(done["closed_at"].is_string(), "{done:#}");
    assert_eq!(done["progress"], json!({"labels_done": 3, "labels_total": 6}));
    // p0: R1 pass, R2 fail (a tie, left out of all but Fleiss' kappa); f0:
    // R1 fail = the automated verdict: agreement 1/1, TNR 1/1, no human
    // pass (Cohen's kappa and TPR undefined); Fleiss over p0 alone, the two
    // reviewers disagreeing with shares ½, ½: (0 − ½) / (1 − ½) = −1.
    assert_metrics(
        &done["overall"],
        [Some(1.0), None, Some(-1.0), None, Some(1.0)],
        "the label of the reviewer who left counts",
    );
    assert_sees_all(&s.expect(Method::GET, &format!("/v1/test-results/{p0}"), &t.reviewer, None, 200).await, "passed");

    // C2: R1 labels everything; R4 has not started. Removing R4 leaves no
    // one to wait for: C2 completes with that change, which says so.
    let c2 = calibration_by_ids(p, &[&p1, &f1], &[&r1, &r4]);
    let c2 = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(c2), 200).await);
    review(&s, &t.reviewer, &p1, true, &[]).await;
    review(&s, &t.reviewer, &f1, false, &[]).await;
    assert_blind(&s.expect(Method::GET, &format!("/v1/test-results/{f1}"), &t.reviewer, None, 200).await, &c2);
    s.expect(Method::DELETE, &member(&r4), &t.owner, None, 200).await;
    let done = get_calibration(&s, &t.reviewer, &c2).await;
    assert_eq!((done["status"].as_str(), done["blinded"].as_bool()), (Some("complete"), Some(false)), "{done:#}");
    assert_eq!(done["progress"], json!({"labels_done": 2, "labels_total": 4}));
    assert_sees_all(&s.expect(Method::GET, &format!("/v1/test-results/{f1}"), &t.reviewer, None, 200).await, "failed");
    let history =
        s.expect(Method::GET, &format!("/v1/activity/resource/project_member/{r4}"), &t.owner, None, 200).await;
    let removed = &history["activity"][0];
    assert_eq!(removed["action"], "project_member.remove", "{history:#}");
    assert_eq!(removed["changes"]["calibrations_completed"], json!([c2]), "{removed:#}");
    assert!(removed["summary"].as_str().unwrap().contains(&c2), "{removed:#}");
    // Its labels are final, as any complete calibration's.
    let e = refused(&s, Method::POST, "/v1/reviews", &t.reviewer, Some(review_body(&f1, true, &[], "")), 409).await;
    assert_eq!(e["error_code"], "review_locked");
}

/// A complete calibration's metrics as a read shows them: `[overall,
/// per_evaluator, disagreements]`.
fn metrics_of(calibration: &Value) -> Value {
    json!([calibration["overall"], calibration["per_evaluator"], calibration["disagreements"]])
}

/// The test's database, as the server holds it.
fn database(s: &TestServer) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.pragma_update(None, "foreign_keys", true).unwrap();
    db
}

/// Four calibrations over `[p0, f0]` in `t`'s project, each completed one
/// way (the last label, a close, a reviewer leaving, a reviewer becoming a
/// viewer), and one still open, with the labels of one reviewer each: `p0`
/// (automated pass) labelled fail, with "right day" failed, and `f0` fail,
/// so that `p0` is where humans and automation disagree. `(complete,
/// open)`.
async fn completed_every_way(s: &TestServer, t: &Team, p0: &str, f0: &str) -> (Vec<String>, String) {
    let p = &t.project_id;
    let member = |user: &str| format!("/v1/projects/{p}/members/{user}");
    let mut reviewers = Vec::new();
    for n in 0..8 {
        reviewers.push(add_member(s, t, &format!("fixed-{n}@example.com"), "reviewer").await);
    }
    let start = |assigned: Vec<String>| async move {
        let body = calibration_by_ids(p, &[p0, f0], &assigned.iter().map(String::as_str).collect::<Vec<_>>());
        id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200).await)
    };
    let label_both = |key: String| async move {
        review(s, &key, p0, false, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
        review(s, &key, f0, false, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
    };
    let mut complete = Vec::new();
    // The last label.
    let (k, r) = reviewers[0].clone();
    let c = start(vec![r]).await;
    label_both(k).await;
    complete.push(c);
    // A close, one reviewer's labels in, the other's not.
    let ((k, r), (_, other)) = (reviewers[1].clone(), reviewers[2].clone());
    let c = start(vec![r, other]).await;
    label_both(k).await;
    assert_eq!(get_calibration(s, &t.owner, &c).await["status"], "open");
    close(s, &t.editor, &c).await;
    complete.push(c);
    // The other reviewer leaving.
    let ((k, r), (_, other)) = (reviewers[3].clone(), reviewers[4].clone());
    let c = start(vec![r, other.clone()]).await;
    label_both(k).await;
    s.expect(Method::DELETE, &member(&other), &t.owner, None, 200).await;
    complete.push(c);
    // The other reviewer becoming a viewer.
    let ((k, r), (_, other)) = (reviewers[5].clone(), reviewers[6].clone());
    let c = start(vec![r, other.clone()]).await;
    label_both(k).await;
    s.expect(Method::PATCH, &member(&other), &t.owner, Some(json!({"role": "viewer"})), 200).await;
    complete.push(c);
    for c in &complete {
        let done = get_calibration(s, &t.owner, c).await;
        assert_eq!(done["status"], "complete", "{done:#}");
        // p0 is where they differ, overall and on "right day".
        assert_eq!(
            done["disagreements"],
            json!([{"test_result_id": p0, "evaluator": null, "human_label": false, "automated_label": true},
                   {"test_result_id": p0, "evaluator": RIGHT_DAY, "human_label": false, "automated_label": true}]),
            "{done:#}"
        );
        assert_metrics(&done["overall"], [Some(0.5), Some(0.0), None, None, Some(0.5)], "overall");
    }
    // Open: one of its two labels in.
    let (k, r) = reviewers[7].clone();
    let open = start(vec![r]).await;
    review(s, &k, p0, false, &[]).await;
    (complete, open)
}

/// A complete calibration's metrics are those of the moment it completed,
/// however it completed: a result deleted afterwards (its reviews with it)
/// leaves them as they were. An open calibration's are still measured from
/// what there is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_calibrations_metrics_stay_as_they_were_when_it_completed() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("fixed metrics").await;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (p0, f0) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let (complete, open) = completed_every_way(&s, &t, &p0, &f0).await;
    let mut before = BTreeMap::new();
    for c in complete.iter().chain([&open]) {
        before.insert(c.clone(), metrics_of(&get_calibration(&s, &t.owner, c).await));
    }
    assert_eq!(
        before[&open][2],
        json!([{"test_result_id": p0, "evaluator": null, "human_label": false, "automated_label": true}])
    );

    let deleted = database(&s).execute("DELETE FROM test_results WHERE id = ?1", [&p0]).unwrap();
    assert_eq!(deleted, 1);
    for c in &complete {
        let now = get_calibration(&s, &t.owner, c).await;
        assert_eq!(metrics_of(&now), before[c], "{c}: {now:#}");
    }
    let listed =
        all_pages(&s, &t.owner, &format!("/v1/reviews/calibration?project_id={}", t.project_id), "calibrations").await;
    for c in &complete {
        assert_eq!(metrics_of(find(&listed, "id", c)), before[c], "{c} listed");
    }
    // The open one has lost its only label, and its disagreement.
    let now = get_calibration(&s, &t.owner, &open).await;
    assert_eq!(now["disagreements"], json!([]), "{now:#}");
    assert_metrics(&now["overall"], [None; 5], "the open one, without its labelled result");
}

/// Reading complete calibrations reads none of their results' documents:
/// with every document made unreadable, a page of them (and each by id)
/// answers what it answered before, for the owner and for a reviewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_complete_calibrations_reads_no_result_document() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("no documents").await;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (p0, f0) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let (complete, open) = completed_every_way(&s, &t, &p0, &f0).await;
    close(&s, &t.editor, &open).await;
    let page = format!("/v1/reviews/calibration?project_id={}&status=complete", t.project_id);
    let mut before = BTreeMap::new();
    for key in [&t.owner, &t.reviewer] {
        before.insert(key.clone(), s.expect(Method::GET, &page, key, None, 200).await);
    }
    assert_eq!(before[&t.owner]["calibrations"].as_array().unwrap().len(), complete.len() + 1);

    let unreadable = database(&s).execute("UPDATE test_results SET document = 'not a document'", []).unwrap();
    assert_eq!(unreadable, 2);
    for key in [&t.owner, &t.reviewer] {
        let now = s.expect(Method::GET, &page, key, None, 200).await;
        assert_eq!(now, before[key]);
        for c in now["calibrations"].as_array().unwrap() {
            assert_eq!(&get_calibration(&s, key, &id(c)).await, c);
        }
    }
}

/// Reviewer statistics compare labels with each result's automated verdicts
/// without reading the result's document (the whole conversation, up to a
/// call's record, for a verdict and a few names): with every document made
/// unreadable, the statistics are what they were, to every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviewer_statistics_read_no_result_document() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("statistics without documents").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (rp, rf) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let editor_id = user_with_role(&s, &t, "editor").await;
    // Automated (T = passed): rp verdict T, confirms T, right day T; rf
    // verdict F, confirms T, right day F.
    review(&s, &t.reviewer, &rp, true, &[(CONFIRMS, true), (RIGHT_DAY, true)]).await;
    review(&s, &t.reviewer, &rf, true, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
    review(&s, &t.editor, &rp, false, &[(RIGHT_DAY, true)]).await;
    review(&s, &t.editor, &rf, false, &[]).await;
    let mut before = BTreeMap::new();
    for key in [&t.owner, &t.reviewer, &t.viewer] {
        before.insert(key.clone(), reviewers(&s, key, p).await);
    }
    // The reviewer: 6 labels, all but rf's verdict as the machine's → 5/6;
    // the editor: rp's verdict differs, rp's right day and rf's verdict
    // agree → 2/3. Their pairs: rp's verdict (differ), rp's right day
    // (equal), rf's verdict (differ) → 1/3 each.
    let stats = &before[&t.owner];
    for (user, automated) in [(&reviewer_id, 5.0 / 6.0), (&editor_id, 2.0 / 3.0)] {
        let of = find(stats, "user_id", user);
        assert_eq!(of["reviews_count"], 2, "{of:#}");
        close_to(&of["agreement_with_automated"], automated, "vs automated");
        close_to(&of["agreement_with_peers"], 1.0 / 3.0, "vs peers");
    }

    let unreadable = database(&s).execute("UPDATE test_results SET document = 'not a document'", []).unwrap();
    assert_eq!(unreadable, 2);
    for key in [&t.owner, &t.reviewer, &t.viewer] {
        assert_eq!(reviewers(&s, key, p).await, before[key]);
    }
}

/// An open calibration's metrics, measured on every read, compare its
/// labels with the automated verdicts kept beside its results, not with
/// their documents (each a whole conversation): with every document made
/// unreadable, it reads as before, by id and in a page, and closing it
/// keeps those metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_calibrations_metrics_read_no_result_document() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("open without documents").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (rp, rf) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let body = calibration_by_ids(p, &[&rp, &rf], &[&reviewer_id]);
    let c = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200).await);
    // rp (automated pass) labelled fail, right day failed: where humans and
    // automation differ, overall and on "right day".
    review(&s, &t.reviewer, &rp, false, &[(CONFIRMS, true), (RIGHT_DAY, false)]).await;
    let page = format!("/v1/reviews/calibration?project_id={p}");
    let open = get_calibration(&s, &t.owner, &c).await;
    assert_eq!(open["status"], "open");
    // One subject with a majority: agreement 0, no human pass (TPR
    // undefined), TNR 0; Cohen's κ over [[0, 0], [1, 0]]: p_o 0, p_e 0 →
    // 0; one reviewer (Fleiss' κ undefined).
    assert_metrics(&open["overall"], [Some(0.0), Some(0.0), None, None, Some(0.0)], "open");
    assert_eq!(
        open["disagreements"],
        json!([{"test_result_id": rp, "evaluator": null, "human_label": false, "automated_label": true},
               {"test_result_id": rp, "evaluator": RIGHT_DAY, "human_label": false, "automated_label": true}])
    );
    let listed = s.expect(Method::GET, &page, &t.owner, None, 200).await;

    let unreadable = database(&s).execute("UPDATE test_results SET document = 'not a document'", []).unwrap();
    assert_eq!(unreadable, 2);
    assert_eq!(get_calibration(&s, &t.owner, &c).await, open);
    assert_eq!(s.expect(Method::GET, &page, &t.owner, None, 200).await, listed);
    let closed = close(&s, &t.editor, &c).await;
    assert_eq!(metrics_of(&closed), metrics_of(&open));
    assert_eq!(metrics_of(&get_calibration(&s, &t.owner, &c).await), metrics_of(&open));
}

/// Writing a review checks its labels against the result's evaluators as
/// kept beside the result, without decoding the result's document (the
/// whole conversation) in the one writer every write waits for: with every
/// document made unreadable, reviews are written, refused and counted as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_is_written_without_reading_the_results_document() {
    let good = Agent::start(&[]);
    let bad = Agent::start(&["--bug", "wrong-day"]);
    let s = TestServer::start().await;
    let t = s.team("reviews without documents").await;
    let p = &t.project_id;
    let ran = run_batch(&s, &t, &good, &bad, 1, 1).await;
    let (rp, rf) = (id(&ran.passed[0]), id(&ran.failed[0]));
    let reviewer_id = user_with_role(&s, &t, "reviewer").await;
    let body = calibration_by_ids(p, &[&rf], &[&reviewer_id]);
    let c = id(&s.expect(Method::POST, "/v1/reviews/calibration", &t.editor, Some(body), 200).await);

    let unreadable = database(&s).execute("UPDATE test_results SET document = 'not a document'", []).unwrap();
    assert_eq!(unreadable, 2);
    let made = review(&s, &t.editor, &rp, true, &[(CONFIRMS, true), (RIGHT_DAY, true)]).await;
    assert_eq!(made["project_id"], p.as_str());
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews",
        &t.editor,
        Some(review_body(&rp, true, &[("no such evaluator", true)], "")),
        400,
    )
    .await;
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("evaluations[0]") && message.contains(&format!("{CONFIRMS}, {RIGHT_DAY}")), "{e}");
    forbidden(&s, Method::POST, "/v1/reviews", &t.viewer, Some(review_body(&rp, true, &[], ""))).await;
    refused(&s, Method::POST, "/v1/reviews", &t.outsider, Some(review_body(&rp, true, &[], "")), 404).await;
    // The calibration's one label completes it.
    let last = review(&s, &t.reviewer, &rf, false, &[(RIGHT_DAY, false)]).await;
    assert_eq!(last["calibration_id"], c.as_str());
    let done = get_calibration(&s, &t.owner, &c).await;
    assert_eq!(done["status"], "complete", "{done:#}");
    assert_metrics(&done["overall"], [Some(1.0), None, None, None, Some(1.0)], "one agreeing fail");
}

/// A result can have more than 100 evaluations (a scenario holds up to 1,000
/// evaluators, a test 100 more), and a review labels each of them: one
/// review of a result of 150 evaluations labels them all, and a label of a
/// name the result does not have is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_labels_every_evaluation_of_a_result_with_many() {
    let good = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("many evaluators").await;
    let p = &t.project_id;
    let persona = create(&s, &t.editor, "/v1/personas", json!({"project_id": p, "name": "Dana"})).await;
    let mut scenario = booking(p, &persona);
    let expect: Vec<Value> = (0..100)
        .map(|i| json!({"type": "not_contains", "name": format!("quiet {i}"), "text": format!("zz{i}zz")}))
        .collect();
    scenario["steps"][1]["expect"] = json!(expect);
    let scenario = create(&s, &t.editor, "/v1/scenarios", scenario).await;
    let channel = channel(&s, &t.editor, p, "http", &good.http_target()).await;
    let evaluators: Vec<Value> = (0..48)
        .map(|i| json!({"type": "not_contains", "name": format!("calm {i}"), "text": format!("yy{i}yy")}))
        .collect();
    let test = create(
        &s,
        &t.editor,
        "/v1/tests",
        json!({"project_id": p, "name": "books", "channel_id": channel, "scenario_id": scenario, "evaluators": evaluators}),
    )
    .await;
    let started = s.expect(Method::POST, &format!("/v1/tests/{test}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.owner, started["id"].as_str().unwrap()).await;
    assert_eq!(done["counts"]["passed"], 1, "{done:#}");
    let results = all_pages(&s, &t.owner, &format!("/v1/tests/{test}/results"), "test_results").await;
    let result = &results[0];
    let names: Vec<(String, bool)> = evaluations(result);
    assert_eq!(names.len(), 150, "{result:#}");
    let labels: Vec<(&str, bool)> = names.iter().map(|(n, passed)| (n.as_str(), *passed)).collect();
    let made = review(&s, &t.reviewer, &id(result), true, &labels).await;
    assert_eq!(made["evaluations"].as_array().unwrap().len(), 150, "{made:#}");
    let mut with_unknown = labels.clone();
    with_unknown.push(("no such evaluator", true));
    let e = refused(
        &s,
        Method::POST,
        "/v1/reviews",
        &t.reviewer,
        Some(review_body(&id(result), true, &with_unknown, "")),
        400,
    )
    .await;
    assert!(e["message"].as_str().unwrap().starts_with("evaluations[150].name"), "{e}");
    // More labels than any result has evaluations: refused as such.
    let many: Vec<String> = (0..1101).map(|i| format!("label {i}")).collect();
    let many: Vec<(&str, bool)> = many.iter().map(|n| (n.as_str(), true)).collect();
    let body = Some(review_body(&id(result), true, &many, ""));
    let e = refused(&s, Method::POST, "/v1/reviews", &t.reviewer, body, 400).await;
    assert!(e["message"].as_str().unwrap().contains("at most 1100 labels, got 1101"), "{e}");
}
