//! The rule evaluators: deterministic checks of an [`Outcome`], each giving
//! a pass or a failure with a reason a person can check against the
//! transcript (turns are numbered from 1 over the whole transcript).

use std::ops::Range;

use serde_json::{Map, Value};
use sparring_server::types::{EndedReason, Evaluator, LatencyPercentile, ToolCall, TranscriptTurn, TurnRole};

use super::{Decision, Scope};
use crate::engine::llm::clip;
use crate::engine::Outcome;

/// How many characters of a turn a reason quotes.
const QUOTE_MAX: usize = 160;
/// How many characters before a match a quote starts.
const QUOTE_BEFORE: usize = 40;
/// How many characters of an evaluator's own text or pattern a reason shows.
const SHOWN_MAX: usize = 200;
/// How many tool calls a failure lists.
const CALLS_LISTED: usize = 10;

/// Runs the rule `evaluator` (anything but `llm_judge`) over `scope`.
pub(super) fn check(evaluator: &Evaluator, outcome: &Outcome, scope: Scope<'_>) -> Decision {
    match evaluator {
        Evaluator::Contains { text, case_sensitive, .. } => contains(outcome, scope, text, *case_sensitive, true),
        Evaluator::NotContains { text, case_sensitive, .. } => contains(outcome, scope, text, *case_sensitive, false),
        Evaluator::Regex { pattern, .. } => regex(outcome, scope, pattern),
        Evaluator::MaxLatencyMs { percentile, ms, .. } => max_latency(outcome, scope, *percentile, ms.get() as i64),
        Evaluator::MaxTurns { turns, .. } => max_turns(outcome, scope, i64::from(turns.get())),
        Evaluator::AgentEndedCall { .. } => agent_ended_call(outcome, scope),
        Evaluator::ToolCalled { tool, arguments, .. } => tool_called(outcome, scope, tool, arguments),
        Evaluator::LlmJudge { .. } => Decision::Error("an llm_judge is not a rule".to_string()),
    }
}

fn pass(reason: String) -> Decision {
    Decision::Pass { score: 1.0, reason }
}

fn fail(reason: String) -> Decision {
    Decision::Fail { score: 0.0, reason }
}

/// The agent's turns in scope, with their transcript index.
fn agent_turns<'a>(outcome: &'a Outcome, scope: Scope<'_>) -> Vec<(usize, &'a TranscriptTurn)> {
    outcome.transcript.iter().enumerate().filter(|(i, t)| t.role == TurnRole::Agent && scope.covers(*i)).collect()
}

/// The first agent turn in scope where `re` matches, with the match.
fn first_match<'a>(
    turns: &[(usize, &'a TranscriptTurn)],
    re: &regex::Regex,
) -> Option<(usize, &'a TranscriptTurn, Range<usize>)> {
    turns.iter().find_map(|(i, t)| re.find(&t.text).map(|m| (*i, *t, m.range())))
}

/// The turn around a match, quoted and clipped so the match shows.
fn quote(text: &str, at: Range<usize>) -> String {
    let from = text[..at.start].char_indices().rev().nth(QUOTE_BEFORE - 1).map_or(0, |(i, _)| i);
    let lead = if from > 0 { "…" } else { "" };
    format!("\"{lead}{}\"", clip(&text[from..], QUOTE_MAX))
}

/// `contains` (`want` true) and `not_contains` (`want` false): a literal
/// search, case-insensitive (Unicode case folding) unless asked otherwise.
fn contains(outcome: &Outcome, scope: Scope<'_>, text: &str, case_sensitive: bool, want: bool) -> Decision {
    let re = match regex::RegexBuilder::new(&regex::escape(text)).case_insensitive(!case_sensitive).build() {
        Ok(re) => re,
        Err(e) => return Decision::Error(format!("the text cannot be searched for: {e}")),
    };
    let turns = agent_turns(outcome, scope);
    let place = scope.place();
    let case = if case_sensitive { " (case-sensitive)" } else { "" };
    let text = clip(text, SHOWN_MAX);
    match (first_match(&turns, &re), want) {
        (Some((i, turn, at)), want) => {
            let reason = format!("the agent said \"{text}\" in turn {}: {}", i + 1, quote(&turn.text, at));
            if want {
                pass(reason)
            } else {
                fail(reason)
            }
        }
        (None, _) if turns.is_empty() => {
            let reason = format!("the agent said nothing {place}");
            if want {
                fail(reason)
            } else {
                pass(reason)
            }
        }
        (None, true) => fail(format!("the agent never said \"{text}\" {place}{case}")),
        (None, false) => pass(format!("the agent never said \"{text}\" {place}{case}")),
    }
}

fn regex(outcome: &Outcome, scope: Scope<'_>, pattern: &str) -> Decision {
    let re = match regex::Regex::new(pattern) {
        Ok(re) => re,
        Err(e) => return Decision::Error(format!("the pattern /{pattern}/ does not compile: {e}")),
    };
    let turns = agent_turns(outcome, scope);
    let place = scope.place();
    let pattern = clip(pattern, SHOWN_MAX);
    match first_match(&turns, &re) {
        Some((i, turn, at)) => pass(format!(
            "the agent said \"{}\" (matching /{pattern}/) in turn {}: {}",
            clip(&turn.text[at.clone()], QUOTE_MAX),
            i + 1,
            quote(&turn.text, at)
        )),
        None if turns.is_empty() => fail(format!("the agent said nothing {place}")),
        None => fail(format!("the agent never said anything matching /{pattern}/ {place}")),
    }
}

fn percentile_name(p: LatencyPercentile) -> &'static str {
    match p {
        LatencyPercentile::P50 => "p50",
        LatencyPercentile::P90 => "p90",
        LatencyPercentile::P95 => "p95",
        LatencyPercentile::Max => "max",
    }
}

