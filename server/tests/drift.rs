//! The spec and the generated trait describe the same API.
//!
//! The test builds the OpenAPI document dropshot emits for the generated
//! trait (`stub_api_description()`) and compares it with `spec/openapi.json`:
//! operations, paths, parameters, request and success bodies, and every
//! schema an operation reaches. Both sides are first normalized, and the
//! normalization is exactly this list — the things dropshot (with schemars
//! 0.8 and typify) cannot express, nothing more:
//!
//! 1. Base path: dropshot's paths carry it (`/v1/...`); the spec's are
//!    relative to `servers[0].url`. It is stripped.
//! 2. The route bridge: an operation in `BRIDGED_ROUTES` is served at its
//!    `route_path`; it is mapped back to its `spec_path`, dropping the route
//!    variables that stand for literal segments and renaming the others back.
//! 3. Security: dropshot emits no security schemes; `security` and
//!    `components.securitySchemes` are not compared.
//! 4. Errors: the spec lists explicit 4xx/5xx codes, each with the `Error` or
//!    `ApiKeyError` schema; dropshot emits the ranges `4XX`/`5XX` with its
//!    own `Error` (`HttpError`, the only error type that can set response
//!    headers such as `WWW-Authenticate`). Both become "the error body",
//!    after checking that every such schema is `{error_code, message,
//!    request_id}` of strings.
//! 5. Text: `description`, `summary`, `title` and `example` are dropped.
//! 6. Limits typify does not carry into the schema it derives: `minLength`,
//!    `maxLength`, `pattern` (enforced in a newtype whose schema is a plain
//!    string), `minimum`, `maximum`, `minItems`, `maxItems`, `maxProperties`
//!    (checked by the implementation's parsing), and an integer format's sign (typify picks
//!    `u32` for an `int32` with `minimum: 0`): `uint32` ≡ `int32`,
//!    `uint64` ≡ `int64`.
//! 7. Nullable and optional: schemars writes an `Option<T>` field as
//!    `nullable` and not required, whether the spec had it optional or
//!    required-but-nullable; so per object the compared fact is which
//!    properties are required *and* not nullable, and `nullable` is removed
//!    from property and query-parameter schemas.
//! 8. Shapes typify rewrites: a one-item `allOf` (how an optional `$ref`
//!    is written) is its item; a `discriminator` is dropped (schemars writes
//!    none for the tagged enum typify makes of it); a `$ref` to
//!    a schema the spec does not have (typify names inline enums, e.g.
//!    `EvaluatorContainsType`) is compared by its content.
//! 9. Request bodies: dropshot marks every body required; an optional body
//!    (`required: false`) is accepted empty by the generated extractor, and
//!    `required` is not compared.
//! 10. Response headers: dropshot documents only those an endpoint's
//!     response type declares, and the spec's (`x-request-id` on every
//!     answer, `WWW-Authenticate` on a 401) are set around every handler, by
//!     dropshot and by the credential's extractor. They are not compared
//!     here; `tests/conformance.rs` checks every answer carries them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};
use sparring_server::{BridgedRoute, BASE_PATH, BRIDGED_ROUTES};

fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/openapi.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// dropshot's document of the trait, with the operations that share a route
/// (documented by `SharedRouteDocs` at their own paths, see
/// `xtask/src/server_gen.rs`) merged in: together, every operation once.
fn emitted() -> Value {
    fn document<C: dropshot::ServerContext>(api: dropshot::ApiDescription<C>) -> Value {
        let doc = api.openapi("Sparring API", semver::Version::new(1, 0, 0)).json().unwrap();
        serde_json::to_value(doc).unwrap()
    }
    let mut main = document(sparring_server::sparring_api_mod::stub_api_description().unwrap());
    let shared = document(sparring_server::shared_route_docs_mod::stub_api_description().unwrap());
    for (path, item) in shared["paths"].as_object().unwrap() {
        let into = main["paths"].as_object_mut().unwrap().entry(path.clone()).or_insert_with(|| json!({}));
        for (method, op) in item.as_object().unwrap() {
            assert!(into.get(method).is_none(), "{method} {path} is both served and documented as shared");
            into[method] = op.clone();
        }
    }
    for (name, schema) in shared["components"]["schemas"].as_object().into_iter().flatten() {
        main["components"]["schemas"][name] = schema.clone();
    }
    main
}

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];
const TEXT: [&str; 6] = ["description", "summary", "title", "example", "examples", "externalDocs"];
const LIMITS: [&str; 10] = [
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "maxProperties",
];

