//! Evaluators over a finished conversation, and the result's verdict
//! (DESIGN §4).
//!
//! Which evaluators run, in this order (the order of the result's
//! `evaluations`):
//! 1. each scripted step's `expect`, applied only to the agent's reply to
//!    that step and named `step {n}: {name}`;
//! 2. the scenario's `success_criteria`, over the whole conversation;
//! 3. the test's `evaluators`, over the whole conversation.
//!
//! Rules ([`rules`]) are pure functions of the [`Outcome`]; `llm_judge`
//! ([`judge`]) asks an `openai_compatible` model. A judge that cannot give a
//! clear verdict is an *errored* evaluation, never a pass, so a flaky judge
//! can only make a result `error`, not let a bad agent through.

mod judge;
mod rules;
#[cfg(test)]
mod testing;

use crate::engine::outbound::Outbound;
use crate::evaluators::{name_of, step_evaluation_name};
use std::collections::HashMap;

use sparring_server::types::{self, EndedReason, EvaluationSource, Evaluator, EvaluatorType, TestResultStatus};

use super::llm::clip;
use super::{LlmEndpoint, Outcome};

pub use judge::JUDGE_TIMEOUT;

/// One evaluation of a result. `errored` tells an evaluator that could not
/// decide (a judge that failed, a pattern that does not compile) from one
/// that decided "failed"; both have `passed: false`.
#[derive(Clone, Debug)]
pub struct Evaluated {
    pub result: types::EvaluationResult,
    pub errored: bool,
}

/// Which part of the conversation an evaluator looks at.
#[derive(Clone, Copy, Debug)]
enum Scope<'a> {
    /// The whole conversation.
    Call,
    /// The agent's reply to scripted step `index` (0-based): the transcript
    /// indices `turns`. `last` when it is the last step the call reached
    /// (where an agent that ends the call does so).
    Step { index: usize, turns: &'a [usize], last: bool },
}

impl Scope<'_> {
    /// Where, in a sentence: "in the call", "in its reply to step 2".
    fn place(&self) -> String {
        match self {
            Scope::Call => "in the call".to_string(),
            Scope::Step { index, .. } => format!("in its reply to step {}", index + 1),
        }
    }

    /// Whether transcript turn `i` is in scope.
    fn covers(&self, i: usize) -> bool {
        match self {
            Scope::Call => true,
            Scope::Step { turns, .. } => turns.contains(&i),
        }
    }
}

/// An evaluator to run, with its result name and what it looks at; `scope`
/// is `None` for a step the call never reached.
struct Planned<'a> {
    name: String,
    evaluator: &'a Evaluator,
    scope: Option<Scope<'a>>,
    step: Option<usize>,
}

/// What one evaluator decided.
enum Decision {
    Pass { score: f64, reason: String },
    Fail { score: f64, reason: String },
    Error(String),
}

/// Runs every evaluator that applies to `outcome` (see the module doc for
/// which and in what order). Judges run concurrently, each bounded by
/// [`JUDGE_TIMEOUT`]; `judges` maps an `llm_judge`'s `integration_id` to its
/// endpoint (a missing one is an errored evaluation). When the conversation
/// itself failed, or was cancelled, the rules still run (they may say what
/// went wrong) but no judge is asked.
pub async fn evaluate(
    http: &Outbound,
    scenario: &types::Scenario,
    test_evaluators: &[Evaluator],
    outcome: &Outcome,
    judges: &HashMap<String, LlmEndpoint>,
) -> Vec<Evaluated> {
    let plan = plan(scenario, test_evaluators, outcome);
    // A judge costs a call to the user's LLM: none is asked about a
    // conversation whose result is an error whatever it would say.
    let not_judged = match (conversation_failure(outcome), outcome.ended_reason) {
        (Some(_), _) => Some("not judged: the conversation failed"),
        (None, EndedReason::Cancelled) => Some("not judged: the conversation was cancelled"),
        (None, _) => None,
    };
    // In result order, a few at a time: each judge holds its prompt (the
    // whole transcript) and its request until its LLM answers, and a test
    // may have a thousand of them.
    use futures::StreamExt as _;
    // (Made first: a stream over a closure would not be `Send` for every
    // lifetime the worker's task needs.)
    let each: Vec<_> = plan.iter().map(|p| run(http, p, outcome, judges, not_judged)).collect();
    futures::stream::iter(each).buffered(JUDGES_AT_ONCE).collect().await
}

