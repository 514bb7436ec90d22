//! Personas and scenarios, against the real server: who may do what, what
//! is refused (and with which code, naming which field), every evaluator
//! type, references to other projects' resources, versions, conflicts,
//! pages and activity.

mod common;

use common::{error_body, TestServer};
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
    })
}

fn persona(project_id: &str, name: &str) -> Value {
    json!({"project_id": project_id, "name": name})
}

/// A simulated scenario; `caller` is the `openai_compatible` integration
/// whose model plays the caller.
fn simulated(project_id: &str, caller: &str, name: &str) -> Value {
    json!({"project_id": project_id, "name": name, "mode": "simulated", "goal": "book a table for two",
           "integration_id": caller})
}

/// An `openai_compatible` integration in the project, to play callers.
async fn caller_llm(s: &TestServer, key: &str, project_id: &str) -> String {
    id(&create(s, "/v1/integrations", key, llm(project_id, "caller")).await)
}

fn scripted(project_id: &str, name: &str) -> Value {
    json!({
        "project_id": project_id,
        "name": name,
        "mode": "scripted",
        "steps": [{"say": "Hi, I'd like to book a table.", "expect": [{"type": "contains", "name": "asks", "text": "how many"}]}],
    })
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

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
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

// Access.

#[tokio::test]
async fn roles_decide_who_reads_and_changes_personas() {
    let s = TestServer::start().await;
    let t = s.team("persona roles").await;
    let p = &t.project_id;
    for (role, key, status) in [
        ("owner", &t.owner, 200),
        ("editor", &t.editor, 200),
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
    ] {
        let resp = s.send_json(Method::POST, "/v1/personas", key, Some(persona(p, role))).await;
        assert_eq!(resp.status().as_u16(), status, "create by {role}");
    }
    let per = id(&create(&s, "/v1/personas", &t.owner, persona(p, "caller")).await);
    let path = format!("/v1/personas/{per}");
    for (role, key) in t.all() {
        let expected = if role == "outsider" { 404 } else { 200 };
        let got = s.expect(Method::GET, &path, key, None, expected).await;
        if expected == 404 {
            assert_eq!(got["error_code"], "not_found");
        } else {
            assert_eq!(got["name"], "caller");
        }
        let listed = s.expect(Method::GET, &format!("/v1/personas?project_id={p}"), key, None, expected).await;
        if expected == 200 {
            assert_eq!(listed["personas"].as_array().unwrap().len(), 3, "{role}: {listed}");
        }
    }
    // Without a project filter, an outsider sees none of them.
    let listed = s.expect(Method::GET, "/v1/personas", &t.outsider, None, 200).await;
    assert_eq!(listed["personas"], json!([]));
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
}

#[tokio::test]
async fn roles_decide_who_reads_and_changes_scenarios() {
    let s = TestServer::start().await;
    let t = s.team("scenario roles").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    for (role, key, status) in [
        ("owner", &t.owner, 200),
        ("editor", &t.editor, 200),
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
    ] {
        let resp = s.send_json(Method::POST, "/v1/scenarios", key, Some(simulated(p, &caller, role))).await;
        assert_eq!(resp.status().as_u16(), status, "create by {role}");
    }
    let scn = id(&create(&s, "/v1/scenarios", &t.owner, scripted(p, "booking")).await);
    let path = format!("/v1/scenarios/{scn}");
    for (role, key) in t.all() {
        let expected = if role == "outsider" { 404 } else { 200 };
        let got = s.expect(Method::GET, &path, key, None, expected).await;
        if expected == 200 {
            assert_eq!(got["name"], "booking");
        }
        let listed = s.expect(Method::GET, &format!("/v1/scenarios?project_id={p}"), key, None, expected).await;
        if expected == 200 {
            assert_eq!(listed["scenarios"].as_array().unwrap().len(), 3, "{role}: {listed}");
        }
    }
    let listed = s.expect(Method::GET, "/v1/scenarios", &t.outsider, None, 200).await;
    assert_eq!(listed["scenarios"], json!([]));
    let mut version = 1;
    for (role, key, status) in [
        ("reviewer", &t.reviewer, 403),
        ("viewer", &t.viewer, 403),
        ("outsider", &t.outsider, 404),
        ("editor", &t.editor, 200),
        ("owner", &t.owner, 200),
    ] {
        let body = with(scripted(p, &format!("replaced by {role}")), json!({"project_id": null}));
        let resp = s.send_json(Method::PUT, &path, key, Some(body)).await;
        assert_eq!(resp.status().as_u16(), status, "replace by {role}");
        if status == 200 {
            version += 1;
        }
    }
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await["version"], version);
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
}

// Personas: input.

#[tokio::test]
async fn persona_defaults_and_every_field_round_trip() {
    let s = TestServer::start().await;
    let t = s.team("persona fields").await;
    let p = &t.project_id;
    let minimal = create(&s, "/v1/personas", &t.editor, persona(p, "plain")).await;
    assert!(minimal["id"].as_str().unwrap().starts_with("per_"));
    assert_eq!(minimal["project_id"], json!(p));
    for (field, value) in [
        ("description", json!("")),
        ("prompt", json!("")),
        ("language", json!("en-US")),
        ("accent", json!(null)),
        ("gender", json!(null)),
        ("voice", json!({"provider": null, "voice_id": null, "speed": 1.0})),
        ("background_noise", json!("none")),
        ("background_noise_volume", json!(0.0)),
        ("interruption_level", json!("none")),
        ("verbosity", json!("medium")),
        ("patience", json!("medium")),
        ("tags", json!([])),
    ] {
        assert_eq!(minimal[field], value, "default {field}");
    }
    let full = json!({
        "project_id": p,
        "name": "Impatient Glaswegian",
        "description": "A regular who wants it quick.",
        "prompt": "You are in a hurry. Interrupt when the agent rambles.",
        "language": "en-GB",
        "accent": "Scottish",
        "gender": "female",
        "voice": {"provider": "elevenlabs", "voice_id": "Rachel", "speed": 1.25},
        "background_noise": "street",
        "background_noise_volume": 0.4,
        "interruption_level": "high",
        "verbosity": "low",
        "patience": "low",
        "tags": ["uk", "hurry", "uk"],
    });
    let made = create(&s, "/v1/personas", &t.editor, full.clone()).await;
    for (k, v) in full.as_object().unwrap() {
        if k != "tags" {
            assert_eq!(&made[k], v, "{k}");
        }
    }
    // Duplicate tags are dropped, order kept.
    assert_eq!(made["tags"], json!(["uk", "hurry"]));
    assert_eq!(made["created_at"], made["updated_at"]);
    let got = s.expect(Method::GET, &format!("/v1/personas/{}", id(&made)), &t.viewer, None, 200).await;
    assert_eq!(got, made);
}

