//! The activity log: one record per successful mutation, none for a failed
//! one, the actor and credential right, filters and visibility.

mod common;

use common::TestServer;
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
