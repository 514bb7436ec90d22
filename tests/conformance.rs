//! The wire against the spec: every operation of `spec/openapi.json` (read
//! at run time), called against the real server as the owner of the data,
//! through the states its resources go through (a batch run queued, under
//! way, ended, cancelled or refused; results passed, failed and in error;
//! a calibration open, labelled blind and closed; webhook deliveries made and
//! failing), every request again as each role and as an outsider, and its
//! common error answers (401 without a key, 404 on an id that does not
//! exist, 400 on a bad body or query, 413 on a body too large), each answer
//! checked against what the operation documents:
//!
//! - its status is one the operation documents (the code, or its `4XX` /
//!   `5XX`, or `default`);
//! - its body validates against the schema documented for that status (the
//!   `jsonschema` crate, draft 7, formats asserted, over the spec's schemas
//!   converted by [`json_schema`]);
//! - it is JSON when JSON is documented, and the documented response headers
//!   that are `required` are present.
//!
//! Every request body the walk sends as valid is checked against the
//! operation's request schema first, so that an answer is never blamed on a
//! request the spec refuses. An operation the walk does not call fails the
//! test: a new one must be added to the walk.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::engine::{chat_llm, wait_for_end, Agent, Recorder};
use common::oidc::{jwks_of, sign, valid, Token, AUDIENCE, ISSUER_KEY};
use common::spec::{operations_of, spec, Operation};
use common::{missing_id, TestServer};
use reqwest::Method;
use serde_json::{json, Map, Value};
use sparring_impl::oidc::IssuerConfig;

/// Deliberate, documented departures of the wire from the spec, as
/// `(operation id, status, why)`: an answer of that operation with that
/// status is not checked. Empty: the wire is what the spec says.
const EXCEPTIONS: &[(&str, u16, &str)] = &[];

/// OpenAPI 3.0 schema object → JSON Schema (draft 7), for what this spec
/// uses:
/// - `nullable: true` → `anyOf: [the schema without it, {"type": "null"}]`
///   (OpenAPI 3.0: `null` is allowed too);
/// - `$ref: #/components/schemas/X` → `#/definitions/X` (the converted
///   components are the validated document's `definitions`);
/// - `format: int32` / `int64` → the range the format names, as
///   `minimum`/`maximum` (JSON Schema formats apply to strings only);
/// - a `$ref` with other keywords beside it (OpenAPI 3.0 ignores them, a
///   `nullable` among them) fails the test, rather than be read either way;
/// - an object schema with `properties` and no `additionalProperties` is
///   closed (`additionalProperties: false`) when `closed`: an answer holds the
///   documented fields only (request schemas say it themselves; the client is
///   generated from the spec with every object opened, so that it reads a
///   newer server's answers, which says this server's are closed);
/// - `discriminator` is dropped (an annotation: `oneOf` decides);
/// - every other keyword of the list below is the same in both; a keyword
///   outside it fails the test, so that the conversion is extended on
///   purpose rather than a keyword being read with another meaning.
fn json_schema(schema: &Value, closed: bool) -> Value {
    const SAME: &[&str] = &[
        "type",
        "description",
        "format",
        "required",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "uniqueItems",
        "pattern",
        "enum",
        "default",
        "title",
    ];
    let Value::Object(m) = schema else { panic!("not a schema object: {schema}") };
    assert!(
        !m.contains_key("$ref") || m.keys().all(|k| k == "$ref" || k == "description"),
        "keywords beside a $ref, which OpenAPI 3.0 ignores: {schema}"
    );
    let mut out = Map::new();
    for (k, v) in m {
        let converted = match k.as_str() {
            "nullable" | "discriminator" => continue,
            "$ref" => {
                let name = v.as_str().unwrap().strip_prefix("#/components/schemas/").expect("a component's $ref");
                json!(format!("#/definitions/{name}"))
            }
            "properties" => {
                Value::Object(v.as_object().unwrap().iter().map(|(p, s)| (p.clone(), json_schema(s, closed))).collect())
            }
            "items" | "not" => json_schema(v, closed),
            "additionalProperties" if v.is_object() => json_schema(v, closed),
            "additionalProperties" => v.clone(),
            "allOf" | "oneOf" | "anyOf" => {
                Value::Array(v.as_array().unwrap().iter().map(|s| json_schema(s, closed)).collect())
            }
            k if SAME.contains(&k) => v.clone(),
            other => panic!("the conversion does not cover the keyword {other:?}: {schema}"),
        };
        out.insert(k.clone(), converted);
    }
    let range = match m.get("format").and_then(Value::as_str) {
        Some("int32") => Some((i32::MIN as i64, i32::MAX as i64)),
        Some("int64") => Some((i64::MIN, i64::MAX)),
        _ => None,
    };
    if let Some((lo, hi)) = range {
        let min = out.get("minimum").and_then(Value::as_f64).map_or(lo as f64, |m| m.max(lo as f64));
        let max = out.get("maximum").and_then(Value::as_f64).map_or(hi as f64, |m| m.min(hi as f64));
        out.insert("minimum".into(), json!(min));
        out.insert("maximum".into(), json!(max));
    }
    if closed && out.contains_key("properties") && !out.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), json!(false));
    }
    if m.get("nullable") == Some(&json!(true)) {
        return json!({"anyOf": [Value::Object(out), {"type": "null"}]});
    }
    Value::Object(out)
}

/// What an operation documents for one status.
struct Documented {
    /// The `application/json` schema, converted; `None`: no body documented.
    schema: Option<Value>,
    /// Response headers documented as `required`.
    headers: Vec<String>,
}

/// A request as the walk sends it.
#[derive(Clone)]
enum Body {
    None,
    /// Valid for the operation (checked against its request schema).
    Json(Value),
    /// Anything, sent as JSON without the check: a bad body.
    Bad(Value),
    /// Bytes as they are, with this `content-type` (if any).
    Raw(Option<&'static str>, Vec<u8>),
}

/// One request the walk made that succeeded: the error answers are asked for
/// with it.
#[derive(Clone)]
struct Sent {
    params: Vec<String>,
    query: String,
    body: Body,
}

struct Walk<'a> {
    s: &'a TestServer,
    ops: BTreeMap<String, Operation>,
    /// `definitions` for responses (objects closed) and requests.
    answer_defs: Value,
    request_defs: Value,
    validators: HashMap<(String, bool), jsonschema::Validator>,
    /// The spec's `components.headers`, which responses name by `$ref`.
    header_defs: Value,
    /// Per operation, its first request answered 2xx.
    succeeded: BTreeMap<String, Sent>,
    /// Every request answered 2xx, in order, once each: what the others
    /// send again.
    done: Vec<(String, Sent)>,
    /// Per operation, the statuses it answered.
    answered: BTreeMap<String, BTreeSet<u16>>,
    failures: Vec<String>,
    checked: usize,
}

