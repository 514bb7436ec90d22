//! `llm_judge`: an `openai_compatible` model reads the transcript and the
//! tool calls and says whether a criterion (the evaluator's `prompt`) holds.
//!
//! The model must answer with a JSON object `{"passed": bool, "score":
//! 0..1, "reason": "…"}` (prose around it is tolerated). Anything less — no
//! object, no boolean `passed`, an endpoint that fails or is slow — is an
//! error ("judge error: …"), never a pass.

use crate::engine::outbound::Outbound;
use std::time::Duration;

use serde_json::Value;
use sparring_server::types::TurnRole;

use super::{Decision, Scope};
use crate::engine::llm::{self, clip, excerpt, first_json_object, ChatMessage, LlmEndpoint};
use crate::engine::Outcome;

/// How long one judge may take to answer.
pub const JUDGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How much of the judge's reason a result keeps.
const REASON_MAX: usize = 1000;

const INSTRUCTIONS: &str = "You are a strict, impartial evaluator of a phone conversation between a caller and \
an AI voice agent under test. You decide whether ONE criterion holds, based only on the transcript and the \
agent's tool calls given to you. Answer with a single JSON object and nothing else: \
{\"passed\": true or false, \"score\": a number from 0 to 1 (how well the criterion is met), \
\"reason\": \"one or two sentences citing what the agent said or did\"}.";

/// Asks `llm` whether `criterion` holds for `outcome` within `scope`.
pub(super) async fn judge(
    http: &Outbound,
    llm: &LlmEndpoint,
    criterion: &str,
    outcome: &Outcome,
    scope: Scope<'_>,
) -> Decision {
    let decision = match llm::complete(http, llm, &messages(criterion, outcome, scope), JUDGE_TIMEOUT).await {
        Err(e) => Decision::Error(format!("judge error: {e}")),
        Ok(answer) => match parse_answer(&answer) {
            Ok(d) => d,
            Err(why) => Decision::Error(format!("judge error: {why}")),
        },
    };
    // An endpoint may echo request headers in an error body; the key must
    // not reach a stored result.
    match &llm.api_key {
        Some(key) if !key.is_empty() => redact(decision, key),
        _ => decision,
    }
}

fn redact(decision: Decision, key: &str) -> Decision {
    let hide = |s: String| crate::engine::redact(s, &[key]);
    match decision {
        Decision::Pass { score, reason } => Decision::Pass { score, reason: hide(reason) },
        Decision::Fail { score, reason } => Decision::Fail { score, reason: hide(reason) },
        Decision::Error(reason) => Decision::Error(hide(reason)),
    }
}

/// The conversation as the judge reads it: one `role: text` line per turn,
/// then the tool calls; for a step, which reply is to be judged.
pub(super) fn messages(criterion: &str, outcome: &Outcome, scope: Scope<'_>) -> Vec<ChatMessage> {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut transcript = String::new();
    for turn in &outcome.transcript {
        let role = match turn.role {
            TurnRole::Caller => "caller",
            TurnRole::Agent => "agent",
        };
        transcript.push_str(&format!("{role}: {}\n", one_line(&turn.text)));
    }
    if transcript.is_empty() {
        transcript.push_str("(nobody said anything)\n");
    }
    let mut tools = String::new();
    for call in &outcome.tool_calls {
        tools.push_str(&format!(
            "- turn {}: {} {}\n",
            i64::from(call.turn) + 1,
            call.name,
            Value::Object(call.arguments.clone())
        ));
    }
    if tools.is_empty() {
        tools.push_str("(none)\n");
    }
    let focus = match scope {
        Scope::Call => String::new(),
        Scope::Step { index, turns, .. } => {
            let reply: Vec<String> = turns
                .iter()
                .filter_map(|&i| outcome.transcript.get(i).map(|t| format!("turn {}: {}", i + 1, one_line(&t.text))))
                .collect();
            let reply = if reply.is_empty() { "(the agent said nothing)".to_string() } else { reply.join("\n") };
            format!("\nJudge ONLY the agent's reply to scripted step {} (the rest is context):\n{reply}\n", index + 1)
        }
    };
    let user = format!(
        "Criterion:\n{criterion}\n\nTranscript (turns numbered from 1):\n{transcript}\nTool calls by the agent:\n\
         {tools}{focus}\nDoes the criterion hold? Answer with the JSON object only."
    );
    vec![ChatMessage::system(INSTRUCTIONS), ChatMessage::user(user)]
}

