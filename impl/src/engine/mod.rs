//! The engine: holds the conversations with the agent under test, measures
//! and judges them.
//!
//! - [`llm`]: the chat-completions client (simulated callers, `llm_judge`).
//! - [`conversation`]: one call over a channel (`http` or `websocket`),
//!   driven by a scripted or simulated scenario; gives an [`Outcome`].
//! - [`evaluate`]: the evaluators of DESIGN §4 over an [`Outcome`], and the
//!   result's verdict.
//! - [`queue`]: the durable run queue (claims, leases, counts, completion).
//! - [`worker`]: the tasks that take runs and hold their conversations.
//! - [`webhooks`]: `batch_run.completed` events, signed and retried.

pub mod conversation;
pub mod evaluate;
pub mod llm;
pub mod outbound;
pub mod queue;
pub mod webhooks;
pub mod worker;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sparring_server::types;

pub use llm::LlmEndpoint;

/// Secret values shorter than this are left alone: too short to be secret,
/// too short to replace without mangling the text.
const SECRET_MIN: usize = 4;

/// `text` with every one of `secrets` replaced by `[redacted]`: an agent, a
/// gateway or an LLM endpoint may echo a request's header or key in an
/// error, and what the engine writes from it (a failure reason, an
/// evaluation's reason) is read by every member of the project. A secret is
/// found in each form an echo gives it (see [`echoed_forms`]). Values
/// shorter than [`SECRET_MIN`] characters are left alone.
///
/// Run on a text before it is clipped or reshaped: a clipped or escaped
/// secret is no longer found (see [`llm::excerpt`]).
pub(crate) fn redact(text: String, secrets: &[&str]) -> String {
    Redaction::of(secrets).apply(text)
}

/// [`redact`] for many texts: the forms of the secrets found once.
pub(crate) struct Redaction(Vec<String>);

impl Redaction {
    pub(crate) fn of(secrets: &[&str]) -> Redaction {
        let mut forms: Vec<String> = secrets.iter().flat_map(|s| echoed_forms(s)).collect();
        // The longest first, so a form holding another is replaced whole (and
        // equal ones side by side, each replaced once).
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Redaction(forms)
    }

    pub(crate) fn apply(&self, text: String) -> String {
        self.0.iter().fold(text, |text, form| {
            if text.contains(form.as_str()) {
                text.replace(form.as_str(), "[redacted]")
            } else {
                text
            }
        })
    }

