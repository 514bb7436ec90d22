//! Conversations against loopback agents that speak the protocol (a tiny
//! hyper server for `http`, tungstenite for `websocket`) and a loopback
//! chat-completions double for the simulated caller.

use crate::engine::outbound::Outbound;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use sparring_server::types::{self, ChannelKind, EndedReason, TurnRole};
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::record::{metrics, nearest_rank};
use super::simulated;
use super::*;
use crate::engine::{AgentEndpoint, LlmEndpoint};

// ---------------------------------------------------------------------------
// Doubles

/// What a loopback HTTP server does with one request.
enum Act {
    Json(Value),
    Raw(u16, String),
    /// A redirect: the status and its `Location`.
    Redirect(u16, &'static str),
    /// Never answers.
    Hang,
    /// The JSON answer, after this long (an LLM that thinks).
    Later(Duration, Value),
    /// A status and body with a `Retry-After`.
    Busy(u16, &'static str, String),
}

/// One request a loopback HTTP server received.
struct Seen {
    headers: HeaderMap,
    body: Value,
}

type Log<T> = Arc<Mutex<Vec<T>>>;

/// An HTTP/1 server on a free loopback port answering every request with
/// `handler(body)`; returns its base URL and what it received.
async fn serve_http<F>(handler: F) -> (String, Log<Seen>)
where
    F: Fn(&Value) -> Act + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Log<Seen> = Arc::default();
    let handler = Arc::new(handler);
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            let log = log.clone();
            let service = service_fn(move |request: hyper::Request<Incoming>| {
                let handler = handler.clone();
                let log = log.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    let act = handler(&body);
                    log.lock().unwrap().push(Seen { headers: parts.headers, body });
                    let (status, text, header) = match act {
                        Act::Json(value) => (200, value.to_string(), None),
                        Act::Raw(status, text) => (status, text, None),
                        Act::Redirect(status, location) => (status, String::new(), Some(("location", location.into()))),
                        Act::Busy(status, text, after) => (status, text.into(), Some(("retry-after", after))),
                        Act::Hang => std::future::pending().await,
                        Act::Later(after, value) => {
                            tokio::time::sleep(after).await;
                            (200, value.to_string(), None)
                        }
                    };
                    let mut response = hyper::Response::builder().status(status);
                    if let Some((name, value)) = header {
                        response = response.header(name, value);
                    }
                    Ok::<_, Infallible>(response.body(Full::new(Bytes::from(text))).unwrap())
                }
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    (base, seen)
}

/// The server side of one websocket call, logging every frame it receives.
struct Peer {
    ws: WebSocketStream<TcpStream>,
    log: Log<Value>,
}

impl Peer {
    /// The next JSON text frame from Sparring; `None` once it closed.
    async fn recv(&mut self) -> Option<Value> {
        loop {
            match self.ws.next().await? {
                Ok(Message::Text(text)) => {
                    let value: Value = serde_json::from_str(&text).unwrap();
                    self.log.lock().unwrap().push(value.clone());
                    return Some(value);
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    async fn send(&mut self, frame: Value) {
        self.send_text(&frame.to_string()).await;
    }

    async fn send_text(&mut self, text: &str) {
        let _ = self.ws.send(Message::text(text.to_string())).await;
    }

    /// Reads until Sparring closes (answering its close).
    async fn drain(&mut self) {
        while self.recv().await.is_some() {}
    }
}

/// A websocket server on a free loopback port running `handler` for each
/// connection; returns its `ws://` URL, the frames it received and the
/// upgrade requests' headers.
async fn serve_ws<F, Fut>(handler: F) -> (String, Log<Value>, Log<HeaderMap>)
where
    F: Fn(Peer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let frames: Log<Value> = Arc::default();
    let upgrades: Log<HeaderMap> = Arc::default();
    let handler = Arc::new(handler);
    let (frame_log, upgrade_log) = (frames.clone(), upgrades.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (handler, log, upgrade_log) = (handler.clone(), frame_log.clone(), upgrade_log.clone());
            tokio::spawn(async move {
                // The signature tungstenite's handshake callback requires.
                #[allow(clippy::result_large_err)]
                let callback = move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
                    upgrade_log.lock().unwrap().push(request.headers().clone());
                    Ok(response)
                };
                if let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await {
                    handler(Peer { ws, log }).await;
                }
            });
        }
    });
    (url, frames, upgrades)
}

/// The agent double's replies: (messages, tool calls, end_call).
fn booking(line: Option<&str>) -> (Vec<&'static str>, Vec<Value>, bool) {
    let line = line.unwrap_or("").to_lowercase();
    if line.is_empty() {
        (vec!["Welcome to Bella's!", "How can I help?"], vec![], false)
    } else if line.contains("bye") {
        (vec!["Goodbye!"], vec![], true)
    } else if line.contains("hello") {
        (vec!["Hi! How can I help?"], vec![], false)
    } else if line.contains("tuesday") {
        (vec!["Tuesday works."], vec![json!({"name": "check_availability", "arguments": {"day": "tuesday"}})], false)
    } else if line.contains("table") {
        (vec!["Sure.", "For which day?"], vec![], false)
    } else {
        (vec!["Sorry?"], vec![], false)
    }
}

/// The booking agent over http.
fn booking_http(body: &Value) -> Act {
    if body["event"] == "end" {
        return Act::Json(json!({"messages": []}));
    }
    let (messages, tool_calls, end_call) = booking(body["message"]["content"].as_str());
    let messages: Vec<Value> = messages.iter().map(|m| json!({"role": "assistant", "content": m})).collect();
    Act::Json(json!({"messages": messages, "tool_calls": tool_calls, "end_call": end_call}))
}

/// The booking agent over websocket; it greets when `start` says it is
/// expected to (`agent_greets`).
async fn booking_ws(mut peer: Peer) {
    let Some(start) = peer.recv().await else { return };
    assert_eq!(start["type"], "start");
    if start["agent_greets"] == true {
        reply_ws(&mut peer, None).await;
    }
    while let Some(frame) = peer.recv().await {
        if frame["type"] == "message" && reply_ws(&mut peer, frame["content"].as_str()).await {
            peer.drain().await;
            return;
        }
    }
}

/// Sends the booking reply to `line` as frames; whether it ended the call.
async fn reply_ws(peer: &mut Peer, line: Option<&str>) -> bool {
    let (messages, tool_calls, end_call) = booking(line);
    for message in messages {
        peer.send(json!({"type": "message", "role": "assistant", "content": message})).await;
    }
    for call in tool_calls {
        peer.send(json!({"type": "tool_call", "name": call["name"], "arguments": call["arguments"]})).await;
    }
    peer.send(json!({"type": if end_call { "end_call" } else { "turn_end" }})).await;
    end_call
}

/// A chat-completions double answering with `answers` in turn (status,
/// content); returns its base URL and the requests it received.
async fn serve_llm(answers: Vec<(u16, &'static str)>) -> (String, Log<Seen>) {
    let count = AtomicUsize::new(0);
    serve_http(move |_| {
        let (status, content) =
            answers.get(count.fetch_add(1, Ordering::SeqCst)).copied().unwrap_or((200, "{\"done\": true}"));
        if status == 200 {
            Act::Json(json!({"choices": [{"message": {"role": "assistant", "content": content}}]}))
        } else {
            Act::Raw(status, content.to_string())
        }
    })
    .await
}

// ---------------------------------------------------------------------------
// Plans

fn scenario(mode: &str, first_message: Option<&str>, steps: &[&str], goal: Option<&str>) -> types::Scenario {
    serde_json::from_value(json!({
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z",
        "default_persona_id": null,
        "description": "A guest books a table.",
        "first_message": first_message,
        "goal": goal,
        "integration_id": null,
        "id": "scn_1",
        "max_duration_s": 60,
        "max_turns": 50,
        "mode": mode,
        "name": "Book a table",
        "project_id": "prj_1",
        "steps": steps.iter().map(|s| json!({"say": s, "expect": []})).collect::<Vec<_>>(),
        "success_criteria": [],
        "tags": [],
        "version": 1,
    }))
    .unwrap()
}

fn persona() -> types::Persona {
    serde_json::from_value(json!({
        "accent": "Scottish",
        "background_noise": "none",
        "background_noise_volume": 0.0,
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z",
        "description": "A retired teacher.",
        "gender": null,
        "id": "per_1",
        "interruption_level": "high",
        "language": "en-GB",
        "name": "Morag",
        "patience": "low",
        "project_id": "prj_1",
        "prompt": "Ask about the vegetarian menu at some point.",
        "tags": ["regular guest"],
        "verbosity": "low",
        "voice": {"provider": null, "voice_id": null, "speed": 1.0},
    }))
    .unwrap()
}

fn plan(kind: ChannelKind, target: impl Into<String>, scenario: types::Scenario) -> CallPlan {
    CallPlan {
        call_id: "call_test1".into(),
        scenario,
        persona: None,
        agent: AgentEndpoint {
            kind,
            target: target.into(),
            headers: vec![("x-api-key".into(), "secret-value".into())],
            turn_timeout: Duration::from_secs(10),
        },
        caller_llm: None,
        max_turns: 50,
        max_duration: Duration::from_secs(60),
    }
}

fn scripted(first_message: Option<&str>, steps: &[&str]) -> types::Scenario {
    scenario("scripted", first_message, steps, None)
}

async fn run(plan: &CallPlan) -> Outcome {
    run_with(plan, &CancellationToken::new()).await
}

async fn run_with(plan: &CallPlan, cancel: &CancellationToken) -> Outcome {
    let http = Outbound::of(reqwest::Client::builder().no_proxy());
    // A safety net so a bug shows as a failure, not a stuck test run.
    tokio::time::timeout(Duration::from_secs(120), converse(&http, plan, cancel)).await.expect("converse hung")
}

/// The transcript as (role, text) pairs.
fn lines(outcome: &Outcome) -> Vec<(&'static str, String)> {
    outcome
        .transcript
        .iter()
        .map(|t| (if t.role == TurnRole::Caller { "caller" } else { "agent" }, t.text.clone()))
        .collect()
}

fn tool_calls(outcome: &Outcome) -> Vec<(String, Value, i32)> {
    outcome.tool_calls.iter().map(|c| (c.name.clone(), Value::Object(c.arguments.clone()), c.turn)).collect()
}

/// (event, turn, caller line) of every request an http agent received.
fn events(seen: &Log<Seen>) -> Vec<(String, u64, Option<String>)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s.body["event"].as_str().unwrap_or("?").to_string(),
                s.body["turn"].as_u64().unwrap_or(999),
                s.body["message"]["content"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// The `type` (and content) of every frame a websocket agent received.
fn frames(log: &Log<Value>) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .map(|f| match f["content"].as_str() {
            Some(content) => format!("{}: {content}", f["type"].as_str().unwrap_or("?")),
            None => f["type"].as_str().unwrap_or("?").to_string(),
        })
        .collect()
}

fn s(text: &str) -> String {
    text.to_string()
}

/// Invariants every outcome keeps: timings in order, latency only on agent
/// turns, metrics consistent with the transcript.
fn assert_consistent(outcome: &Outcome) {
    let mut previous = 0;
    for turn in &outcome.transcript {
        assert!(turn.start_ms >= previous && turn.end_ms >= turn.start_ms, "{:?}", outcome.transcript);
        previous = turn.end_ms;
        assert_eq!(turn.latency_ms.is_some(), turn.role == TurnRole::Agent);
        assert!(turn.latency_ms.unwrap_or(0) >= 0);
    }
    assert!(outcome.duration_ms as i64 >= previous);
    assert_eq!(outcome.metrics.turns as usize, outcome.transcript.len());
    let mut latencies: Vec<i64> = outcome.transcript.iter().filter_map(|t| t.latency_ms).collect();
    latencies.sort();
    assert_eq!(outcome.metrics.latency_ms.max, latencies.last().copied());
    assert_eq!(outcome.metrics.latency_ms.p50, nearest_rank(&latencies, 50));
    // The first words fall within the first agent turn that has words: at
    // its start, or later when they came after its first frame (a tool
    // call, or a `turn_end` before them).
    let first_words = outcome.transcript.iter().find(|t| t.role == TurnRole::Agent && !t.text.is_empty());
    match (outcome.metrics.time_to_first_word_ms, first_words) {
        (Some(words), Some(turn)) => assert!(words >= turn.start_ms && words <= turn.end_ms, "{outcome:?}"),
        (words, turn) => assert_eq!(words, turn.map(|t| t.start_ms), "{outcome:?}"),
    }
}

// ---------------------------------------------------------------------------
// Scripted calls over http

#[tokio::test]
async fn scripted_http_call_follows_the_script() {
    let (base, seen) = serve_http(booking_http).await;
    let plan = plan(
        ChannelKind::Http,
        format!("{base}/http"),
        scripted(Some("Hi, I'd like a table"), &["Tuesday please", "Thanks"]),
    );
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert_eq!(outcome.error, None);
    assert!(!outcome.caller_error);
    assert_eq!(
        lines(&outcome),
        vec![
            ("caller", s("Hi, I'd like a table")),
            ("agent", s("Sure. For which day?")),
            ("caller", s("Tuesday please")),
            ("agent", s("Tuesday works.")),
            ("caller", s("Thanks")),
            ("agent", s("Sorry?")),
        ]
    );
    assert_eq!(outcome.step_replies, vec![vec![3], vec![5]]);
    assert_eq!(tool_calls(&outcome), vec![(s("check_availability"), json!({"day": "tuesday"}), 3)]);
    assert_eq!(outcome.metrics.turns, 6);
    assert_eq!(outcome.metrics.time_to_first_word_ms, Some(outcome.transcript[1].start_ms));
    assert!(outcome.metrics.latency_ms.p95.is_some());
    assert!(outcome.reached_agent);
    assert_consistent(&outcome);

    assert_eq!(
        events(&seen),
        vec![
            (s("start"), 0, Some(s("Hi, I'd like a table"))),
            (s("message"), 1, Some(s("Tuesday please"))),
            (s("message"), 2, Some(s("Thanks"))),
            (s("end"), 3, None),
        ]
    );
    for request in seen.lock().unwrap().iter() {
        assert_eq!(request.headers["x-sparring-call-id"], "call_test1");
        assert_eq!(request.headers["x-api-key"], "secret-value");
        assert_eq!(request.headers["content-type"], "application/json");
        assert_eq!(request.body["call_id"], "call_test1");
        if request.body["event"] != "end" {
            assert_eq!(request.body["message"]["role"], "user");
        } else {
            assert_eq!(request.body["message"], Value::Null);
        }
    }
}

#[tokio::test]
async fn agent_greets_first_when_there_is_no_first_message() {
    let (base, seen) = serve_http(booking_http).await;
    let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(None, &["A table, please"]));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert_eq!(
        lines(&outcome),
        vec![
            ("agent", s("Welcome to Bella's! How can I help?")),
            ("caller", s("A table, please")),
            ("agent", s("Sure. For which day?")),
        ]
    );
    assert_eq!(outcome.step_replies, vec![vec![2]]);
    assert_eq!(outcome.metrics.time_to_first_word_ms, Some(outcome.transcript[0].start_ms));
    assert_consistent(&outcome);
    assert_eq!(events(&seen).len(), 3, "start, one message, end");
    let requests = seen.lock().unwrap();
    assert_eq!(requests[0].body["event"], "start");
    assert_eq!(requests[0].body["message"], Value::Null);
}

#[tokio::test]
async fn agent_ends_the_call() {
    let (base, seen) = serve_http(booking_http).await;
    let plan = plan(
        ChannelKind::Http,
        format!("{base}/http"),
        scripted(Some("Hi, a table"), &["Tuesday please", "OK bye", "Never said"]),
    );
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::AgentEnded);
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.transcript.len(), 6);
    assert_eq!(outcome.transcript[5].text, "Goodbye!");
    assert_eq!(outcome.step_replies, vec![vec![3], vec![5]], "the third step was never reached: no entry");
    // The agent hung up: no `end` is sent.
    assert_eq!(events(&seen).last().unwrap().0, "message");
    assert_eq!(events(&seen).len(), 3);
}

#[tokio::test]
async fn max_turns_stops_before_a_line_whose_reply_would_not_fit() {
    let steps = ["Hello there", "Tuesday please", "A table", "More", "Even more"];
    let (base, seen) = serve_http(booking_http).await;
    for (max_turns, expected) in [(4, 4), (5, 4), (6, 6)] {
        let mut plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi"), &steps));
        plan.max_turns = max_turns;
        let outcome = run(&plan).await;
        assert_eq!(outcome.ended_reason, EndedReason::MaxTurns, "max_turns {max_turns}");
        assert_eq!(outcome.transcript.len(), expected, "max_turns {max_turns}");
        assert_eq!(outcome.step_replies.iter().filter(|r| !r.is_empty()).count(), expected / 2 - 1);
        assert_consistent(&outcome);
    }
    // Each call hung up with `end`.
    assert_eq!(events(&seen).iter().filter(|e| e.0 == "end").count(), 3);

    // The limit counts the opening exchange too.
    let mut tiny = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi"), &steps));
    tiny.max_turns = 1;
    let before = events(&seen).len();
    let outcome = run(&tiny).await;
    assert_eq!(outcome.ended_reason, EndedReason::MaxTurns);
    assert!(outcome.transcript.is_empty());
    assert_eq!(events(&seen).len(), before, "a call with no room is not started");
    assert!(!outcome.reached_agent, "so it costs nothing");
}

#[tokio::test]
async fn max_duration_ends_a_call_waiting_for_the_agent() {
    // The agent never answers (but takes the hang-up): the call's limit, far
    // below the turn timeout, ends it.
    let (base, seen) = serve_http(|body| match body["event"].as_str() {
        Some("end") => booking_http(body),
        _ => Act::Hang,
    })
    .await;
    let mut plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi, a table"), &["Tuesday please"]));
    plan.max_duration = Duration::from_millis(300);
    plan.agent.turn_timeout = Duration::from_secs(60);
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::MaxDuration);
    assert_eq!(outcome.error, None);
    assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table"))]);
    assert!(outcome.step_replies.is_empty(), "only the opening line was said; step 1 was never reached");
    assert!(outcome.duration_ms >= 300);
    assert_eq!(events(&seen).iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(), vec![("start", 0), ("end", 1)]);
}