#[tokio::test]
async fn persona_input_is_checked_field_by_field() {
    let s = TestServer::start().await;
    let t = s.team("persona validation").await;
    let p = &t.project_id;
    let before = activity_count(&s, &t.owner, p).await;
    let long = |n: usize| "x".repeat(n);
    let voice = |speed: f64| json!({"provider": null, "voice_id": null, "speed": speed});
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"name": ""}), "invalid_name", "name"),
        (json!({"name": "   "}), "invalid_name", "name"),
        (json!({"name": long(101)}), "invalid_name", "name"),
        (json!({"name": "tab\u{7}bell"}), "invalid_name", "name"),
        (json!({"description": long(2001)}), "invalid_description", "description"),
        (json!({"description": "bell\u{7}"}), "invalid_description", "description"),
        (json!({"prompt": long(20_001)}), "invalid_prompt", "prompt"),
        (json!({"language": "english"}), "invalid_language", "language"),
        (json!({"language": "en_US"}), "invalid_language", "language"),
        (json!({"language": "e"}), "invalid_language", "language"),
        (json!({"accent": " "}), "invalid_accent", "accent"),
        (json!({"accent": long(101)}), "invalid_accent", "accent"),
        (json!({"gender": ""}), "invalid_gender", "gender"),
        (json!({"gender": long(101)}), "invalid_gender", "gender"),
        (json!({"voice": voice(0.49)}), "invalid_speed", "voice.speed"),
        (json!({"voice": voice(2.01)}), "invalid_speed", "voice.speed"),
        (json!({"voice": {"provider": " ", "voice_id": null, "speed": 1.0}}), "invalid_provider", "voice.provider"),
        (
            json!({"voice": {"provider": null, "voice_id": long(101), "speed": 1.0}}),
            "invalid_voice_id",
            "voice.voice_id",
        ),
        (json!({"voice": {"provider": null, "voice_id": null}}), "invalid_speed", "speed"),
        (json!({"background_noise": "jungle"}), "invalid_background_noise", "background_noise"),
        (json!({"background_noise_volume": -0.1}), "invalid_background_noise_volume", "background_noise_volume"),
        (json!({"background_noise_volume": 1.5}), "invalid_background_noise_volume", "background_noise_volume"),
        (json!({"interruption_level": "always"}), "invalid_interruption_level", "interruption_level"),
        (json!({"verbosity": "chatty"}), "invalid_verbosity", "verbosity"),
        (json!({"patience": "none"}), "invalid_patience", "patience"),
        (json!({"tags": [" "]}), "invalid_tags", "tags[0]"),
        (json!({"tags": ["ok", long(101)]}), "invalid_tags", "tags[1]"),
        (json!({"tags": (0..51).map(|i| format!("t{i}")).collect::<Vec<_>>()}), "invalid_tags", "tags"),
        (json!({"project_id": null}), "invalid_project_id", "project_id"),
        (json!({"name": null}), "invalid_name", "name"),
    ];
    for (extra, code, field) in &cases {
        refused(&s, Method::POST, "/v1/personas", &t.editor, with(persona(p, "x"), extra.clone()), code, field).await;
    }
    // The same rules on PATCH, plus: fields other than accent and gender
    // cannot be null.
    let per = id(&create(&s, "/v1/personas", &t.editor, persona(p, "target")).await);
    let path = format!("/v1/personas/{per}");
    let after_create = activity_count(&s, &t.owner, p).await;
    for (extra, code, field) in &cases {
        if extra.get("project_id").is_some() || extra.get("name").is_some_and(Value::is_null) {
            continue;
        }
        refused(&s, Method::PATCH, &path, &t.editor, extra.clone(), code, field).await;
    }
    for field in [
        "name",
        "description",
        "prompt",
        "language",
        "voice",
        "background_noise",
        "background_noise_volume",
        "interruption_level",
        "verbosity",
        "patience",
        "tags",
    ] {
        refused(&s, Method::PATCH, &path, &t.editor, json!({ field: null }), &format!("invalid_{field}"), field).await;
    }
    refused(&s, Method::PATCH, &path, &t.editor, json!({"project_id": p}), "invalid_body", "project_id").await;
    // Nothing failed was written.
    assert_eq!(before + 1, after_create);
    assert_eq!(activity_count(&s, &t.owner, p).await, after_create);
    let got = s.expect(Method::GET, &path, &t.editor, None, 200).await;
    assert_eq!(got["name"], "target");
    assert_eq!(got["updated_at"], got["created_at"]);
    // The boundaries themselves are accepted.
    create(
        &s,
        "/v1/personas",
        &t.editor,
        with(
            persona(p, &long(100)),
            json!({"description": long(2000), "voice": voice(0.5), "background_noise_volume": 1.0, "accent": long(100),
                   "tags": (0..50).map(|i| format!("{i:0>100}")).collect::<Vec<_>>()}),
        ),
    )
    .await;
    s.expect(Method::PATCH, &path, &t.editor, Some(json!({"voice": voice(2.0), "background_noise_volume": 0.0})), 200)
        .await;
}

#[tokio::test]
async fn persona_patch_changes_only_what_is_sent() {
    let s = TestServer::start().await;
    let t = s.team("persona patch").await;
    let p = &t.project_id;
    let made = create(
        &s,
        "/v1/personas",
        &t.editor,
        with(
            persona(p, "caller"),
            json!({"accent": "Irish", "gender": "male", "tags": ["a", "b"], "verbosity": "high",
                   "voice": {"provider": "azure", "voice_id": "en-IE-ConnorNeural", "speed": 1.1}}),
        ),
    )
    .await;
    let path = format!("/v1/personas/{}", id(&made));
    // Absent fields stay; given ones change.
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"description": "new"})), 200).await;
    assert_eq!(got["description"], "new");
    for field in ["name", "accent", "gender", "tags", "verbosity", "voice", "language", "created_at"] {
        assert_eq!(got[field], made[field], "{field} kept");
    }
    assert_ne!(got["updated_at"], made["updated_at"]);
    // null clears accent; gender, absent, stays.
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"accent": null})), 200).await;
    assert_eq!((got["accent"].clone(), got["gender"].clone()), (json!(null), json!("male")));
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"gender": null, "accent": "Welsh"})), 200).await;
    assert_eq!((got["accent"].clone(), got["gender"].clone()), (json!("Welsh"), json!(null)));
    // Tags: absent keeps them, a list replaces them, [] removes them.
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"name": "renamed"})), 200).await;
    assert_eq!((got["name"].clone(), got["tags"].clone()), (json!("renamed"), json!(["a", "b"])));
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"tags": ["c"]})), 200).await;
    assert_eq!(got["tags"], json!(["c"]));
    let got = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"tags": []})), 200).await;
    assert_eq!(got["tags"], json!([]));
    // The voice is replaced as a whole.
    let got = s
        .expect(
            Method::PATCH,
            &path,
            &t.editor,
            Some(json!({"voice": {"provider": null, "voice_id": null, "speed": 0.8}})),
            200,
        )
        .await;
    assert_eq!(got["voice"], json!({"provider": null, "voice_id": null, "speed": 0.8}));
    // A PATCH that changes nothing (empty, or the same values) writes nothing.
    let records = history(&s, &t.viewer, "persona", &id(&made)).await.len();
    let same = s.expect(Method::PATCH, &path, &t.editor, Some(json!({})), 200).await;
    assert_eq!(same, got);
    let same = s.expect(Method::PATCH, &path, &t.editor, Some(json!({"name": "renamed", "tags": []})), 200).await;
    assert_eq!(same, got);
    assert_eq!(history(&s, &t.viewer, "persona", &id(&made)).await.len(), records);
    // A missing persona is a 404 naming it.
    let (status, e) =
        error_body(s.send_json(Method::PATCH, "/v1/personas/per_missing", &t.editor, Some(json!({"name": "x"}))).await)
            .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (404, "not_found"));
    assert!(e["message"].as_str().unwrap().contains("per_missing"));
}

