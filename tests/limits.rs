//! Input limits, as a careless or hostile tenant would probe them: each
//! request can store and cause only a bounded amount, and going over a limit
//! is a 400 whose code and message name the field.

mod common;

use common::{error_body, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Sends and expects a 400 with `code` whose message names `field`.
async fn refused(s: &TestServer, method: Method, path: &str, key: &str, body: Value, code: &str, field: &str) {
    let (status, e) = error_body(s.send_json(method.clone(), path, key, Some(body)).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap_or("")), (400, code), "{method} {path}: {e}");
    assert!(e["message"].as_str().unwrap().contains(field), "message names `{field}`: {e}");
}

async fn create(s: &TestServer, path: &str, key: &str, body: Value) -> String {
    s.expect(Method::POST, path, key, Some(body), 200).await["id"].as_str().unwrap().to_string()
}

/// `{"a": {"a": … 1}}`, `levels` objects deep.
fn nested(levels: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!({ "a": v });
    }
    v
}

fn llm(project_id: &str, config: Value) -> Value {
    json!({"project_id": project_id, "provider": "openai_compatible", "name": "judge", "config": config})
}

/// A channel and a scripted scenario to hang tests on.
async fn channel_and_scenario(s: &TestServer, key: &str, project_id: &str) -> (String, String) {
    let channel = create(
        s,
        "/v1/channels",
        key,
        json!({"project_id": project_id, "name": "agent", "kind": "http", "target": "https://agent.example.com/turn"}),
    )
    .await;
    let persona = create(s, "/v1/personas", key, json!({"project_id": project_id, "name": "caller"})).await;
    let scenario = create(
        s,
        "/v1/scenarios",
        key,
        json!({"project_id": project_id, "name": "book", "mode": "scripted", "default_persona_id": persona,
               "steps": [{"say": "hi", "expect": []}]}),
    )
    .await;
    (channel, scenario)
}

/// Free-form objects (`config`, `credentials`, `tool_called.arguments`) were
/// stored as given, up to the 1 MiB body: 200 such resources per page made
/// lists of hundreds of MB, and one nested 120 levels deep came back in a
/// page or an activity record deeper than the 128 levels a JSON reader
/// (the generated client's included) accepts, so nobody in the project
/// could read that list any more.
#[tokio::test]
async fn free_form_objects_are_small_and_shallow() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "free form").await;
    let ok = json!({"base_url": "https://llm.example.com/v1", "model": "m", "options": {"temperature": 0.2}});

    let mut deep = ok.clone();
    deep["options"] = nested(100);
    refused(&s, Method::POST, "/v1/integrations", key, llm(p, deep.clone()), "invalid_config", "config").await;
    let mut big = ok.clone();
    big["options"] = json!("x".repeat(20_000));
    refused(&s, Method::POST, "/v1/integrations", key, llm(p, big.clone()), "invalid_config", "config").await;
    let with_credentials = |c: Value| {
        let mut body = llm(p, ok.clone());
        body["credentials"] = c;
        body
    };
    let path = "/v1/integrations";
    refused(&s, Method::POST, path, key, with_credentials(nested(100)), "invalid_credentials", "credentials").await;
    let huge = json!({"api_key": "x".repeat(20_000)});
    refused(&s, Method::POST, path, key, with_credentials(huge.clone()), "invalid_credentials", "credentials").await;

    let int = create(&s, path, key, with_credentials(json!({"api_key": "sk-1"}))).await;
    let at = format!("/v1/integrations/{int}");
    refused(&s, Method::PATCH, &at, key, json!({"config": deep}), "invalid_config", "config").await;
    refused(&s, Method::PATCH, &at, key, json!({"config": big}), "invalid_config", "config").await;
    refused(&s, Method::PATCH, &at, key, json!({"credentials": huge}), "invalid_credentials", "credentials").await;

    let (channel, scenario) = channel_and_scenario(&s, key, p).await;
    let test = |arguments: Value| {
        json!({"project_id": p, "name": "books", "channel_id": channel, "scenario_id": scenario,
               "evaluators": [{"type": "tool_called", "name": "books", "tool": "book", "arguments": arguments}]})
    };
    create(&s, "/v1/tests", key, test(json!({"day": "tuesday", "slot": {"from": "10:00"}}))).await;
    for arguments in [nested(120), json!({"note": "x".repeat(20_000)})] {
        let field = "evaluators[0].arguments";
        refused(&s, Method::POST, "/v1/tests", key, test(arguments), "invalid_arguments", field).await;
    }
    let step =
        json!({"say": "hi", "expect": [{"type": "tool_called", "name": "t", "tool": "t", "arguments": nested(100)}]});
    let scenario = json!({"project_id": p, "name": "deep", "mode": "scripted", "steps": [step]});
    refused(&s, Method::POST, "/v1/scenarios", key, scenario, "invalid_arguments", "steps[0].expect[0].arguments")
        .await;

    // What was accepted reads back through the generated client (a test
    // whose arguments were nested 120 deep made both fail to decode).
    let tests = s.client(key).list_tests().project_id(p.as_str()).send().await.unwrap().into_inner();
    assert_eq!(tests.tests.len(), 1);
    s.client(key).list_activity().project_id(p.as_str()).send().await.unwrap();
}