#[tokio::test]
async fn cancel_is_seen_before_the_next_caller_line() {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let (base, seen) = serve_http(move |body| {
        if body["turn"] == 1 {
            token.cancel();
        }
        booking_http(body)
    })
    .await;
    let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi"), &["A table", "Tuesday", "More"]));
    let outcome = run_with(&plan, &cancel).await;

    assert_eq!(outcome.ended_reason, EndedReason::Cancelled);
    // The turn running when the token was cancelled finished.
    assert_eq!(outcome.transcript.len(), 4);
    assert_eq!(outcome.transcript[3].text, "Sure. For which day?");
    assert_eq!(
        events(&seen).iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(),
        vec![("start", 0), ("message", 1), ("end", 2)]
    );

    // Cancelled before it began: the agent is never called.
    let (base, seen) = serve_http(booking_http).await;
    let plan = self::plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi"), &["A table"]));
    let outcome = run_with(&plan, &cancel).await;
    assert_eq!(outcome.ended_reason, EndedReason::Cancelled);
    assert!(outcome.transcript.is_empty());
    assert!(seen.lock().unwrap().is_empty());
    assert!(!outcome.reached_agent);
}

#[tokio::test]
async fn empty_replies_add_no_turn_and_tool_only_replies_do() {
    let (base, _seen) = serve_http(|body| match body["turn"].as_u64() {
        Some(0) => Act::Json(json!({"messages": []})),
        Some(1) => Act::Json(json!({"messages": [], "tool_calls": [{"name": "lookup"}]})),
        _ => Act::Json(json!({"messages": [{"content": "  "}, {"role": "assistant", "content": "Done."}], "end_call": null, "tool_calls": null})),
    })
    .await;
    let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(None, &["First", "Second"]));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert_eq!(
        lines(&outcome),
        vec![("caller", s("First")), ("agent", s("")), ("caller", s("Second")), ("agent", s("Done."))]
    );
    assert_eq!(outcome.step_replies, vec![vec![1], vec![3]]);
    assert_eq!(tool_calls(&outcome), vec![(s("lookup"), json!({}), 1)]);
    // The first words came in turn 3, not in the silent turn 1.
    assert_eq!(outcome.metrics.time_to_first_word_ms, Some(outcome.transcript[3].start_ms));
    assert_consistent(&outcome);
}

// ---------------------------------------------------------------------------
// http failures

async fn http_failure(act: fn(&Value) -> Act, turn_timeout: Duration) -> (Outcome, Log<Seen>) {
    let (base, seen) = serve_http(act).await;
    let mut plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi, a table"), &["Tuesday please"]));
    plan.agent.turn_timeout = turn_timeout;
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
    assert!(!outcome.caller_error);
    assert_consistent(&outcome);
    (outcome, seen)
}

#[tokio::test]
async fn http_refused_connection() {
    let (_held, port) = crate::engine::closed_port();
    let plan = plan(ChannelKind::Http, format!("http://127.0.0.1:{port}/http"), scripted(Some("Hi"), &[]));
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError);
    let error = outcome.error.clone().unwrap();
    assert!(
        error.starts_with(&format!("could not reach the agent at http://127.0.0.1:{port}/http for turn 0: ")),
        "{error}"
    );
    assert!(error.to_lowercase().contains("refused"), "{error}");
    assert_eq!(lines(&outcome), vec![("caller", s("Hi"))]);
    assert!(!outcome.reached_agent, "the line was never delivered");
}