// Scenarios: input.

#[tokio::test]
async fn scenario_defaults_and_fields_round_trip() {
    let s = TestServer::start().await;
    let t = s.team("scenario fields").await;
    let p = &t.project_id;
    // The project's max_call_duration_s is the default max_duration_s.
    s.expect(
        Method::PUT,
        &format!("/v1/projects/{p}"),
        &t.owner,
        Some(json!({"name": "scenario fields", "settings": {"max_call_duration_s": 420, "default_concurrency": 5}})),
        200,
    )
    .await;
    let caller = caller_llm(&s, &t.owner, p).await;
    let made = create(&s, "/v1/scenarios", &t.editor, simulated(p, &caller, "plain")).await;
    assert!(made["id"].as_str().unwrap().starts_with("scn_"));
    for (field, value) in [
        ("mode", json!("simulated")),
        ("goal", json!("book a table for two")),
        ("description", json!("")),
        ("first_message", json!(null)),
        ("steps", json!([])),
        ("success_criteria", json!([])),
        ("default_persona_id", json!(null)),
        ("max_turns", json!(20)),
        ("max_duration_s", json!(420)),
        ("tags", json!([])),
        ("version", json!(1)),
    ] {
        assert_eq!(made[field], value, "default {field}");
    }
    let per = id(&create(&s, "/v1/personas", &t.editor, persona(p, "caller")).await);
    let full = json!({
        "project_id": p,
        "name": "Book a table",
        "description": "The happy path.",
        "mode": "scripted",
        "first_message": "Hello?",
        "steps": [
            {"say": "I'd like a table for two.", "expect": [{"type": "contains", "name": "asks time", "text": "what time", "case_sensitive": false, "critical": true}]},
            {"say": "Eight o'clock.", "expect": []},
        ],
        "goal": "a booking",
        "success_criteria": [{"type": "agent_ended_call", "name": "hangs up", "critical": false}],
        "default_persona_id": per,
        "max_turns": 500,
        "max_duration_s": 3600,
        "tags": ["smoke"],
    });
    let made = create(&s, "/v1/scenarios", &t.editor, full.clone()).await;
    for (k, v) in full.as_object().unwrap() {
        assert_eq!(&made[k], v, "{k}");
    }
    assert_eq!(made["version"], 1);
    let got = s.expect(Method::GET, &format!("/v1/scenarios/{}", id(&made)), &t.viewer, None, 200).await;
    assert_eq!(got, made);
}

#[tokio::test]
async fn scenario_input_is_checked_field_by_field() {
    let s = TestServer::start().await;
    let t = s.team("scenario validation").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let before = activity_count(&s, &t.owner, p).await;
    let long = |n: usize| "x".repeat(n);
    let step = |say: &str| json!({"say": say, "expect": []});
    let base = scripted(p, "x");
    let sim = simulated(p, &caller, "x");
    let cases: Vec<(Value, &str, &str)> = vec![
        (with(base.clone(), json!({"name": " "})), "invalid_name", "name"),
        (with(base.clone(), json!({"name": long(101)})), "invalid_name", "name"),
        (with(base.clone(), json!({"description": long(2001)})), "invalid_description", "description"),
        (with(base.clone(), json!({"mode": "improvised"})), "invalid_mode", "mode"),
        (with(base.clone(), json!({"mode": null})), "invalid_mode", "mode"),
        // Scripted: at least one step, each saying something.
        (with(base.clone(), json!({"steps": null})), "invalid_steps", "steps"),
        (with(base.clone(), json!({"steps": []})), "invalid_steps", "steps"),
        (with(base.clone(), json!({"steps": [step("hi"), step("  ")]})), "invalid_say", "steps[1].say"),
        (with(base.clone(), json!({"steps": [step("")]})), "invalid_say", "steps[0].say"),
        (with(base.clone(), json!({"steps": [step(&long(20_001))]})), "invalid_say", "steps[0].say"),
        (with(base.clone(), json!({"steps": [{"say": "hi"}]})), "invalid_expect", "expect"),
        (
            with(base.clone(), json!({"steps": (0..201).map(|_| step("hi")).collect::<Vec<_>>()})),
            "invalid_steps",
            "steps",
        ),
        // Simulated: a goal, and no steps.
        (with(sim.clone(), json!({"goal": null})), "invalid_goal", "goal"),
        (with(sim.clone(), json!({"goal": "  "})), "invalid_goal", "goal"),
        (with(sim.clone(), json!({"goal": long(20_001)})), "invalid_goal", "goal"),
        (with(sim.clone(), json!({"steps": [step("hi")]})), "invalid_steps", "steps"),
        (with(sim.clone(), json!({"first_message": " "})), "invalid_first_message", "first_message"),
        (with(sim.clone(), json!({"first_message": long(20_001)})), "invalid_first_message", "first_message"),
        (with(sim.clone(), json!({"max_turns": 0})), "invalid_max_turns", "max_turns"),
        (with(sim.clone(), json!({"max_turns": 501})), "invalid_max_turns", "max_turns"),
        (with(sim.clone(), json!({"max_duration_s": 0})), "invalid_max_duration_s", "max_duration_s"),
        (with(sim.clone(), json!({"max_duration_s": 3601})), "invalid_max_duration_s", "max_duration_s"),
        (with(sim.clone(), json!({"tags": ["ok", ""]})), "invalid_tags", "tags[1]"),
        (with(sim.clone(), json!({"tags": ["ok", long(101)]})), "invalid_tags", "tags[1]"),
        (with(sim.clone(), json!({"version": 7})), "invalid_body", "version"),
        (
            with(sim.clone(), json!({"default_persona_id": "per_missing"})),
            "invalid_default_persona_id",
            "default_persona_id",
        ),
    ];
    for (body, code, field) in &cases {
        refused(&s, Method::POST, "/v1/scenarios", &t.editor, body.clone(), code, field).await;
    }
    // The same rules on PUT; a failed PUT changes nothing (not the version).
    let scn = create(&s, "/v1/scenarios", &t.editor, scripted(p, "target")).await;
    let path = format!("/v1/scenarios/{}", id(&scn));
    for (body, code, field) in &cases {
        let body = with(body.clone(), json!({"project_id": null}));
        refused(&s, Method::PUT, &path, &t.editor, body, code, field).await;
    }
    refused(&s, Method::PUT, &path, &t.editor, scripted(p, "moved"), "invalid_body", "project_id").await;
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, scn);
    assert_eq!(activity_count(&s, &t.owner, p).await, before + 1);
    // A missing scenario is a 404 whatever the body.
    let (status, e) = error_body(
        s.send_json(
            Method::PUT,
            "/v1/scenarios/scn_missing",
            &t.editor,
            Some(with(scripted(p, "x"), json!({"project_id": null}))),
        )
        .await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (404, "not_found"));
}

