//! Tests (the runnable cases) and batches, against the real server: who may
//! do what, what is refused (with which code, naming which field),
//! references to other projects' resources and to missing ids, `PATCH`
//! merging, `PUT` replacing, `in_use` conflicts, pages and filters, activity;
//! and a user's first hour through the generated client.

mod common;

use common::{error_body, Team, TestServer};
use futures::StreamExt as _;
use reqwest::Method;
use serde_json::{json, Value};

/// The example program's flow, run here against the real server.
#[allow(dead_code)]
#[path = "../client/examples/first_hour.rs"]
mod first_hour;

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

/// `base` with the fields of `extra` set (a null removes the field).
fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    base
}

/// A resource's activity, newest first.
async fn history(s: &TestServer, key: &str, resource_type: &str, id: &str) -> Vec<Value> {
    let body = s.expect(Method::GET, &format!("/v1/activity/resource/{resource_type}/{id}"), key, None, 200).await;
    body["activity"].as_array().unwrap().clone()
}

/// How many activity records the project has.
async fn activity_count(s: &TestServer, key: &str, project_id: &str) -> usize {
    let body = s.expect(Method::GET, &format!("/v1/activity?project_id={project_id}&limit=200"), key, None, 200).await;
    body["activity"].as_array().unwrap().len()
}

/// Sends and expects a 400 with `code` whose message names `field`.
async fn refused(s: &TestServer, method: Method, path: &str, key: &str, body: Value, code: &str, field: &str) {
    let (status, e) = error_body(s.send_json(method.clone(), path, key, Some(body.clone())).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, code), "{method} {path} {body}: {e}");
    assert!(e["message"].as_str().unwrap().contains(field), "message names `{field}`: {e}");
}

async fn create(s: &TestServer, path: &str, key: &str, body: Value) -> Value {
    s.expect(Method::POST, path, key, Some(body), 200).await
}

/// What a test needs, in one project: a channel, two personas, a scenario
/// whose default persona is the first, and one without a default.
struct Parts {
    project_id: String,
    channel: String,
    personas: [String; 2],
    scenario: String,
    scenario_without_default: String,
}

async fn parts(s: &TestServer, key: &str, project_id: &str) -> Parts {
    let channel = id(&create(
        s,
        "/v1/channels",
        key,
        json!({"project_id": project_id, "name": "web agent", "kind": "http", "target": "http://127.0.0.1:9/agent"}),
    )
    .await);
    let mut personas = Vec::new();
    for name in ["busy parent", "retired teacher"] {
        personas.push(id(&create(s, "/v1/personas", key, json!({"project_id": project_id, "name": name})).await));
    }
    let scripted = |name: &str| json!({"project_id": project_id, "name": name, "mode": "scripted", "steps": [{"say": "hi", "expect": []}]});
    let scenario = id(&create(
        s,
        "/v1/scenarios",
        key,
        with(scripted("book a cleaning"), json!({"default_persona_id": personas[0]})),
    )
    .await);
    let scenario_without_default = id(&create(s, "/v1/scenarios", key, scripted("cancel")).await);
    Parts {
        project_id: project_id.to_string(),
        channel,
        personas: [personas[0].clone(), personas[1].clone()],
        scenario,
        scenario_without_default,
    }
}

impl Parts {
    /// A test body using the channel and the scenario with a default persona.
    fn test(&self, name: &str) -> Value {
        json!({"project_id": self.project_id, "name": name, "channel_id": self.channel, "scenario_id": self.scenario})
    }

    fn batch(&self, name: &str, test_ids: &[&str]) -> Value {
        json!({"project_id": self.project_id, "name": name, "test_ids": test_ids})
    }
}

fn llm(project_id: &str, name: &str) -> Value {
    json!({
        "project_id": project_id,
        "provider": "openai_compatible",
        "name": name,
        "config": {"base_url": "https://llm.example.com/v1", "model": "gpt-4o-mini"},
    })
}

fn judge(integration_id: &str) -> Value {
    json!({"type": "llm_judge", "name": "polite", "integration_id": integration_id, "prompt": "Was the agent polite?"})
}

// Access.

#[tokio::test]
async fn roles_decide_who_reads_and_changes_tests() {
    let s = TestServer::start().await;
    let t = s.team("test roles").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    for (role, key, status) in [
        ("owner", &t.owner, 200),
        ("editor", &t.editor, 200),
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
    ] {
        let resp = s.send_json(Method::POST, "/v1/tests", key, Some(x.test(role))).await;
        assert_eq!(resp.status().as_u16(), status, "create by {role}");
    }
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("checkout")).await);
    let path = format!("/v1/tests/{tst}");
    for (role, key) in t.all() {
        let expected = if role == "outsider" { 404 } else { 200 };
        let got = s.expect(Method::GET, &path, key, None, expected).await;
        if expected == 404 {
            assert_eq!(got["error_code"], "not_found");
        } else {
            assert_eq!(got["name"], "checkout");
        }
        let listed =
            s.expect(Method::GET, &format!("/v1/tests?project_id={}", x.project_id), key, None, expected).await;
        if expected == 200 {
            assert_eq!(listed["tests"].as_array().unwrap().len(), 3, "{role}: {listed}");
        }
    }
    // Without a project filter, an outsider sees none of them.
    let listed = s.expect(Method::GET, "/v1/tests", &t.outsider, None, 200).await;
    assert_eq!(listed["tests"], json!([]));
    for (role, key, status) in [
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
        ("owner", &t.owner, 200),
    ] {
        let resp = s.send_json(Method::PATCH, &path, key, Some(json!({"name": format!("renamed by {role}")}))).await;
        assert_eq!(resp.status().as_u16(), status, "update by {role}");
    }
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await["name"], "renamed by owner");
    for (role, key, status) in [
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
    ] {
        let resp = s.send_json(Method::DELETE, &path, key, None).await;
        assert_eq!(resp.status().as_u16(), status, "delete by {role}");
    }
    s.expect(Method::GET, &path, &t.owner, None, 404).await;
    s.expect(Method::DELETE, &path, &t.owner, None, 404).await;
    s.expect(Method::PATCH, &path, &t.owner, Some(json!({"name": "x"})), 404).await;
}