/// How many evaluators of one conversation are judged at once.
const JUDGES_AT_ONCE: usize = 8;

/// The evaluators of `scenario` and the test, in result order, each with
/// its scope. A step is reached when the conversation recorded a reply
/// slot for it (`step_replies` has an entry at its index).
fn plan<'a>(scenario: &'a types::Scenario, test_evaluators: &'a [Evaluator], outcome: &'a Outcome) -> Vec<Planned<'a>> {
    let reached = outcome.step_replies.len();
    let mut plan = Vec::new();
    for (index, step) in scenario.steps.iter().enumerate() {
        let scope =
            outcome.step_replies.get(index).map(|turns| Scope::Step { index, turns, last: index + 1 == reached });
        for evaluator in &step.expect {
            plan.push(Planned {
                name: step_evaluation_name(index, name_of(evaluator)),
                evaluator,
                scope,
                step: Some(index),
            });
        }
    }
    for evaluator in scenario.success_criteria.iter().chain(test_evaluators) {
        plan.push(Planned { name: name_of(evaluator).to_string(), evaluator, scope: Some(Scope::Call), step: None });
    }
    plan
}

async fn run(
    http: &Outbound,
    planned: &Planned<'_>,
    outcome: &Outcome,
    judges: &HashMap<String, LlmEndpoint>,
    not_judged: Option<&str>,
) -> Evaluated {
    let evaluator = planned.evaluator;
    let decision = match (planned.scope, evaluator) {
        (None, _) => Decision::Fail {
            score: 0.0,
            reason: format!("the call ended before step {}", planned.step.map_or(0, |s| s + 1)),
        },
        (Some(_), Evaluator::LlmJudge { .. }) if not_judged.is_some() => {
            Decision::Error(not_judged.unwrap_or_default().to_string())
        }
        (Some(scope), Evaluator::LlmJudge { integration_id, prompt, .. }) => match judges.get(integration_id) {
            None => Decision::Error(format!(
                "judge error: integration `{integration_id}` cannot judge (it was deleted, or it is not an \
                 openai_compatible integration with a base_url and a model)"
            )),
            Some(llm) => judge::judge(http, llm, prompt, outcome, scope).await,
        },
        (Some(scope), rule) => rules::check(rule, outcome, scope),
    };
    let (passed, score, reason, errored) = match decision {
        Decision::Pass { score, reason } => (true, score, reason, false),
        Decision::Fail { score, reason } => (false, score, reason, false),
        Decision::Error(reason) => (false, 0.0, reason, true),
    };
    let type_ = type_of(evaluator);
    let source = if type_ == EvaluatorType::LlmJudge { EvaluationSource::Llm } else { EvaluationSource::Rule };
    Evaluated {
        result: types::EvaluationResult {
            critical: critical_of(evaluator),
            name: planned.name.clone(),
            passed,
            reason,
            score,
            source,
            type_,
        },
        errored,
    }
}

/// What a result comes to.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub status: types::TestResultStatus,
    /// Share of evaluations passed (1.0 when there are none).
    pub score: f64,
    pub failure_reason: Option<String>,
}

/// The result's status: `error` when the conversation failed or a critical
/// evaluator could not decide; else `failed` when a critical evaluator
/// failed; else `passed`. Non-critical evaluators only move the score.
pub fn verdict(outcome: &Outcome, evaluated: &[Evaluated]) -> Verdict {
    let passed = evaluated.iter().filter(|e| e.result.passed && !e.errored).count();
    let score = if evaluated.is_empty() { 1.0 } else { passed as f64 / evaluated.len() as f64 };
    if let Some(reason) = conversation_failure(outcome) {
        return Verdict { status: TestResultStatus::Error, score, failure_reason: Some(reason) };
    }
    let critical_errored: Vec<&Evaluated> = evaluated.iter().filter(|e| e.result.critical && e.errored).collect();
    if !critical_errored.is_empty() {
        return Verdict { status: TestResultStatus::Error, score, failure_reason: Some(first_of(&critical_errored)) };
    }
    let critical_failed: Vec<&Evaluated> = evaluated.iter().filter(|e| e.result.critical && !e.result.passed).collect();
    if !critical_failed.is_empty() {
        return Verdict { status: TestResultStatus::Failed, score, failure_reason: Some(first_of(&critical_failed)) };
    }
    Verdict { status: TestResultStatus::Passed, score, failure_reason: None }
}