/// Nearest-rank percentile of `values` (sorted in place); `None` if empty.
fn nearest_rank(values: &mut [i64], p: LatencyPercentile) -> Option<i64> {
    values.sort_unstable();
    let n = values.len();
    let rank = match p {
        LatencyPercentile::P50 => (n * 50).div_ceil(100),
        LatencyPercentile::P90 => (n * 90).div_ceil(100),
        LatencyPercentile::P95 => (n * 95).div_ceil(100),
        LatencyPercentile::Max => n,
    };
    values.get(rank.max(1) - 1).copied()
}

/// The whole call uses the conversation's measured percentiles; a step, the
/// latencies of its reply's agent turns.
fn max_latency(outcome: &Outcome, scope: Scope<'_>, p: LatencyPercentile, ms: i64) -> Decision {
    let measured = match scope {
        Scope::Call => {
            let l = &outcome.metrics.latency_ms;
            match p {
                LatencyPercentile::P50 => l.p50,
                LatencyPercentile::P90 => l.p90,
                LatencyPercentile::P95 => l.p95,
                LatencyPercentile::Max => l.max,
            }
        }
        Scope::Step { .. } => {
            let mut values: Vec<i64> = agent_turns(outcome, scope).iter().filter_map(|(_, t)| t.latency_ms).collect();
            nearest_rank(&mut values, p)
        }
    };
    let (name, place) = (percentile_name(p), scope.place());
    match measured {
        None => fail(format!("the agent said nothing {place}, so there is no {name} latency to compare with {ms} ms")),
        Some(v) if v <= ms => pass(format!("{name} latency {place} was {v} ms, within {ms} ms")),
        Some(v) => fail(format!("{name} latency {place} was {v} ms, more than {ms} ms")),
    }
}

fn count(n: i64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The whole call counts its transcript turns (both roles, as measured); a
/// step, the agent turns of its reply.
fn max_turns(outcome: &Outcome, scope: Scope<'_>, max: i64) -> Decision {
    let (taken, what) = match scope {
        Scope::Call => (i64::from(outcome.metrics.turns), "the call".to_string()),
        Scope::Step { index, .. } => {
            (agent_turns(outcome, scope).len() as i64, format!("the agent's reply to step {}", index + 1))
        }
    };
    if taken <= max {
        pass(format!("{what} took {}, within {max}", count(taken, "turn")))
    } else {
        fail(format!("{what} took {}, more than {max}", count(taken, "turn")))
    }
}

/// How the call ended, when it was not the agent who ended it.
fn how_it_ended(reason: EndedReason) -> &'static str {
    match reason {
        EndedReason::CallerDone => "the caller hung up when the scenario was done",
        EndedReason::AgentEnded => "the agent ended it",
        EndedReason::MaxTurns => "it reached the scenario's turn limit",
        EndedReason::MaxDuration => "it reached the time limit",
        EndedReason::AgentError => "it ended on an agent error",
        EndedReason::Cancelled => "it was cancelled",
    }
}

