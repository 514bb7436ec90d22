//! What every list shares: its cursor (opaque: only one this list issued is
//! taken), its order (newest first) and its filters.

mod common;

use base64::Engine as _;
use common::{error_body, keys_of_pages, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

fn ids(page: &Value, field: &str) -> Vec<String> {
    page[field].as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap().to_string()).collect()
}

/// `GET /activity?until=`: "only records created before this time".
#[tokio::test]
async fn until_leaves_out_a_record_made_at_that_time() {
    let s = TestServer::start().await;
    let key = s.key_for_user("until@example.com").await;
    let project = s.create_project(&key, "until").await;
    let all = s.expect(Method::GET, &format!("/v1/activity?project_id={project}"), &key, None, 200).await;
    let created = &all["activity"][0];
    assert_eq!(created["action"], "project.create");
    let at = created["created_at"].as_str().unwrap().replace('+', "%2B");
    let before = s.expect(Method::GET, &format!("/v1/activity?project_id={project}&until={at}"), &key, None, 200).await;
    assert_eq!(ids(&before, "activity"), Vec::<String>::new(), "a record made at `until` is not before it");
    let since = s.expect(Method::GET, &format!("/v1/activity?project_id={project}&since={at}"), &key, None, 200).await;
    assert_eq!(ids(&since, "activity"), [created["id"].as_str().unwrap()], "`since` is at or after");
}

