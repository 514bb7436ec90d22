//! Evaluators: what counts as success, checked when a scenario or a test is
//! saved so that a bad one is a 400 now rather than a failure mid-run.
//!
//! The wire type (a tagged union) already guarantees each `type` has its
//! fields; this adds what a type cannot say: names unique within a list
//! (and among all a result is judged by: see [`scenario_evaluations`]) and
//! not blank, texts not blank, a `regex` that compiles, `tool_called`
//! arguments small and shallow, latency and turn bounds that make sense,
//! an `llm_judge` integration in the same project that can judge
//! (`openai_compatible`).

use std::collections::BTreeSet;

use rusqlite::{params, OptionalExtension as _};
use sparring_server::types::Evaluator;

use crate::failure::{Failure, Result};
use crate::validate;

pub const MAX_EVALUATORS: usize = 100;
const MAX_LATENCY_MS: u64 = 600_000;
const MAX_TURNS: u32 = 1000;

/// Checks a list of evaluators (`field` is its name in the request, e.g.
/// `success_criteria` or `steps[2].expect`). Returns the integration ids
/// that `llm_judge` evaluators name, to check and record as references.
pub fn check_list(field: &str, evaluators: &[Evaluator]) -> Result<BTreeSet<String>> {
    if evaluators.len() > MAX_EVALUATORS {
        return Err(Failure::invalid(
            field,
            format_args!("at most {MAX_EVALUATORS} evaluators, got {}", evaluators.len()),
        ));
    }
    // The names seen: borrowed, and few (at most `MAX_EVALUATORS`).
    let mut names: Vec<&str> = Vec::with_capacity(evaluators.len());
    let mut judges = BTreeSet::new();
    for (i, e) in evaluators.iter().enumerate() {
        // The field's name, written only for a failure.
        let at = |f: &'static str| At { list: field, i, field: f };
        let name = name_of(e);
        validate::check_name(at("name"), name)?;
        if names.contains(&name) {
            return Err(Failure::invalid(&at("name").to_string(), format_args!("`{name}` is used twice in this list")));
        }
        names.push(name);
        match e {
            Evaluator::Contains { text, .. } | Evaluator::NotContains { text, .. } => {
                validate::check_required_text(at("text"), text, validate::MAX_DESCRIPTION)?;
            }
            Evaluator::Regex { pattern, .. } => {
                validate::regex(at("pattern"), pattern)?;
            }
            Evaluator::MaxLatencyMs { ms, .. } => {
                validate::range(at("ms"), ms.get(), 1, MAX_LATENCY_MS)?;
            }
            Evaluator::MaxTurns { turns, .. } => {
                validate::range(at("turns"), turns.get(), 1, MAX_TURNS)?;
            }
            Evaluator::AgentEndedCall { .. } => {}
            Evaluator::ToolCalled { tool, arguments, .. } => {
                validate::check_required_text(at("tool"), tool, validate::MAX_TOOL)?;
                validate::free_form(at("arguments"), arguments)?;
            }
            Evaluator::LlmJudge { integration_id, prompt, .. } => {
                validate::check_required_text(at("prompt"), prompt, validate::MAX_PROMPT)?;
                judges.insert(integration_id.clone());
            }
        }
    }
    Ok(judges)
}

/// `list[i].field`, the name of a field of an evaluator in a request.
#[derive(Clone, Copy)]
struct At<'a> {
    list: &'a str,
    i: usize,
    field: &'static str,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}].{}", self.list, self.i, self.field)
    }
}

pub fn name_of(e: &Evaluator) -> &str {
    match e {
        Evaluator::Contains { name, .. }
        | Evaluator::NotContains { name, .. }
        | Evaluator::Regex { name, .. }
        | Evaluator::MaxLatencyMs { name, .. }
        | Evaluator::MaxTurns { name, .. }
        | Evaluator::AgentEndedCall { name, .. }
        | Evaluator::ToolCalled { name, .. }
        | Evaluator::LlmJudge { name, .. } => name,
    }
}

/// The name a result gives the evaluation of an evaluator named `name` of
/// scripted step `index` (from 0): `step N: <name>`. The evaluators of the
/// whole call (a scenario's success criteria, a test's evaluators) keep
/// their own name.
pub fn step_evaluation_name(index: usize, name: &str) -> String {
    format!("step {}: {name}", index + 1)
}

/// Said when a name is taken: reviews and calibration find an evaluation
/// of a result by its name.
pub const NAMES_APART: &str = "a result's evaluations each need a name of their own";