/// "`{name}`: {reason}", with "(+N more)" when others are in the same state.
fn first_of(list: &[&Evaluated]) -> String {
    let first = &list[0].result;
    let mut reason = format!("`{}`: {}", first.name, clip(&first.reason, 1000));
    if list.len() > 1 {
        reason.push_str(&format!(" (+{} more)", list.len() - 1));
    }
    reason
}

/// Why the conversation itself failed, if it did.
fn conversation_failure(outcome: &Outcome) -> Option<String> {
    match (&outcome.error, outcome.ended_reason) {
        (Some(error), _) => Some(error.clone()),
        (None, EndedReason::AgentError) => Some("the call ended with an agent error".to_string()),
        (None, _) => None,
    }
}

/// Whether a test met its `pass_threshold` (the share of its runs that must
/// pass). Decided on integers: `passed / total >= threshold` is
/// `passed >= ceil(threshold × total)`, with the product nudged down by a
/// hair so that 0.07 × 100 (7.000000000000001 in floating point) needs 7.
/// No runs never pass; a threshold outside 0..1 is clamped (NaN counts as 1).
pub fn test_passed(passed_runs: u32, total_runs: u32, pass_threshold: f64) -> bool {
    if total_runs == 0 {
        return false;
    }
    let threshold = if pass_threshold.is_nan() { 1.0 } else { pass_threshold.clamp(0.0, 1.0) };
    let needed = (threshold * f64::from(total_runs) - 1e-9).ceil().max(0.0) as u64;
    u64::from(passed_runs.min(total_runs)) >= needed
}

fn critical_of(e: &Evaluator) -> bool {
    match e {
        Evaluator::Contains { critical, .. }
        | Evaluator::NotContains { critical, .. }
        | Evaluator::Regex { critical, .. }
        | Evaluator::MaxLatencyMs { critical, .. }
        | Evaluator::MaxTurns { critical, .. }
        | Evaluator::AgentEndedCall { critical, .. }
        | Evaluator::ToolCalled { critical, .. }
        | Evaluator::LlmJudge { critical, .. } => *critical,
    }
}