/// A cursor is opaque: one a list did not issue (made up, cut short, or
/// another list's) is a 400 `invalid_cursor`, never some other page.
#[tokio::test]
async fn a_cursor_the_list_did_not_issue_is_refused() {
    let s = TestServer::start().await;
    let t = s.team("cursors").await;
    let p = &t.project_id;
    for i in 0..2 {
        s.expect(Method::POST, "/v1/personas", &t.owner, Some(json!({"project_id": p, "name": format!("p{i}")})), 200)
            .await;
        s.expect(
            Method::POST,
            "/v1/channels",
            &t.owner,
            Some(json!({"project_id": p, "name": format!("c{i}"), "kind": "http", "target": "http://127.0.0.1:9/a"})),
            200,
        )
        .await;
    }
    let cursor_of = async |path: &str| -> String {
        s.expect(Method::GET, path, &t.owner, None, 200).await["next_cursor"].as_str().unwrap().to_string()
    };
    let channels = cursor_of("/v1/channels?limit=1").await;
    let personas = cursor_of("/v1/personas?limit=1").await;
    // The list's own cursor works.
    let next = s.expect(Method::GET, &format!("/v1/personas?limit=1&cursor={personas}"), &t.owner, None, 200).await;
    assert_eq!(ids(&next, "personas").len(), 1);
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let decoded =
        String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&personas).unwrap()).unwrap();
    for (what, path) in [
        ("another list's", format!("/v1/personas?cursor={channels}")),
        ("another list's", format!("/v1/activity?cursor={personas}")),
        ("another list's", format!("/v1/projects/{p}/members?cursor={personas}")),
        ("made up", format!("/v1/personas?cursor={}", b64("zzzz"))),
        ("made up", format!("/v1/activity?cursor={}", b64("0"))),
        ("cut short", format!("/v1/personas?cursor={}", b64(&decoded[..decoded.len() - 4]))),
        ("another list's", format!("/v1/api-keys?cursor={personas}")),
    ] {
        let (status, e) = error_body(s.send_json(Method::GET, &path, &t.owner, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_cursor"), "{what} cursor: {path}: {e}");
        // Every list says it the same way, naming the parameter once.
        assert_eq!(e["message"], "cursor: not a cursor this server issued", "{what} cursor: {path}");
    }
}

/// In the team's project, made by its editor: an http channel to `closed`
/// (every call fails at once, each run keeping a result that says so) and a
/// scripted scenario of one line with its persona.
async fn unreachable_channel_and_scenario(
    s: &TestServer,
    t: &common::Team,
    closed: &common::ClosedPort,
) -> (String, String) {
    let p = &t.project_id;
    let create = async |path: &str, body: Value| -> String {
        s.expect(Method::POST, path, &t.editor, Some(body), 200).await["id"].as_str().unwrap().to_string()
    };
    let channel = create(
        "/v1/channels",
        json!({"project_id": p, "name": "agent", "kind": "http", "target": closed.http_target()}),
    )
    .await;
    let persona = create("/v1/personas", json!({"project_id": p, "name": "caller"})).await;
    let scenario = create(
        "/v1/scenarios",
        json!({"project_id": p, "name": "s", "mode": "scripted", "default_persona_id": persona,
               "steps": [{"say": "hi", "expect": []}]}),
    )
    .await;
    (channel, scenario)
}

/// The runs of a batch run, the tests of a batch run and the results of a
/// test are a list each: a cursor one of them issued, given to the same
/// list of another batch run or test, is refused too. It was taken as a
/// place in time, and answered with a page of the other list's items
/// older than it: some skipped, or none at all and no cursor, as if its
/// end were reached.
#[tokio::test]
async fn a_cursor_of_another_batch_runs_or_tests_list_is_refused() {
    let s = TestServer::start().await;
    let t = s.team("cursors of a parent").await;
    let p = &t.project_id;
    let closed = common::ClosedPort::new();
    let create = |path: &'static str, body: Value| {
        let (s, key) = (&s, t.editor.clone());
        async move { s.expect(Method::POST, path, &key, Some(body), 200).await["id"].as_str().unwrap().to_string() }
    };
    let (channel, scenario) = unreachable_channel_and_scenario(&s, &t, &closed).await;
    let test = |name: &str| json!({"project_id": p, "name": name, "channel_id": channel, "scenario_id": scenario, "iterations": 2});
    let (one, two) = (create("/v1/tests", test("one")).await, create("/v1/tests", test("two")).await);
    let batch = create("/v1/batches", json!({"project_id": p, "name": "b", "test_ids": [one, two]})).await;
    // Two batch runs (the batch's first), each ending at once: the agent is
    // not there, and every run keeps a result saying so.
    let both = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let first = s.expect(Method::POST, &format!("/v1/tests/{one}/run"), &t.editor, Some(json!({})), 200).await;
    let (both, first) = (both["id"].as_str().unwrap(), first["id"].as_str().unwrap());
    for id in [both, first] {
        common::engine::wait_for_end(&s, &t.viewer, id).await;
    }
    let cursor_of = async |path: &str| -> String {
        s.expect(Method::GET, path, &t.viewer, None, 200).await["next_cursor"].as_str().unwrap().to_string()
    };
    for (issued_by, given_to) in [
        (format!("/v1/batch-runs/{both}/runs?limit=1"), format!("/v1/batch-runs/{first}/runs")),
        (format!("/v1/batch-runs/{first}/runs?limit=1"), format!("/v1/batch-runs/{both}/runs")),
        (format!("/v1/batch-runs/{both}/tests?limit=1"), format!("/v1/batch-runs/{first}/tests")),
        (format!("/v1/tests/{two}/results?limit=1"), format!("/v1/tests/{one}/results")),
        (format!("/v1/tests/{one}/results?limit=1"), format!("/v1/tests/{two}/results")),
    ] {
        let cursor = cursor_of(&issued_by).await;
        // Its own list goes on from it.
        let own = issued_by.replace("limit=1", &format!("cursor={cursor}"));
        s.expect(Method::GET, &own, &t.viewer, None, 200).await;
        let (status, e) = error_body(s.get(&format!("{given_to}?cursor={cursor}"), &t.viewer).await).await;
        assert_eq!((status, e["error_code"].as_str()), (400, Some("invalid_cursor")), "{issued_by} -> {given_to}: {e}");
    }
}

