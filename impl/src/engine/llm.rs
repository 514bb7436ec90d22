//! A client for OpenAI-compatible chat-completions endpoints
//! (`POST {base_url}/chat/completions`), used by simulated callers and by
//! `llm_judge` evaluators. Integrations of provider `openai_compatible` give
//! `config.base_url`, `config.model`, optionally `config.temperature`, and
//! the write-only `credentials.api_key` (sent as a bearer token).

use crate::engine::outbound::Outbound;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// An `openai_compatible` integration with its credentials opened.
#[derive(Clone)]
pub struct LlmEndpoint {
    pub base_url: String,
    pub model: String,
    pub temperature: Option<f64>,
    pub api_key: Option<String>,
}

impl std::fmt::Debug for LlmEndpoint {
    // The key is a secret: never in a log line or a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEndpoint")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("temperature", &self.temperature)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl LlmEndpoint {
    /// From an integration's stored `config` and opened `credentials`.
    pub fn from_integration(config: &Map<String, Value>, credentials: Option<&Map<String, Value>>) -> Option<Self> {
        Some(LlmEndpoint {
            base_url: config.get("base_url")?.as_str()?.trim_end_matches('/').to_string(),
            model: config.get("model")?.as_str()?.to_string(),
            temperature: config.get("temperature").and_then(Value::as_f64),
            api_key: credentials.and_then(|c| c.get("api_key")).and_then(Value::as_str).map(str::to_string),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        ChatMessage { role: "system".into(), content: content.into() }
    }
    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage { role: "user".into(), content: content.into() }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        ChatMessage { role: "assistant".into(), content: content.into() }
    }
}

/// Why a completion could not be had, in words for a result's
/// `failure_reason`.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("the LLM endpoint {url} could not be reached: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the LLM endpoint did not answer within {0} ms")]
    Timeout(u128),
    #[error("the LLM endpoint answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error(
        "the LLM endpoint answered HTTP {status}, a redirect to {location} that is not followed (only a 307 or 308 \
         within the origin of config.base_url is: give config.base_url as it points){}{body}",
        if body.is_empty() { "" } else { ": " }
    )]
    Redirect { status: u16, location: String, body: String },
    #[error("the LLM endpoint's answer is not a chat completion: {0}")]
    Malformed(String),
    #[error("the LLM endpoint's answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    #[error("the LLM endpoint answered HTTP {0} with a body larger than {MAX_ANSWER_BYTES} bytes")]
    StatusTooLarge(u16),
    #[error("{error} ({attempts} attempts)")]
    Retried { error: Box<LlmError>, attempts: u32 },
    /// A busy endpoint whose `Retry-After` is longer than [`MAX_PAUSE`]:
    /// not asked again before it said, so not asked again at all.
    #[error("{error} (it asked not to be asked again for {wait_s} s, longer than a conversation waits)")]
    WaitTooLong { error: Box<LlmError>, wait_s: u64 },
}

/// How many times a busy (or unreachable, see [`never_sent`]) endpoint is
/// asked, in all.
const ATTEMPTS: u32 = 3;
/// The longest pause before asking a busy endpoint again. One whose
/// `Retry-After` asks for longer is not asked again: asking sooner than it
/// said would only be refused again, and counts against the caller's key.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// An endpoint busy for now (a rate limit, a gateway, the model
/// overloaded), asked again a little later.
fn busy(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// Whether `e` failed a request before a byte of it was sent, so that
/// sending it again cannot make the endpoint produce a second answer: its
/// connection was refused (nothing listens there, the endpoint or its
/// gateway restarting), or reset or closed while it was being made (in the
/// TCP or the TLS handshake, before the request is written). Asked again
/// like a busy endpoint. A connection lost once the request went (reset or
/// closed before the answer, or in the middle of it) is not: the endpoint
/// may have received the request and produced (and billed) its answer,
/// which a second request would produce again, perhaps another one (a
/// judge's verdict). Nor is a refusal of this server's own (an address it
/// may not call, a name that does not resolve): asked again, it says the
/// same.
fn never_sent(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind;
    if !e.is_connect() {
        return false;
    }
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if let ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof = io.kind()
            {
                return true;
            }
            // An I/O error may wrap the one that says what happened (the
            // TLS connector's: "tls handshake eof"), which its `source`
            // skips.
            if let Some(inner) = io.get_ref() {
                source = Some(inner);
                continue;
            }
        }
        source = cause.source();
    }
    false
}