/// Every `regex` evaluator is compiled when it is saved (and again in every
/// run), up to tens of milliseconds each at the old 1 MiB compiled size. A
/// scenario took 100 per step's `expect` over 200 steps: one 1 MiB body
/// of 20,000 `\w{10}` patterns kept the server compiling for minutes.
#[tokio::test]
async fn regex_work_per_scenario_is_bounded() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "regexes").await;
    let regex = |i: usize, pattern: &str| json!({"type": "regex", "name": format!("r{i}"), "pattern": pattern});
    let scenario = |steps: Vec<Value>, success: Vec<Value>| json!({"project_id": p, "name": "many", "mode": "scripted", "steps": steps, "success_criteria": success});
    let step = |expect: Vec<Value>| json!({"say": "hi", "expect": expect});

    // A pattern that compiles past 256 KiB (Unicode `\w`, ten times).
    let big = scenario(vec![step(vec![regex(0, r"\w{10}")])], vec![]);
    refused(&s, Method::POST, "/v1/scenarios", key, big, "invalid_pattern", "steps[0].expect[0].pattern").await;

    // 100 regexes in all is fine; 101 spread over steps and criteria is not.
    let spread = |n: usize| {
        let steps = (0..n / 2).map(|i| step(vec![regex(i, r"\d{3}-\d{4}")])).collect();
        let success = (n / 2..n).map(|i| regex(i, r"(?i)\bthanks?\b")).collect();
        scenario(steps, success)
    };
    let id = create(&s, "/v1/scenarios", key, spread(100)).await;
    refused(&s, Method::POST, "/v1/scenarios", key, spread(101), "invalid_steps", "regex").await;
    let mut put = spread(101);
    put.as_object_mut().unwrap().remove("project_id");
    refused(&s, Method::PUT, &format!("/v1/scenarios/{id}"), key, put, "invalid_steps", "regex").await;

    // At most 1000 evaluators in all (10 steps of 100 each is fine).
    let contains = |i: usize| json!({"type": "contains", "name": format!("c{i}"), "text": "ok"});
    let steps = |n: usize| (0..n).map(|_| step((0..100).map(contains).collect())).collect::<Vec<_>>();
    create(&s, "/v1/scenarios", key, with_name(scenario(steps(10), vec![]), "thousand")).await;
    let over = scenario(steps(10), vec![contains(0)]);
    refused(&s, Method::POST, "/v1/scenarios", key, over, "invalid_steps", "1000 evaluators").await;
}

fn with_name(mut v: Value, name: &str) -> Value {
    v["name"] = json!(name);
    v
}

/// Header names had no length limit (only values did), so a channel could
/// hold fifty names of 60 KB each, sent to the agent on every turn and
/// echoed whole in the 400 when one was not a valid name.
#[tokio::test]
async fn channel_header_names_are_bounded() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "headers").await;
    let channel = |headers: Value| {
        json!({"project_id": p, "name": "agent", "kind": "http", "target": "https://agent.example.com/turn",
               "headers": headers})
    };
    let long = format!("x-{}", "a".repeat(99));
    let mut headers = serde_json::Map::new();
    headers.insert(long.clone(), json!("v"));
    refused(
        &s,
        Method::POST,
        "/v1/channels",
        key,
        channel(Value::Object(headers.clone())),
        "invalid_headers",
        "headers",
    )
    .await;
    let id = create(&s, "/v1/channels", key, channel(json!({ &long[..100]: "v", "authorization": "Bearer t" }))).await;
    let at = format!("/v1/channels/{id}");
    refused(&s, Method::PATCH, &at, key, json!({"headers": headers}), "invalid_headers", "100 characters").await;
    // The refusal does not echo a long invalid name whole.
    let bad = format!("bad name {}", "z".repeat(10_000));
    let (status, e) =
        error_body(s.send_json(Method::PATCH, &at, key, Some(json!({"headers": {bad: "v"}}))).await).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["message"].as_str().unwrap().len() < 300, "{e}");
}