/// `GET /batch-runs/{id}/tests` over a batch run of more tests than a page:
/// paged one, two or three at a time it is its one page of 200 (every test
/// once, newest first), and each test, on whatever page, is counted with
/// its own runs and no other test's.
#[tokio::test]
async fn a_batch_runs_tests_paged_are_its_whole_page() {
    let s = TestServer::start().await;
    let t = s.team("tests of a batch run").await;
    let p = &t.project_id;
    let closed = common::ClosedPort::new();
    let create = |path: &'static str, body: Value| {
        let (s, key) = (&s, t.editor.clone());
        async move { s.expect(Method::POST, path, &key, Some(body), 200).await["id"].as_str().unwrap().to_string() }
    };
    let (channel, scenario) = unreachable_channel_and_scenario(&s, &t, &closed).await;
    // Five tests, the i-th with i iterations: each test's count says whose
    // runs it counted.
    let mut iterations = std::collections::HashMap::new();
    let mut tests = Vec::new();
    for i in 1..=5 {
        let body = json!({"project_id": p, "name": format!("t{i}"), "channel_id": channel,
                          "scenario_id": scenario, "iterations": i});
        let test = create("/v1/tests", body).await;
        iterations.insert(test.clone(), i);
        tests.push(test);
    }
    let batch = create("/v1/batches", json!({"project_id": p, "name": "b", "test_ids": tests})).await;
    let run = s.expect(Method::POST, &format!("/v1/batches/{batch}/run"), &t.editor, Some(json!({})), 200).await;
    let id = run["id"].as_str().unwrap();
    common::engine::wait_for_end(&s, &t.viewer, id).await;
    let path = format!("/v1/batch-runs/{id}/tests");
    let whole = s.expect(Method::GET, &format!("{path}?limit=200"), &t.viewer, None, 200).await;
    assert!(whole["next_cursor"].is_null(), "{whole:#}");
    let whole = whole["tests"].as_array().unwrap().clone();
    let mut newest_first = tests.clone();
    newest_first.reverse();
    let ids_of =
        |items: &[Value]| -> Vec<String> { items.iter().map(|t| t["test_id"].as_str().unwrap().to_string()).collect() };
    assert_eq!(ids_of(&whole), newest_first);
    for test in &whole {
        let n = iterations[test["test_id"].as_str().unwrap()];
        let counts = &test["counts"];
        assert_eq!(counts["total"], n, "{test:#}");
        let ended: i64 = ["queued", "running", "passed", "failed", "errored", "cancelled"]
            .iter()
            .map(|k| counts[k].as_i64().unwrap())
            .sum();
        assert_eq!(ended, n, "{test:#}");
    }
    for limit in [1, 2, 3] {
        let paged = common::items_of_pages(&s, &t.viewer, &format!("{path}?limit={limit}"), "tests").await;
        assert_eq!(paged, whole, "{limit} at a time");
    }
}

