//! The activity log: one record per successful mutation, none for a failed
//! one, the actor and credential right, filters and visibility.

mod common;

use common::{keys_of_pages, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

async fn history(s: &TestServer, key: &str, resource_type: &str, id: &str, order: &str) -> Vec<Value> {
    let body = s
        .expect(Method::GET, &format!("/v1/activity/resource/{resource_type}/{id}?order={order}"), key, None, 200)
        .await;
    body["activity"].as_array().unwrap().clone()
}

async fn key_id(s: &TestServer, key: &str) -> String {
    let keys = s.expect(Method::GET, "/v1/api-keys", key, None, 200).await;
    keys["keys"].as_array().unwrap().iter().find(|k| key.starts_with(k["prefix"].as_str().unwrap())).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn each_mutation_writes_one_record_and_a_failure_none() {
    let s = TestServer::start().await;
    let key = s.key_for_user("actor@example.com").await;
    let acting_key = key_id(&s, &key).await;

    let project = s.create_project(&key, "history").await;
    let path = format!("/v1/projects/{project}");
    s.expect(Method::PUT, &path, &key, Some(json!({"name": "history, renamed"})), 200).await;
    // Failures: bad input, and a change by someone without the role.
    s.expect(Method::PUT, &path, &key, Some(json!({"name": " "})), 400).await;
    let outsider = s.key_for_user("outsider@example.com").await;
    s.expect(Method::PUT, &path, &outsider, Some(json!({"name": "taken over"})), 404).await;

    let records = history(&s, &key, "project", &project, "asc").await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["project.create", "project.update"]);
    for r in &records {
        assert_eq!(r["actor"]["credential"], "api_key");
        assert_eq!(r["actor"]["api_key_id"], acting_key.as_str());
        assert_eq!(r["project_id"], project.as_str());
        assert_eq!(r["resource_type"], "project");
    }
    assert_eq!(records[1]["changes"]["name"], "history, renamed");
    // Newest first by default, and the same records.
    let newest_first = history(&s, &key, "project", &project, "desc").await;
    assert_eq!(
        newest_first.iter().rev().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        records.iter().map(|r| r["id"].clone()).collect::<Vec<_>>()
    );

    // API keys are mutations too; the record never holds the secret.
    let created = s.expect(Method::POST, "/v1/api-keys", &key, Some(json!({"label": "logged"})), 201).await;
    let id = created["id"].as_str().unwrap();
    s.expect(Method::POST, &format!("/v1/api-keys/{id}/rotate"), &key, Some(json!({})), 200).await;
    s.expect(Method::DELETE, &format!("/v1/api-keys/{id}"), &key, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/api-keys/{id}"), &key, None, 200).await; // already revoked: no change
    let records = history(&s, &key, "api_key", id, "asc").await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["api_key.create", "api_key.rotate", "api_key.revoke"]);
    let all = serde_json::to_string(&records).unwrap();
    assert!(!all.contains(&created["apiKey"].as_str().unwrap()[12..]));
}

#[tokio::test]
async fn filters_and_visibility() {
    let s = TestServer::start().await;
    let t = s.team("filters").await;
    let other = s.team("elsewhere").await;
    let before = chrono::Utc::now();
    s.expect(Method::PUT, &format!("/v1/projects/{}", t.project_id), &t.editor, Some(json!({"name": "edited"})), 200)
        .await;

    // Members see their project's records, by whoever made them.
    let q = format!("/v1/activity?project_id={}&action=project.update", t.project_id);
    let seen = s.expect(Method::GET, &q, &t.viewer, None, 200).await;
    assert_eq!(seen["activity"].as_array().unwrap().len(), 1);
    // An outsider sees nothing of it, and the other project's members neither.
    for key in [&t.outsider, &other.owner] {
        let none = s.expect(Method::GET, &q, key, None, 200).await;
        assert!(none["activity"].as_array().unwrap().is_empty());
        let none =
            s.expect(Method::GET, &format!("/v1/activity/resource/project/{}", t.project_id), key, None, 200).await;
        assert!(none["activity"].as_array().unwrap().is_empty());
    }
    // Time and type filters.
    let since = before.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let recent = s
        .expect(
            Method::GET,
            &format!("/v1/activity?project_id={}&since={}", t.project_id, since.replace('+', "%2B")),
            &t.owner,
            None,
            200,
        )
        .await;
    let actions: Vec<&str> =
        recent["activity"].as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["project.update"]);
    let members = s
        .expect(
            Method::GET,
            &format!("/v1/activity?project_id={}&resource_type=project_member", t.project_id),
            &t.owner,
            None,
            200,
        )
        .await;
    assert_eq!(members["activity"].as_array().unwrap().len(), 3, "three members were added");
    let until_before = s
        .expect(
            Method::GET,
            &format!("/v1/activity?project_id={}&until={}", t.project_id, since.replace('+', "%2B")),
            &t.owner,
            None,
            200,
        )
        .await;
    assert!(until_before["activity"].as_array().unwrap().iter().all(|r| r["action"] != "project.update"));
    // A record by id: its actor and project members only.
    let id = seen["activity"][0]["id"].as_str().unwrap();
    s.expect(Method::GET, &format!("/v1/activity/{id}"), &t.reviewer, None, 200).await;
    s.expect(Method::GET, &format!("/v1/activity/{id}"), &t.outsider, None, 404).await;
}