/// Error messages quote what the client sent (an id, an unknown field's
/// name, an enum value); only the 1 MiB body limit bounded them, so one
/// request made a 1 MB answer and a 1 MB line in the server's log.
#[tokio::test]
async fn error_messages_are_bounded() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "messages").await;
    let long = "x".repeat(100_000);
    let bodies = [
        // An id (domain error).
        (
            "/v1/tests",
            json!({"project_id": p, "name": "t", "channel_id": long, "scenario_id": long}),
            "invalid_channel_id",
        ),
        ("/v1/channels", json!({"project_id": long, "name": "c", "kind": "http", "target": "https://a.example"}), ""),
        // An unknown field, an unknown enum value (extractor errors).
        ("/v1/projects", json!({"name": "n", long.clone(): 1}), "invalid_body"),
        ("/v1/channels", json!({"project_id": p, "name": "c", "kind": long, "target": "https://a.example"}), ""),
    ];
    for (path, body, code) in bodies {
        let (status, e) = error_body(s.send_json(Method::POST, path, key, Some(body)).await).await;
        assert!(status == 400 || status == 404, "{path}: {status}");
        if !code.is_empty() {
            assert_eq!(e["error_code"], code);
        }
        let message = e["message"].as_str().unwrap();
        assert!(message.len() <= 4096, "{path}: a message of {} bytes", message.len());
    }
    assert!(s.log.contents().len() < 200_000, "the log quotes no 100 KB value");
}

/// A run's `metadata` is kept with its batch run, its results and the
/// activity record of the run: nested deeper than a JSON reader accepts, it
/// made `GET /batch-runs` and `GET /activity` of the whole project unreadable
/// through the generated client.
#[tokio::test]
async fn run_metadata_is_shallow() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "metadata").await;
    let (channel, scenario) = channel_and_scenario(&s, key, p).await;
    let test = create(
        &s,
        "/v1/tests",
        key,
        json!({"project_id": p, "name": "books", "channel_id": channel, "scenario_id": scenario}),
    )
    .await;
    let run = format!("/v1/tests/{test}/run");
    refused(&s, Method::POST, &run, key, json!({"metadata": {"ci": nested(120)}}), "invalid_metadata", "metadata")
        .await;
    s.expect(Method::POST, &run, key, Some(json!({"metadata": {"ci": {"job": {"id": 7}}}})), 200).await;
    s.client(key).list_batch_runs().project_id(p.as_str()).send().await.unwrap();
    s.client(key).list_activity().project_id(p.as_str()).send().await.unwrap();
}

/// One batch run holds at most 10,000 runs; a batch whose tests make more is
/// refused with a code of its own (its body has no field to blame), before
/// anything is reserved or queued.
#[tokio::test]
async fn a_batch_run_holds_at_most_10000_runs() {
    // Credits for 9,900 ten-minute conversations, and no worker to hold them.
    let s = TestServer::start_configured(Vec::new(), |c| {
        c.starting_credits = 100_000;
        c.engine.workers = 0;
    })
    .await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "big").await;
    let (channel, scenario) = channel_and_scenario(&s, key, p).await;
    let mut personas = Vec::new();
    for i in 0..11 {
        personas.push(create(&s, "/v1/personas", key, json!({"project_id": p, "name": format!("caller {i}")})).await);
    }
    let mut tests = Vec::new();
    for i in 0..10 {
        let body = json!({"project_id": p, "name": format!("t{i}"), "channel_id": channel, "scenario_id": scenario,
                          "persona_ids": personas, "iterations": 100});
        tests.push(create(&s, "/v1/tests", key, body).await);
    }
    let batch = create(&s, "/v1/batches", key, json!({"project_id": p, "name": "all", "test_ids": tests})).await;
    let (status, e) =
        error_body(s.send_json(Method::POST, &format!("/v1/batches/{batch}/run"), key, Some(json!({}))).await).await;
    assert_eq!((status, e["error_code"].as_str()), (400, Some("too_many_runs")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("10000 runs"), "{e}");
    let runs = s.expect(Method::GET, &format!("/v1/batch-runs?project_id={p}"), key, None, 200).await;
    assert_eq!(runs["batch_runs"], json!([]), "nothing started");
    // Nine of them fit.
    let fits = create(&s, "/v1/batches", key, json!({"project_id": p, "name": "fits", "test_ids": tests[..9]})).await;
    let started = s.expect(Method::POST, &format!("/v1/batches/{fits}/run"), key, Some(json!({})), 200).await;
    assert_eq!(started["counts"]["total"], 9900);
}

