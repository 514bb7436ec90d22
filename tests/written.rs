//! Reads served as written JSON (a page of API keys, a test, a page of
//! tests, a test result; see `impl/src/written.rs`) say exactly what the typed path says: the
//! same JSON value as the responses built from the generated types, and a
//! body the generated types read back without loss.

mod common;

use common::engine::{all_pages, channel, create, wait_for_end, Agent};
use common::TestServer;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use sparring_server::types;

/// The body as JSON, after checking that the server's own type reads it
/// and writes it back as the same value (no field lost, none extra).
async fn typed_body<T: DeserializeOwned + Serialize>(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let text = resp.text().await.unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    let typed: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(serde_json::to_value(&typed).unwrap(), value, "the type reads and writes it back unchanged");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_reads_equal_typed_ones() {
    let agent = Agent::start(&[]);
    let s = TestServer::start().await;
    let t = s.team("written").await;
    let p = &t.project_id;
    let persona = |name: &str| json!({"project_id": p, "name": name, "prompt": "A caller who says \"hi\"\n twice"});
    let dana = create(&s, &t.editor, "/v1/personas", persona("Dana")).await;
    let lee = create(&s, &t.editor, "/v1/personas", persona("Lee")).await;
    let scenario = create(
        &s,
        &t.editor,
        "/v1/scenarios",
        json!({
            "project_id": p, "name": "hours", "mode": "scripted", "default_persona_id": dana,
            "first_message": "Hi, what are your opening hours?",
            "steps": [{"say": "Thanks, goodbye.", "expect": [{"type": "contains", "name": "thanks", "text": "bye"}]}],
            "max_duration_s": 60
        }),
    )
    .await;
    let over_http = channel(&s, &t.editor, p, "http", &agent.http_target()).await;

    // A test with every kind of member: escaped text, each evaluator type
    // but the judge (which needs an LLM), personas in order, tags.
    let created = s
        .expect(
            Method::POST,
            "/v1/tests",
            &t.editor,
            Some(json!({
                "project_id": p, "name": "hours \"quoted\" ünïcode", "description": "line one\nline two\ttab",
                "channel_id": over_http, "scenario_id": scenario, "persona_ids": [lee, dana], "iterations": 2,
                "pass_threshold": 0.5, "tags": ["smoke", "nightly"],
                "evaluators": [
                    {"type": "contains", "name": "greets", "text": "hello"},
                    {"type": "not_contains", "name": "no swearing", "text": "damn", "case_sensitive": true},
                    {"type": "regex", "name": "a time", "pattern": "\\d{1,2}:\\d{2}"},
                    {"type": "max_latency_ms", "name": "fast", "percentile": "p95", "ms": 1200},
                    {"type": "max_turns", "name": "short", "turns": 12},
                    {"type": "agent_ended_call", "name": "hangs up", "critical": false},
                    {"type": "tool_called", "name": "books", "tool": "book_table", "arguments": {"party": 2}}
                ]
            })),
            200,
        )
        .await;
    let id = created["id"].as_str().unwrap();
    let other = create(
        &s,
        &t.editor,
        "/v1/tests",
        json!({"project_id": p, "name": "plain", "channel_id": over_http, "scenario_id": scenario}),
    )
    .await;

    // `create` builds its answer and the stored JSON before its
    // transaction; a change that changes nothing answers with the test read
    // back from its columns: the same.
    let unchanged = s
        .expect(Method::PATCH, &format!("/v1/tests/{id}"), &t.editor, Some(json!({"name": created["name"]})), 200)
        .await;
    assert_eq!(unchanged, created);
    // `get` and `list` answer with the stored JSON.
    let got = typed_body::<types::Test>(s.get(&format!("/v1/tests/{id}"), &t.viewer).await).await;
    assert_eq!(got, created);
    let page =
        typed_body::<types::TestList>(s.get(&format!("/v1/tests?project_id={p}&limit=1"), &t.viewer).await).await;
    assert_eq!(page["tests"].as_array().unwrap().len(), 1);
    assert!(page["next_cursor"].is_string(), "{page}");
    let listed = all_pages(&s, &t.viewer, &format!("/v1/tests?project_id={p}"), "tests").await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1], created, "oldest last");
    assert_eq!(listed[0]["id"], json!(other));
    assert_eq!(listed[0]["persona_ids"], json!([]), "no personas: the scenario's default plays");
    let last = typed_body::<types::TestList>(s.get(&format!("/v1/tests?project_id={p}"), &t.viewer).await).await;
    assert_eq!(last["next_cursor"], Value::Null);
    // After a change, too.
    let patched = s.expect(Method::PATCH, &format!("/v1/tests/{id}"), &t.editor, Some(json!({"tags": []})), 200).await;
    assert_eq!(typed_body::<types::Test>(s.get(&format!("/v1/tests/{id}"), &t.viewer).await).await, patched);

    // Results: `list`, `get` and `by-call` serve the stored document (which
    // the engine encoded from the generated type); each is what the type
    // reads and writes back, and all three agree.
    let run = s.expect(Method::POST, &format!("/v1/tests/{id}/run"), &t.editor, Some(json!({})), 200).await;
    let done = wait_for_end(&s, &t.viewer, run["id"].as_str().unwrap()).await;
    assert_eq!(done["counts"]["total"], 4, "{done:#}");
    let results = all_pages(&s, &t.viewer, &format!("/v1/tests/{id}/results"), "test_results").await;
    assert_eq!(results.len(), 4);
    for listed in &results {
        let rid = listed["id"].as_str().unwrap();
        let got = typed_body::<types::TestResult>(s.get(&format!("/v1/test-results/{rid}"), &t.viewer).await).await;
        assert_eq!(&got, listed);
        assert!(got["transcript"].as_array().unwrap().len() >= 2, "{got:#}");
        let call = got["call_id"].as_str().unwrap();
        let by_call =
            typed_body::<types::TestResult>(s.get(&format!("/v1/test-results/by-call/{call}"), &t.viewer).await).await;
        assert_eq!(&by_call, listed);
    }

    // Outsiders still get a 404, as for what does not exist.
    let stranger = s.key_for_user("stranger@example.com").await;
    assert_eq!(s.get(&format!("/v1/tests/{id}"), &stranger).await.status(), 404);
    let rid = results[0]["id"].as_str().unwrap();
    assert_eq!(s.get(&format!("/v1/test-results/{rid}"), &stranger).await.status(), 404);
}