/// `GET /v1/tests/{id}` answers from memory once a test was read (see
/// `test_cache`): every change that bears on the answer is seen by the very
/// next request, whoever read the test before.
#[tokio::test]
async fn a_test_read_before_a_change_is_read_after_it_as_changed() {
    let s = TestServer::start().await;
    let t = s.team("read after change").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("checkout")).await);
    let path = format!("/v1/tests/{tst}");
    let members = format!("/v1/projects/{}/members", t.project_id);
    let listed = s.expect(Method::GET, &members, &t.owner, None, 200).await;
    let user_id = |role: &str| {
        listed["members"].as_array().unwrap().iter().find(|m| m["role"] == role).unwrap()["user_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (viewer_id, editor_id) = (user_id("viewer"), user_id("editor"));
    let viewer = listed["members"].as_array().unwrap().iter().find(|m| m["role"] == "viewer").unwrap();
    let viewer_email = viewer["email"].as_str().unwrap().to_string();

    // Read twice by each: what the members read is not the outsider's.
    for (role, key) in t.all() {
        let status = if role == "outsider" { 404 } else { 200 };
        for _ in 0..2 {
            s.expect(Method::GET, &path, key, None, status).await;
        }
    }
    // Renamed, its personas replaced (rows of a table of their own).
    let patch = json!({"name": "checkout v2", "persona_ids": [x.personas[1]]});
    s.expect(Method::PATCH, &path, &t.editor, Some(patch), 200).await;
    let got = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
    assert_eq!((&got["name"], &got["persona_ids"]), (&json!("checkout v2"), &json!([x.personas[1]])));
    // A member removed reads nothing at once; added back, reads again.
    s.expect(Method::DELETE, &format!("{members}/{viewer_id}"), &t.owner, None, 200).await;
    s.expect(Method::GET, &path, &t.viewer, None, 404).await;
    s.expect(Method::GET, &path, &t.owner, None, 200).await;
    s.expect(Method::POST, &members, &t.owner, Some(json!({"email": viewer_email, "role": "viewer"})), 200).await;
    s.expect(Method::GET, &path, &t.viewer, None, 200).await;
    // A member whose role changed keeps reading (every role reads).
    s.expect(Method::PATCH, &format!("{members}/{editor_id}"), &t.owner, Some(json!({"role": "viewer"})), 200).await;
    assert_eq!(s.expect(Method::GET, &path, &t.editor, None, 200).await["name"], "checkout v2");
    // A test made after the reads is read too; deleted, it is gone.
    let other = format!("/v1/tests/{}", id(&create(&s, "/v1/tests", &t.owner, x.test("refund")).await));
    assert_eq!(s.expect(Method::GET, &other, &t.viewer, None, 200).await["name"], "refund");
    s.expect(Method::DELETE, &other, &t.owner, None, 200).await;
    s.expect(Method::GET, &other, &t.viewer, None, 404).await;
    // The project deleted: its tests are gone for everyone.
    s.expect(Method::GET, &path, &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/projects/{}", t.project_id), &t.owner, None, 200).await;
    for (_, key) in t.all() {
        s.expect(Method::GET, &path, key, None, 404).await;
    }
}

/// Ids of a page of tests.
fn ids_of(page: &Value) -> Vec<String> {
    page["tests"].as_array().unwrap().iter().map(id).collect()
}

/// The first page of a project's tests is kept in memory: it shows every
/// change at once, and reads as the database's page does.
#[tokio::test]
async fn a_first_page_of_tests_read_before_a_change_is_read_after_it_as_changed() {
    let s = TestServer::start().await;
    let t = s.team("first page after change").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let p = &x.project_id;
    let first = format!("/v1/tests?project_id={p}");
    let members = format!("/v1/projects/{p}/members");
    let listed = s.expect(Method::GET, &members, &t.owner, None, 200).await;
    let viewer = listed["members"].as_array().unwrap().iter().find(|m| m["role"] == "viewer").unwrap();
    let (viewer_id, viewer_email) =
        (viewer["user_id"].as_str().unwrap().to_string(), viewer["email"].as_str().unwrap().to_string());
    let read = |key: &str| {
        let (s, first, key) = (&s, first.clone(), key.to_string());
        async move { s.expect(Method::GET, &first, &key, None, 200).await }
    };

    // Read while empty (twice: the second from memory), then each test
    // made is first at once, for every member.
    for _ in 0..2 {
        assert_eq!(ids_of(&read(&t.viewer).await), Vec::<String>::new());
    }
    let mut made = Vec::new();
    for i in 0..4 {
        made.insert(0, id(&create(&s, "/v1/tests", &t.editor, x.test(&format!("t{i}"))).await));
        for (role, key) in t.all() {
            if role != "outsider" {
                assert_eq!(ids_of(&read(key).await), made, "{role} after test {i}");
            }
        }
    }
    s.expect(Method::GET, &first, &t.outsider, None, 404).await;

    // Pages from memory are the database's: every limit, and the page after.
    for limit in [1, 3, 4, 5, 200] {
        let path = format!("{first}&limit={limit}");
        // A change to a test empties what is kept: the next read is the
        // database's, the one after it from memory.
        let patch = json!({"description": format!("limit {limit}")});
        s.expect(Method::PATCH, &format!("/v1/tests/{}", made[3]), &t.editor, Some(patch), 200).await;
        let from_database = s.get(&path, &t.viewer).await.text().await.unwrap();
        let from_memory = s.get(&path, &t.viewer).await.text().await.unwrap();
        assert_eq!(from_memory, from_database, "limit {limit}");
        let page: Value = serde_json::from_str(&from_memory).unwrap();
        assert_eq!(ids_of(&page), made[..limit.min(4)].to_vec(), "limit {limit}");
        assert_eq!(page["next_cursor"].is_string(), limit < 4, "limit {limit}");
        if limit >= 4 {
            assert_eq!(page["tests"][3]["description"], json!(format!("limit {limit}")));
        }
    }

    // Renamed, deleted: at once.
    s.expect(Method::PATCH, &format!("/v1/tests/{}", made[1]), &t.editor, Some(json!({"name": "renamed"})), 200).await;
    assert_eq!(read(&t.viewer).await["tests"][1]["name"], "renamed");
    s.expect(Method::DELETE, &format!("/v1/tests/{}", made[0]), &t.owner, None, 200).await;
    made.remove(0);
    assert_eq!(ids_of(&read(&t.viewer).await), made);
    // A member removed reads nothing at once; added back, reads again.
    s.expect(Method::DELETE, &format!("{members}/{viewer_id}"), &t.owner, None, 200).await;
    s.expect(Method::GET, &first, &t.viewer, None, 404).await;
    assert_eq!(ids_of(&read(&t.owner).await), made);
    s.expect(Method::POST, &members, &t.owner, Some(json!({"email": viewer_email, "role": "viewer"})), 200).await;
    assert_eq!(ids_of(&read(&t.viewer).await), made);
    // The project deleted: its page is gone for everyone.
    s.expect(Method::DELETE, &format!("/v1/projects/{p}"), &t.owner, None, 200).await;
    for (_, key) in t.all() {
        s.expect(Method::GET, &first, key, None, 404).await;
    }
}

/// Tests made many at once, with the first page read all the while, past
/// the most a page holds: once every create is answered, the pages hold
/// every test once, newest first.
#[tokio::test]
async fn tests_made_while_the_first_page_is_read_are_all_listed() {
    let s = TestServer::start().await;
    let owner = s.key_for_user("pages@example.com").await;
    let project_id = s.create_project(&owner, "busy").await;
    let x = parts(&s, &owner, &project_id).await;
    let first = format!("/v1/tests?project_id={project_id}&limit=200");
    let made = std::sync::Mutex::new(Vec::new());
    let creates = futures::stream::iter(0..230)
        .map(|i| {
            let (s, x, owner, made) = (&s, &x, &owner, &made);
            async move {
                let test = id(&create(s, "/v1/tests", owner, x.test(&format!("t{i}"))).await);
                made.lock().unwrap().push(test);
            }
        })
        .buffer_unordered(16)
        .collect::<()>();
    let reads = async {
        let mut pages = 0;
        while made.lock().unwrap().len() < 230 {
            let page = s.expect(Method::GET, &first, &owner, None, 200).await;
            let ids = ids_of(&page);
            assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first, each once: {ids:?}");
            pages += 1;
        }
        pages
    };
    let ((), pages) = tokio::join!(creates, reads);
    assert!(pages > 0);

    let mut made = made.into_inner().unwrap();
    made.sort_unstable_by(|a, b| b.cmp(a));
    // Page by page, 200 at a time as `first`.
    let listed = common::engine::all_pages(&s, &owner, &format!("/v1/tests?project_id={project_id}"), "tests").await;
    let seen: Vec<String> = listed.iter().map(id).collect();
    assert_eq!(seen, made);
}

#[tokio::test]
async fn roles_decide_who_reads_and_changes_batches() {
    let s = TestServer::start().await;
    let t = s.team("batch roles").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("checkout")).await);
    for (role, key, status) in [
        ("owner", &t.owner, 200),
        ("editor", &t.editor, 200),
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
    ] {
        let resp = s.send_json(Method::POST, "/v1/batches", key, Some(x.batch(role, &[&tst]))).await;
        assert_eq!(resp.status().as_u16(), status, "create by {role}");
    }
    let bat = id(&create(&s, "/v1/batches", &t.owner, x.batch("nightly", &[&tst])).await);
    let path = format!("/v1/batches/{bat}");
    for (role, key) in t.all() {
        let expected = if role == "outsider" { 404 } else { 200 };
        let got = s.expect(Method::GET, &path, key, None, expected).await;
        if expected == 404 {
            assert_eq!(got["error_code"], "not_found");
        } else {
            assert_eq!(got["name"], "nightly");
        }
        let listed =
            s.expect(Method::GET, &format!("/v1/batches?project_id={}", x.project_id), key, None, expected).await;
        if expected == 200 {
            assert_eq!(listed["batches"].as_array().unwrap().len(), 3, "{role}: {listed}");
        }
    }
    let listed = s.expect(Method::GET, "/v1/batches", &t.outsider, None, 200).await;
    assert_eq!(listed["batches"], json!([]));
    for (role, key, status) in [
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
        ("owner", &t.owner, 200),
    ] {
        let body = json!({"name": format!("replaced by {role}"), "test_ids": [tst]});
        let resp = s.send_json(Method::PUT, &path, key, Some(body)).await;
        assert_eq!(resp.status().as_u16(), status, "replace by {role}");
    }
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await["name"], "replaced by owner");
    for (role, key, status) in [
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
    ] {
        let resp = s.send_json(Method::DELETE, &path, key, None).await;
        assert_eq!(resp.status().as_u16(), status, "delete by {role}");
    }
    s.expect(Method::GET, &path, &t.owner, None, 404).await;
    s.expect(Method::DELETE, &path, &t.owner, None, 404).await;
    s.expect(Method::PUT, &path, &t.owner, Some(json!({"name": "x", "test_ids": []})), 404).await;
    // The test outlives its batch.
    s.expect(Method::GET, &format!("/v1/tests/{tst}"), &t.owner, None, 200).await;
}

