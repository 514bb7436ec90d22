//! The record of a call as it happens: transcript turns with their timings,
//! tool calls, step replies; and the metrics computed from them at the end.

use chrono::Utc;
use sparring_server::types::{self, CallMetrics, LatencyPercentiles, ScenarioMode, TurnRole};
use tokio::time::Instant;

use super::{Ending, Reply};
use crate::engine::{CallPlan, Outcome};

pub(super) struct Recorder {
    /// The start of the call: every `*_ms` is measured from here.
    t0: Instant,
    started_at: chrono::DateTime<Utc>,
    transcript: Vec<types::TranscriptTurn>,
    tool_calls: Vec<types::ToolCall>,
    step_replies: Vec<Vec<usize>>,
    /// How many scripted steps the caller said: the steps after them were
    /// never reached and get no `step_replies` entry.
    steps_said: usize,
    agent_ended: bool,
    /// When the agent's first words came (ms from the start): within a
    /// turn, they may come after its first frame (a tool call).
    first_words_ms: Option<i64>,
    /// A connection to the agent was made (see `Outcome::reached_agent`).
    reached: bool,
    /// The bytes of every turn's words and tool calls so far.
    bytes: usize,
    /// Of `bytes`, the caller's lines.
    caller_bytes: usize,
}

impl Recorder {
    pub(super) fn start(plan: &CallPlan) -> Self {
        let steps = match plan.scenario.mode {
            ScenarioMode::Scripted => plan.scenario.steps.len(),
            ScenarioMode::Simulated => 0,
        };
        Recorder {
            t0: Instant::now(),
            started_at: Utc::now(),
            transcript: Vec::new(),
            tool_calls: Vec::new(),
            step_replies: vec![Vec::new(); steps],
            steps_said: 0,
            agent_ended: false,
            first_words_ms: None,
            reached: false,
            bytes: 0,
            caller_bytes: 0,
        }
    }

    /// The bytes of every turn's words and tool calls so far.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Of [`Recorder::bytes`], those of the caller's lines (the rest are
    /// the agent's words and tool calls).
    pub(super) fn caller_bytes(&self) -> usize {
        self.caller_bytes
    }

    /// Something reached the agent: a connection to it was made.
    pub(super) fn reached(&mut self) {
        self.reached = true;
    }

    /// Whether something reached the agent (see [`Recorder::reached`]).
    pub(super) fn has_reached(&self) -> bool {
        self.reached
    }

    pub(super) fn call_start(&self) -> Instant {
        self.t0
    }

    pub(super) fn transcript(&self) -> &[types::TranscriptTurn] {
        &self.transcript
    }

    /// Whether `turns` more turns fit in `max_turns`.
    pub(super) fn has_room(&self, max_turns: u32, turns: usize) -> bool {
        self.transcript.len() + turns <= max_turns as usize
    }

    /// Whether the agent asked to end the call in one of its replies.
    pub(super) fn agent_ended(&self) -> bool {
        self.agent_ended
    }

