//! Bad input, systematically (DESIGN §2: "400 bad input", an `error_code`
//! and a message that names the offending field). Every operation of the
//! spec with a request body, and every query parameter, is read from
//! `spec/openapi.json` at run time; each must be placed in this file's
//! table ([`target`], [`list_path`]), so that an operation added later is
//! walked too. From a valid request, sent by the owner of real data, the
//! invalid variants are derived from the schema: each required property
//! removed, each property of the wrong JSON type, `null` where it is not
//! nullable, an `enum` value outside it, each `minLength`, `maxLength`,
//! `minItems`, `maxItems`, `maxProperties`, `minimum` and `maximum` just
//! past its bound, each `pattern` and `format` broken, an unknown property
//! in every declared object (the spec: "a field an operation does not
//! know, at any depth, is refused with 400 `invalid_body` naming it"), a
//! body that is not JSON and an empty body. Each must be a 400 with the
//! error shape, an `invalid_…` code and a message naming the field, and
//! nothing stored; the values just within each bound must be accepted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::engine::{create, wait_for_end, Agent};
use common::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

/// Marks a string to be written as the number after it.
const BEYOND: &str = "beyond:";

const SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/spec/openapi.json");

/// Within-bound values that a documented rule beyond the schema refuses:
/// `(operation or "*", field, bound, why)`. Each is the schema's bound
/// being weaker than the documented rule, never stricter.
const WITHIN_BOUND_EXCEPTIONS: &[(&str, &str, &str, &str)] = &[
    ("add_project_member", "email", "minLength", "an address is `NAME@DOMAIN`: no one has a 1-character one"),
    ("*", "target", "minLength", "a target is a URL or an E.164 number, never 1 character"),
];

fn spec() -> Value {
    serde_json::from_str(&std::fs::read_to_string(SPEC_PATH).unwrap()).unwrap()
}

/// Follows local `$ref`s.
fn resolve(spec: &Value, schema: &Value) -> Value {
    let mut schema = schema.clone();
    while let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        schema = spec.pointer(r.strip_prefix('#').unwrap()).unwrap().clone();
    }
    schema
}

struct Operation {
    id: String,
    method: Method,
    /// The body's schema, and whether the body must be sent.
    body: Option<(Value, bool)>,
    /// Query parameters: name and schema.
    query: Vec<(String, Value)>,
    /// Header parameters: name and schema.
    headers: Vec<(String, Value)>,
}

fn operations(spec: &Value) -> Vec<Operation> {
    let mut ops = Vec::new();
    for item in spec["paths"].as_object().unwrap().values() {
        for (method, op) in item.as_object().unwrap() {
            if !matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                continue;
            }
            let body = op.get("requestBody").map(|rb| {
                let rb = resolve(spec, rb);
                (resolve(spec, &rb["content"]["application/json"]["schema"]), rb["required"] == true)
            });
            let query = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| resolve(spec, p))
                .filter(|p| p["in"] == "query")
                .map(|p| (p["name"].as_str().unwrap().to_string(), resolve(spec, &p["schema"])))
                .collect();
            let headers = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| resolve(spec, p))
                .filter(|p| p["in"] == "header")
                .map(|p| (p["name"].as_str().unwrap().to_string(), resolve(spec, &p["schema"])))
                .collect();
            ops.push(Operation {
                id: op["operationId"].as_str().unwrap().to_string(),
                method: Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap(),
                body,
                query,
                headers,
            });
        }
    }
    assert!(ops.len() >= 70, "operations in the spec: {}", ops.len());
    ops
}

/// The owner's real data the requests are about.
struct Fixture {
    owner: String,
    agent_target: String,
    /// The project everything runs in.
    project: String,
    /// Another project of the owner's, for `PUT /projects/{id}`.
    other_project: String,
    /// The channel the pool of tests uses, and what runs.
    channel: String,
    /// A channel to change.
    channel_u: String,
    scenario_u: String,
    persona_u: String,
    /// `openai_compatible`, for judges.
    judge: String,
    /// `twilio`, to change and list numbers of.
    phone_integration: String,
    /// 1,000 tests of `channel`; the first is the one runs start.
    tests: Vec<String>,
    /// A test to change.
    test_u: String,
    /// 100 personas.
    personas: Vec<String>,
    /// 50 reviewers of `project` (user ids).
    reviewers: Vec<String>,
    /// 500 results of `results_test`, from `results_run`.
    results: Vec<String>,
    results_test: String,
    results_run: String,
    /// A result with 1,100 evaluations, and their names.
    big_result: String,
    big_names: Vec<String>,
    /// A batch to replace, and one to run.
    batch_u: String,
    batch_run_target: String,
    /// A member to change the role of.
    member_u: String,
    /// Users who are not members of `project`: by email (one of the longest
    /// address allowed too), and by id (sharing `other_project`).
    outsider_email: String,
    longest_email: String,
    outsider_id: String,
    /// An API key of the owner's to rotate.
    rotate_key: String,
}

fn scripted_scenario(project: &str, persona: &str, judge: &str, prefix: &str) -> Value {
    json!({"project_id": project, "name": "booking", "description": "d", "mode": "scripted",
           "first_message": "Hi", "goal": "book", "integration_id": null,
           "steps": [{"say": "Tuesday, please.", "expect": [{"type": "contains", "name": format!("{prefix}c"), "text": "ok"}]},
                     {"say": "Thanks.", "expect": evaluators(judge, &format!("{prefix}x-"))}],
           "success_criteria": evaluators(judge, prefix),
           "default_persona_id": persona, "max_turns": 20, "max_duration_s": 60, "tags": ["a"]})
}

/// One evaluator of every type, named with `prefix`.
fn evaluators(judge: &str, prefix: &str) -> Value {
    json!([
        {"type": "contains", "name": format!("{prefix}contains"), "critical": true, "text": "ok", "case_sensitive": false},
        {"type": "not_contains", "name": format!("{prefix}not"), "critical": false, "text": "no", "case_sensitive": true},
        {"type": "regex", "name": format!("{prefix}regex"), "critical": true, "pattern": "o+k"},
        {"type": "max_latency_ms", "name": format!("{prefix}latency"), "critical": true, "percentile": "p90", "ms": 5000},
        {"type": "max_turns", "name": format!("{prefix}turns"), "critical": true, "turns": 30},
        {"type": "agent_ended_call", "name": format!("{prefix}ended"), "critical": false},
        {"type": "tool_called", "name": format!("{prefix}tool"), "critical": false, "tool": "book", "arguments": {"day": "tue"}},
        {"type": "llm_judge", "name": format!("{prefix}judge"), "critical": false, "integration_id": judge, "prompt": "polite?"},
    ])
}

