//! Integrations and channels, against the real server: who may do what,
//! what is refused (and with which code), references, conflicts, pages,
//! activity, and that credential and header values never come back out.

mod common;

use common::engine::create;
use common::{contains, error_body, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

fn llm(project_id: &str, name: &str) -> Value {
    json!({
        "project_id": project_id,
        "provider": "openai_compatible",
        "name": name,
        "config": {"base_url": "https://llm.example.com/v1", "model": "gpt-4o-mini"},
    })
}

fn twilio(project_id: &str, name: &str) -> Value {
    json!({
        "project_id": project_id,
        "provider": "twilio",
        "name": name,
        "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
        "phone_numbers": [{"number": "+14155550100", "label": "main", "direction": "both"}],
    })
}

fn http_channel(project_id: &str, name: &str) -> Value {
    json!({"project_id": project_id, "name": name, "kind": "http", "target": "https://agent.example.com/turn"})
}

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

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

/// How many activity records a resource has.
async fn history(s: &TestServer, key: &str, resource_type: &str, id: &str) -> Vec<Value> {
    let body = s.expect(Method::GET, &format!("/v1/activity/resource/{resource_type}/{id}"), key, None, 200).await;
    body["activity"].as_array().unwrap().clone()
}

/// Sends and expects a 400 with `code` whose message names `field`.
async fn refused(s: &TestServer, method: Method, path: &str, key: &str, body: Value, code: &str, field: &str) {
    let (status, e) = error_body(s.send_json(method.clone(), path, key, Some(body.clone())).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, code), "{method} {path} {body}: {e}");
    assert!(e["message"].as_str().unwrap().contains(field), "message names `{field}`: {e}");
}