/// Replies each under the per-reply limit, but a call whose record would
/// grow without bound: it is ended once the record passes its limit, and
/// what was said until then is kept.
#[tokio::test]
async fn a_call_whose_record_grows_past_its_limit_is_ended() {
    let words = "w".repeat(600 << 10);
    let (base, seen) = serve_http(move |body| {
        if body["event"] == "end" {
            return Act::Json(json!({"messages": []}));
        }
        Act::Json(json!({"messages": [{"role": "assistant", "content": words}]}))
    })
    .await;
    let steps: Vec<&str> = vec!["more"; 20];
    let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi"), &steps));
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the call's transcript and tool calls passed 2 MiB after turn 3"), "{error}");
    assert!(error.contains("mostly the agent's replies and tool calls (2.3 MiB)"), "{error}");
    assert!(!outcome.caller_error);
    // Four replies of 600 KiB: the fourth passed 2 MiB, and no line followed.
    assert_eq!(outcome.transcript.iter().filter(|t| t.role == TurnRole::Agent).count(), 4);
    assert_eq!(events(&seen).iter().filter(|e| e.0 == "message").count(), 3);
    assert!(outcome.reached_agent);
    assert_consistent(&outcome);
}

/// The simulated caller's LLM writes the long lines: the record passing its
/// limit is the caller's doing, not the agent's, and the verdict is `error`.
#[tokio::test]
async fn a_record_grown_by_the_callers_lines_is_a_caller_error() {
    let (agent, seen) = serve_http(booking_http).await;
    let line: &'static str =
        Box::leak(json!({"say": "w".repeat(600 << 10), "done": false}).to_string().into_boxed_str());
    let (llm, _) = serve_llm(vec![(200, line); 20]).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert!(outcome.caller_error);
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the call's transcript and tool calls passed 2 MiB after turn 4"), "{error}");
    assert!(error.contains("mostly the caller's lines (2.3 MiB)"), "{error}");
    // Four lines of 600 KiB, each answered: the caller hung up.
    assert_eq!(outcome.transcript.iter().filter(|t| t.role == TurnRole::Caller).count(), 5);
    assert_eq!(events(&seen).last().unwrap().0, "end");
    assert_consistent(&outcome);
}

#[tokio::test]
async fn http_server_error_shows_status_and_body() {
    let (outcome, seen) = http_failure(
        |body| if body["turn"] == 1 { Act::Raw(503, "agent overloaded\n".into()) } else { booking_http(body) },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(outcome.error.as_deref(), Some("the agent answered turn 1 with HTTP 503: agent overloaded"));
    assert_eq!(outcome.transcript.len(), 3);
    assert!(outcome.reached_agent);
    // An agent error is not followed by `end`.
    assert_eq!(events(&seen).len(), 2);
}

#[tokio::test]
async fn http_long_error_bodies_are_clipped() {
    let (outcome, _) = http_failure(|_| Act::Raw(500, "x".repeat(5000)), Duration::from_secs(10)).await;
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent answered turn 0 with HTTP 500: xxx"), "{error}");
    assert!(error.ends_with('…') && error.len() < 400, "{error}");
}

#[tokio::test]
async fn http_hanging_agent_times_out() {
    let (outcome, _) = http_failure(|_| Act::Hang, Duration::from_millis(300)).await;
    assert_eq!(outcome.error.as_deref(), Some("the agent did not answer turn 0 within 300 ms"));
    assert!(outcome.reached_agent, "it took the request: the call costs");
}

/// An agent that begins its reply (status and headers, part of the body)
/// and does not finish it within the turn timeout (a reply streamed slowly)
/// is told so: "did not answer" would send its engineer looking for a
/// request that never came.
#[tokio::test]
async fn http_reply_begun_and_not_finished_says_so() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !String::from_utf8_lossy(&request).contains("\"event\"") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
                let _ = stream.write_all(format!("{head}{{\"messages\": [").as_bytes()).await;
                // The rest never comes.
                let _ = stream.read(&mut buffer).await;
            });
        }
    });
    let mut plan = plan(ChannelKind::Http, format!("http://{address}/http"), scripted(Some("Hi"), &[]));
    plan.agent.turn_timeout = Duration::from_millis(300);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent's reply to turn 0 began after "), "{error}");
    assert!(
        error.ends_with(" ms but was not complete within 300 ms (a reply is read whole: send its body at once)"),
        "{error}"
    );
    assert!(outcome.reached_agent);
    assert_consistent(&outcome);
}

/// A connection the agent never takes (its address does not answer) is
/// not an agent slow to answer: nothing reached it, so the call costs
/// nothing, whether the turn timeout or the call's `max_duration` ends it.
#[tokio::test]
async fn http_connection_never_made_is_unreached() {
    let (_held, port) = crate::engine::unanswered_port().await;
    let target = format!("http://127.0.0.1:{port}/http");
    let mut plan = plan(ChannelKind::Http, target.clone(), scripted(Some("Hi"), &[]));
    plan.agent.turn_timeout = Duration::from_millis(300);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError);
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with(&format!("could not connect to the agent at {target} for turn 0 within ")), "{error}");
    assert!(!outcome.reached_agent, "nothing reached the agent: {outcome:?}");
    assert_consistent(&outcome);

    plan.agent.turn_timeout = Duration::from_secs(60);
    plan.max_duration = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let outcome = run(&plan).await;
    assert_eq!((outcome.ended_reason, outcome.error.as_deref()), (EndedReason::MaxDuration, None));
    assert!(outcome.duration_ms >= 300, "{outcome:?}");
    assert!(!outcome.reached_agent, "nothing reached the agent: {outcome:?}");
    // And no `end` waits for the connection that was never made.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

/// The latency of an http turn runs from when its request was sent: a
/// connection the request had to make first (DNS, TCP, TLS; here a
/// connect that takes a second, its first SYN dropped by a full accept
/// queue) is no part of how long the agent took to answer.
#[tokio::test]
async fn http_latency_leaves_out_making_the_connection() {
    // A listener whose accept queue is full, so that a new connection's
    // first SYN is dropped and the connect waits for its retransmission.
    let (listener, queued) = crate::engine::full_listener().await;
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Room again once the call's first SYN was dropped.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(queued);
        while let Ok((stream, _)) = listener.accept().await {
            let service = service_fn(|request: hyper::Request<Incoming>| async move {
                let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let reply = match booking_http(&body) {
                    Act::Json(value) => value.to_string(),
                    _ => unreachable!(),
                };
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(reply))))
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    let plan = plan(ChannelKind::Http, format!("http://{address}/http"), scripted(Some("Hi, a table"), &[]));
    let outcome = run(&plan).await;
    assert_eq!(outcome.error, None, "{outcome:?}");
    let (caller, agent) = (&outcome.transcript[0], &outcome.transcript[1]);
    let waited = agent.start_ms - caller.start_ms;
    assert!(waited >= 900, "the connection took its second: {outcome:?}");
    let latency = agent.latency_ms.unwrap();
    assert!(latency * 2 < waited, "the latency {latency} ms holds the connect of the {waited} ms waited");
    assert_consistent(&outcome);
}

#[tokio::test]
async fn http_reply_that_is_not_json() {
    let (outcome, _) = http_failure(|_| Act::Raw(200, "<html>oops</html>".into()), Duration::from_secs(10)).await;
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent's reply to turn 0 is not JSON ("), "{error}");
    assert!(error.ends_with("<html>oops</html>"), "{error}");
}

#[tokio::test]
async fn http_reply_of_the_wrong_shape() {
    let (outcome, _) = http_failure(
        |body| if body["turn"] == 1 { Act::Json(json!({"message": "hi"})) } else { booking_http(body) },
        Duration::from_secs(10),
    )
    .await;
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent's reply to turn 1 is not of the protocol's shape"), "{error}");
    assert!(error.contains("missing field `messages`"), "{error}");

    let (outcome, _) =
        http_failure(|_| Act::Json(json!({"messages": [{"content": 3}]})), Duration::from_secs(10)).await;
    assert!(outcome.error.unwrap().starts_with("the agent's reply to turn 0 is not of the protocol's shape"));

    // A message with no `content` (or a null one), as a `websocket`
    // `message` frame without it: it was taken for silence.
    let without: fn(&Value) -> Act = |_| Act::Json(json!({"messages": [{"role": "assistant"}]}));
    let null: fn(&Value) -> Act = |_| Act::Json(json!({"messages": [{"role": "assistant", "content": null}]}));
    for reply in [without, null] {
        let (outcome, _) = http_failure(reply, Duration::from_secs(10)).await;
        assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
        let error = outcome.error.unwrap();
        assert!(error.starts_with("the agent's reply to turn 0 is not of the protocol's shape"), "{error}");
        assert!(error.contains("content"), "{error}");
    }
}

/// An agent that answers a turn's POST with a 301, 302 or 303 would have it
/// followed as a GET without its body (as every HTTP client does): the
/// caller's line would never reach the agent, and whatever the GET answered
/// would be taken as the reply to it. Such a redirect is the turn's error,
/// naming where it pointed; a 307 or 308 (which keep the POST and its body)
/// within the origin is still followed.
#[tokio::test]
async fn http_redirect_that_would_drop_the_callers_line_is_not_followed() {
    for status in [301, 302, 303] {
        let (base, seen) = serve_http(move |body| {
            if body.is_null() {
                // The GET a followed redirect makes: no event, no line.
                return Act::Json(json!({"messages": [{"role": "assistant", "content": "Anything else?"}]}));
            }
            Act::Redirect(status, "/moved")
        })
        .await;
        let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi, a table"), &[]));
        let outcome = run(&plan).await;
        assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{status}: {outcome:?}");
        let error = outcome.error.clone().unwrap();
        assert!(error.starts_with(&format!("the agent answered turn 0 with HTTP {status}")), "{error}");
        assert!(error.contains("/moved"), "the reason says where it pointed: {error}");
        assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table"))]);
        assert!(seen.lock().unwrap().iter().all(|seen| !seen.body.is_null()), "{status}: no GET was made");
    }
    let requests = AtomicUsize::new(0);
    let (base, seen) = serve_http(move |body| match requests.fetch_add(1, Ordering::SeqCst) {
        0 => Act::Redirect(307, "/moved"),
        _ => booking_http(body),
    })
    .await;
    let plan = plan(ChannelKind::Http, format!("{base}/http"), scripted(Some("Hi, a table"), &[]));
    let outcome = run(&plan).await;
    assert_eq!(outcome.error, None);
    assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table")), ("agent", s("Sure. For which day?"))]);
    assert_eq!(seen.lock().unwrap().len(), 3, "the POST, the same POST at its new place, and `end`");
}

