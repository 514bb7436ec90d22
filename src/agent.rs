//! `sparring agent`: the reference agent under test. A deterministic,
//! text-only appointment-booking voice agent ("Ava" at Bright Smile Dental)
//! that speaks both channel protocols of `spec/channels.md`:
//!
//! - `POST /http`: one request per caller event (`start`, `message`, `end`);
//! - `GET /ws`: one WebSocket per call;
//! - `GET /stats`: `{active_calls, peak_active_calls, calls_started, turns}`,
//!   so a test can see how many conversations really overlapped.
//!
//! What it understands (case-insensitive):
//! - no caller line at the start of a call: it greets, "Thanks for calling
//!   Bright Smile Dental, this is Ava. How can I help you today?";
//! - "hours" or "open": "We're open Monday to Friday, 8 am to 6 pm.";
//! - booking ("book", "appointment", "schedule", or a weekday or a time): it
//!   collects a weekday (monday … friday; Saturday and Sunday get "We're
//!   closed on weekends.") and a time ("3 pm", "10am", "14:00"), asking for
//!   what is missing ("Which day works for you?", "What time on Tuesday?");
//!   with both it reports the tool call `book_appointment {"day": "Tuesday",
//!   "time": "3 pm"}` and says "Your appointment is confirmed for Tuesday at
//!   3 pm. Is there anything else I can help you with?";
//! - "cancel": tool call `cancel_appointment {}`, "Your appointment has been
//!   cancelled.";
//! - "bye", "goodbye", "that's all": "Thank you for calling Bright Smile
//!   Dental. Goodbye!" and it ends the call;
//! - anything else: "Sorry, I didn't catch that. Could you say it another
//!   way?".
//!
//! Misbehaviour on purpose, for tests that must fail for a real reason or
//! exercise Sparring's failure handling:
//! - `--bug no-confirmation`: books (the tool call happens) but only says
//!   "Alright. Is there anything else I can help you with?";
//! - `--bug wrong-day`: books and confirms the next weekday instead of the
//!   one asked for;
//! - `--fault bad-json | hang | disconnect`: the first reply of a call is
//!   normal, every later one is invalid JSON / never comes / drops the
//!   connection (WebSocket; over http a 502 with no body);
//! - `--error-rate F`: that share of replies are HTTP 500 (a WebSocket is
//!   closed with code 1011), chosen deterministically from `--seed`, the
//!   call id and the turn;
//! - `--latency-ms N --jitter-ms J`: each reply waits N plus 0..J ms.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dropshot::{
    channel, endpoint, ApiDescription, ConfigDropshot, HandlerTaskMode, HttpError, HttpResponseOk, RequestContext,
    ServerBuilder, TypedBody, WebsocketConnection,
};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;

#[derive(Args, Clone, Debug)]
pub struct AgentConfig {
    /// Address to listen on (port 0: any free port, printed on start).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub bind: SocketAddr,
    /// Delay before each reply, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Extra delay of 0 to this many milliseconds on each reply.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Seed for jitter and errors.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Share of replies that fail (HTTP 500, or a WebSocket closed with
    /// 1011), from 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    pub error_rate: f64,
    /// Misbehave in one realistic way.
    #[arg(long, value_enum, default_value = "none")]
    pub bug: Bug,
    /// Break the protocol after the first reply of each call.
    #[arg(long, value_enum, default_value = "none")]
    pub fault: Fault,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Bug {
    None,
    NoConfirmation,
    WrongDay,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    None,
    BadJson,
    Hang,
    Disconnect,
}

/// A call over HTTP counts as ended (the caller went away without `end`)
/// after this long without a request since the agent's last reply. Longer
/// than any pause Sparring leaves within a call: the agent's own turn is
/// timed from its reply, and a simulated caller's LLM has 60 s to answer.
const IDLE: Duration = Duration::from_secs(300);
const DAYS: [&str; 5] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"];

#[derive(Default)]
pub struct Call {
    day: Option<usize>,
    time: Option<String>,
    replies: u32,
    last_seen: Option<Instant>,
}

#[derive(Default)]
struct Counters {
    active: i64,
    peak: i64,
    started: u64,
    turns: u64,
}

pub struct Agent {
    config: AgentConfig,
    calls: Mutex<HashMap<String, Call>>,
    counters: Mutex<Counters>,
    /// [`IDLE`], shorter in tests.
    idle: Duration,
}

/// What the agent says in one turn.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub messages: Vec<String>,
    pub end_call: bool,
    pub tool_calls: Vec<(String, Value)>,
}