// Tests: what is stored, what is refused.

#[tokio::test]
async fn tests_keep_what_they_were_given_and_default_the_rest() {
    let s = TestServer::start().await;
    let t = s.team("test fields").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let minimal = create(&s, "/v1/tests", &t.editor, x.test("minimal")).await;
    assert!(minimal["id"].as_str().unwrap().starts_with("tst_"));
    assert_eq!(minimal["project_id"], json!(x.project_id));
    assert_eq!(minimal["channel_id"], json!(x.channel));
    assert_eq!(minimal["scenario_id"], json!(x.scenario));
    // No personas: the scenario's default persona plays.
    assert_eq!(minimal["persona_ids"], json!([]));
    assert_eq!(minimal["iterations"], 1);
    assert_eq!(minimal["pass_threshold"], 1.0);
    assert_eq!(minimal["evaluators"], json!([]));
    assert_eq!(minimal["tags"], json!([]));
    assert_eq!(minimal["description"], "");
    assert_eq!(minimal["created_at"], minimal["updated_at"]);

    let integration = id(&create(&s, "/v1/integrations", &t.owner, llm(&x.project_id, "judge")).await);
    let evaluators = json!([
        {"type": "regex", "name": "time", "pattern": "\\d{1,2}:\\d{2}", "critical": false},
        judge(&integration),
    ]);
    let full = create(
        &s,
        "/v1/tests",
        &t.editor,
        with(
            x.test("full"),
            json!({
                "description": "both callers, twice",
                "scenario_id": x.scenario_without_default,
                // Order kept as given.
                "persona_ids": [x.personas[1], x.personas[0]],
                "iterations": 100,
                "pass_threshold": 0.0,
                "evaluators": evaluators,
                "tags": ["smoke", "nightly", "smoke"],
            }),
        ),
    )
    .await;
    assert_eq!(full["persona_ids"], json!([x.personas[1], x.personas[0]]));
    assert_eq!(full["iterations"], 100);
    assert_eq!(full["pass_threshold"], 0.0);
    assert_eq!(full["evaluators"][0]["pattern"], "\\d{1,2}:\\d{2}");
    assert_eq!(full["evaluators"][0]["critical"], false);
    assert_eq!(full["evaluators"][1]["integration_id"], json!(integration));
    assert_eq!(full["evaluators"][1]["critical"], true);
    // Duplicate tags are dropped, order kept.
    assert_eq!(full["tags"], json!(["smoke", "nightly"]));
    assert_eq!(full["description"], "both callers, twice");
    let got = s.expect(Method::GET, &format!("/v1/tests/{}", id(&full)), &t.viewer, None, 200).await;
    assert_eq!(got, full);

    // One activity record each, with every field.
    let records = history(&s, &t.owner, "test", &id(&full)).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["action"], "test.create");
    assert_eq!(records[0]["project_id"], json!(x.project_id));
    assert_eq!(records[0]["changes"]["persona_ids"], json!([x.personas[1], x.personas[0]]));
    assert_eq!(records[0]["changes"]["iterations"], 100);
    assert_eq!(history(&s, &t.owner, "test", &id(&minimal)).await.len(), 1);
}

/// A number comes back as it was sent, to the last bit. One double in ten
/// in [0, 1) is read one unit in the last place off by a JSON reader
/// without exact float parsing: 0.9856906946328695 as ...696, and 10/11
/// (0.9090909090909091, as Python or JavaScript write it) as ...092, so a
/// client that compares what it stored with what it reads saw a change.
#[tokio::test]
async fn a_test_s_numbers_come_back_to_the_last_bit() {
    let s = TestServer::start().await;
    let t = s.team("exact numbers").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    for sent in ["0.9856906946328695", "0.9090909090909091", "0.30000000000000004"] {
        let body = with(x.test(sent), json!({"pass_threshold": "THRESHOLD"})).to_string();
        let body = body.replace("\"THRESHOLD\"", sent);
        let created = s
            .http
            .post(s.url("/v1/tests"))
            .header("x-api-key", &t.editor)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 200);
        let created: Value = created.json().await.unwrap();
        let read = s.get(&format!("/v1/tests/{}", id(&created)), &t.editor).await.text().await.unwrap();
        let read: Value = serde_json::from_str(&read).unwrap();
        assert_eq!(read["pass_threshold"].to_string(), sent, "{sent}");
        assert_eq!(created["pass_threshold"].to_string(), sent, "{sent}");
    }
}