/// Answers larger than this are refused (a caller's line or a verdict is a
/// few sentences), before they are read whole.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
}

/// Asks for one completion and returns the first choice's text, within
/// `timeout` in all. An endpoint that answers it is busy (429, 502, 503,
/// 504: many simulated callers at once meet rate limits), or that could not
/// be sent the request at all (see [`never_sent`]), is asked again after
/// its `Retry-After` or half a second, then a second: [`ATTEMPTS`] times
/// in all, while time is left. One that asks to wait longer than
/// [`MAX_PAUSE`] is not asked again.
pub async fn complete(
    http: &Outbound,
    llm: &LlmEndpoint,
    messages: &[ChatMessage],
    timeout: Duration,
) -> Result<String, LlmError> {
    let start = tokio::time::Instant::now();
    let mut attempt = 1;
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        let (error, pause) = match ask(http, llm, messages, left, timeout).await {
            Ok(text) => return Ok(text),
            Err(Failure::Busy(error, Some(wait))) if wait > MAX_PAUSE => {
                (LlmError::WaitTooLong { error: Box::new(error), wait_s: wait.as_secs_f64().ceil() as u64 }, None)
            }
            Err(Failure::Busy(error, retry_after)) => {
                (error, Some(retry_after.unwrap_or(Duration::from_millis(500) * 2u32.pow(attempt - 1))))
            }
            Err(Failure::Final(error)) => (error, None),
        };
        match pause {
            Some(pause) if attempt < ATTEMPTS && start.elapsed() + pause < timeout => {
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            _ if attempt == 1 => return Err(error),
            _ => return Err(LlmError::Retried { error: Box::new(error), attempts: attempt }),
        }
    }
}

/// Why one request of [`complete`] got no completion.
enum Failure {
    /// The endpoint is busy (see [`busy`]), with its `Retry-After`, or was
    /// sent nothing (see [`never_sent`]).
    Busy(LlmError, Option<Duration>),
    Final(LlmError),
}

/// One request of [`complete`], with `left` of its `timeout`.
async fn ask(
    http: &Outbound,
    llm: &LlmEndpoint,
    messages: &[ChatMessage],
    left: Duration,
    timeout: Duration,
) -> Result<String, Failure> {
    let url = format!("{}/chat/completions", llm.base_url);
    let mut body = json!({"model": llm.model, "messages": messages});
    if let Some(t) = llm.temperature {
        body["temperature"] = json!(t);
    }
    let request = http
        .post(&url)
        .map_err(|refused| Failure::Final(LlmError::Unreachable { url: url.clone(), detail: refused }))?;
    let mut request = request.timeout(left).json(&body);
    if let Some(key) = &llm.api_key {
        request = request.bearer_auth(key);
    }
    let failed = |e: reqwest::Error| {
        Failure::Final(if e.is_timeout() {
            LlmError::Timeout(timeout.as_millis())
        } else {
            LlmError::Unreachable { url: url.clone(), detail: without_url(&e) }
        })
    };
    let mut response = request.send().await.map_err(|e| {
        if never_sent(&e) {
            Failure::Busy(LlmError::Unreachable { url: url.clone(), detail: without_url(&e) }, None)
        } else {
            failed(e)
        }
    })?;
    let status = response.status();
    // A redirect the client did not follow (see `Outbound`): where it
    // pointed, for the reason.
    let location = super::redirect_location(status, response.headers());
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(super::retry_after_wait);
    let Some(bytes) = super::body_at_most(&mut response, MAX_ANSWER_BYTES).await.map_err(failed)? else {
        // An error page too large to read still has its status said (and
        // a busy one is asked again).
        return Err(match status.as_u16() {
            _ if status.is_success() => Failure::Final(LlmError::TooLarge),
            code if busy(code) => Failure::Busy(LlmError::StatusTooLarge(code), retry_after),
            code => Failure::Final(LlmError::StatusTooLarge(code)),
        });
    };
    let text = String::from_utf8_lossy(&bytes);
    let key: Vec<&str> = llm.api_key.as_deref().into_iter().collect();
    if let Some(location) = location {
        let (location, body) = (excerpt(&location, 300, &key), excerpt(&text, 300, &key));
        return Err(Failure::Final(LlmError::Redirect { status: status.as_u16(), location, body }));
    }
    if !status.is_success() {
        let error = LlmError::Status { status: status.as_u16(), body: excerpt(&text, 300, &key) };
        return Err(if busy(status.as_u16()) { Failure::Busy(error, retry_after) } else { Failure::Final(error) });
    }
    let completion: Completion = serde_json::from_str(&text)
        .map_err(|e| Failure::Final(LlmError::Malformed(format!("{e}; body: {}", excerpt(&text, 200, &key)))))?;
    completion
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.message.content)
        .ok_or_else(|| Failure::Final(LlmError::Malformed("no choice with message content".into())))
}