#[tokio::test]
async fn roles_decide_who_reads_and_changes_integrations() {
    let s = TestServer::start().await;
    let t = s.team("integration roles").await;
    // Create: editors and owners; reviewers and viewers 403; outsiders 404.
    let mut made = Vec::new();
    for (role, key) in t.all() {
        let expected = match role {
            "owner" | "editor" => 200,
            "outsider" => 404,
            _ => 403,
        };
        let body = s
            .expect(Method::POST, "/v1/integrations", key, Some(twilio(&t.project_id, &format!("by {role}"))), expected)
            .await;
        if expected == 200 {
            made.push(id(&body));
        }
    }
    assert_eq!(made.len(), 2);
    let one = &made[0];
    for (role, key) in t.all() {
        let read = if role == "outsider" { 404 } else { 200 };
        s.expect(Method::GET, &format!("/v1/integrations/{one}"), key, None, read).await;
        s.expect(Method::GET, &format!("/v1/integrations/{one}/phone-numbers"), key, None, read).await;
        s.expect(Method::GET, &format!("/v1/integrations?project_id={}", t.project_id), key, None, read).await;
        let write = match role {
            "owner" | "editor" => 200,
            "outsider" => 404,
            _ => 403,
        };
        s.expect(Method::PATCH, &format!("/v1/integrations/{one}"), key, Some(json!({"name": role})), write).await;
    }
    // Without a project filter, the outsider sees none of it.
    let listed = s.expect(Method::GET, "/v1/integrations", &t.outsider, None, 200).await;
    assert_eq!(listed["integrations"], json!([]));
    let listed = s.expect(Method::GET, "/v1/integrations", &t.viewer, None, 200).await;
    assert_eq!(listed["integrations"].as_array().unwrap().len(), 2);
    // Delete: the same as changing.
    for (key, status) in [(&t.viewer, 403), (&t.reviewer, 403), (&t.outsider, 404)] {
        s.expect(Method::DELETE, &format!("/v1/integrations/{one}"), key, None, status).await;
    }
    s.expect(Method::DELETE, &format!("/v1/integrations/{}", made[0]), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{}", made[1]), &t.owner, None, 200).await;
    s.expect(Method::GET, &format!("/v1/integrations/{one}"), &t.owner, None, 404).await;
    s.expect(Method::GET, &format!("/v1/integrations/{one}/phone-numbers"), &t.owner, None, 404).await;
}

#[tokio::test]
async fn roles_decide_who_reads_and_changes_channels() {
    let s = TestServer::start().await;
    let t = s.team("channel roles").await;
    let mut made = Vec::new();
    for (role, key) in t.all() {
        let expected = match role {
            "owner" | "editor" => 200,
            "outsider" => 404,
            _ => 403,
        };
        let body = s
            .expect(
                Method::POST,
                "/v1/channels",
                key,
                Some(http_channel(&t.project_id, &format!("by {role}"))),
                expected,
            )
            .await;
        if expected == 200 {
            made.push(id(&body));
        }
    }
    assert_eq!(made.len(), 2);
    let one = &made[0];
    for (role, key) in t.all() {
        let read = if role == "outsider" { 404 } else { 200 };
        s.expect(Method::GET, &format!("/v1/channels/{one}"), key, None, read).await;
        s.expect(Method::GET, &format!("/v1/channels?project_id={}", t.project_id), key, None, read).await;
        let write = match role {
            "owner" | "editor" => 200,
            "outsider" => 404,
            _ => 403,
        };
        s.expect(Method::PATCH, &format!("/v1/channels/{one}"), key, Some(json!({"name": role})), write).await;
    }
    let listed = s.expect(Method::GET, "/v1/channels", &t.outsider, None, 200).await;
    assert_eq!(listed["channels"], json!([]));
    for (key, status) in [(&t.viewer, 403), (&t.reviewer, 403), (&t.outsider, 404)] {
        s.expect(Method::DELETE, &format!("/v1/channels/{one}"), key, None, status).await;
    }
    s.expect(Method::DELETE, &format!("/v1/channels/{}", made[0]), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/channels/{}", made[1]), &t.owner, None, 200).await;
    s.expect(Method::GET, &format!("/v1/channels/{one}"), &t.owner, None, 404).await;
}

#[tokio::test]
async fn integration_input_is_checked_field_by_field() {
    let s = TestServer::start().await;
    let t = s.team("integration validation").await;
    let p = &t.project_id;
    let number = |n: &str| json!({"number": n, "label": "", "direction": "inbound"});
    let cases: Vec<(Value, &str, &str)> = vec![
        (with(twilio(p, ""), json!({})), "invalid_name", "name"),
        (with(twilio(p, "   "), json!({})), "invalid_name", "name"),
        (with(twilio(p, &"n".repeat(101)), json!({})), "invalid_name", "name"),
        (with(twilio(p, "x"), json!({"provider": "pigeon"})), "invalid_provider", "provider"),
        (with(twilio(p, "x"), json!({"project_id": null})), "invalid_project_id", "project_id"),
        (with(llm(p, "x"), json!({"config": {"model": "m"}})), "invalid_base_url", "config.base_url"),
        (
            with(llm(p, "x"), json!({"config": {"base_url": "ftp://llm.example.com", "model": "m"}})),
            "invalid_base_url",
            "config.base_url",
        ),
        (
            with(llm(p, "x"), json!({"config": {"base_url": "https://llm.example.com", "model": " "}})),
            "invalid_model",
            "config.model",
        ),
        (
            with(llm(p, "x"), json!({"config": {"base_url": "https://llm.example.com"}})),
            "invalid_model",
            "config.model",
        ),
        (with(twilio(p, "x"), json!({"config": {}})), "invalid_account_sid", "config.account_sid"),
        (with(twilio(p, "x"), json!({"config": {"account_sid": 7}})), "invalid_account_sid", "config.account_sid"),
        (
            with(twilio(p, "x"), json!({"config": {"account_sid": "AC1", "auth_token": "x"}})),
            "invalid_config",
            "auth_token",
        ),
        (with(twilio(p, "x"), json!({"config": "nope"})), "invalid_config", "config"),
        (with(twilio(p, "x"), json!({"credentials": "nope"})), "invalid_credentials", "credentials"),
        // Sent as a bearer token: a key that is no string went unsent.
        (with(llm(p, "x"), json!({"credentials": {"api_key": 5}})), "invalid_api_key", "credentials.api_key"),
        (with(llm(p, "x"), json!({"credentials": {"api_key": " "}})), "invalid_api_key", "credentials.api_key"),
        // `/chat/completions` is appended: it would land in the query.
        (
            with(llm(p, "x"), json!({"config": {"base_url": "https://llm.example.com/v1?x=1", "model": "m"}})),
            "invalid_base_url",
            "config.base_url",
        ),
        (
            with(
                llm(p, "x"),
                json!({"config": {"base_url": "https://llm.example.com", "model": "m", "temperature": "hot"}}),
            ),
            "invalid_temperature",
            "config.temperature",
        ),
        (with(twilio(p, "x"), json!({"phone_numbers": [number("555")]})), "invalid_number", "phone_numbers[0].number"),
        (
            with(twilio(p, "x"), json!({"phone_numbers": [number("+14155550100"), number("+0123")]})),
            "invalid_number",
            "phone_numbers[1].number",
        ),
        (
            with(
                twilio(p, "x"),
                json!({"phone_numbers": [{"number": "+14155550100", "label": "l".repeat(101), "direction": "both"}]}),
            ),
            "invalid_label",
            "phone_numbers[0].label",
        ),
        (
            with(
                twilio(p, "x"),
                json!({"phone_numbers": [{"number": "+14155550100", "label": "a\u{1}b", "direction": "both"}]}),
            ),
            "invalid_label",
            "phone_numbers[0].label",
        ),
        (
            with(
                twilio(p, "x"),
                json!({"phone_numbers": [{"number": "+14155550100", "label": "", "direction": "sideways"}]}),
            ),
            "invalid_direction",
            "direction",
        ),
        (
            with(twilio(p, "x"), json!({"phone_numbers": [number("+14155550100"), number("+14155550100")]})),
            "invalid_phone_numbers",
            "phone_numbers",
        ),
        (
            with(
                twilio(p, "x"),
                json!({"phone_numbers": (0..101).map(|i| number(&format!("+1415555{i:04}"))).collect::<Vec<_>>()}),
            ),
            "invalid_phone_numbers",
            "phone_numbers",
        ),
        (
            with(llm(p, "x"), json!({"phone_numbers": [number("+14155550100")]})),
            "invalid_phone_numbers",
            "phone_numbers",
        ),
        (with(twilio(p, "x"), json!({"colour": "blue"})), "invalid_body", "colour"),
    ];
    for (body, code, field) in cases {
        refused(&s, Method::POST, "/v1/integrations", &t.owner, body, code, field).await;
    }
    // A project the caller is not in, or none at all: 404.
    let other = s.create_project(&t.outsider, "not theirs").await;
    s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio(&other, "x")), 404).await;
    s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio("prj_nope", "x")), 404).await;
    // Nothing was made, so nothing was recorded.
    let listed = s.expect(Method::GET, &format!("/v1/integrations?project_id={p}"), &t.owner, None, 200).await;
    assert_eq!(listed["integrations"], json!([]));
    let activity = s
        .expect(Method::GET, &format!("/v1/activity?project_id={p}&resource_type=integration"), &t.owner, None, 200)
        .await;
    assert_eq!(activity["activity"], json!([]));

    // Telnyx and Vonage take any config; phone numbers keep their order.
    for provider in ["telnyx", "vonage"] {
        let made = s
            .expect(
                Method::POST,
                "/v1/integrations",
                &t.owner,
                Some(json!({"project_id": p, "provider": provider, "name": provider,
                            "phone_numbers": [number("+442071838750"), number("+14155550100")]})),
                200,
            )
            .await;
        assert_eq!(made["config"], json!({}));
        assert_eq!(made["credentials_configured"], false);
        assert_eq!(made["phone_numbers"][0]["number"], "+442071838750");
        assert_eq!(made["phone_numbers"][1]["number"], "+14155550100");
    }
}