#[tokio::test]
async fn unsupported_channel_kinds() {
    for (kind, name) in [(ChannelKind::Phone, "phone"), (ChannelKind::Sip, "sip")] {
        let outcome = run(&plan(kind, "+15550100", scripted(Some("Hi"), &[]))).await;
        assert_eq!(outcome.ended_reason, EndedReason::AgentError);
        assert_eq!(outcome.error, Some(format!("channel kind `{name}` is not supported yet")));
        assert!(outcome.transcript.is_empty());
    }
}

#[tokio::test]
async fn header_values_never_show_in_errors() {
    let mut plan = plan(ChannelKind::Http, "http://127.0.0.1:1/http", scripted(Some("Hi"), &[]));
    plan.agent.headers = vec![("authorization".into(), "Bearer top-secret\n".into())];
    let outcome = run(&plan).await;
    let error = outcome.error.clone().unwrap();
    assert_eq!(error, "the value of the channel header `authorization` is not a valid HTTP header value");
    assert!(!format!("{outcome:?}").contains("top-secret"));
}

/// A plan holds the channel's header values opened; printed (a log line, a
/// panic message, a test's failure), it shows their names only, as an LLM
/// endpoint shows no key.
#[test]
fn header_values_never_show_in_a_plans_debug() {
    let mut plan = simulated_plan("http://127.0.0.1:9/http".into(), Some("http://127.0.0.1:9/v1"), None);
    plan.agent.headers.push(("authorization".into(), "Bearer sk-agent-0815".into()));
    let printed = format!("{plan:?}");
    for secret in ["secret-value", "sk-agent-0815", "sk-test"] {
        assert!(!printed.contains(secret), "{secret} in {printed}");
    }
    assert!(printed.contains("x-api-key") && printed.contains("authorization"), "{printed}");
}

// ---------------------------------------------------------------------------
// Scripted calls over websocket

#[tokio::test]
async fn scripted_websocket_call_follows_the_script() {
    let (url, received, upgrades) = serve_ws(booking_ws).await;
    let plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi, I'd like a table"), &["Tuesday please", "Thanks"]));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert_eq!(
        lines(&outcome),
        vec![
            ("caller", s("Hi, I'd like a table")),
            ("agent", s("Sure. For which day?")),
            ("caller", s("Tuesday please")),
            ("agent", s("Tuesday works.")),
            ("caller", s("Thanks")),
            ("agent", s("Sorry?")),
        ]
    );
    assert_eq!(outcome.step_replies, vec![vec![3], vec![5]]);
    assert_eq!(tool_calls(&outcome), vec![(s("check_availability"), json!({"day": "tuesday"}), 3)]);
    assert_consistent(&outcome);

    assert_eq!(
        frames(&received),
        vec![
            s("start"),
            s("message: Hi, I'd like a table"),
            s("message: Tuesday please"),
            s("message: Thanks"),
            s("end_call"),
        ]
    );
    let log = received.lock().unwrap();
    assert_eq!(log[0]["call_id"], "call_test1");
    assert_eq!(log[1]["role"], "user");
    let upgrades = upgrades.lock().unwrap();
    assert_eq!(upgrades.len(), 1, "one connection per call");
    assert_eq!(upgrades[0]["x-sparring-call-id"], "call_test1");
    assert_eq!(upgrades[0]["x-api-key"], "secret-value");
}

/// A websocket target is called as the URL the API accepted it as (`url`'s
/// reading, which also sends an http channel's): the handshake's stricter
/// URI parser refused an upper-case scheme (`WSS://`) and a path or query
/// with a space, so every call over such a channel failed, and one with a
/// space was counted as reaching the agent it never connected to.
#[tokio::test]
async fn websocket_target_is_called_as_the_url_it_was_accepted_as() {
    let (url, received, upgrades) = serve_ws(booking_ws).await;
    let targets = [url.replacen("ws://", "WS://", 1), format!("{url}/a b"), format!("{url}?q=a b|c")];
    for target in &targets {
        assert!(crate::validate::url("target", target, &["ws", "wss"]).is_ok(), "the API accepts {target}");
        let plan = plan(ChannelKind::Websocket, target.clone(), scripted(Some("Hi, I'd like a table"), &["Thanks"]));
        let outcome = run(&plan).await;
        assert_eq!((outcome.ended_reason, &outcome.error), (EndedReason::CallerDone, &None), "{target}");
        assert_eq!(lines(&outcome).len(), 4, "{target}");
    }
    assert_eq!(upgrades.lock().unwrap().len(), targets.len());
    assert_eq!(frames(&received).iter().filter(|f| *f == "start").count(), targets.len());
}

#[tokio::test]
async fn websocket_greeting_first_and_agent_ending() {
    let (url, received, _) = serve_ws(booking_ws).await;
    let plan = plan(ChannelKind::Websocket, url, scripted(None, &["A table", "Bye then", "Never said"]));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::AgentEnded, "{:?}", outcome.error);
    assert_eq!(
        lines(&outcome),
        vec![
            ("agent", s("Welcome to Bella's! How can I help?")),
            ("caller", s("A table")),
            ("agent", s("Sure. For which day?")),
            ("caller", s("Bye then")),
            ("agent", s("Goodbye!")),
        ]
    );
    assert_eq!(outcome.step_replies, vec![vec![2], vec![4]], "the third step was never reached: no entry");
    assert_eq!(outcome.metrics.time_to_first_word_ms, Some(outcome.transcript[0].start_ms));
    assert_consistent(&outcome);
    // No `end_call` from us: the agent hung up.
    assert_eq!(frames(&received), vec![s("start"), s("message: A table"), s("message: Bye then")]);
}

#[tokio::test]
async fn websocket_silence_ends_a_turn() {
    let (url, _, _) = serve_ws(|mut peer| async move {
        while let Some(frame) = peer.recv().await {
            if frame["type"] == "message" {
                // No turn_end: the turn ends after the turn timeout of silence.
                peer.send(json!({"type": "message", "role": "assistant", "content": "Mm-hm."})).await;
            }
        }
    })
    .await;
    let mut plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi"), &["Still there?"]));
    plan.agent.turn_timeout = Duration::from_millis(1500);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert_eq!(
        lines(&outcome),
        vec![("caller", s("Hi")), ("agent", s("Mm-hm.")), ("caller", s("Still there?")), ("agent", s("Mm-hm."))]
    );
}

#[tokio::test]
async fn websocket_max_duration_keeps_what_the_agent_said() {
    let (url, received, _) = serve_ws(|mut peer| async move {
        while let Some(frame) = peer.recv().await {
            if frame["type"] == "message" {
                peer.send(json!({"type": "message", "role": "assistant", "content": "Let me think"})).await;
                peer.send(json!({"type": "tool_call", "name": "think"})).await;
            }
        }
    })
    .await;
    let mut plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi"), &["Anything?"]));
    plan.agent.turn_timeout = Duration::from_secs(60);
    // Long enough for the frames sent at once to arrive first.
    plan.max_duration = Duration::from_secs(3);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::MaxDuration, "{:?}", outcome.error);
    assert_eq!(lines(&outcome), vec![("caller", s("Hi")), ("agent", s("Let me think"))]);
    assert_eq!(tool_calls(&outcome), vec![(s("think"), json!({}), 1)]);
    assert_eq!(frames(&received).last().unwrap(), "end_call");
}

/// Sends `frames` in one write, so they reach Sparring together.
/// An agent's `message` frame.
fn assistant(content: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": content})
}

/// Frames sent together, then, if given, more after a pause.
type Answer = (Vec<Value>, Option<(Duration, Vec<Value>)>);

/// A websocket agent answering the caller's `n`th line (from 1) with
/// `answer(n)`.
async fn serve_ws_by_line(answer: fn(usize) -> Answer) -> String {
    let (agent, _, _) = serve_ws(move |mut peer| async move {
        let mut lines = 0;
        while let Some(received) = peer.recv().await {
            if received["type"] == "message" {
                lines += 1;
                let (now, later) = answer(lines);
                send_together(&mut peer, &now).await;
                if let Some((after, frames)) = later {
                    tokio::time::sleep(after).await;
                    send_together(&mut peer, &frames).await;
                }
            }
        }
    })
    .await;
    agent
}

async fn send_together(peer: &mut Peer, frames: &[Value]) {
    for frame in frames {
        peer.ws.feed(Message::text(frame.to_string())).await.unwrap();
    }
    peer.ws.flush().await.unwrap();
}

#[tokio::test]
async fn websocket_frames_after_turn_end_stay_in_their_turn() {
    // Frames sent after `turn_end` wait in the socket when the caller's next
    // line goes out: they belong to the turn that ended, and the next
    // turn's latency runs from the line to the agent's first frame after it.
    const SLOW: Duration = Duration::from_millis(1200);
    let (url, _, _) = serve_ws(|mut peer| async move {
        let message = |content: &str| json!({"type": "message", "role": "assistant", "content": content});
        let mut lines = 0;
        while let Some(received) = peer.recv().await {
            if received["type"] != "message" {
                continue;
            }
            lines += 1;
            match lines {
                1 => {
                    peer.send(message("Reply one.")).await;
                    let note = json!({"type": "tool_call", "name": "note", "arguments": {"n": 1}});
                    send_together(&mut peer, &[json!({"type": "turn_end"}), message("Anything else?"), note]).await;
                }
                2 => {
                    tokio::time::sleep(SLOW).await;
                    send_together(&mut peer, &[message("Reply two."), json!({"type": "turn_end"})]).await;
                }
                // A turn that said nothing before its `turn_end`: its words
                // came after it.
                3 => send_together(&mut peer, &[json!({"type": "turn_end"}), message("Late words.")]).await,
                _ => send_together(&mut peer, &[message("Reply four."), json!({"type": "turn_end"})]).await,
            }
        }
    })
    .await;
    let plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi"), &["Tuesday please", "Thanks", "Ok"]));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert_eq!(
        lines(&outcome),
        vec![
            ("caller", s("Hi")),
            ("agent", s("Reply one. Anything else?")),
            ("caller", s("Tuesday please")),
            ("agent", s("Reply two.")),
            ("caller", s("Thanks")),
            ("agent", s("Late words.")),
            ("caller", s("Ok")),
            ("agent", s("Reply four.")),
        ]
    );
    assert_eq!(tool_calls(&outcome), vec![(s("note"), json!({"n": 1}), 1)]);
    assert_eq!(outcome.step_replies, vec![vec![3], vec![5], vec![7]]);
    let latency = |i: usize| outcome.transcript[i].latency_ms.unwrap();
    assert!(latency(3) >= SLOW.as_millis() as i64, "the slow reply's latency: {:?}", outcome.transcript);
    assert_eq!(outcome.metrics.latency_ms.max, Some(latency(3)));
    // The late words' turn is timed from its `turn_end`, before the next line.
    assert!(latency(5) < SLOW.as_millis() as i64, "{:?}", outcome.transcript);
    assert!(outcome.transcript[5].end_ms <= outcome.transcript[6].start_ms);
    assert_consistent(&outcome);
}