/// The judge's verdict from its answer. `score` is optional (1 or 0 from
/// `passed` when absent, clamped to 0..1); a missing `reason` is said so.
pub(super) fn parse_answer(answer: &str) -> Result<Decision, String> {
    let shown = || excerpt(answer, 200, &[]);
    let object = first_json_object(answer).ok_or_else(|| format!("the answer has no JSON object: {}", shown()))?;
    let passed = match object.get("passed") {
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("`passed` is {other}, not true or false: {}", shown())),
        None => return Err(format!("the answer has no `passed`: {}", shown())),
    };
    let score =
        object.get("score").and_then(Value::as_f64).map_or(if passed { 1.0 } else { 0.0 }, |s| s.clamp(0.0, 1.0));
    let reason = match object.get("reason").and_then(Value::as_str).map(str::trim) {
        Some(r) if !r.is_empty() => clip(r, REASON_MAX),
        _ => "the judge gave no reason".to_string(),
    };
    Ok(if passed { Decision::Pass { score, reason } } else { Decision::Fail { score, reason } })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;
    use sparring_server::types::{EvaluationSource, TestResultStatus};

    use super::super::testing::{evaluators, scenario, ChatDouble, OutcomeBuilder};
    use super::super::{evaluate, verdict, Evaluated};
    use super::*;

    const KEY: &str = "sk-judge-key-4f9a2c";

    fn outcome() -> Outcome {
        OutcomeBuilder::new()
            .caller("I want to cancel my\norder")
            .agent("Sorry to hear that. Which order?", 300)
            .caller("Order 77")
            .agent("Order 77 is cancelled.", 400)
            .tool("cancel_order", json!({"order": 77}))
            .build()
    }

    /// Runs one judge (`integration_id` int_j, unless `judges` lacks it)
    /// over `outcome()` and returns its evaluation.
    async fn judged(double: Option<&ChatDouble>) -> Evaluated {
        let test = evaluators(json!([
            {"type": "llm_judge", "name": "resolves", "integration_id": "int_j", "prompt": "The agent cancels the order."}
        ]));
        let judges = double.map(|d| HashMap::from([("int_j".to_string(), d.endpoint(Some(KEY)))])).unwrap_or_default();
        let mut results =
            evaluate(&Outbound::anywhere(), &scenario(json!([]), json!([])), &test, &outcome(), &judges).await;
        assert_eq!(results.len(), 1);
        let e = results.remove(0);
        assert_eq!(e.result.source, EvaluationSource::Llm);
        assert!(!e.result.reason.contains(KEY), "the key leaked into a reason: {}", e.result.reason);
        e
    }

    #[tokio::test]
    async fn a_passing_verdict() {
        let double = ChatDouble::start(|_| {
            (200, r#"{"passed": true, "score": 0.9, "reason": "It cancelled order 77."}"#.to_string())
        })
        .await;
        let e = judged(Some(&double)).await;
        assert!(e.result.passed && !e.errored);
        assert_eq!(e.result.score, 0.9);
        assert_eq!(e.result.reason, "It cancelled order 77.");

        // What the judge was asked: the criterion, the transcript line by
        // line, the tool calls, with the bearer key and the model.
        let requests = double.requests();
        assert_eq!(requests.len(), 1);
        let r = &requests[0];
        assert_eq!(r.authorization.as_deref(), Some(format!("Bearer {KEY}").as_str()));
        assert_eq!(r.body["model"], "judge-model");
        let user = r.body["messages"][1]["content"].as_str().unwrap();
        assert_eq!(r.body["messages"][1]["role"], "user");
        assert!(user.contains("Criterion:\nThe agent cancels the order.\n"), "{user}");
        assert!(
            user.contains(
                "caller: I want to cancel my order\nagent: Sorry to hear that. Which order?\ncaller: Order 77\n\
                 agent: Order 77 is cancelled.\n"
            ),
            "{user}"
        );
        assert!(user.contains("- turn 4: cancel_order {\"order\":77}\n"), "{user}");
        assert_eq!(r.body["messages"][0]["role"], "system");
    }

    #[tokio::test]
    async fn a_failing_verdict_and_a_default_score() {
        let double = ChatDouble::start(|_| {
            (200, r#"{"passed": false, "reason": "The agent never confirmed the cancellation."}"#.to_string())
        })
        .await;
        let e = judged(Some(&double)).await;
        assert!(!e.result.passed && !e.errored);
        assert_eq!(e.result.score, 0.0);
        assert_eq!(e.result.reason, "The agent never confirmed the cancellation.");
    }

    #[tokio::test]
    async fn json_wrapped_in_prose_is_found() {
        let double = ChatDouble::start(|_| {
            (
                200,
                "Let me think. The agent did cancel.\n```json\n{\"passed\": true, \"score\": 7, \"reason\": \"Done {as asked}.\"}\n```\nHope this helps!"
                    .to_string(),
            )
        })
        .await;
        let e = judged(Some(&double)).await;
        assert!(e.result.passed && !e.errored);
        assert_eq!(e.result.score, 1.0, "a score outside 0..1 is clamped");
        assert_eq!(e.result.reason, "Done {as asked}.");
    }

    #[tokio::test]
    async fn an_unparseable_answer_is_an_error_not_a_pass() {
        let double = ChatDouble::start(|_| (200, "Yes, the agent passed.".to_string())).await;
        let e = judged(Some(&double)).await;
        assert!(!e.result.passed && e.errored);
        assert_eq!(e.result.reason, "judge error: the answer has no JSON object: Yes, the agent passed.");
        assert_eq!(e.result.score, 0.0);

        let double = ChatDouble::start(|_| (200, r#"{"passed": "yes", "reason": "ok"}"#.to_string())).await;
        let e = judged(Some(&double)).await;
        assert!(!e.result.passed && e.errored);
        assert_eq!(
            e.result.reason,
            r#"judge error: `passed` is "yes", not true or false: {"passed": "yes", "reason": "ok"}"#
        );

        let double = ChatDouble::start(|_| (200, r#"{"score": 1, "reason": "great"}"#.to_string())).await;
        let e = judged(Some(&double)).await;
        assert!(!e.result.passed && e.errored);
        assert_eq!(e.result.reason, r#"judge error: the answer has no `passed`: {"score": 1, "reason": "great"}"#);
    }

    #[tokio::test]
    async fn an_http_failure_is_an_error_and_hides_the_key() {
        // A misbehaving endpoint that echoes the request's credentials.
        let double = ChatDouble::start_raw(|auth, _| (500, format!("upstream failed; you sent {auth}"))).await;
        let e = judged(Some(&double)).await;
        assert!(!e.result.passed && e.errored);
        assert_eq!(
            e.result.reason,
            "judge error: the LLM endpoint answered HTTP 500: upstream failed; you sent Bearer [redacted]"
        );
        let v = verdict(&outcome(), &[e]);
        assert_eq!(v.status, TestResultStatus::Error);
        assert!(!v.failure_reason.unwrap().contains(KEY));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_an_error() {
        let (_held, port) = crate::engine::closed_port();
        let url = format!("http://127.0.0.1:{port}");
        let llm = LlmEndpoint { base_url: url, model: "m".into(), temperature: None, api_key: Some(KEY.into()) };
        match judge(&Outbound::anywhere(), &llm, "c", &outcome(), Scope::Call).await {
            Decision::Error(reason) => {
                assert!(reason.starts_with("judge error: the LLM endpoint "), "{reason}");
                assert!(!reason.contains(KEY));
            }
            _ => panic!("expected an error"),
        }
    }

    #[tokio::test]
    async fn a_missing_integration_is_an_error() {
        let e = judged(None).await;
        assert!(!e.result.passed && e.errored);
        assert_eq!(
            e.result.reason,
            "judge error: integration `int_j` cannot judge (it was deleted, or it is not an openai_compatible \
             integration with a base_url and a model)"
        );
    }

    #[tokio::test]
    async fn judges_of_one_result_run_at_once() {
        // The double answers nobody until both judges have asked: judges
        // asked one after the other would each time out and error.
        let double = ChatDouble::start_gated(2, |user| {
            let verdict = user.contains("Criterion:\nfirst\n");
            (200, format!(r#"{{"passed": {verdict}, "reason": "criterion seen"}}"#))
        })
        .await;
        let test = evaluators(json!([
            {"type": "llm_judge", "name": "one", "integration_id": "int_j", "prompt": "first"},
            {"type": "llm_judge", "name": "two", "integration_id": "int_j", "prompt": "second", "critical": false},
        ]));
        let judges = HashMap::from([("int_j".to_string(), double.endpoint(None))]);
        let results =
            evaluate(&Outbound::anywhere(), &scenario(json!([]), json!([])), &test, &outcome(), &judges).await;
        let got: Vec<(&str, bool, bool)> =
            results.iter().map(|e| (e.result.name.as_str(), e.result.passed, e.errored)).collect();
        assert_eq!(got, vec![("one", true, false), ("two", false, false)]);
        assert_eq!(double.requests().len(), 2);
        assert!(double.requests().iter().all(|r| r.authorization.is_none()), "no key, no authorization header");
        let v = verdict(&outcome(), &results);
        assert_eq!((v.status, v.score), (TestResultStatus::Passed, 0.5));
    }

    #[tokio::test]
    async fn a_step_judge_is_told_which_reply_to_judge() {
        let double = ChatDouble::start(|_| (200, r#"{"passed": true, "reason": "asked"}"#.to_string())).await;
        let scenario = scenario(
            json!([{"say": "I want to cancel", "expect": [
                {"type": "llm_judge", "name": "asks which", "integration_id": "int_j", "prompt": "Asks which order."}
            ]}]),
            json!([]),
        );
        let mut o = outcome();
        o.step_replies = vec![vec![1]];
        let judges = HashMap::from([("int_j".to_string(), double.endpoint(Some(KEY)))]);
        let results = evaluate(&Outbound::anywhere(), &scenario, &[], &o, &judges).await;
        assert_eq!(results[0].result.name, "step 1: asks which");
        assert!(results[0].result.passed);
        let user = double.requests()[0].body["messages"][1]["content"].as_str().unwrap().to_string();
        assert!(
            user.contains(
                "Judge ONLY the agent's reply to scripted step 1 (the rest is context):\n\
                 turn 2: Sorry to hear that. Which order?\n"
            ),
            "{user}"
        );
    }

    #[test]
    fn answers_are_parsed_strictly() {
        let reason = |d: Result<Decision, String>| match d {
            Ok(Decision::Pass { score, reason }) => format!("pass {score} {reason}"),
            Ok(Decision::Fail { score, reason }) => format!("fail {score} {reason}"),
            Ok(Decision::Error(e)) | Err(e) => format!("error {e}"),
        };
        assert_eq!(reason(parse_answer(r#"{"passed": true}"#)), "pass 1 the judge gave no reason");
        assert_eq!(reason(parse_answer(r#"{"passed": false, "score": -2, "reason": " x "}"#)), "fail 0 x");
        assert_eq!(reason(parse_answer(r#"{"passed": true, "score": "high", "reason": "y"}"#)), "pass 1 y");
        assert_eq!(
            reason(parse_answer(r#"{"passed": 1}"#)),
            r#"error `passed` is 1, not true or false: {"passed": 1}"#
        );
        assert_eq!(reason(parse_answer("")), "error the answer has no JSON object: ");
        assert_eq!(reason(parse_answer("[true]")), "error the answer has no JSON object: [true]");
    }
}