#[tokio::test]
async fn channel_input_is_checked_field_by_field() {
    let s = TestServer::start().await;
    let t = s.team("channel validation").await;
    let p = &t.project_id;
    let tel = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio(p, "tel")), 200).await);
    let judge = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(p, "judge")), 200).await);
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    let foreign = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio(&elsewhere, "tel")), 200).await);
    let phone = |target: &str, integration: Option<&str>| json!({"project_id": p, "name": "phone", "kind": "phone", "target": target, "integration_id": integration});
    let sip =
        |target: &str| json!({"project_id": p, "name": "sip", "kind": "sip", "target": target, "integration_id": tel});
    let ws = |target: &str| json!({"project_id": p, "name": "ws", "kind": "websocket", "target": target});
    let many: serde_json::Map<String, Value> = (0..51).map(|i| (format!("x-h{i}"), json!("v"))).collect();
    let cases: Vec<(Value, &str, &str)> = vec![
        (with(http_channel(p, " "), json!({})), "invalid_name", "name"),
        (with(http_channel(p, "x"), json!({"kind": "fax"})), "invalid_kind", "kind"),
        (with(http_channel(p, "x"), json!({"target": ""})), "invalid_target", "target"),
        (with(http_channel(p, "x"), json!({"target": "not a url"})), "invalid_target", "target"),
        (with(http_channel(p, "x"), json!({"target": "wss://agent.example.com"})), "invalid_target", "target"),
        (with(http_channel(p, "x"), json!({"target": "https://u:pw@agent.example.com"})), "invalid_target", "target"),
        (ws("https://agent.example.com"), "invalid_target", "target"),
        (phone("4155550100", Some(&tel)), "invalid_target", "target"),
        (sip("sip:"), "invalid_target", "target"),
        (sip("https://sip.example.com"), "invalid_target", "target"),
        (sip("sip:agent:password@sip.example.com"), "invalid_target", "target"),
        (with(http_channel(p, "x"), json!({"headers": {"bad name": "v"}})), "invalid_headers", "headers"),
        (with(http_channel(p, "x"), json!({"headers": {"Host": "v"}})), "invalid_headers", "host"),
        (
            with(http_channel(p, "x"), json!({"headers": {"X-Sparring-Call-Id": "v"}})),
            "invalid_headers",
            "x-sparring-call-id",
        ),
        (with(http_channel(p, "x"), json!({"headers": {"Content-Length": "1"}})), "invalid_headers", "content-length"),
        (with(http_channel(p, "x"), json!({"headers": {"connection": "close"}})), "invalid_headers", "connection"),
        (
            with(http_channel(p, "x"), json!({"headers": {"Transfer-Encoding": "chunked"}})),
            "invalid_headers",
            "transfer-encoding",
        ),
        (with(http_channel(p, "x"), json!({"headers": {"x-a": "line\nbreak"}})), "invalid_headers", "x-a"),
        (with(http_channel(p, "x"), json!({"headers": {"X-A": "1", "x-a": "2"}})), "invalid_headers", "x-a"),
        (with(http_channel(p, "x"), json!({"headers": many})), "invalid_headers", "headers"),
        (with(http_channel(p, "x"), json!({"turn_timeout_ms": 99})), "invalid_turn_timeout_ms", "turn_timeout_ms"),
        (with(http_channel(p, "x"), json!({"turn_timeout_ms": 120001})), "invalid_turn_timeout_ms", "turn_timeout_ms"),
        (
            with(http_channel(p, "x"), json!({"max_call_duration_s": 0})),
            "invalid_max_call_duration_s",
            "max_call_duration_s",
        ),
        (
            with(http_channel(p, "x"), json!({"max_call_duration_s": 3601})),
            "invalid_max_call_duration_s",
            "max_call_duration_s",
        ),
        // References: none where the kind needs none, a telephony
        // integration of this project where it needs one.
        (with(http_channel(p, "x"), json!({"integration_id": tel})), "invalid_integration_id", "integration_id"),
        (
            with(ws("wss://agent.example.com"), json!({"integration_id": tel})),
            "invalid_integration_id",
            "integration_id",
        ),
        (phone("+14155550123", None), "invalid_integration_id", "integration_id"),
        (phone("+14155550123", Some(&judge)), "invalid_integration_id", "integration_id"),
        (phone("+14155550123", Some(&foreign)), "invalid_integration_id", "integration_id"),
        (phone("+14155550123", Some("int_missing")), "invalid_integration_id", "integration_id"),
        (
            json!({"project_id": p, "name": "sip", "kind": "sip", "target": "sip:a@sip.example.com"}),
            "invalid_integration_id",
            "integration_id",
        ),
        (with(http_channel(p, "x"), json!({"colour": "blue"})), "invalid_body", "colour"),
    ];
    for (body, code, field) in cases {
        refused(&s, Method::POST, "/v1/channels", &t.owner, body, code, field).await;
    }
    let activity =
        s.expect(Method::GET, &format!("/v1/activity?project_id={p}&resource_type=channel"), &t.owner, None, 200).await;
    assert_eq!(activity["activity"], json!([]), "failed creates record nothing");

    // Each kind with a target that suits it; defaults filled in.
    let made = s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(p, "http")), 200).await;
    assert_eq!(
        (made["kind"].clone(), made["integration_id"].clone(), made["header_names"].clone()),
        (json!("http"), Value::Null, json!([]))
    );
    assert_eq!((made["turn_timeout_ms"].clone(), made["max_call_duration_s"].clone()), (json!(10000), json!(600)));
    s.expect(Method::POST, "/v1/channels", &t.owner, Some(ws("wss://agent.example.com/ws")), 200).await;
    let made = s.expect(Method::POST, "/v1/channels", &t.owner, Some(phone("+14155550123", Some(&tel))), 200).await;
    assert_eq!(made["integration_id"], json!(tel));
    s.expect(Method::POST, "/v1/channels", &t.owner, Some(sip("sips:agent@sip.example.com:5061;transport=tls")), 200)
        .await;
    let made = s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.owner,
            Some(with(
                http_channel(p, "tuned"),
                json!({"turn_timeout_ms": 100, "max_call_duration_s": 3600, "integration_id": null,
                       "headers": {"X-Api-Key": "k", "Authorization": "Bearer t"}}),
            )),
            200,
        )
        .await;
    assert_eq!(made["header_names"], json!(["authorization", "x-api-key"]));
    assert_eq!((made["turn_timeout_ms"].clone(), made["max_call_duration_s"].clone()), (json!(100), json!(3600)));
}