#[tokio::test]
async fn bad_test_fields_are_refused_naming_the_field_and_leave_no_trace() {
    let s = TestServer::start().await;
    let t = s.team("test validation").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let twilio = id(&create(
        &s,
        "/v1/integrations",
        &t.owner,
        json!({"project_id": x.project_id, "provider": "twilio", "name": "phones",
               "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"}}),
    )
    .await);
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    let many_personas: Vec<String> = (0..101).map(|i| format!("per_{i}")).collect();
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"name": " "}), "invalid_name", "name"),
        (json!({"name": "x".repeat(101)}), "invalid_name", "name"),
        (json!({"name": "a\u{7}b"}), "invalid_name", "name"),
        (json!({"description": "x".repeat(2001)}), "invalid_description", "description"),
        (json!({"description": "bell\u{7}"}), "invalid_description", "description"),
        (json!({"iterations": 0}), "invalid_iterations", "iterations"),
        (json!({"iterations": 101}), "invalid_iterations", "iterations"),
        (json!({"pass_threshold": 1.01}), "invalid_pass_threshold", "pass_threshold"),
        (json!({"pass_threshold": -0.5}), "invalid_pass_threshold", "pass_threshold"),
        (
            json!({"persona_ids": [x.personas[0], x.personas[1], x.personas[0]]}),
            "invalid_persona_ids",
            "persona_ids[2]",
        ),
        (json!({"persona_ids": many_personas}), "invalid_persona_ids", "persona_ids"),
        (json!({"tags": [" "]}), "invalid_tags", "tags[0]"),
        (
            json!({"evaluators": [{"type": "regex", "name": "r", "pattern": "(("}]}),
            "invalid_pattern",
            "evaluators[0].pattern",
        ),
        (
            json!({"evaluators": [{"type": "agent_ended_call", "name": "a"}, {"type": "agent_ended_call", "name": "a"}]}),
            "invalid_name",
            "evaluators[1].name",
        ),
        (json!({"evaluators": [{"type": "sentiment", "name": "s"}]}), "invalid_type", "evaluators[0].type"),
        (json!({"evaluators": [judge(&twilio)]}), "invalid_integration_id", "evaluators[0].integration_id"),
        (json!({"channel_id": null}), "invalid_channel_id", "channel_id"),
        (json!({"scenario_id": null}), "invalid_scenario_id", "scenario_id"),
        // No personas and a scenario without a default: nobody would call.
        (json!({"scenario_id": x.scenario_without_default}), "invalid_persona_ids", "persona_ids"),
        (
            json!({"scenario_id": x.scenario_without_default, "persona_ids": []}),
            "invalid_persona_ids",
            "default persona",
        ),
    ];
    for (extra, code, field) in cases {
        refused(&s, Method::POST, "/v1/tests", &t.editor, with(x.test("t"), extra), code, field).await;
    }
    let listed = s.expect(Method::GET, &format!("/v1/tests?project_id={}", x.project_id), &t.owner, None, 200).await;
    assert_eq!(listed["tests"], json!([]), "nothing was created");
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before, "no activity for refused requests");

    // The same rules hold for PATCH, which changes nothing when refused.
    let tst = create(&s, "/v1/tests", &t.editor, x.test("kept")).await;
    let path = format!("/v1/tests/{}", id(&tst));
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"name": " "}), "invalid_name", "name"),
        (json!({"name": null}), "invalid_name", "name"),
        (json!({"description": null}), "invalid_description", "description"),
        (json!({"channel_id": null}), "invalid_channel_id", "channel_id"),
        (json!({"iterations": 101}), "invalid_iterations", "iterations"),
        (json!({"iterations": null}), "invalid_iterations", "iterations"),
        (json!({"pass_threshold": 2}), "invalid_pass_threshold", "pass_threshold"),
        (json!({"persona_ids": null}), "invalid_persona_ids", "persona_ids"),
        (json!({"persona_ids": [x.personas[1], x.personas[1]]}), "invalid_persona_ids", "persona_ids[1]"),
        (json!({"tags": ["ok", ""]}), "invalid_tags", "tags[1]"),
        (json!({"evaluators": [judge(&twilio)]}), "invalid_integration_id", "evaluators[0].integration_id"),
        (json!({"scenario_id": x.scenario_without_default}), "invalid_persona_ids", "persona_ids"),
        // A name change alongside a bad field is not applied either.
        (json!({"name": "changed", "pass_threshold": -1}), "invalid_pass_threshold", "pass_threshold"),
    ];
    for (body, code, field) in cases {
        refused(&s, Method::PATCH, &path, &t.editor, body, code, field).await;
    }
    assert_eq!(s.expect(Method::GET, &path, &t.owner, None, 200).await, tst, "unchanged");
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before);
}

/// A result is judged by its scenario's evaluators (a step's named
/// `step N: <name>`, then the success criteria) and its test's, and reviews
/// find each evaluation by its name: no two may share one, whichever of
/// the scenario or the test is changed to make them.
#[tokio::test]
async fn a_result_s_evaluations_never_share_a_name() {
    let s = TestServer::start().await;
    let t = s.team("evaluation names").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let p = &x.project_id;
    let ended = |name: &str| json!({"type": "agent_ended_call", "name": name});
    let scenario = |name: &str, criteria: Value| {
        json!({"project_id": p, "name": name, "mode": "scripted", "default_persona_id": x.personas[0],
               "steps": [{"say": "hi", "expect": [ended("confirms")]}], "success_criteria": criteria})
    };
    // A success criterion named as a step's evaluation is in results.
    let clash = scenario("clash", json!([ended("step 1: confirms")]));
    refused(&s, Method::POST, "/v1/scenarios", &t.editor, clash, "invalid_name", "success_criteria[0].name").await;

    let booking = id(&create(&s, "/v1/scenarios", &t.editor, scenario("booking", json!([ended("books")]))).await);
    let other = id(&create(&s, "/v1/scenarios", &t.editor, scenario("other", json!([ended("polite")]))).await);
    let test = |evaluators: Value| with(x.test("judged"), json!({"scenario_id": booking, "evaluators": evaluators}));
    let before = activity_count(&s, &t.owner, p).await;
    for (evaluators, taken) in [
        (json!([ended("books")]), "success_criteria[0]"),
        (json!([ended("fine"), ended("step 1: confirms")]), "steps[0].expect[0]"),
    ] {
        let (status, e) =
            error_body(s.send_json(Method::POST, "/v1/tests", &t.editor, Some(test(evaluators))).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_name"), "{e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.starts_with("evaluators[") && message.contains(&booking) && message.contains(taken), "{e}");
    }
    assert_eq!(activity_count(&s, &t.owner, p).await, before, "nothing was created");
    // A step's `confirms` is `step 1: confirms` in results: a test may have `confirms`.
    let tst = create(&s, "/v1/tests", &t.editor, test(json!([ended("confirms"), ended("polite")]))).await;
    let path = format!("/v1/tests/{}", id(&tst));

    // PATCH: the evaluators given, or the scenario moved to.
    refused(
        &s,
        Method::PATCH,
        &path,
        &t.editor,
        json!({"evaluators": [ended("books")]}),
        "invalid_name",
        "evaluators[0].name",
    )
    .await;
    let moved = json!({"scenario_id": other});
    refused(&s, Method::PATCH, &path, &t.editor, moved, "invalid_scenario_id", "evaluators[1]").await;
    assert_eq!(s.expect(Method::GET, &path, &t.owner, None, 200).await, tst, "unchanged");

    // PUT of the scenario: a criterion named as the test's evaluator is.
    let scenario_path = format!("/v1/scenarios/{booking}");
    let hi = json!({"say": "hi", "expect": [ended("confirms")]});
    let put = |criteria: Value, steps: Value| {
        with(scenario("booking", criteria), json!({"project_id": null, "steps": steps}))
    };
    let taking = put(json!([ended("books"), ended("polite")]), json!([hi]));
    let (status, e) = error_body(s.send_json(Method::PUT, &scenario_path, &t.editor, Some(taking)).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(&format!("test {} \"judged\"", id(&tst))) && message.contains("`polite`"), "{e}");
    assert_eq!(s.expect(Method::GET, &scenario_path, &t.viewer, None, 200).await["version"], 1, "unchanged");
    // So is a step whose evaluation is named as it in results.
    let evaluators = json!({"evaluators": [ended("confirms"), ended("step 2: fine")]});
    s.expect(Method::PATCH, &path, &t.editor, Some(evaluators), 200).await;
    let taking = put(json!([ended("books")]), json!([hi, {"say": "bye", "expect": [ended("fine")]}]));
    let (status, e) = error_body(s.send_json(Method::PUT, &scenario_path, &t.editor, Some(taking)).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("`step 2: fine`"), "{e}");
    // Names of their own are fine.
    let apart = put(json!([ended("books"), ended("fine")]), json!([hi, {"say": "bye", "expect": [ended("done")]}]));
    assert_eq!(s.expect(Method::PUT, &scenario_path, &t.editor, Some(apart), 200).await["version"], 2);
}

#[tokio::test]
async fn tests_refer_only_to_their_own_projects_resources() {
    let s = TestServer::start().await;
    let t = s.team("references").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    // The same owner's other project: visible to them, still refused.
    let other_project = s.create_project(&t.owner, "other").await;
    let y = parts(&s, &t.owner, &other_project).await;
    let other_judge = id(&create(&s, "/v1/integrations", &t.owner, llm(&other_project, "judge")).await);
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"channel_id": y.channel}), "invalid_channel_id", "channel_id"),
        (json!({"channel_id": "chn_missing"}), "invalid_channel_id", "channel_id"),
        (json!({"channel_id": x.scenario}), "invalid_channel_id", "channel_id"),
        (json!({"scenario_id": y.scenario}), "invalid_scenario_id", "scenario_id"),
        (json!({"scenario_id": "scn_missing"}), "invalid_scenario_id", "scenario_id"),
        (json!({"persona_ids": [x.personas[0], y.personas[0]]}), "invalid_persona_ids", "persona_ids[1]"),
        (json!({"persona_ids": ["per_missing"]}), "invalid_persona_ids", "persona_ids[0]"),
        (json!({"evaluators": [judge(&other_judge)]}), "invalid_integration_id", "evaluators[0].integration_id"),
        (json!({"evaluators": [judge("int_missing")]}), "invalid_integration_id", "evaluators[0].integration_id"),
    ];
    let tst = create(&s, "/v1/tests", &t.owner, x.test("mine")).await;
    let path = format!("/v1/tests/{}", id(&tst));
    for (extra, code, field) in cases {
        refused(&s, Method::POST, "/v1/tests", &t.owner, with(x.test("t"), extra.clone()), code, field).await;
        refused(&s, Method::PATCH, &path, &t.owner, extra, code, field).await;
    }
    // The message does not say whether the id exists elsewhere.
    let (_, e) = error_body(
        s.send_json(Method::POST, "/v1/tests", &t.owner, Some(with(x.test("t"), json!({"channel_id": y.channel}))))
            .await,
    )
    .await;
    let (_, missing) = error_body(
        s.send_json(Method::POST, "/v1/tests", &t.owner, Some(with(x.test("t"), json!({"channel_id": "chn_missing"}))))
            .await,
    )
    .await;
    assert_eq!(
        e["message"].as_str().unwrap().replace(&y.channel, "ID"),
        missing["message"].as_str().unwrap().replace("chn_missing", "ID")
    );
    // A project the caller is not in is 404, as if it did not exist.
    s.expect(Method::POST, "/v1/tests", &t.outsider, Some(x.test("t")), 404).await;
    s.expect(Method::POST, "/v1/tests", &t.owner, Some(with(x.test("t"), json!({"project_id": "prj_missing"}))), 404)
        .await;
    // The contract says so: the generated client reads it as the API's
    // error, not as an answer it did not expect.
    let body: sparring_client::types::CreateTestRequest = serde_json::from_value(x.test("t")).unwrap();
    match s.client(&t.outsider).create_test().body(body).send().await {
        Err(sparring_client::Error::ErrorResponse(e)) => {
            assert_eq!((e.status().as_u16(), e.error_code.as_str()), (404, "not_found"))
        }
        other => panic!("expected the API's 404, got {other:?}"),
    }
    assert_eq!(s.expect(Method::GET, &path, &t.owner, None, 200).await, tst);

    // Batches: tests of the same project only.
    let theirs = id(&create(&s, "/v1/tests", &t.owner, y.test("theirs")).await);
    let mine = id(&tst);
    refused(
        &s,
        Method::POST,
        "/v1/batches",
        &t.owner,
        x.batch("b", &[&mine, &theirs]),
        "invalid_test_ids",
        "test_ids[1]",
    )
    .await;
    refused(
        &s,
        Method::POST,
        "/v1/batches",
        &t.owner,
        x.batch("b", &["tst_missing"]),
        "invalid_test_ids",
        "test_ids[0]",
    )
    .await;
    let bat = id(&create(&s, "/v1/batches", &t.owner, x.batch("b", &[&mine])).await);
    refused(
        &s,
        Method::PUT,
        &format!("/v1/batches/{bat}"),
        &t.owner,
        json!({"name": "b", "test_ids": [theirs]}),
        "invalid_test_ids",
        "test_ids[0]",
    )
    .await;
    assert_eq!(
        s.expect(Method::GET, &format!("/v1/batches/{bat}"), &t.owner, None, 200).await["test_ids"],
        json!([mine])
    );
}