impl<'a> Walk<'a> {
    fn new(s: &'a TestServer) -> Walk<'a> {
        let spec = spec();
        let ops = operations_of(&spec).into_iter().map(|o| (o.id.clone(), o)).collect();
        let defs = |closed: bool| -> Value {
            let schemas = spec["components"]["schemas"].as_object().unwrap();
            Value::Object(schemas.iter().map(|(n, s)| (n.clone(), json_schema(s, closed))).collect())
        };
        Walk {
            s,
            ops,
            answer_defs: defs(true),
            request_defs: defs(false),
            validators: HashMap::new(),
            header_defs: spec["components"]["headers"].clone(),
            succeeded: BTreeMap::new(),
            done: Vec::new(),
            answered: BTreeMap::new(),
            failures: Vec::new(),
            checked: 0,
        }
    }

    fn op(&self, id: &str) -> &Operation {
        self.ops.get(id).unwrap_or_else(|| panic!("{id} is not an operation of the spec"))
    }

    /// What `op` documents for `status`: the code, its `4XX`/`5XX`, or
    /// `default`.
    fn documented<'b>(&'b self, op: &'b Operation, status: u16) -> Option<Documented> {
        let responses = &op.doc["responses"];
        let class = format!("{}XX", status / 100);
        let response = [status.to_string(), class, "default".to_string()].iter().find_map(|k| responses.get(k))?;
        assert!(response.get("$ref").is_none(), "{}: a response by $ref, which this file does not follow", op.id);
        let schema = response["content"].get("application/json").map(|c| json_schema(&c["schema"], true));
        let header = |d: &'b Value| match d.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let name = r.strip_prefix("#/components/headers/").unwrap_or_else(|| panic!("a header by {r}"));
                &self.header_defs[name]
            }
            None => d,
        };
        let headers = response["headers"]
            .as_object()
            .map(|h| h.iter().filter(|(_, d)| header(d)["required"] == true).map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        Some(Documented { schema, headers })
    }

    /// Validation errors of `value` against `schema` (converted), each with
    /// where in the value it is.
    fn errors(&mut self, schema: &Value, answer: bool, value: &Value) -> Vec<String> {
        let key = (schema.to_string(), answer);
        if !self.validators.contains_key(&key) {
            let defs = if answer { &self.answer_defs } else { &self.request_defs };
            let document = json!({"allOf": [schema], "definitions": defs});
            let validator = jsonschema::draft7::options()
                .should_validate_formats(true)
                .build(&document)
                .unwrap_or_else(|e| panic!("the schema {schema} does not compile: {e}"));
            self.validators.insert(key.clone(), validator);
        }
        self.validators[&key].iter_errors(value).map(|e| format!("at {:?}: {e}", e.instance_path().as_str())).collect()
    }

    /// Sends one request of `op_id` and checks the answer against the spec;
    /// returns its status and body (JSON, or the text as a string).
    async fn call(&mut self, op_id: &str, key: Option<&str>, params: &[&str], query: &str, body: Body) -> (u16, Value) {
        let headers: Vec<(&str, &str)> = key.map(|k| ("x-api-key", k)).into_iter().collect();
        self.call_with(op_id, &headers, params, query, body).await
    }

    /// [`Walk::call`] with these request headers (the credential among them).
    async fn call_with(
        &mut self,
        op_id: &str,
        request_headers: &[(&str, &str)],
        params: &[&str],
        query: &str,
        body: Body,
    ) -> (u16, Value) {
        let op = self.op(op_id);
        let (method, path) = (op.method.clone(), op.path_with(params));
        let url = format!("{path}{query}");
        if let Body::Json(v) = &body {
            let schema = &op.doc["requestBody"]["content"]["application/json"]["schema"];
            assert!(schema.is_object(), "{op_id} takes no JSON body");
            let schema = json_schema(schema, false);
            let errors = self.errors(&schema, false, v);
            assert!(errors.is_empty(), "{method} {url}: the walk's body is not one the spec takes: {errors:?}\n{v}");
        }
        let mut req = self.s.http.request(method.clone(), self.s.url(&url));
        for (name, value) in request_headers {
            req = req.header(*name, *value);
        }
        match &body {
            Body::None => {}
            Body::Json(v) | Body::Bad(v) => req = req.json(v),
            Body::Raw(content_type, bytes) => {
                if let Some(content_type) = content_type {
                    req = req.header("content-type", *content_type);
                }
                req = req.body(bytes.clone());
            }
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
        self.answered.entry(op_id.to_string()).or_default().insert(status);
        if (200..300).contains(&status) {
            let sent = Sent { params: params.iter().map(|p| p.to_string()).collect(), query: query.into(), body };
            let again = |(id, s): &(String, Sent)| id == op_id && s.params == sent.params && s.query == sent.query;
            if !self.done.iter().any(again) {
                self.done.push((op_id.to_string(), sent.clone()));
            }
            self.succeeded.entry(op_id.to_string()).or_insert(sent);
        }
        self.checked += 1;
        let what = format!("{method} {url} ({op_id}) answered {status}");
        if let Some((_, _, why)) = EXCEPTIONS.iter().find(|(id, st, _)| *id == op_id && *st == status) {
            eprintln!("{what}: not checked, {why}");
            return (status, value);
        }
        let op = self.op(op_id);
        let Some(documented) = self.documented(op, status) else {
            let listed: Vec<&String> = op.doc["responses"].as_object().unwrap().keys().collect();
            self.failures.push(format!("{what}, a status it does not document ({listed:?}): {text}"));
            return (status, value);
        };
        for name in &documented.headers {
            if !headers.contains_key(name.as_str()) {
                self.failures.push(format!("{what} without its required header {name}"));
            }
        }
        match &documented.schema {
            Some(schema) => {
                let json = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
                if !json.starts_with("application/json") {
                    self.failures.push(format!("{what} as {json:?}, not application/json"));
                }
                if serde_json::from_str::<Value>(&text).is_err() {
                    self.failures.push(format!("{what}, not JSON: {text}"));
                } else {
                    let errors = self.errors(schema, true, &value);
                    if !errors.is_empty() {
                        self.failures
                            .push(format!("{what}, a body unlike its schema:\n  {}\n  {text}", errors.join("\n  ")));
                    }
                }
            }
            None if !text.is_empty() => self.failures.push(format!("{what} with a body it does not document: {text}")),
            None => {}
        }
        (status, value)
    }

    /// Every request that succeeded so far, reads only or all, sent again as
    /// `key`: whatever they answer (refused, empty, allowed), as documented.
    async fn replay(&mut self, key: &str, writes_too: bool) {
        for (op_id, sent) in self.done.clone() {
            if writes_too || self.op(&op_id).method == Method::GET {
                let params: Vec<&str> = sent.params.iter().map(String::as_str).collect();
                self.call(&op_id, Some(key), &params, &sent.query, sent.body).await;
            }
        }
    }

    /// [`Walk::call`] as `key`, which must succeed with `status`.
    async fn expect(&mut self, op_id: &str, key: &str, params: &[&str], query: &str, body: Body, status: u16) -> Value {
        let (got, value) = self.call(op_id, Some(key), params, query, body).await;
        assert_eq!(got, status, "{op_id} {params:?}{query}: {value}\nso far:\n{}", self.failures.join("\n"));
        value
    }

    /// [`Walk::expect`] 200, with a valid body or none.
    async fn ok(&mut self, op_id: &str, key: &str, params: &[&str], body: Option<Value>) -> Value {
        let body = body.map_or(Body::None, Body::Json);
        self.expect(op_id, key, params, "", body, 200).await
    }

    /// [`Walk::ok`] for a list, also read with each query, and a page after
    /// the first when there is one.
    async fn list(&mut self, op_id: &str, key: &str, params: &[&str], queries: &[String]) -> Value {
        let first = self.ok(op_id, key, params, None).await;
        for q in queries {
            let page = self.expect(op_id, key, params, &format!("?{q}"), Body::None, 200).await;
            if let Some(cursor) = page["next_cursor"].as_str() {
                self.expect(op_id, key, params, &format!("?{q}&cursor={cursor}"), Body::None, 200).await;
            }
        }
        first
    }
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().unwrap_or_else(|| panic!("no id: {v}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_as_the_spec_documents() {
    let agent = Agent::start(&[]);
    let hook = Recorder::start(|_, _| (200, "{}".into())).await;
    // ID tokens from an issuer whose keys are read from a file.
    let jwks = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(jwks.path(), jwks_of(ISSUER_KEY, "k1").to_string()).unwrap();
    let issuer = "https://issuer.example.com";
    let config = IssuerConfig { issuer: issuer.into(), audience: AUDIENCE.into(), jwks_file: Some(jwks.path().into()) };
    let s = TestServer::start_with_oidc(vec![config]).await;
    let owner = s.key_for_user("owner@example.com").await;
    let reviewer_email = "reviewer@example.com";
    let reviewer = s.key_for_user(reviewer_email).await;
    let (viewer_email, editor_email) = ("viewer@example.com", "editor@example.com");
    let viewer = s.key_for_user(viewer_email).await;
    let editor = s.key_for_user(editor_email).await;
    let outsider = s.key_for_user("outsider@example.com").await;
    let payer_email = "payer@example.com";
    let payer = s.key_for_user(payer_email).await;
    let mut w = Walk::new(&s);
    let o = owner.as_str();

    // API keys.
    w.ok("list_api_keys", o, &[], None).await;
    let made = w.expect("create_api_key", o, &[], "", Body::Json(json!({"label": "ci"})), 201).await;
    let key_id = id_of(&made);
    w.ok("rotate_api_key", o, &[&key_id], Some(json!({}))).await;
    w.ok("rotate_api_key", o, &[&key_id], None).await;
    w.list("list_api_keys", o, &[], &["limit=1".into()]).await;
    // Up to the limit of active keys, and one past it.
    let mut status = 201;
    for n in 0..30 {
        (status, _) = w.call("create_api_key", Some(o), &[], "", Body::Json(json!({"label": format!("k{n}")}))).await;
        if status != 201 {
            break;
        }
    }
    assert_eq!(status, 409, "the 26th active key");

    // A project with a webhook, and its members.
    let project = w
        .ok(
            "create_project",
            o,
            &[],
            Some(json!({"name": "conformance", "description": "every operation", "webhook_url": format!("{}/hook", hook.base),
                        "webhook_secret": "whsec_conformance", "settings": {"max_call_duration_s": 120, "default_concurrency": 4}})),
        )
        .await;
    let p = id_of(&project);
    let p = p.as_str();
    w.ok("get_project", o, &[p], None).await;
    w.ok(
        "replace_project",
        o,
        &[p],
        Some(json!({"name": "conformance", "description": "every operation, replaced",
                    "webhook_url": format!("{}/hook", hook.base), "webhook_secret": "whsec_conformance"})),
    )
    .await;
    w.list("list_projects", o, &[], &["limit=1".into()]).await;
    let r_member = w.ok("add_project_member", o, &[p], Some(json!({"email": reviewer_email, "role": "viewer"}))).await;
    let r_user = r_member["user_id"].as_str().unwrap().to_string();
    w.ok("update_project_member", o, &[p, &r_user], Some(json!({"role": "reviewer"}))).await;
    let p_member = w.ok("add_project_member", o, &[p], Some(json!({"email": payer_email, "role": "owner"}))).await;
    let p_user = p_member["user_id"].as_str().unwrap().to_string();
    w.ok("add_project_member", o, &[p], Some(json!({"email": viewer_email, "role": "viewer"}))).await;
    w.ok("add_project_member", o, &[p], Some(json!({"email": editor_email, "role": "editor"}))).await;
    w.list("list_project_members", o, &[p], &["limit=1".into()]).await;
    // Someone signed in with an ID token whose email is not verified (a
    // user with no email), made an editor by their id, and changing things
    // with that token.
    let bearer = format!("Bearer {}", sign(Token { email_verified: false, ..valid(issuer, "anonymous") }));
    let t = [("authorization", bearer.as_str())];
    let (status, theirs) =
        w.call_with("create_project", &t, &[], "", Body::Json(json!({"name": "signed in with a token"}))).await;
    assert_eq!(status, 200, "{theirs}");
    let (status, members) = w.call_with("list_project_members", &t, &[&id_of(&theirs)], "", Body::None).await;
    assert_eq!(status, 200, "{members}");
    let t_user = members["members"][0]["user_id"].as_str().unwrap().to_string();
    // Found by their id once they share a project.
    let body = Body::Json(json!({"email": "owner@example.com", "role": "viewer"}));
    let (status, added) = w.call_with("add_project_member", &t, &[&id_of(&theirs)], "", body).await;
    assert_eq!(status, 200, "{added}");
    w.ok("add_project_member", o, &[p], Some(json!({"user_id": t_user, "role": "editor"}))).await;
    let (status, made) =
        w.call_with("create_persona", &t, &[], "", Body::Json(json!({"project_id": p, "name": "Sam"}))).await;
    assert_eq!(status, 200, "{made}");
    w.list("list_project_members", o, &[p], &[]).await;
    w.list("list_reviewers", o, &[], &[format!("project_id={p}")]).await;
    w.list("list_activity", o, &[], &[format!("project_id={p}"), "action=persona.create".into()]).await;
    // The second owner pays, then the creator again.
    w.ok("take_over_project_billing", &payer, &[p], None).await;
    w.ok("take_over_project_billing", o, &[p], None).await;

    // Integrations: an LLM and a telephony provider with a number.
    let judge = w
        .ok(
            "create_integration",
            o,
            &[],
            Some(json!({"project_id": p, "provider": "openai_compatible", "name": "judge",
                        "config": {"base_url": "https://llm.example.com/v1", "model": "m"},
                        "credentials": {"api_key": "sk-conformance"}})),
        )
        .await;
    let judge = id_of(&judge);
    let phone = w
        .ok(
            "create_integration",
            o,
            &[],
            Some(json!({"project_id": p, "provider": "twilio", "name": "line",
                        "config": {"account_sid": "AC0123456789abcdef0123456789abcdef"},
                        "phone_numbers": [{"number": "+14155550100", "label": "main", "direction": "both"}]})),
        )
        .await;
    let phone = id_of(&phone);
    w.ok("get_integration", o, &[&judge], None).await;
    w.ok("update_integration", o, &[&judge], Some(json!({"name": "the judge"}))).await;
    w.list("list_integrations", o, &[], &[format!("project_id={p}"), "provider=twilio".into()]).await;
    w.list("list_integration_phone_numbers", o, &[&phone], &["limit=1".into()]).await;

    // Channels: the reference agent over http, and a phone line.
    let ch = w
        .ok(
            "create_channel",
            o,
            &[],
            Some(json!({"project_id": p, "name": "reference agent", "kind": "http", "target": agent.http_target(),
                        "headers": {"x-agent-token": "secret-token"}, "turn_timeout_ms": 3000,
                        "max_call_duration_s": 60})),
        )
        .await;
    let ch = id_of(&ch);
    let line = w
        .ok(
            "create_channel",
            o,
            &[],
            Some(json!({"project_id": p, "name": "line", "kind": "phone", "target": "+14155550102",
                        "integration_id": phone})),
        )
        .await;
    let line = id_of(&line);
    w.ok("get_channel", o, &[&ch], None).await;
    w.ok("update_channel", o, &[&ch], Some(json!({"name": "the reference agent"}))).await;
    w.list("list_channels", o, &[], &[format!("project_id={p}"), "kind=phone".into()]).await;

    // A persona, a scenario, a test and a batch.
    let persona = w
        .ok(
            "create_persona",
            o,
            &[],
            Some(json!({"project_id": p, "name": "Dana", "description": "in a hurry", "prompt": "Be brief.",
                        "language": "en-US", "accent": "Scottish", "gender": "female",
                        "voice": {"provider": "acme", "voice_id": "v1", "speed": 1.1},
                        "background_noise": "office", "background_noise_volume": 0.25, "interruption_level": "low",
                        "verbosity": "low", "patience": "high", "tags": ["vip"]})),
        )
        .await;
    let persona = id_of(&persona);
    w.ok("get_persona", o, &[&persona], None).await;
    w.ok("update_persona", o, &[&persona], Some(json!({"description": "in a real hurry"}))).await;
    w.list("list_personas", o, &[], &[format!("project_id={p}"), "tag=vip".into()]).await;
    let scenario_body = json!({"name": "book tuesday", "mode": "scripted", "default_persona_id": persona,
        "first_message": "Hi, I'd like to book an appointment.",
        "steps": [{"say": "Tuesday at 3 pm, please.",
                   "expect": [{"type": "contains", "name": "confirms", "text": "confirmed"}]},
                  {"say": "That's all, goodbye.", "expect": []}],
        "success_criteria": [{"type": "max_turns", "name": "short", "turns": 20},
                             {"type": "max_latency_ms", "name": "quick", "percentile": "p95", "ms": 5000,
                              "critical": false}],
        "max_duration_s": 60, "tags": ["booking"]});
    let mut create_scenario = scenario_body.clone();
    create_scenario["project_id"] = json!(p);
    let scenario = w.ok("create_scenario", o, &[], Some(create_scenario)).await;
    let scenario = id_of(&scenario);
    w.ok("get_scenario", o, &[&scenario], None).await;
    w.ok("replace_scenario", o, &[&scenario], Some(scenario_body)).await;
    w.list("list_scenarios", o, &[], &[format!("project_id={p}"), "mode=scripted".into(), "tag=booking".into()]).await;
    let test = w
        .ok(
            "create_test",
            o,
            &[],
            Some(json!({"project_id": p, "name": "books tuesday", "description": "the happy path", "channel_id": ch,
                        "scenario_id": scenario, "persona_ids": [persona], "iterations": 2,
                        "evaluators": [{"type": "not_contains", "name": "polite", "text": "idiot"},
                                       {"type": "regex", "name": "a time", "pattern": "[0-9]"}],
                        "pass_threshold": 0.5, "tags": ["smoke"]})),
        )
        .await;
    let test = id_of(&test);
    w.ok("get_test", o, &[&test], None).await;
    w.ok("update_test", o, &[&test], Some(json!({"description": "the happy path, again"}))).await;
    w.list("list_tests", o, &[], &[format!("project_id={p}"), format!("channel_id={ch}"), "tag=smoke".into()]).await;
    let batch = w
        .ok(
            "create_batch",
            o,
            &[],
            Some(json!({"project_id": p, "name": "nightly", "description": "all of it", "test_ids": [test],
                        "concurrency": 2})),
        )
        .await;
    let batch = id_of(&batch);
    w.ok("get_batch", o, &[&batch], None).await;
    w.ok("replace_batch", o, &[&batch], Some(json!({"name": "nightly", "test_ids": [test], "concurrency": 3}))).await;

    // Batch runs: a batch's, a channel's and a test's, one of them cancelled.
    let run = w.ok("run_batch", o, &[&batch], Some(json!({"metadata": {"commit": "abc123"}}))).await;
    let batch_run = id_of(&run);
    w.ok("get_batch_run", o, &[&batch_run], None).await;
    let done = wait_for_end(&s, o, &batch_run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let run = w.ok("run_channel", o, &[&ch], Some(json!({"test_ids": [test]}))).await;
    wait_for_end(&s, o, &id_of(&run)).await;
    // A test's run started twice with one Idempotency-Key: one batch run;
    // the key with another request, refused.
    let once = [("x-api-key", o), ("idempotency-key", "conformance-1")];
    let (status, run) = w.call_with("run_test", &once, &[&test], "", Body::None).await;
    assert_eq!(status, 200, "{run}");
    let (status, again) = w.call_with("run_test", &once, &[&test], "", Body::None).await;
    assert_eq!((status, &again["id"]), (200, &run["id"]), "{again}");
    let (status, reused) =
        w.call_with("run_test", &once, &[&test], "", Body::Json(json!({"metadata": {"commit": "another"}}))).await;
    assert_eq!(status, 409, "{reused}");
    let cancelled = id_of(&run);
    w.ok("cancel_batch_run", o, &[&cancelled], None).await;
    wait_for_end(&s, o, &cancelled).await;
    w.ok("cancel_batch_run", o, &[&cancelled], None).await;
    w.ok("get_batch_run", o, &[&batch_run], None).await;
    w.list("get_queue_stats", o, &[], &[]).await;
    w.list(
        "list_batch_runs",
        o,
        &[],
        &[format!("project_id={p}"), format!("batch_id={batch}"), "status=cancelled".into(), "limit=1".into()],
    )
    .await;
    w.list("list_batch_run_runs", o, &[&batch_run], &["status=passed".into(), "limit=1".into()]).await;
    w.list("list_batch_run_tests", o, &[&batch_run], &["limit=1".into()]).await;
    w.list("list_batches", o, &[], &[format!("project_id={p}")]).await;

    // Results.
    let results = w.list("list_test_results", o, &[&test], &["status=passed".into(), "limit=1".into()]).await;
    let result = id_of(&results["test_results"][0]);
    let call = results["test_results"][0]["call_id"].as_str().unwrap().to_string();
    w.ok("get_test_result", o, &[&result], None).await;
    w.ok("get_test_result_by_call", o, &[&call], None).await;

    // Reviews, and a calibration that the reviewer labels blind.
    let review = w
        .ok(
            "create_review",
            o,
            &[],
            Some(json!({"test_result_id": result, "verdict": "pass", "notes": "fine",
                        "evaluations": [{"name": "step 1: confirms", "passed": true}]})),
        )
        .await;
    let review = id_of(&review);
    let calibration = w
        .ok(
            "create_calibration",
            o,
            &[],
            Some(json!({"project_id": p, "sample": {"batch_run_id": batch_run, "size": 2, "seed": 1},
                        "reviewer_ids": [r_user]})),
        )
        .await;
    let calibration = id_of(&calibration);
    let sampled = w.ok("get_calibration", o, &[&calibration], None).await;
    let blind_result = sampled["test_result_ids"][0].as_str().unwrap().to_string();
    let r = reviewer.as_str();
    w.ok("get_test_result", r, &[&blind_result], None).await;
    w.ok("get_batch_run", r, &[&batch_run], None).await;
    w.ok("list_batch_run_tests", r, &[&batch_run], None).await;
    // Every read so far, as the reviewer who labels blind, a viewer, an
    // editor and someone outside the project: each answer as documented
    // (what is not theirs to read refused, checked the same).
    for key in [r, &viewer, &editor, &outsider] {
        w.replay(key, false).await;
    }
    w.ok("create_review", r, &[], Some(json!({"test_result_id": blind_result, "verdict": "fail"}))).await;
    w.ok("get_calibration", r, &[&calibration], None).await;
    w.list("list_reviews", r, &[], &[format!("calibration_id={calibration}")]).await;
    w.ok("get_calibration", o, &[&calibration], None).await;
    w.ok("close_calibration", o, &[&calibration], None).await;
    w.ok("get_calibration", o, &[&calibration], None).await;
    w.list("list_calibrations", o, &[], &[format!("project_id={p}"), "status=complete".into()]).await;
    w.list(
        "list_reviews",
        o,
        &[],
        &[
            format!("project_id={p}"),
            format!("test_result_id={result}"),
            format!("reviewer_id={r_user}"),
            format!("calibration_id={calibration}"),
            "verdict=pass".into(),
        ],
    )
    .await;
    w.list("list_reviewers", o, &[], &[format!("project_id={p}")]).await;
    w.ok("delete_review", o, &[&review], None).await;

    // Money and history: the ledger with an administrator's grant and
    // adjustment (`sparring admin grant-credits`, beside the server) too.
    for amount in ["25", "-5"] {
        let data_dir = s.data_dir.path().to_str().unwrap();
        let out = std::process::Command::new(common::process::BIN)
            .args(["admin", "grant-credits", "--data-dir", data_dir, "--user", "owner@example.com", "--amount", amount])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let ledger = w
        .list(
            "list_transactions",
            o,
            &[],
            &[
                "kind=reservation".into(),
                "kind=adjustment".into(),
                "kind=grant".into(),
                format!("batch_run_id={batch_run}"),
            ],
        )
        .await;
    for entry in ledger["transactions"].as_array().unwrap().iter().take(3) {
        w.ok("get_transaction", o, &[&id_of(entry)], None).await;
    }
    let activity = w
        .list(
            "list_activity",
            o,
            &[],
            &[format!("project_id={p}"), "resource_type=test".into(), "action=test.create".into()],
        )
        .await;
    w.ok("get_activity", o, &[&id_of(&activity["activity"][0])], None).await;
    w.list("list_resource_activity", o, &["test", &test], &["order=asc".into(), "limit=1".into()]).await;

    // The webhook deliveries of the batch runs, delivered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), o, None, 200).await;
        let all = list["webhook_deliveries"].as_array().unwrap();
        if all.len() == 3 && all.iter().all(|d| d["status"] == "delivered") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not delivered: {list:#}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    w.list("list_webhook_deliveries", o, &[p], &["limit=1".into()]).await;

    // More states of the same resources: a simulated caller and an LLM judge
    // (a loopback chat-completions stand-in), a websocket channel, an agent
    // that is not there (a result in error) reported to a webhook receiver
    // that fails, then no webhook at all.
    let llm = chat_llm(r#"{"passed": false, "reason": "no booking was confirmed"}"#).await;
    let llm_integration = |name: &str| {
        json!({"project_id": p, "provider": "openai_compatible", "name": name,
               "config": {"base_url": format!("{}/{name}", llm.base), "model": "m"},
               "credentials": {"api_key": format!("sk-{name}")}})
    };
    let caller = id_of(&w.ok("create_integration", o, &[], Some(llm_integration("caller"))).await);
    let llm_judge = id_of(&w.ok("create_integration", o, &[], Some(llm_integration("judge"))).await);
    let simulated = w
        .ok(
            "create_scenario",
            o,
            &[],
            Some(json!({"project_id": p, "name": "simulated booking", "mode": "simulated", "goal": "Book Tuesday",
                        "integration_id": caller, "default_persona_id": persona, "max_duration_s": 60,
                        "success_criteria": [{"type": "llm_judge", "name": "booked", "integration_id": llm_judge,
                                              "prompt": "Did the agent confirm a booking?"},
                                             {"type": "agent_ended_call", "name": "hung up", "critical": false},
                                             {"type": "tool_called", "name": "booked it", "critical": false,
                                              "tool": "book", "arguments": {"day": "tuesday"}}]})),
        )
        .await;
    let simulated = id_of(&simulated);
    let ws = w
        .ok(
            "create_channel",
            o,
            &[],
            Some(json!({"project_id": p, "name": "websocket", "kind": "websocket", "target": agent.ws_target(),
                        "turn_timeout_ms": 3000, "max_call_duration_s": 3600})),
        )
        .await;
    let ws = id_of(&ws);
    let nowhere = common::ClosedPort::new();
    let dead = w
        .ok(
            "create_channel",
            o,
            &[],
            Some(json!({"project_id": p, "name": "not there", "kind": "http", "target": nowhere.http_target()})),
        )
        .await;
    let dead = id_of(&dead);
    let failing = Recorder::start(|_, _| (500, "{}".into())).await;
    let mut more_tests = Vec::new();
    for (name, channel, scenario, iterations) in
        [("simulated", &ch, &simulated, 1), ("websocket", &ws, &scenario, 1), ("dead", &dead, &scenario, 5)]
    {
        // The agent that is not there fails more runs than a batch run's
        // report of a test lists.
        let body = json!({"project_id": p, "name": name, "channel_id": channel, "scenario_id": scenario,
                          "iterations": iterations});
        more_tests.push(id_of(&w.ok("create_test", o, &[], Some(body)).await));
    }
    for (i, test) in more_tests.iter().enumerate() {
        if i == 2 {
            let hook = json!({"name": "conformance", "webhook_url": format!("{}/hook", failing.base),
                             "webhook_secret": "whsec_failing"});
            w.ok("replace_project", o, &[p], Some(hook)).await;
        }
        let run = w.ok("run_test", o, &[test], Some(json!({}))).await;
        let ended = wait_for_end(&s, o, &id_of(&run)).await;
        w.ok("get_batch_run", o, &[&id_of(&ended)], None).await;
        w.ok("list_batch_run_runs", o, &[&id_of(&ended)], None).await;
        w.ok("list_batch_run_tests", o, &[&id_of(&ended)], None).await;
        let results = w.ok("list_test_results", o, &[test], None).await;
        let result = id_of(&results["test_results"][0]);
        w.ok("get_test_result", o, &[&result], None).await;
        if let Some(call) = results["test_results"][0]["call_id"].as_str() {
            w.ok("get_test_result_by_call", o, &[call], None).await;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = s.expect(Method::GET, &format!("/v1/projects/{p}/webhook-deliveries"), o, None, 200).await;
        if list["webhook_deliveries"][0]["attempts"].as_i64() >= Some(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not attempted: {list:#}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    w.ok("list_webhook_deliveries", o, &[p], None).await;
    w.ok("replace_project", o, &[p], Some(json!({"name": "conformance"}))).await;
    w.ok("list_webhook_deliveries", o, &[p], None).await;
    w.ok("get_project", o, &[p], None).await;
    w.ok("list_transactions", o, &[], None).await;
    w.ok("list_activity", o, &[], None).await;

    // A conversation held at its first turn: the batch run, its runs and the
    // queue while it is under way, cancelled there; and a calibration of
    // named results, closed with no label.
    let (held_url, mut arrivals, answers) = common::engine::held_receiver().await;
    let held = json!({"project_id": p, "name": "held", "kind": "http", "target": held_url, "turn_timeout_ms": 60000});
    let held = id_of(&w.ok("create_channel", o, &[], Some(held)).await);
    let held_test = json!({"project_id": p, "name": "held", "channel_id": held, "scenario_id": scenario});
    let held_test = id_of(&w.ok("create_test", o, &[], Some(held_test)).await);
    more_tests.push(held_test.clone());
    let held_batch = json!({"project_id": p, "name": "held", "test_ids": [held_test]});
    let held_batch = id_of(&w.ok("create_batch", o, &[], Some(held_batch)).await);
    let run = w.ok("run_batch", o, &[&held_batch], Some(json!({}))).await;
    let under_way = id_of(&run);
    tokio::time::timeout(std::time::Duration::from_secs(30), arrivals.recv()).await.unwrap().unwrap();
    w.ok("get_batch_run", o, &[&under_way], None).await;
    w.ok("list_batch_run_runs", o, &[&under_way], None).await;
    w.ok("list_batch_run_tests", o, &[&under_way], None).await;
    w.ok("get_batch", o, &[&held_batch], None).await;
    w.ok("get_queue_stats", o, &[], None).await;
    w.expect("list_batch_runs", o, &[], "?status=running", Body::None, 200).await;
    w.expect("delete_test", o, &[&held_test], "", Body::None, 409).await;
    w.expect("delete_project", o, &[p], "", Body::None, 409).await;
    w.ok("cancel_batch_run", o, &[&under_way], None).await;
    answers.send(200).unwrap();
    let ended = wait_for_end(&s, o, &under_way).await;
    assert_eq!(ended["status"], "cancelled", "{ended:#}");
    w.ok("get_batch_run", o, &[&under_way], None).await;
    w.ok("list_batch_run_runs", o, &[&under_way], None).await;
    w.ok("list_batch_run_tests", o, &[&under_way], None).await;
    w.ok("list_test_results", o, &[&held_test], None).await;
    w.ok("get_batch", o, &[&held_batch], None).await;
    w.ok("delete_batch", o, &[&held_batch], None).await;
    let named = json!({"project_id": p, "test_result_ids": [result], "reviewer_ids": [r_user, p_user]});
    let named = id_of(&w.ok("create_calibration", o, &[], Some(named)).await);
    w.ok("get_calibration", r, &[&named], None).await;
    w.ok("close_calibration", o, &[&named], None).await;
    w.ok("get_calibration", o, &[&named], None).await;
    w.ok("list_reviewers", o, &[], None).await;

    // Refusals: a channel kind whose calls are not built yet, a run the
    // payer's credits do not cover, a reviewer's change, a final review.
    w.expect("run_channel", o, &[&line], "", Body::Json(json!({})), 409).await;
    let call_test = json!({"project_id": p, "name": "a call", "channel_id": line, "scenario_id": scenario});
    more_tests.push(id_of(&w.ok("create_test", o, &[], Some(call_test)).await));
    w.expect("run_channel", o, &[&line], "", Body::Json(json!({})), 501).await;
    let long = json!({"name": "conformance", "settings": {"max_call_duration_s": 3600, "default_concurrency": 4}});
    w.ok("replace_project", o, &[p], Some(long)).await;
    let unbounded = json!({"project_id": p, "name": "long", "mode": "scripted", "first_message": "Hi",
                           "default_persona_id": persona, "steps": [{"say": "Bye", "expect": []}]});
    let unbounded = id_of(&w.ok("create_scenario", o, &[], Some(unbounded)).await);
    let expensive = json!({"project_id": p, "name": "expensive", "channel_id": ws, "scenario_id": unbounded,
                           "iterations": 100});
    let expensive = id_of(&w.ok("create_test", o, &[], Some(expensive)).await);
    w.expect("run_test", o, &[&expensive], "", Body::Json(json!({})), 402).await;
    more_tests.push(expensive);
    w.expect(
        "create_test",
        r,
        &[],
        "",
        Body::Json(json!({"project_id": p, "name": "no", "channel_id": ch,
                                                           "scenario_id": scenario})),
        403,
    )
    .await;
    w.expect("list_webhook_deliveries", r, &[p], "", Body::None, 403).await;
    w.expect("add_project_member", o, &[p], "", Body::Json(json!({"email": reviewer_email, "role": "viewer"})), 409)
        .await;
    let r_reviews = w.ok("list_reviews", r, &[], None).await;
    let locked = id_of(&r_reviews["reviews"][0]);
    w.expect("delete_review", r, &[&locked], "", Body::None, 409).await;

    // Every request of the walk, as a viewer and as someone outside the
    // project: refused (or their own), as documented.
    w.replay(&viewer, true).await;
    w.replay(&outsider, true).await;

    // The keys once their use is written (every 5 s, coalesced).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let keys = s.expect(Method::GET, "/v1/api-keys", o, None, 200).await;
        if keys["keys"].as_array().unwrap().iter().any(|k| k["last_used_at"].is_string()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no use written: {keys:#}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    w.list("list_api_keys", o, &[], &["limit=1".into()]).await;

    // The ends: revoke, delete, remove.
    w.ok("revoke_api_key", o, &[&key_id], None).await;
    w.ok("revoke_api_key", o, &[&key_id], None).await;
    w.expect("rotate_api_key", o, &[&key_id], "", Body::Json(json!({})), 409).await;
    w.ok("delete_batch", o, &[&batch], None).await;
    w.ok("delete_test", o, &[&test], None).await;
    for test in &more_tests {
        w.ok("delete_test", o, &[test], None).await;
    }
    for scenario in [&scenario, &simulated, &unbounded] {
        w.ok("delete_scenario", o, &[scenario], None).await;
    }
    w.ok("delete_persona", o, &[&persona], None).await;
    w.ok("delete_channel", o, &[&line], None).await;
    w.ok("delete_channel", o, &[&ch], None).await;
    w.ok("delete_integration", o, &[&phone], None).await;
    w.ok("delete_integration", o, &[&judge], None).await;
    // Every read again, the resources gone and their history kept.
    w.replay(o, false).await;
    w.replay(r, false).await;
    w.ok("remove_project_member", o, &[p, &p_user], None).await;
    w.ok("remove_project_member", r, &[p, &r_user], None).await;
    w.ok("delete_project", o, &[p], None).await;

    // Every operation walked, each answered with success.
    let unwalked: Vec<&String> = w.ops.keys().filter(|id| !w.succeeded.contains_key(*id)).collect();
    assert!(unwalked.is_empty(), "operations of the spec this walk does not call with success: {unwalked:?}");

    // The common error answers, for every operation, from the request that
    // succeeded: without a key, 401; with an id that does not exist, 404;
    // with a body or a query the spec refuses, 400.
    let walked: Vec<(String, Sent)> = w.succeeded.clone().into_iter().collect();
    for (op_id, sent) in &walked {
        let params: Vec<&str> = sent.params.iter().map(String::as_str).collect();
        let (status, body) = w.call(op_id, None, &params, &sent.query, sent.body.clone()).await;
        if status != 401 {
            w.failures.push(format!("{op_id} without a key: {status} {body}"));
        }
        let unknown_key = format!("spk_{}", "A".repeat(43));
        for credential in [("x-api-key", unknown_key.as_str()), ("authorization", "Bearer not.a.token")] {
            let (status, body) = w.call_with(op_id, &[credential], &params, &sent.query, sent.body.clone()).await;
            if status != 401 {
                w.failures.push(format!("{op_id} with {credential:?}: {status} {body}"));
            }
        }
        let op = w.op(op_id);
        let names: Vec<String> = op.path_params().iter().map(|n| n.to_string()).collect();
        let documents_404 = op.statuses.iter().any(|s| s == "404");
        let has_limit = op.query.iter().any(|q| q == "limit");
        let has_body = op.has_body;
        let id_filters: Vec<String> = op.query.iter().filter(|q| q.ends_with("_id")).cloned().collect();
        if documents_404 {
            for (i, name) in names.iter().enumerate() {
                let mut gone: Vec<String> = sent.params.clone();
                gone[i] = missing_id(&gone[i]);
                let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
                let (status, body) = w.call(op_id, Some(o), &gone, "", sent.body.clone()).await;
                if status != 404 {
                    w.failures.push(format!("{op_id} with a {name} that does not exist: {status} {body}"));
                }
            }
        }
        if let Body::Json(valid) = &sent.body {
            let mut bad = valid.clone();
            bad["not_a_field"] = json!(1);
            let (status, body) = w.call(op_id, Some(o), &params, "", Body::Bad(bad)).await;
            if status != 400 {
                w.failures.push(format!("{op_id} with an unknown field: {status} {body}"));
            }
            let (status, body) = w.call(op_id, Some(o), &params, "", Body::Bad(json!(["not", "an", "object"]))).await;
            if status != 400 {
                w.failures.push(format!("{op_id} with an array for a body: {status} {body}"));
            }
        }
        if has_body {
            let huge =
                Body::Raw(Some("application/json"), format!("{{\"name\": \"{}\"}}", "x".repeat(1 << 20)).into_bytes());
            let not_json = Body::Raw(Some("text/plain"), b"{}".to_vec());
            let cut = Body::Raw(Some("application/json"), b"{\"name\": ".to_vec());
            for (what, bad, want) in
                [("a body over 1 MiB", huge, 413), ("a text/plain body", not_json, 400), ("a cut body", cut, 400)]
            {
                let (status, body) = w.call(op_id, Some(o), &params, "", bad).await;
                if status != want {
                    w.failures.push(format!("{op_id} with {what}: {status} {body}"));
                }
            }
        }
        for name in id_filters {
            let query = format!("?{name}=nothing_01a2000000007000800000000000000a");
            let (status, _) = w.call(op_id, Some(o), &params, &query, Body::None).await;
            if !(200..300).contains(&status) && status != 404 {
                w.failures.push(format!("{op_id} with a {name} that does not exist: {status}"));
            }
        }
        if has_limit {
            let (status, body) = w.call(op_id, Some(o), &params, "?cursor=not-a-cursor", Body::None).await;
            if status != 400 {
                w.failures.push(format!("{op_id} with a cursor it did not issue: {status} {body}"));
            }
            let (status, body) = w.call(op_id, Some(o), &params, "?limit=0", Body::None).await;
            if status != 400 {
                w.failures.push(format!("{op_id} with limit=0: {status} {body}"));
            }
        }
    }
    let statuses: BTreeSet<u16> = w.answered.values().flatten().copied().collect();
    for want in [200, 201, 400, 401, 402, 403, 404, 409, 413, 501] {
        assert!(statuses.contains(&want), "no answer {want} was checked: {statuses:?}");
    }
    assert!(w.checked > 3 * w.ops.len(), "{} answers checked for {} operations", w.checked, w.ops.len());
    assert!(w.failures.is_empty(), "{} answers unlike the spec:\n{}", w.failures.len(), w.failures.join("\n\n"));
}

/// The conversion and the validation catch what they are for: a test of the
/// checker, so that a walk finding nothing means the wire is right rather
/// than the checker blind.
#[test]
fn the_checker_refuses_what_the_spec_does_not_allow() {
    let spec = spec();
    let defs: Map<String, Value> = spec["components"]["schemas"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(n, s)| (n.clone(), json_schema(s, true)))
        .collect();
    let check = |schema: &str, value: Value| -> bool {
        let document = json!({"allOf": [{"$ref": format!("#/definitions/{schema}")}], "definitions": defs});
        let validator = jsonschema::draft7::options().should_validate_formats(true).build(&document).unwrap();
        validator.is_valid(&value)
    };
    let key = json!({"id": "key_1", "label": "ci", "prefix": "spk_abc", "revoked": false,
                     "created_at": "2026-01-01T00:00:00Z", "last_used_at": null, "revoked_at": null});
    assert!(check("ApiKey", key.clone()), "a valid key");
    let with = |field: &str, value: Value| {
        let mut k = key.clone();
        k[field] = value;
        k
    };
    let without = |field: &str| {
        let mut k = key.clone();
        k.as_object_mut().unwrap().remove(field);
        k
    };
    assert!(!check("ApiKey", without("last_used_at")), "required, though nullable");
    assert!(!check("ApiKey", with("revoked", Value::Null)), "null where not nullable");
    assert!(!check("ApiKey", with("created_at", json!("yesterday"))), "a date-time");
    assert!(!check("ApiKey", with("label", json!(7))), "a string");
    assert!(!check("ApiKey", with("secret", json!("spk_x"))), "an undocumented field");
    let error = json!({"error_code": "not_found", "message": "no", "request_id": "r"});
    assert!(check("Error", error.clone()));
    assert!(!check("Error", json!({"message": "no", "request_id": "r"})), "error_code is required");
    // int32 and int64: a number out of their range, or not an integer.
    let stats = |workers: Value| {
        json!({"queued": 0, "running": 0, "workers": workers, "available_slots": 0, "oldest_queued_at": null,
               "completed_last_hour": 0, "failed_last_hour": 0, "avg_wait_ms_last_hour": null,
               "mine": {"queued": 0, "running": 0}})
    };
    assert!(check("QueueStats", stats(json!(4))), "valid stats");
    assert!(!check("QueueStats", stats(json!(-1_294_967_296i64 - 3_000_000_000))), "int32, below");
    assert!(!check("QueueStats", stats(json!(3_000_000_000u64))), "int32, above");
    assert!(!check("QueueStats", stats(json!(4.5))), "an integer");
    // An enum through a nullable `allOf`: null, or one of its values.
    let run_status = |status: Value| {
        let defs = defs.clone();
        let document = json!({"allOf": [{"$ref": "#/definitions/Run"}], "definitions": defs});
        let validator = jsonschema::draft7::options().build(&document).unwrap();
        let run = json!({"id": "run_1", "project_id": "prj_1", "batch_run_id": "brn_1", "test_id": "tst_1",
                         "scenario_id": "scn_1", "persona_id": null, "iteration": 1, "status": status, "attempt": 1,
                         "call_id": null, "test_result_id": null, "queued_at": "2026-01-01T00:00:00Z",
                         "started_at": null, "finished_at": null, "created_at": "2026-01-01T00:00:00Z",
                         "updated_at": "2026-01-01T00:00:00Z"});
        validator.is_valid(&run)
    };
    assert!(run_status(json!("passed")));
    assert!(run_status(Value::Null), "nullable");
    assert!(!run_status(json!("done")), "not one of the enum");
}