/// A misspelled field is refused wherever it is in a body, not only at the
/// top: `args` for `arguments` in a `tool_called` evaluator was dropped
/// without a word, and the check then passed on any arguments.
#[tokio::test]
async fn an_unknown_field_is_refused_at_any_depth() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let p = &s.create_project(key, "spelling").await;
    let (channel, scenario) = channel_and_scenario(&s, key, p).await;
    // Each body with `field: value` where the misspelling (or its right
    // spelling) goes.
    let tool = |field: &str, value: Value| {
        json!({"project_id": p, "name": format!("books {field}"), "channel_id": channel, "scenario_id": scenario,
               "evaluators": [{"type": "tool_called", "name": "books friday", "tool": "book", field: value}]})
    };
    let settings = |field: &str, value: Value| json!({"name": format!("settings {field}"), "settings": {"max_call_duration_s": 60, field: value}});
    let voice = |field: &str, value: Value| json!({"project_id": p, "name": format!("voice {field}"), "voice": {"provider": "x", "voice_id": "y", field: value}});
    let step = |field: &str, value: Value| {
        json!({"project_id": p, "name": format!("step {field}"), "mode": "scripted",
               "steps": [{"say": "hi", "expect": [], field: value}]})
    };
    let number = |field: &str, value: Value| {
        json!({"project_id": p, "provider": "twilio", "name": format!("numbers {field}"), "config": {"account_sid": "AC1"},
               "phone_numbers": [{"number": "+14155550100", "direction": "both", field: value}]})
    };
    type Body<'a> = &'a dyn Fn(&str, Value) -> Value;
    let friday = json!({"day": "Friday"});
    let cases: [(&str, Body, &str, (&str, Value)); 5] = [
        ("/v1/tests", &tool, "args", ("arguments", friday.clone())),
        ("/v1/projects", &settings, "bogus", ("default_concurrency", json!(2))),
        ("/v1/personas", &voice, "bogus", ("speed", json!(1.0))),
        ("/v1/scenarios", &step, "bogus", ("say", json!("x"))),
        ("/v1/integrations", &number, "bogus", ("label", json!("x"))),
    ];
    for (path, body, wrong, (right, value)) in cases {
        let wrong_value = if wrong == "args" { friday.clone() } else { json!(1) };
        let (status, e) = error_body(s.send_json(Method::POST, path, key, Some(body(wrong, wrong_value))).await).await;
        assert_eq!(status, 400, "{path} with `{wrong}`: {e}");
        assert!(e["message"].as_str().unwrap().contains(&format!("`{wrong}`")), "{path}: the message names it: {e}");
        // Spelled right, the same body is taken.
        s.expect(Method::POST, path, key, Some(body(right, value)), 200).await;
    }
    // The bodies of reviews and calibrations, top level and nested.
    for (path, body) in [
        ("/v1/reviews", json!({"test_result_id": "trs_x", "verdict": "pass", "bogus": 1})),
        (
            "/v1/reviews",
            json!({"test_result_id": "trs_x", "verdict": "pass", "evaluations": [{"name": "a", "passed": true, "bogus": 1}]}),
        ),
        ("/v1/reviews/calibration", json!({"project_id": p, "reviewer_ids": [], "bogus": 1})),
        (
            "/v1/reviews/calibration",
            json!({"project_id": p, "reviewer_ids": [], "sample": {"batch_run_id": "brn_x", "size": 1, "bogus": 1}}),
        ),
    ] {
        let (status, e) = error_body(s.send_json(Method::POST, path, key, Some(body)).await).await;
        assert_eq!(status, 400, "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains("`bogus`"), "{path}: {e}");
    }
}