#[tokio::test]
async fn websocket_late_words_count_toward_max_turns() {
    // The opening's reply says nothing before its `turn_end` and its words
    // come after it; every later reply is on time. The late words are a
    // turn, so the next line and its reply do not fit in 3.
    let (url, _, _) = serve_ws(|mut peer| async move {
        let message = |content: &str| json!({"type": "message", "role": "assistant", "content": content});
        let mut lines = 0;
        while let Some(received) = peer.recv().await {
            if received["type"] != "message" {
                continue;
            }
            lines += 1;
            if lines == 1 {
                send_together(&mut peer, &[json!({"type": "turn_end"}), message("Late hello.")]).await;
            } else {
                send_together(&mut peer, &[message("Reply."), json!({"type": "turn_end"})]).await;
            }
        }
    })
    .await;
    let mut plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi"), &["Tuesday please", "Thanks"]));
    plan.max_turns = 3;
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::MaxTurns, "{:?}", outcome.error);
    assert_eq!(lines(&outcome), vec![("caller", s("Hi")), ("agent", s("Late hello."))]);
    assert_consistent(&outcome);
}

#[tokio::test]
async fn websocket_end_call_after_turn_end_ends_the_call() {
    let (url, received, _) = serve_ws(|mut peer| async move {
        let mut answered = false;
        while let Some(frame) = peer.recv().await {
            if frame["type"] == "message" && !answered {
                answered = true;
                let bye = json!({"type": "message", "role": "assistant", "content": "Bye now."});
                send_together(&mut peer, &[json!({"type": "turn_end"}), bye, json!({"type": "end_call"})]).await;
            }
        }
    })
    .await;
    let plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi"), &["Tuesday please"]));
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentEnded, "{:?}", outcome.error);
    assert_eq!(lines(&outcome), vec![("caller", s("Hi")), ("agent", s("Bye now."))]);
    assert_eq!(outcome.step_replies, Vec::<Vec<usize>>::new(), "the step was never said");
    assert_eq!(frames(&received), vec![s("start"), s("message: Hi")]);
    // The turn began at its `turn_end`; its words came with the frame after.
    let words = outcome.metrics.time_to_first_word_ms.unwrap();
    assert!(words >= outcome.transcript[1].start_ms && words <= outcome.transcript[1].end_ms, "{outcome:?}");
}

// ---------------------------------------------------------------------------
// websocket failures

async fn ws_failure<F, Fut>(handler: F, turn_timeout: Duration) -> Outcome
where
    F: Fn(Peer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (url, _, _) = serve_ws(handler).await;
    let mut plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi, a table"), &["Tuesday please"]));
    plan.agent.turn_timeout = turn_timeout;
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
    assert_consistent(&outcome);
    outcome
}

/// An agent that answers the opening line as the booking agent does, does
/// `then` in the next line's turn, and reads on until the caller is gone.
async fn answers_once_then(mut peer: Peer, then: impl AsyncFnOnce(&mut Peer)) {
    let mut answered = false;
    while let Some(received) = peer.recv().await {
        if received["type"] != "message" {
            continue;
        }
        if !answered {
            answered = true;
            reply_ws(&mut peer, received["content"].as_str()).await;
            continue;
        }
        then(&mut peer).await;
        peer.drain().await;
        return;
    }
}

/// A websocket agent that answers the opening properly and then sends
/// `frame` (raw text) in reply to the next line.
async fn then_sends(mut peer: Peer, frame: &'static str) {
    let mut lines = 0;
    while let Some(received) = peer.recv().await {
        if received["type"] == "message" {
            lines += 1;
            if lines == 1 {
                reply_ws(&mut peer, received["content"].as_str()).await;
            } else {
                peer.send_text(frame).await;
            }
        }
    }
}

#[tokio::test]
async fn websocket_refused_connection() {
    let (_held, port) = crate::engine::closed_port();
    let url = format!("ws://127.0.0.1:{port}/ws");
    let outcome = run(&plan(ChannelKind::Websocket, url.clone(), scripted(Some("Hi"), &[]))).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError);
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with(&format!("could not connect to the agent at {url} for turn 0: ")), "{error}");
    assert!(error.to_lowercase().contains("refused"), "{error}");
    assert!(outcome.transcript.is_empty());
    assert!(!outcome.reached_agent);
}

/// As over http: a connection the agent never takes reaches no one, and a
/// connection it takes but whose handshake it never answers reached it.
#[tokio::test]
async fn websocket_connection_never_made_is_unreached() {
    let (_held, port) = crate::engine::unanswered_port().await;
    let url = format!("ws://127.0.0.1:{port}/ws");
    let mut plan = plan(ChannelKind::Websocket, url.clone(), scripted(Some("Hi"), &[]));
    plan.agent.turn_timeout = Duration::from_millis(300);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::AgentError);
    assert_eq!(outcome.error, Some(format!("could not connect to the agent at {url} for turn 0 within 300 ms")));
    assert!(!outcome.reached_agent, "nothing reached the agent: {outcome:?}");

    plan.agent.turn_timeout = Duration::from_secs(60);
    plan.max_duration = Duration::from_millis(300);
    let outcome = run(&plan).await;
    assert_eq!((outcome.ended_reason, outcome.error.as_deref()), (EndedReason::MaxDuration, None));
    assert!(!outcome.reached_agent, "nothing reached the agent: {outcome:?}");

    // Taken, never answered.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut taken = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            taken.push(stream);
        }
    });
    let mut plan = self::plan(ChannelKind::Websocket, url.clone(), scripted(Some("Hi"), &[]));
    plan.agent.turn_timeout = Duration::from_millis(300);
    let outcome = run(&plan).await;
    silent.abort();
    assert_eq!(
        outcome.error,
        Some(format!("the agent at {url} did not accept the websocket connection for turn 0 within 300 ms"))
    );
    assert!(outcome.reached_agent, "it took the connection: the call costs");
}

/// TLS is part of the connection, for `wss://` as for `https://` (and the
/// protocol's "the connection cannot be made (refused, DNS, TLS)"): a TLS
/// setup that fails or is never answered reached no one, and the call costs
/// nothing. The websocket client did the TLS setup inside the handshake, so
/// either counted as reaching the agent.
#[tokio::test]
async fn a_tls_setup_that_fails_reaches_no_one_over_either_kind() {
    // Speaks plain HTTP (and websocket) where TLS is expected.
    let (base, _) = serve_http(booking_http).await;
    let (ws, _, upgrades) = serve_ws(booking_ws).await;
    // Takes connections and says nothing.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = listener.local_addr().unwrap();
    let taking = tokio::spawn(async move {
        let mut taken = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            taken.push(stream);
        }
    });
    let cases = [
        (ChannelKind::Http, format!("{}/http", base.replacen("http://", "https://", 1)), "could not reach the agent"),
        (ChannelKind::Websocket, ws.replacen("ws://", "wss://", 1), "could not connect to the agent"),
        (ChannelKind::Http, format!("https://{silent}/http"), "could not connect to the agent"),
        (ChannelKind::Websocket, format!("wss://{silent}/ws"), "could not connect to the agent"),
    ];
    for (kind, target, said) in cases {
        let mut plan = plan(kind, target.clone(), scripted(Some("Hi"), &[]));
        plan.agent.turn_timeout = Duration::from_millis(500);
        let outcome = run(&plan).await;
        assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{target}");
        let error = outcome.error.clone().unwrap();
        assert!(error.starts_with(&format!("{said} at {target} for turn 0")), "{target}: {error}");
        assert!(!outcome.reached_agent, "{target}: nothing reached the agent: {outcome:?}");
    }
    taking.abort();
    assert!(upgrades.lock().unwrap().is_empty(), "no upgrade request was read");
}

#[tokio::test]
async fn websocket_upgrade_refused() {
    let (base, _) = serve_http(|_| Act::Raw(404, "no such agent".into())).await;
    let url = format!("{}/ws", base.replace("http://", "ws://"));
    let outcome = run(&plan(ChannelKind::Websocket, url.clone(), scripted(Some("Hi"), &[]))).await;
    assert_eq!(
        outcome.error,
        Some(format!("the agent at {url} refused the websocket connection for turn 0 with HTTP 404: no such agent"))
    );
    assert!(outcome.reached_agent, "it answered, with a refusal");
}

/// A websocket upgrade answered with a redirect (an agent moved to `wss://`,
/// or behind a new path) is not followed, and the reason says where it
/// pointed: the target to give the channel instead.
#[tokio::test]
async fn websocket_upgrade_redirected_names_where() {
    let (base, _) = serve_http(|_| Act::Redirect(301, "wss://agent.example.com/v2/ws")).await;
    let url = format!("{}/ws", base.replace("http://", "ws://"));
    let outcome = run(&plan(ChannelKind::Websocket, url.clone(), scripted(Some("Hi"), &[]))).await;
    assert_eq!(
        outcome.error,
        Some(format!(
            "the agent at {url} refused the websocket connection for turn 0 with HTTP 301, a redirect to \
             wss://agent.example.com/v2/ws that is not followed (give the channel that target)"
        ))
    );
}

#[tokio::test]
async fn websocket_silent_agent_times_out() {
    let outcome = ws_failure(|mut peer| async move { peer.drain().await }, Duration::from_millis(300)).await;
    assert_eq!(outcome.error.as_deref(), Some("the agent sent nothing for turn 0 within 300 ms"));
    assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table"))]);
}