#[tokio::test]
async fn patch_changes_only_what_it_names() {
    let s = TestServer::start().await;
    let t = s.team("patch").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let integration = id(&create(&s, "/v1/integrations", &t.owner, llm(&x.project_id, "judge")).await);
    let tst = create(
        &s,
        "/v1/tests",
        &t.owner,
        with(
            x.test("flow"),
            json!({
                "description": "first",
                "persona_ids": [x.personas[0], x.personas[1]],
                "iterations": 3,
                "pass_threshold": 0.5,
                "evaluators": [judge(&integration)],
                "tags": ["smoke"],
            }),
        ),
    )
    .await;
    let path = format!("/v1/tests/{}", id(&tst));

    // A name alone: everything else kept (lists included).
    let renamed = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"name": "renamed"})), 200).await;
    assert_eq!(renamed["name"], "renamed");
    for field in ["description", "persona_ids", "iterations", "pass_threshold", "evaluators", "tags", "channel_id"] {
        assert_eq!(renamed[field], tst[field], "{field} kept");
    }
    assert_ne!(renamed["updated_at"], tst["updated_at"]);
    let records = history(&s, &t.owner, "test", &id(&tst)).await;
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["action"], "test.update");
    assert_eq!(records[0]["changes"], json!({"name": "renamed"}));

    // Lists are replaced as a whole; `[]` empties them.
    let changed = s
        .expect(
            Method::PATCH,
            &path,
            &t.editor,
            Some(json!({"persona_ids": [x.personas[1]], "tags": [], "iterations": 5})),
            200,
        )
        .await;
    assert_eq!(changed["persona_ids"], json!([x.personas[1]]));
    assert_eq!(changed["tags"], json!([]));
    assert_eq!(changed["iterations"], 5);
    assert_eq!(changed["evaluators"], tst["evaluators"]);
    let records = history(&s, &t.owner, "test", &id(&tst)).await;
    assert_eq!(records.len(), 3);
    assert_eq!(records[0]["changes"], json!({"persona_ids": [x.personas[1]], "tags": [], "iterations": 5}));

    // `persona_ids: []` falls back to the scenario's default persona.
    let defaulted = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"persona_ids": []})), 200).await;
    assert_eq!(defaulted["persona_ids"], json!([]));
    // Moving to a scenario without a default now needs personas...
    refused(
        &s,
        Method::PATCH,
        &path,
        &t.editor,
        json!({"scenario_id": x.scenario_without_default}),
        "invalid_persona_ids",
        "persona_ids",
    )
    .await;
    // ...given in the same request.
    let moved = s
        .expect(
            Method::PATCH,
            &path,
            &t.editor,
            Some(json!({"scenario_id": x.scenario_without_default, "persona_ids": [x.personas[0]]})),
            200,
        )
        .await;
    assert_eq!(moved["scenario_id"], json!(x.scenario_without_default));
    assert_eq!(moved["persona_ids"], json!([x.personas[0]]));

    // Nothing to change: nothing written, nothing recorded.
    let count = history(&s, &t.owner, "test", &id(&tst)).await.len();
    for body in [json!({}), json!({"name": "renamed", "iterations": 5, "tags": []})] {
        let same = s.expect(Method::PATCH, &path, &t.editor, Some(body), 200).await;
        assert_eq!(same, moved);
    }
    assert_eq!(history(&s, &t.owner, "test", &id(&tst)).await.len(), count);
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, moved);
}