/// A share, from 0 to 1 (`--error-rate`).
fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(_) => Err("must be from 0 to 1 (0.1: one reply in ten fails)".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn say(text: impl Into<String>) -> Reply {
    Reply { messages: vec![text.into()], ..Reply::default() }
}

fn weekday(text: &str) -> Option<Result<usize, ()>> {
    if text.contains("saturday") || text.contains("sunday") || text.contains("weekend") {
        return Some(Err(()));
    }
    DAYS.iter().position(|d| text.contains(&d.to_lowercase())).map(Ok)
}

fn time_of(text: &str) -> Option<String> {
    let re = regex::Regex::new(r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)\b|\b(\d{1,2}):(\d{2})\b").ok()?;
    let c = re.captures(text)?;
    if let Some(hour) = c.get(1) {
        let minutes = c.get(2).map(|m| format!(":{}", m.as_str())).unwrap_or_default();
        return Some(format!("{}{minutes} {}", hour.as_str(), &c[3]));
    }
    let hour: u32 = c[4].parse().ok()?;
    let minutes = &c[5];
    let (h, half) = match hour {
        0 => (12, "am"),
        1..=11 => (hour, "am"),
        12 => (12, "pm"),
        13..=23 => (hour - 12, "pm"),
        _ => return None,
    };
    Some(if minutes == "00" { format!("{h} {half}") } else { format!("{h}:{minutes} {half}") })
}

impl Agent {
    pub fn new(config: AgentConfig) -> Agent {
        Agent { config, calls: Mutex::new(HashMap::new()), counters: Mutex::new(Counters::default()), idle: IDLE }
    }

    /// The agent's turn: what it says to `line` (`None`: the call just
    /// started and the caller said nothing).
    pub fn respond(&self, call: &mut Call, line: Option<&str>) -> Reply {
        let Some(line) = line else {
            return say("Thanks for calling Bright Smile Dental, this is Ava. How can I help you today?");
        };
        let text = line.to_lowercase();
        if text.contains("bye") || text.contains("that's all") || text.contains("that is all") {
            return Reply {
                messages: vec!["Thank you for calling Bright Smile Dental. Goodbye!".into()],
                end_call: true,
                ..Reply::default()
            };
        }
        if text.contains("cancel") {
            return Reply {
                messages: vec!["Your appointment has been cancelled.".into()],
                tool_calls: vec![("cancel_appointment".into(), json!({}))],
                ..Reply::default()
            };
        }
        let mut reply = Reply::default();
        if text.contains("hours") || text.contains("open") {
            reply.messages.push("We're open Monday to Friday, 8 am to 6 pm.".into());
        }
        let day = weekday(&text);
        let time = time_of(&text);
        let booking = text.contains("book")
            || text.contains("appointment")
            || text.contains("schedule")
            || day.is_some()
            || time.is_some();
        if !booking {
            if reply.messages.is_empty() {
                reply.messages.push("Sorry, I didn't catch that. Could you say it another way?".into());
            }
            return reply;
        }
        match day {
            Some(Err(())) => {
                reply.messages.push("We're closed on weekends. Which weekday works for you?".into());
                return reply;
            }
            Some(Ok(d)) => call.day = Some(d),
            None => {}
        }
        if let Some(t) = time {
            call.time = Some(t);
        }
        match (call.day, call.time.clone()) {
            (None, _) => {
                reply.messages.push("Sure, I can help you book an appointment. Which day works for you?".into())
            }
            (Some(d), None) => {
                reply.messages.push(format!("What time on {}? We have openings at 10 am and 3 pm.", DAYS[d]))
            }
            (Some(d), Some(time)) => {
                let booked = if self.config.bug == Bug::WrongDay { (d + 1) % DAYS.len() } else { d };
                reply.tool_calls.push(("book_appointment".into(), json!({"day": DAYS[booked], "time": time})));
                reply.messages.push(if self.config.bug == Bug::NoConfirmation {
                    "Alright. Is there anything else I can help you with?".into()
                } else {
                    format!(
                        "Your appointment is confirmed for {} at {time}. Is there anything else I can help you with?",
                        DAYS[booked]
                    )
                });
                call.day = None;
                call.time = None;
            }
        }
        reply
    }

    /// A number in [0, 1) decided by the seed, the call and the turn.
    fn chance(&self, call_id: &str, turn: u64, salt: u8) -> f64 {
        let mut h = std::hash::DefaultHasher::new();
        (self.config.seed, call_id, turn, salt).hash(&mut h);
        (h.finish() >> 11) as f64 / (1u64 << 53) as f64
    }

    async fn delay(&self, call_id: &str, turn: u64) {
        let jitter = (self.chance(call_id, turn, 1) * self.config.jitter_ms as f64) as u64;
        let wait = self.config.latency_ms + jitter;
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }

    fn fails(&self, call_id: &str, turn: u64) -> bool {
        self.config.error_rate > 0.0 && self.chance(call_id, turn, 2) < self.config.error_rate
    }

    fn call_started(&self) {
        let mut c = self.counters.lock().expect("not poisoned");
        c.active += 1;
        c.started += 1;
        c.peak = c.peak.max(c.active);
    }

    fn call_ended(&self) {
        let mut c = self.counters.lock().expect("not poisoned");
        c.active = (c.active - 1).max(0);
    }

    fn turn(&self) {
        self.counters.lock().expect("not poisoned").turns += 1;
    }

    /// HTTP calls whose caller went quiet for [`IDLE`] count as ended.
    fn sweep(&self) {
        let now = Instant::now();
        let mut calls = self.calls.lock().expect("not poisoned");
        let before = calls.len();
        calls.retain(|_, c| c.last_seen.is_none_or(|t| now.duration_since(t) < self.idle));
        for _ in calls.len()..before {
            self.call_ended();
        }
    }
}

fn reply_json(reply: &Reply) -> Value {
    json!({
        "messages": reply.messages.iter().map(|m| json!({"role": "assistant", "content": m})).collect::<Vec<_>>(),
        "end_call": reply.end_call,
        "tool_calls": reply.tool_calls.iter().map(|(n, a)| json!({"name": n, "arguments": a})).collect::<Vec<_>>(),
    })
}

type Ctx = Arc<Agent>;

fn bad_request(message: impl Into<String>) -> HttpError {
    HttpError::for_bad_request(None, message.into())
}

/// The http channel: one request per caller event.
#[endpoint { method = POST, path = "/http" }]
async fn http_turn(
    rqctx: RequestContext<Ctx>,
    body: TypedBody<Value>,
) -> Result<http::Response<dropshot::Body>, HttpError> {
    let agent = rqctx.context().clone();
    let body = body.into_inner();
    let call_id = body["call_id"].as_str().ok_or_else(|| bad_request("call_id is required"))?.to_string();
    let event = body["event"].as_str().ok_or_else(|| bad_request("event is required"))?.to_string();
    let turn = body["turn"].as_u64().unwrap_or(0);
    let line = body["message"]["content"].as_str().map(str::to_string);
    agent.sweep();
    let (reply, replies) = {
        let mut calls = agent.calls.lock().expect("not poisoned");
        if event == "start" && !calls.contains_key(&call_id) {
            calls.insert(call_id.clone(), Call::default());
            agent.call_started();
        }
        let Some(call) = calls.get_mut(&call_id) else {
            return Err(bad_request(format!("no call {call_id}: a call begins with a `start` event")));
        };
        call.last_seen = Some(Instant::now());
        if event == "end" {
            calls.remove(&call_id);
            agent.call_ended();
            return json_response(200, &json!({"messages": [], "end_call": true, "tool_calls": []}).to_string());
        }
        let reply = agent.respond(call, line.as_deref());
        call.replies += 1;
        let replies = call.replies;
        if reply.end_call {
            calls.remove(&call_id);
            agent.call_ended();
        }
        (reply, replies)
    };
    agent.turn();
    agent.delay(&call_id, turn).await;
    // The caller's next request comes after this reply: its pause is timed
    // from here, not from when this request came in.
    if let Some(call) = agent.calls.lock().expect("not poisoned").get_mut(&call_id) {
        call.last_seen = Some(Instant::now());
    }
    if agent.fails(&call_id, turn) {
        return json_response(500, r#"{"error": "internal error (simulated by --error-rate)"}"#);
    }
    if replies > 1 {
        match agent.config.fault {
            Fault::None => {}
            Fault::BadJson => return json_response(200, "{\"messages\": [{\"role\": \"assistant\", \"content\": "),
            Fault::Hang => std::future::pending::<()>().await,
            Fault::Disconnect => return json_response(502, ""),
        }
    }
    json_response(200, &reply_json(&reply).to_string())
}

fn json_response(status: u16, body: &str) -> Result<http::Response<dropshot::Body>, HttpError> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(dropshot::Body::from(body.to_string()))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

#[derive(serde::Serialize, schemars::JsonSchema)]
struct Stats {
    active_calls: i64,
    peak_active_calls: i64,
    calls_started: u64,
    turns: u64,
}

#[endpoint { method = GET, path = "/stats" }]
async fn stats(rqctx: RequestContext<Ctx>) -> Result<HttpResponseOk<Stats>, HttpError> {
    let agent = rqctx.context();
    agent.sweep();
    let c = agent.counters.lock().expect("not poisoned");
    Ok(HttpResponseOk(Stats {
        active_calls: c.active,
        peak_active_calls: c.peak,
        calls_started: c.started,
        turns: c.turns,
    }))
}

/// The websocket channel: one connection per call.
#[channel { protocol = WEBSOCKETS, path = "/ws" }]
async fn ws_call(rqctx: RequestContext<Ctx>, upgraded: WebsocketConnection) -> dropshot::WebsocketChannelResult {
    let agent = rqctx.context().clone();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(upgraded.into_inner(), Role::Server, None).await;
    agent.call_started();
    let result = ws_conversation(&agent, &mut ws).await;
    agent.call_ended();
    result
}

type Ws = tokio_tungstenite::WebSocketStream<dropshot::WebsocketConnectionRaw>;

async fn next_frame(
    ws: &mut Ws,
    wait: Option<Duration>,
) -> Result<Option<Value>, Box<dyn std::error::Error + Send + Sync>> {
    loop {
        let next = match wait {
            Some(w) => match tokio::time::timeout(w, ws.next()).await {
                Ok(n) => n,
                Err(_) => return Ok(Some(Value::Null)),
            },
            None => ws.next().await,
        };
        match next {
            None | Some(Ok(Message::Close(_))) => return Ok(None),
            Some(Ok(Message::Text(t))) => return Ok(Some(serde_json::from_str(&t)?)),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

async fn ws_conversation(agent: &Agent, ws: &mut Ws) -> dropshot::WebsocketChannelResult {
    let Some(start) = next_frame(ws, None).await? else { return Ok(()) };
    if start["type"] != "start" {
        ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Protocol, reason: "expected start".into() })))
            .await?;
        return Ok(());
    }
    let call_id = start["call_id"].as_str().unwrap_or_default().to_string();
    let mut call = Call::default();
    let mut turn = 0u64;
    // `start` says whether the agent is to greet. Without it (a caller
    // older than the flag), one who speaks first sends its line right after
    // `start`, so the agent greets if none comes at once.
    let mut pending = None;
    let mut greet = match start["agent_greets"].as_bool() {
        Some(greets) => greets,
        None => {
            pending = match next_frame(ws, Some(Duration::from_millis(100))).await? {
                None => return Ok(()),
                Some(Value::Null) => None,
                Some(frame) => Some(frame),
            };
            pending.is_none()
        }
    };
    loop {
        let line = if greet {
            greet = false;
            None
        } else {
            let frame = match pending.take() {
                Some(f) => f,
                None => match next_frame(ws, None).await? {
                    Some(f) => f,
                    None => return Ok(()),
                },
            };
            match frame["type"].as_str() {
                Some("message") => Some(frame["content"].as_str().unwrap_or_default().to_string()),
                Some("end_call") => {
                    let _ = ws.close(None).await;
                    return Ok(());
                }
                _ => continue,
            }
        };
        let reply = agent.respond(&mut call, line.as_deref());
        call.replies += 1;
        agent.turn();
        agent.delay(&call_id, turn).await;
        if agent.fails(&call_id, turn) {
            ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Error, reason: "simulated failure".into() })))
                .await?;
            return Ok(());
        }
        if call.replies > 1 {
            match agent.config.fault {
                Fault::None => {}
                Fault::BadJson => {
                    ws.send(Message::Text("{\"type\": \"message\", \"content\": ".into())).await?;
                    continue;
                }
                Fault::Hang => {
                    // Never answers, but lets the caller hang up: the call
                    // (and its socket) ends when the caller closes.
                    while next_frame(ws, None).await?.is_some() {}
                    return Ok(());
                }
                Fault::Disconnect => return Ok(()),
            }
        }
        turn += 1;
        for (name, arguments) in &reply.tool_calls {
            ws.send(Message::Text(
                json!({"type": "tool_call", "name": name, "arguments": arguments}).to_string().into(),
            ))
            .await?;
        }
        for m in &reply.messages {
            ws.send(Message::Text(json!({"type": "message", "role": "assistant", "content": m}).to_string().into()))
                .await?;
        }
        if reply.end_call {
            ws.send(Message::Text(json!({"type": "end_call"}).to_string().into())).await?;
            let _ = ws.close(None).await;
            return Ok(());
        }
        ws.send(Message::Text(json!({"type": "turn_end"}).to_string().into())).await?;
    }
}