/// The normalized, comparable form of a document.
#[derive(Debug, PartialEq)]
struct Normalized {
    operations: BTreeMap<String, Value>,
    schemas: BTreeMap<String, Value>,
}

fn schema_name(r: &str) -> String {
    r.trim_start_matches("#/components/schemas/").to_string()
}

/// What `normalize_schema` needs to know about the document.
struct Names<'a> {
    /// The document's own `components.schemas`.
    schemas: &'a Map<String, Value>,
    /// The names the spec defines; a `$ref` elsewhere is inlined (rule 8).
    spec: &'a BTreeSet<String>,
}

/// Rules 5 to 8 on one schema, recursively.
fn normalize_schema(schema: &Value, names: &Names<'_>) -> Value {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                let name = schema_name(r);
                if !names.spec.contains(&name) {
                    if let Some(target) = names.schemas.get(&name) {
                        return normalize_schema(target, names);
                    }
                }
            }
            if let Some(Value::Array(items)) = map.get("allOf") {
                if items.len() == 1 {
                    let mut inner = normalize_schema(&items[0], names);
                    if let (Some(o), Some(n)) = (inner.as_object_mut(), map.get("nullable")) {
                        o.insert("nullable".into(), n.clone());
                    }
                    return inner;
                }
            }
            let mut out = Map::new();
            for (k, v) in map {
                if TEXT.contains(&k.as_str()) || LIMITS.contains(&k.as_str()) || k == "required" || k == "discriminator"
                {
                    continue;
                }
                if k == "format" {
                    let f = v.as_str().unwrap_or_default();
                    out.insert(k.clone(), json!(f.strip_prefix('u').unwrap_or(f)));
                    continue;
                }
                if k == "properties" {
                    let props = v.as_object().unwrap();
                    if props.is_empty() {
                        continue;
                    }
                    let mut p = Map::new();
                    for (name, s) in props {
                        let mut s = normalize_schema(s, names);
                        if let Some(o) = s.as_object_mut() {
                            o.remove("nullable");
                        }
                        p.insert(name.clone(), s);
                    }
                    out.insert(k.clone(), Value::Object(p));
                    continue;
                }
                out.insert(k.clone(), normalize_schema(v, names));
            }
            if let Some(props) = map.get("properties").and_then(Value::as_object).filter(|p| !p.is_empty()) {
                let required: BTreeSet<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let always: Vec<&str> = props
                    .iter()
                    .filter(|(name, s)| required.contains(name.as_str()) && s.get("nullable") != Some(&json!(true)))
                    .map(|(name, _)| name.as_str())
                    .collect();
                out.insert("x-required-non-null".into(), json!(always));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| normalize_schema(i, names)).collect()),
        other => other.clone(),
    }
}

fn is_error_body(schema: &Value) -> bool {
    let props = schema.get("properties").and_then(Value::as_object);
    props.is_some_and(|p| {
        p.len() == 3
            && ["error_code", "message", "request_id"]
                .iter()
                .all(|f| p.get(*f).and_then(|s| s.get("type")) == Some(&json!("string")))
    })
}

fn collect_refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.insert(r.clone());
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The schemas the operations reach, except the error bodies (rule 4).
fn reachable_schemas(
    roots: BTreeSet<String>,
    error_names: &BTreeSet<String>,
    names: &Names<'_>,
) -> BTreeMap<String, Value> {
    let schemas = names.schemas;
    let mut seen = BTreeMap::new();
    let mut todo: Vec<String> = roots.into_iter().map(|r| schema_name(&r)).collect();
    while let Some(name) = todo.pop() {
        if seen.contains_key(&name) || error_names.contains(&name) || !names.spec.contains(&name) {
            continue;
        }
        let schema = schemas.get(&name).unwrap_or_else(|| panic!("dangling $ref to {name}"));
        let mut refs = BTreeSet::new();
        collect_refs(schema, &mut refs);
        todo.extend(refs.iter().map(|r| schema_name(r)));
        seen.insert(name, normalize_schema(schema, names));
    }
    seen
}

