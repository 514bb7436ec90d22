//! One conversation with the agent under test: [`converse`] plays the caller
//! of a [`CallPlan`] over its channel and records what happened as an
//! [`Outcome`].
//!
//! - `http` and `websocket`: the two channel clients, exactly as the
//!   agent-facing protocol says (one POST per caller event; one connection
//!   per call with JSON text frames).
//! - `simulated`: the caller played by an LLM toward the scenario's goal.
//! - `record`: the transcript, tool calls, timings and metrics.
//!
//! How a call goes: the caller opens with the scenario's `first_message`
//! (sent with `start`), or, without one, sends `start` with no line and the
//! agent greets first. Then, turn by turn, the caller says its next line
//! (the next scripted step, or the simulated caller's answer) and the agent
//! replies. The call ends when:
//! - the agent ends it (`agent_ended`, checked after every reply, also a
//!   reply to the caller's last words);
//! - the caller has nothing more to say (`caller_done`: steps ran out, or
//!   the simulated caller said `done`);
//! - the token is cancelled (`cancelled`, checked before each caller line,
//!   also while a simulated caller's LLM writes it; a running turn
//!   finishes);
//! - `max_duration` passes (`max_duration`, at any await);
//! - the next caller line and the agent's reply would not fit in
//!   `max_turns` transcript turns (`max_turns`): a line is said only when its
//!   reply has room, so the transcript never exceeds the limit and no reply
//!   is thrown away;
//! - the agent fails (`agent_error`, with a reason naming the turn).
//!
//! A failure of the simulated caller's own LLM is nobody's fault on the
//! agent's side: the caller hangs up (`caller_done`) and the outcome carries
//! `caller_error` so the verdict is `error`, not `failed`. So is a record
//! grown past its bound mostly by the caller's lines.
//!
//! Every await is bounded by the channel's turn timeout or by the call's
//! deadline, so a call never hangs; nothing here panics on what the agent or
//! the LLM sends.

mod http;
mod record;
mod simulated;
mod websocket;

#[cfg(test)]
mod tests;

use crate::engine::outbound::Outbound;
use std::time::Duration;

use serde_json::{Map, Value};
use sparring_server::types::{self, ChannelKind, EndedReason, ScenarioMode};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{CallPlan, Outcome};
use record::Recorder;

/// The header that carries our call id on every request to the agent.
const CALL_ID_HEADER: &str = "x-sparring-call-id";

/// An agent turn larger than this (an http reply's body, the text frames of
/// a websocket turn) is refused: a reply is a few sentences.
const MAX_REPLY_BYTES: usize = 1 << 20;

/// A call whose record (every turn's words and tool calls) grows past this
/// is ended as an agent error: a result is kept, judged and served whole,
/// and an hour of talk is some 100 KB.
const MAX_RECORD_BYTES: usize = 2 << 20;

/// Has the conversation of `plan` with the agent and records it. Never
/// panics and never hangs: see the module documentation for how it ends.
pub async fn converse(http: &Outbound, plan: &CallPlan, cancel: &CancellationToken) -> Outcome {
    let mut rec = Recorder::start(plan);
    let ending = drive(http, plan, cancel, &mut rec).await;
    rec.finish(ending)
}

/// What the agent answered to one caller event.
#[derive(Debug)]
struct Reply {
    /// The contents of its messages, in order.
    texts: Vec<String>,
    tool_calls: Vec<(String, Map<String, Value>)>,
    end_call: bool,
    /// When the caller's line (or the `start` without one) went out.
    sent_at: Instant,
    /// The arrival of the reply (http) or of its first and last frames
    /// (websocket); `None` when nothing arrived.
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    /// The arrival of its first words: the reply (http), or its first
    /// `message` frame with words (websocket), which may come after a
    /// `tool_call` frame; `None` when it said nothing.
    words_at: Option<Instant>,
}

impl Reply {
    fn new(sent_at: Instant) -> Self {
        Reply {
            texts: Vec::new(),
            tool_calls: Vec::new(),
            end_call: false,
            sent_at,
            first_at: None,
            last_at: None,
            words_at: None,
        }
    }