/// The parts, an LLM integration, and a test "flow" using the scenario
/// without a default persona, the second persona and a judge on that
/// integration.
async fn test_using_everything(s: &TestServer, t: &Team) -> (Parts, String, String) {
    let x = parts(s, &t.owner, &t.project_id).await;
    let integration = id(&create(s, "/v1/integrations", &t.owner, llm(&x.project_id, "judge")).await);
    let tst = id(&create(
        s,
        "/v1/tests",
        &t.owner,
        with(
            x.test("flow"),
            json!({"scenario_id": x.scenario_without_default, "persona_ids": [x.personas[1]],
                   "evaluators": [judge(&integration)]}),
        ),
    )
    .await);
    (x, integration, tst)
}

#[tokio::test]
async fn what_a_test_uses_cannot_be_deleted_from_under_it() {
    let s = TestServer::start().await;
    let t = s.team("in use").await;
    let (x, integration, tst) = test_using_everything(&s, &t).await;
    for path in [
        format!("/v1/channels/{}", x.channel),
        format!("/v1/scenarios/{}", x.scenario_without_default),
        format!("/v1/personas/{}", x.personas[1]),
        format!("/v1/integrations/{integration}"),
    ] {
        let (status, e) = error_body(s.send_json(Method::DELETE, &path, &t.owner, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains(&format!("test {tst} \"flow\"")), "{path}: {e}");
    }
    // Dropping the judge from the test frees its integration.
    s.expect(Method::PATCH, &format!("/v1/tests/{tst}"), &t.owner, Some(json!({"evaluators": []})), 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{integration}"), &t.owner, None, 200).await;
    // Deleting the test frees the rest.
    s.expect(Method::DELETE, &format!("/v1/tests/{tst}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/personas/{}", x.personas[1]), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/scenarios/{}", x.scenario_without_default), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/channels/{}", x.channel), &t.owner, None, 200).await;
}

#[tokio::test]
async fn a_test_in_a_batch_cannot_be_deleted() {
    let s = TestServer::start().await;
    let t = s.team("batch in use").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("flow")).await);
    let other = id(&create(&s, "/v1/tests", &t.owner, x.test("other")).await);
    let bat = id(&create(&s, "/v1/batches", &t.owner, x.batch("nightly", &[&other, &tst])).await);
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    let (status, e) = error_body(s.send_json(Method::DELETE, &format!("/v1/tests/{tst}"), &t.editor, None).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{e}");
    assert!(e["message"].as_str().unwrap().contains(&format!("batch {bat} \"nightly\"")), "{e}");
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before);
    s.expect(Method::GET, &format!("/v1/tests/{tst}"), &t.owner, None, 200).await;
    // Out of the batch, it can go.
    s.expect(
        Method::PUT,
        &format!("/v1/batches/{bat}"),
        &t.editor,
        Some(json!({"name": "nightly", "test_ids": [other]})),
        200,
    )
    .await;
    s.expect(Method::DELETE, &format!("/v1/tests/{tst}"), &t.editor, None, 200).await;
    let records = history(&s, &t.owner, "test", &tst).await;
    assert_eq!(records[0]["action"], "test.delete");
    assert_eq!(records.len(), 2);
    // Deleting the batch leaves its tests.
    s.expect(Method::DELETE, &format!("/v1/batches/{bat}"), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/tests/{other}"), &t.editor, None, 200).await;
}

/// DELETE /tests/{id} and /batches/{id}: 409 while one of its runs is
/// active (spec); once the runs are over, they go.
#[tokio::test]
async fn a_test_or_a_batch_with_an_active_run_cannot_be_deleted() {
    // No workers: what is started stays queued.
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.workers = 0).await;
    let t = s.team("active runs").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("flow")).await);
    let batched = id(&create(&s, "/v1/tests", &t.owner, x.test("batched")).await);
    let bat = id(&create(&s, "/v1/batches", &t.owner, x.batch("nightly", &[&batched])).await);
    let by_test = id(&s.expect(Method::POST, &format!("/v1/tests/{tst}/run"), &t.editor, Some(json!({})), 200).await);
    let by_batch =
        id(&s.expect(Method::POST, &format!("/v1/batches/{bat}/run"), &t.editor, Some(json!({})), 200).await);
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    for path in [format!("/v1/tests/{tst}"), format!("/v1/batches/{bat}")] {
        let (status, e) = error_body(s.send_json(Method::DELETE, &path, &t.editor, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "runs_active"), "{path}: {e}");
        s.expect(Method::GET, &path, &t.owner, None, 200).await;
    }
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before, "a refused delete records nothing");
    // Cancelled, the runs are over: both can go.
    for run in [&by_test, &by_batch] {
        s.expect(Method::POST, &format!("/v1/batch-runs/{run}/cancel"), &t.editor, None, 200).await;
    }
    s.expect(Method::DELETE, &format!("/v1/tests/{tst}"), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/batches/{bat}"), &t.editor, None, 200).await;
    s.expect(Method::GET, &format!("/v1/batch-runs/{by_batch}"), &t.viewer, None, 200).await;
}

/// Runs keep their test's channel, scenario, personas and evaluators as
/// queued (spec, PATCH /tests/{id}): what they were queued with cannot be
/// deleted while they wait, though the test now refers to something else;
/// once they are over, it can.
#[tokio::test]
async fn what_queued_runs_were_queued_with_cannot_be_deleted_from_under_them() {
    // No workers: what is started stays queued.
    let s = TestServer::start_configured(Vec::new(), |c| c.engine.workers = 0).await;
    let t = s.team("bound runs").await;
    let (x, integration, tst) = test_using_everything(&s, &t).await;
    let queued = id(&s.expect(Method::POST, &format!("/v1/tests/{tst}/run"), &t.editor, Some(json!({})), 200).await);
    // The test moves on to other parts; its queued runs do not.
    let channel = id(&create(
        &s,
        "/v1/channels",
        &t.owner,
        json!({"project_id": x.project_id, "name": "other agent", "kind": "http", "target": "http://127.0.0.1:9/other"}),
    )
    .await);
    let moved =
        json!({"channel_id": channel, "scenario_id": x.scenario, "persona_ids": [x.personas[0]], "evaluators": []});
    s.expect(Method::PATCH, &format!("/v1/tests/{tst}"), &t.editor, Some(moved), 200).await;
    let bound = [
        format!("/v1/channels/{}", x.channel),
        format!("/v1/scenarios/{}", x.scenario_without_default),
        format!("/v1/personas/{}", x.personas[1]),
        format!("/v1/integrations/{integration}"),
    ];
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    for path in &bound {
        let (status, e) = error_body(s.send_json(Method::DELETE, path, &t.owner, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "runs_active"), "{path}: {e}");
        s.expect(Method::GET, path, &t.owner, None, 200).await;
    }
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before, "a refused delete records nothing");
    // Cancelled, the runs are over: every one of them can go.
    s.expect(Method::POST, &format!("/v1/batch-runs/{queued}/cancel"), &t.editor, None, 200).await;
    for path in &bound {
        s.expect(Method::DELETE, path, &t.owner, None, 200).await;
    }
}