async fn make_fixture(s: &TestServer, agent: &Agent) -> Fixture {
    let owner = s.key_for_user("owner@example.com").await;
    let project = s.create_project(&owner, "main").await;
    let other_project = s.create_project(&owner, "other").await;
    let agent_target = agent.http_target();
    let channel = common::engine::channel(s, &owner, &project, "http", &agent_target).await;
    let channel_u = create(
        s,
        &owner,
        "/v1/channels",
        json!({"project_id": project, "name": "to change", "kind": "http", "target": agent_target}),
    )
    .await;
    let judge = create(
        s,
        &owner,
        "/v1/integrations",
        json!({"project_id": project, "provider": "openai_compatible", "name": "judge",
               "config": {"base_url": "https://llm.example.com/v1", "model": "m"}}),
    )
    .await;
    let phone_integration = create(
        s,
        &owner,
        "/v1/integrations",
        json!({"project_id": project, "provider": "twilio", "name": "line",
               "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
               "phone_numbers": [{"number": "+14155550100", "label": "main", "direction": "both"}]}),
    )
    .await;
    let mut personas = Vec::new();
    for i in 0..100 {
        personas.push(create(s, &owner, "/v1/personas", json!({"project_id": project, "name": format!("p{i}")})).await);
    }
    let persona_u = create(s, &owner, "/v1/personas", json!({"project_id": project, "name": "to change"})).await;
    let plain = |persona: &str| {
        json!({"project_id": project, "name": "plain", "mode": "scripted", "first_message": "Hi",
               "steps": [{"say": "Bye", "expect": []}], "default_persona_id": persona})
    };
    let scenario = create(s, &owner, "/v1/scenarios", plain(&personas[0])).await;
    let mut changed = plain(&personas[0]);
    changed["name"] = json!("to change");
    let scenario_u = create(s, &owner, "/v1/scenarios", changed).await;
    let mut tests = Vec::new();
    for i in 0..1000 {
        let body =
            json!({"project_id": project, "name": format!("t{i}"), "channel_id": channel, "scenario_id": scenario});
        tests.push(create(s, &owner, "/v1/tests", body).await);
    }
    let test_u = create(
        s,
        &owner,
        "/v1/tests",
        json!({"project_id": project, "name": "to change", "channel_id": channel_u, "scenario_id": scenario_u}),
    )
    .await;
    // 500 results: 5 personas × 100 iterations.
    let results_test = create(
        s,
        &owner,
        "/v1/tests",
        json!({"project_id": project, "name": "many", "channel_id": channel_u, "scenario_id": scenario,
               "persona_ids": personas[..5], "iterations": 100}),
    )
    .await;
    let started = s.expect(Method::POST, &format!("/v1/tests/{results_test}/run"), &owner, Some(json!({})), 200).await;
    let results_run = started["id"].as_str().unwrap().to_string();
    // A result with 1,100 evaluations: 1,000 of its scenario's, 100 of its
    // test's.
    let step_evaluators = |step: usize| -> Vec<Value> {
        (0..90).map(|i| json!({"type": "contains", "name": format!("e{step}-{i}"), "text": "x"})).collect()
    };
    let steps: Vec<Value> = (0..10).map(|i| json!({"say": "more", "expect": step_evaluators(i)})).collect();
    let criteria: Vec<Value> =
        (0..100).map(|i| json!({"type": "max_turns", "name": format!("c{i}"), "turns": 100})).collect();
    let big_scenario = create(
        s,
        &owner,
        "/v1/scenarios",
        json!({"project_id": project, "name": "big", "mode": "scripted", "first_message": "Hi", "steps": steps,
               "success_criteria": criteria, "default_persona_id": personas[0], "max_turns": 40}),
    )
    .await;
    let test_evaluators: Vec<Value> =
        (0..100).map(|i| json!({"type": "max_turns", "name": format!("t{i}"), "turns": 100})).collect();
    let big_test = create(
        s,
        &owner,
        "/v1/tests",
        json!({"project_id": project, "name": "big", "channel_id": channel_u, "scenario_id": big_scenario,
               "evaluators": test_evaluators}),
    )
    .await;
    let big_run = s.expect(Method::POST, &format!("/v1/tests/{big_test}/run"), &owner, Some(json!({})), 200).await;
    let done = wait_for_end(s, &owner, big_run["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let big = s.expect(Method::GET, &format!("/v1/tests/{big_test}/results"), &owner, None, 200).await;
    let big_result = big["test_results"][0]["id"].as_str().unwrap().to_string();
    let big_doc = s.expect(Method::GET, &format!("/v1/test-results/{big_result}"), &owner, None, 200).await;
    let big_names: Vec<String> =
        big_doc["evaluations"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(big_names.len(), 1100, "{big_doc:#}");

    let done = wait_for_end(s, &owner, &results_run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let results: Vec<String> =
        common::keys_of_pages(s, &owner, &format!("/v1/tests/{results_test}/results?limit=200"), "test_results", "id")
            .await;
    assert_eq!(results.len(), 500);

    let mut reviewers = Vec::new();
    for i in 0..50 {
        let email = format!("reviewer{i}@example.com");
        s.key_for_user(&email).await;
        let added = s.add_member(&owner, &project, &email, "reviewer").await;
        reviewers.push(added["user_id"].as_str().unwrap().to_string());
    }
    s.key_for_user("member@example.com").await;
    let member = s.add_member(&owner, &project, "member@example.com", "viewer").await;
    let member_u = member["user_id"].as_str().unwrap().to_string();
    let outsider_email = "outsider@example.com".to_string();
    s.key_for_user(&outsider_email).await;
    let domain = "@example.com";
    let longest_email = format!("{}{domain}", "l".repeat(320 - domain.len()));
    s.key_for_user(&longest_email).await;
    s.key_for_user("sharer@example.com").await;
    let sharer = s.add_member(&owner, &other_project, "sharer@example.com", "viewer").await;
    let outsider_id = sharer["user_id"].as_str().unwrap().to_string();

    let batch_u =
        create(s, &owner, "/v1/batches", json!({"project_id": project, "name": "to replace", "test_ids": [tests[0]]}))
            .await;
    let batch_run_target =
        create(s, &owner, "/v1/batches", json!({"project_id": project, "name": "to run", "test_ids": [tests[0]]}))
            .await;
    let key = s.expect(Method::POST, "/v1/api-keys", &owner, Some(json!({"label": "to rotate"})), 201).await;
    let rotate_key = key["id"].as_str().unwrap().to_string();
    Fixture {
        owner,
        agent_target,
        project,
        other_project,
        channel,
        channel_u,
        scenario_u,
        persona_u,
        judge,
        phone_integration,
        tests,
        test_u,
        personas,
        reviewers,
        results,
        results_test,
        results_run,
        big_result,
        big_names,
        batch_u,
        batch_run_target,
        member_u,
        outsider_email,
        longest_email,
        outsider_id,
        rotate_key,
    }
}

/// What to undo after a request was accepted, so that the next one starts
/// from the same state (and no limit fills up).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cleanup {
    None,
    RevokeKey,
    DeleteProject,
    CloseCalibration,
    RemoveMember,
    CancelBatchRun,
}

/// Where an operation's requests go: `(path, valid body)` pairs (together
/// they hold every property of the schema), the reads that must not change
/// when a request is refused, and the undo of an accepted one.
struct Target {
    requests: Vec<(String, Value)>,
    watch: Vec<String>,
    cleanup: Cleanup,
}

/// Every operation with a request body. An operation missing here fails
/// the test.
fn target(op: &str, f: &Fixture) -> Option<Target> {
    let p = &f.project;
    let one = |path: String, body: Value| vec![(path, body)];
    let lists = |list: &str| vec![format!("/v1/{list}?project_id={p}&limit=200")];
    let (requests, watch, cleanup) = match op {
        "create_api_key" => {
            (one("/v1/api-keys".into(), json!({"label": "ci"})), vec!["/v1/api-keys".into()], Cleanup::RevokeKey)
        }
        "rotate_api_key" => (
            one(format!("/v1/api-keys/{}/rotate", f.rotate_key), json!({})),
            vec!["/v1/api-keys".into()],
            Cleanup::None,
        ),
        "create_batch" => (
            one(
                "/v1/batches".into(),
                json!({"project_id": p, "name": "b", "description": "d", "test_ids": [f.tests[0]], "concurrency": 4}),
            ),
            lists("batches"),
            Cleanup::None,
        ),
        "replace_batch" => (
            one(
                format!("/v1/batches/{}", f.batch_u),
                json!({"name": "b", "description": "d", "test_ids": [f.tests[0]], "concurrency": 4}),
            ),
            vec![format!("/v1/batches/{}", f.batch_u)],
            Cleanup::None,
        ),
        "run_batch" => (
            one(format!("/v1/batches/{}/run", f.batch_run_target), json!({"metadata": {"commit": "abc"}})),
            lists("batch-runs"),
            Cleanup::CancelBatchRun,
        ),
        "create_channel" => (
            one(
                "/v1/channels".into(),
                json!({"project_id": p, "name": "c", "kind": "http", "target": f.agent_target, "integration_id": null,
                       "headers": {"x-team": "qa"}, "turn_timeout_ms": 3000, "max_call_duration_s": 60}),
            ),
            lists("channels"),
            Cleanup::None,
        ),
        "update_channel" => (
            one(
                format!("/v1/channels/{}", f.channel_u),
                json!({"name": "c", "target": f.agent_target, "integration_id": null, "headers": {"x-team": "qa"},
                       "turn_timeout_ms": 3000, "max_call_duration_s": 60}),
            ),
            vec![format!("/v1/channels/{}", f.channel_u)],
            Cleanup::None,
        ),
        "run_channel" => (
            one(
                format!("/v1/channels/{}/run", f.channel),
                json!({"test_ids": [f.tests[0]], "metadata": {"commit": "abc"}}),
            ),
            lists("batch-runs"),
            Cleanup::CancelBatchRun,
        ),
        "create_integration" => (
            one(
                "/v1/integrations".into(),
                json!({"project_id": p, "provider": "twilio", "name": "i",
                       "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"}, "credentials": {"auth_token": "t"},
                       "phone_numbers": [{"number": "+14155550101", "label": "l", "direction": "inbound"}]}),
            ),
            lists("integrations"),
            Cleanup::None,
        ),
        "update_integration" => (
            one(
                format!("/v1/integrations/{}", f.phone_integration),
                json!({"name": "i", "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
                       "credentials": {"auth_token": "t"},
                       "phone_numbers": [{"number": "+14155550101", "label": "l", "direction": "inbound"}]}),
            ),
            vec![format!("/v1/integrations/{}", f.phone_integration)],
            Cleanup::None,
        ),
        "create_persona" | "update_persona" => {
            let mut body = json!({"name": "Dana", "description": "d", "prompt": "be brief", "language": "en-US",
                                  "accent": "Scottish", "gender": "female",
                                  "voice": {"provider": "tts", "voice_id": "v1", "speed": 1.0},
                                  "background_noise": "cafe", "background_noise_volume": 0.5,
                                  "interruption_level": "low", "verbosity": "medium", "patience": "high", "tags": ["a"]});
            if op == "create_persona" {
                body["project_id"] = json!(p);
                (one("/v1/personas".into(), body), lists("personas"), Cleanup::None)
            } else {
                let path = format!("/v1/personas/{}", f.persona_u);
                (one(path.clone(), body), vec![path], Cleanup::None)
            }
        }
        "create_project" | "replace_project" => {
            let body = json!({"name": "p", "description": "d", "webhook_url": "https://hooks.example.com/in",
                              "webhook_secret": "whsec", "settings": {"max_call_duration_s": 60, "default_concurrency": 4}});
            if op == "create_project" {
                (one("/v1/projects".into(), body), vec!["/v1/projects?limit=200".into()], Cleanup::DeleteProject)
            } else {
                let path = format!("/v1/projects/{}", f.other_project);
                (one(path.clone(), body), vec![path], Cleanup::None)
            }
        }
        "add_project_member" => {
            let path = format!("/v1/projects/{p}/members");
            (
                vec![
                    (path.clone(), json!({"email": f.outsider_email, "role": "viewer"})),
                    (path.clone(), json!({"user_id": f.outsider_id, "role": "viewer"})),
                ],
                vec![format!("{path}?limit=200")],
                Cleanup::RemoveMember,
            )
        }
        "update_project_member" => {
            let path = format!("/v1/projects/{p}/members/{}", f.member_u);
            (one(path, json!({"role": "viewer"})), vec![format!("/v1/projects/{p}/members?limit=200")], Cleanup::None)
        }
        "create_review" => (
            one(
                "/v1/reviews".into(),
                json!({"test_result_id": f.big_result, "verdict": "pass",
                       "evaluations": [{"name": f.big_names[0], "passed": true}], "notes": "n"}),
            ),
            lists("reviews"),
            Cleanup::None,
        ),
        "create_calibration" => (
            vec![
                (
                    "/v1/reviews/calibration".into(),
                    json!({"project_id": p, "test_result_ids": [f.results[0]], "reviewer_ids": [f.reviewers[0]]}),
                ),
                (
                    "/v1/reviews/calibration".into(),
                    json!({"project_id": p, "sample": {"test_id": f.results_test, "batch_run_id": null, "size": 1, "seed": 7},
                           "reviewer_ids": [f.reviewers[0]]}),
                ),
                (
                    "/v1/reviews/calibration".into(),
                    json!({"project_id": p, "sample": {"batch_run_id": f.results_run, "test_id": null, "size": 1, "seed": 7},
                           "reviewer_ids": [f.reviewers[0]]}),
                ),
            ],
            lists("reviews/calibration"),
            Cleanup::CloseCalibration,
        ),
        "create_scenario" => (
            one("/v1/scenarios".into(), scripted_scenario(p, &f.personas[0], &f.judge, "s-")),
            lists("scenarios"),
            Cleanup::None,
        ),
        "replace_scenario" => {
            let mut body = scripted_scenario(p, &f.personas[0], &f.judge, "s-");
            body.as_object_mut().unwrap().remove("project_id");
            let path = format!("/v1/scenarios/{}", f.scenario_u);
            (one(path.clone(), body), vec![path], Cleanup::None)
        }
        "create_test" | "update_test" => {
            let mut body = json!({"name": "t", "description": "d", "channel_id": f.channel_u, "scenario_id": f.scenario_u,
                                  "persona_ids": [f.personas[0]], "iterations": 1, "evaluators": evaluators(&f.judge, "t-"),
                                  "pass_threshold": 0.5, "tags": ["a"]});
            if op == "create_test" {
                body["project_id"] = json!(p);
                (one("/v1/tests".into(), body), lists("tests"), Cleanup::None)
            } else {
                let path = format!("/v1/tests/{}", f.test_u);
                (one(path.clone(), body), vec![path], Cleanup::None)
            }
        }
        "run_test" => (
            one(format!("/v1/tests/{}/run", f.tests[0]), json!({"metadata": {"commit": "abc"}})),
            lists("batch-runs"),
            Cleanup::CancelBatchRun,
        ),
        _ => return None,
    };
    Some(Target { requests, watch, cleanup })
}

/// The path of every operation with query parameters. An operation missing
/// here fails the test.
fn list_path(op: &str, f: &Fixture) -> Option<String> {
    Some(match op {
        "list_activity" => "/v1/activity".into(),
        "list_resource_activity" => format!("/v1/activity/resource/test/{}", f.tests[0]),
        "list_api_keys" => "/v1/api-keys".into(),
        "list_batch_runs" => "/v1/batch-runs".into(),
        "list_batch_run_runs" => format!("/v1/batch-runs/{}/runs", f.results_run),
        "list_batch_run_tests" => format!("/v1/batch-runs/{}/tests", f.results_run),
        "list_batches" => "/v1/batches".into(),
        "list_channels" => "/v1/channels".into(),
        "list_integrations" => "/v1/integrations".into(),
        "list_integration_phone_numbers" => format!("/v1/integrations/{}/phone-numbers", f.phone_integration),
        "list_personas" => "/v1/personas".into(),
        "list_projects" => "/v1/projects".into(),
        "list_project_members" => format!("/v1/projects/{}/members", f.project),
        "list_webhook_deliveries" => format!("/v1/projects/{}/webhook-deliveries", f.project),
        "list_reviews" => "/v1/reviews".into(),
        "list_calibrations" => "/v1/reviews/calibration".into(),
        "list_reviewers" => "/v1/reviews/reviewers".into(),
        "list_scenarios" => "/v1/scenarios".into(),
        "list_tests" => "/v1/tests".into(),
        "list_test_results" => format!("/v1/tests/{}/results", f.results_test),
        "list_transactions" => "/v1/transactions".into(),
        _ => return None,
    })
}

/// A step of the path to a value in a body.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

fn show(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => out.push_str(&format!(".{k}")),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() {
        "(the body)".into()
    } else {
        out
    }
}

/// The property names along a path.
fn names(path: &[Seg]) -> Vec<String> {
    path.iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.clone()),
            Seg::Index(_) => None,
        })
        .collect()
}