#[tokio::test]
async fn names_are_unique_within_a_project() {
    let s = TestServer::start().await;
    let t = s.team("names").await;
    let p = &t.project_id;
    let a = id(&s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(p, "agent")), 200).await);
    let b = id(&s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(p, "other")), 200).await);
    let (status, e) =
        error_body(s.send_json(Method::POST, "/v1/channels", &t.owner, Some(http_channel(p, "agent"))).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"), "{e}");
    assert!(e["message"].as_str().unwrap().contains(&a), "{e}");
    let (status, e) = error_body(
        s.send_json(Method::PATCH, &format!("/v1/channels/{b}"), &t.owner, Some(json!({"name": "agent"}))).await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"));
    // Renaming to its own name is no conflict; another project may reuse it.
    s.expect(Method::PATCH, &format!("/v1/channels/{a}"), &t.owner, Some(json!({"name": "agent"})), 200).await;
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(&elsewhere, "agent")), 200).await;

    let i = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(p, "judge")), 200).await);
    let j = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(p, "judge 2")), 200).await);
    let (status, e) =
        error_body(s.send_json(Method::POST, "/v1/integrations", &t.owner, Some(twilio(p, "judge"))).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"));
    assert!(e["message"].as_str().unwrap().contains(&i), "{e}");
    let (status, e) = error_body(
        s.send_json(Method::PATCH, &format!("/v1/integrations/{j}"), &t.owner, Some(json!({"name": "judge"}))).await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"));
    s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(&elsewhere, "judge")), 200).await;
    // The failed renames changed nothing and recorded nothing.
    assert_eq!(history(&s, &t.owner, "channel", &b).await.len(), 1);
    assert_eq!(history(&s, &t.owner, "integration", &j).await.len(), 1);
}

#[tokio::test]
async fn patch_changes_only_what_is_sent() {
    let s = TestServer::start().await;
    let t = s.team("patch").await;
    let p = &t.project_id;
    let made = s
        .expect(
            Method::POST,
            "/v1/integrations",
            &t.editor,
            Some(with(twilio(p, "tel"), json!({"credentials": {"auth_token": "tok-1"}}))),
            200,
        )
        .await;
    let i = id(&made);
    let path = format!("/v1/integrations/{i}");
    assert_eq!(made["credentials_configured"], true);
    // Absent fields are unchanged.
    let after = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"name": "renamed"})), 200).await;
    assert_eq!(after["name"], "renamed");
    for field in ["config", "phone_numbers", "credentials_configured", "provider", "created_at"] {
        assert_eq!(after[field], made[field], "{field}");
    }
    assert!(after["updated_at"].as_str() >= made["updated_at"].as_str());
    // Config and phone numbers are replaced whole.
    let numbers = json!([
        {"number": "+14155550102", "label": "b", "direction": "outbound"},
        {"number": "+14155550101", "label": "a", "direction": "inbound"},
    ]);
    let after = s
        .expect(
            Method::PATCH,
            &path,
            &t.editor,
            Some(json!({"config": {"account_sid": "AC2", "region": "ie1"}, "phone_numbers": numbers})),
            200,
        )
        .await;
    assert_eq!(after["config"], json!({"account_sid": "AC2", "region": "ie1"}));
    assert_eq!(after["phone_numbers"], numbers);
    assert_eq!(after["credentials_configured"], true);
    let listed = s.expect(Method::GET, &format!("{path}/phone-numbers"), &t.viewer, None, 200).await;
    assert_eq!(listed["phone_numbers"], numbers);
    // Credentials: null removes them, an object replaces them.
    let after = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"credentials": null})), 200).await;
    assert_eq!(after["credentials_configured"], false);
    let after =
        s.expect(Method::PATCH, &path, &t.editor, Some(json!({"credentials": {"auth_token": "tok-2"}})), 200).await;
    assert_eq!(after["credentials_configured"], true);
    let after = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"phone_numbers": []})), 200).await;
    assert_eq!(after["phone_numbers"], json!([]));
    // Refused changes, each naming its field, none recorded.
    let judge = id(&s.expect(Method::POST, "/v1/integrations", &t.editor, Some(llm(p, "judge")), 200).await);
    let judge_path = format!("/v1/integrations/{judge}");
    let recorded = history(&s, &t.editor, "integration", &i).await.len();
    for (target, body, code, field) in [
        (&path, json!({"name": null}), "invalid_name", "name"),
        (&path, json!({"name": " "}), "invalid_name", "name"),
        (&path, json!({"config": {}}), "invalid_account_sid", "config.account_sid"),
        (&path, json!({"config": {"account_sid": "AC1", "password": "x"}}), "invalid_config", "password"),
        (&path, json!({"config": null}), "invalid_config", "config"),
        (&path, json!({"provider": "vonage"}), "invalid_body", "provider"),
        (
            &path,
            json!({"phone_numbers": [{"number": "+14155550101", "label": "", "direction": "both"},
                                     {"number": "+14155550101", "label": "", "direction": "both"}]}),
            "invalid_phone_numbers",
            "phone_numbers",
        ),
        (&judge_path, json!({"config": {"model": "m"}}), "invalid_base_url", "config.base_url"),
        (
            &judge_path,
            json!({"phone_numbers": [{"number": "+14155550101", "label": "", "direction": "both"}]}),
            "invalid_phone_numbers",
            "phone_numbers",
        ),
    ] {
        refused(&s, Method::PATCH, target, &t.editor, body, code, field).await;
    }
    assert_eq!(history(&s, &t.editor, "integration", &i).await.len(), recorded);
    s.expect(Method::PATCH, "/v1/integrations/int_missing", &t.editor, Some(json!({"name": "x"})), 404).await;

    // Channels.
    let ch = s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.editor,
            Some(with(http_channel(p, "web"), json!({"headers": {"Authorization": "Bearer a"}}))),
            200,
        )
        .await;
    let c = id(&ch);
    let cpath = format!("/v1/channels/{c}");
    let after = s.expect(Method::PATCH, &cpath, &t.editor, Some(json!({"turn_timeout_ms": 2500})), 200).await;
    assert_eq!(after["turn_timeout_ms"], 2500);
    for field in ["name", "target", "kind", "header_names", "max_call_duration_s", "integration_id"] {
        assert_eq!(after[field], ch[field], "{field}");
    }
    let after =
        s.expect(Method::PATCH, &cpath, &t.editor, Some(json!({"headers": {"X-B": "1", "x-a": "2"}})), 200).await;
    assert_eq!(after["header_names"], json!(["x-a", "x-b"]));
    let after = s.expect(Method::PATCH, &cpath, &t.editor, Some(json!({"headers": null})), 200).await;
    assert_eq!(after["header_names"], json!([]));
    let after = s
        .expect(Method::PATCH, &cpath, &t.editor, Some(json!({"target": "http://agent.internal:8080/turn"})), 200)
        .await;
    assert_eq!(after["target"], "http://agent.internal:8080/turn");
    let tel = id(&s.expect(Method::POST, "/v1/integrations", &t.editor, Some(twilio(p, "tel 2")), 200).await);
    let phone = id(&s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.editor,
            Some(json!({"project_id": p, "name": "phone", "kind": "phone", "target": "+14155550123",
                        "integration_id": tel})),
            200,
        )
        .await);
    let ppath = format!("/v1/channels/{phone}");
    let recorded = history(&s, &t.editor, "channel", &c).await.len();
    for (target, body, code, field) in [
        (&cpath, json!({"kind": "websocket"}), "invalid_body", "kind"),
        (&cpath, json!({"target": "wss://agent.example.com"}), "invalid_target", "target"),
        (&cpath, json!({"target": null}), "invalid_target", "target"),
        (&cpath, json!({"name": null}), "invalid_name", "name"),
        (&cpath, json!({"integration_id": tel}), "invalid_integration_id", "integration_id"),
        (&cpath, json!({"headers": {"Connection": "close"}}), "invalid_headers", "connection"),
        (&cpath, json!({"turn_timeout_ms": 50}), "invalid_turn_timeout_ms", "turn_timeout_ms"),
        (&cpath, json!({"max_call_duration_s": 4000}), "invalid_max_call_duration_s", "max_call_duration_s"),
        (&ppath, json!({"integration_id": null}), "invalid_integration_id", "integration_id"),
        (&ppath, json!({"integration_id": judge}), "invalid_integration_id", "integration_id"),
        (&ppath, json!({"target": "https://agent.example.com"}), "invalid_target", "target"),
    ] {
        refused(&s, Method::PATCH, target, &t.editor, body, code, field).await;
    }
    assert_eq!(history(&s, &t.editor, "channel", &c).await.len(), recorded);
    let after = s.expect(Method::PATCH, &ppath, &t.editor, Some(json!({"target": "+442071838750"})), 200).await;
    assert_eq!((after["target"].clone(), after["integration_id"].clone()), (json!("+442071838750"), json!(tel)));
    s.expect(Method::PATCH, "/v1/channels/chn_missing", &t.editor, Some(json!({"name": "x"})), 404).await;
}