/// A test is up to a request body (1 MiB) in size: a page of 200 of them
/// was up to 200 MB, read, kept and written whole for one request. A page
/// ends before its `limit`, with a cursor, once its tests pass 8 MiB, from
/// the database or from memory alike, and page by page every test is listed
/// once.
#[tokio::test]
async fn a_page_of_tests_ends_once_its_tests_pass_8_mib() {
    const PAGE_BYTES: usize = 8 << 20;
    let s = TestServer::start().await;
    let owner = s.key_for_user("big-tests@example.com").await;
    let project_id = s.create_project(&owner, "big tests").await;
    let x = parts(&s, &owner, &project_id).await;
    let llm = id(&create(&s, "/v1/integrations", &owner, llm(&project_id, "judge")).await);
    // ~960 KB each: 48 judges with prompts of 20,000 characters.
    let judges: Vec<Value> = (0..48)
        .map(|i| {
            json!({"type": "llm_judge", "name": format!("judge {i}"), "integration_id": llm,
                   "prompt": "p".repeat(20_000)})
        })
        .collect();
    let mut made = Vec::new();
    for i in 0..12 {
        let test = with(x.test(&format!("big {i}")), json!({"evaluators": judges}));
        made.insert(0, id(&create(&s, "/v1/tests", &owner, test).await));
    }
    for path in [format!("/v1/tests?project_id={project_id}&limit=200"), "/v1/tests?limit=200".to_string()] {
        // Twice: the second may be answered from memory.
        for _ in 0..2 {
            let body = s.get(&path, &owner).await.text().await.unwrap();
            let page: Value = serde_json::from_str(&body).unwrap();
            let ids = ids_of(&page);
            assert!(body.len() < PAGE_BYTES + (1 << 20), "{path}: a page of {} bytes, {} tests", body.len(), ids.len());
            assert!(!ids.is_empty() && ids.len() < made.len(), "{path}: {} tests", ids.len());
            assert_eq!(ids, made[..ids.len()], "{path}");
            assert!(page["next_cursor"].is_string(), "{path}: a page cut short has a next one");
            let all = common::items_of_pages(&s, &owner, &path, "tests").await;
            assert_eq!(all.iter().map(id).collect::<Vec<_>>(), made, "{path}: page by page");
        }
    }
}

#[tokio::test]
async fn tests_are_listed_by_filter_and_page() {
    let s = TestServer::start().await;
    let t = s.team("test lists").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let second_channel = id(&create(
        &s,
        "/v1/channels",
        &t.owner,
        json!({"project_id": x.project_id, "name": "ws agent", "kind": "websocket", "target": "ws://127.0.0.1:9/ws"}),
    )
    .await);
    let mut made = Vec::new();
    for i in 0..7 {
        let mut extra = json!({"tags": if i % 2 == 0 { json!(["even"]) } else { json!(["odd"]) }});
        if i < 3 {
            extra["channel_id"] = json!(second_channel);
        }
        if i == 6 {
            extra["scenario_id"] = json!(x.scenario_without_default);
            extra["persona_ids"] = json!([x.personas[0]]);
        }
        made.push(id(&create(&s, "/v1/tests", &t.editor, with(x.test(&format!("t{i}")), extra)).await));
    }
    // Another project's tests stay out of filtered lists.
    let other = s.create_project(&t.owner, "other").await;
    let y = parts(&s, &t.owner, &other).await;
    create(&s, "/v1/tests", &t.owner, y.test("elsewhere")).await;

    let newest_first = |mut v: Vec<String>| {
        v.reverse();
        v
    };
    let p = &x.project_id;
    let all = s.expect(Method::GET, &format!("/v1/tests?project_id={p}"), &t.viewer, None, 200).await;
    assert_eq!(ids_of(&all), newest_first(made.clone()));
    let by_channel =
        s.expect(Method::GET, &format!("/v1/tests?channel_id={second_channel}"), &t.viewer, None, 200).await;
    assert_eq!(ids_of(&by_channel), newest_first(made[..3].to_vec()));
    let by_scenario = s
        .expect(Method::GET, &format!("/v1/tests?scenario_id={}", x.scenario_without_default), &t.viewer, None, 200)
        .await;
    assert_eq!(ids_of(&by_scenario), vec![made[6].clone()]);
    let by_tag = s.expect(Method::GET, &format!("/v1/tests?project_id={p}&tag=even"), &t.viewer, None, 200).await;
    assert_eq!(ids_of(&by_tag), newest_first(vec![made[0].clone(), made[2].clone(), made[4].clone(), made[6].clone()]));
    let both =
        s.expect(Method::GET, &format!("/v1/tests?channel_id={second_channel}&tag=odd"), &t.viewer, None, 200).await;
    assert_eq!(ids_of(&both), vec![made[1].clone()]);
    // The viewer is not in the other project: its test is not in their list.
    let everything = s.expect(Method::GET, "/v1/tests", &t.viewer, None, 200).await;
    assert_eq!(ids_of(&everything), newest_first(made.clone()));
    s.expect(Method::GET, &format!("/v1/tests?project_id={other}"), &t.viewer, None, 404).await;
    // Persona lists come back in order in lists too.
    assert_eq!(all["tests"][0]["persona_ids"], json!([x.personas[0]]));

    // Pages: each test once, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tests?project_id={p}&limit=3");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
        let ids = ids_of(&page);
        assert!(ids.len() <= 3);
        seen.extend(ids);
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, newest_first(made.clone()));
    // The owner is in both projects: page by page, both projects' tests,
    // newest first, each once.
    let mut both_projects = s.expect(Method::GET, &format!("/v1/tests?project_id={other}"), &t.owner, None, 200).await
        ["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(id)
        .collect::<Vec<_>>();
    both_projects.extend(made.clone());
    both_projects.sort_unstable_by(|a, b| b.cmp(a));
    let listed = common::items_of_pages(&s, &t.owner, "/v1/tests?limit=2", "tests").await;
    assert_eq!(listed.iter().map(id).collect::<Vec<_>>(), both_projects);
    let (status, e) = error_body(s.get("/v1/tests?cursor=bm90IGEgY3Vyc29yIQ", &t.viewer).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_cursor"));
}

// Batches.

#[tokio::test]
async fn batches_keep_their_tests_in_order_and_put_replaces_everything() {
    let s = TestServer::start().await;
    let t = s.team("batch fields").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    // Batches without a `concurrency` take the project's default.
    let settings = json!({"name": "batch fields", "settings": {"max_call_duration_s": 600, "default_concurrency": 7}});
    s.expect(Method::PUT, &format!("/v1/projects/{}", t.project_id), &t.owner, Some(settings), 200).await;
    let mut tests = Vec::new();
    for i in 0..3 {
        tests.push(id(&create(&s, "/v1/tests", &t.owner, x.test(&format!("t{i}"))).await));
    }
    let order = [tests[2].as_str(), tests[0].as_str(), tests[1].as_str()];
    let bat = create(
        &s,
        "/v1/batches",
        &t.editor,
        with(x.batch("nightly", &order), json!({"description": "every night", "concurrency": 3})),
    )
    .await;
    assert!(bat["id"].as_str().unwrap().starts_with("bat_"));
    assert_eq!(bat["test_ids"], json!(order));
    assert_eq!(bat["concurrency"], 3);
    assert_eq!(bat["description"], "every night");
    assert_eq!(bat["last_run"], Value::Null, "no run yet");
    assert!(bat.as_object().unwrap().contains_key("last_run"));
    let path = format!("/v1/batches/{}", id(&bat));
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, bat);

    let minimal = create(&s, "/v1/batches", &t.editor, x.batch("empty for now", &[])).await;
    assert_eq!(minimal["test_ids"], json!([]));
    assert_eq!(minimal["concurrency"], 7);
    assert_eq!(minimal["description"], "");

    // PUT: absent optional fields reset to their defaults.
    let replaced =
        s.expect(Method::PUT, &path, &t.editor, Some(json!({"name": "nightly", "test_ids": [tests[1]]})), 200).await;
    assert_eq!(replaced["test_ids"], json!([tests[1]]));
    assert_eq!(replaced["concurrency"], 7);
    assert_eq!(replaced["description"], "");
    assert_eq!(replaced["created_at"], bat["created_at"]);
    assert_ne!(replaced["updated_at"], bat["updated_at"]);
    let records = history(&s, &t.owner, "batch", &id(&bat)).await;
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["action"], "batch.update");
    assert_eq!(records[0]["changes"], json!({"test_ids": [tests[1]], "concurrency": 7, "description": ""}));
    assert_eq!(records[1]["action"], "batch.create");
    assert_eq!(records[1]["changes"]["test_ids"], json!(order));

    s.expect(Method::DELETE, &path, &t.editor, None, 200).await;
    let records = history(&s, &t.owner, "batch", &id(&bat)).await;
    assert_eq!(records.len(), 3);
    assert_eq!(records[0]["action"], "batch.delete");
    assert_eq!(records[0]["project_id"], json!(x.project_id));
}