/// `root` with the value at `path` replaced (`None`: removed).
fn with(root: &Value, path: &[Seg], new: Option<Value>) -> Value {
    let mut root = root.clone();
    let (last, parents) = path.split_last().expect("not the root");
    let mut here = &mut root;
    for seg in parents {
        here = match seg {
            Seg::Key(k) => &mut here[k.as_str()],
            Seg::Index(i) => &mut here[*i],
        };
    }
    match (last, new) {
        (Seg::Key(k), Some(v)) => {
            here[k.as_str()] = v;
        }
        (Seg::Key(k), None) => {
            here.as_object_mut().unwrap().remove(k);
        }
        (Seg::Index(i), Some(v)) => here[*i] = v,
        (Seg::Index(i), None) => {
            here.as_array_mut().unwrap().remove(*i);
        }
    }
    root
}

#[derive(Clone, Debug)]
enum Expect {
    /// A 400 whose code is `invalid_<one of these>` and whose message names
    /// the first.
    Refused { field: Vec<String>, codes: Vec<String> },
    /// Within every bound: accepted. `bound` names the schema keyword, for
    /// [`WITHIN_BOUND_EXCEPTIONS`].
    Accepted { field: String, bound: &'static str },
}

struct Variant {
    what: String,
    body: Option<String>,
    expect: Expect,
}

struct Walk<'a> {
    spec: &'a Value,
    fixture: &'a Fixture,
    op: &'a str,
    root: Value,
    out: Vec<Variant>,
    /// Property paths (indices left out) the body held, and those the
    /// schema declares, for the check that the valid bodies hold them all.
    walked: BTreeSet<String>,
    declared: BTreeSet<String>,
}