    /// Every string in `value`, object keys included, redacted.
    fn apply_json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => *s = self.apply(std::mem::take(s)),
            Value::Array(items) => items.iter_mut().for_each(|v| self.apply_json(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (key, mut v) in entries {
                    self.apply_json(&mut v);
                    map.insert(self.apply(key), v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// What the agent and the simulated caller said and did, redacted: an
    /// agent (or what is in front of it) that echoes a channel's header
    /// value, or a caller LLM that repeats its key, in a normal reply would
    /// otherwise put it in the transcript every member reads, and in what
    /// the evaluators quote from it.
    pub(crate) fn apply_to_conversation(&self, outcome: &mut Outcome) {
        if self.0.is_empty() {
            return;
        }
        for turn in &mut outcome.transcript {
            turn.text = self.apply(std::mem::take(&mut turn.text));
        }
        for call in &mut outcome.tool_calls {
            call.name = self.apply(std::mem::take(&mut call.name));
            let mut arguments = serde_json::Value::Object(std::mem::take(&mut call.arguments));
            self.apply_json(&mut arguments);
            if let serde_json::Value::Object(map) = arguments {
                call.arguments = map;
            }
        }
        outcome.error = outcome.error.take().map(|e| self.apply(e));
    }
}

/// The innermost cause of a request error: the useful part ("connection
/// refused"), without reqwest's wrapping.
pub(crate) fn innermost(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    source.to_string()
}

/// The forms `secret` takes in what echoes it, none shorter than
/// [`SECRET_MIN`]: as sent; its credentials alone when it is an
/// `Authorization`-style `<scheme> <credentials>` value (an echo names the
/// token, "invalid token sk-…", without the scheme); each of those escaped
/// in a JSON string (`"` and `\`, control characters; also `/` for the
/// encoders that escape it and `<`, `>`, `&` for Go's); and percent-encoded,
/// as in a URL echoed.
fn echoed_forms(secret: &str) -> Vec<String> {
    let mut plain = vec![secret];
    if let Some((scheme, credentials)) = secret.split_once(' ') {
        let credentials = credentials.trim();
        let is_scheme = !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if is_scheme && credentials.len() >= 8 && !credentials.contains(char::is_whitespace) {
            plain.push(credentials);
        }
    }
    let mut forms = Vec::new();
    for p in plain.into_iter().filter(|p| p.len() >= SECRET_MIN) {
        let json = serde_json::to_string(p).unwrap_or_default();
        let json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().to_string();
        let slashed = json.replace('/', "\\/");
        let go = json.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
        let percent: String = p
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect();
        forms.extend([p.to_string(), json, slashed, go, percent]);
    }
    forms
}

/// `text` (the part of a redacted text kept by a clip) without its end when
/// that end is the start of a secret: the clip fell inside an occurrence
/// that redaction did not find whole (the text already held it cut).
pub(crate) fn without_secret_start<'t>(text: &'t str, secrets: &[&str]) -> &'t str {
    let mut cut = 0;
    for form in secrets.iter().flat_map(|s| echoed_forms(s)) {
        let longest =
            (SECRET_MIN..form.len()).rev().find(|&k| k > cut && form.is_char_boundary(k) && text.ends_with(&form[..k]));
        if let Some(k) = longest {
            cut = k;
        }
    }
    &text[..text.len() - cut]
}

/// The wait a `Retry-After` value asks for: its seconds, or the time until
/// its HTTP date (none once that has passed). `None` when it is neither.
/// The engine's LLM calls and the CLI's retries read it so.
pub fn retry_after_wait(value: &str) -> Option<std::time::Duration> {
    let value = value.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(std::time::Duration::from_secs(seconds)),
        Err(_) => httpdate::parse_http_date(value)
            .ok()
            .map(|at| at.duration_since(std::time::SystemTime::now()).unwrap_or_default()),
    }
}

/// Where a redirect the client did not follow pointed (see `Outbound`),
/// for a failure's reason: the `Location` of an answer whose status is a
/// redirect, read lossily.
pub(crate) fn redirect_location(status: reqwest::StatusCode, headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get(reqwest::header::LOCATION)
        .filter(|_| status.is_redirection())
        .map(|location| String::from_utf8_lossy(location.as_bytes()).into_owned())
}

/// A response's body read chunk by chunk, given up (`None`) once it is
/// past `max` bytes: what an agent or an LLM endpoint sends costs at most
/// that much memory, however much it sends.
pub(crate) async fn body_at_most(response: &mut reqwest::Response, max: usize) -> reqwest::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > max {
            return Ok(None);
        }
    }
    Ok(Some(bytes))
}

/// How the agent under test is reached: a channel with its header values
/// opened (they never leave the engine).
#[derive(Clone)]
pub struct AgentEndpoint {
    pub kind: types::ChannelKind,
    /// `http(s)://` for `http`, `ws(s)://` for `websocket`.
    pub target: String,
    /// Sent with every request (http) or the upgrade request (websocket).
    pub headers: Vec<(String, String)>,
    /// How long to wait for the agent's reply to a caller line.
    pub turn_timeout: Duration,
}

impl std::fmt::Debug for AgentEndpoint {
    // The header values are secrets: never in a log line or a panic message
    // (as an `LlmEndpoint` shows no key).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, &str)> = self.headers.iter().map(|(name, _)| (name.as_str(), "<set>")).collect();
        f.debug_struct("AgentEndpoint")
            .field("kind", &self.kind)
            .field("target", &self.target)
            .field("headers", &headers)
            .field("turn_timeout", &self.turn_timeout)
            .finish()
    }
}

/// Everything one conversation needs, resolved from the database before it
/// starts.
#[derive(Clone, Debug)]
pub struct CallPlan {
    /// Ours, sent to the agent (`call_id` field and `x-sparring-call-id`).
    pub call_id: String,
    pub scenario: types::Scenario,
    pub persona: Option<types::Persona>,
    pub agent: AgentEndpoint,
    /// The `openai_compatible` integration that plays the caller; required
    /// for simulated scenarios.
    pub caller_llm: Option<LlmEndpoint>,
    /// Limit on transcript turns (both roles), from the scenario.
    pub max_turns: u32,
    /// The smallest of the scenario's, channel's and project's limits.
    pub max_duration: Duration,
}