#[tokio::test]
async fn bad_batch_fields_are_refused_naming_the_field() {
    let s = TestServer::start().await;
    let t = s.team("batch validation").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("t")).await);
    let other = id(&create(&s, "/v1/tests", &t.owner, x.test("u")).await);
    let bat = create(&s, "/v1/batches", &t.owner, x.batch("kept", &[&tst])).await;
    let path = format!("/v1/batches/{}", id(&bat));
    let before = activity_count(&s, &t.owner, &x.project_id).await;
    let too_many: Vec<String> = (0..1001).map(|i| format!("tst_{i}")).collect();
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"name": " "}), "invalid_name", "name"),
        (json!({"name": "x".repeat(101)}), "invalid_name", "name"),
        (json!({"description": "x".repeat(2001)}), "invalid_description", "description"),
        (json!({"concurrency": 0}), "invalid_concurrency", "concurrency"),
        (json!({"concurrency": 1001}), "invalid_concurrency", "concurrency"),
        (json!({"test_ids": [tst, other, tst]}), "invalid_test_ids", "test_ids[2]"),
        (json!({"test_ids": too_many}), "invalid_test_ids", "test_ids"),
        (json!({"test_ids": null}), "invalid_test_ids", "test_ids"),
    ];
    for (extra, code, field) in cases {
        refused(&s, Method::POST, "/v1/batches", &t.editor, with(x.batch("b", &[&tst]), extra.clone()), code, field)
            .await;
        let put = with(json!({"name": "b", "test_ids": [tst]}), extra);
        refused(&s, Method::PUT, &path, &t.editor, put, code, field).await;
    }
    assert_eq!(s.expect(Method::GET, &path, &t.owner, None, 200).await, bat, "unchanged");
    assert_eq!(activity_count(&s, &t.owner, &x.project_id).await, before, "no activity for refused requests");
    let listed = s.expect(Method::GET, &format!("/v1/batches?project_id={}", x.project_id), &t.owner, None, 200).await;
    assert_eq!(listed["batches"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn batches_are_listed_by_page() {
    let s = TestServer::start().await;
    let t = s.team("batch pages").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("t")).await);
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(id(&create(&s, "/v1/batches", &t.editor, x.batch(&format!("b{i}"), &[&tst])).await));
    }
    let other = s.create_project(&t.owner, "other").await;
    create(&s, "/v1/batches", &t.owner, json!({"project_id": other, "name": "elsewhere", "test_ids": []})).await;
    made.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/batches?project_id={}&limit=2", x.project_id);
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = s.expect(Method::GET, &path, &t.reviewer, None, 200).await;
        let batches = page["batches"].as_array().unwrap();
        assert!(batches.len() <= 2);
        for b in batches {
            assert_eq!(b["test_ids"], json!([tst]));
        }
        seen.extend(batches.iter().map(id));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, made);
    // The reviewer is not in the other project.
    let all = s.expect(Method::GET, "/v1/batches", &t.reviewer, None, 200).await;
    assert_eq!(all["batches"].as_array().unwrap().iter().map(id).collect::<Vec<_>>(), made);
    s.expect(Method::GET, &format!("/v1/batches?project_id={other}"), &t.reviewer, None, 404).await;
    // The owner sees both projects' batches.
    let owners = s.expect(Method::GET, "/v1/batches", &t.owner, None, 200).await;
    assert_eq!(owners["batches"].as_array().unwrap().len(), 6);
    // Page by page across both, newest first, each once.
    let paged = common::items_of_pages(&s, &t.owner, "/v1/batches?limit=2", "batches").await;
    let mut newest_first: Vec<String> = owners["batches"].as_array().unwrap().iter().map(id).collect();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(paged.iter().map(id).collect::<Vec<_>>(), newest_first);
}

// The first hour, through the generated client.

#[tokio::test]
async fn a_first_hour_through_the_generated_client() {
    let s = TestServer::start().await;
    let owner = s.key_for_user("first-hour-owner@example.com").await;
    let reviewer = s.key_for_user("first-hour-reviewer@example.com").await;
    let client = s.client(&owner);
    let made = first_hour::first_hour(&client, "first-hour-reviewer@example.com").await.unwrap();

    assert_eq!(made.project.role.to_string(), "owner");
    assert_eq!(made.phone_numbers.len(), 2);
    assert_eq!(made.integration.phone_numbers.len(), 2);
    assert!(made.integration.credentials_configured);
    assert_eq!(made.channel.integration_id.as_deref(), Some(made.integration.id.as_str()));
    assert_eq!(made.personas.len(), 2);
    assert_eq!(made.scenario.default_persona_id.as_deref(), Some(made.personas.iter().last().unwrap().id.as_str()));
    let persona_ids: Vec<String> = made.personas.iter().rev().map(|p| p.id.clone()).collect();
    assert_eq!(made.test.persona_ids, persona_ids, "created in order, listed newest first");
    assert_eq!(made.test.iterations.get(), 2);
    assert_eq!(made.test.pass_threshold, 0.5);
    assert_eq!(made.test.evaluators.len(), 1);
    assert_eq!(made.test.tags, vec!["smoke".to_string()]);
    assert_eq!(made.batch.test_ids, vec![made.test.id.clone()]);
    assert_eq!(made.batch.concurrency.get(), 2);
    assert!(made.batch.last_run.is_none());
    let mut roles: Vec<String> = made.members.iter().map(|m| m.role.to_string()).collect();
    roles.sort();
    assert_eq!(roles, ["owner", "reviewer"]);
    let summary = made.summary();
    assert!(summary.contains(&made.batch.id) && summary.contains("first-hour-reviewer@example.com"), "{summary}");
    // The credential is write-only: nowhere in what was read back.
    assert!(!format!("{made:?}").contains("first-hour-example-token"));

    // The reviewer reads the test and the batch, and may not change them.
    let as_reviewer = s.client(&reviewer);
    let test = as_reviewer.get_test().id(&made.test.id).send().await.unwrap().into_inner();
    assert_eq!(test.name, made.test.name);
    let batches = as_reviewer.list_batches().project_id(&made.project.id).send().await.unwrap().into_inner();
    assert_eq!(batches.batches.len(), 1);
    let refused = as_reviewer.delete_batch().id(&made.batch.id).send().await.unwrap_err();
    assert_eq!(refused.status().map(|s| s.as_u16()), Some(403));
    let tests = client.list_tests().project_id(&made.project.id).tag("smoke").send().await.unwrap().into_inner();
    assert_eq!(tests.tests.len(), 1);
}

/// A `PUT` that gives the batch it already is changes nothing: its
/// `updated_at` ("time of the last change") stays and nothing is recorded,
/// as for a `PATCH` of a test that changes nothing.
#[tokio::test]
async fn a_put_giving_the_stored_batch_changes_nothing() {
    let s = TestServer::start().await;
    let t = s.team("same batch").await;
    let x = parts(&s, &t.owner, &t.project_id).await;
    let tst = id(&create(&s, "/v1/tests", &t.owner, x.test("t")).await);
    let bat = create(&s, "/v1/batches", &t.editor, with(x.batch("nightly", &[&tst]), json!({"concurrency": 3}))).await;
    let path = format!("/v1/batches/{}", id(&bat));
    let same = json!({"name": "nightly", "description": "", "test_ids": [tst], "concurrency": 3});
    let got = s.expect(Method::PUT, &path, &t.editor, Some(same), 200).await;
    assert_eq!(got, bat, "nothing changed");
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, bat);
    assert_eq!(history(&s, &t.owner, "batch", &id(&bat)).await.len(), 1, "nothing recorded");
}