impl Walk<'_> {
    fn refused(&mut self, path: &[Seg], what: String, value: Option<Value>) {
        let names = names(path);
        // The message names where: the whole path of a value, or the path
        // of the object a removed property is missing from and the property.
        let field = match (&value, path.split_last()) {
            (None, Some((Seg::Key(k), parent))) if !parent.is_empty() => vec![show(parent), k.clone()],
            _ => vec![show(path)],
        };
        let codes: Vec<String> = names.iter().map(|n| format!("invalid_{n}")).collect();
        let body = with(&self.root, path, value).to_string();
        // A number JSON can write but `serde_json::Value` cannot hold.
        let body = match body.find(&format!("\"{BEYOND}")) {
            Some(at) => {
                let end = body[at + 1..].find('"').unwrap() + at + 1;
                format!("{}{}{}", &body[..at], &body[at + 1 + BEYOND.len()..end], &body[end + 1..])
            }
            None => body,
        };
        self.out.push(Variant {
            what: format!("{}: {what}", show(path)),
            body: Some(body),
            expect: Expect::Refused { field, codes },
        });
    }

    fn accepted(&mut self, path: &[Seg], what: String, value: Value, bound: &'static str) {
        let field = names(path).last().cloned().unwrap_or_default();
        let body = with(&self.root, path, Some(value));
        self.out.push(Variant {
            what: format!("{}: {what}", show(path)),
            body: Some(body.to_string()),
            expect: Expect::Accepted { field, bound },
        });
    }

    /// An unknown property added to the object at `path`.
    fn unknown(&mut self, path: &[Seg]) {
        let mut body = self.root.clone();
        let mut here = &mut body;
        for seg in path {
            here = match seg {
                Seg::Key(k) => &mut here[k.as_str()],
                Seg::Index(i) => &mut here[*i],
            };
        }
        here["zz_unknown"] = json!(1);
        self.out.push(Variant {
            what: format!("{}: an unknown property", show(path)),
            body: Some(body.to_string()),
            expect: Expect::Refused { field: vec!["zz_unknown".into()], codes: vec!["invalid_body".into()] },
        });
    }

    fn walk(&mut self, schema: &Value, value: &Value, path: Vec<Seg>, required: bool) {
        let mut schema = resolve(self.spec, schema);
        if let Some(branches) = schema.get("oneOf").and_then(Value::as_array) {
            let tag = &value["type"];
            let branch = branches
                .iter()
                .map(|b| resolve(self.spec, b))
                .find(|b| &b["properties"]["type"]["enum"][0] == tag)
                .unwrap_or_else(|| panic!("{}: {}: no branch for {value}", self.op, show(&path)));
            let at = names(&path).join(".");
            for b in branches {
                let t = resolve(self.spec, b)["properties"]["type"]["enum"][0].as_str().unwrap().to_string();
                self.declared.insert(format!("{at}<{t}>"));
            }
            self.walked.insert(format!("{at}<{}>", tag.as_str().unwrap()));
            schema = branch;
        }
        let ty = schema["type"].as_str().unwrap_or("object").to_string();
        if !path.is_empty() {
            if required && matches!(path.last(), Some(Seg::Key(_))) {
                self.refused(&path, "removed (required)".into(), None);
            }
            if schema["nullable"] != true {
                self.refused(&path, "null".into(), Some(Value::Null));
            }
            let wrong: &[Value] = match ty.as_str() {
                "string" => &[json!(7), json!(true), json!(["x"])],
                "integer" => &[json!("7"), json!(1.5), json!(true)],
                "number" => &[json!("0.5"), json!(false)],
                "boolean" => &[json!("true"), json!(1)],
                "array" => &[json!({}), json!("x")],
                _ => &[json!([]), json!("x"), json!(7)],
            };
            for w in wrong {
                self.refused(&path, format!("the wrong type, {w}"), Some(w.clone()));
            }
        }
        let num = |k: &str| schema.get(k).and_then(Value::as_f64);
        let int = |k: &str| schema.get(k).and_then(Value::as_i64);
        match ty.as_str() {
            "string" => {
                if let Some(values) = schema.get("enum").and_then(Value::as_array) {
                    if values.len() > 1 || !matches!(path.last(), Some(Seg::Key(k)) if k == "type") {
                        self.refused(&path, "outside its enum".into(), Some(json!("not_a_value")));
                        self.refused(
                            &path,
                            "outside its enum, in another case".into(),
                            Some(json!(values[0].as_str().unwrap().to_uppercase())),
                        );
                    } else {
                        self.refused(&path, "an unknown type".into(), Some(json!("not_a_type")));
                    }
                }
                if let Some(min) = int("minLength").filter(|m| *m > 0) {
                    let min = min as usize;
                    self.refused(
                        &path,
                        format!("{} characters (minLength {min})", min - 1),
                        Some(json!(self.text(&path, min - 1))),
                    );
                    self.within(&path, min, "minLength");
                }
                if let Some(max) = int("maxLength") {
                    let max = max as usize;
                    // Lengths are characters, not bytes (nor UTF-16 units):
                    // two-byte and four-byte ones count one each.
                    let field = names(&path).last().cloned().unwrap_or_default();
                    // (Not where a pattern decides which characters.)
                    let patterned = schema.get("pattern").is_some();
                    if !patterned && !matches!(field.as_str(), "email" | "language" | "target" | "webhook_url") {
                        let c = if self.op.starts_with("create_") { "é" } else { "ü" };
                        for (c, what) in [(c, "two-byte"), (if c == "é" { "😀" } else { "🙂" }, "four-byte")] {
                            self.accepted(
                                &path,
                                format!("{max} {what} characters (maxLength)"),
                                json!(c.repeat(max)),
                                "maxLength",
                            );
                            self.refused(
                                &path,
                                format!("{} {what} characters (maxLength {max})", max + 1),
                                Some(json!(c.repeat(max + 1))),
                            );
                        }
                    }
                    self.refused(
                        &path,
                        format!("{} characters (maxLength {max})", max + 1),
                        Some(json!(self.text(&path, max + 1))),
                    );
                    self.within(&path, max, "maxLength");
                }
                if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                    let (bad, good) = pattern_cases(pattern);
                    for b in bad {
                        self.refused(&path, format!("{b:?} breaks its pattern"), Some(json!(b)));
                    }
                    for g in good {
                        self.accepted(&path, format!("{g:?} matches its pattern"), json!(g), "pattern");
                    }
                }
                if let Some(format) = schema.get("format").and_then(Value::as_str) {
                    panic!("{}: {}: no case for a body string of format {format}", self.op, show(&path));
                }
            }
            "integer" => {
                let (lowest, highest) = match schema["format"].as_str() {
                    Some("int32") => (i32::MIN as i64, i32::MAX as i64),
                    Some("int64") | None => (i64::MIN, i64::MAX),
                    Some(other) => panic!("{}: integer format {other}", self.op),
                };
                match int("minimum") {
                    Some(min) => {
                        self.refused(&path, format!("{} (minimum {min})", min - 1), Some(json!(min - 1)));
                        self.accepted(&path, format!("{min} (minimum)"), json!(min), "minimum");
                    }
                    None => {
                        self.refused(
                            &path,
                            "below its format".into(),
                            Some(json!(format!("{BEYOND}{}", lowest as i128 - 1))),
                        );
                        self.accepted(&path, format!("{lowest} (the least of its format)"), json!(lowest), "format");
                    }
                }
                match int("maximum") {
                    Some(max) => {
                        self.refused(&path, format!("{} (maximum {max})", max + 1), Some(json!(max + 1)));
                        self.accepted(&path, format!("{max} (maximum)"), json!(max), "maximum");
                    }
                    None => {
                        self.refused(
                            &path,
                            "past its format".into(),
                            Some(json!(format!("{BEYOND}{}", highest as i128 + 1))),
                        );
                        self.accepted(&path, format!("{highest} (the most of its format)"), json!(highest), "format");
                    }
                }
            }
            "number" => {
                // Past what a double holds.
                self.refused(&path, "1e400, past its format".into(), Some(json!(format!("{BEYOND}1e400"))));
                if let Some(min) = num("minimum") {
                    self.refused(&path, format!("just below {min}"), Some(json!(min - 0.001)));
                    self.accepted(&path, format!("{min} (minimum)"), json!(min), "minimum");
                }
                if let Some(max) = num("maximum") {
                    self.refused(&path, format!("just above {max}"), Some(json!(max + 0.001)));
                    self.accepted(&path, format!("{max} (maximum)"), json!(max), "maximum");
                }
            }
            "boolean" => {}
            "array" => {
                let items = value.as_array().unwrap_or_else(|| panic!("{}: {} is not an array", self.op, show(&path)));
                assert!(!items.is_empty(), "{}: {}: a valid body's list needs an item to walk", self.op, show(&path));
                if let Some(min) = int("minItems").filter(|m| *m > 0) {
                    let min = min as usize;
                    self.refused(
                        &path,
                        format!("{} items (minItems {min})", min - 1),
                        Some(self.items(&path, &items[0], min - 1)),
                    );
                    let v = self.items(&path, &items[0], min);
                    self.accepted(&path, format!("{min} items (minItems)"), v, "minItems");
                }
                if let Some(max) = int("maxItems") {
                    let max = max as usize;
                    self.refused(
                        &path,
                        format!("{} items (maxItems {max})", max + 1),
                        Some(self.items(&path, &items[0], max + 1)),
                    );
                    let v = self.items(&path, &items[0], max);
                    self.accepted(&path, format!("{max} items (maxItems)"), v, "maxItems");
                }
                for (i, item) in items.iter().enumerate() {
                    let mut at = path.clone();
                    at.push(Seg::Index(i));
                    self.walk(&schema["items"], item, at, false);
                }
            }
            _ => {
                let props = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
                let declared_object = schema.get("properties").is_some();
                if let Some(values) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    // A map (`headers`): its values typed, its size bounded.
                    let map = value.as_object().cloned().unwrap_or_default();
                    let (name, _) =
                        map.iter().next().unwrap_or_else(|| panic!("{}: {}: an empty map", self.op, show(&path)));
                    let mut at = path.clone();
                    at.push(Seg::Key(name.clone()));
                    // A value as any other: its type, and its bounds.
                    let first = map[name].clone();
                    self.walk(values, &first, at, false);
                    if let Some(max) = int("maxProperties") {
                        let max = max as usize;
                        let many = |n: usize| -> Value {
                            (0..n).map(|i| (format!("x-h{i}"), json!("v"))).collect::<serde_json::Map<_, _>>().into()
                        };
                        self.refused(
                            &path,
                            format!("{} properties (maxProperties {max})", max + 1),
                            Some(many(max + 1)),
                        );
                        self.accepted(&path, format!("{max} properties (maxProperties)"), many(max), "maxProperties");
                    }
                    return;
                }
                if !declared_object {
                    // Free-form (`metadata`, `config`): any keys.
                    return;
                }
                if schema["additionalProperties"] == false {
                    self.unknown(&path);
                }
                if let (false, Some((k, v))) = (path.is_empty(), value.as_object().and_then(|m| m.iter().next())) {
                    // Its first property given twice, in the text.
                    let marker = json!("__twice__");
                    let text = with(&self.root, &path, Some(marker.clone())).to_string();
                    let object = value.to_string();
                    let twice = format!("{},{}:{v}}}", object.strip_suffix('}').unwrap(), json!(k));
                    let mut at = path.clone();
                    at.push(Seg::Key(k.clone()));
                    self.out.push(Variant {
                        what: format!("{}: given twice", show(&at)),
                        body: Some(text.replacen(&marker.to_string(), &twice, 1)),
                        expect: Expect::Refused {
                            field: vec![show(&path), k.clone()],
                            codes: names(&at).iter().map(|n| format!("invalid_{n}")).collect(),
                        },
                    });
                }
                if !path.is_empty() {
                    let values: Vec<Value> = value.as_object().unwrap().values().cloned().collect();
                    self.refused(&path, "written as an array of its values".into(), Some(Value::Array(values)));
                }
                let required: BTreeSet<&str> =
                    schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let obj = value.as_object().cloned().unwrap_or_default();
                let at = names(&path).join(".");
                for (name, property) in &props {
                    let key = if at.is_empty() { name.clone() } else { format!("{at}.{name}") };
                    self.declared.insert(key.clone());
                    if let Some(v) = obj.get(name) {
                        self.walked.insert(key);
                        let mut next = path.clone();
                        next.push(Seg::Key(name.clone()));
                        self.walk(property, v, next, required.contains(name.as_str()));
                    }
                }
            }
        }
    }

    /// A string of `n` characters for the field at `path`, valid for it
    /// where the field can be that long.
    fn text(&self, path: &[Seg], n: usize) -> String {
        self.filled(path, n).unwrap_or_else(|| "x".repeat(n))
    }

    fn filled(&self, path: &[Seg], n: usize) -> Option<String> {
        let f = self.fixture;
        let field = names(path).last().cloned().unwrap_or_default();
        let pad = |base: &str, sep: &str| -> Option<String> {
            let rest = n.checked_sub(base.len() + sep.len())?;
            Some(format!("{base}{sep}{}", "a".repeat(rest)))
        };
        match field.as_str() {
            "email" => (n == f.longest_email.len()).then(|| f.longest_email.clone()),
            "language" => match n {
                2 => Some("en".into()),
                35 => Some("en-x-aaaaaaaa-bbbbbbbb-cccccccc-ddd".into()),
                _ => None,
            },
            "target" => pad(&f.agent_target, "?q="),
            "webhook_url" => pad("https://hooks.example.com/in", "?q="),
            // Names are unique in a project: not those the creates gave.
            "name" if !self.op.starts_with("create_") => Some("y".repeat(n)),
            _ => Some("x".repeat(n)),
        }
    }

    fn within(&mut self, path: &[Seg], n: usize, bound: &'static str) {
        match self.filled(path, n) {
            Some(v) => self.accepted(path, format!("{n} characters ({bound})"), json!(v), bound),
            None => {
                let field = names(path).last().cloned().unwrap_or_default();
                self.out.push(Variant {
                    what: format!("{}: {n} characters ({bound}), no valid value that long", show(path)),
                    body: None,
                    expect: Expect::Accepted { field, bound },
                });
            }
        }
    }

    /// `n` items for the list at `path`, each valid and distinct where the
    /// list needs them distinct.
    fn items(&self, path: &[Seg], first: &Value, n: usize) -> Value {
        let f = self.fixture;
        let field = names(path).last().cloned().unwrap_or_default();
        let pick = |pool: &[String], i: usize| {
            json!(pool.get(i).cloned().unwrap_or_else(|| format!("{}_{i:04}", &pool[0][..3])))
        };
        Value::Array(
            (0..n)
                .map(|i| match field.as_str() {
                    "test_ids" => pick(&f.tests, i),
                    "persona_ids" => pick(&f.personas, i),
                    "test_result_ids" => pick(&f.results, i),
                    "reviewer_ids" => pick(&f.reviewers, i),
                    "tags" => json!(format!("tag{i}")),
                    "phone_numbers" => {
                        let mut v = first.clone();
                        v["number"] = json!(format!("+1415555{i:04}"));
                        v
                    }
                    "evaluations" => {
                        let mut v = first.clone();
                        v["name"] = json!(f.big_names.get(i).cloned().unwrap_or_else(|| format!("n{i}")));
                        v
                    }
                    _ if first.get("name").is_some() => {
                        let mut v = first.clone();
                        v["name"] = json!(format!("{}{i}", first["name"].as_str().unwrap()));
                        v
                    }
                    _ => first.clone(),
                })
                .collect(),
        )
    }
}