#[tokio::test]
async fn websocket_frame_that_is_not_json() {
    let outcome = ws_failure(|peer| then_sends(peer, "hello?"), Duration::from_secs(10)).await;
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent sent a frame that is not JSON during turn 1 ("), "{error}");
    assert!(error.ends_with("hello?"), "{error}");
    assert_eq!(outcome.transcript.len(), 3);
}

#[tokio::test]
async fn websocket_frame_of_the_wrong_shape() {
    let outcome = ws_failure(|peer| then_sends(peer, r#"{"type": "message"}"#), Duration::from_secs(10)).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            r#"the agent sent a `message` frame during turn 1: {"type": "message"} (a `message` frame needs a string `content`)"#
        )
    );
    let outcome = ws_failure(|peer| then_sends(peer, r#"["message"]"#), Duration::from_secs(10)).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some(r#"the agent sent a frame that is not a JSON object during turn 1: ["message"]"#)
    );
    let outcome = ws_failure(
        |peer| then_sends(peer, r#"{"type": "tool_call", "name": "x", "arguments": 1}"#),
        Duration::from_secs(10),
    )
    .await;
    assert!(outcome.error.unwrap().ends_with("(`arguments` must be an object)"));
}

#[tokio::test]
async fn websocket_unknown_frame_type() {
    let outcome = ws_failure(|peer| then_sends(peer, r#"{"type": "dance"}"#), Duration::from_secs(10)).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            "the agent sent a frame of unknown type `dance` during turn 1 \
             (expected message, tool_call, end_call or turn_end)"
        )
    );
}

#[tokio::test]
async fn websocket_bad_frame_after_turn_end() {
    let outcome = ws_failure(
        |mut peer| async move {
            peer.recv().await;
            peer.recv().await;
            let said = json!({"type": "message", "role": "assistant", "content": "Hello."});
            for text in [said.to_string(), json!({"type": "turn_end"}).to_string(), s("hello?")] {
                peer.ws.feed(Message::text(text)).await.unwrap();
            }
            peer.ws.flush().await.unwrap();
            peer.drain().await;
        },
        Duration::from_secs(10),
    )
    .await;
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the agent sent a frame that is not JSON after turn 0 ("), "{error}");
    // The line was not sent.
    assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table")), ("agent", s("Hello."))]);
}

/// Words the agent sent after its `turn_end` and before it failed (closed
/// the connection, here) are kept in the turn they belong to, as words
/// before a failure within a turn are.
#[tokio::test]
async fn websocket_late_words_before_a_failure_are_kept() {
    let outcome = ws_failure(
        |mut peer| async move {
            peer.recv().await;
            peer.recv().await;
            let said = |content: &str| {
                Message::text(json!({"type": "message", "role": "assistant", "content": content}).to_string())
            };
            for frame in
                [said("Hello."), Message::text(json!({"type": "turn_end"}).to_string()), said("One more thing.")]
            {
                peer.ws.feed(frame).await.unwrap();
            }
            peer.ws.feed(Message::Close(None)).await.unwrap();
            peer.ws.flush().await.unwrap();
            peer.drain().await;
        },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(outcome.error.as_deref(), Some("the agent closed the connection after turn 0"));
    assert_eq!(lines(&outcome), vec![("caller", s("Hi, a table")), ("agent", s("Hello. One more thing."))]);
}

#[tokio::test]
async fn websocket_close_mid_turn() {
    let outcome = ws_failure(
        |peer| {
            answers_once_then(peer, async |peer: &mut Peer| {
                peer.send(json!({"type": "message", "role": "assistant", "content": "Let me"})).await;
                let _ = peer.ws.close(None).await;
            })
        },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(outcome.error.as_deref(), Some("the agent closed the connection during turn 1"));

    // Dropping the connection without a close handshake is said the same way.
    let outcome = ws_failure(
        |mut peer| async move {
            peer.recv().await;
            peer.recv().await;
            drop(peer);
        },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(outcome.error.as_deref(), Some("the agent closed the connection during turn 0"));
}

/// An agent that closes the connection with a code and a reason has the
/// result say them (its secrets taken out): "closed the connection" alone
/// leaves its engineer guessing why.
#[tokio::test]
async fn websocket_close_code_and_reason_are_said() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    let outcome = ws_failure(
        |peer| {
            answers_once_then(peer, async |peer: &mut Peer| {
                let reason = "database unavailable (key secret-value)";
                let _ = peer.ws.close(Some(CloseFrame { code: CloseCode::Error, reason: reason.into() })).await;
            })
        },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        outcome.error.as_deref(),
        Some("the agent closed the connection during turn 1 (close code 1011: database unavailable (key [redacted]))")
    );
}

/// What the agent said of a turn before it failed in it (closed the
/// connection, sent a frame that is not the protocol's) is kept in the
/// transcript, with its latency, as the words of a turn the call's time
/// limit cut are: the last thing the agent said is what its engineer needs
/// to see. A turn larger than a reply may be is not kept.
#[tokio::test]
async fn websocket_words_said_before_a_failure_are_kept() {
    for last in [None, Some("{\"type\": \"thinking\"}")] {
        let outcome = ws_failure(
            move |peer| {
                answers_once_then(peer, async move |peer: &mut Peer| {
                    peer.send(json!({"type": "tool_call", "name": "lookup", "arguments": {"day": "tuesday"}})).await;
                    peer.send(json!({"type": "message", "role": "assistant", "content": "Let me check"})).await;
                    match last {
                        Some(frame) => peer.send_text(frame).await,
                        None => {
                            let _ = peer.ws.close(None).await;
                        }
                    }
                })
            },
            Duration::from_secs(10),
        )
        .await;
        let error = outcome.error.clone().unwrap();
        match last {
            None => assert_eq!(error, "the agent closed the connection during turn 1"),
            Some(_) => {
                assert!(error.starts_with("the agent sent a frame of unknown type `thinking` during turn 1"), "{error}")
            }
        }
        assert_eq!(
            lines(&outcome),
            vec![
                ("caller", s("Hi, a table")),
                ("agent", s("Sure. For which day?")),
                ("caller", s("Tuesday please")),
                ("agent", s("Let me check")),
            ]
        );
        assert!(outcome.transcript[3].latency_ms.is_some());
        assert_eq!(tool_calls(&outcome), vec![(s("lookup"), json!({"day": "tuesday"}), 3)]);
        assert_eq!(outcome.step_replies, vec![vec![3]]);
    }
}

#[tokio::test]
async fn websocket_binary_frame() {
    let outcome = ws_failure(
        |mut peer| async move {
            peer.recv().await;
            let _ = peer.ws.send(Message::binary(vec![1u8, 2, 3])).await;
            peer.drain().await;
        },
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        outcome.error.as_deref(),
        Some("the agent sent a binary frame during turn 0; the protocol's frames are JSON text")
    );
}

/// An agent that floods the connection with pings after its turn: what
/// arrived after a turn is read without a pause before the caller's next
/// line, and pings are answered by the websocket layer, not counted as the
/// turn's frames, so the reading never ended (nor let the thread it ran on
/// do anything else) for as long as the flood came. A turn's control frames
/// are bounded too: past the limit the agent has failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_a_flood_of_pings_is_an_agent_error_not_a_hang() {
    use tokio::io::AsyncWriteExt as _;
    let (url, _, _) = serve_ws(|mut peer| async move {
        while let Some(received) = peer.recv().await {
            if received["type"] == "message" {
                reply_ws(&mut peer, received["content"].as_str()).await;
                // Unmasked empty pings, as fast as the socket takes them.
                let pings = [0x89u8, 0x00].repeat(32 << 10);
                while peer.ws.get_mut().write_all(&pings).await.is_ok() {}
                return;
            }
        }
    })
    .await;
    let mut plan = plan(ChannelKind::Websocket, url, scripted(Some("Hi, a table"), &["Tuesday please"]));
    // Far below the wait below: a call ends by its own limit at the latest.
    plan.max_duration = Duration::from_secs(10);
    // On a thread of its own: a conversation that never yields would hold
    // up the runtime that should time it out.
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _ = done.send(runtime.block_on(async { run(&plan).await }));
    });
    let outcome = tokio::task::spawn_blocking(move || outcome.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("the conversation never ended");
    assert_eq!(outcome.ended_reason, EndedReason::AgentError, "{outcome:?}");
    let error = outcome.error.clone().unwrap();
    // After its turn, or, should the reading have caught up with the flood
    // for a moment, during the next.
    assert!(error.starts_with("the agent sent more than 10000 ping or pong frames "), "{error}");
    assert!(error.ends_with("after turn 0") || error.ends_with("during turn 1"), "{error}");
    assert_eq!(lines(&outcome)[..2], [("caller", s("Hi, a table")), ("agent", s("Sure. For which day?"))]);
}

// ---------------------------------------------------------------------------
// Simulated callers

fn simulated_plan(agent: String, llm: Option<&str>, first_message: Option<&str>) -> CallPlan {
    let mut plan =
        plan(ChannelKind::Http, agent, scenario("simulated", first_message, &[], Some("Book a table for Tuesday")));
    plan.persona = Some(persona());
    plan.caller_llm = llm.map(|base_url| LlmEndpoint {
        base_url: base_url.to_string(),
        model: "caller-model".into(),
        temperature: Some(0.7),
        api_key: Some("sk-test".into()),
    });
    plan
}

#[tokio::test]
async fn simulated_caller_plays_toward_its_goal() {
    let (agent, seen) = serve_http(booking_http).await;
    let (llm, asked) = serve_llm(vec![
        (200, "Here you go:\n```json\n{\"say\": \"Do you have a table on Tuesday?\", \"done\": false}\n```"),
        (200, "Great, thanks"),
        (200, "{\"done\": true, \"say\": \"That's all I needed.\"}"),
    ])
    .await;
    let plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    let outcome = run(&plan).await;

    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert!(!outcome.caller_error);
    assert_eq!(
        lines(&outcome),
        vec![
            ("caller", s("Hello")),
            ("agent", s("Hi! How can I help?")),
            ("caller", s("Do you have a table on Tuesday?")),
            ("agent", s("Tuesday works.")),
            ("caller", s("Great, thanks")),
            ("agent", s("Sorry?")),
            ("caller", s("That's all I needed.")),
            ("agent", s("Sorry?")),
        ]
    );
    assert!(outcome.step_replies.is_empty());
    assert_eq!(tool_calls(&outcome), vec![(s("check_availability"), json!({"day": "tuesday"}), 3)]);
    assert_consistent(&outcome);
    assert_eq!(events(&seen).last().unwrap().0, "end");

    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 3);
    assert_eq!(asked[0].headers["authorization"], "Bearer sk-test");
    assert_eq!(asked[0].body["model"], "caller-model");
    let roles = |i: usize| -> Vec<String> {
        asked[i].body["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(roles(0), ["system", "assistant", "user"]);
    assert_eq!(roles(2), ["system", "assistant", "user", "assistant", "user", "assistant", "user"]);
    let messages = asked[2].body["messages"].as_array().unwrap();
    let system = messages[0]["content"].as_str().unwrap();
    for expected in [
        "Morag",
        "A retired teacher.",
        "vegetarian menu",
        "en-GB",
        "Scottish",
        "Book a table for Tuesday",
        "regular guest",
        "\"done\": true",
    ] {
        assert!(system.contains(expected), "{expected} missing from {system}");
    }
    assert_eq!(messages[1]["content"], json!({"say": "Hello", "done": false}).to_string());
    assert_eq!(messages[2]["content"], "Hi! How can I help?");
    assert_eq!(messages[6]["content"], "Sorry?");
}

#[tokio::test]
async fn simulated_caller_hears_late_words_before_it_answers() {
    // The agent's words to the opening come after its `turn_end`: the
    // simulated caller's next line is written knowing them.
    let agent = serve_ws_by_line(|line| match line {
        1 => (vec![json!({"type": "turn_end"}), assistant("Late hello.")], None),
        _ => (vec![assistant("Reply."), json!({"type": "turn_end"})], None),
    })
    .await;
    let (llm, asked) = serve_llm(vec![(200, "{\"say\": \"Tuesday please\", \"done\": false}")]).await;
    let mut plan = simulated_plan(agent, Some(&llm), Some("Hello"));
    plan.agent.kind = ChannelKind::Websocket;
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert_eq!(
        lines(&outcome)[..3],
        [("caller", s("Hello")), ("agent", s("Late hello.")), ("caller", s("Tuesday please"))]
    );
    let asked = asked.lock().unwrap();
    let first = asked[0].body["messages"].as_array().unwrap();
    assert_eq!(first.last().unwrap()["content"], "Late hello.", "{first:#?}");
}

/// A frame the agent sends after its `turn_end`, while the simulated
/// caller's LLM makes the next line, ends that turn when it came: it was
/// read, and timed, only once the line was made, so the LLM's thinking
/// counted as the agent's speech.
#[tokio::test]
async fn late_words_while_the_simulated_caller_thinks_are_timed_when_they_came() {
    let agent = serve_ws_by_line(|line| {
        let later = (line == 1).then(|| (Duration::from_millis(200), vec![assistant("One more thing.")]));
        (vec![assistant("Reply."), json!({"type": "turn_end"})], later)
    })
    .await;
    let think = Duration::from_millis(1200);
    let line =
        json!({"choices": [{"message": {"role": "assistant", "content": "{\"say\": \"Tuesday\", \"done\": false}"}}]});
    let done = json!({"choices": [{"message": {"role": "assistant", "content": "{\"done\": true}"}}]});
    let count = AtomicUsize::new(0);
    let (llm, _) = serve_http(move |_| {
        let answer = if count.fetch_add(1, Ordering::SeqCst) == 0 { line.clone() } else { done.clone() };
        Act::Later(think, answer)
    })
    .await;
    let mut plan = simulated_plan(agent, Some(&llm), Some("Hello"));
    plan.agent.kind = ChannelKind::Websocket;
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    let t = &outcome.transcript;
    assert_eq!((t[1].text.as_str(), &t[2].text), ("Reply. One more thing.", &s("Tuesday")), "{t:?}");
    // The late words came ~200 ms after the reply; the next line ~1200 ms
    // after it (the LLM's thinking).
    assert!(t[1].end_ms + 500 < t[2].start_ms, "the turn ended when the line went out: {t:?}");
    assert_consistent(&outcome);
}

#[tokio::test]
async fn simulated_caller_done_without_last_words() {
    let (agent, seen) = serve_http(booking_http).await;
    let (llm, _) = serve_llm(vec![(200, "{\"done\": true}")]).await;
    let plan = simulated_plan(format!("{agent}/http"), Some(&llm), None);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert_eq!(lines(&outcome), vec![("agent", s("Welcome to Bella's! How can I help?"))]);
    assert_eq!(events(&seen).iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["start", "end"]);
}

#[tokio::test]
async fn simulated_caller_llm_failure_is_a_caller_error() {
    let (agent, seen) = serve_http(booking_http).await;
    let (llm, _) = serve_llm(vec![(500, "model overloaded")]).await;
    let plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert!(outcome.caller_error);
    assert_eq!(
        outcome.error.as_deref(),
        Some("the simulated caller's LLM failed: the LLM endpoint answered HTTP 500: model overloaded")
    );
    assert_eq!(outcome.transcript.len(), 2);
    // The caller hung up properly.
    assert_eq!(events(&seen).iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["start", "end"]);

    // A busy endpoint (429, 502, 503, 504: a rate limit, a gateway) is
    // asked again, a little later; the call goes on.
    let (llm, asked) = serve_llm(vec![
        (429, "rate limited"),
        (503, "overloaded"),
        (200, "{\"say\": \"Tuesday please\", \"done\": false}"),
    ])
    .await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    assert!(!outcome.caller_error, "{:?}", outcome.error);
    assert_eq!(lines(&outcome)[2], ("caller", s("Tuesday please")));
    assert_eq!(asked.lock().unwrap().len(), 4, "three attempts, then the answer after the agent's reply");

    // One that stays busy: given up after three attempts, and said so.
    let (llm, asked) = serve_llm(vec![(503, "overloaded"); 5]).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert!(outcome.caller_error);
    assert_eq!(
        outcome.error.as_deref(),
        Some("the simulated caller's LLM failed: the LLM endpoint answered HTTP 503: overloaded (3 attempts)")
    );
    assert_eq!(asked.lock().unwrap().len(), 3);

    // An error page too large to read still says the status.
    let page: &'static str = Box::leak("<p>upstream error</p>".repeat(60_000).into_boxed_str());
    let (llm, _) = serve_llm(vec![(500, page)]).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            "the simulated caller's LLM failed: the LLM endpoint answered HTTP 500 with a body larger than 1048576 \
             bytes"
        )
    );

    // A redirect is not followed out of the endpoint's origin: the reason
    // says where it pointed (an http base_url moved to https, say).
    let (llm, _) = serve_http(|_| Act::Redirect(301, "https://llm.example.com/v1/chat/completions?key=sk-test")).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert!(outcome.caller_error);
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            "the simulated caller's LLM failed: the LLM endpoint answered HTTP 301, a redirect to \
             https://llm.example.com/v1/chat/completions?key=[redacted] that is not followed (only a 307 or 308 \
             within the origin of config.base_url is: give config.base_url as it points)"
        )
    );

    // An answer with nothing to say is a failure too.
    let (llm, _) = serve_llm(vec![(200, "{\"say\": \"\", \"done\": false}")]).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert!(outcome.caller_error);
    assert!(outcome
        .error
        .unwrap()
        .starts_with("the simulated caller's LLM failed: its answer has neither a line to say nor \"done\": true: "));
}

/// A caller's LLM that does not answer (an outage that hangs) until the
/// call's limit is a caller error once it took longer than an agent's
/// reply may: it was a judged `max_duration` call, which its evaluators
/// could pass. Within that time the call just reached its limit.
#[tokio::test]
async fn a_caller_llm_that_hangs_until_the_calls_limit_is_a_caller_error() {
    let (agent, _) = serve_http(booking_http).await;
    let (llm, asked) = serve_http(|_| Act::Hang).await;
    let mut plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    plan.max_duration = Duration::from_millis(1500);
    plan.agent.turn_timeout = Duration::from_millis(300);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{outcome:?}");
    assert!(outcome.caller_error, "{outcome:?}");
    let error = outcome.error.clone().unwrap();
    assert!(error.starts_with("the simulated caller's LLM failed: it had not answered after 1"), "{error}");
    assert!(
        error.ends_with(
            "ms when the call reached its limit (an agent's reply may take 300 ms, the channel's turn_timeout_ms)"
        ),
        "{error}"
    );
    assert_eq!(lines(&outcome), vec![("caller", s("Hello")), ("agent", s("Hi! How can I help?"))]);
    assert_eq!(asked.lock().unwrap().len(), 1);

    // Cut by the limit sooner than an agent's reply may take: the call
    // reached its end.
    plan.agent.turn_timeout = Duration::from_secs(10);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::MaxDuration, "{outcome:?}");
    assert!(!outcome.caller_error && outcome.error.is_none(), "{outcome:?}");
}