/// Every page of `GET /activity` at `query`, following the cursors: the
/// records' ids in the order served.
async fn paged(s: &TestServer, key: &str, query: &str) -> Vec<String> {
    keys_of_pages(s, key, &format!("/v1/activity?{query}"), "activity", "id").await
}

/// A page of the log is merged from the caller's own records and those of
/// each project they are in. Paged a few at a time, with and without
/// filters, it is what the database holds for them: newest first, each
/// record once (their own records in their projects come from both), their
/// own records where they are no longer a member, and nothing else.
#[tokio::test]
async fn pages_merge_own_records_and_each_projects() {
    let s = TestServer::start().await;
    let me = s.key_for_user("me@example.com").await;
    let other = s.key_for_user("other@example.com").await;
    let mine = [s.create_project(&me, "first").await, s.create_project(&me, "second").await];
    let theirs = s.create_project(&other, "theirs").await;
    let add = |project: &str, by: &str, email: &str| {
        let (project, by, body) = (project.to_string(), by.to_string(), json!({"email": email, "role": "editor"}));
        let s = &s;
        async move { s.expect(Method::POST, &format!("/v1/projects/{project}/members"), &by, Some(body), 200).await }
    };
    for project in &mine {
        add(project, &me, "other@example.com").await;
    }
    // I edit their project while a member, then am removed from it.
    let me_as_member = add(&theirs, &other, "me@example.com").await;
    let rename = |by: &str, n: usize| Some(json!({"name": format!("renamed by {by} {n}")}));
    s.expect(Method::PUT, &format!("/v1/projects/{theirs}"), &me, rename("me", 0), 200).await;
    let my_id = me_as_member["user_id"].as_str().unwrap();
    s.expect(Method::DELETE, &format!("/v1/projects/{theirs}/members/{my_id}"), &other, None, 200).await;
    // Interleaved: the other user in my projects and theirs, I in mine and
    // with no project (a key).
    for n in 1..=7 {
        s.expect(Method::PUT, &format!("/v1/projects/{}", mine[n % 2]), &other, rename("other", n), 200).await;
        s.expect(Method::PUT, &format!("/v1/projects/{theirs}"), &other, rename("other", n), 200).await;
        if n % 3 == 0 {
            s.expect(Method::POST, "/v1/api-keys", &me, Some(json!({"label": format!("key {n}")})), 201).await;
        } else {
            s.expect(Method::PUT, &format!("/v1/projects/{}", mine[n % 2]), &me, rename("me", n), 200).await;
        }
    }

    // What the database holds for me, asked directly.
    let db = rusqlite::Connection::open(s.data_dir.path().join("sparring.db")).unwrap();
    let expected = |filter: &str| -> Vec<String> {
        let sql = format!(
            "SELECT id FROM activity WHERE (actor_user_id = ?1 OR subject_user_id = ?1
               OR project_id IN (SELECT project_id FROM project_members WHERE user_id = ?1)) {filter}
             ORDER BY id DESC"
        );
        let mut statement = db.prepare(&sql).unwrap();
        statement.query_map([my_id], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
    };
    let all = expected("");
    let (first, second) = (&mine[0], &mine[1]);
    let theirs_renamed = expected(&format!("AND project_id = '{theirs}'"));
    assert_eq!(theirs_renamed.len(), 1, "my own edit of their project, and none of theirs");
    // Mine: 2 projects, 2 members added, 1 edit of theirs, 5 edits of mine,
    // 2 keys; theirs in my projects: 7 edits.
    assert!(all.len() >= 19, "{}", all.len());
    for limit in [1, 2, 3, 7, 200] {
        assert_eq!(paged(&s, &me, &format!("limit={limit}")).await, all, "limit {limit}");
    }
    for (query, filter) in [
        (format!("limit=2&project_id={first}"), format!("AND project_id = '{first}'")),
        (
            format!("limit=3&project_id={second}&action=project.update"),
            format!("AND project_id = '{second}' AND action = 'project.update'"),
        ),
        (format!("limit=2&project_id={theirs}"), format!("AND project_id = '{theirs}'")),
        ("limit=2&resource_type=api_key".to_string(), "AND resource_type = 'api_key'".to_string()),
    ] {
        let want = expected(&filter);
        assert!(!want.is_empty(), "{query}");
        assert_eq!(paged(&s, &me, &query).await, want, "{query}");
    }
}