/// Values that break, and values that match, each pattern of the spec.
fn pattern_cases(pattern: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    match pattern {
        r"^\+[1-9][0-9]{1,14}$" => (
            vec!["14155550100", "+04155550100", "+1", "+1234567890123456", "+1415555010a", " +14155550100"],
            vec!["+12", "+123456789012345"],
        ),
        // A header value: visible ASCII, spaces and tabs.
        r"^[\x20-\x7E\t]*$" => {
            (vec!["caf\u{e9}", "two\nlines", "a\rb", "del\u{7f}", "nul\u{0}"], vec!["a\tb c", "~!#"])
        }
        other => panic!("no cases for the pattern {other}"),
    }
}

/// Reads that must not change when a request is refused: the owner's
/// newest activity records (every change writes one) and the target's own.
async fn snapshot(s: &TestServer, key: &str, watch: &[String]) -> Vec<(String, Value)> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("last_used_at");
                m.remove("request_id");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut all = Vec::new();
    for path in std::iter::once(&"/v1/activity?limit=3".to_string()).chain(watch) {
        let resp = s.http.get(s.url(path)).header("x-api-key", key).send().await.unwrap();
        let status = resp.status().as_u16();
        let mut v: Value = resp.json().await.unwrap_or(Value::Null);
        strip(&mut v);
        all.push((path.clone(), json!({"status": status, "body": v})));
    }
    all
}