/// For a step: the agent ended the call in its reply to that step, which is
/// then the last step the call reached.
fn agent_ended_call(outcome: &Outcome, scope: Scope<'_>) -> Decision {
    let ended = outcome.ended_reason == EndedReason::AgentEnded;
    match scope {
        Scope::Call if ended => pass("the agent ended the call".to_string()),
        Scope::Call => fail(format!("the agent did not end the call: {}", how_it_ended(outcome.ended_reason))),
        Scope::Step { index, last: true, .. } if ended => {
            pass(format!("the agent ended the call in its reply to step {}", index + 1))
        }
        Scope::Step { index, .. } if ended => {
            fail(format!("the agent ended the call later, not in its reply to step {}", index + 1))
        }
        Scope::Step { index, .. } => fail(format!(
            "the agent did not end the call in its reply to step {}: {}",
            index + 1,
            how_it_ended(outcome.ended_reason)
        )),
    }
}

/// A tool call, for a reason: "`book` {"day":"tuesday"} (turn 3)".
fn describe(call: &ToolCall) -> String {
    format!(
        "`{}` {} (turn {})",
        call.name,
        clip(&Value::Object(call.arguments.clone()).to_string(), SHOWN_MAX),
        i64::from(call.turn) + 1
    )
}

fn tool_called(outcome: &Outcome, scope: Scope<'_>, tool: &str, expected: &Map<String, Value>) -> Decision {
    let seen: Vec<&ToolCall> =
        outcome.tool_calls.iter().filter(|c| usize::try_from(c.turn).is_ok_and(|t| scope.covers(t))).collect();
    let place = scope.place();
    if let Some(call) = seen.iter().find(|c| c.name == tool && object_contains(&c.arguments, expected)) {
        return pass(format!("the agent called {}", describe(call)));
    }
    let wanted = if expected.is_empty() {
        format!("the agent never called `{tool}` {place}")
    } else {
        format!(
            "the agent never called `{tool}` with arguments containing {} {place}",
            clip(&Value::Object(expected.clone()).to_string(), SHOWN_MAX)
        )
    };
    if seen.is_empty() {
        return fail(format!("{wanted}; it called no tool"));
    }
    let mut listed: Vec<String> = seen.iter().take(CALLS_LISTED).map(|c| describe(c)).collect();
    if seen.len() > CALLS_LISTED {
        listed.push(format!("and {} more", seen.len() - CALLS_LISTED));
    }
    fail(format!("{wanted}; calls seen: {}", listed.join(", ")))
}

/// Subset match: every key of `expected` is in `actual` with a value that
/// matches (objects recursively by subset, everything else equal).
pub(super) fn object_contains(actual: &Map<String, Value>, expected: &Map<String, Value>) -> bool {
    expected.iter().all(|(k, want)| actual.get(k).is_some_and(|got| value_contains(got, want)))
}

fn value_contains(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => object_contains(a, e),
        _ => json_equal(actual, expected),
    }
}