    /// The frame or body that arrived at `at` belongs to this reply.
    fn arrived(&mut self, at: Instant) {
        self.first_at.get_or_insert(at);
        self.last_at = Some(at);
    }

    /// Words (`text`) that arrived at `at` belong to this reply.
    fn said(&mut self, text: String, at: Instant) {
        if !text.trim().is_empty() {
            self.words_at.get_or_insert(at);
        }
        self.texts.push(text);
    }
}

/// Why an agent turn did not give a reply.
#[derive(Debug)]
enum TurnFailure {
    /// The agent failed; the reason names the turn.
    Agent(String),
    /// The agent failed partway through its turn (websocket), after it had
    /// sent what the reply holds: kept, as a turn cut by the time limit is.
    AgentAfter(String, Box<Reply>),
    /// Nothing reached the agent: its address was refused by the outbound
    /// rule, or no connection to it could be made (also one that was not
    /// made within the turn timeout). Ends the call as an agent error, but
    /// no call took place.
    Unreached(String),
    /// The call's `max_duration` passed; what the agent had sent of its
    /// turn so far, if anything.
    Deadline(Option<Reply>),
    /// The call's `max_duration` passed while the connection to the agent
    /// was being made: the call ends as `max_duration`, and nothing reached
    /// the agent.
    DeadlineUnreached,
}

/// How the call ended, decided by [`drive`].
#[derive(Debug)]
struct Ending {
    reason: EndedReason,
    error: Option<String>,
    caller_error: bool,
    at: Instant,
}

impl Ending {
    fn now(reason: EndedReason) -> Self {
        Ending { reason, error: None, caller_error: false, at: Instant::now() }
    }

    fn agent_error(reason: String) -> Self {
        Ending { error: Some(reason), ..Ending::now(EndedReason::AgentError) }
    }

    /// The simulated caller could not go on: it hangs up, and the verdict
    /// must be `error` (see [`Outcome::caller_error`]).
    fn caller_failed(reason: String) -> Self {
        Ending {
            error: Some(format!("the simulated caller's LLM failed: {reason}")),
            caller_error: true,
            ..Ending::now(EndedReason::CallerDone)
        }
    }
}

/// The open channel to the agent.
enum Channel<'a> {
    Http(http::HttpAgent<'a>),
    Websocket(Box<websocket::WsAgent>),
}

impl Channel<'_> {
    /// Sends the caller event of `turn` (`start` for turn 0, with or without
    /// a line) and waits for the agent's reply.
    async fn exchange(&mut self, turn: u32, line: Option<&str>, deadline: Instant) -> Result<Reply, TurnFailure> {
        match self {
            Channel::Http(agent) => agent.exchange(turn, line, deadline).await,
            Channel::Websocket(agent) => agent.exchange(turn, line, deadline).await,
        }
    }

    /// What the agent sent after its last turn ended and before the
    /// caller's next line: part of that turn (websocket; an http reply is
    /// whole).
    async fn late(&mut self) -> Result<Option<Reply>, TurnFailure> {
        match self {
            Channel::Http(_) => Ok(None),
            Channel::Websocket(agent) => agent.late().await,
        }
    }

    /// While the caller makes its line: takes in what the agent sends
    /// meanwhile, with when it came (websocket; never resolves for http).
    async fn listen(&mut self) {
        match self {
            Channel::Http(_) => std::future::pending().await,
            Channel::Websocket(agent) => agent.listen().await,
        }
    }

    /// Closes the call the way `ending` requires: the caller hangs up (http
    /// `end`, websocket `end_call` then close) unless the agent ended the
    /// call or failed. Best effort, bounded by the turn timeout.
    async fn close(self, next_turn: u32, ending: &Ending) {
        let hang_up = !matches!(ending.reason, EndedReason::AgentEnded | EndedReason::AgentError);
        match self {
            Channel::Http(agent) if hang_up => agent.end(next_turn).await,
            Channel::Http(_) => {}
            Channel::Websocket(agent) => agent.close(hang_up, ending.reason != EndedReason::AgentError).await,
        }
    }
}

