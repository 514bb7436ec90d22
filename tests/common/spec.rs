//! The operations of `spec/openapi.json`, read at run time: what the tests
//! that walk every operation (`tests/tenancy.rs`, `tests/conformance.rs`)
//! iterate over, so that an operation added to the spec is walked too.
#![allow(dead_code)]

use reqwest::Method;
use serde_json::Value;

pub const SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/spec/openapi.json");

/// The spec, parsed.
pub fn spec() -> Value {
    serde_json::from_str(&std::fs::read_to_string(SPEC_PATH).unwrap()).unwrap()
}

/// One documented operation.
pub struct Operation {
    pub method: Method,
    /// As documented, relative to the base path (`/tests/{id}`).
    pub path: String,
    pub id: String,
    pub has_body: bool,
    /// Documented statuses (`200`, `4XX`, `default`, …).
    pub statuses: Vec<String>,
    /// The names of its query parameters.
    pub query: Vec<String>,
    /// The operation object as the spec has it.
    pub doc: Value,
}

impl Operation {
    /// The names of its path parameters, in the order they appear in its path.
    pub fn path_params(&self) -> Vec<&str> {
        self.path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect()
    }

    /// `/v1` + the path with its parameters filled in order by `values`.
    pub fn path_with(&self, values: &[&str]) -> String {
        let mut values = values.iter();
        let segments: Vec<String> = self
            .path
            .split('/')
            .map(|s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => {
                    let value = values.next().unwrap_or_else(|| panic!("{}: no value for {name}", self.id));
                    value.to_string()
                }
                None => s.to_string(),
            })
            .collect();
        assert!(values.next().is_none(), "{}: more values than path parameters", self.id);
        format!("/v1{}", segments.join("/"))
    }
}

/// Every operation of `spec`.
pub fn operations_of(spec: &Value) -> Vec<Operation> {
    let mut ops = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if !matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                continue;
            }
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            ops.push(Operation {
                method: Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap(),
                path: path.clone(),
                id: op["operationId"].as_str().unwrap().to_string(),
                has_body: op.get("requestBody").is_some(),
                statuses: op["responses"].as_object().unwrap().keys().cloned().collect(),
                query: params
                    .iter()
                    .filter(|p| p["in"] == "query")
                    .map(|p| p["name"].as_str().unwrap().to_string())
                    .collect(),
                doc: op.clone(),
            });
        }
    }
    assert!(ops.len() >= 70, "operations in the spec: {}", ops.len());
    ops
}

/// Every operation of `spec/openapi.json`.
pub fn operations() -> Vec<Operation> {
    operations_of(&spec())
}
