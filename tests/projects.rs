//! Projects and members, against the real server.

mod common;

use common::{error_body, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn roles_decide_what_members_may_do() {
    let s = TestServer::start().await;
    let t = s.team("roles").await;
    let p = format!("/v1/projects/{}", t.project_id);
    // Everyone in the project reads it, with their role; the outsider gets 404.
    for (role, key) in t.all() {
        let expected = if role == "outsider" { 404 } else { 200 };
        let body = s.expect(Method::GET, &p, key, None, expected).await;
        if expected == 200 {
            assert_eq!(body["role"], role);
        }
    }
    // Editors change the project; reviewers and viewers may not (403); the
    // outsider does not see it (404).
    for (role, key, status) in [
        ("viewer", &t.viewer, 403),
        ("reviewer", &t.reviewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
    ] {
        let resp = s.send_json(Method::PUT, &p, key, Some(json!({"name": format!("renamed by {role}")}))).await;
        assert_eq!(resp.status().as_u16(), status, "{role}");
    }
    // Only owners touch the webhook.
    let hook =
        json!({"name": "x", "webhook_url": "https://hooks.example.com/sparring", "webhook_secret": "whsec_123456"});
    let (status, body) = error_body(s.send_json(Method::PUT, &p, &t.editor, Some(hook.clone())).await).await;
    assert_eq!((status, body["error_code"].as_str().unwrap()), (403, "forbidden"));
    let project = s.expect(Method::PUT, &p, &t.owner, Some(hook), 200).await;
    assert_eq!(project["webhook_secret_configured"], true);
    assert!(!project.to_string().contains("whsec_123456"));
    // Members: owners manage them; others may not.
    let members = format!("{p}/members");
    let listed = s.expect(Method::GET, &members, &t.viewer, None, 200).await;
    assert_eq!(listed["members"].as_array().unwrap().len(), 4);
    for key in [&t.editor, &t.reviewer, &t.viewer] {
        let resp =
            s.send_json(Method::POST, &members, key, Some(json!({"email": "x@example.com", "role": "viewer"}))).await;
        assert_eq!(resp.status().as_u16(), 403);
    }
    // Only the owners delete the project.
    for key in [&t.editor, &t.reviewer, &t.viewer] {
        assert_eq!(s.send_json(Method::DELETE, &p, key, None).await.status().as_u16(), 403);
    }
    assert_eq!(s.send_json(Method::DELETE, &p, &t.outsider, None).await.status().as_u16(), 404);
    s.expect(Method::DELETE, &p, &t.owner, None, 200).await;
    assert_eq!(s.send_json(Method::GET, &p, &t.owner, None).await.status().as_u16(), 404);
}

#[tokio::test]
async fn a_project_keeps_an_owner() {
    let s = TestServer::start().await;
    let t = s.team("owners").await;
    let members = format!("/v1/projects/{}/members", t.project_id);
    let owner_id = s.expect(Method::GET, &members, &t.owner, None, 200).await["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "owner")
        .unwrap()["user_id"]
        .as_str()
        .unwrap()
        .to_string();
    for (method, body) in [(Method::PATCH, Some(json!({"role": "editor"}))), (Method::DELETE, None)] {
        let (status, e) = error_body(s.send_json(method, &format!("{members}/{owner_id}"), &t.owner, body).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "last_owner"));
    }
    // With a second owner, the first may step down.
    let editor_id = s.expect(Method::GET, &members, &t.owner, None, 200).await["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "editor")
        .unwrap()["user_id"]
        .as_str()
        .unwrap()
        .to_string();
    s.expect(Method::PATCH, &format!("{members}/{editor_id}"), &t.owner, Some(json!({"role": "owner"})), 200).await;
    // The first owner pays for the project's runs, and stays an owner (and a
    // member) until another owner takes billing over.
    let project = format!("/v1/projects/{}", t.project_id);
    assert_eq!(s.expect(Method::GET, &project, &t.editor, None, 200).await["billing_user_id"], owner_id.as_str());
    for (method, body) in [(Method::PATCH, Some(json!({"role": "viewer"}))), (Method::DELETE, None)] {
        let (status, e) = error_body(s.send_json(method, &format!("{members}/{owner_id}"), &t.owner, body).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "billing_owner"), "{e}");
    }
    let taken = s.expect(Method::POST, &format!("{project}/billing"), &t.editor, None, 200).await;
    assert_eq!(taken["billing_user_id"], editor_id.as_str(), "{taken}");
    s.expect(Method::PATCH, &format!("{members}/{owner_id}"), &t.owner, Some(json!({"role": "viewer"})), 200).await;
    // Each change is one record; giving someone the role they have changes
    // nothing and records nothing.
    let history = format!("/v1/activity?project_id={}&action=project_member.update", t.project_id);
    let before = s.expect(Method::GET, &history, &t.editor, None, 200).await["activity"].as_array().unwrap().len();
    assert_eq!(before, 2);
    let same = s
        .expect(Method::PATCH, &format!("{members}/{owner_id}"), &t.editor, Some(json!({"role": "viewer"})), 200)
        .await;
    assert_eq!(same["role"], "viewer");
    let after = s.expect(Method::GET, &history, &t.editor, None, 200).await["activity"].as_array().unwrap().len();
    assert_eq!(after, before, "a role given again is not a change");
    // Adding someone twice is a conflict; an unknown email or id a 404.
    let (status, e) = error_body(
        s.send_json(Method::POST, &members, &t.editor, Some(json!({"user_id": owner_id, "role": "viewer"}))).await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "already_member"));
    let (status, e) = error_body(
        s.send_json(Method::POST, &members, &t.editor, Some(json!({"email": "nobody@example.com", "role": "viewer"})))
            .await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (404, "not_found"));
    let unknown_id = json!({"user_id": "usr_00000000000000000000000000", "role": "viewer"});
    let (status, e2) = error_body(s.send_json(Method::POST, &members, &t.editor, Some(unknown_id)).await).await;
    assert_eq!((status, e2["error_code"].as_str().unwrap()), (404, "not_found"), "{e2}");
    // By id, a user one shares no project with is not found either, as an
    // id no one has: an id would tell their email back.
    let theirs = s.create_project(&t.outsider, "a stranger's").await;
    let listed = s.expect(Method::GET, &format!("/v1/projects/{theirs}/members"), &t.outsider, None, 200).await;
    let stranger = listed["members"][0]["user_id"].as_str().unwrap().to_string();
    let by_id = json!({"user_id": stranger, "role": "viewer"});
    let (status, e3) = error_body(s.send_json(Method::POST, &members, &t.editor, Some(by_id)).await).await;
    assert_eq!((status, e3["error_code"].as_str().unwrap()), (404, "not_found"), "{e3}");
    let unknown = e2["message"].as_str().unwrap().replace("usr_00000000000000000000000000", &stranger);
    assert_eq!(e3["message"], unknown.as_str(), "told apart from an id no one has");
    // By email, as anyone is added.
    let outsider_email = listed["members"][0]["email"].as_str().unwrap();
    let by_email = json!({"email": outsider_email, "role": "viewer"});
    assert_eq!(s.expect(Method::POST, &members, &t.editor, Some(by_email), 200).await["user_id"], stranger.as_str());
    // And how such a user comes to be: a server with API keys only has no
    // sign-in, and its users are made by the admin command.
    // The command is named whole: `--label` is required, and without it
    // the command the message gave was refused.
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("nobody@example.com"), "{message}");
    assert!(message.contains("`sparring admin create-key --user EMAIL --label LABEL`"), "{message}");
    // Something that is no address at all says so, by the rule the admin
    // command makes users by.
    for not_an_address in ["nobody", "@example.com", "no body@example.com"] {
        let body = json!({"email": not_an_address, "role": "viewer"});
        let (status, e) = error_body(s.send_json(Method::POST, &members, &t.editor, Some(body)).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_email"), "{not_an_address}");
        let message = e["message"].as_str().unwrap();
        assert!(!message.contains("sparring admin create-key"), "{not_an_address}: {message}");
    }
}

#[tokio::test]
async fn outsiders_never_see_a_project_in_lists() {
    let s = TestServer::start().await;
    let t = s.team("private").await;
    let listed = s.expect(Method::GET, "/v1/projects", &t.outsider, None, 200).await;
    assert_eq!(listed["projects"].as_array().unwrap().len(), 0);
    let listed = s.expect(Method::GET, "/v1/projects", &t.viewer, None, 200).await;
    assert_eq!(listed["projects"][0]["id"], t.project_id.as_str());
    let resp = s.send_json(Method::GET, &format!("/v1/activity?project_id={}", t.project_id), &t.outsider, None).await;
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["activity"].as_array().unwrap().len(), 0, "{body}");
}