/// One resource's history, paged a few records at a time in either order,
/// is the whole history in that order, each record once.
#[tokio::test]
async fn a_resource_history_pages_in_both_orders() {
    let s = TestServer::start().await;
    let key = s.key_for_user("renamer@example.com").await;
    let project = s.create_project(&key, "renamed often").await;
    for i in 0..8 {
        let body = json!({ "name": format!("renamed {i}") });
        s.expect(Method::PUT, &format!("/v1/projects/{project}"), &key, Some(body), 200).await;
    }
    let asc: Vec<String> = history(&s, &key, "project", &project, "asc")
        .await
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(asc.len(), 9);
    let desc: Vec<String> = asc.iter().rev().cloned().collect();
    for limit in [1, 2, 4] {
        for (order, want) in [("asc", &asc), ("desc", &desc)] {
            let path = format!("/v1/activity/resource/project/{project}?order={order}&limit={limit}");
            assert_eq!(&keys_of_pages(&s, &key, &path, "activity", "id").await, want, "{order}, limit {limit}");
        }
    }
}

/// A record's `changes` are up to a request body (1 MiB) in size (a
/// scenario's steps, a test's evaluators): a page of 200 records was up to
/// 200 MB to read and write for one request. A page of the log, or of one
/// resource's history in either order, ends before its `limit`, with a
/// cursor, once its records pass 8 MiB, and page by page every record is
/// listed once.
#[tokio::test]
async fn a_page_of_records_ends_once_its_records_pass_8_mib() {
    const PAGE_BYTES: usize = 8 << 20;
    let s = TestServer::start().await;
    let key = s.key_for_user("big-records@example.com").await;
    let project_id = s.create_project(&key, "big records").await;
    // ~960 KB of steps, different each time so that each change records them.
    let scenario = |i: usize| {
        let steps: Vec<Value> = (0..48).map(|_| json!({"say": format!("{i}").repeat(20_000), "expect": []})).collect();
        json!({"project_id": project_id, "name": "big", "mode": "scripted", "steps": steps})
    };
    let created = s.expect(Method::POST, "/v1/scenarios", &key, Some(scenario(0)), 200).await;
    let id = created["id"].as_str().unwrap().to_string();
    for i in 1..12 {
        let mut body = scenario(i % 2);
        body.as_object_mut().unwrap().remove("project_id");
        s.expect(Method::PUT, &format!("/v1/scenarios/{id}"), &key, Some(body), 200).await;
    }
    let all = paged(&s, &key, &format!("project_id={project_id}&limit=1")).await;
    assert_eq!(all.len(), 13, "a project.create, a scenario.create and 11 scenario.update");
    // Outside the project: the record of the key made for them (the admin's).
    let key_made = paged(&s, &key, "resource_type=api_key").await;
    assert_eq!(key_made.len(), 1);
    let everything = [all.clone(), key_made].concat();
    for (path, expected) in [
        (format!("/v1/activity?project_id={project_id}&limit=200"), all.clone()),
        ("/v1/activity?limit=200".to_string(), everything),
        (format!("/v1/activity/resource/scenario/{id}?limit=200"), all[..12].to_vec()),
        (format!("/v1/activity/resource/scenario/{id}?order=asc&limit=200"), all[..12].iter().rev().cloned().collect()),
    ] {
        let body = s.get(&path, &key).await.text().await.unwrap();
        let page: Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<String> =
            page["activity"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect();
        assert!(body.len() < PAGE_BYTES + (1 << 20), "{path}: a page of {} bytes, {} records", body.len(), ids.len());
        assert!(!ids.is_empty() && ids.len() < expected.len(), "{path}: {} records", ids.len());
        assert_eq!(ids, expected[..ids.len()], "{path}");
        assert!(page["next_cursor"].is_string(), "{path}: a page cut short has a next one");
        assert_eq!(keys_of_pages(&s, &key, &path, "activity", "id").await, expected, "{path}: page by page");
    }
}