#[tokio::test]
async fn deleting_an_integration_a_channel_uses_is_refused() {
    let s = TestServer::start().await;
    let t = s.team("in use").await;
    let p = &t.project_id;
    let tel = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(twilio(p, "tel")), 200).await);
    let ch = id(&s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.owner,
            Some(json!({"project_id": p, "name": "front desk", "kind": "sip",
                        "target": "sip:agent@sip.example.com", "integration_id": tel})),
            200,
        )
        .await);
    let (status, e) =
        error_body(s.send_json(Method::DELETE, &format!("/v1/integrations/{tel}"), &t.owner, None).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"));
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(&ch) && message.contains("front desk"), "{message}");
    assert_eq!(history(&s, &t.owner, "integration", &tel).await.len(), 1, "a refused delete records nothing");
    s.expect(Method::GET, &format!("/v1/integrations/{tel}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/channels/{ch}"), &t.owner, None, 200).await;
    let deleted = s.expect(Method::DELETE, &format!("/v1/integrations/{tel}"), &t.owner, None, 200).await;
    assert_eq!(deleted, json!({"id": tel, "deleted": true}));
    s.expect(Method::DELETE, &format!("/v1/integrations/{tel}"), &t.owner, None, 404).await;
    s.expect(Method::DELETE, &format!("/v1/channels/{ch}"), &t.owner, None, 404).await;
    // The record of the deletion outlives the resource.
    let records = history(&s, &t.owner, "integration", &tel).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["integration.delete", "integration.create"]);
}