/// `GET /projects/{id}/members`: "newest first" is the member added last
/// first, whenever their account was made.
#[tokio::test]
async fn members_are_listed_newest_first() {
    let s = TestServer::start().await;
    let owner = s.key_for_user("owner@example.com").await;
    // Accounts made in this order...
    s.key_for_user("older@example.com").await;
    s.key_for_user("newer@example.com").await;
    let project = s.create_project(&owner, "members").await;
    let members = format!("/v1/projects/{project}/members");
    // ...added in the other.
    for email in ["newer@example.com", "older@example.com"] {
        s.expect(Method::POST, &members, &owner, Some(json!({"email": email, "role": "viewer"})), 200).await;
    }
    let emails = |page: &Value| -> Vec<String> {
        page["members"].as_array().unwrap().iter().map(|m| m["email"].as_str().unwrap().to_string()).collect()
    };
    let all = s.expect(Method::GET, &members, &owner, None, 200).await;
    assert_eq!(emails(&all), ["older@example.com", "newer@example.com", "owner@example.com"]);
    // And page by page, each once.
    let mut seen = Vec::new();
    let mut path = format!("{members}?limit=1");
    loop {
        let page = s.expect(Method::GET, &path, &owner, None, 200).await;
        seen.extend(emails(&page));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("{members}?limit=1&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, emails(&all));
}

/// `GET /projects/{id}/members` over more members than a page, some added
/// at the same moment: paged one or two at a time it is its one page of
/// 200, in its documented order (added last first, then by user id), and a
/// cursor issued before a member was added goes on as it would have.
#[tokio::test]
async fn members_paged_are_their_whole_page() {
    let s = TestServer::start().await;
    let owner = s.key_for_user("owner@example.com").await;
    let project = s.create_project(&owner, "members paged").await;
    let members = format!("/v1/projects/{project}/members");
    for i in 0..6 {
        let email = format!("member{i}@example.com");
        s.key_for_user(&email).await;
        s.expect(Method::POST, &members, &owner, Some(json!({"email": email, "role": "viewer"})), 200).await;
    }
    // Three of them added at one moment: the user id orders them.
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let tied = db
        .execute(
            "UPDATE project_members SET added_at = '2020-01-01T00:00:00.000000Z'
             WHERE project_id = ?1 AND user_id IN (
                 SELECT id FROM users WHERE email IN ('member1@example.com', 'member2@example.com', 'member4@example.com'))",
            [&project],
        )
        .unwrap();
    assert_eq!(tied, 3);
    drop(db);
    let whole = s.expect(Method::GET, &format!("{members}?limit=200"), &owner, None, 200).await;
    assert!(whole["next_cursor"].is_null(), "{whole:#}");
    let whole = whole["members"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 7);
    let order: Vec<(String, String)> = whole
        .iter()
        .map(|m| (m["added_at"].as_str().unwrap().to_string(), m["user_id"].as_str().unwrap().to_string()))
        .collect();
    let mut newest_first = order.clone();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(order, newest_first, "added last first, then by user id");
    // The tied ones, added "before" the owner, last.
    assert_eq!(whole[3]["email"], "owner@example.com");
    assert!(whole[4..].iter().all(|m| m["added_at"] == "2020-01-01T00:00:00Z"), "{whole:#?}");
    for limit in [1, 2] {
        let paged = common::items_of_pages(&s, &owner, &format!("{members}?limit={limit}"), "members").await;
        assert_eq!(paged, whole, "{limit} at a time");
    }
    // A cursor in the middle of the tied members, issued before a member is
    // added: the rest of the list from there, without the new member.
    let first = s.expect(Method::GET, &format!("{members}?limit=5"), &owner, None, 200).await;
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    s.key_for_user("later@example.com").await;
    s.expect(Method::POST, &members, &owner, Some(json!({"email": "later@example.com", "role": "viewer"})), 200).await;
    let rest = s.expect(Method::GET, &format!("{members}?limit=200&cursor={cursor}"), &owner, None, 200).await;
    assert_eq!(rest["members"].as_array().unwrap()[..], whole[5..]);
}

/// Every list with a `?project_id=` filter, given a project the caller is
/// not in: the answer is one the spec documents for that operation (read
/// from the spec, so a list added later is covered), and never the other
/// project's items.
#[tokio::test]
async fn a_filter_on_someone_elses_project_is_answered_as_documented() {
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/spec/openapi.json")).unwrap(),
    )
    .unwrap();
    let s = TestServer::start().await;
    let mine = s.team("mine").await;
    let theirs = s.team("theirs").await;
    s.expect(
        Method::POST,
        "/v1/personas",
        &theirs.owner,
        Some(json!({"project_id": theirs.project_id, "name": "p"})),
        200,
    )
    .await;
    let mut checked = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        let Some(op) = item.get("get") else { continue };
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        if !params.iter().any(|p| p["name"] == "project_id" && p["in"] == "query") {
            continue;
        }
        let url = format!("/v1{path}?project_id={}", theirs.project_id);
        let resp = s.send_json(Method::GET, &url, &mine.owner, None).await;
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        let documented = op["responses"].as_object().unwrap();
        assert!(documented.contains_key(&status.to_string()), "GET {url}: {status} is not documented: {body}");
        if status == 200 {
            assert!(!body.contains(&theirs.project_id), "GET {url}: another project's items: {body}");
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} lists filter by project");
}

/// A list paged one or two items at a time is its one page of 200: every
/// item once, in the same order. (A page after a cursor runs SQL of its own,
/// with the cursor as a range on the list's index; a first page does not.)
#[tokio::test]
async fn a_list_paged_a_few_at_a_time_is_its_whole_page() {
    let s = TestServer::start().await;
    let t = s.team("paging").await;
    let p = &t.project_id;
    let numbers: Vec<Value> = (0..4)
        .map(|i| json!({"number": format!("+1415555010{i}"), "label": format!("line {i}"), "direction": "both"}))
        .collect();
    let mut integration = String::new();
    for i in 0..4 {
        s.expect(Method::POST, "/v1/api-keys", &t.owner, Some(json!({"label": format!("k{i}")})), 201).await;
        let more = s.create_project(&t.owner, &format!("more {i}")).await;
        s.expect(Method::POST, "/v1/personas", &t.owner, Some(json!({"project_id": p, "name": format!("p{i}")})), 200)
            .await;
        let channel =
            json!({"project_id": p, "name": format!("c{i}"), "kind": "http", "target": "http://127.0.0.1:9/a"});
        s.expect(Method::POST, "/v1/channels", &t.owner, Some(channel), 200).await;
        // And one in another project: a page across the caller's projects
        // is merged from each one's.
        let elsewhere =
            json!({"project_id": more, "name": format!("c{i}"), "kind": "http", "target": "http://127.0.0.1:9/a"});
        s.expect(Method::POST, "/v1/channels", &t.owner, Some(elsewhere), 200).await;
        let twilio = json!({
            "project_id": p,
            "provider": "twilio",
            "name": format!("tel {i}"),
            "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
            "phone_numbers": numbers,
        });
        let created = s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio), 200).await;
        integration = created["id"].as_str().unwrap().to_string();
        let elsewhere = json!({
            "project_id": more,
            "provider": "twilio",
            "name": format!("tel {i}"),
            "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
        });
        s.expect(Method::POST, "/v1/integrations", &t.owner, Some(elsewhere), 200).await;
    }
    for (path, field) in [
        ("/v1/api-keys".to_string(), "keys"),
        ("/v1/projects".to_string(), "projects"),
        (format!("/v1/personas?project_id={p}"), "personas"),
        (format!("/v1/channels?project_id={p}"), "channels"),
        ("/v1/channels".to_string(), "channels"),
        (format!("/v1/integrations?project_id={p}"), "integrations"),
        ("/v1/integrations".to_string(), "integrations"),
        (format!("/v1/integrations/{integration}/phone-numbers"), "phone_numbers"),
    ] {
        // Phone numbers are named by their number; the rest by their id.
        let item_key = if field == "phone_numbers" { "number" } else { "id" };
        let sep = if path.contains('?') { '&' } else { '?' };
        let paged = async |limit: usize| {
            keys_of_pages(&s, &t.owner, &format!("{path}{sep}limit={limit}"), field, item_key).await
        };
        let whole = paged(200).await;
        assert!(whole.len() >= 4, "{path}: {whole:?}");
        if item_key == "id" {
            let mut newest_first = whole.clone();
            newest_first.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(whole, newest_first, "{path}: newest first");
        }
        for limit in [1, 2] {
            assert_eq!(paged(limit).await, whole, "{path}, {limit} at a time");
        }
    }
}

