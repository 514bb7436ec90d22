//! The `http` channel: one `POST {target}` per caller event
//! (`{"call_id", "turn", "event": "start"|"message"|"end", "message"}`),
//! answered with `{"messages": [...], "end_call", "tool_calls"}`.

use crate::engine::outbound::{connect_too_late, Outbound};
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::{turn_limit, Reply, TurnFailure, CALL_ID_HEADER, MAX_REPLY_BYTES};
use crate::engine::llm::excerpt;
use crate::engine::{innermost, CallPlan};

pub(super) struct HttpAgent<'a> {
    http: &'a Outbound,
    target: &'a str,
    call_id: &'a str,
    headers: HeaderMap,
    /// The channel's header values, redacted from the agent's answers
    /// quoted in a reason.
    secrets: Vec<&'a str>,
    turn_timeout: Duration,
}

/// The reply body of the protocol. `end_call` and `tool_calls` may be left
/// out or null.
#[derive(Deserialize)]
struct WireReply {
    messages: Vec<WireMessage>,
    #[serde(default)]
    end_call: Option<bool>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireMessage {
    /// Meant to be `assistant`; not checked, an agent has only one role.
    #[serde(default)]
    #[allow(dead_code)]
    role: Option<String>,
    /// Required, as in a `websocket` `message` frame: a message without it
    /// was taken for silence, and judged as "the agent said nothing".
    content: String,
}

#[derive(Deserialize)]
struct WireToolCall {
    name: String,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

impl<'a> HttpAgent<'a> {
    /// Checks the channel's headers once, so a bad one is reported before
    /// the call starts (by name: values are secret).
    pub(super) fn new(http: &'a Outbound, plan: &'a CallPlan) -> Result<Self, String> {
        let mut headers = header_map(&plan.agent.headers)?;
        headers.insert(
            HeaderName::from_static(CALL_ID_HEADER),
            HeaderValue::from_str(&plan.call_id)
                .map_err(|_| format!("the call id `{}` is not a valid header value", plan.call_id))?,
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(HttpAgent {
            http,
            target: &plan.agent.target,
            call_id: &plan.call_id,
            headers,
            secrets: plan.agent.headers.iter().map(|(_, value)| value.as_str()).collect(),
            turn_timeout: plan.agent.turn_timeout,
        })
    }

    /// `start` (turn 0) or `message` with the caller's line, and the reply.
    pub(super) async fn exchange(
        &self,
        turn: u32,
        line: Option<&str>,
        deadline: Instant,
    ) -> Result<Reply, TurnFailure> {
        let event = if turn == 0 { "start" } else { "message" };
        let message = line.map(|content| json!({"role": "user", "content": content}));
        let body = json!({"call_id": self.call_id, "turn": turn, "event": event, "message": message});
        let (limit, deadline_binds) = turn_limit(self.turn_timeout, deadline);
        let sent_at = Instant::now();
        // A connection the request opens must be made a little before the
        // turn's limit: one that is not, the agent never took (nothing
        // reached it). So when the limit itself passes, the agent has the
        // request and is slow to answer.
        let connect_by = limit.checked_sub(connect_margin(limit.saturating_duration_since(sent_at))).unwrap_or(limit);
        // When the answer's head came: a turn timed out after it is a reply
        // begun and not finished, not one never given.
        let answered = OnceLock::new();
        let posting = self.http.connecting_by(connect_by, self.post(turn, &body, &answered));
        let (text, connected) = match tokio::time::timeout_at(limit, posting).await {
            Ok((Ok(text), connected)) => (text, connected),
            Ok((Err(Failed::Turn(failure)), _)) => return Err(failure),
            Ok((Err(Failed::ConnectTooLate), _)) if deadline_binds => {
                // The call lasts until its `max_duration`, as it would have
                // had the connection been made.
                tokio::time::sleep_until(limit).await;
                return Err(TurnFailure::DeadlineUnreached);
            }
            Ok((Err(Failed::ConnectTooLate), _)) => {
                return Err(TurnFailure::Unreached(format!(
                    "could not connect to the agent at {} for turn {turn} within {} ms",
                    self.target,
                    connect_by.saturating_duration_since(sent_at).as_millis()
                )))
            }
            Err(_) if deadline_binds => return Err(TurnFailure::Deadline(None)),
            Err(_) => {
                return Err(TurnFailure::Agent(match answered.get() {
                    None => format!("the agent did not answer turn {turn} within {} ms", self.turn_timeout.as_millis()),
                    Some(at) => format!(
                        "the agent's reply to turn {turn} began after {} ms but was not complete within {} ms \
                         (a reply is read whole: send its body at once)",
                        at.saturating_duration_since(sent_at).as_millis(),
                        self.turn_timeout.as_millis()
                    ),
                }))
            }
        };
        // The request was sent once its connection was made: the time it
        // took to make one (DNS, TCP, TLS) is not the agent's latency.
        let mut reply = Reply::new(connected.map_or(sent_at, |made| made.max(sent_at)));
        let at = Instant::now();
        reply.arrived(at);
        let wire = parse_reply(turn, &text, &self.secrets).map_err(TurnFailure::Agent)?;
        for content in wire.messages.into_iter().map(|m| m.content) {
            reply.said(content, at);
        }
        reply.tool_calls = wire
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|call| (call.name, call.arguments.unwrap_or_default()))
            .collect();
        reply.end_call = wire.end_call.unwrap_or(false);
        Ok(reply)
    }

