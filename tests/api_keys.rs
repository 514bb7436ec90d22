//! API keys and API-key authentication, against the real server.

mod common;

use common::{contains, error_body, TestServer};
use serde_json::json;

#[tokio::test]
async fn label_matrix() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    let ok_100 = "é".repeat(100);
    let too_long = "é".repeat(101);
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("missing", json!({}).to_string(), Some("invalid_label")),
        ("null", json!({"label": null}).to_string(), Some("invalid_label")),
        ("number", json!({"label": 7}).to_string(), Some("invalid_label")),
        ("empty", json!({"label": ""}).to_string(), Some("invalid_label")),
        ("blank", json!({"label": "   \t "}).to_string(), Some("invalid_label")),
        ("101 characters", json!({"label": too_long}).to_string(), Some("invalid_label")),
        ("control character", json!({"label": "ci\u{0007}bot"}).to_string(), Some("invalid_label")),
        ("newline", json!({"label": "ci\nbot"}).to_string(), Some("invalid_label")),
        ("malformed JSON", "{\"label\": \"ci\"".to_string(), Some("invalid_body")),
        ("not an object", "[\"ci\"]".to_string(), Some("invalid_body")),
        ("unknown field", json!({"label": "ci", "scopes": []}).to_string(), Some("invalid_body")),
        ("100 multi-byte characters", json!({"label": ok_100}).to_string(), None),
    ];
    for (name, body, expected) in cases {
        let resp = s.post_json("/v1/api-keys", key, &body).await;
        match expected {
            Some(code) => {
                let (status, body) = error_body(resp).await;
                assert_eq!(status, 400, "{name}: {body}");
                assert_eq!(body["error_code"], code, "{name}: {body}");
                if code == "invalid_label" {
                    assert!(
                        body["message"].as_str().unwrap().contains("label"),
                        "{name}: message names the field: {body}"
                    );
                }
            }
            None => {
                assert_eq!(resp.status().as_u16(), 201, "{name}");
                let body: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(body["label"].as_str().unwrap().chars().count(), 100);
            }
        }
    }
}