/// One valid example of every evaluator type, and what is refused about
/// each, in `success_criteria` and in a step's `expect`.
#[tokio::test]
async fn every_evaluator_type_is_checked() {
    let s = TestServer::start().await;
    let t = s.team("evaluators").await;
    let p = &t.project_id;
    let judge = id(&create(&s, "/v1/integrations", &t.owner, llm(p, "judge")).await);
    let phone = id(&create(&s, "/v1/integrations", &t.owner, twilio(p, "phone")).await);
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    let foreign = id(&create(&s, "/v1/integrations", &t.owner, llm(&elsewhere, "their judge")).await);

    let valid = json!([
        {"type": "contains", "name": "greets", "text": "hello"},
        {"type": "not_contains", "name": "no swearing", "text": "damn", "case_sensitive": true},
        {"type": "regex", "name": "a time", "pattern": "\\d{1,2}:\\d{2}"},
        {"type": "max_latency_ms", "name": "fast", "percentile": "p95", "ms": 1200},
        {"type": "max_turns", "name": "short", "turns": 12},
        {"type": "agent_ended_call", "name": "hangs up", "critical": false},
        {"type": "tool_called", "name": "books", "tool": "book_table", "arguments": {"party": 2}},
        {"type": "llm_judge", "name": "polite", "integration_id": judge, "prompt": "Was the agent polite?"},
    ]);
    let made = create(
        &s,
        "/v1/scenarios",
        &t.editor,
        with(simulated(p, &judge, "all types"), json!({"success_criteria": valid})),
    )
    .await;
    // Each comes back as given, defaults filled in.
    let back = made["success_criteria"].as_array().unwrap();
    assert_eq!(back.len(), 8);
    assert_eq!(
        back[0],
        json!({"type": "contains", "name": "greets", "text": "hello", "case_sensitive": false, "critical": true})
    );
    assert_eq!(back[5]["critical"], false);
    assert_eq!(back[6]["arguments"], json!({"party": 2}));
    assert_eq!(back[7]["integration_id"], json!(judge));
    let in_step = create(
        &s,
        "/v1/scenarios",
        &t.editor,
        with(scripted(p, "all types in a step"), json!({"steps": [{"say": "hi", "expect": valid}]})),
    )
    .await;
    assert_eq!(in_step["steps"][0]["expect"], made["success_criteria"]);
    // The spec's limits are accepted (characters, not bytes).
    let at_limits = json!([
        {"type": "regex", "name": "long", "pattern": "é".repeat(2000), "critical": true},
        {"type": "max_latency_ms", "name": "slowest", "percentile": "max", "ms": 600_000, "critical": true},
        {"type": "max_turns", "name": "longest", "turns": 1000, "critical": true},
        {"type": "tool_called", "name": "long tool", "tool": "t".repeat(200), "critical": true},
    ]);
    let body = with(simulated(p, &judge, "at the limits"), json!({"success_criteria": at_limits}));
    assert_eq!(create(&s, "/v1/scenarios", &t.editor, body).await["success_criteria"], at_limits);

    let judge_at =
        |integration: &str| json!({"type": "llm_judge", "name": "j", "integration_id": integration, "prompt": "ok?"});
    // (evaluator, code, what the message names after the list's field): a
    // value the wire type refuses inside an element is named as one the
    // domain refuses, by its field.
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"type": "sentiment", "name": "a"}), "invalid_type", "[0].type"),
        (json!({"name": "a", "text": "hi"}), "invalid_type", "type"),
        (json!({"type": "contains", "name": "a"}), "invalid_text", "text"),
        (json!({"type": "contains", "text": "hi"}), "invalid_name", "name"),
        (json!({"type": "contains", "name": "a", "text": " "}), "invalid_text", "[0].text"),
        (json!({"type": "contains", "name": " ", "text": "hi"}), "invalid_name", "[0].name"),
        (json!({"type": "not_contains", "name": "a"}), "invalid_text", "text"),
        (json!({"type": "not_contains", "name": "a", "text": "\t"}), "invalid_text", "[0].text"),
        (json!({"type": "regex", "name": "a"}), "invalid_pattern", "pattern"),
        (json!({"type": "regex", "name": "a", "pattern": "(("}), "invalid_pattern", "[0].pattern"),
        (json!({"type": "regex", "name": "a", "pattern": "é".repeat(2001)}), "invalid_pattern", "[0].pattern"),
        (json!({"type": "max_latency_ms", "name": "a", "percentile": "p95"}), "invalid_ms", "ms"),
        (json!({"type": "max_latency_ms", "name": "a", "ms": 100}), "invalid_percentile", "percentile"),
        (
            json!({"type": "max_latency_ms", "name": "a", "percentile": "p42", "ms": 100}),
            "invalid_percentile",
            "[0].percentile",
        ),
        (json!({"type": "max_latency_ms", "name": "a", "percentile": "p50", "ms": 0}), "invalid_ms", "[0].ms"),
        (json!({"type": "max_latency_ms", "name": "a", "percentile": "max", "ms": 600_001}), "invalid_ms", "[0].ms"),
        (json!({"type": "max_turns", "name": "a"}), "invalid_turns", "turns"),
        (json!({"type": "max_turns", "name": "a", "turns": 0}), "invalid_turns", "[0].turns"),
        (json!({"type": "max_turns", "name": "a", "turns": 1001}), "invalid_turns", "[0].turns"),
        (json!({"type": "agent_ended_call"}), "invalid_name", "name"),
        (json!({"type": "tool_called", "name": "a"}), "invalid_tool", "tool"),
        (json!({"type": "tool_called", "name": "a", "tool": " "}), "invalid_tool", "[0].tool"),
        (json!({"type": "tool_called", "name": "a", "tool": "t".repeat(201)}), "invalid_tool", "[0].tool"),
        (json!({"type": "llm_judge", "name": "a", "prompt": "ok?"}), "invalid_integration_id", "integration_id"),
        (json!({"type": "llm_judge", "name": "a", "integration_id": judge}), "invalid_prompt", "prompt"),
        (
            json!({"type": "llm_judge", "name": "a", "integration_id": judge, "prompt": " "}),
            "invalid_prompt",
            "[0].prompt",
        ),
        (judge_at("int_missing"), "invalid_integration_id", "[0].integration_id"),
        (judge_at(&foreign), "invalid_integration_id", "[0].integration_id"),
        (judge_at(&phone), "invalid_integration_id", "[0].integration_id"),
    ];
    let before = activity_count(&s, &t.owner, p).await;
    let scn = id(&made);
    for (evaluator, code, names) in &cases {
        let criteria = json!([evaluator]);
        let body = with(simulated(p, &judge, "bad"), json!({"success_criteria": criteria}));
        // The message names the list (and, for a rule on a field, the field).
        let at = |list: &str| if names.starts_with('[') { format!("{list}{names}") } else { list.to_string() };
        refused(&s, Method::POST, "/v1/scenarios", &t.editor, body.clone(), code, &at("success_criteria")).await;
        refused(&s, Method::POST, "/v1/scenarios", &t.editor, body.clone(), code, names).await;
        // In a step's expect (the second step), the field is that step's.
        let steps = json!([{"say": "hi", "expect": []}, {"say": "again", "expect": criteria}]);
        let body = with(scripted(p, "bad"), json!({"steps": steps}));
        refused(&s, Method::POST, "/v1/scenarios", &t.editor, body.clone(), code, &at("steps[1].expect")).await;
        // And on PUT.
        let body = with(simulated(p, &judge, "bad"), json!({"success_criteria": criteria, "project_id": null}));
        refused(&s, Method::PUT, &format!("/v1/scenarios/{scn}"), &t.editor, body, code, names).await;
    }
    // The judge is named in the message, and why it cannot judge.
    for (integration, why) in [
        ("int_missing", "not an integration of this project"),
        (foreign.as_str(), "not an integration of this project"),
        (phone.as_str(), "twilio"),
    ] {
        let body = with(simulated(p, &judge, "bad"), json!({"success_criteria": [judge_at(integration)]}));
        let (_, e) = error_body(s.send_json(Method::POST, "/v1/scenarios", &t.editor, Some(body)).await).await;
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(integration) && message.contains(why), "{message}");
    }
    // Names are unique within one list, not across lists.
    let twice = json!([{"type": "agent_ended_call", "name": "x"}, {"type": "agent_ended_call", "name": "x"}]);
    refused(
        &s,
        Method::POST,
        "/v1/scenarios",
        &t.editor,
        with(simulated(p, &judge, "bad"), json!({"success_criteria": twice})),
        "invalid_name",
        "success_criteria[1].name",
    )
    .await;
    let once_each = json!({"steps": [{"say": "a", "expect": [{"type": "agent_ended_call", "name": "x"}]}],
                           "success_criteria": [{"type": "agent_ended_call", "name": "x"}]});
    create(&s, "/v1/scenarios", &t.editor, with(scripted(p, "same names"), once_each)).await;
    // More than 100 evaluators in one list.
    let many: Vec<Value> = (0..101).map(|i| json!({"type": "agent_ended_call", "name": format!("e{i}")})).collect();
    let (status, e) = error_body(
        s.send_json(
            Method::POST,
            "/v1/scenarios",
            &t.editor,
            Some(with(simulated(p, &judge, "many"), json!({"success_criteria": many}))),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
    assert!(e["message"].as_str().unwrap().contains("success_criteria"), "{e}");
    // Only the valid "same names" scenario was written.
    assert_eq!(activity_count(&s, &t.owner, p).await, before + 1);
}

#[tokio::test]
async fn references_must_be_in_the_same_project() {
    let s = TestServer::start().await;
    let t = s.team("references").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    let theirs = id(&create(&s, "/v1/personas", &t.owner, persona(&elsewhere, "theirs")).await);
    let ours = id(&create(&s, "/v1/personas", &t.owner, persona(p, "ours")).await);
    for missing in [theirs.as_str(), "per_missing", ""] {
        let body = with(simulated(p, &caller, "s"), json!({"default_persona_id": missing}));
        refused(&s, Method::POST, "/v1/scenarios", &t.editor, body, "invalid_default_persona_id", "default_persona_id")
            .await;
    }
    let scn =
        create(&s, "/v1/scenarios", &t.editor, with(simulated(p, &caller, "s"), json!({"default_persona_id": ours})))
            .await;
    assert_eq!(scn["default_persona_id"], json!(ours));
    let body = with(simulated(p, &caller, "s"), json!({"default_persona_id": theirs, "project_id": null}));
    refused(
        &s,
        Method::PUT,
        &format!("/v1/scenarios/{}", id(&scn)),
        &t.editor,
        body,
        "invalid_default_persona_id",
        "default_persona_id",
    )
    .await;
    // Creating in a project one is not a member of is a 404, whatever the body.
    let (status, _) = error_body(
        s.send_json(Method::POST, "/v1/scenarios", &t.editor, Some(simulated(&elsewhere, &caller, "s"))).await,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) =
        error_body(s.send_json(Method::POST, "/v1/personas", &t.editor, Some(persona(&elsewhere, "p"))).await).await;
    assert_eq!(status, 404);
}

// Versions and judges.

#[tokio::test]
async fn replacing_bumps_the_version_and_resets_what_is_left_out() {
    let s = TestServer::start().await;
    let t = s.team("versions").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let per = id(&create(&s, "/v1/personas", &t.editor, persona(p, "caller")).await);
    let first = create(
        &s,
        "/v1/scenarios",
        &t.editor,
        with(
            scripted(p, "v1"),
            json!({"description": "d", "first_message": "hi", "default_persona_id": per, "max_turns": 5,
                   "max_duration_s": 60, "tags": ["x"]}),
        ),
    )
    .await;
    assert_eq!(first["version"], 1);
    let path = format!("/v1/scenarios/{}", id(&first));
    let second = s
        .expect(
            Method::PUT,
            &path,
            &t.editor,
            Some(with(
                first.clone(),
                json!({
            "name": "v2", "id": null, "project_id": null, "version": null, "created_at": null, "updated_at": null,
            "goal": null, "first_message": "hello"}),
            )),
            200,
        )
        .await;
    assert_eq!(second["version"], 2);
    assert_eq!((second["name"].clone(), second["first_message"].clone()), (json!("v2"), json!("hello")));
    assert_eq!(second["default_persona_id"], json!(per));
    assert_eq!(second["created_at"], first["created_at"]);
    // Absent optional fields go back to their defaults.
    let third = s
        .expect(
            Method::PUT,
            &path,
            &t.editor,
            Some(json!({"name": "v3", "mode": "simulated", "goal": "g", "integration_id": caller})),
            200,
        )
        .await;
    assert_eq!(third["version"], 3);
    for (field, value) in [
        ("description", json!("")),
        ("first_message", json!(null)),
        ("steps", json!([])),
        ("default_persona_id", json!(null)),
        ("max_turns", json!(20)),
        ("max_duration_s", json!(600)),
        ("tags", json!([])),
        ("mode", json!("simulated")),
    ] {
        assert_eq!(third[field], value, "{field} reset");
    }
    assert_eq!(s.expect(Method::GET, &path, &t.viewer, None, 200).await, third);
    // The same body again is still a new version.
    let fourth = s
        .expect(
            Method::PUT,
            &path,
            &t.editor,
            Some(json!({"name": "v3", "mode": "simulated", "goal": "g", "integration_id": caller})),
            200,
        )
        .await;
    assert_eq!(fourth["version"], 4);
    // Each replace is one record, with the version change.
    let records = history(&s, &t.viewer, "scenario", &id(&first)).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["scenario.update", "scenario.update", "scenario.update", "scenario.create"]);
    assert_eq!(records[0]["changes"], json!({"version": {"from": 3, "to": 4}}));
    assert_eq!(records[2]["changes"]["version"], json!({"from": 1, "to": 2}));
    assert_eq!(records[2]["changes"]["name"], "v2");
    assert_eq!(records[2]["changes"]["first_message"], "hello");
    assert!(records[2]["changes"].get("description").is_none(), "unchanged fields are not recorded: {}", records[2]);
    assert_eq!(records[3]["changes"]["version"], 1);
}

