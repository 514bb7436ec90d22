//! What every list shares: its cursor (opaque: only one this list issued is
//! taken), its order (newest first) and its filters.

mod common;

use common::TestServer;
use reqwest::Method;
use serde_json::Value;

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