    /// The caller hangs up: `end`, best effort, its reply ignored.
    pub(super) async fn end(&self, turn: u32) {
        let body = json!({"call_id": self.call_id, "turn": turn, "event": "end", "message": null});
        let _ = tokio::time::timeout(self.turn_timeout, self.post(turn, &body, &OnceLock::new())).await;
    }

    /// One POST; the body of a 2xx answer, or why there is none. `answered`
    /// is set when the answer's head comes.
    async fn post(&self, turn: u32, body: &Value, answered: &OnceLock<Instant>) -> Result<String, Failed> {
        let request = self.http.post(self.target).map_err(|refused| {
            TurnFailure::Unreached(format!("the agent at {} was not called for turn {turn}: {refused}", self.target))
        })?;
        let sent = request.headers(self.headers.clone()).body(body.to_string()).send().await;
        let mut response = sent.map_err(|e| {
            if connect_too_late(&e) {
                Failed::ConnectTooLate
            } else if e.is_connect() {
                Failed::Turn(TurnFailure::Unreached(format!(
                    "could not reach the agent at {} for turn {turn}: {}",
                    self.target,
                    innermost(&e)
                )))
            } else {
                Failed::Turn(TurnFailure::Agent(format!(
                    "the request for turn {turn} to the agent at {} failed: {}",
                    self.target,
                    innermost(&e)
                )))
            }
        })?;
        let _ = answered.set(Instant::now());
        let status = response.status();
        // A redirect the client did not follow (see `Outbound`): where it
        // pointed, for the reason.
        let location = crate::engine::redirect_location(status, response.headers());
        let bytes = crate::engine::body_at_most(&mut response, MAX_REPLY_BYTES)
            .await
            .map_err(|e| TurnFailure::Agent(format!("the agent's reply to turn {turn} broke off: {}", innermost(&e))))?
            .ok_or_else(|| {
                TurnFailure::Agent(format!("the agent's reply to turn {turn} is larger than {MAX_REPLY_BYTES} bytes"))
            })?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some(location) = location {
            let body = excerpt(&text, 300, &self.secrets);
            return Err(TurnFailure::Agent(format!(
                "the agent answered turn {turn} with HTTP {}, a redirect to {} that is not followed (only a 307 or \
                 308 within the target's origin is: it keeps the request and its body){}{body}",
                status.as_u16(),
                excerpt(&location, 300, &self.secrets),
                if body.is_empty() { "" } else { ": " },
            ))
            .into());
        }
        if !status.is_success() {
            return Err(TurnFailure::Agent(format!(
                "the agent answered turn {turn} with HTTP {}: {}",
                status.as_u16(),
                excerpt(&text, 300, &self.secrets)
            ))
            .into());
        }
        Ok(text)
    }
}

/// Why [`HttpAgent::post`] has no answer.
enum Failed {
    /// Its connection was not made by the time it was given (see
    /// [`HttpAgent::exchange`]).
    ConnectTooLate,
    Turn(TurnFailure),
}

impl From<TurnFailure> for Failed {
    fn from(failure: TurnFailure) -> Self {
        Failed::Turn(failure)
    }
}

/// How long before a turn's limit, `allowed` from now, the connection of
/// its request must be made: a small part of the time, so that the
/// connection's own limit surely ends the request before the turn's limit
/// does (two timers of the request's task, fired in their order).
fn connect_margin(allowed: Duration) -> Duration {
    (allowed / 10).min(Duration::from_secs(1))
}

fn parse_reply(turn: u32, text: &str, secrets: &[&str]) -> Result<WireReply, String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("the agent's reply to turn {turn} is not JSON ({e}): {}", excerpt(text, 200, secrets)))?;
    serde_json::from_value(value).map_err(|e| {
        format!(
            "the agent's reply to turn {turn} is not of the protocol's shape \
             {{\"messages\": [{{\"role\": \"assistant\", \"content\": …}}], \"end_call\": …, \"tool_calls\": […]}} \
             ({e}): {}",
            excerpt(text, 200, secrets)
        )
    })
}

/// The channel's headers as a header map; a bad one is named, never shown.
pub(super) fn header_map(headers: &[(String, String)]) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("the channel header name `{name}` is not a valid HTTP header name"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of the channel header `{name}` is not a valid HTTP header value"))?;
        map.append(name, value);
    }
    Ok(map)
}