#[tokio::test]
async fn written_key_listings_equal_typed_answers() {
    let s = TestServer::start().await;
    let key = s.key_for_user("keys@example.com").await;
    let make = |label: &str| json!({"label": label});
    let used = s.expect(Method::POST, "/v1/api-keys", &key, Some(make("ci \"nightly\" \\ build")), 201).await;
    let revoked = s.expect(Method::POST, "/v1/api-keys", &key, Some(make("laptop ü")), 201).await;
    let gone =
        s.expect(Method::DELETE, &format!("/v1/api-keys/{}", revoked["id"].as_str().unwrap()), &key, None, 200).await;
    // A use not yet written (uses are stored every few seconds) shows at once.
    assert_eq!(s.get("/v1/api-keys?limit=1", used["apiKey"].as_str().unwrap()).await.status(), 200);

    let page = typed_body::<types::ApiKeyList>(s.get("/v1/api-keys?limit=2", &key).await).await;
    let keys = page["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert!(page["next_cursor"].is_string(), "three keys, two per page: {page}");
    // Newest first: the revoked key, then the used one; each says what its
    // typed answers said.
    let (r, u) = (&keys[0], &keys[1]);
    for (listed, made) in [(r, &revoked), (u, &used)] {
        for field in ["id", "label", "prefix", "created_at"] {
            assert_eq!(listed[field], made[field], "{field}: {listed} vs {made}");
        }
    }
    assert_eq!((&r["revoked"], &r["revoked_at"]), (&json!(true), &gone["revoked_at"]));
    assert_eq!((&u["revoked"], &u["revoked_at"]), (&json!(false), &Value::Null));
    assert!(u["last_used_at"].is_string(), "{u}");
    assert_eq!(r["last_used_at"], Value::Null);
    let rest = typed_body::<types::ApiKeyList>(
        s.get(&format!("/v1/api-keys?cursor={}", page["next_cursor"].as_str().unwrap()), &key).await,
    )
    .await;
    assert_eq!(rest["keys"].as_array().unwrap().len(), 1);
    assert_eq!(rest["next_cursor"], Value::Null);
}