/// The innermost cause of a request error, without the URL (already said).
fn without_url(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    source.to_string()
}

/// A body (an agent's or an LLM endpoint's) quoted in a reason: `secrets`
/// (what the request sent: header values, a key) redacted while the body is
/// whole, its lines joined on one line, then clipped, never ending inside
/// the start of a secret. Reasons are read in one-line places (a table row
/// of `sparring run`, a log line), and a pretty-printed JSON error body's
/// first line is only `{`.
pub fn excerpt(s: &str, max: usize, secrets: &[&str]) -> String {
    let s = super::redact(s.to_string(), secrets);
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let joined = lines.join(" ");
    match joined.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", super::without_secret_start(&joined[..i], secrets)),
        None => joined,
    }
}

/// At most `max` characters of `s`, marked when cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The first JSON object in a model's answer: models wrap JSON in prose or
/// code fences. Read left to right: from each `{`, as a JSON value, the next
/// `{` tried where that fails, so a `{` inside a stretch that failed (`{"a":
/// {"say": "hi"}` broken later, or a `"{"` quoted in prose before the
/// object) is tried too. That is bounded: once the attempts have read
/// [`RETRY_READS`] times the answer, the search goes on from the byte each
/// failed at instead. Trying every `{` afresh without a bound read an answer
/// of many unclosed `{"a":` (up to [`MAX_ANSWER_BYTES`]) some 10^8 times
/// over.
pub fn first_json_object(text: &str) -> Option<Map<String, Value>> {
    first_json_object_examining(text, &mut 0)
}

/// How many times over [`first_json_object`] may read an answer while it
/// tries each `{` (and at least 64 KiB), before it goes on from where each
/// attempt failed.
const RETRY_READS: usize = 4;

/// [`first_json_object`], adding to `examined` the bytes it went through
/// (searched for a `{`, or read as JSON): at most [`RETRY_READS`] + 2 times
/// the answer's length (or 64 KiB more).
fn first_json_object_examining(text: &str, examined: &mut usize) -> Option<Map<String, Value>> {
    let budget = *examined + text.len().saturating_mul(RETRY_READS).max(64 << 10);
    let mut from = 0;
    while let Some(found) = text[from..].find('{') {
        *examined += found;
        let start = from + found;
        let rest = &text[start..];
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(Value::Object(m))) => {
                *examined += stream.byte_offset();
                return Some(m);
            }
            Some(Err(e)) => {
                // Never before the byte after `{`: the search moves on.
                let mut failed = failed_at(rest, &e).max(1);
                while !rest.is_char_boundary(failed) {
                    failed -= 1;
                }
                *examined += failed;
                from = if *examined < budget { start + 1 } else { start + failed };
            }
            _ => return None,
        }
    }
    *examined += text.len() - from;
    None
}

/// The byte of `text` where parsing it failed with `e` (or one before).
fn failed_at(text: &str, e: &serde_json::Error) -> usize {
    let line_start = match e.line() {
        0 | 1 => 0,
        line => text.match_indices('\n').nth(line - 2).map_or(text.len(), |(i, _)| i + 1),
    };
    (line_start + e.column().saturating_sub(1)).min(text.len())
}

