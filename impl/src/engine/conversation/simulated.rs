//! The simulated caller: an LLM (the plan's `caller_llm`) plays the persona
//! toward the scenario's goal. Each of its answers is a JSON object
//! `{"say": "…", "done": false}`, or `{"done": true, "say": "…"}` once the
//! goal is reached or clearly out of reach; plain text is taken as the line.
//! The chat is seen from the caller's side: its own lines are `assistant`
//! messages, the agent's are `user` messages.

use crate::engine::outbound::Outbound;
use std::time::Duration;

use serde_json::{json, Value};
use sparring_server::types::{self, InterruptionLevel, PersonaLevel, TurnRole};
use tokio::time::Instant;

use super::Next;
use crate::engine::llm::{self, excerpt, ChatMessage, LlmEndpoint};
use crate::engine::{CallPlan, Redaction};

/// How long one answer of the caller's LLM may take. Long enough for slow
/// models; a caller that thinks longer has failed.
const LLM_TIMEOUT: Duration = Duration::from_secs(60);

/// What the agent's empty turns look like to the caller.
const SILENCE: &str = "(the agent says nothing)";

pub(super) struct SimulatedCaller<'a> {
    http: &'a Outbound,
    llm: &'a LlmEndpoint,
    system: String,
    /// The channel's header values: they go only to the agent, so an agent
    /// that echoes one does not have it passed on to the LLM.
    agent_secrets: Redaction,
    /// What an agent's reply may take (the channel's `turn_timeout_ms`):
    /// the caller's LLM, held to it when the call's limit cuts its answer.
    turn_timeout: Duration,
}

impl<'a> SimulatedCaller<'a> {
    /// Fails (as a caller error) when the plan has no caller LLM.
    pub(super) fn new(http: &'a Outbound, plan: &'a CallPlan) -> Result<Self, String> {
        let llm = plan.caller_llm.as_ref().ok_or_else(|| {
            "no LLM is configured to play the caller of this simulated scenario \
             (it needs an openai_compatible integration)"
                .to_string()
        })?;
        let headers: Vec<&str> = plan.agent.headers.iter().map(|(_, value)| value.as_str()).collect();
        Ok(SimulatedCaller {
            http,
            llm,
            system: system_prompt(&plan.scenario, plan.persona.as_ref()),
            agent_secrets: Redaction::of(&headers),
            turn_timeout: plan.agent.turn_timeout,
        })
    }

    /// The caller's next move after `transcript`.
    pub(super) async fn next(&self, transcript: &[types::TranscriptTurn], deadline: Instant) -> Next {
        let mut messages = chat(&self.system, transcript);
        for message in &mut messages {
            message.content = self.agent_secrets.apply(std::mem::take(&mut message.content));
        }
        let asked = Instant::now();
        let answer = tokio::time::timeout_at(deadline, llm::complete(self.http, self.llm, &messages, LLM_TIMEOUT));
        match answer.await {
            // The call's limit came while the LLM was thinking: the call
            // reached its end, unless the LLM had taken longer than an
            // agent's reply may. Then the caller, not the agent, spent the
            // call (an LLM that hangs, during an outage), and the result
            // is a caller error, as when the LLM fails, not a judged call.
            Err(_) if asked.elapsed() > self.turn_timeout => Next::Failed(format!(
                "it had not answered after {} ms when the call reached its limit (an agent's reply may take {} \
                 ms, the channel's turn_timeout_ms)",
                asked.elapsed().as_millis(),
                self.turn_timeout.as_millis()
            )),
            Err(_) => Next::Deadline,
            Ok(Err(e)) => Next::Failed(e.to_string()),
            // Its key taken out first: an endpoint echoing it in an answer
            // must not have it said to the agent, nor quoted clipped (a
            // clipped key is no longer found) in a reason.
            Ok(Ok(text)) => {
                let key: Vec<&str> = self.llm.api_key.iter().map(String::as_str).collect();
                parse(&crate::engine::redact(text, &key))
            }
        }
    }
}