/// Needs integrations (delete refuses a judge in use).
#[tokio::test]
async fn judges_are_recorded_and_replaced() {
    let s = TestServer::start().await;
    let t = s.team("judges").await;
    let p = &t.project_id;
    let a = id(&create(&s, "/v1/integrations", &t.owner, llm(p, "a")).await);
    let b = id(&create(&s, "/v1/integrations", &t.owner, llm(p, "b")).await);
    let judge = |i: &str, name: &str| json!({"type": "llm_judge", "name": name, "integration_id": i, "prompt": "ok?"});
    let scn = create(
        &s,
        "/v1/scenarios",
        &t.editor,
        with(scripted(p, "judged"), json!({"steps": [{"say": "hi", "expect": [judge(&a, "step judge")]}]})),
    )
    .await;
    let path = format!("/v1/scenarios/{}", id(&scn));
    let (status, e) =
        error_body(s.send_json(Method::DELETE, &format!("/v1/integrations/{a}"), &t.owner, None).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{e}");
    assert!(e["message"].as_str().unwrap().contains(&id(&scn)), "{e}");
    // After a replace, only the new judge is held.
    let body = json!({"name": "judged", "mode": "simulated", "goal": "g", "integration_id": b, "success_criteria": [judge(&b, "final")]});
    s.expect(Method::PUT, &path, &t.editor, Some(body), 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{a}"), &t.owner, None, 200).await;
    let (status, _) =
        error_body(s.send_json(Method::DELETE, &format!("/v1/integrations/{b}"), &t.owner, None).await).await;
    assert_eq!(status, 409);
    // Deleting the scenario lets the judge go.
    s.expect(Method::DELETE, &path, &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/integrations/{b}"), &t.owner, None, 200).await;
}

// Conflicts.

#[tokio::test]
async fn a_persona_a_scenario_defaults_to_is_in_use() {
    let s = TestServer::start().await;
    let t = s.team("persona in use").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let per = id(&create(&s, "/v1/personas", &t.editor, persona(p, "caller")).await);
    let scn = create(
        &s,
        "/v1/scenarios",
        &t.editor,
        with(simulated(p, &caller, "checkout flow"), json!({"default_persona_id": per})),
    )
    .await;
    let before = activity_count(&s, &t.owner, p).await;
    let (status, e) =
        error_body(s.send_json(Method::DELETE, &format!("/v1/personas/{per}"), &t.editor, None).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"));
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(&format!("scenario {} \"checkout flow\"", id(&scn))), "{message}");
    assert!(message.contains(&per), "{message}");
    assert_eq!(activity_count(&s, &t.owner, p).await, before);
    s.expect(Method::GET, &format!("/v1/personas/{per}"), &t.viewer, None, 200).await;
    // Once the scenario no longer names it, it goes.
    s.expect(
        Method::PUT,
        &format!("/v1/scenarios/{}", id(&scn)),
        &t.editor,
        Some(json!({"name": "checkout flow", "mode": "simulated", "goal": "g", "integration_id": caller})),
        200,
    )
    .await;
    s.expect(Method::DELETE, &format!("/v1/personas/{per}"), &t.editor, None, 200).await;
}

/// Needs channels and tests.
#[tokio::test]
async fn what_a_test_uses_is_in_use() {
    let s = TestServer::start().await;
    let t = s.team("test in use").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let ch = id(&create(
        &s,
        "/v1/channels",
        &t.editor,
        json!({"project_id": p, "name": "web", "kind": "http", "target": "https://agent.example.com/turn"}),
    )
    .await);
    let per = id(&create(&s, "/v1/personas", &t.editor, persona(p, "caller")).await);
    let scn = id(&create(&s, "/v1/scenarios", &t.editor, simulated(p, &caller, "booking")).await);
    let test = id(&create(
        &s,
        "/v1/tests",
        &t.editor,
        json!({"project_id": p, "name": "checkout flow", "channel_id": ch, "scenario_id": scn, "persona_ids": [per]}),
    )
    .await);
    let before = activity_count(&s, &t.owner, p).await;
    for (path, what) in [(format!("/v1/personas/{per}"), &per), (format!("/v1/scenarios/{scn}"), &scn)] {
        let (status, e) = error_body(s.send_json(Method::DELETE, &path, &t.editor, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{path}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("test {test} \"checkout flow\"")) && message.contains(what.as_str()),
            "{message}"
        );
    }
    assert_eq!(activity_count(&s, &t.owner, p).await, before);
    // A scenario a test uses can still be replaced (a new version).
    let replaced = s
        .expect(
            Method::PUT,
            &format!("/v1/scenarios/{scn}"),
            &t.editor,
            Some(json!({"name": "booking", "mode": "simulated", "goal": "g2", "integration_id": caller})),
            200,
        )
        .await;
    assert_eq!(replaced["version"], 2);
    s.expect(Method::DELETE, &format!("/v1/tests/{test}"), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/personas/{per}"), &t.editor, None, 200).await;
    s.expect(Method::DELETE, &format!("/v1/scenarios/{scn}"), &t.editor, None, 200).await;
}

/// A test naming no personas plays its scenario's default persona: a `PUT`
/// cannot take it away (as `POST` and `PATCH /tests` refuse a test without
/// anyone to call).
#[tokio::test]
async fn a_default_persona_a_test_plays_cannot_be_replaced_away() {
    let s = TestServer::start().await;
    let t = s.team("default in use").await;
    let p = &t.project_id;
    let ch = id(&create(
        &s,
        "/v1/channels",
        &t.editor,
        json!({"project_id": p, "name": "web", "kind": "http", "target": "https://agent.example.com/turn"}),
    )
    .await);
    let dana = id(&create(&s, "/v1/personas", &t.editor, persona(p, "Dana")).await);
    let lee = id(&create(&s, "/v1/personas", &t.editor, persona(p, "Lee")).await);
    let scn =
        id(&create(&s, "/v1/scenarios", &t.editor, with(scripted(p, "booking"), json!({"default_persona_id": dana})))
            .await);
    let test = id(&create(
        &s,
        "/v1/tests",
        &t.editor,
        json!({"project_id": p, "name": "plays the default", "channel_id": ch, "scenario_id": scn}),
    )
    .await);
    let path = format!("/v1/scenarios/{scn}");
    let without = with(scripted(p, "booking"), json!({"project_id": null}));
    let before = activity_count(&s, &t.owner, p).await;
    let (status, e) = error_body(s.send_json(Method::PUT, &path, &t.editor, Some(without.clone())).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "in_use"), "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(&format!("test {test} \"plays the default\"")) && message.contains("persona_ids"), "{e}");
    let kept = s.expect(Method::GET, &path, &t.viewer, None, 200).await;
    assert_eq!((&kept["default_persona_id"], &kept["version"]), (&json!(dana), &json!(1)));
    assert_eq!(activity_count(&s, &t.owner, p).await, before, "nothing recorded");

    // Another default is fine; so is none once the test names its personas.
    let other = with(without.clone(), json!({"default_persona_id": lee}));
    s.expect(Method::PUT, &path, &t.editor, Some(other), 200).await;
    s.expect(Method::PATCH, &format!("/v1/tests/{test}"), &t.editor, Some(json!({"persona_ids": [dana]})), 200).await;
    let replaced = s.expect(Method::PUT, &path, &t.editor, Some(without), 200).await;
    assert_eq!((&replaced["default_persona_id"], &replaced["version"]), (&Value::Null, &json!(3)));
}

// Lists.

async fn walk(s: &TestServer, key: &str, path: &str, list: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit=2&cursor={c}"),
            None => format!("{path}{sep}limit=2"),
        };
        let page = s.expect(Method::GET, &url, key, None, 200).await;
        let items = page[list].as_array().unwrap();
        assert!(items.len() <= 2, "{page}");
        seen.extend(items.iter().map(id));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    seen
}