/// Equality where numbers compare by value (an agent may send `2` or `2.0`).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(x), Some(y), _, _) => x == y,
            (_, _, Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{evaluators, OutcomeBuilder};
    use super::*;
    use serde_json::json;

    fn one(json: Value) -> Evaluator {
        evaluators(json!([json])).remove(0)
    }

    /// (passed, reason) of `evaluator` over the whole call; panics on error.
    fn on_call(evaluator: Value, outcome: &Outcome) -> (bool, String) {
        decided(check(&one(evaluator), outcome, Scope::Call))
    }

    fn decided(d: Decision) -> (bool, String) {
        match d {
            Decision::Pass { score, reason } => {
                assert_eq!(score, 1.0);
                (true, reason)
            }
            Decision::Fail { score, reason } => {
                assert_eq!(score, 0.0);
                (false, reason)
            }
            Decision::Error(e) => panic!("unexpected error: {e}"),
        }
    }

    fn talk() -> Outcome {
        OutcomeBuilder::new()
            .caller("Hi, can I get a REFUND?")
            .agent("Hello! I can help with a Refund.", 400)
            .caller("Great, order 1234")
            .agent("Your refund for order 1234 is on its way.", 900)
            .build()
    }

    #[test]
    fn contains_looks_at_agent_turns_only() {
        let o = talk();
        assert_eq!(
            on_call(json!({"type": "contains", "name": "c", "text": "refund"}), &o),
            (true, "the agent said \"refund\" in turn 2: \"Hello! I can help with a Refund.\"".into())
        );
        // The caller said "Great"; the agent never did.
        assert_eq!(
            on_call(json!({"type": "contains", "name": "c", "text": "great"}), &o),
            (false, "the agent never said \"great\" in the call".into())
        );
    }

    #[test]
    fn case_sensitivity() {
        let o = talk();
        // Case-sensitive "REFUND" is only in the caller's line.
        assert_eq!(
            on_call(json!({"type": "contains", "name": "c", "text": "REFUND", "case_sensitive": true}), &o),
            (false, "the agent never said \"REFUND\" in the call (case-sensitive)".into())
        );
        assert_eq!(
            on_call(json!({"type": "contains", "name": "c", "text": "refund", "case_sensitive": true}), &o),
            (true, "the agent said \"refund\" in turn 4: \"Your refund for order 1234 is on its way.\"".into())
        );
        assert_eq!(
            on_call(json!({"type": "not_contains", "name": "n", "text": "REFUND", "case_sensitive": true}), &o),
            (true, "the agent never said \"REFUND\" in the call (case-sensitive)".into())
        );
        // Case folding is Unicode-aware, and the quote is of the original text.
        let o = OutcomeBuilder::new().agent("Grüße aus ÖSTERREICH", 10).build();
        assert_eq!(
            on_call(json!({"type": "contains", "name": "c", "text": "österreich"}), &o),
            (true, "the agent said \"österreich\" in turn 1: \"Grüße aus ÖSTERREICH\"".into())
        );
        // Regex metacharacters in the text are literal.
        assert_eq!(
            on_call(
                json!({"type": "contains", "name": "c", "text": "a.b"}),
                &OutcomeBuilder::new().agent("axb", 1).build()
            ),
            (false, "the agent never said \"a.b\" in the call".into())
        );
    }

    #[test]
    fn not_contains() {
        let o = talk();
        assert_eq!(
            on_call(json!({"type": "not_contains", "name": "n", "text": "on its way"}), &o),
            (false, "the agent said \"on its way\" in turn 4: \"Your refund for order 1234 is on its way.\"".into())
        );
        assert_eq!(
            on_call(json!({"type": "not_contains", "name": "n", "text": "great"}), &o),
            (true, "the agent never said \"great\" in the call".into())
        );
        let silent = OutcomeBuilder::new().caller("Hello?").build();
        assert_eq!(
            on_call(json!({"type": "not_contains", "name": "n", "text": "x"}), &silent),
            (true, "the agent said nothing in the call".into())
        );
        assert_eq!(
            on_call(json!({"type": "contains", "name": "n", "text": "x"}), &silent),
            (false, "the agent said nothing in the call".into())
        );
    }

    #[test]
    fn long_turns_are_quoted_around_the_match() {
        let text = format!("{} the code is 4711 {}", "a".repeat(300), "b".repeat(300));
        let o = OutcomeBuilder::new().agent(&text, 1).build();
        let (passed, reason) = on_call(json!({"type": "contains", "name": "c", "text": "4711"}), &o);
        assert!(passed);
        let quoted = format!("\"…{} the code is 4711 {}…\"", "a".repeat(27), "b".repeat(160 - 27 - 18));
        assert_eq!(reason, format!("the agent said \"4711\" in turn 1: {quoted}"));
    }

    #[test]
    fn regex() {
        let o = talk();
        assert_eq!(
            on_call(json!({"type": "regex", "name": "r", "pattern": "order \\d+"}), &o),
            (
                true,
                "the agent said \"order 1234\" (matching /order \\d+/) in turn 4: \"Your refund for order 1234 is on its way.\""
                    .into()
            )
        );
        assert_eq!(
            on_call(json!({"type": "regex", "name": "r", "pattern": "^Great"}), &o),
            (false, "the agent never said anything matching /^Great/ in the call".into())
        );
        // Validation rejects such a pattern; still no panic here.
        match check(&one(json!({"type": "regex", "name": "r", "pattern": "(("})), &o, Scope::Call) {
            Decision::Error(e) => assert!(e.starts_with("the pattern /((/ does not compile: "), "{e}"),
            _ => panic!("expected an error"),
        }
    }

    #[test]
    fn max_latency_uses_the_measured_percentile() {
        let o = OutcomeBuilder::new().agent("a", 100).caller("b").agent("c", 300).caller("d").agent("e", 2000).build();
        assert_eq!(
            on_call(json!({"type": "max_latency_ms", "name": "l", "percentile": "p50", "ms": 300}), &o),
            (true, "p50 latency in the call was 300 ms, within 300 ms".into())
        );
        assert_eq!(
            on_call(json!({"type": "max_latency_ms", "name": "l", "percentile": "max", "ms": 1999}), &o),
            (false, "max latency in the call was 2000 ms, more than 1999 ms".into())
        );
        assert_eq!(
            on_call(json!({"type": "max_latency_ms", "name": "l", "percentile": "p95", "ms": 5000}), &o),
            (true, "p95 latency in the call was 2000 ms, within 5000 ms".into())
        );
        let silent = OutcomeBuilder::new().caller("Hello?").build();
        assert_eq!(
            on_call(json!({"type": "max_latency_ms", "name": "l", "percentile": "p90", "ms": 800}), &silent),
            (false, "the agent said nothing in the call, so there is no p90 latency to compare with 800 ms".into())
        );
        // A step looks at its own reply's latency only.
        let step = Scope::Step { index: 1, turns: &[2], last: false };
        let e = one(json!({"type": "max_latency_ms", "name": "l", "percentile": "p50", "ms": 250}));
        assert_eq!(
            decided(check(&e, &o, step)),
            (false, "p50 latency in its reply to step 2 was 300 ms, more than 250 ms".into())
        );
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<i64> = (1..=20).rev().collect();
        assert_eq!(nearest_rank(&mut v, LatencyPercentile::P50), Some(10));
        assert_eq!(nearest_rank(&mut v, LatencyPercentile::P90), Some(18));
        assert_eq!(nearest_rank(&mut v, LatencyPercentile::P95), Some(19));
        assert_eq!(nearest_rank(&mut v, LatencyPercentile::Max), Some(20));
        assert_eq!(nearest_rank(&mut [7], LatencyPercentile::P50), Some(7));
        assert_eq!(nearest_rank(&mut [], LatencyPercentile::Max), None);
    }

    #[test]
    fn max_turns() {
        let o = talk();
        assert_eq!(
            on_call(json!({"type": "max_turns", "name": "t", "turns": 4}), &o),
            (true, "the call took 4 turns, within 4".into())
        );
        assert_eq!(
            on_call(json!({"type": "max_turns", "name": "t", "turns": 3}), &o),
            (false, "the call took 4 turns, more than 3".into())
        );
        let step = Scope::Step { index: 0, turns: &[1], last: false };
        assert_eq!(
            decided(check(&one(json!({"type": "max_turns", "name": "t", "turns": 1})), &o, step)),
            (true, "the agent's reply to step 1 took 1 turn, within 1".into())
        );
    }

    #[test]
    fn agent_ended_call() {
        let e = json!({"type": "agent_ended_call", "name": "e"});
        let ended = OutcomeBuilder::new().agent("Bye", 1).ended(EndedReason::AgentEnded).build();
        assert_eq!(on_call(e.clone(), &ended), (true, "the agent ended the call".into()));
        let hung_up = OutcomeBuilder::new().agent("Bye", 1).ended(EndedReason::CallerDone).build();
        assert_eq!(
            on_call(e.clone(), &hung_up),
            (false, "the agent did not end the call: the caller hung up when the scenario was done".into())
        );
        let limit = OutcomeBuilder::new().ended(EndedReason::MaxTurns).build();
        assert_eq!(
            on_call(e.clone(), &limit),
            (false, "the agent did not end the call: it reached the scenario's turn limit".into())
        );
        let e = one(e);
        assert_eq!(
            decided(check(&e, &ended, Scope::Step { index: 2, turns: &[0], last: true })),
            (true, "the agent ended the call in its reply to step 3".into())
        );
        assert_eq!(
            decided(check(&e, &ended, Scope::Step { index: 1, turns: &[0], last: false })),
            (false, "the agent ended the call later, not in its reply to step 2".into())
        );
        assert_eq!(
            decided(check(&e, &hung_up, Scope::Step { index: 1, turns: &[0], last: true })),
            (
                false,
                "the agent did not end the call in its reply to step 2: the caller hung up when the scenario was done"
                    .into()
            )
        );
    }

    fn with_tools() -> Outcome {
        OutcomeBuilder::new()
            .caller("Book me Tuesday at 10")
            .agent("Checking.", 100)
            .tool("check_availability", json!({"day": "tuesday"}))
            .caller("OK")
            .agent("Booked.", 100)
            .tool("book", json!({"day": "tuesday", "slot": {"hour": 10, "minute": 0}, "people": ["ann", "bo"], "n": 2}))
            .build()
    }

    #[test]
    fn tool_called_passes_on_a_subset() {
        let o = with_tools();
        let booked = "the agent called `book` {\"day\":\"tuesday\",\"n\":2,\"people\":[\"ann\",\"bo\"],\"slot\":{\"hour\":10,\"minute\":0}} (turn 4)";
        for args in [
            json!({}),
            json!({"day": "tuesday"}),
            json!({"slot": {"hour": 10}}),
            json!({"slot": {}}),
            json!({"people": ["ann", "bo"]}),
            json!({"n": 2.0}),
            json!({"day": "tuesday", "slot": {"hour": 10, "minute": 0}, "people": ["ann", "bo"], "n": 2}),
        ] {
            assert_eq!(
                on_call(json!({"type": "tool_called", "name": "t", "tool": "book", "arguments": args}), &o),
                (true, booked.to_string()),
                "{args}"
            );
        }
    }

    #[test]
    fn tool_called_fails_naming_the_calls_seen() {
        let o = with_tools();
        let seen = "calls seen: `check_availability` {\"day\":\"tuesday\"} (turn 2), `book` {\"day\":\"tuesday\",\"n\":2,\"people\":[\"ann\",\"bo\"],\"slot\":{\"hour\":10,\"minute\":0}} (turn 4)";
        for (args, shown) in [
            (json!({"day": "Tuesday"}), "{\"day\":\"Tuesday\"}"),
            (json!({"slot": {"hour": 11}}), "{\"slot\":{\"hour\":11}}"),
            (json!({"people": ["ann"]}), "{\"people\":[\"ann\"]}"),
            (json!({"people": ["bo", "ann"]}), "{\"people\":[\"bo\",\"ann\"]}"),
            (json!({"n": "2"}), "{\"n\":\"2\"}"),
            (json!({"missing": null}), "{\"missing\":null}"),
            (json!({"slot": 10}), "{\"slot\":10}"),
        ] {
            assert_eq!(
                on_call(json!({"type": "tool_called", "name": "t", "tool": "book", "arguments": args}), &o),
                (false, format!("the agent never called `book` with arguments containing {shown} in the call; {seen}")),
                "{args}"
            );
        }
        assert_eq!(
            on_call(json!({"type": "tool_called", "name": "t", "tool": "cancel"}), &o),
            (false, format!("the agent never called `cancel` in the call; {seen}"))
        );
        assert_eq!(
            on_call(json!({"type": "tool_called", "name": "t", "tool": "cancel"}), &talk()),
            (false, "the agent never called `cancel` in the call; it called no tool".into())
        );
        // A step sees only the calls of its reply.
        let e = one(json!({"type": "tool_called", "name": "t", "tool": "book"}));
        assert_eq!(
            decided(check(&e, &o, Scope::Step { index: 0, turns: &[1], last: false })),
            (
                false,
                "the agent never called `book` in its reply to step 1; calls seen: `check_availability` {\"day\":\"tuesday\"} (turn 2)"
                    .into()
            )
        );
    }

    #[test]
    fn subset_edge_cases() {
        let m = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        // Objects nested in arrays compare whole, not by subset.
        assert!(!object_contains(&m(json!({"a": [{"x": 1, "y": 2}]})), &m(json!({"a": [{"x": 1}]}))));
        assert!(object_contains(&m(json!({"a": [{"x": 1, "y": 2}]})), &m(json!({"a": [{"y": 2, "x": 1.0}]}))));
        // null is a value to match, not "anything".
        assert!(object_contains(&m(json!({"a": null})), &m(json!({"a": null}))));
        assert!(!object_contains(&m(json!({"a": 0})), &m(json!({"a": null}))));
        assert!(!object_contains(&m(json!({"a": false})), &m(json!({"a": null}))));
        assert!(!object_contains(&m(json!({"a": 1})), &m(json!({"a": true}))));
        // Deep nesting.
        assert!(object_contains(&m(json!({"a": {"b": {"c": 1, "d": 2}, "e": 3}})), &m(json!({"a": {"b": {"d": 2}}}))));
        // Large integers are compared exactly.
        assert!(!object_contains(&m(json!({"a": 9007199254740993_i64})), &m(json!({"a": 9007199254740992_i64}))));
        assert!(object_contains(&m(json!({"a": u64::MAX})), &m(json!({"a": u64::MAX}))));
        assert!(!object_contains(&m(json!({"a": -1})), &m(json!({"a": u64::MAX}))));
    }
}