/// Needs the persona, scenario and test operations.
#[tokio::test]
async fn deleting_what_scenarios_and_tests_use_is_refused() {
    let s = TestServer::start().await;
    let t = s.team("judges").await;
    let p = &t.project_id;
    let judge = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(p, "judge")), 200).await);
    let judge2 = id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(p, "judge 2")), 200).await);
    let ch = id(&s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(p, "web")), 200).await);
    let persona = id(&s
        .expect(Method::POST, "/v1/personas", &t.owner, Some(json!({"project_id": p, "name": "caller"})), 200)
        .await);
    let scenario = id(&s
        .expect(
            Method::POST,
            "/v1/scenarios",
            &t.owner,
            Some(json!({"project_id": p, "name": "booking", "mode": "simulated", "goal": "book a table for two", "integration_id": judge,
                        "default_persona_id": persona,
                        "success_criteria": [{"type": "llm_judge", "name": "booked", "integration_id": judge,
                                              "prompt": "Did the agent book the table?"}]})),
            200,
        )
        .await);
    let test = id(&s
        .expect(
            Method::POST,
            "/v1/tests",
            &t.owner,
            Some(json!({"project_id": p, "name": "booking works", "channel_id": ch, "scenario_id": scenario,
                        "evaluators": [{"type": "llm_judge", "name": "polite", "integration_id": judge2,
                                        "prompt": "Was the agent polite?"}]})),
            200,
        )
        .await);
    for (path, referrer) in [
        (format!("/v1/integrations/{judge}"), &scenario),
        (format!("/v1/integrations/{judge2}"), &test),
        (format!("/v1/channels/{ch}"), &test),
    ] {
        let (status, e) = error_body(s.send_json(Method::DELETE, &path, &t.owner, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{path}");
        assert!(e["message"].as_str().unwrap().contains(referrer.as_str()), "{path}: {e}");
    }
    s.expect(Method::DELETE, &format!("/v1/tests/{test}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/channels/{ch}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{judge2}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/scenarios/{scenario}"), &t.owner, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{judge}"), &t.owner, None, 200).await;
}

#[tokio::test]
async fn pages_return_each_item_once() {
    let s = TestServer::start().await;
    let t = s.team("pages").await;
    let p = &t.project_id;
    // Another project's resources never show in this one's list.
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    s.expect(Method::POST, "/v1/integrations", &t.owner, Some(llm(&elsewhere, "x")), 200).await;
    s.expect(Method::POST, "/v1/channels", &t.owner, Some(http_channel(&elsewhere, "x")), 200).await;
    let mut integrations = Vec::new();
    let mut channels = Vec::new();
    for i in 0..5 {
        let body = if i % 2 == 0 { llm(p, &format!("i{i}")) } else { twilio(p, &format!("i{i}")) };
        integrations.push(id(&s.expect(Method::POST, "/v1/integrations", &t.owner, Some(body), 200).await));
        let body = if i % 2 == 0 {
            http_channel(p, &format!("c{i}"))
        } else {
            json!({"project_id": p, "name": format!("c{i}"), "kind": "websocket", "target": "wss://a.example.com"})
        };
        channels.push(id(&s.expect(Method::POST, "/v1/channels", &t.owner, Some(body), 200).await));
    }
    integrations.reverse();
    channels.reverse();
    for (list, field, expected) in
        [("integrations", "integrations", &integrations), ("channels", "channels", &channels)]
    {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut path = format!("/v1/{list}?project_id={p}&limit=2");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
            pages += 1;
            let items = page[field].as_array().unwrap();
            assert!(items.len() <= 2);
            seen.extend(items.iter().map(id));
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(&seen, expected, "{list}: newest first, each once");
        assert_eq!(pages, 3);
    }
    // Filters.
    let twilios =
        s.expect(Method::GET, &format!("/v1/integrations?project_id={p}&provider=twilio"), &t.viewer, None, 200).await;
    assert_eq!(twilios["integrations"].as_array().unwrap().len(), 2);
    assert!(twilios["integrations"].as_array().unwrap().iter().all(|i| i["provider"] == "twilio"));
    let sockets =
        s.expect(Method::GET, &format!("/v1/channels?project_id={p}&kind=websocket"), &t.viewer, None, 200).await;
    assert_eq!(sockets["channels"].as_array().unwrap().len(), 2);
    assert!(sockets["channels"].as_array().unwrap().iter().all(|c| c["kind"] == "websocket"));
    for list in ["integrations", "channels"] {
        s.expect(Method::GET, &format!("/v1/{list}?cursor=%21%21"), &t.viewer, None, 400).await;
        s.expect(Method::GET, &format!("/v1/{list}?project_id={elsewhere}"), &t.viewer, None, 404).await;
    }

    // Phone numbers page in the order they were given.
    let numbers: Vec<Value> = (0..7)
        .map(|i| json!({"number": format!("+1415555{:04}", 90 - i), "label": format!("n{i}"), "direction": "both"}))
        .collect();
    let tel = id(&s
        .expect(
            Method::POST,
            "/v1/integrations",
            &t.owner,
            Some(with(twilio(p, "numbers"), json!({"phone_numbers": numbers}))),
            200,
        )
        .await);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/integrations/{tel}/phone-numbers?limit=3");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = s.expect(Method::GET, &path, &t.reviewer, None, 200).await;
        seen.extend(page["phone_numbers"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, numbers);
    // A cursor from another list is refused.
    let other_cursor = s
        .expect(Method::GET, &format!("/v1/channels?project_id={p}&limit=1"), &t.viewer, None, 200)
        .await["next_cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, e) = error_body(
        s.send_json(
            Method::GET,
            &format!("/v1/integrations/{tel}/phone-numbers?cursor={other_cursor}"),
            &t.viewer,
            None,
        )
        .await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_cursor"));
}

#[tokio::test]
async fn each_change_is_recorded_once_with_secrets_masked() {
    let s = TestServer::start().await;
    let t = s.team("activity").await;
    let p = &t.project_id;
    let made = s
        .expect(
            Method::POST,
            "/v1/integrations",
            &t.editor,
            Some(with(
                twilio(p, "tel"),
                json!({"credentials": {"auth_token": "tok-activity", "api_key": "k-activity"}}),
            )),
            200,
        )
        .await;
    let i = id(&made);
    s.expect(
        Method::PATCH,
        &format!("/v1/integrations/{i}"),
        &t.editor,
        Some(json!({"credentials": {"auth_token": "tok-2"}})),
        200,
    )
    .await;
    s.expect(Method::PATCH, &format!("/v1/integrations/{i}"), &t.editor, Some(json!({"credentials": null})), 200).await;
    // A PATCH that changes nothing records nothing.
    s.expect(Method::PATCH, &format!("/v1/integrations/{i}"), &t.editor, Some(json!({})), 200).await;
    let records = history(&s, &t.viewer, "integration", &i).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["integration.update", "integration.update", "integration.create"]);
    let create = &records[2];
    assert_eq!(create["project_id"], json!(p));
    assert_eq!(create["resource_type"], "integration");
    assert_eq!(create["changes"]["credentials"], json!({"auth_token": "***", "api_key": "***"}));
    assert_eq!(create["changes"]["config"], made["config"]);
    assert_eq!(create["changes"]["phone_numbers"], made["phone_numbers"]);
    assert_eq!(records[1]["changes"], json!({"credentials": {"auth_token": "***"}}));
    assert_eq!(records[0]["changes"], json!({"credentials": null}));

    let ch = s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.editor,
            Some(with(http_channel(p, "web"), json!({"headers": {"Authorization": "Bearer hdr-activity"}}))),
            200,
        )
        .await;
    let c = id(&ch);
    s.expect(
        Method::PATCH,
        &format!("/v1/channels/{c}"),
        &t.editor,
        Some(json!({"headers": {"X-Key": "hdr-2"}, "name": "web 2"})),
        200,
    )
    .await;
    s.expect(Method::DELETE, &format!("/v1/channels/{c}"), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{i}"), &t.owner, None, 200).await;
    let records = history(&s, &t.viewer, "channel", &c).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["channel.delete", "channel.update", "channel.create"]);
    assert_eq!(records[2]["changes"]["headers"], json!({"authorization": "***"}));
    assert_eq!(records[2]["changes"]["target"], "https://agent.example.com/turn");
    assert_eq!(records[1]["changes"], json!({"headers": {"x-key": "***"}, "name": "web 2"}));
    for r in &records {
        assert_eq!(r["actor"]["credential"], "api_key");
        assert_eq!(r["project_id"], json!(p));
    }
    let records = history(&s, &t.viewer, "integration", &i).await;
    assert_eq!(records[0]["action"], "integration.delete");
    let all = s.expect(Method::GET, &format!("/v1/activity?project_id={p}"), &t.viewer, None, 200).await.to_string();
    for secret in ["tok-activity", "k-activity", "tok-2", "hdr-activity", "hdr-2"] {
        assert!(!all.contains(secret), "{secret} in activity");
    }
}

#[tokio::test]
async fn credential_and_header_values_never_come_back_out() {
    let mut s = TestServer::start().await;
    let t = s.team("secrets").await;
    let p = &t.project_id;
    let credential = "sk-live-CREDENTIAL-VALUE-4f1e9a7c";
    let credential2 = "sk-live-SECOND-CREDENTIAL-b2d0";
    let header = "Bearer HEADER-VALUE-77aa31d05e";
    let header2 = "HEADER-VALUE-SECOND-c0ffee";
    let mut bodies: Vec<String> = Vec::new();
    let mut call = async |method: Method, path: String, body: Option<Value>| -> Value {
        let resp = s.send_json(method, &path, &t.owner, body).await;
        let text = resp.text().await.unwrap();
        bodies.push(text.clone());
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    let integration = call(
        Method::POST,
        "/v1/integrations".into(),
        Some(with(llm(p, "judge"), json!({"credentials": {"api_key": credential}}))),
    )
    .await;
    let i = id(&integration);
    assert_eq!(integration["credentials_configured"], true);
    assert!(integration.get("credentials").is_none());
    let tel = id(&call(
        Method::POST,
        "/v1/integrations".into(),
        Some(with(twilio(p, "tel"), json!({"credentials": {"auth_token": credential2}}))),
    )
    .await);
    let channel = call(
        Method::POST,
        "/v1/channels".into(),
        Some(with(http_channel(p, "web"), json!({"headers": {"Authorization": header}}))),
    )
    .await;
    let c = id(&channel);
    assert_eq!(channel["header_names"], json!(["authorization"]));
    assert!(channel.get("headers").is_none());
    call(
        Method::PATCH,
        format!("/v1/channels/{c}"),
        Some(json!({"headers": {"X-Token": header2, "Authorization": header}})),
    )
    .await;
    call(
        Method::PATCH,
        format!("/v1/integrations/{i}"),
        Some(json!({"credentials": {"api_key": credential}, "name": "j"})),
    )
    .await;
    // Refused requests carrying the secrets do not echo them either.
    call(
        Method::POST,
        "/v1/channels".into(),
        Some(with(http_channel(p, "bad"), json!({"headers": {"x-a": format!("{header}\n")}}))),
    )
    .await;
    call(Method::PATCH, format!("/v1/channels/{c}"), Some(json!({"headers": {"Host": header2}}))).await;
    call(
        Method::PATCH,
        format!("/v1/integrations/{i}"),
        Some(json!({"credentials": {"api_key": credential}, "config": {}})),
    )
    .await;
    for path in [
        format!("/v1/integrations/{i}"),
        format!("/v1/integrations/{tel}"),
        format!("/v1/integrations?project_id={p}"),
        format!("/v1/integrations/{tel}/phone-numbers"),
        format!("/v1/channels/{c}"),
        format!("/v1/channels?project_id={p}"),
        format!("/v1/activity/resource/integration/{i}"),
        format!("/v1/activity/resource/integration/{tel}"),
        format!("/v1/activity/resource/channel/{c}"),
        format!("/v1/activity?project_id={p}"),
    ] {
        call(Method::GET, path, None).await;
    }
    assert!(bodies.len() > 15);
    let secrets = [credential, credential2, header, header2];
    for body in &bodies {
        for secret in secrets {
            assert!(!body.contains(secret), "a response carries {secret}: {body}");
        }
    }
    s.stop().await;
    let log = s.log.contents();
    assert!(!log.is_empty());
    let stored = s.stored_bytes();
    for secret in secrets {
        assert!(!log.contains(secret), "the log carries {secret}");
        assert!(!contains(&stored, secret), "the data dir holds {secret} in the clear");
    }
    // The header names are public; they are stored as given (lower-cased).
    assert!(contains(&stored, "x-token"));
}

/// Secrets are write-only, so an editor who cannot read them must not be
/// able to send them elsewhere either: moving a channel's target, or an
/// integration's `base_url`, to another origin needs its header values or
/// credentials given again (or dropped) in the same request.
#[tokio::test]
async fn stored_secrets_go_only_where_they_were_set() {
    let s = TestServer::start().await;
    let t = s.team("destinations").await;
    let p = &t.project_id;
    let channel =
        create(&s, &t.editor, "/v1/channels", with(http_channel(p, "web"), json!({"headers": {"X-Token": "t"}}))).await;
    let c = format!("/v1/channels/{channel}");
    for elsewhere in
        ["https://elsewhere.example.net/turn", "http://agent.example.com/turn", "https://agent.example.com:8443/turn"]
    {
        refused(&s, Method::PATCH, &c, &t.editor, json!({"target": elsewhere}), "invalid_headers", "headers").await;
    }
    let seen = s.expect(Method::GET, &c, &t.editor, None, 200).await;
    assert_eq!(seen["target"], "https://agent.example.com/turn", "nothing changed: {seen:#}");
    // The same origin (another path, the default port spelled out) keeps them.
    for same in ["https://agent.example.com/v2/turn", "https://agent.example.com:443/turn"] {
        let moved = s.expect(Method::PATCH, &c, &t.editor, Some(json!({"target": same})), 200).await;
        assert_eq!((&moved["target"], &moved["header_names"]), (&json!(same), &json!(["x-token"])));
    }
    // Given again, or dropped, they follow.
    let away = json!({"target": "https://elsewhere.example.net/turn", "headers": {"X-Token": "u"}});
    assert_eq!(s.expect(Method::PATCH, &c, &t.editor, Some(away), 200).await["header_names"], json!(["x-token"]));
    let back = json!({"target": "https://agent.example.com/turn", "headers": null});
    assert_eq!(s.expect(Method::PATCH, &c, &t.editor, Some(back), 200).await["header_names"], json!([]));
    // With none stored, nothing to give again.
    let plain = json!({"target": "https://plain.example.org/turn"});
    s.expect(Method::PATCH, &c, &t.editor, Some(plain), 200).await;

    let integration =
        create(&s, &t.editor, "/v1/integrations", with(llm(p, "judge"), json!({"credentials": {"api_key": "k"}})))
            .await;
    let i = format!("/v1/integrations/{integration}");
    let config = |base_url: &str| json!({"config": {"base_url": base_url, "model": "gpt-4o-mini"}});
    refused(
        &s,
        Method::PATCH,
        &i,
        &t.editor,
        config("https://collector.example.net/v1"),
        "invalid_credentials",
        "credentials",
    )
    .await;
    let seen = s.expect(Method::GET, &i, &t.editor, None, 200).await;
    assert_eq!(seen["config"]["base_url"], "https://llm.example.com/v1");
    s.expect(Method::PATCH, &i, &t.editor, Some(config("https://llm.example.com/v2")), 200).await;
    let mut away = config("https://other.example.net/v1");
    away["credentials"] = json!({"api_key": "k2"});
    let moved = s.expect(Method::PATCH, &i, &t.editor, Some(away), 200).await;
    assert_eq!(
        (&moved["config"]["base_url"], &moved["credentials_configured"]),
        (&json!("https://other.example.net/v1"), &json!(true))
    );
}

/// A PATCH that gives the values already stored changes nothing: the
/// resource's `updated_at` ("time of the last change") stays, and nothing is
/// recorded, as for personas and tests.
#[tokio::test]
async fn a_patch_giving_the_stored_values_changes_nothing() {
    let s = TestServer::start().await;
    let t = s.team("same values").await;
    let p = &t.project_id;
    let chn = s
        .expect(
            Method::POST,
            "/v1/channels",
            &t.editor,
            Some(with(http_channel(p, "agent"), json!({"turn_timeout_ms": 5000, "max_call_duration_s": 90}))),
            200,
        )
        .await;
    let path = format!("/v1/channels/{}", id(&chn));
    let same = json!({"name": "agent", "target": "https://agent.example.com/turn", "integration_id": null,
                      "headers": null, "turn_timeout_ms": 5000, "max_call_duration_s": 90});
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(same), 200).await;
    assert_eq!(got, chn, "nothing changed");
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, chn);
    assert_eq!(history(&s, &t.viewer, "channel", &id(&chn)).await.len(), 1, "nothing recorded");

    let int = s.expect(Method::POST, "/v1/integrations", &t.editor, Some(twilio(p, "tel")), 200).await;
    let path = format!("/v1/integrations/{}", id(&int));
    let same = json!({"name": "tel", "config": int["config"], "phone_numbers": int["phone_numbers"],
                      "credentials": null});
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(same), 200).await;
    assert_eq!(got, int, "nothing changed");
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, int);
    assert_eq!(history(&s, &t.viewer, "integration", &id(&int)).await.len(), 1, "nothing recorded");
}

