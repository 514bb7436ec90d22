//! Evaluators over a finished conversation, and the result's verdict.
//! PLACEHOLDER until the evaluate branch is merged.

use std::collections::HashMap;

use sparring_server::types;

use super::{LlmEndpoint, Outcome};

pub struct Evaluated {
    pub result: types::EvaluationResult,
    pub errored: bool,
}

pub async fn evaluate(
    _http: &reqwest::Client,
    _scenario: &types::Scenario,
    _test_evaluators: &[types::Evaluator],
    _outcome: &Outcome,
    _judges: &HashMap<String, LlmEndpoint>,
) -> Vec<Evaluated> {
    Vec::new()
}

pub struct Verdict {
    pub status: types::TestResultStatus,
    pub score: f64,
    pub failure_reason: Option<String>,
}

pub fn verdict(outcome: &Outcome, _evaluated: &[Evaluated]) -> Verdict {
    Verdict { status: types::TestResultStatus::Error, score: 0.0, failure_reason: outcome.error.clone() }
}

pub fn test_passed(passed_runs: u32, total_runs: u32, pass_threshold: f64) -> bool {
    total_runs > 0 && f64::from(passed_runs) >= pass_threshold * f64::from(total_runs) - 1e-9
}