#[tokio::test]
async fn pages_return_each_item_once_newest_first() {
    let s = TestServer::start().await;
    let t = s.team("pages").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    create(&s, "/v1/personas", &t.owner, persona(&elsewhere, "x")).await;
    create(&s, "/v1/scenarios", &t.owner, scripted(&elsewhere, "x")).await;
    let mut personas = Vec::new();
    let mut scenarios = Vec::new();
    for i in 0..5 {
        let tags = if i % 2 == 0 { json!(["even"]) } else { json!(["odd"]) };
        personas.push(id(&create(
            &s,
            "/v1/personas",
            &t.editor,
            with(persona(p, &format!("p{i}")), json!({"tags": tags})),
        )
        .await));
        let scn = if i < 3 { simulated(p, &caller, &format!("s{i}")) } else { scripted(p, &format!("s{i}")) };
        scenarios.push(id(&create(&s, "/v1/scenarios", &t.editor, with(scn, json!({"tags": tags}))).await));
    }
    personas.reverse();
    scenarios.reverse();
    // The viewer, who is only in this project, sees exactly its items.
    assert_eq!(walk(&s, &t.viewer, "/v1/personas", "personas").await, personas);
    assert_eq!(walk(&s, &t.viewer, &format!("/v1/personas?project_id={p}"), "personas").await, personas);
    assert_eq!(walk(&s, &t.viewer, "/v1/scenarios", "scenarios").await, scenarios);
    // The owner is in both projects: no filter shows both, the filter one.
    assert_eq!(walk(&s, &t.owner, "/v1/personas", "personas").await.len(), 6);
    assert_eq!(walk(&s, &t.owner, &format!("/v1/scenarios?project_id={p}"), "scenarios").await, scenarios);
    // Filters.
    // (Newest first: p4, p3, p2, p1, p0; s4 and s3 are scripted.)
    let even = vec![personas[0].clone(), personas[2].clone(), personas[4].clone()];
    assert_eq!(walk(&s, &t.viewer, "/v1/personas?tag=even", "personas").await, even);
    assert_eq!(
        walk(&s, &t.viewer, "/v1/scenarios?tag=odd", "scenarios").await,
        vec![scenarios[1].clone(), scenarios[3].clone()]
    );
    assert_eq!(walk(&s, &t.viewer, "/v1/scenarios?mode=scripted", "scenarios").await, scenarios[..2].to_vec());
    assert_eq!(
        walk(&s, &t.viewer, "/v1/scenarios?mode=simulated&tag=even", "scenarios").await,
        vec![scenarios[2].clone(), scenarios[4].clone()]
    );
    assert_eq!(walk(&s, &t.viewer, "/v1/personas?tag=none", "personas").await, Vec::<String>::new());
    // A project one is not in is a 404; a bad cursor a 400.
    for list in ["personas", "scenarios"] {
        let (status, _) =
            error_body(s.send_json(Method::GET, &format!("/v1/{list}?project_id={elsewhere}"), &t.viewer, None).await)
                .await;
        assert_eq!(status, 404);
        let (status, e) =
            error_body(s.send_json(Method::GET, &format!("/v1/{list}?cursor=!!"), &t.viewer, None).await).await;
        assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_cursor"));
    }
    // A limit is 1 to 200.
    let (status, e) = error_body(s.send_json(Method::GET, "/v1/personas?limit=1000", &t.viewer, None).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (400, "invalid_query"));
    let all = s.expect(Method::GET, "/v1/personas?limit=200", &t.viewer, None, 200).await;
    assert_eq!(all["personas"].as_array().unwrap().len(), 5);
    assert_eq!(all["next_cursor"], json!(null));
}