/// A busy LLM endpoint's `Retry-After` is kept to: asked again no sooner
/// than it says (in seconds or as a date), and not at all when it asks for
/// longer than a conversation waits, rather than sooner than it said.
#[tokio::test]
async fn a_busy_llms_retry_after_is_kept_to() {
    let (agent, _) = serve_http(booking_http).await;
    let answers = |first: Act| {
        let count = AtomicUsize::new(0);
        let first = Mutex::new(Some(first));
        move |_: &Value| match count.fetch_add(1, Ordering::SeqCst) {
            0 => first.lock().unwrap().take().unwrap(),
            1 => Act::Json(json!({"choices": [{"message": {"role": "assistant",
                                                            "content": "{\"say\": \"Tuesday\", \"done\": true}"}}]})),
            _ => Act::Json(json!({"choices": [{"message": {"role": "assistant", "content": "{\"done\": true}"}}]})),
        }
    };

    // 60 s: not asked again, and the reason says why.
    let (llm, asked) = serve_http(answers(Act::Busy(429, "rate limited", "60".into()))).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
    assert!(outcome.caller_error);
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            "the simulated caller's LLM failed: the LLM endpoint answered HTTP 429: rate limited (it asked not to \
             be asked again for 60 s, longer than a conversation waits)"
        )
    );
    assert_eq!(asked.lock().unwrap().len(), 1, "asked once");

    // 2 s, in seconds or as a date: asked again, no sooner.
    for as_date in [false, true] {
        let after = match as_date {
            false => "2".to_string(),
            true => httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3)),
        };
        let (llm, asked) = serve_http(answers(Act::Busy(503, "overloaded", after.clone()))).await;
        let started = std::time::Instant::now();
        let outcome = run(&simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"))).await;
        assert!(!outcome.caller_error, "{after}: {:?}", outcome.error);
        assert_eq!(lines(&outcome)[2], ("caller", s("Tuesday")), "{after}");
        assert!(asked.lock().unwrap().len() >= 2, "{after}");
        // A date has whole seconds: 3 s ahead is at least 2 s ahead.
        assert!(started.elapsed() >= Duration::from_secs(2), "{after}: asked again after {:?}", started.elapsed());
    }
}

/// A resolver double: the first `first` lookups of any name give `before`,
/// every later one `after` (an endpoint whose address comes back to life).
struct Moving {
    before: SocketAddr,
    after: SocketAddr,
    first: usize,
    lookups: AtomicUsize,
}

impl reqwest::dns::Resolve for Moving {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        let address = if n < self.first { self.before } else { self.after };
        Box::pin(async move { Ok(Box::new(std::iter::once(address)) as reqwest::dns::Addrs) })
    }
}

