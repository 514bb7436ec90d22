//! Deleting a project removes everything in it, in one transaction, and
//! nothing of any other project.

mod common;

use common::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

/// One of each resource in `project`; returns `(path, id)` of each.
async fn populate(s: &TestServer, key: &str, project: &str) -> Vec<(String, String)> {
    let mut made = Vec::new();
    let mut post = async |path: &str, body: Value| -> String {
        let created = s.expect(Method::POST, path, key, Some(body), 200).await;
        let id = created["id"].as_str().unwrap().to_string();
        made.push((path.to_string(), id.clone()));
        id
    };
    let judge = post(
        "/v1/integrations",
        json!({"project_id": project, "provider": "openai_compatible", "name": "judge",
               "config": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "credentials": {"api_key": "sk-delete-me"}}),
    )
    .await;
    post(
        "/v1/integrations",
        json!({"project_id": project, "provider": "twilio", "name": "phones", "config": {"account_sid": "AC1"},
               "phone_numbers": [{"number": "+14155550100", "label": "main", "direction": "both"}]}),
    )
    .await;
    let channel = post(
        "/v1/channels",
        json!({"project_id": project, "name": "agent", "kind": "http", "target": "http://127.0.0.1:9/agent",
               "headers": {"authorization": "Bearer agent-secret"}}),
    )
    .await;
    let persona = post("/v1/personas", json!({"project_id": project, "name": "caller"})).await;
    let scenario = post(
        "/v1/scenarios",
        json!({"project_id": project, "name": "book", "mode": "scripted", "default_persona_id": persona,
               "steps": [{"say": "I'd like an appointment", "expect": []}],
               "success_criteria": [{"type": "llm_judge", "name": "polite", "integration_id": judge, "prompt": "Polite?"}]}),
    )
    .await;
    let test = post(
        "/v1/tests",
        json!({"project_id": project, "name": "booking", "channel_id": channel, "scenario_id": scenario,
               "persona_ids": [persona],
               "evaluators": [{"type": "llm_judge", "name": "judged", "integration_id": judge, "prompt": "Booked?"}]}),
    )
    .await;
    post("/v1/batches", json!({"project_id": project, "name": "nightly", "test_ids": [test]})).await;
    made
}

async fn rows_of(s: &TestServer, project: &str) -> i64 {
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let project = project.to_string();
    store
        .read::<_, sparring_impl::store::StoreError, _>(move |tx| {
            let mut total = 0i64;
            for table in ["projects", "project_members", "integrations", "channels", "personas", "scenarios", "tests", "batches"] {
                let column = if table == "projects" { "id" } else { "project_id" };
                let n: i64 = tx.query_row(&format!("SELECT count(*) FROM {table} WHERE {column} = ?1"), [&project], |r| r.get(0))?;
                total += n;
            }
            // The rows that hang off those, by their parents.
            for (table, parent, parent_table) in [
                ("integration_phone_numbers", "integration_id", "integrations"),
                ("test_personas", "test_id", "tests"),
                ("test_judges", "test_id", "tests"),
                ("scenario_judges", "scenario_id", "scenarios"),
                ("batch_tests", "batch_id", "batches"),
            ] {
                let n: i64 = tx.query_row(
                    &format!("SELECT count(*) FROM {table} WHERE {parent} IN (SELECT id FROM {parent_table} WHERE project_id = ?1)"),
                    [&project],
                    |r| r.get(0),
                )?;
                total += n;
            }
            Ok(total)
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn deleting_a_project_removes_everything_in_it_and_nothing_else() {
    let s = TestServer::start().await;
    let doomed = s.team("doomed").await;
    let kept = s.team("kept").await;
    let doomed_items = populate(&s, &doomed.editor, &doomed.project_id).await;
    let kept_items = populate(&s, &kept.editor, &kept.project_id).await;
    let kept_rows = rows_of(&s, &kept.project_id).await;
    assert!(rows_of(&s, &doomed.project_id).await > 10);

    // Editors cannot delete a project; its owner can.
    s.expect(Method::DELETE, &format!("/v1/projects/{}", doomed.project_id), &doomed.editor, None, 403).await;
    s.expect(Method::DELETE, &format!("/v1/projects/{}", doomed.project_id), &doomed.owner, None, 200).await;

    assert_eq!(rows_of(&s, &doomed.project_id).await, 0);
    for (path, id) in &doomed_items {
        s.expect(Method::GET, &format!("{path}/{id}"), &doomed.owner, None, 404).await;
    }
    // The other project is as it was.
    assert_eq!(rows_of(&s, &kept.project_id).await, kept_rows);
    for (path, id) in &kept_items {
        s.expect(Method::GET, &format!("{path}/{id}"), &kept.viewer, None, 200).await;
    }
    // The deletion is on record for whoever made it.
    let history = s
        .expect(Method::GET, &format!("/v1/activity/resource/project/{}", doomed.project_id), &doomed.owner, None, 200)
        .await;
    assert_eq!(history["activity"][0]["action"], "project.delete");
    // And for everyone who could read the project's records when it was
    // deleted: its history, and what was in it, by resource and in the feed.
    let (persona_path, persona) = doomed_items.iter().find(|(path, _)| path.ends_with("personas")).unwrap();
    assert_eq!(persona_path, "/v1/personas");
    let resource = format!("/v1/activity/resource/persona/{persona}");
    let by_owner = s.expect(Method::GET, &resource, &doomed.owner, None, 200).await;
    assert!(!by_owner["activity"].as_array().unwrap().is_empty(), "{by_owner:#}");
    for key in [&doomed.viewer, &doomed.reviewer] {
        assert_eq!(s.expect(Method::GET, &resource, key, None, 200).await, by_owner);
        let again = s
            .expect(Method::GET, &format!("/v1/activity/resource/project/{}", doomed.project_id), key, None, 200)
            .await;
        assert_eq!(again, history);
        let feed =
            s.expect(Method::GET, &format!("/v1/activity?project_id={}", doomed.project_id), key, None, 200).await;
        assert_eq!(feed["activity"][0]["action"], "project.delete", "{feed:#}");
    }
    // Not for anyone else.
    let nothing = s.expect(Method::GET, &resource, &kept.owner, None, 200).await;
    assert_eq!(nothing["activity"], serde_json::json!([]));
    let feed =
        s.expect(Method::GET, &format!("/v1/activity?project_id={}", doomed.project_id), &kept.owner, None, 200).await;
    assert_eq!(feed["activity"], serde_json::json!([]), "{feed:#}");
}