/// A scenario is up to a request body (1 MiB) in size: a page of 200 of
/// them was up to 200 MB to read, decode and write for one request. A page
/// ends before its `limit`, with a cursor, once its scenarios pass 8 MiB,
/// and page by page every scenario is listed once.
#[tokio::test]
async fn a_page_of_scenarios_ends_once_its_scenarios_pass_8_mib() {
    const PAGE_BYTES: usize = 8 << 20;
    let s = TestServer::start().await;
    let owner = s.key_for_user("big-scenarios@example.com").await;
    let project_id = s.create_project(&owner, "big scenarios").await;
    // ~960 KB each: 48 steps of 20,000 characters.
    let steps: Vec<Value> = (0..48).map(|_| json!({"say": "s".repeat(20_000), "expect": []})).collect();
    let mut made = Vec::new();
    for i in 0..12 {
        let scenario = with(scripted(&project_id, &format!("big {i}")), json!({"steps": steps}));
        made.insert(0, id(&create(&s, "/v1/scenarios", &owner, scenario).await));
    }
    for path in [format!("/v1/scenarios?project_id={project_id}&limit=200"), "/v1/scenarios?limit=200".to_string()] {
        let body = s.get(&path, &owner).await.text().await.unwrap();
        let page: Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<String> = page["scenarios"].as_array().unwrap().iter().map(id).collect();
        assert!(body.len() < PAGE_BYTES + (1 << 20), "{path}: a page of {} bytes, {} scenarios", body.len(), ids.len());
        assert!(!ids.is_empty() && ids.len() < made.len(), "{path}: {} scenarios", ids.len());
        assert_eq!(ids, made[..ids.len()], "{path}");
        assert!(page["next_cursor"].is_string(), "{path}: a page cut short has a next one");
        let all = common::items_of_pages(&s, &owner, &path, "scenarios").await;
        assert_eq!(all.iter().map(id).collect::<Vec<_>>(), made, "{path}: page by page");
    }
}