fn type_of(e: &Evaluator) -> EvaluatorType {
    match e {
        Evaluator::Contains { .. } => EvaluatorType::Contains,
        Evaluator::NotContains { .. } => EvaluatorType::NotContains,
        Evaluator::Regex { .. } => EvaluatorType::Regex,
        Evaluator::MaxLatencyMs { .. } => EvaluatorType::MaxLatencyMs,
        Evaluator::MaxTurns { .. } => EvaluatorType::MaxTurns,
        Evaluator::AgentEndedCall { .. } => EvaluatorType::AgentEndedCall,
        Evaluator::ToolCalled { .. } => EvaluatorType::ToolCalled,
        Evaluator::LlmJudge { .. } => EvaluatorType::LlmJudge,
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{evaluators, scenario, ChatDouble, OutcomeBuilder};
    use super::*;
    use serde_json::json;

    fn evaluated(name: &str, critical: bool, passed: bool, errored: bool) -> Evaluated {
        Evaluated {
            result: types::EvaluationResult {
                critical,
                name: name.to_string(),
                passed,
                reason: format!("{name} reason"),
                score: if passed { 1.0 } else { 0.0 },
                source: EvaluationSource::Rule,
                type_: EvaluatorType::Contains,
            },
            errored,
        }
    }

    fn summary(results: &[Evaluated]) -> Vec<(String, bool, bool, String)> {
        results.iter().map(|e| (e.result.name.clone(), e.result.passed, e.errored, e.result.reason.clone())).collect()
    }

    #[tokio::test]
    async fn steps_then_success_criteria_then_test_evaluators() {
        let scenario = scenario(
            json!([
                {"say": "I'd like to book", "expect": [{"type": "contains", "name": "asks day", "text": "which day"}]},
                {"say": "Tuesday", "expect": [
                    {"type": "contains", "name": "confirms", "text": "booked"},
                    {"type": "contains", "name": "asks day", "text": "which day"},
                ]},
                {"say": "Thanks", "expect": [{"type": "not_contains", "name": "no upsell", "text": "premium"}]},
            ]),
            json!([{"type": "contains", "name": "greets", "text": "hello"}]),
        );
        let test = evaluators(json!([{"type": "max_turns", "name": "short", "turns": 10}]));
        // Step 1's reply asks the day, step 2's books; step 3 was never reached.
        let outcome = OutcomeBuilder::new()
            .agent("Hello, how can I help?", 100)
            .caller("I'd like to book")
            .agent("Sure, which day?", 200)
            .caller("Tuesday")
            .agent("You are booked for Tuesday.", 300)
            .step(&[2])
            .step(&[4])
            .ended(EndedReason::MaxDuration)
            .build();
        let results = evaluate(&Outbound::anywhere(), &scenario, &test, &outcome, &HashMap::new()).await;
        assert_eq!(
            summary(&results),
            vec![
                (
                    "step 1: asks day".into(),
                    true,
                    false,
                    "the agent said \"which day\" in turn 3: \"Sure, which day?\"".into()
                ),
                (
                    "step 2: confirms".into(),
                    true,
                    false,
                    "the agent said \"booked\" in turn 5: \"You are booked for Tuesday.\"".into()
                ),
                // The same words earlier in the call do not count for step 2.
                (
                    "step 2: asks day".into(),
                    false,
                    false,
                    "the agent never said \"which day\" in its reply to step 2".into()
                ),
                ("step 3: no upsell".into(), false, false, "the call ended before step 3".into()),
                ("greets".into(), true, false, "the agent said \"hello\" in turn 1: \"Hello, how can I help?\"".into()),
                ("short".into(), true, false, "the call took 5 turns, within 10".into()),
            ]
        );
        let v = verdict(&outcome, &results);
        assert_eq!(v.status, TestResultStatus::Failed);
        assert_eq!(v.score, 4.0 / 6.0);
        assert_eq!(
            v.failure_reason.as_deref(),
            Some("`step 2: asks day`: the agent never said \"which day\" in its reply to step 2 (+1 more)")
        );
    }

    #[tokio::test]
    async fn a_step_the_agent_did_not_answer_is_judged_on_nothing() {
        let scenario = scenario(
            json!([{"say": "Hi", "expect": [
                {"type": "contains", "name": "greets", "text": "hi"},
                {"type": "not_contains", "name": "calm", "text": "!"},
            ]}]),
            json!([]),
        );
        let outcome = OutcomeBuilder::new().caller("Hi").step(&[]).build();
        let results = evaluate(&Outbound::anywhere(), &scenario, &[], &outcome, &HashMap::new()).await;
        assert_eq!(
            summary(&results),
            vec![
                ("step 1: greets".into(), false, false, "the agent said nothing in its reply to step 1".into()),
                ("step 1: calm".into(), true, false, "the agent said nothing in its reply to step 1".into()),
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_conversation_runs_rules_but_not_judges() {
        let double = ChatDouble::start(|_| (200, r#"{"passed": true, "reason": "fine"}"#.to_string())).await;
        let scenario = scenario(json!([]), json!([{"type": "contains", "name": "greets", "text": "hello"}]));
        let test = evaluators(
            json!([{"type": "llm_judge", "name": "polite", "integration_id": "int_j", "prompt": "Polite?"}]),
        );
        let outcome = OutcomeBuilder::new()
            .agent("Hello!", 50)
            .caller("Hi")
            .ended(EndedReason::AgentError)
            .error("the agent answered HTTP 502 on turn 2")
            .build();
        let judges = HashMap::from([("int_j".to_string(), double.endpoint(None))]);
        let results = evaluate(&Outbound::anywhere(), &scenario, &test, &outcome, &judges).await;
        assert_eq!(
            summary(&results),
            vec![
                ("greets".into(), true, false, "the agent said \"hello\" in turn 1: \"Hello!\"".into()),
                ("polite".into(), false, true, "not judged: the conversation failed".into()),
            ]
        );
        assert!(double.requests().is_empty(), "no judge may be asked about a failed conversation");
        let v = verdict(&outcome, &results);
        assert_eq!(v.status, TestResultStatus::Error);
        assert_eq!(v.failure_reason.as_deref(), Some("the agent answered HTTP 502 on turn 2"));
        assert_eq!(v.score, 0.5);
    }

    #[tokio::test]
    async fn a_cancelled_conversation_is_not_judged() {
        let double = ChatDouble::start(|_| (200, r#"{"passed": true, "reason": "fine"}"#.to_string())).await;
        let scenario = scenario(json!([]), json!([]));
        let test = evaluators(
            json!([{"type": "llm_judge", "name": "polite", "integration_id": "int_j", "prompt": "Polite?"}]),
        );
        let outcome = OutcomeBuilder::new().caller("Hi").agent("Hello!", 50).ended(EndedReason::Cancelled).build();
        let judges = HashMap::from([("int_j".to_string(), double.endpoint(None))]);
        let results = evaluate(&Outbound::anywhere(), &scenario, &test, &outcome, &judges).await;
        assert_eq!(
            summary(&results),
            vec![("polite".into(), false, true, "not judged: the conversation was cancelled".into())]
        );
        assert!(double.requests().is_empty(), "no judge may be asked about a cancelled conversation");
    }

    #[test]
    fn an_agent_error_without_words_is_still_an_error() {
        let outcome = OutcomeBuilder::new().ended(EndedReason::AgentError).build();
        let v = verdict(&outcome, &[evaluated("a", true, true, false)]);
        assert_eq!(v.status, TestResultStatus::Error);
        assert_eq!(v.failure_reason.as_deref(), Some("the call ended with an agent error"));
        assert_eq!(v.score, 1.0);
    }

    #[test]
    fn verdict_rules() {
        let ok = OutcomeBuilder::new().build();
        let passed = verdict(&ok, &[evaluated("a", true, true, false), evaluated("b", false, false, false)]);
        assert_eq!(passed, Verdict { status: TestResultStatus::Passed, score: 0.5, failure_reason: None });

        // A non-critical error does not make the result an error.
        let v = verdict(&ok, &[evaluated("a", true, true, false), evaluated("j", false, false, true)]);
        assert_eq!(v.status, TestResultStatus::Passed);
        assert_eq!(v.score, 0.5);

        let failed = verdict(
            &ok,
            &[
                evaluated("a", true, true, false),
                evaluated("b", true, false, false),
                evaluated("c", false, false, false),
                evaluated("d", true, false, false),
                evaluated("e", true, false, false),
            ],
        );
        assert_eq!(failed.status, TestResultStatus::Failed);
        assert_eq!(failed.score, 0.2);
        assert_eq!(failed.failure_reason.as_deref(), Some("`b`: b reason (+2 more)"));

        let one = verdict(&ok, &[evaluated("b", true, false, false)]);
        assert_eq!(one.failure_reason.as_deref(), Some("`b`: b reason"));

        // A critical error outranks a critical failure.
        let errored = verdict(&ok, &[evaluated("b", true, false, false), evaluated("j", true, false, true)]);
        assert_eq!(errored.status, TestResultStatus::Error);
        assert_eq!(errored.failure_reason.as_deref(), Some("`j`: j reason"));
        assert_eq!(errored.score, 0.0);

        // An errored evaluation never counts as passed, even if marked so.
        let odd = verdict(&ok, &[evaluated("j", false, true, true), evaluated("a", true, true, false)]);
        assert_eq!(odd.score, 0.5);

        let none = verdict(&ok, &[]);
        assert_eq!(none, Verdict { status: TestResultStatus::Passed, score: 1.0, failure_reason: None });
    }

    #[test]
    fn thresholds_are_decided_without_floating_point_traps() {
        assert!(test_passed(7, 10, 0.7));
        assert!(!test_passed(6, 10, 0.7));
        // Products that floating point puts a hair above the whole number.
        assert!(test_passed(7, 100, 0.07)); // 0.07 × 100 = 7.000000000000001
        assert!(!test_passed(6, 100, 0.07));
        assert!(test_passed(7, 25, 0.28)); // 7.000000000000001
        assert!(test_passed(51, 75, 0.68)); // 51.00000000000001
        assert!(!test_passed(50, 75, 0.68));
        // And one a hair below.
        assert!(test_passed(29, 100, 0.29)); // 28.999999999999996
        assert!(!test_passed(28, 100, 0.29));
        assert!(test_passed(1, 3, 1.0 / 3.0));
        assert!(test_passed(2, 3, 0.66));
        assert!(!test_passed(2, 3, 0.67));
        assert!(test_passed(10, 10, 1.0));
        assert!(!test_passed(9, 10, 1.0));
        assert!(test_passed(0, 5, 0.0));
        assert!(!test_passed(0, 0, 0.0), "no runs never pass");
        assert!(!test_passed(0, 0, 1.0));
        assert!(!test_passed(4, 5, f64::NAN), "NaN counts as 1");
        assert!(test_passed(5, 5, f64::NAN));
        assert!(!test_passed(9, 10, 1.5), "clamped to 1");
        assert!(test_passed(u32::MAX - 1, u32::MAX, 0.99));
    }
}