/// The names a scenario gives the evaluations of each of its results, in
/// result order, each with the field of its evaluator (`steps[0].expect[1]`,
/// `success_criteria[2]`): the evaluators of its steps (`steps`, the names
/// of each step's `expect`), then its success criteria (`criteria`). A
/// result holds these, then its test's evaluators; no two of all of them
/// may share a name.
pub fn scenario_evaluations(steps: &[Vec<&str>], criteria: &[&str]) -> Vec<(String, String)> {
    let of_steps = steps.iter().enumerate().flat_map(|(i, names)| {
        names
            .iter()
            .enumerate()
            .map(move |(j, name)| (step_evaluation_name(i, name), format!("steps[{i}].expect[{j}]")))
    });
    let of_criteria = criteria.iter().enumerate().map(|(j, name)| (name.to_string(), format!("success_criteria[{j}]")));
    of_steps.chain(of_criteria).collect()
}

/// An evaluator as stored, read for its name only.
#[derive(serde::Deserialize)]
pub struct Named {
    pub name: String,
}

/// Each judge must be an `openai_compatible` integration of `project_id`
/// (400 naming `field` otherwise).
pub fn check_judges(
    tx: &rusqlite::Transaction<'_>,
    field: &str,
    judges: &BTreeSet<String>,
    project_id: &str,
) -> Result<()> {
    for id in judges {
        let provider: Option<(String, bool)> = tx
            .prepare_cached("SELECT provider, project_id = ?2 FROM integrations WHERE id = ?1")?
            .query_row(params![id, project_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        match provider {
            Some((p, true)) if p == "openai_compatible" => {}
            Some((p, true)) => {
                return Err(Failure::invalid(
                    field,
                    format_args!("llm_judge integration `{id}` is a {p} integration; a judge needs openai_compatible"),
                ));
            }
            _ => {
                return Err(Failure::invalid(
                    field,
                    format_args!("llm_judge integration `{id}` is not an integration of this project"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Vec<Evaluator> {
        serde_json::from_value(json).unwrap()
    }

    fn code(r: Result<BTreeSet<String>>) -> String {
        match r {
            Err(Failure::Invalid { message, .. }) => message,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn every_type_is_checked() {
        let ok = parse(serde_json::json!([
            {"type": "contains", "name": "greets", "text": "hello"},
            {"type": "not_contains", "name": "no swearing", "text": "damn", "case_sensitive": true},
            {"type": "regex", "name": "time", "pattern": "\\d{1,2}:\\d{2}"},
            {"type": "max_latency_ms", "name": "fast", "percentile": "p95", "ms": 1200},
            {"type": "max_turns", "name": "short", "turns": 12},
            {"type": "agent_ended_call", "name": "hangs up"},
            {"type": "tool_called", "name": "books", "tool": "book_appointment", "arguments": {"day": "tuesday"}},
            {"type": "llm_judge", "name": "polite", "integration_id": "int_1", "prompt": "Was the agent polite?"},
        ]));
        let judges = check_list("success_criteria", &ok).unwrap();
        assert_eq!(judges.into_iter().collect::<Vec<_>>(), vec!["int_1".to_string()]);

        let cases = [
            (serde_json::json!([{"type": "contains", "name": "a", "text": " "}]), "success_criteria[0].text"),
            (serde_json::json!([{"type": "regex", "name": "a", "pattern": "(("}]), "success_criteria[0].pattern"),
            (
                serde_json::json!([{"type": "max_latency_ms", "name": "a", "percentile": "p50", "ms": 600_001}]),
                "success_criteria[0].ms",
            ),
            (serde_json::json!([{"type": "max_turns", "name": "a", "turns": 5000}]), "success_criteria[0].turns"),
            (serde_json::json!([{"type": "tool_called", "name": "a", "tool": " "}]), "success_criteria[0].tool"),
            (
                serde_json::json!([{"type": "llm_judge", "name": "a", "integration_id": "i", "prompt": " "}]),
                "success_criteria[0].prompt",
            ),
            (
                serde_json::json!([{"type": "agent_ended_call", "name": "x"}, {"type": "agent_ended_call", "name": "x"}]),
                "success_criteria[1].name",
            ),
            (serde_json::json!([{"type": "agent_ended_call", "name": "  "}]), "success_criteria[0].name"),
        ];
        for (json, field) in cases {
            let message = code(check_list("success_criteria", &parse(json.clone())));
            assert!(message.starts_with(field), "{json}: {message}");
        }
    }

    #[test]
    fn the_wire_type_rejects_unknown_types_and_missing_fields() {
        assert!(serde_json::from_value::<Evaluator>(serde_json::json!({"type": "sentiment", "name": "a"})).is_err());
        assert!(serde_json::from_value::<Evaluator>(serde_json::json!({"type": "contains", "name": "a"})).is_err());
        assert!(serde_json::from_value::<Evaluator>(serde_json::json!({"type": "regex", "name": "a", "text": "x"}))
            .is_err());
        let instant = serde_json::json!({"type": "max_latency_ms", "name": "a", "percentile": "p50", "ms": 0});
        assert!(serde_json::from_value::<Evaluator>(instant).is_err(), "the spec's minimum is 1 ms");
    }
}