fn normalize(
    doc: &Value,
    base_path: &str,
    bridged: &[BridgedRoute],
    spec_names: &BTreeSet<String>,
) -> Result<Normalized, String> {
    let empty = Map::new();
    let names = Names { schemas: doc["components"]["schemas"].as_object().unwrap_or(&empty), spec: spec_names };
    let mut operations = BTreeMap::new();
    let mut roots = BTreeSet::new();
    let mut error_names = BTreeSet::new();
    let paths = doc["paths"].as_object().ok_or("no paths")?;
    for (path, item) in paths {
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let id = op["operationId"].as_str().ok_or(format!("{method} {path}: no operationId"))?.to_string();
            // Rules 1 and 2.
            let mut path = path.strip_prefix(base_path).unwrap_or(path).to_string();
            let bridge =
                bridged.iter().find(|b| b.operation_id == id && path == b.route_path.trim_start_matches(base_path));
            if let Some(b) = bridge {
                path = b.spec_path.trim_start_matches(base_path).to_string();
            }
            let mut params: Vec<Value> = Vec::new();
            for p in op.get("parameters").and_then(Value::as_array).cloned().unwrap_or_default() {
                let mut name = p["name"].as_str().unwrap_or_default().to_string();
                if let Some(b) = bridge {
                    if p["in"] == "path" && b.literals.iter().any(|(v, _)| *v == name) {
                        continue;
                    }
                    if let Some((_, spec_name)) = b.renames.iter().find(|(v, _)| *v == name) {
                        name = spec_name.to_string();
                    }
                }
                let mut schema = normalize_schema(&p["schema"], &names);
                if let Some(o) = schema.as_object_mut() {
                    o.remove("nullable");
                }
                params.push(json!({
                    "name": name,
                    "in": p["in"],
                    "required": p.get("required").cloned().unwrap_or(json!(false)),
                    "schema": schema,
                }));
            }
            params.sort_by_key(|p| (p["in"].to_string(), p["name"].to_string()));

            // Rule 8.
            let body = op.get("requestBody").map(|b| {
                let content = b["content"].as_object().unwrap();
                json!(content.iter().map(|(ct, m)| (ct.clone(), m["schema"].clone())).collect::<Map<_, _>>())
            });
            if let Some(b) = &body {
                collect_refs(b, &mut roots);
            }

            let mut success = Vec::new();
            let mut errors = BTreeSet::new();
            for (status, resp) in op["responses"].as_object().ok_or("no responses")? {
                let resp = match resp.get("$ref").and_then(Value::as_str) {
                    Some(r) => &doc["components"]["responses"][r.trim_start_matches("#/components/responses/")],
                    None => resp,
                };
                let schema = &resp["content"]["application/json"]["schema"];
                if status.starts_with('2') {
                    collect_refs(schema, &mut roots);
                    success.push(json!({"status": status, "schema": schema}));
                } else {
                    // Rule 4.
                    let name =
                        schema_name(schema["$ref"].as_str().ok_or(format!("{id}: error {status} without $ref"))?);
                    let target = &doc["components"]["schemas"][&name];
                    if !is_error_body(target) {
                        return Err(format!("{id}: error schema {name} is not {{error_code, message, request_id}}"));
                    }
                    error_names.insert(name);
                    errors.insert("the error body");
                }
            }
            let key = format!("{} {path}", method.to_uppercase());
            let tags = op.get("tags").cloned().unwrap_or(json!([]));
            let normalized = json!({"operationId": id, "tags": tags, "parameters": params, "requestBody": body, "success": success, "errors": errors});
            if operations.insert(key.clone(), normalized).is_some() {
                return Err(format!("{key} appears twice"));
            }
        }
    }
    let schemas = reachable_schemas(roots, &error_names, &names);
    Ok(Normalized { operations, schemas })
}