#[tokio::test]
async fn create_shows_the_secret_once_and_listing_never() {
    let s = TestServer::start().await;
    let client = s.client(&s.admin_key);
    let created =
        client.create_api_key().body_map(|b| b.label("ci pipeline".parse::<String>().unwrap())).send().await.unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let secret = created.into_inner();
    assert!(secret.api_key.starts_with("spk_"));
    assert!(secret.api_key.starts_with(&secret.prefix));
    assert!(secret.id.starts_with("key_"));

    // The new key works, and the listing shows it without its secret,
    // newest first.
    let list = s.client(&secret.api_key).list_api_keys().send().await.unwrap().into_inner();
    assert_eq!(list.keys.len(), 2);
    assert_eq!(list.keys[0].id, secret.id);
    assert_eq!(list.keys[0].label, "ci pipeline");
    assert!(!list.keys[0].revoked && list.keys[0].revoked_at.is_none());
    let raw = s.get("/v1/api-keys", &secret.api_key).await.text().await.unwrap();
    assert!(!raw.contains(&secret.api_key), "listing leaks the secret");
    assert!(!raw.contains(&s.admin_key), "listing leaks the secret");
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_limit() {
    // (The exact 25/25 split from zero keys needs a credential that is not
    // a key: see `tests/oidc.rs`.) Here: one active key, so 24 more fit.
    let s = TestServer::start().await;
    let first = s.key_for_user("zero@example.com").await;
    let second = s.key_for_user("zero@example.com").await;
    let list = s.client(&first).list_api_keys().send().await.unwrap().into_inner();
    let first_id = list.keys.iter().find(|k| first.starts_with(&k.prefix)).unwrap().id.clone();
    assert_eq!(s.client(&second).revoke_api_key().id(&first_id).send().await.unwrap().status().as_u16(), 200);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let client = s.client(&second);
        tasks.push(tokio::spawn(async move {
            client
                .create_api_key()
                .body_map(move |b| b.label(format!("k{i}")))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let mut ok = 0;
    let mut conflict = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(201) => ok += 1,
            Err(sparring_client::Error::ErrorResponse(e)) if e.status().as_u16() == 409 => conflict += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((ok, conflict), (24, 26));
}

#[tokio::test]
async fn rotate_and_revoke() {
    let s = TestServer::start().await;
    let admin = s.client(&s.admin_key);
    let secret =
        admin.create_api_key().body_map(|b| b.label("rotating".to_string())).send().await.unwrap().into_inner();
    let old = secret.api_key.clone();

    // `{}` body accepted; the new secret works, the old one fails at once.
    let resp = s.post_json(&format!("/v1/api-keys/{}/rotate", secret.id), &s.admin_key, "{}").await;
    assert_eq!(resp.status().as_u16(), 200);
    let rotated: serde_json::Value = resp.json().await.unwrap();
    let new = rotated["apiKey"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(rotated["id"], secret.id.as_str());
    assert_eq!(s.get("/v1/api-keys", &new).await.status().as_u16(), 200);
    let (status, _) = error_body(s.get("/v1/api-keys", &old).await).await;
    assert_eq!(status, 401);

    // No body at all is accepted too.
    let resp = s
        .http
        .post(s.url(&format!("/v1/api-keys/{}/rotate", secret.id)))
        .header("x-api-key", &s.admin_key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let newest: serde_json::Value = resp.json().await.unwrap();
    let newest = newest["apiKey"].as_str().unwrap().to_string();
    assert_eq!(s.get("/v1/api-keys", &new).await.status().as_u16(), 401);

    // A body that is not an object is refused.
    for bad in ["[]", "\"x\"", "{\"a\": 1}", "{"] {
        let (status, body) =
            error_body(s.post_json(&format!("/v1/api-keys/{}/rotate", secret.id), &s.admin_key, bad).await).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }

    // Unknown id: 404.
    let (status, body) = error_body(s.post_json("/v1/api-keys/key_nope/rotate", &s.admin_key, "{}").await).await;
    assert_eq!((status, body["error_code"].as_str().unwrap()), (404, "not_found"));

    // Revoke twice: both 200, the second says so; the key fails at once.
    let first = admin.revoke_api_key().id(&secret.id).send().await.unwrap().into_inner();
    assert!(!first.already_revoked);
    assert_eq!(s.get("/v1/api-keys", &newest).await.status().as_u16(), 401);
    let second = admin.revoke_api_key().id(&secret.id).send().await.unwrap().into_inner();
    assert!(second.already_revoked);
    assert!(second.message.contains("already revoked"));
    assert_eq!(second.revoked_at, first.revoked_at);

    // Rotating a revoked key: 409.
    let (status, body) =
        error_body(s.post_json(&format!("/v1/api-keys/{}/rotate", secret.id), &s.admin_key, "{}").await).await;
    assert_eq!((status, body["error_code"].as_str().unwrap()), (409, "key_revoked"));

    // Unknown id on revoke: 404.
    let resp = s.http.delete(s.url("/v1/api-keys/key_nope")).header("x-api-key", &s.admin_key).send().await.unwrap();
    assert_eq!(error_body(resp).await.0, 404);

    // The listing shows it revoked.
    let list = admin.list_api_keys().send().await.unwrap().into_inner();
    let k = list.keys.iter().find(|k| k.id == secret.id).unwrap();
    assert!(k.revoked && k.revoked_at.is_some());
}

/// A credential header sent twice is refused whatever its values, valid
/// ones included: the request is not decided by which copy a hop keeps.
#[tokio::test]
async fn an_api_key_header_sent_twice_is_refused() {
    let s = TestServer::start().await;
    let unknown = format!("spk_{}", "A".repeat(43));
    let valid = s.admin_key.as_str();
    assert_eq!(s.get("/v1/api-keys", valid).await.status().as_u16(), 200);
    for (first, second) in [(valid, valid), (valid, unknown.as_str()), (unknown.as_str(), valid)] {
        let resp = s
            .http
            .get(s.url("/v1/api-keys"))
            .header("x-api-key", first)
            .header("x-api-key", second)
            .send()
            .await
            .unwrap();
        let (status, body) = error_body(resp).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error_code"], "unauthenticated", "{body}");
        assert!(body["message"].as_str().unwrap().contains("one `x-api-key` header"), "{body}");
    }
    // The key decides, but an `Authorization` sent twice beside it is
    // refused all the same.
    let resp = s
        .http
        .get(s.url("/v1/api-keys"))
        .header("x-api-key", valid)
        .header("authorization", "Bearer a")
        .header("authorization", "Bearer b")
        .send()
        .await
        .unwrap();
    let (status, body) = error_body(resp).await;
    assert_eq!((status, body["error_code"].as_str()), (401, Some("unauthenticated")), "{body}");
}

#[tokio::test]
async fn users_cannot_touch_each_others_keys() {
    let s = TestServer::start().await;
    let alice = s.key_for_user("alice@example.com").await;
    let bob = s.key_for_user("bob@example.com").await;
    let alice_keys = s.client(&alice).list_api_keys().send().await.unwrap().into_inner();
    let alice_id = alice_keys.keys[0].id.clone();

    let bob_keys = s.client(&bob).list_api_keys().send().await.unwrap().into_inner();
    assert!(bob_keys.keys.iter().all(|k| k.id != alice_id), "bob sees alice's key");

    let resp =
        s.http.delete(s.url(&format!("/v1/api-keys/{alice_id}"))).header("x-api-key", &bob).send().await.unwrap();
    assert_eq!(error_body(resp).await.0, 404);
    let (status, _) = error_body(s.post_json(&format!("/v1/api-keys/{alice_id}/rotate"), &bob, "{}").await).await;
    assert_eq!(status, 404);
    // Alice's key still works.
    assert_eq!(s.get("/v1/api-keys", &alice).await.status().as_u16(), 200);
}

#[tokio::test]
async fn last_used_at_is_recorded_off_the_request_path() {
    let s = TestServer::start().await;
    let key = s.key_for_user("used@example.com").await;
    let list = s.client(&key).list_api_keys().send().await.unwrap().into_inner();
    // The listing request itself used the key: shown from memory at once.
    assert!(list.keys[0].last_used_at.is_some());
}

#[tokio::test]
async fn raw_keys_are_stored_nowhere_and_never_logged() {
    let mut s = TestServer::start().await;
    let mut secrets = vec![s.admin_key.clone()];
    for i in 0..3 {
        let resp = s.post_json("/v1/api-keys", &s.admin_key, &json!({"label": format!("k{i}")}).to_string()).await;
        let body: serde_json::Value = resp.json().await.unwrap();
        let secret = body["apiKey"].as_str().unwrap().to_string();
        // Use it, rotate it, fail with a wrong one.
        assert_eq!(s.get("/v1/api-keys", &secret).await.status().as_u16(), 200);
        let id = body["id"].as_str().unwrap();
        let rotated: serde_json::Value =
            s.post_json(&format!("/v1/api-keys/{id}/rotate"), &s.admin_key, "{}").await.json().await.unwrap();
        secrets.push(secret);
        secrets.push(rotated["apiKey"].as_str().unwrap().to_string());
    }
    let _ = s.get("/v1/api-keys", "spk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").await;
    s.stop().await;
    let stored = s.stored_bytes();
    let log = s.log.contents();
    assert!(log.contains("req_id"), "the log was captured");
    for secret in &secrets {
        assert!(!contains(&stored, secret), "a raw key is in the data dir");
        // Not even the secret part after the public prefix.
        assert!(!contains(&stored, &secret[12..]), "part of a raw key is in the data dir");
        assert!(!log.contains(&secret[12..]), "a raw key is in the log");
    }
}

/// The first page of a user's keys is kept in memory between listings; every
/// change to a key must show on the next listing, whoever made it.
#[tokio::test]
async fn a_listing_shows_every_change_at_once() {
    let s = TestServer::start().await;
    let key = s.key_for_user("lists@example.com").await;
    let client = s.client(&key);
    let listed =
        |client: sparring_client::Client| async move { client.list_api_keys().send().await.unwrap().into_inner().keys };
    assert_eq!(listed(client.clone()).await.len(), 1);

    // Made through the API.
    let made = client.create_api_key().body_map(|b| b.label("second".to_string())).send().await.unwrap().into_inner();
    let keys = listed(client.clone()).await;
    assert_eq!(keys.len(), 2);
    assert_eq!((keys[0].id.as_str(), keys[0].label.as_str()), (made.id.as_str(), "second"));

    // Made as `sparring admin create-key` makes it from its own process:
    // through the server's admin socket, so the kept page is emptied.
    let outside = s.key_for_user("lists@example.com").await;
    let keys = listed(client.clone()).await;
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(outside.starts_with(&keys[0].prefix), "{keys:?}");

    // Rotated: same id, new prefix.
    let rotated: serde_json::Value =
        s.post_json(&format!("/v1/api-keys/{}/rotate", made.id), &key, "{}").await.json().await.unwrap();
    let keys = listed(client.clone()).await;
    let shown = keys.iter().find(|k| k.id == made.id).unwrap();
    assert!(rotated["apiKey"].as_str().unwrap().starts_with(&shown.prefix), "{keys:?}");
    assert_ne!(shown.prefix, made.prefix);

    // Revoked.
    client.revoke_api_key().id(&made.id).send().await.unwrap();
    let keys = listed(client.clone()).await;
    let shown = keys.iter().find(|k| k.id == made.id).unwrap();
    assert!(shown.revoked && shown.revoked_at.is_some(), "{keys:?}");

    // A page of another size is not the kept one.
    let one = client.list_api_keys().limit(1).send().await.unwrap().into_inner();
    assert_eq!(one.keys.len(), 1);
    assert!(one.next_cursor.is_some());
    assert_eq!(listed(client.clone()).await.len(), 3);
}