/// Serves the agent until `shutdown` resolves.
pub async fn serve(config: AgentConfig, log: slog::Logger) -> anyhow::Result<dropshot::HttpServer<Ctx>> {
    serve_agent(Agent::new(config), log)
}

/// Serves `agent` at its configured address.
fn serve_agent(agent: Agent, log: slog::Logger) -> anyhow::Result<dropshot::HttpServer<Ctx>> {
    let mut api = ApiDescription::new();
    api.register(http_turn).map_err(|e| anyhow::anyhow!("{e}"))?;
    api.register(stats).map_err(|e| anyhow::anyhow!("{e}"))?;
    api.register(ws_call).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bind = agent.config.bind;
    let agent = Arc::new(agent);
    ServerBuilder::new(api, agent, log)
        .config(ConfigDropshot {
            bind_address: bind,
            default_request_body_max_bytes: 256 * 1024,
            // A turn whose caller went away (it timed out, the call ended)
            // is dropped, not awaited: under `--fault hang` it never ends.
            // Cancel-safe: each change a turn makes to its call is whole,
            // under one lock, and a websocket call runs after its upgrade.
            default_handler_task_mode: HandlerTaskMode::CancelOnDisconnect,
            ..Default::default()
        })
        .start()
        .map_err(|e| {
            // As `serve` does: dropshot's message ("failed to bind to ADDR")
            // leaves out why, which is its source ("Address already in use").
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
            anyhow::anyhow!("starting the agent on {bind}: {e}{cause}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(bug: Bug) -> Agent {
        Agent::new(AgentConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            latency_ms: 0,
            jitter_ms: 0,
            seed: 0,
            error_rate: 0.0,
            bug,
            fault: Fault::None,
        })
    }

    #[test]
    fn a_booking_dialog() {
        let a = agent(Bug::None);
        let mut call = Call::default();
        assert!(a.respond(&mut call, None).messages[0].contains("How can I help"));
        assert!(a.respond(&mut call, Some("Hi, I'd like to book an appointment.")).messages[0].contains("Which day"));
        let booked = a.respond(&mut call, Some("Tuesday at 3 pm, please."));
        assert_eq!(booked.tool_calls, [("book_appointment".to_string(), json!({"day": "Tuesday", "time": "3 pm"}))]);
        assert!(booked.messages[0].contains("confirmed for Tuesday at 3 pm"), "{booked:?}");
        let bye = a.respond(&mut call, Some("That's all, goodbye."));
        assert!(bye.end_call);
        assert!(a.respond(&mut call, Some("Saturday?")).messages[0].contains("closed on weekends"));
        let on_time = a.respond(&mut call, Some("Can I come Friday at 14:00?"));
        assert!(on_time.messages[0].contains("Friday at 2 pm"), "{on_time:?}");
        assert!(a.respond(&mut call, Some("What are your opening hours?")).messages[0].contains("Monday to Friday"));
        assert!(a.respond(&mut call, Some("banana")).messages[0].contains("didn't catch"));
    }

    #[test]
    fn the_bugs_misbehave_as_documented() {
        let mut call = Call::default();
        let wrong = agent(Bug::WrongDay).respond(&mut call, Some("Book me Tuesday at 3 pm"));
        assert!(wrong.messages[0].contains("confirmed for Wednesday"), "{wrong:?}");
        assert_eq!(wrong.tool_calls[0].1["day"], "Wednesday");
        let mut call = Call::default();
        let silent = agent(Bug::NoConfirmation).respond(&mut call, Some("Book me Tuesday at 3 pm"));
        assert!(!silent.messages[0].contains("confirmed") && !silent.messages[0].contains("Tuesday"));
        assert_eq!(silent.tool_calls[0].0, "book_appointment");
    }

    /// An http call is forgotten only after its caller has been quiet for
    /// the idle time since the agent's last reply: a reply that took longer
    /// than that (`--latency-ms`) did not make the next request find no
    /// call ("a call begins with a `start` event", a 400 the caller's
    /// result blamed on the agent).
    #[tokio::test]
    async fn a_call_is_idle_from_the_agents_reply_not_from_the_request() {
        let mut config = agent(Bug::None).config;
        config.latency_ms = 400;
        let mut slow = Agent::new(config);
        slow.idle = Duration::from_millis(300);
        let server = serve_agent(slow, slog::Logger::root(slog::Discard, slog::o!())).unwrap();
        let url = format!("http://{}/http", server.local_addr());
        let http = reqwest::Client::new();
        let post = |body: Value| http.post(&url).json(&body).send();
        let start = post(json!({"call_id": "call_1", "turn": 0, "event": "start", "message": null})).await.unwrap();
        assert_eq!(start.status(), 200);
        let line = json!({"role": "user", "content": "I'd like to book an appointment."});
        let next = post(json!({"call_id": "call_1", "turn": 1, "event": "message", "message": line})).await.unwrap();
        assert_eq!(next.status(), 200, "{}", next.text().await.unwrap());
        let reply: Value = next.json().await.unwrap();
        assert!(reply["messages"][0]["content"].as_str().unwrap().contains("Which day"), "{reply}");
        server.close().await.unwrap();
    }

    /// The first frame of the agent's first turn over a websocket.
    async fn first_reply(ws: &mut WsClient) -> String {
        while let Some(Ok(frame)) = ws.next().await {
            let frame: Value = serde_json::from_str(frame.to_text().unwrap_or("null")).unwrap_or_default();
            if frame["type"] == "message" {
                return frame["content"].as_str().unwrap_or_default().to_string();
            }
        }
        panic!("the call ended without a reply");
    }

    type WsClient = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    /// `start` says whether the agent greets; it no longer guesses from
    /// whether a line follows within 100 ms, which made a caller's slow
    /// first line a greeting, and a greeting wait 100 ms.
    #[tokio::test]
    async fn a_websocket_call_greets_as_its_start_says() {
        let server = serve_agent(agent(Bug::None), slog::Logger::root(slog::Discard, slog::o!())).unwrap();
        let url = format!("ws://{}/ws", server.local_addr());
        let send = |frame: Value| Message::text(frame.to_string());
        let line = json!({"type": "message", "role": "user", "content": "When are you open?"});

        // The caller speaks first, a while after `start`.
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(send(json!({"type": "start", "call_id": "call_1", "agent_greets": false}))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        ws.send(send(line.clone())).await.unwrap();
        let reply = first_reply(&mut ws).await;
        assert!(reply.contains("Monday to Friday"), "{reply}");
        ws.close(None).await.unwrap();

        // The agent greets, though a line follows at once.
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(send(json!({"type": "start", "call_id": "call_2", "agent_greets": true}))).await.unwrap();
        ws.send(send(line)).await.unwrap();
        let reply = first_reply(&mut ws).await;
        assert!(reply.contains("How can I help"), "{reply}");
        ws.close(None).await.unwrap();
        server.close().await.unwrap();
    }

    /// `--fault hang` over a websocket never answers, and the call still
    /// ends when its caller hangs up: it was held forever, counted in
    /// `active_calls` and its socket kept, one more per call.
    #[tokio::test]
    async fn a_hanging_websocket_call_ends_when_its_caller_closes() {
        let mut config = agent(Bug::None).config;
        config.fault = Fault::Hang;
        let server = serve_agent(Agent::new(config), slog::Logger::root(slog::Discard, slog::o!())).unwrap();
        let address = server.local_addr();
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{address}/ws")).await.unwrap();
        let send = |frame: Value| Message::text(frame.to_string());
        ws.send(send(json!({"type": "start", "call_id": "call_1"}))).await.unwrap();
        ws.send(send(json!({"type": "message", "role": "user", "content": "Book an appointment"}))).await.unwrap();
        while let Some(Ok(frame)) = ws.next().await {
            if frame.to_text().unwrap_or_default().contains("turn_end") {
                break;
            }
        }
        ws.send(send(json!({"type": "message", "role": "user", "content": "Tuesday"}))).await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
        assert!(silent.is_err(), "it hangs: {silent:?}");
        let active_calls = || async {
            let url = format!("http://{address}/stats");
            reqwest::get(&url).await.unwrap().json::<Value>().await.unwrap()
        };
        assert_eq!(active_calls().await["active_calls"], 1);
        ws.close(None).await.unwrap();
        let mut active = active_calls().await["active_calls"].clone();
        for _ in 0..100 {
            if active == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            active = active_calls().await["active_calls"].clone();
        }
        assert_eq!(active, 0, "the call ended with its connection");
        server.close().await.unwrap();
    }

    /// `--fault hang` over http never answers, and a request its caller gave
    /// up on is dropped with its connection: it was awaited forever, one
    /// more task (and its hold on the agent) for every call of a run.
    #[tokio::test]
    async fn a_hanging_http_reply_ends_when_its_caller_goes() {
        let mut config = agent(Bug::None).config;
        config.fault = Fault::Hang;
        let server = serve_agent(Agent::new(config), slog::Logger::root(slog::Discard, slog::o!())).unwrap();
        let url = format!("http://{}/http", server.local_addr());
        let held = || Arc::strong_count(server.app_private());
        let idle = held();
        let post = |body: Value| reqwest::Client::new().post(&url).json(&body).send();
        post(json!({"call_id": "call_1", "turn": 0, "event": "start", "message": null})).await.unwrap();
        let line = json!({"role": "user", "content": "Book an appointment"});
        let hanging = post(json!({"call_id": "call_1", "turn": 1, "event": "message", "message": line}));
        assert!(tokio::time::timeout(Duration::from_millis(300), hanging).await.is_err(), "it hangs");
        let mut now = held();
        for _ in 0..100 {
            if now == idle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            now = held();
        }
        assert_eq!(now, idle, "the request the caller gave up on is still held");
        server.close().await.unwrap();
    }

    #[test]
    fn chance_is_deterministic_and_spread() {
        let a = agent(Bug::None);
        assert_eq!(a.chance("call_1", 3, 2), a.chance("call_1", 3, 2));
        let below: usize = (0..1000).filter(|t| a.chance("call_1", *t, 2) < 0.3).count();
        assert!((200..400).contains(&below), "{below}");
    }
}