/// Who the caller is and what it wants, and how to answer.
pub(super) fn system_prompt(scenario: &types::Scenario, persona: Option<&types::Persona>) -> String {
    let mut p = String::from(
        "You are playing a caller on a phone call with a voice agent, to test that agent. \
         Stay in character for the whole call. Never say that you are an AI, a simulation or a test. \
         Say only what the caller says out loud: no stage directions, no narration.\n",
    );
    if let Some(persona) = persona {
        p.push_str(&format!("\nWho you are: {}.", persona.name));
        if !persona.description.trim().is_empty() {
            p.push_str(&format!(" {}", persona.description.trim()));
        }
        p.push('\n');
        if !persona.prompt.trim().is_empty() {
            p.push_str(&format!("How to play this caller: {}\n", persona.prompt.trim()));
        }
        p.push_str(&format!("Speak in the language with the tag {}.", persona.language));
        if let Some(accent) = persona.accent.as_deref().filter(|a| !a.trim().is_empty()) {
            p.push_str(&format!(" You have a {accent} accent; let it show in your words and phrasing."));
        }
        p.push('\n');
        p.push_str(match persona.verbosity {
            PersonaLevel::Low => "You say as little as you can: short lines, often a few words.\n",
            PersonaLevel::Medium => "You speak naturally: one to three sentences at a time.\n",
            PersonaLevel::High => "You are talkative: you give more detail than asked and wander off topic a little.\n",
        });
        p.push_str(match persona.patience {
            PersonaLevel::Low => {
                "You are impatient: if the agent is slow, repeats itself or does not help, you get curt and \
                 soon give up.\n"
            }
            PersonaLevel::Medium => "You are reasonably patient, but not endlessly.\n",
            PersonaLevel::High => "You are very patient and give the agent every chance.\n",
        });
        p.push_str(match persona.interruption_level {
            InterruptionLevel::None => "",
            InterruptionLevel::Low => "Once in a while you cut in before the agent has finished its point.\n",
            InterruptionLevel::Medium => "You sometimes cut the agent short and push your own point.\n",
            InterruptionLevel::High => "You often cut the agent short, talk over it and change the subject.\n",
        });
        if !persona.tags.is_empty() {
            p.push_str(&format!("Traits: {}.\n", persona.tags.join(", ")));
        }
    } else {
        p.push_str("\nYou are an ordinary caller.\n");
    }
    p.push_str(&format!("\nThe situation: {}", scenario.name));
    if !scenario.description.trim().is_empty() {
        p.push_str(&format!(". {}", scenario.description.trim()));
    }
    p.push('\n');
    match scenario.goal.as_deref().filter(|g| !g.trim().is_empty()) {
        Some(goal) => p.push_str(&format!("Your goal on this call: {}\n", goal.trim())),
        None => p.push_str("You have no goal beyond the situation; end the call when it has run its course.\n"),
    }
    if let Some(first) = scenario.first_message.as_deref().filter(|f| !f.trim().is_empty()) {
        p.push_str(&format!("You opened the call with: {first:?}\n"));
    }
    p.push_str(
        "\nAnswer every time with only a JSON object and nothing else: {\"say\": \"<your next line>\", \"done\": false}. \
         When your goal is reached, or it clearly cannot be reached, answer {\"done\": true, \"say\": \"<your last \
         words, or an empty string>\"}.",
    );
    p
}

/// The call so far as a chat from the caller's side. The caller's own
/// lines are given back in the JSON form it must answer in, so it keeps to
/// it; the chat always ends with the agent's turn (silence when it said
/// nothing).
pub(super) fn chat(system: &str, transcript: &[types::TranscriptTurn]) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::system(system)];
    for turn in transcript {
        match turn.role {
            TurnRole::Caller => {
                messages.push(ChatMessage::assistant(json!({"say": turn.text, "done": false}).to_string()));
            }
            TurnRole::Agent if turn.text.trim().is_empty() => messages.push(ChatMessage::user(SILENCE)),
            TurnRole::Agent => messages.push(ChatMessage::user(turn.text.clone())),
        }
    }
    if transcript.last().is_none_or(|t| t.role == TurnRole::Caller) {
        messages.push(ChatMessage::user(SILENCE));
    }
    messages
}

/// The caller's move from its LLM's answer.
pub(super) fn parse(answer: &str) -> Next {
    let Some(object) = llm::first_json_object(answer) else {
        let line = answer.trim();
        if line.is_empty() {
            return Next::Failed("it answered with nothing to say".into());
        }
        return Next::Say { line: line.to_string(), step: None };
    };
    let say = object.get("say").and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty());
    if object.get("done").and_then(Value::as_bool).unwrap_or(false) {
        return Next::Done { last_words: say.map(str::to_string) };
    }
    match say {
        Some(line) => Next::Say { line: line.to_string(), step: None },
        None => Next::Failed(format!(
            "its answer has neither a line to say nor \"done\": true: {}",
            excerpt(answer, 200, &[])
        )),
    }
}