/// The JSON object that is a model's whole answer, where the answer must be
/// nothing else: surrounding whitespace and one markdown code fence around
/// it (```` ``` ```` or ```` ```json ````) are allowed; prose around it, a
/// second value, or an object quoted before another is not.
pub fn sole_json_object(text: &str) -> Option<Map<String, Value>> {
    let mut body = text.trim();
    if let Some(fenced) = body.strip_prefix("```") {
        let fenced = fenced.strip_suffix("```")?;
        body = fenced.strip_prefix("json").or_else(|| fenced.strip_prefix("JSON")).unwrap_or(fenced).trim();
    }
    match serde_json::from_str(body) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sole_object_may_only_be_fenced() {
        let m = sole_json_object(" \n```json\n{\"passed\": true, \"reason\": \"ok {fine}\"}\n```\n").unwrap();
        assert_eq!((&m["passed"], &m["reason"]), (&json!(true), &json!("ok {fine}")));
        assert_eq!(sole_json_object("```\n{\"a\": 1}\n```").unwrap()["a"], 1);
        assert_eq!(sole_json_object("{\"a\": 1}\n").unwrap()["a"], 1);
        for not_alone in [
            "Sure!\n```json\n{\"passed\": true}\n```",
            "The agent said {\"passed\": true}. My verdict: {\"passed\": false}",
            "{\"passed\": true} {\"passed\": false}",
            "{\"passed\": true}\nHope this helps!",
            "```json\n{\"passed\": true}",
            "```jsonc\n{\"passed\": true}\n```",
            "[{\"passed\": true}]",
            "",
        ] {
            assert!(sole_json_object(not_alone).is_none(), "{not_alone}");
        }
    }

    #[test]
    fn json_is_found_inside_prose_and_fences() {
        let m = first_json_object("Sure!\n```json\n{\"passed\": true, \"reason\": \"ok {fine}\"}\n```").unwrap();
        assert_eq!(m["passed"], true);
        assert_eq!(m["reason"], "ok {fine}");
        assert!(first_json_object("no json here").is_none());
        assert!(first_json_object("{broken").is_none());
        // Past what failed to parse, the search goes on.
        for answer in [
            "I use {curly} braces é {\"say\": \"x\"}",
            "{\"say\": \"no\", oops}\n{\"say\": \"x\"}",
            "{\"say\": \"no\"\n{\"say\": \"x\"}",
            "{\"é\": 1é{\"say\": \"x\"}",
            "{\"say\": \"a line\nbroken\"} {\"say\": \"x\"}",
        ] {
            assert_eq!(first_json_object(answer).map(|m| m["say"].clone()), Some(json!("x")), "{answer}");
        }
    }

    #[test]
    fn finding_json_goes_through_an_answer_once() {
        // Each `{` opens an object that never closes: read from every one of
        // them in turn, such an answer of 1 MiB is some 10^8 bytes of parsing.
        for unit in ["{\"a\":", "{\"{\":", "{\"\":[", "{", "{\n\"a\":\n"] {
            let answer = unit.repeat(MAX_ANSWER_BYTES / unit.len());
            let mut examined = 0;
            assert!(first_json_object_examining(&answer, &mut examined).is_none());
            let bound = (RETRY_READS + 2) * answer.len();
            assert!(examined <= bound, "{unit:?}: {examined} bytes examined for {}", answer.len());
        }
        let mut answer = "{\"a\":".repeat(100_000);
        answer.push_str("oops\n{\"say\": \"hi\"}");
        let mut examined = 0;
        assert_eq!(first_json_object_examining(&answer, &mut examined).unwrap()["say"], "hi");
        assert!(examined <= (RETRY_READS + 2) * answer.len(), "{examined} bytes examined for {}", answer.len());
    }

    #[test]
    fn a_brace_inside_a_stretch_that_failed_is_tried_too() {
        // A `{` quoted in prose starts a parse that swallows the object's
        // own `{` into a key; the object is still found.
        let found = first_json_object("Use \"{\" to begin: {\"say\": \"hi\"}").unwrap();
        assert_eq!(found["say"], "hi");
        // An object left open around a whole one.
        let found = first_json_object("{\"a\": {\"say\": \"hi\"} and then it stops").unwrap();
        assert_eq!(found["say"], "hi");
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        let llm = LlmEndpoint {
            base_url: "http://x".into(),
            model: "m".into(),
            temperature: None,
            api_key: Some("sk-very-secret".into()),
        };
        assert!(!format!("{llm:?}").contains("very-secret"));
    }

    #[test]
    fn clip_marks_the_cut() {
        assert_eq!(clip("abcdef", 3), "abc…");
        assert_eq!(clip("abc", 3), "abc");
    }

    #[test]
    fn an_excerpt_is_one_line() {
        assert_eq!(excerpt("{\n  \"message\": \"Not Found\"\r\n}\n", 100, &[]), "{ \"message\": \"Not Found\" }");
        assert_eq!(excerpt("a  b\n\n  c", 3, &[]), "a  …");
    }
}