/// Human-readable differences, empty when the documents agree.
fn differences(spec: &Value, emitted: &Value) -> Vec<String> {
    let base = BASE_PATH;
    let spec_names: BTreeSet<String> =
        spec["components"]["schemas"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    let a = match normalize(spec, "", &[], &spec_names) {
        Ok(n) => n,
        Err(e) => return vec![format!("spec: {e}")],
    };
    let b = match normalize(emitted, base, BRIDGED_ROUTES, &spec_names) {
        Ok(n) => n,
        Err(e) => return vec![format!("generated: {e}")],
    };
    let mut diffs = Vec::new();
    let keys: BTreeSet<&String> = a.operations.keys().chain(b.operations.keys()).collect();
    for k in keys {
        match (a.operations.get(k), b.operations.get(k)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) => diffs.push(format!("operation {k}:\n  spec:      {x}\n  generated: {y}")),
            (Some(_), None) => diffs.push(format!("operation {k} is in the spec but not generated")),
            (None, Some(_)) => diffs.push(format!("operation {k} is generated but not in the spec")),
            (None, None) => unreachable!(),
        }
    }
    let names: BTreeSet<&String> = a.schemas.keys().chain(b.schemas.keys()).collect();
    for n in names {
        match (a.schemas.get(n), b.schemas.get(n)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) => diffs.push(format!("schema {n}:\n  spec:      {x}\n  generated: {y}")),
            (Some(_), None) => diffs.push(format!("schema {n} is in the spec but not generated")),
            (None, Some(_)) => diffs.push(format!("schema {n} is generated but not in the spec")),
            (None, None) => unreachable!(),
        }
    }
    diffs
}

#[test]
fn generated_trait_matches_the_spec() {
    let diffs = differences(&spec(), &emitted());
    assert!(diffs.is_empty(), "{} differences between spec and generated trait:\n{}", diffs.len(), diffs.join("\n"));
}

#[test]
fn every_operation_is_generated() {
    let spec = spec();
    let count = METHODS
        .iter()
        .map(|m| spec["paths"].as_object().unwrap().values().filter(|i| i.get(*m).is_some()).count())
        .sum::<usize>();
    let emitted = emitted();
    let generated = METHODS
        .iter()
        .map(|m| emitted["paths"].as_object().unwrap().values().filter(|i| i.get(*m).is_some()).count())
        .sum::<usize>();
    assert_eq!(count, generated);
    assert!(count >= 35);
}

/// A named change to a spec document.
type Mutation = (&'static str, Box<dyn Fn(&mut Value)>);

/// The comparison is not vacuous: each deliberate change to the spec is
/// reported.
#[test]
fn a_deliberate_mismatch_fails_the_comparison() {
    let emitted = emitted();
    let mutations: Vec<Mutation> = vec![
        (
            "a field's type",
            Box::new(|s| s["components"]["schemas"]["ApiKey"]["properties"]["revoked"] = json!({"type": "string"})),
        ),
        (
            "a removed required field",
            Box::new(|s| {
                s["components"]["schemas"]["ApiKeySecret"]["properties"].as_object_mut().unwrap().remove("prefix");
            }),
        ),
        (
            "a renamed path parameter",
            Box::new(|s| {
                let paths = s["paths"].as_object_mut().unwrap();
                let item = paths.remove("/api-keys/{id}/rotate").unwrap();
                let mut item = item;
                item["post"]["parameters"][0]["name"] = json!("key_id");
                paths.insert("/api-keys/{key_id}/rotate".into(), item);
            }),
        ),
        (
            "a changed success status",
            Box::new(|s| {
                let r = s["paths"]["/api-keys"]["post"]["responses"].as_object_mut().unwrap();
                let created = r.remove("201").unwrap();
                r.insert("200".into(), created);
            }),
        ),
        (
            "a new operation",
            Box::new(|s| {
                s["paths"]["/queue/stats"]["delete"] = s["paths"]["/queue/stats"]["get"].clone();
                s["paths"]["/queue/stats"]["delete"]["operationId"] = json!("clear_queue");
            }),
        ),
        (
            "a changed query parameter",
            Box::new(|s| {
                s["paths"]["/api-keys"]["get"]["parameters"][0]["schema"] = json!({"type": "boolean"});
            }),
        ),
        (
            "a bridged path's literal segment",
            Box::new(|s| {
                let paths = s["paths"].as_object_mut().unwrap();
                let item = paths.remove("/test-results/by-call/{callId}").unwrap();
                paths.insert("/test-results/by-caller/{callId}".into(), item);
            }),
        ),
        (
            "an enum value",
            Box::new(|s| {
                s["components"]["schemas"]["ProjectRole"]["enum"].as_array_mut().unwrap().push(json!("guest"));
            }),
        ),
    ];
    for (name, mutate) in mutations {
        let mut spec = spec();
        mutate(&mut spec);
        assert!(!differences(&spec, &emitted).is_empty(), "changing {name} went unnoticed");
    }
}