/// Checks a refusal: `Err` says what is wrong.
fn check_refusal(status: u16, text: &str, field: &[String], codes: &[String]) -> Result<(), String> {
    if status != 400 {
        return Err(format!("{status}, not 400: {text}"));
    }
    let body: Value = serde_json::from_str(text).map_err(|_| format!("not JSON: {text}"))?;
    for k in ["error_code", "message", "request_id"] {
        if !body[k].is_string() {
            return Err(format!("the error lacks {k}: {text}"));
        }
    }
    let code = body["error_code"].as_str().unwrap();
    if !codes.iter().any(|c| c == code) {
        return Err(format!("error_code {code}, not one of {codes:?}: {text}"));
    }
    let message = body["message"].as_str().unwrap();
    if let Some(missing) = field.iter().find(|f| !message.contains(f.as_str())) {
        return Err(format!("the message does not name `{missing}`: {text}"));
    }
    Ok(())
}

struct Sent {
    status: u16,
    text: String,
}

async fn send(
    http: &reqwest::Client,
    s: &TestServer,
    key: &str,
    method: &Method,
    path: &str,
    body: Option<&str>,
) -> Result<Sent, String> {
    send_with(http, s, key, method, path, body, None).await
}

async fn send_with(
    http: &reqwest::Client,
    s: &TestServer,
    key: &str,
    method: &Method,
    path: &str,
    body: Option<&str>,
    header: Option<(&str, &str)>,
) -> Result<Sent, String> {
    let mut req = http.request(method.clone(), s.url(path)).header("x-api-key", key);
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body.to_string());
    }
    let resp = req.send().await.map_err(|e| format!("no answer: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| format!("no whole answer: {e}"))?;
    Ok(Sent { status, text })
}

async fn undo(s: &TestServer, f: &Fixture, cleanup: Cleanup, path: &str, answer: &str) {
    let v: Value = serde_json::from_str(answer).unwrap_or_default();
    let id = v["id"].as_str().unwrap_or_default();
    let (method, at) = match cleanup {
        Cleanup::None => return,
        Cleanup::RevokeKey => (Method::DELETE, format!("/v1/api-keys/{id}")),
        Cleanup::DeleteProject => (Method::DELETE, format!("/v1/projects/{id}")),
        Cleanup::CloseCalibration => (Method::POST, format!("/v1/reviews/calibration/{id}/close")),
        Cleanup::RemoveMember => (Method::DELETE, format!("{path}/{}", v["user_id"].as_str().unwrap_or_default())),
        Cleanup::CancelBatchRun => (Method::POST, format!("/v1/batch-runs/{id}/cancel")),
    };
    let resp = s.send_json(method, &at, &f.owner, None).await;
    assert!(resp.status().is_success(), "undo {at}: {}", resp.text().await.unwrap());
    if cleanup == Cleanup::CancelBatchRun {
        // Its end is recorded once its runs have stopped: wait for it, so
        // that no record comes in while a refused request is checked.
        wait_for_end(s, &f.owner, id).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn excepted(op: &str, field: &str, bound: &str) -> bool {
    WITHIN_BOUND_EXCEPTIONS.iter().any(|(o, fd, b, _)| (*o == "*" || *o == op) && *fd == field && *b == bound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_constraint_of_every_request_body_and_query_parameter_violated_is_a_clear_400() {
    let spec = spec();
    let ops = operations(&spec);
    let agent = Agent::start(&[]);
    let s = TestServer::start_configured(Vec::new(), |c| c.starting_credits = 100_000_000).await;
    let f = make_fixture(&s, &agent).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();

    let unplaced: Vec<&str> = ops
        .iter()
        .filter(|o| {
            (o.body.is_some() && target(&o.id, &f).is_none()) || (!o.query.is_empty() && list_path(&o.id, &f).is_none())
        })
        .map(|o| o.id.as_str())
        .collect();
    assert!(unplaced.is_empty(), "operations of the spec not in this file's tables: {unplaced:?}");

    let mut failures: Vec<String> = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unique = 0;
    for op in ops.iter().filter(|o| o.body.is_some()) {
        let (schema, required) = op.body.clone().unwrap();
        let t = target(&op.id, &f).unwrap();
        let mut walked = BTreeSet::new();
        let mut declared = BTreeSet::new();
        for (path, valid) in &t.requests {
            let mut w = Walk {
                spec: &spec,
                fixture: &f,
                op: &op.id,
                root: valid.clone(),
                out: Vec::new(),
                walked: BTreeSet::new(),
                declared: BTreeSet::new(),
            };
            w.walk(&schema, valid, Vec::new(), true);
            walked.extend(w.walked);
            declared.extend(w.declared);
            let mut variants = vec![Variant {
                what: "the valid body".into(),
                body: Some(valid.to_string()),
                expect: Expect::Accepted { field: String::new(), bound: "" },
            }];
            variants.extend(w.out);
            for (what, raw) in [
                ("a body that is not JSON", "{\"name\": "),
                ("a body that is not JSON", "not json"),
                ("a JSON array", "[]"),
                ("a JSON string", "\"x\""),
                ("trailing characters", "{} x"),
                ("null", "null"),
                ("a number", "7"),
            ] {
                variants.push(Variant {
                    what: what.into(),
                    body: Some(raw.into()),
                    expect: Expect::Refused { field: Vec::new(), codes: vec!["invalid_body".into()] },
                });
            }
            // Each property given twice, the second time with the same value:
            // which one counts would be the reader's guess.
            let text = valid.to_string();
            for (k, v) in valid.as_object().unwrap() {
                variants.push(Variant {
                    what: format!("{k}: given twice"),
                    body: Some(format!("{},{}:{v}}}", text.strip_suffix('}').unwrap(), json!(k))),
                    expect: Expect::Refused {
                        field: vec![k.clone()],
                        codes: vec![format!("invalid_{k}"), "invalid_body".into()],
                    },
                });
            }
            variants.push(Variant {
                what: "an empty body".into(),
                body: Some(String::new()),
                expect: if required {
                    Expect::Refused { field: Vec::new(), codes: vec!["invalid_body".into()] }
                } else {
                    Expect::Accepted { field: String::new(), bound: "" }
                },
            });
            for v in variants {
                let what = format!("{} {path} ({}) {}", op.method, op.id, v.what);
                let Some(mut body) = v.body.clone() else {
                    if let Expect::Accepted { field, bound } = &v.expect {
                        if !excepted(&op.id, field, bound) {
                            failures
                                .push(format!("{what}: a bound no valid value reaches, and not a listed exception"));
                        }
                    }
                    continue;
                };
                *counts
                    .entry(if matches!(v.expect, Expect::Refused { .. }) { "refused" } else { "accepted" })
                    .or_default() += 1;
                // Names are unique in a project: each create names its
                // resource anew, but where the name is what is tried. In the
                // text, so that a property given twice stays twice.
                if op.id.starts_with("create_") && !v.what.starts_with("name:") {
                    if let Some(name) = valid.get("name") {
                        unique += 1;
                        body = body.replacen(&format!("\"name\":{name}"), &format!("\"name\":\"n{unique}\""), 1);
                    }
                }
                let before = snapshot(&s, &f.owner, &t.watch).await;
                let sent = match send(&http, &s, &f.owner, &op.method, path, Some(&body)).await {
                    Ok(sent) => sent,
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                match &v.expect {
                    Expect::Refused { field, codes } => {
                        if (200..300).contains(&sent.status) {
                            failures.push(format!("{what}: accepted: {} {}", sent.status, sent.text));
                            undo(&s, &f, t.cleanup, path, &sent.text).await;
                            continue;
                        }
                        if let Err(e) = check_refusal(sent.status, &sent.text, field, codes) {
                            failures.push(format!("{what}: {e}"));
                        }
                        let after = snapshot(&s, &f.owner, &t.watch).await;
                        if before != after {
                            failures.push(format!("{what}: refused, but stored: before {before:?}\nafter {after:?}"));
                        }
                    }
                    Expect::Accepted { field, bound } => {
                        if (200..300).contains(&sent.status) {
                            undo(&s, &f, t.cleanup, path, &sent.text).await;
                        } else if !excepted(&op.id, field, bound) {
                            failures.push(format!("{what}: refused within its bounds: {} {}", sent.status, sent.text));
                        }
                    }
                }
            }
        }
        // Header parameters, with the valid body.
        for (name, schema) in &op.headers {
            let (path, valid) = &t.requests[0];
            let mut cases: Vec<(String, bool)> = Vec::new();
            assert_eq!(schema["type"], "string", "{} {name}", op.id);
            let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
            let max = schema["maxLength"].as_u64().unwrap_or_else(|| panic!("{} {name}: no maxLength", op.id)) as usize;
            if min > 0 {
                cases.push(("k".repeat(min - 1), false));
            }
            cases.push(("k".repeat(max + 1), false));
            cases.push(("not visible".into(), false));
            for n in [min.max(1), max] {
                unique += 1;
                let u = unique.to_string();
                cases.push((format!("{u}{}", "k".repeat(n.saturating_sub(u.len()))), true));
            }
            for (value, valid_value) in cases {
                let what = format!("{} {path} ({}) {name}: {:?} ({} characters)", op.method, op.id, value, value.len());
                let before = snapshot(&s, &f.owner, &t.watch).await;
                let sent = match send_with(
                    &http,
                    &s,
                    &f.owner,
                    &op.method,
                    path,
                    Some(&valid.to_string()),
                    Some((name, &value)),
                )
                .await
                {
                    Ok(sent) => sent,
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                if valid_value {
                    *counts.entry("header accepted").or_default() += 1;
                    if (200..300).contains(&sent.status) {
                        undo(&s, &f, t.cleanup, path, &sent.text).await;
                    } else {
                        failures.push(format!("{what}: refused within its bounds: {} {}", sent.status, sent.text));
                    }
                } else {
                    *counts.entry("header refused").or_default() += 1;
                    if (200..300).contains(&sent.status) {
                        undo(&s, &f, t.cleanup, path, &sent.text).await;
                    }
                    let snake = name.to_ascii_lowercase().replace('-', "_");
                    let codes = vec![format!("invalid_{snake}"), "invalid_header".into()];
                    if let Err(e) = check_refusal(
                        sent.status,
                        &sent.text.to_ascii_lowercase().replace(&name.to_ascii_lowercase(), &snake),
                        std::slice::from_ref(&snake),
                        &codes,
                    ) {
                        failures.push(format!("{what}: {e}"));
                    }
                    if before != snapshot(&s, &f.owner, &t.watch).await {
                        failures.push(format!("{what}: refused, but stored"));
                    }
                }
            }
        }
        let left_out: Vec<&String> = declared.difference(&walked).collect();
        if !left_out.is_empty() {
            failures
                .push(format!("{}: the valid bodies leave out {left_out:?}, so nothing about them is checked", op.id));
        }
    }

    // Query parameters.
    for op in ops.iter().filter(|o| !o.query.is_empty()) {
        let base = list_path(&op.id, &f).unwrap();
        for (name, schema) in &op.query {
            let mut cases: Vec<(String, bool)> = Vec::new();
            match schema["type"].as_str() {
                Some("integer") => {
                    cases.extend(["abc", "1.5", "", "1e2"].iter().map(|v| (v.to_string(), false)));
                    if let Some(min) = schema["minimum"].as_i64() {
                        cases.push(((min - 1).to_string(), false));
                        cases.push((min.to_string(), true));
                    }
                    if let Some(max) = schema["maximum"].as_i64() {
                        cases.push(((max + 1).to_string(), false));
                        cases.push((max.to_string(), true));
                    }
                    cases.push(("99999999999999999999".into(), false));
                }
                Some("string") => {
                    if let Some(values) = schema["enum"].as_array() {
                        cases.extend(["not_a_value", ""].iter().map(|v| (v.to_string(), false)));
                        cases.push((values[0].as_str().unwrap().to_uppercase(), false));
                        cases.extend(values.iter().map(|v| (v.as_str().unwrap().to_string(), true)));
                    } else if schema["format"] == "date-time" {
                        cases.extend(
                            ["yesterday", "", "2026-13-01T00:00:00Z", "2026-01-01", "2026-01-01T00:00:00"]
                                .iter()
                                .map(|v| (v.to_string(), false)),
                        );
                        cases.push(("2026-01-01T00:00:00Z".into(), true));
                        cases.push(("2026-01-01T00:00:00.5+02:00".into(), true));
                        // RFC 3339's ABNF is case-insensitive.
                        cases.push(("2026-01-01t00:00:00z".into(), true));
                    } else if let Some(format) = schema["format"].as_str() {
                        failures.push(format!("{} {name}: no cases for a query string of format {format}", op.id));
                    } else if name == "cursor" {
                        cases.extend(["!!!", "", "abc"].iter().map(|v| (v.to_string(), false)));
                    }
                }
                other => failures.push(format!("{} {name}: no cases for a query parameter of type {other:?}", op.id)),
            }
            // Each value that is accepted alone, given twice: which one
            // counts would be the server's guess.
            let twice: Vec<(String, bool)> =
                cases.iter().filter(|(_, valid)| *valid).map(|(v, _)| (format!("{v}&{name}={v}"), false)).collect();
            cases.extend(twice);
            for (value, valid) in cases {
                let path = format!("{base}?{name}={}", urlencode(&value).replace("%26", "&").replace("%3D", "="));
                let what = format!("GET {path} ({})", op.id);
                *counts.entry(if valid { "query accepted" } else { "query refused" }).or_default() += 1;
                let sent = match send(&http, &s, &f.owner, &Method::GET, &path, None).await {
                    Ok(sent) => sent,
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                if valid {
                    if sent.status != 200 {
                        failures.push(format!("{what}: refused within its bounds: {} {}", sent.status, sent.text));
                    }
                } else {
                    let codes = vec![format!("invalid_{name}"), "invalid_query".into()];
                    if let Err(e) = check_refusal(sent.status, &sent.text, std::slice::from_ref(name), &codes) {
                        failures.push(format!("{what}: {e}"));
                    }
                }
            }
        }
    }

    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    // Guards against a walk over nothing.
    assert!(counts["refused"] > 1500 && counts["accepted"] > 150 && counts["query refused"] > 100, "{counts:?}");
}

fn urlencode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every length a request property's description states ("1 to 100
/// characters", "at most 2000 characters") is in its schema too, where the
/// walk above (and any client generated from the spec) reads bounds.
#[test]
fn every_length_a_description_states_is_in_the_schema() {
    let spec = spec();
    let mut checked = 0;
    let mut failures = Vec::new();
    fn number(word: &str) -> Option<u64> {
        word.trim_end_matches([',', ';', '.']).replace(',', "").parse().ok()
    }
    fn walk(v: &Value, at: &str, checked: &mut usize, failures: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let (Some("string"), Some(text)) =
                    (m.get("type").and_then(Value::as_str), m.get("description").and_then(Value::as_str))
                {
                    let words: Vec<&str> = text.split_whitespace().collect();
                    for w in words.windows(4) {
                        let stated = match w {
                            [a, "to", b, c] if c.starts_with("characters") => Some((number(a), number(b))),
                            ["at", "most", b, c] if c.starts_with("characters") => Some((None, number(b))),
                            _ => None,
                        };
                        let Some((min, max)) = stated else { continue };
                        *checked += 1;
                        let has = |k: &str| m.get(k).and_then(Value::as_u64);
                        if min.is_some() && has("minLength") != min || has("maxLength") != max {
                            failures.push(format!(
                                "{at}: \"{}\" but minLength {:?}, maxLength {:?}",
                                w.join(" "),
                                has("minLength"),
                                has("maxLength")
                            ));
                        }
                    }
                }
                for (k, v) in m {
                    walk(v, &format!("{at}/{k}"), checked, failures);
                }
            }
            Value::Array(a) => {
                a.iter().enumerate().for_each(|(i, v)| walk(v, &format!("{at}[{i}]"), checked, failures))
            }
            _ => {}
        }
    }
    walk(&spec["components"]["schemas"], "#/components/schemas", &mut checked, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 30, "{checked} stated lengths");
}