/// A test of the team's project with `n` results of 3 MiB each, stored as
/// the engine stores them (a document the list serves as it is): the test
/// and its results' ids, newest first.
async fn a_test_with_large_results(s: &TestServer, t: &common::Team, n: usize) -> (String, Vec<String>) {
    let p = &t.project_id;
    let create = |path: &'static str, body: Value| {
        let key = t.owner.clone();
        async move { s.expect(Method::POST, path, &key, Some(body), 200).await["id"].as_str().unwrap().to_string() }
    };
    let channel = create(
        "/v1/channels",
        json!({"project_id": p, "name": "agent", "kind": "http", "target": "http://127.0.0.1:9/http"}),
    )
    .await;
    let scenario = create(
        "/v1/scenarios",
        json!({"project_id": p, "name": "s", "mode": "scripted", "steps": [{"say": "hi", "expect": []}]}),
    )
    .await;
    let persona = create("/v1/personas", json!({"project_id": p, "name": "caller"})).await;
    let test = json!({"project_id": p, "name": "t", "channel_id": channel, "scenario_id": scenario,
                      "persona_ids": [persona]});
    let test = create("/v1/tests", test).await;
    let made: Vec<String> = (0..n).map(|_| sparring_impl::ids::new_id("trs")).collect();
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let (rows, project, test_id) = (made.clone(), p.clone(), test.clone());
    store
        .write(move |tx| {
            for (i, id) in rows.iter().enumerate() {
                let document = json!({"id": id, "padding": "x".repeat(3 << 20)}).to_string();
                tx.execute(
                    "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                               created_at, document)
                     VALUES (?1, ?2, ?3, 'brn_x', ?4, ?5, 'passed', '2026-01-01T00:00:00.000000Z', ?6)",
                    rusqlite::params![id, project, format!("run_{i}"), test_id, format!("call_{i}"), document],
                )?;
            }
            Ok::<_, sparring_impl::store::StoreError>(())
        })
        .await
        .unwrap();
    (test, made.into_iter().rev().collect())
}