/// A persona is up to about 100 KB (a prompt of 20,000 characters of up
/// to 4 bytes each, and its description): a page of 200 was up to 20 MB.
/// A page ends before its `limit`, with a cursor, once its personas pass
/// 8 MiB, and page by page every persona is listed once.
#[tokio::test]
async fn a_page_of_personas_ends_once_its_personas_pass_8_mib() {
    const PAGE_BYTES: usize = 8 << 20;
    let s = TestServer::start().await;
    let owner = s.key_for_user("big-personas@example.com").await;
    let project_id = s.create_project(&owner, "big personas").await;
    // ~88 KB each: 20,000 and 2,000 characters of 4 bytes.
    let (prompt, description) = ("\u{1F600}".repeat(20_000), "\u{1F600}".repeat(2_000));
    let mut made = Vec::new();
    for i in 0..110 {
        let body =
            with(persona(&project_id, &format!("big {i}")), json!({"prompt": prompt, "description": description}));
        made.insert(0, id(&create(&s, "/v1/personas", &owner, body).await));
    }
    for path in [format!("/v1/personas?project_id={project_id}&limit=200"), "/v1/personas?limit=200".to_string()] {
        let body = s.get(&path, &owner).await.text().await.unwrap();
        let page: Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<String> = page["personas"].as_array().unwrap().iter().map(id).collect();
        assert!(body.len() < PAGE_BYTES + (1 << 20), "{path}: a page of {} bytes, {} personas", body.len(), ids.len());
        assert!(!ids.is_empty() && ids.len() < made.len(), "{path}: {} personas", ids.len());
        assert_eq!(ids, made[..ids.len()], "{path}");
        assert!(page["next_cursor"].is_string(), "{path}: a page cut short has a next one");
        let all = common::items_of_pages(&s, &owner, &path, "personas").await;
        assert_eq!(all.iter().map(id).collect::<Vec<_>>(), made, "{path}: page by page");
    }
}

// Activity.

#[tokio::test]
async fn each_change_is_recorded_once() {
    let s = TestServer::start().await;
    let t = s.team("activity").await;
    let p = &t.project_id;
    let caller = caller_llm(&s, &t.owner, p).await;
    let made = create(&s, "/v1/personas", &t.editor, with(persona(p, "caller"), json!({"accent": "Irish"}))).await;
    let per = id(&made);
    s.expect(
        Method::PATCH,
        &format!("/v1/personas/{per}"),
        &t.editor,
        Some(json!({"accent": null, "name": "caller 2", "verbosity": "medium"})),
        200,
    )
    .await;
    // Refused requests write nothing.
    s.expect(Method::PATCH, &format!("/v1/personas/{per}"), &t.viewer, Some(json!({"name": "no"})), 403).await;
    s.expect(Method::PATCH, &format!("/v1/personas/{per}"), &t.editor, Some(json!({"language": "xx_YY"})), 400).await;
    s.expect(Method::DELETE, &format!("/v1/personas/{per}"), &t.editor, None, 200).await;
    let records = history(&s, &t.viewer, "persona", &per).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["persona.delete", "persona.update", "persona.create"]);
    let create_record = &records[2];
    assert_eq!(create_record["resource_type"], "persona");
    assert_eq!(create_record["changes"]["name"], "caller");
    assert_eq!(create_record["changes"]["accent"], "Irish");
    assert_eq!(create_record["changes"]["language"], "en-US");
    // Only what changed (verbosity was already medium).
    assert_eq!(records[1]["changes"], json!({"accent": null, "name": "caller 2"}));
    assert_eq!(records[0]["changes"], json!({"deleted": true}));

    let scn = create(&s, "/v1/scenarios", &t.editor, simulated(p, &caller, "s")).await;
    let sid = id(&scn);
    s.expect(
        Method::PUT,
        &format!("/v1/scenarios/{sid}"),
        &t.editor,
        Some(json!({"name": "s", "mode": "simulated", "goal": "other", "integration_id": caller})),
        200,
    )
    .await;
    s.expect(
        Method::PUT,
        &format!("/v1/scenarios/{sid}"),
        &t.reviewer,
        Some(json!({"name": "s", "mode": "simulated", "goal": "x", "integration_id": caller})),
        403,
    )
    .await;
    s.expect(Method::DELETE, &format!("/v1/scenarios/{sid}"), &t.viewer, None, 403).await;
    s.expect(Method::DELETE, &format!("/v1/scenarios/{sid}"), &t.owner, None, 200).await;
    let records = history(&s, &t.viewer, "scenario", &sid).await;
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["scenario.delete", "scenario.update", "scenario.create"]);
    assert_eq!(records[2]["changes"]["goal"], "book a table for two");
    assert_eq!(records[2]["changes"]["mode"], "simulated");
    assert_eq!(records[1]["changes"], json!({"goal": "other", "version": {"from": 1, "to": 2}}));
    for r in &records {
        assert_eq!(r["project_id"], json!(p));
        assert_eq!(r["actor"]["credential"], "api_key");
    }
    // Only the six successful changes (and the team's member additions).
    let all = s.expect(Method::GET, &format!("/v1/activity?project_id={p}&limit=200"), &t.viewer, None, 200).await;
    let ours: Vec<&Value> = all["activity"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["resource_type"] == "persona" || r["resource_type"] == "scenario")
        .collect();
    assert_eq!(ours.len(), 6);
}

// Names.

/// The spec: `POST /personas` answers 409 when "a persona with this name
/// already exists in the project", and `PATCH` 409 on "a duplicate name",
/// as for channels and integrations.
#[tokio::test]
async fn persona_names_are_unique_within_a_project() {
    let s = TestServer::start().await;
    let t = s.team("persona names").await;
    let p = &t.project_id;
    let a = id(&create(&s, "/v1/personas", &t.editor, persona(p, "caller")).await);
    let b = id(&create(&s, "/v1/personas", &t.editor, persona(p, "other")).await);
    let (status, e) =
        error_body(s.send_json(Method::POST, "/v1/personas", &t.editor, Some(persona(p, "caller"))).await).await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"), "{e}");
    assert!(e["message"].as_str().unwrap().contains(&a), "{e}");
    let (status, e) = error_body(
        s.send_json(Method::PATCH, &format!("/v1/personas/{b}"), &t.editor, Some(json!({"name": "caller"}))).await,
    )
    .await;
    assert_eq!((status, e["error_code"].as_str().unwrap()), (409, "name_taken"), "{e}");
    // Its own name is no conflict; another project may reuse it.
    s.expect(Method::PATCH, &format!("/v1/personas/{a}"), &t.editor, Some(json!({"name": "caller"})), 200).await;
    let elsewhere = s.create_project(&t.owner, "elsewhere").await;
    create(&s, "/v1/personas", &t.owner, persona(&elsewhere, "caller")).await;
    // The refused rename changed nothing and recorded nothing; one persona is named so.
    assert_eq!(s.expect(Method::GET, &format!("/v1/personas/{b}"), &t.viewer, None, 200).await["name"], "other");
    assert_eq!(history(&s, &t.viewer, "persona", &b).await.len(), 1);
    let listed = s.expect(Method::GET, &format!("/v1/personas?project_id={p}"), &t.viewer, None, 200).await;
    assert_eq!(listed["personas"].as_array().unwrap().len(), 2);
}