#[tokio::test]
async fn validation_names_the_field() {
    let s = TestServer::start().await;
    let key = &s.admin_key;
    for (body, code) in [
        (json!({"name": "  "}), "invalid_name"),
        (json!({"name": "x".repeat(101)}), "invalid_name"),
        (json!({"name": "ok", "webhook_url": "ftp://x.example.com"}), "invalid_webhook_url"),
        (
            json!({"name": "ok", "settings": {"max_call_duration_s": 99999, "default_concurrency": 1}}),
            "invalid_max_call_duration_s",
        ),
        (json!({"name": "ok", "unknown": 1}), "invalid_body"),
    ] {
        let (status, e) = error_body(s.send_json(Method::POST, "/v1/projects", key, Some(body.clone())).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (400, code), "{body}: {e}");
    }
}

#[tokio::test]
async fn pages_return_every_project_once_while_others_are_created() {
    let s = TestServer::start().await;
    let key = s.key_for_user("pager@example.com").await;
    let mut before = Vec::new();
    for i in 0..12 {
        before.push(s.create_project(&key, &format!("p{i}")).await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut inserted = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/projects?limit=5&cursor={c}"),
            None => "/v1/projects?limit=5".to_string(),
        };
        let page = s.expect(Method::GET, &q, &key, None, 200).await;
        seen.extend(page["projects"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap().to_string()));
        // Newer projects appear between pages; they are before the cursor.
        s.create_project(&key, &format!("during {inserted}")).await;
        inserted += 1;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    before.reverse();
    assert_eq!(seen, before, "every project created before the first page, once, newest first");
    assert_eq!(inserted, 3);
}

/// A `PUT` that gives the project it already is changes nothing: its
/// `updated_at` ("time of the last change") stays and nothing is recorded.
#[tokio::test]
async fn a_put_giving_the_stored_project_changes_nothing() {
    let s = TestServer::start().await;
    let t = s.team("same project").await;
    let p = format!("/v1/projects/{}", t.project_id);
    let body = json!({"name": "same project", "description": "d", "webhook_url": "https://hooks.example.com/x",
                      "settings": {"max_call_duration_s": 120, "default_concurrency": 4}});
    let set = s.expect(Method::PUT, &p, &t.owner, Some(body.clone()), 200).await;
    let history = format!("/v1/activity/resource/project/{}", t.project_id);
    let records = s.expect(Method::GET, &history, &t.owner, None, 200).await["activity"].as_array().unwrap().len();
    let got = s.expect(Method::PUT, &p, &t.owner, Some(body), 200).await;
    assert_eq!(got, set, "nothing changed");
    assert_eq!(s.expect(Method::GET, &p, &t.owner, None, 200).await, set);
    let after = s.expect(Method::GET, &history, &t.owner, None, 200).await["activity"].as_array().unwrap().len();
    assert_eq!(after, records, "nothing recorded");
}

#[tokio::test]
async fn a_put_records_only_the_fields_it_changed() {
    let s = TestServer::start().await;
    let t = s.team("diffed").await;
    let p = format!("/v1/projects/{}", t.project_id);
    let body = json!({"name": "diffed", "description": "d", "webhook_url": "https://hooks.example.com/x",
                      "webhook_secret": "s3cret", "settings": {"max_call_duration_s": 120, "default_concurrency": 4}});
    s.expect(Method::PUT, &p, &t.owner, Some(body.clone()), 200).await;
    let latest = || async {
        let history = format!("/v1/activity/resource/project/{}?limit=1", t.project_id);
        s.expect(Method::GET, &history, &t.owner, None, 200).await["activity"][0].clone()
    };
    assert_eq!(latest().await["changes"]["webhook_secret"], "***");

    // A rename (the secret left out: kept) records the name alone.
    let mut put = body.clone();
    put.as_object_mut().unwrap().remove("webhook_secret");
    put["name"] = json!("diffed, renamed");
    s.expect(Method::PUT, &p, &t.owner, Some(put.clone()), 200).await;
    let record = latest().await;
    assert_eq!(record["changes"], json!({"name": "diffed, renamed"}), "{record}");
    // One setting: that setting alone.
    put["settings"]["default_concurrency"] = json!(8);
    s.expect(Method::PUT, &p, &t.owner, Some(put.clone()), 200).await;
    assert_eq!(latest().await["changes"], json!({"settings": {"default_concurrency": 8}}));
    // A secret given is a change, masked, even the same one.
    put["webhook_secret"] = json!("s3cret");
    s.expect(Method::PUT, &p, &t.owner, Some(put.clone()), 200).await;
    assert_eq!(latest().await["changes"], json!({"webhook_secret": "***"}));
    // Clearing it records the clearing; clearing none records nothing.
    put["webhook_secret"] = json!("");
    s.expect(Method::PUT, &p, &t.owner, Some(put.clone()), 200).await;
    let cleared = latest().await;
    assert_eq!(cleared["changes"], json!({"webhook_secret": null}));
    s.expect(Method::PUT, &p, &t.owner, Some(put), 200).await;
    assert_eq!(latest().await["id"], cleared["id"], "nothing recorded");

    // `null` is not a way to clear the secret (it was read as left out,
    // which keeps it): refused, and the secret stays as it was.
    let mut put = body.clone();
    s.expect(Method::PUT, &p, &t.owner, Some(put.clone()), 200).await;
    put["webhook_secret"] = Value::Null;
    let (status, error) = error_body(s.send_json(Method::PUT, &p, &t.owner, Some(put.clone())).await).await;
    assert_eq!((status, error["error_code"].as_str()), (400, Some("invalid_webhook_secret")), "{error}");
    let project = s.expect(Method::GET, &p, &t.owner, None, 200).await;
    assert_eq!(project["webhook_secret_configured"], true, "{project}");
    // The URL is nullable: `null` is no webhook, as leaving it out is.
    put["webhook_secret"] = json!("");
    put["webhook_url"] = Value::Null;
    let project = s.expect(Method::PUT, &p, &t.owner, Some(put), 200).await;
    assert_eq!((&project["webhook_url"], &project["webhook_secret_configured"]), (&Value::Null, &json!(false)));
}

/// A stored webhook secret signs only for the origin it was given with: a
/// move to another origin must give it again (or clear it); another path on
/// the same origin keeps it.
#[tokio::test]
async fn a_webhook_secret_does_not_follow_its_url_to_another_origin() {
    let s = TestServer::start().await;
    let t = s.team("moved hook").await;
    let p = format!("/v1/projects/{}", t.project_id);
    let set = json!({"name": "moved hook", "webhook_url": "https://hooks.example.com/a", "webhook_secret": "s3cret"});
    s.expect(Method::PUT, &p, &t.owner, Some(set), 200).await;
    let moved = json!({"name": "moved hook", "webhook_url": "https://elsewhere.example.net/a"});
    let (status, body) = error_body(s.send_json(Method::PUT, &p, &t.owner, Some(moved.clone())).await).await;
    assert_eq!((status, body["error_code"].as_str().unwrap()), (400, "invalid_webhook_secret"), "{body}");
    let kept = s.expect(Method::GET, &p, &t.owner, None, 200).await;
    assert_eq!(kept["webhook_url"], "https://hooks.example.com/a", "nothing changed");
    // Same origin, another path: kept.
    let path = json!({"name": "moved hook", "webhook_url": "https://hooks.example.com/b"});
    assert_eq!(s.expect(Method::PUT, &p, &t.owner, Some(path), 200).await["webhook_secret_configured"], true);
    // Given again, or cleared: the move goes through.
    let mut again = moved.clone();
    again["webhook_secret"] = json!("n3w");
    assert_eq!(s.expect(Method::PUT, &p, &t.owner, Some(again), 200).await["webhook_secret_configured"], true);
    let back = json!({"name": "moved hook", "webhook_url": "https://hooks.example.com/a", "webhook_secret": ""});
    assert_eq!(s.expect(Method::PUT, &p, &t.owner, Some(back), 200).await["webhook_secret_configured"], false);

    // A secret kept while the URL was cleared was set for no origin: a URL
    // set again, wherever it points, needs it given again too.
    let set = json!({"name": "moved hook", "webhook_url": "https://hooks.example.com/a", "webhook_secret": "s3cret"});
    s.expect(Method::PUT, &p, &t.owner, Some(set), 200).await;
    let cleared = s.expect(Method::PUT, &p, &t.owner, Some(json!({"name": "moved hook"})), 200).await;
    assert_eq!((&cleared["webhook_url"], &cleared["webhook_secret_configured"]), (&Value::Null, &json!(true)));
    for url in ["https://elsewhere.example.net/a", "https://hooks.example.com/a"] {
        let set_again = json!({"name": "moved hook", "webhook_url": url});
        let (status, body) = error_body(s.send_json(Method::PUT, &p, &t.owner, Some(set_again)).await).await;
        assert_eq!((status, body["error_code"].as_str().unwrap()), (400, "invalid_webhook_secret"), "{url}: {body}");
    }
    let with_secret =
        json!({"name": "moved hook", "webhook_url": "https://elsewhere.example.net/a", "webhook_secret": "n3w"});
    let project = s.expect(Method::PUT, &p, &t.owner, Some(with_secret), 200).await;
    assert_eq!(project["webhook_url"], "https://elsewhere.example.net/a");
}

/// Credits are charged to the project's owner, but only to an owner who
/// chose to pay: adding someone as an owner and stepping down does not
/// make them the payer. Only an owner takes billing over, for themselves.
#[tokio::test]
async fn no_one_is_made_to_pay_for_a_project_by_someone_else() {
    let s = TestServer::start().await;
    let mallory = s.key_for_user("mallory@example.com").await;
    let victim = s.key_for_user("victim@example.com").await;
    let project_id = s.create_project(&mallory, "on someone else's tab").await;
    let project = format!("/v1/projects/{project_id}");
    let members = format!("{project}/members");
    // The creator pays.
    let listed = s.expect(Method::GET, &members, &mallory, None, 200).await;
    let mallory_id = listed["members"][0]["user_id"].as_str().unwrap().to_string();
    assert_eq!(s.expect(Method::GET, &project, &mallory, None, 200).await["billing_user_id"], mallory_id.as_str());
    let added = s
        .expect(Method::POST, &members, &mallory, Some(json!({"email": "victim@example.com", "role": "owner"})), 200)
        .await;
    let victim_id = added["user_id"].as_str().unwrap().to_string();
    // The victim is an owner now, but the payer is still the one who chose
    // to be, who cannot step down or leave.
    assert_eq!(s.expect(Method::GET, &project, &victim, None, 200).await["billing_user_id"], mallory_id.as_str());
    for (method, body) in [(Method::PATCH, Some(json!({"role": "editor"}))), (Method::DELETE, None)] {
        for (by, who) in [(&mallory, "herself"), (&victim, "the other owner")] {
            let (status, e) =
                error_body(s.send_json(method.clone(), &format!("{members}/{mallory_id}"), by, body.clone()).await)
                    .await;
            assert_eq!((status, e["error_code"].as_str()), (409, Some("billing_owner")), "by {who}: {e}");
        }
    }
    // Nobody takes billing over for another: the call makes the caller pay.
    // Members below owner cannot, outsiders do not see the project.
    let editor = s.key_for_user("editor-of-tab@example.com").await;
    s.expect(
        Method::POST,
        &members,
        &mallory,
        Some(json!({"email": "editor-of-tab@example.com", "role": "editor"})),
        200,
    )
    .await;
    let outsider = s.key_for_user("outsider-of-tab@example.com").await;
    let billing = format!("{project}/billing");
    assert_eq!(s.send_json(Method::POST, &billing, &editor, None).await.status().as_u16(), 403);
    assert_eq!(s.send_json(Method::POST, &billing, &outsider, None).await.status().as_u16(), 404);
    // Taking over what one pays for already changes nothing.
    let history = format!("/v1/activity?project_id={project_id}&action=project.billing");
    let same = s.expect(Method::POST, &billing, &mallory, None, 200).await;
    assert_eq!(same["billing_user_id"], mallory_id.as_str());
    assert_eq!(s.expect(Method::GET, &history, &mallory, None, 200).await["activity"], json!([]));
    // The victim's own choice moves it, recorded, and frees the first payer.
    let taken = s.expect(Method::POST, &billing, &victim, None, 200).await;
    assert_eq!(taken["billing_user_id"], victim_id.as_str(), "{taken}");
    let records = s.expect(Method::GET, &history, &mallory, None, 200).await["activity"].clone();
    assert_eq!(records[0]["changes"], json!({"billing_user_id": {"from": mallory_id, "to": victim_id}}), "{records}");
    s.expect(Method::DELETE, &format!("{members}/{mallory_id}"), &mallory, None, 200).await;
}