/// An LLM endpoint that could not be reached is asked again, as a busy one
/// is, when nothing of the request reached it: its connection refused, or
/// closed while it was being made (here in the TLS handshake, before a
/// byte of the request). One whose connection was lost after the request
/// went is not: the endpoint may have made (and billed) the answer, which
/// a second request would make again, perhaps another (a judge's verdict).
#[tokio::test]
async fn an_llm_connection_lost_before_the_request_went_is_tried_again() {
    let ask = |http: Outbound, base_url: String| async move {
        let llm = LlmEndpoint { base_url, model: "m".into(), temperature: None, api_key: None };
        let messages = [crate::engine::llm::ChatMessage::user("Hello")];
        crate::engine::llm::complete(&http, &llm, &messages, Duration::from_secs(20)).await
    };

    // Refused once (the endpoint restarting, say), then answering.
    let (llm, asked) = serve_llm(vec![(200, "Tuesday please")]).await;
    let (_held, closed) = crate::engine::closed_port();
    let moving = Arc::new(Moving {
        before: SocketAddr::from(([127, 0, 0, 1], closed)),
        after: llm.trim_start_matches("http://").parse().unwrap(),
        first: 1,
        lookups: AtomicUsize::new(0),
    });
    let http = Outbound::of(reqwest::Client::builder().no_proxy().dns_resolver(moving.clone()));
    let answer = ask(http, "http://llm.test".into()).await;
    assert_eq!(answer.unwrap(), "Tuesday please");
    assert_eq!(moving.lookups.load(Ordering::SeqCst), 2, "refused, then asked again");
    assert_eq!(asked.lock().unwrap().len(), 1);

    // Refused every time: three attempts, and said so.
    let error = ask(Outbound::of(reqwest::Client::builder().no_proxy()), format!("http://127.0.0.1:{closed}"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("refused") && error.ends_with("(3 attempts)"), "{error}");

    // Closed during the TLS handshake every time: three connections.
    let (url, connections) = serve_raw(|mut stream| async move {
        let _ = stream.read(&mut [0; 512]).await;
    })
    .await;
    let error = ask(Outbound::of(reqwest::Client::builder().no_proxy()), url.replace("http://", "https://"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.ends_with("(3 attempts)"), "{error}");
    assert_eq!(connections.load(Ordering::SeqCst), 3);

    // Closed once the request was read, before any answer: asked once.
    let (url, connections) = serve_raw(|mut stream| async move {
        let mut request = Vec::new();
        let mut buffer = [0; 4096];
        while !String::from_utf8_lossy(&request).contains("\"messages\"") {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    let error = ask(Outbound::of(reqwest::Client::builder().no_proxy()), url).await.unwrap_err().to_string();
    assert!(error.starts_with("the LLM endpoint") && !error.contains("attempts"), "{error}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

/// A TCP server on a free loopback port running `handler` on each
/// connection (closed when it returns); its `http://` URL and how many
/// connections it accepted.
async fn serve_raw<F, Fut>(handler: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(handler(stream));
        }
    });
    (url, accepted)
}

/// An endpoint that answers 200 with its error as the completion (some
/// gateways do), echoing the caller's key: the answer, taken as the caller's
/// line, would send the key to the agent and keep it in the transcript, and
/// a clipped quote of it in a failure reason would keep part of it. The key
/// is taken out of the answer before either.
#[tokio::test]
async fn a_key_echoed_in_the_caller_llms_answer_goes_nowhere() {
    const KEY: &str = "sk-caller-key-0815-4711";
    const ECHO: &str = "upstream refused Bearer sk-caller-key-0815-4711";
    const CLIPPED: &str = concat!(
        "{\"say\": \"\", \"note\": \"",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx sk-caller-key-0815-4711\"}"
    );
    let hidden = |text: &str| {
        let chars: Vec<char> = KEY.chars().collect();
        chars.windows(8).map(String::from_iter).all(|run| !text.contains(&run))
    };
    let (agent, seen) = serve_http(booking_http).await;
    let (llm, _) = serve_llm(vec![(200, ECHO), (200, CLIPPED)]).await;
    let mut plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    plan.caller_llm.as_mut().unwrap().api_key = Some(KEY.into());
    let outcome = run(&plan).await;
    assert!(outcome.caller_error, "{outcome:?}");
    let error = outcome.error.clone().unwrap();
    assert!(error.contains("neither a line to say"), "{error}");
    assert!(hidden(&error), "{error}");
    for turn in &outcome.transcript {
        assert!(hidden(&turn.text), "{:?}", outcome.transcript);
    }
    for (_, _, line) in events(&seen) {
        assert!(hidden(line.as_deref().unwrap_or("")), "the agent was told {line:?}");
    }
}

/// A channel's header values go only to the agent they were set for: an
/// agent that echoes one (in a greeting, a debug line) does not have it
/// passed on to the simulated caller's LLM, another service.
#[tokio::test]
async fn a_header_value_echoed_by_the_agent_is_not_told_to_the_callers_llm() {
    let (agent, _) = serve_http(|body| {
        if body["event"] == "end" {
            return Act::Json(json!({"messages": []}));
        }
        Act::Json(json!({"messages": [{"role": "assistant", "content": "Your key is secret-value, right?"}]}))
    })
    .await;
    let (llm, asked) = serve_llm(vec![(200, "{\"say\": \"Tuesday please\", \"done\": false}")]).await;
    let plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    assert_eq!(plan.agent.headers, [(s("x-api-key"), s("secret-value"))]);
    let outcome = run(&plan).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone, "{:?}", outcome.error);
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 2);
    for request in asked.iter() {
        let messages = request.body["messages"].as_array().unwrap();
        let heard: Vec<&str> =
            messages.iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect();
        assert!(heard.contains(&"Your key is [redacted], right?"), "{heard:?}");
        assert!(!request.body.to_string().contains("secret-value"), "{}", request.body);
    }
}

/// A cancel that comes while the simulated caller's LLM is writing its next
/// line stops the call there: the line is not said, and the agent is sent
/// no other turn.
#[tokio::test]
async fn cancel_while_the_simulated_caller_thinks_says_no_more_lines() {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let (agent, seen) = serve_http(booking_http).await;
    let (llm, _) = serve_http(move |_| {
        token.cancel();
        Act::Json(json!({"choices": [{"message": {"role": "assistant", "content": "{\"say\": \"Tuesday please\"}"}}]}))
    })
    .await;
    let plan = simulated_plan(format!("{agent}/http"), Some(&llm), Some("Hello"));
    let outcome = run_with(&plan, &cancel).await;
    assert_eq!(outcome.ended_reason, EndedReason::Cancelled, "{outcome:?}");
    assert_eq!(lines(&outcome), vec![("caller", s("Hello")), ("agent", s("Hi! How can I help?"))]);
    assert_eq!(events(&seen).iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(), vec![("start", 0), ("end", 1)]);
}

#[tokio::test]
async fn simulated_scenario_without_a_caller_llm() {
    let (agent, seen) = serve_http(booking_http).await;
    let outcome = run(&simulated_plan(format!("{agent}/http"), None, Some("Hello"))).await;
    assert_eq!(outcome.ended_reason, EndedReason::CallerDone);
    assert!(outcome.caller_error);
    assert!(outcome.error.unwrap().starts_with("the simulated caller's LLM failed: no LLM is configured"));
    assert!(outcome.transcript.is_empty());
    assert!(seen.lock().unwrap().is_empty(), "the agent is not called");
}

// ---------------------------------------------------------------------------
// Pieces

#[test]
fn parse_caller_answers() {
    let say = |text: &str| match simulated::parse(text) {
        Next::Say { line, step: None } => Some(line),
        _ => None,
    };
    assert_eq!(say("{\"say\": \" Hi \", \"done\": false}").as_deref(), Some("Hi"));
    assert_eq!(say("{\"say\": \"Hi\"}").as_deref(), Some("Hi"));
    assert_eq!(say("  Just words.\n").as_deref(), Some("Just words."));
    assert!(
        matches!(simulated::parse("{\"done\": true, \"say\": \"Bye\"}"), Next::Done { last_words: Some(w) } if w == "Bye")
    );
    assert!(matches!(simulated::parse("{\"done\": true, \"say\": \" \"}"), Next::Done { last_words: None }));
    assert!(matches!(simulated::parse("   "), Next::Failed(_)));
    assert!(matches!(simulated::parse("{\"done\": false}"), Next::Failed(_)));
}

#[test]
fn chat_always_ends_with_the_agent() {
    let turn =
        |role, text: &str| types::TranscriptTurn { role, text: text.into(), start_ms: 0, end_ms: 0, latency_ms: None };
    let roles_and_text = |messages: Vec<crate::engine::llm::ChatMessage>| -> Vec<(String, String)> {
        messages.into_iter().skip(1).map(|m| (m.role, m.content)).collect()
    };
    assert_eq!(roles_and_text(simulated::chat("sys", &[])), vec![(s("user"), s("(the agent says nothing)"))]);
    assert_eq!(
        roles_and_text(simulated::chat("sys", &[turn(TurnRole::Caller, "Hi"), turn(TurnRole::Agent, "")])),
        vec![
            (s("assistant"), json!({"say": "Hi", "done": false}).to_string()),
            (s("user"), s("(the agent says nothing)"))
        ]
    );
    assert_eq!(
        roles_and_text(simulated::chat("sys", &[turn(TurnRole::Agent, "Hello"), turn(TurnRole::Caller, "Hi")])),
        vec![
            (s("user"), s("Hello")),
            (s("assistant"), json!({"say": "Hi", "done": false}).to_string()),
            (s("user"), s("(the agent says nothing)"))
        ]
    );
}

#[test]
fn system_prompt_without_persona_or_goal() {
    let prompt = simulated::system_prompt(&scenario("simulated", None, &[], None), None);
    assert!(prompt.contains("ordinary caller"));
    assert!(prompt.contains("Book a table. A guest books a table."));
    assert!(prompt.contains("no goal beyond the situation"));
}

#[test]
fn nearest_rank_percentiles() {
    let tens: Vec<i64> = (1..=10).map(|i| i * 10).collect();
    assert_eq!(nearest_rank(&tens, 50), Some(50));
    assert_eq!(nearest_rank(&tens, 90), Some(90));
    assert_eq!(nearest_rank(&tens, 95), Some(100));
    let twenty: Vec<i64> = (1..=20).collect();
    assert_eq!(nearest_rank(&twenty, 95), Some(19));
    assert_eq!(nearest_rank(&twenty, 50), Some(10));
    assert_eq!(nearest_rank(&[7], 50), Some(7));
    assert_eq!(nearest_rank(&[7], 95), Some(7));
    assert_eq!(nearest_rank(&[], 50), None);
}

#[test]
fn metrics_of_a_transcript() {
    let turn = |role, text: &str, start_ms, latency_ms| types::TranscriptTurn {
        role,
        text: text.into(),
        start_ms,
        end_ms: start_ms,
        latency_ms,
    };
    let transcript = vec![
        turn(TurnRole::Caller, "Hi", 0, None),
        turn(TurnRole::Agent, "", 40, Some(40)),
        turn(TurnRole::Caller, "Hello?", 50, None),
        turn(TurnRole::Agent, "Yes", 350, Some(300)),
        turn(TurnRole::Caller, "OK", 400, None),
        turn(TurnRole::Agent, "Good", 500, Some(100)),
    ];
    let m = metrics(&transcript);
    assert_eq!(m.turns, 6);
    assert_eq!(m.time_to_first_word_ms, Some(350));
    assert_eq!(
        (m.latency_ms.p50, m.latency_ms.p90, m.latency_ms.p95, m.latency_ms.max),
        (Some(100), Some(300), Some(300), Some(300))
    );
    let none = metrics(&transcript[..1]);
    assert_eq!((none.time_to_first_word_ms, none.latency_ms.p50, none.latency_ms.max), (None, None, None));
}