    fn ms(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.t0).as_millis()).unwrap_or(i64::MAX)
    }

    /// The caller said `line` at `at`.
    pub(super) fn caller(&mut self, line: &str, at: Instant) {
        let ms = self.ms(at);
        self.bytes += line.len();
        self.caller_bytes += line.len();
        self.transcript.push(types::TranscriptTurn {
            role: TurnRole::Caller,
            text: line.to_string(),
            start_ms: ms,
            end_ms: ms,
            latency_ms: None,
        });
    }

    /// Records the agent's reply as one transcript turn (its messages'
    /// contents joined with a single space) with its tool calls, and returns
    /// the turn's index. A reply with neither words nor tool calls adds no
    /// turn: there is nothing to show or to time.
    pub(super) fn agent(&mut self, reply: Reply) -> Option<usize> {
        self.agent_ended |= reply.end_call;
        let text = joined(reply.texts.iter().map(String::as_str));
        if text.is_empty() && reply.tool_calls.is_empty() {
            return None;
        }
        let first = reply.first_at.unwrap_or_else(Instant::now);
        let last = reply.last_at.unwrap_or(first);
        if !text.is_empty() && self.first_words_ms.is_none() {
            self.first_words_ms = Some(self.ms(reply.words_at.unwrap_or(first)));
        }
        let index = self.transcript.len();
        self.bytes += text.len();
        self.transcript.push(types::TranscriptTurn {
            role: TurnRole::Agent,
            text,
            start_ms: self.ms(first),
            end_ms: self.ms(last),
            latency_ms: Some(
                i64::try_from(first.saturating_duration_since(reply.sent_at).as_millis()).unwrap_or(i64::MAX),
            ),
        });
        self.tool_calls_of(index, reply.tool_calls);
        Some(index)
    }

    /// Frames the agent sent after its last turn ended (`late`, a
    /// continuation of that turn's reply): their words are appended to that
    /// turn and their tool calls are its own. If that turn added no
    /// transcript turn (it said nothing), they make it one, timed from the
    /// turn's first frame; its index is returned, as [`Recorder::agent`]
    /// does.
    pub(super) fn late(&mut self, late: Reply) -> Option<usize> {
        let index = match self.transcript.last() {
            Some(turn) if turn.role == TurnRole::Agent => self.transcript.len() - 1,
            _ => return self.agent(late),
        };
        self.agent_ended |= late.end_call;
        let end_ms = late.last_at.map(|at| self.ms(at));
        if let Some(at) = late.words_at.filter(|_| self.first_words_ms.is_none()) {
            self.first_words_ms = Some(self.ms(at));
        }
        self.bytes += late.texts.iter().map(|t| t.len() + 1).sum::<usize>();
        let turn = &mut self.transcript[index];
        turn.text = joined(std::iter::once(turn.text.as_str()).chain(late.texts.iter().map(String::as_str)));
        turn.end_ms = turn.end_ms.max(end_ms.unwrap_or(turn.end_ms));
        self.tool_calls_of(index, late.tool_calls);
        None
    }

    /// Records `calls` as made in transcript turn `index`.
    fn tool_calls_of(&mut self, index: usize, calls: Vec<(String, serde_json::Map<String, serde_json::Value>)>) {
        let turn = i32::try_from(index).unwrap_or(i32::MAX);
        self.bytes += calls
            .iter()
            .map(|(name, arguments)| name.len() + serde_json::to_string(arguments).map_or(0, |a| a.len()))
            .sum::<usize>();
        self.tool_calls.extend(calls.into_iter().map(|(name, arguments)| types::ToolCall { name, arguments, turn }));
    }

    /// The caller said scripted step `step`'s line.
    pub(super) fn step_said(&mut self, step: usize) {
        self.steps_said = self.steps_said.max(step + 1);
    }

    /// The agent's reply to scripted step `step` is transcript turn `index`.
    pub(super) fn step_reply(&mut self, step: usize, index: usize) {
        if let Some(replies) = self.step_replies.get_mut(step) {
            replies.push(index);
        }
    }

    pub(super) fn finish(mut self, ending: Ending) -> Outcome {
        let mut metrics = metrics(&self.transcript);
        // The transcript knows when a turn began, not when its words came.
        if self.first_words_ms.is_some() {
            metrics.time_to_first_word_ms = self.first_words_ms;
        }
        self.step_replies.truncate(self.steps_said);
        Outcome {
            started_at: self.started_at,
            duration_ms: u64::try_from(ending.at.saturating_duration_since(self.t0).as_millis()).unwrap_or(u64::MAX),
            transcript: self.transcript,
            tool_calls: self.tool_calls,
            ended_reason: ending.reason,
            error: ending.error,
            caller_error: ending.caller_error,
            metrics,
            step_replies: self.step_replies,
            reached_agent: self.reached,
        }
    }
}

/// Turns, time to first word and latency percentiles of a transcript.
pub(super) fn metrics(transcript: &[types::TranscriptTurn]) -> CallMetrics {
    let agent = || transcript.iter().filter(|t| t.role == TurnRole::Agent);
    let mut latencies: Vec<i64> = agent().filter_map(|t| t.latency_ms).collect();
    latencies.sort_unstable();
    CallMetrics {
        turns: i32::try_from(transcript.len()).unwrap_or(i32::MAX),
        time_to_first_word_ms: agent().find(|t| !t.text.is_empty()).map(|t| t.start_ms),
        latency_ms: LatencyPercentiles {
            p50: nearest_rank(&latencies, 50),
            p90: nearest_rank(&latencies, 90),
            p95: nearest_rank(&latencies, 95),
            max: latencies.last().copied(),
        },
    }
}

/// The `p`th percentile of `sorted` by the nearest-rank method: the value
/// at rank ⌈p/100 · n⌉ (1-based); `None` for no values.
pub(super) fn nearest_rank(sorted: &[i64], p: usize) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// Pieces of what the agent said, trimmed, joined with a single space,
/// the empty ones left out.
fn joined<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    texts.map(str::trim).filter(|t| !t.is_empty()).collect::<Vec<_>>().join(" ")
}