/// Who says the caller's lines.
enum Caller<'a> {
    Scripted { steps: &'a [types::ScenarioStep], next: usize },
    Simulated(simulated::SimulatedCaller<'a>),
}

/// The caller's next move.
enum Next {
    Say { line: String, step: Option<usize> },
    Done { last_words: Option<String> },
    Failed(String),
    Deadline,
}

impl Caller<'_> {
    /// A scripted caller whose steps ran out; a simulated caller only
    /// knows it is done when its LLM says so.
    fn exhausted(&self) -> bool {
        match self {
            Caller::Scripted { steps, next } => *next >= steps.len(),
            Caller::Simulated(_) => false,
        }
    }

    async fn next(&mut self, transcript: &[types::TranscriptTurn], deadline: Instant) -> Next {
        match self {
            Caller::Scripted { steps, next } => match steps.get(*next) {
                Some(step) => {
                    *next += 1;
                    Next::Say { line: step.say.to_string(), step: Some(*next - 1) }
                }
                None => Next::Done { last_words: None },
            },
            Caller::Simulated(caller) => caller.next(transcript, deadline).await,
        }
    }
}

/// Plays the call to its end, recording into `rec`, and closes the channel.
async fn drive(http: &Outbound, plan: &CallPlan, cancel: &CancellationToken, rec: &mut Recorder) -> Ending {
    let deadline = later(rec.call_start(), plan.max_duration);
    if cancel.is_cancelled() {
        return Ending::now(EndedReason::Cancelled);
    }
    let mut caller = match plan.scenario.mode {
        ScenarioMode::Scripted => Caller::Scripted { steps: &plan.scenario.steps, next: 0 },
        ScenarioMode::Simulated => match simulated::SimulatedCaller::new(http, plan) {
            Ok(caller) => Caller::Simulated(caller),
            Err(reason) => return Ending::caller_failed(reason),
        },
    };
    let opening = plan.scenario.first_message.as_deref().filter(|line| !line.trim().is_empty());
    // The opening line needs room for itself and the reply; a greeting only
    // for itself.
    if !rec.has_room(plan.max_turns, if opening.is_some() { 2 } else { 1 }) {
        return Ending::now(EndedReason::MaxTurns);
    }
    let channel = match open(http, plan, deadline).await {
        Ok(channel) => channel,
        Err(TurnFailure::Agent(reason) | TurnFailure::AgentAfter(reason, _)) => {
            // A websocket that got as far as its handshake was reached.
            rec.reached();
            return Ending::agent_error(reason);
        }
        Err(TurnFailure::Unreached(reason)) => return Ending::agent_error(reason),
        Err(TurnFailure::Deadline(_)) => {
            // Past its connection, in its handshake: reached.
            rec.reached();
            return Ending::now(EndedReason::MaxDuration);
        }
        Err(TurnFailure::DeadlineUnreached) => return Ending::now(EndedReason::MaxDuration),
    };
    if matches!(channel, Channel::Websocket(_)) {
        rec.reached();
    }
    let mut call = Call { channel, rec, turn: 0, deadline, step: None, max_turns: plan.max_turns };
    let ending = call.talk(&mut caller, opening, cancel).await;
    // An agent never reached is not hung up on: an http `end` would wait
    // for the connection that was never made.
    if call.rec.has_reached() {
        call.channel.close(call.turn, &ending).await;
    }
    ending
}

/// Opens the channel of `plan.agent`; for websocket, connects.
async fn open<'a>(http: &'a Outbound, plan: &'a CallPlan, deadline: Instant) -> Result<Channel<'a>, TurnFailure> {
    match plan.agent.kind {
        ChannelKind::Http => Ok(Channel::Http(http::HttpAgent::new(http, plan).map_err(TurnFailure::Agent)?)),
        ChannelKind::Websocket => {
            Ok(Channel::Websocket(Box::new(websocket::WsAgent::connect(http, plan, deadline).await?)))
        }
        other => Err(TurnFailure::Agent(format!("channel kind `{}` is not supported yet", kind_name(other)))),
    }
}