/// A page of a test's results ends before its `limit`, with a cursor, once
/// the results in it pass 8 MiB (each may be a call's whole record), and
/// the next page goes on from there: nothing skipped, nothing twice.
#[tokio::test]
async fn a_page_of_large_results_ends_early_and_goes_on() {
    let s = TestServer::start().await;
    let t = s.team("large results").await;
    let (test, newest_first) = a_test_with_large_results(&s, &t, 4).await;
    let first = s.expect(Method::GET, &format!("/v1/tests/{test}/results?limit=10"), &t.viewer, None, 200).await;
    assert_eq!(ids(&first, "test_results"), newest_first[..3], "three pass 8 MiB");
    let cursor = first["next_cursor"].as_str().expect("a cursor to the rest");
    let rest = s
        .expect(Method::GET, &format!("/v1/tests/{test}/results?limit=10&cursor={cursor}"), &t.viewer, None, 200)
        .await;
    assert_eq!(ids(&rest, "test_results"), newest_first[3..]);
    assert!(rest["next_cursor"].is_null(), "{}", rest["next_cursor"]);
}

/// A page cut early by its size names a next page only when there is one:
/// the last results, passing 8 MiB with the last of them, are the last
/// page (`next_cursor` null), not a page with a cursor to an empty one.
#[tokio::test]
async fn a_last_page_cut_by_its_size_has_no_cursor() {
    let s = TestServer::start().await;
    let t = s.team("large last page").await;
    // Three results of 3 MiB each: the third passes 8 MiB, and is the last.
    let (test, newest_first) = a_test_with_large_results(&s, &t, 3).await;
    let page = s.expect(Method::GET, &format!("/v1/tests/{test}/results?limit=10"), &t.viewer, None, 200).await;
    assert_eq!(ids(&page, "test_results"), newest_first);
    assert!(page["next_cursor"].is_null(), "the last page: {}", page["next_cursor"]);
    // Cut before its end, a page still names the next.
    let page = s.expect(Method::GET, &format!("/v1/tests/{test}/results?limit=2"), &t.viewer, None, 200).await;
    assert_eq!(ids(&page, "test_results"), newest_first[..2]);
    assert!(page["next_cursor"].is_string(), "{page:#}");
}