/// An integration's phone numbers page newest first, each once, whatever
/// happens to the list between two pages: a number removed, one added,
/// the order or a label changed. Numbers registered together keep the
/// order given; the integration itself shows them in the order given.
#[tokio::test]
async fn phone_number_pages_are_newest_first_and_skip_nothing_when_the_list_changes() {
    let s = TestServer::start().await;
    let t = s.team("numbers").await;
    let number =
        |n: u32, label: &str| json!({"number": format!("+1415555{n:04}"), "label": label, "direction": "both"});
    let six: Vec<Value> = (200..206).map(|n| number(n, "")).collect();
    let made = s
        .expect(
            Method::POST,
            "/v1/integrations",
            &t.editor,
            Some(with(twilio(&t.project_id, "tel"), json!({"phone_numbers": six}))),
            200,
        )
        .await;
    let path = format!("/v1/integrations/{}", id(&made));
    let page = |cursor: Option<String>| {
        let url = match cursor {
            Some(c) => format!("{path}/phone-numbers?limit=2&cursor={c}"),
            None => format!("{path}/phone-numbers?limit=2"),
        };
        let s = &s;
        let key = t.viewer.clone();
        async move {
            let page = s.expect(Method::GET, &url, &key, None, 200).await;
            let numbers: Vec<String> = page["phone_numbers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["number"].as_str().unwrap().to_string())
                .collect();
            (numbers, page["next_cursor"].as_str().map(str::to_string))
        }
    };
    let (first, mut cursor) = page(None).await;
    assert_eq!(first, ["+14155550200", "+14155550201"], "registered together: in the order given");

    // Between two pages: the first number goes, the last moves to the
    // front with a new label, and a new one comes at the end.
    let changed = json!([
        number(205, "moved"),
        number(201, ""),
        number(202, ""),
        number(203, ""),
        number(204, ""),
        number(206, "new")
    ]);
    let after = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"phone_numbers": changed})), 200).await;
    assert_eq!(after["phone_numbers"], changed, "the integration shows them as given");
    let mut rest = Vec::new();
    while let Some(c) = cursor.take() {
        let (numbers, next) = page(Some(c)).await;
        rest.extend(numbers);
        cursor = next;
    }
    assert_eq!(rest, ["+14155550202", "+14155550203", "+14155550204", "+14155550205"], "nothing skipped or repeated");

    // From the start: the newest first, a kept number in its place with its
    // new label.
    let all = s.expect(Method::GET, &format!("{path}/phone-numbers"), &t.viewer, None, 200).await;
    assert_eq!(
        all["phone_numbers"],
        json!([
            number(206, "new"),
            number(201, ""),
            number(202, ""),
            number(203, ""),
            number(204, ""),
            number(205, "moved")
        ])
    );
}