fn kind_name(kind: ChannelKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| format!("{kind:?}"))
}

/// A call in progress: the open channel, the record, and `turn`, the
/// number of the next caller event (the http `turn` field; error messages
/// name it too).
struct Call<'a, 'r> {
    channel: Channel<'a>,
    rec: &'r mut Recorder,
    turn: u32,
    deadline: Instant,
    /// The scripted step the last agent turn answered.
    step: Option<usize>,
    /// The scenario's `max_turns`.
    max_turns: u32,
}

impl Call<'_, '_> {
    /// The turns of the call, from the opening to the ending.
    async fn talk(&mut self, caller: &mut Caller<'_>, opening: Option<&str>, cancel: &CancellationToken) -> Ending {
        if let Err(ending) = self.exchange(opening, None).await {
            return ending;
        }
        loop {
            // What the agent sent after its turn ended belongs to that turn:
            // taken before the checks, so that the room counts it and the
            // simulated caller hears it before it answers.
            if let Err(ending) = self.take_late().await {
                return ending;
            }
            if self.rec.agent_ended() {
                return Ending::now(EndedReason::AgentEnded);
            }
            if caller.exhausted() {
                return Ending::now(EndedReason::CallerDone);
            }
            if cancel.is_cancelled() {
                return Ending::now(EndedReason::Cancelled);
            }
            if Instant::now() >= self.deadline {
                return Ending::now(EndedReason::MaxDuration);
            }
            if !self.rec.has_room(self.max_turns, 2) {
                return Ending::now(EndedReason::MaxTurns);
            }
            // A cancel while the caller makes its line (a simulated
            // caller's LLM may take a while) stops the call before the line
            // is said: the agent is sent no other turn.
            // Meanwhile what the agent sends is taken in as it comes: a
            // late frame's time is its own, not when the line was made.
            let next = {
                let asking = caller.next(self.rec.transcript(), self.deadline);
                tokio::pin!(asking);
                loop {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Ending::now(EndedReason::Cancelled),
                        next = &mut asking => break next,
                        () = self.channel.listen() => {}
                    }
                }
            };
            if cancel.is_cancelled() {
                return Ending::now(EndedReason::Cancelled);
            }
            match next {
                Next::Say { line, step } => {
                    if let Err(ending) = self.exchange(Some(&line), step).await {
                        return ending;
                    }
                }
                Next::Done { last_words: Some(line) } => {
                    if let Err(ending) = self.exchange(Some(&line), None).await {
                        return ending;
                    }
                    if !self.rec.agent_ended() {
                        return Ending::now(EndedReason::CallerDone);
                    }
                }
                Next::Done { last_words: None } => return Ending::now(EndedReason::CallerDone),
                Next::Failed(reason) => return Ending::caller_failed(reason),
                Next::Deadline => return Ending::now(EndedReason::MaxDuration),
            }
        }
    }

    /// Records what the agent sent after its last turn ended (a
    /// continuation of that turn, neither taken for the next reply nor
    /// counted in its latency); if it ended the call, the call ends.
    async fn take_late(&mut self) -> Result<(), Ending> {
        match self.channel.late().await {
            Ok(None) => Ok(()),
            Ok(Some(late)) => {
                if let (Some(index), Some(step)) = (self.rec.late(late), self.step) {
                    self.rec.step_reply(step, index);
                }
                self.within_record()?;
                if self.rec.agent_ended() {
                    return Err(Ending::now(EndedReason::AgentEnded));
                }
                Ok(())
            }
            // What the agent had sent after its turn before it failed is
            // that turn's, and kept.
            Err(TurnFailure::AgentAfter(reason, late)) => {
                if let (Some(index), Some(step)) = (self.rec.late(*late), self.step) {
                    self.rec.step_reply(step, index);
                }
                Err(Ending::agent_error(reason))
            }
            Err(TurnFailure::Agent(reason) | TurnFailure::Unreached(reason)) => Err(Ending::agent_error(reason)),
            Err(TurnFailure::Deadline(_) | TurnFailure::DeadlineUnreached) => {
                Err(Ending::now(EndedReason::MaxDuration))
            }
        }
    }

    /// One caller event and the agent's reply, recorded (with the step it
    /// answers, for scripted steps). What the agent sent after its previous
    /// turn while the line was being made is added to that turn first; if
    /// it ended the call, or left no room for the line and its reply, the
    /// line is not said.
    async fn exchange(&mut self, line: Option<&str>, step: Option<usize>) -> Result<(), Ending> {
        let before = self.rec.transcript().len();
        self.take_late().await?;
        if line.is_some() && self.rec.transcript().len() > before && !self.rec.has_room(self.max_turns, 2) {
            return Err(Ending::now(EndedReason::MaxTurns));
        }
        self.step = step;
        if let Some(line) = line {
            self.rec.caller(line, Instant::now());
        }
        if let Some(step) = step {
            self.rec.step_said(step);
        }
        let result = self.channel.exchange(self.turn, line, self.deadline).await;
        self.turn += 1;
        if !matches!(result, Err(TurnFailure::Unreached(_) | TurnFailure::DeadlineUnreached)) {
            self.rec.reached();
        }
        let (reply, failure) = match result {
            Ok(reply) => (Some(reply), None),
            Err(TurnFailure::Agent(reason) | TurnFailure::Unreached(reason)) => {
                (None, Some(Ending::agent_error(reason)))
            }
            // What the agent had said of its turn before it failed is kept.
            Err(TurnFailure::AgentAfter(reason, partial)) => (Some(*partial), Some(Ending::agent_error(reason))),
            // What the agent had said when the time ran out is kept.
            Err(TurnFailure::Deadline(partial)) => (partial, Some(Ending::now(EndedReason::MaxDuration))),
            Err(TurnFailure::DeadlineUnreached) => (None, Some(Ending::now(EndedReason::MaxDuration))),
        };
        if let (Some(index), Some(step)) = (reply.and_then(|reply| self.rec.agent(reply)), step) {
            self.rec.step_reply(step, index);
        }
        failure.map_or(Ok(()), Err)?;
        self.within_record()
    }

    /// Ends the call once its record has grown past [`MAX_RECORD_BYTES`],
    /// as the fault of whichever side wrote most of it: the agent's replies
    /// and tool calls (`agent_error`), or the caller's lines (a simulated
    /// caller's LLM writing at length: the caller hangs up, and the verdict
    /// is `error`, as when that LLM fails).
    fn within_record(&self) -> Result<(), Ending> {
        let (total, caller) = (self.rec.bytes(), self.rec.caller_bytes());
        if total <= MAX_RECORD_BYTES {
            return Ok(());
        }
        let agent = total - caller;
        let (who, bytes) =
            if caller > agent { ("the caller's lines", caller) } else { ("the agent's replies and tool calls", agent) };
        let reason = format!(
            "the call's transcript and tool calls passed {} MiB after turn {}, mostly {who} ({:.1} MiB); a call's \
             record is kept whole, so the call was ended",
            MAX_RECORD_BYTES >> 20,
            self.turn.saturating_sub(1),
            bytes as f64 / f64::from(1 << 20)
        );
        Err(if caller > agent {
            Ending { error: Some(reason), caller_error: true, ..Ending::now(EndedReason::CallerDone) }
        } else {
            Ending::agent_error(reason)
        })
    }
}

/// The earlier of `now + timeout` and the call's deadline, and whether the
/// deadline is the one that binds (so an expiry means `max_duration`, not a
/// turn timeout).
fn turn_limit(timeout: Duration, deadline: Instant) -> (Instant, bool) {
    let turn_end = later(Instant::now(), timeout);
    if deadline <= turn_end {
        (deadline, true)
    } else {
        (turn_end, false)
    }
}

/// `at + duration`, without the panic of an overflow on absurd durations
/// (capped at a year: longer than any call).
fn later(at: Instant, duration: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    at.checked_add(duration.min(YEAR)).unwrap_or(at)
}