/// What happened in one conversation.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub started_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub transcript: Vec<types::TranscriptTurn>,
    pub tool_calls: Vec<types::ToolCall>,
    pub ended_reason: types::EndedReason,
    /// With `ended_reason` `agent_error` (or a caller LLM failure): what went
    /// wrong, in words a person understands.
    pub error: Option<String>,
    /// The simulated caller could not go on (its LLM failed or is not
    /// configured): not the agent's fault, so the verdict is `error` with
    /// `error` as the reason ("the simulated caller's LLM failed: …"). The
    /// caller hung up, so `ended_reason` is `caller_done`.
    pub caller_error: bool,
    pub metrics: types::CallMetrics,
    /// Scripted scenarios: one entry per step whose line the caller said, in
    /// step order, holding the transcript indices of the agent's reply to
    /// that line (empty when the agent said nothing). A step the call never
    /// reached has NO entry (the list is shorter than the steps): its
    /// `expect` evaluators then fail with "the call ended before step N",
    /// whereas an empty entry is judged as "the agent said nothing".
    pub step_replies: Vec<Vec<usize>>,
    /// Whether a connection to the agent was made: a call that never
    /// reached it (refused by the outbound rule, no connection, ended or
    /// cancelled before its first turn) costs nothing.
    pub reached_agent: bool,
}

/// For tests: a loopback port that refuses connections while the socket
/// lives (bound, never listening), and the port. A port bound and let go
/// could be taken by another test's listener before it is used.
#[cfg(test)]
pub(crate) fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let port = held.local_addr().unwrap().port();
    (held, port)
}

/// For tests: a loopback port where a connection is never made while the
/// listener lives (what the returned value holds), and the port: its accept
/// queue is full (a backlog of 0, taken by connections never accepted), so
/// Linux drops a new connection's SYN and the connect hangs, as to an
/// address that does not answer. (The integration tests' own is
/// `tests/common`'s `UnansweredPort`: they cannot reach this crate's test
/// code.)
#[cfg(test)]
pub(crate) async fn unanswered_port() -> (impl Sized, u16) {
    let (listener, queued) = full_listener().await;
    let port = listener.local_addr().unwrap().port();
    ((listener, queued), port)
}

/// A loopback listener whose accept queue is full (a backlog of 0, filled
/// by the connections also given): a new connection's first SYN is
/// dropped, and its connect waits for a retransmission, until the queued
/// connections are dropped and the listener accepts again.
#[cfg(test)]
pub(crate) async fn full_listener() -> (tokio::net::TcpListener, Vec<tokio::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    loop {
        let connecting = tokio::net::TcpStream::connect(address);
        match tokio::time::timeout(std::time::Duration::from_millis(200), connecting).await {
            Ok(stream) => queued.push(stream.unwrap()),
            Err(_) => return (listener, queued),
        }
        assert!(queued.len() < 16, "the accept queue of a backlog of 0 never filled");
    }
}

#[cfg(test)]
mod retry_after_tests {
    use super::retry_after_wait;

    #[test]
    fn a_retry_after_is_seconds_or_a_date() {
        use std::time::{Duration, SystemTime};
        assert_eq!(retry_after_wait(" 7 "), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let wait = retry_after_wait(&later).unwrap();
        assert!(wait > Duration::from_secs(118) && wait <= Duration::from_secs(120), "{wait:?}");
        assert_eq!(retry_after_wait("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "passed: at once");
        assert_eq!(retry_after_wait("soon"), None);
        assert_eq!(retry_after_wait("-3"), None);
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::{llm::excerpt, redact, without_secret_start};

    #[test]
    fn a_secret_is_found_in_the_forms_an_echo_gives_it() {
        let secret = r#"Bearer to"k/e<n>\&-0815"#;
        for echoed in [
            secret.to_string(),
            r#"to"k/e<n>\&-0815"#.to_string(),
            serde_json::to_string(secret).unwrap(),
            r#"to\"k\/e<n>\\&-0815"#.to_string(),
            r#"to\"k/e\u003cn\u003e\\\u0026-0815"#.to_string(),
            "to%22k%2Fe%3Cn%3E%5C%26-0815".to_string(),
        ] {
            let shown = redact(format!("refused: {echoed}."), &[secret]);
            assert!(!shown.contains("0815"), "{echoed} -> {shown}");
        }
        // Too short to be replaced without mangling the text.
        assert_eq!(redact("a b c".into(), &["b"]), "a b c");
    }

    #[test]
    fn a_clip_never_ends_inside_a_secret() {
        assert_eq!(without_secret_start("key: sk-live-12", &["sk-live-123456"]), "key: ");
        assert_eq!(without_secret_start("key: sk", &["sk-live-123456"]), "key: sk");
        // The body already held the secret cut, where the clip falls.
        let body = format!("{} token sk-live-1234 (cut)", "x".repeat(20));
        assert_eq!(excerpt(&body, 35, &["sk-live-123456"]), format!("{} token …", "x".repeat(20)));
        // Whole, it is redacted before the clip.
        let body = format!("{} token sk-live-123456 (cut)", "x".repeat(20));
        assert_eq!(excerpt(&body, 35, &["sk-live-123456"]), format!("{} token [redacte…", "x".repeat(20)));
    }
}
