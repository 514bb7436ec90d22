//! The `websocket` channel: one connection per call, JSON text frames.
//! We send `start`, then a `message` per caller line, and `end_call` plus a
//! normal close when the caller hangs up; the agent sends `message`,
//! `tool_call`, `end_call` and `turn_end` frames.

use crate::engine::outbound::Outbound;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{FutureExt as _, SinkExt, StreamExt};
use reqwest::header::{HeaderName, HeaderValue};
use rustls::pki_types::ServerName;
use rustls_platform_verifier::BuilderVerifierExt;
use serde_json::{json, Map, Value};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{later, turn_limit, Reply, TurnFailure, CALL_ID_HEADER, MAX_REPLY_BYTES};
use crate::engine::llm::excerpt;
use crate::engine::CallPlan;

pub(super) struct WsAgent {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    call_id: String,
    /// The channel's header values, redacted from the agent's frames
    /// quoted in a reason.
    secrets: Vec<String>,
    turn_timeout: Duration,
    /// The agent turn that ended last, which frames arriving before the
    /// caller's next line still belong to (see [`WsAgent::late`]).
    ended: Option<Ended>,
    /// Frames taken in while the caller made its next line, each with when
    /// it came (see [`WsAgent::listen`]), for [`WsAgent::late`].
    heard: std::collections::VecDeque<(Instant, Option<Result<Message, tungstenite::Error>>)>,
    /// The size of `heard`'s frames, and whether it ends with the stream's
    /// end or an error (nothing more is read then).
    heard_bytes: usize,
    heard_all: bool,
}

/// What a later frame of an ended turn needs to know of it.
struct Ended {
    turn: u32,
    sent_at: Instant,
    first_at: Option<Instant>,
    /// The size of its text frames so far.
    size: usize,
    /// Its control frames so far (see [`MAX_CONTROL_FRAMES`]).
    controls: usize,
}

/// The most pings and pongs an agent may send in one turn (the frames after
/// it included). A keepalive is a frame every few seconds; a flood is an
/// agent error. Without a bound, the frames after a turn, which are read
/// without a pause, would be read for as long as a flood came (the
/// websocket layer answers pings itself, and they are no part of a turn).
const MAX_CONTROL_FRAMES: usize = 10_000;

/// One frame from the agent.
enum Frame {
    Message(String),
    ToolCall(String, Map<String, Value>),
    EndCall,
    TurnEnd,
}

impl WsAgent {
    /// Connects to the channel's target with `x-sparring-call-id` and the
    /// channel's headers on the upgrade request. Counts as turn 0 in errors.
    pub(super) async fn connect(outbound: &Outbound, plan: &CallPlan, deadline: Instant) -> Result<Self, TurnFailure> {
        let target = plan.agent.target.as_str();
        let secrets: Vec<&str> = plan.agent.headers.iter().map(|(_, value)| value.as_str()).collect();
        // The target as the URL parser that accepted it reads it (as an http
        // channel's is sent): scheme and host lower-cased, what a URI may not
        // hold percent-encoded. The handshake's own parser takes only that
        // form, and would refuse `WSS://…` or a path with a space.
        let url = url::Url::parse(target).map(String::from).unwrap_or_else(|_| target.to_string());
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| TurnFailure::Agent(format!("the channel target `{target}` is not a websocket URL: {e}")))?;
        let headers = super::http::header_map(&plan.agent.headers).map_err(TurnFailure::Agent)?;
        request.headers_mut().extend(headers);
        request.headers_mut().insert(
            HeaderName::from_static(CALL_ID_HEADER),
            HeaderValue::from_str(&plan.call_id).map_err(|_| {
                TurnFailure::Agent(format!("the call id `{}` is not a valid header value", plan.call_id))
            })?,
        );
        let turn_timeout = plan.agent.turn_timeout;
        let (limit, deadline_binds) = turn_limit(turn_timeout, deadline);
        // No frame may be larger than a whole turn may be, so a huge one is
        // refused from its header, never buffered.
        let config =
            WebSocketConfig::default().max_message_size(Some(MAX_REPLY_BYTES)).max_frame_size(Some(MAX_REPLY_BYTES));
        // A URL that names no one reaches no one.
        let uri = request.uri();
        let host = match (tungstenite::client::uri_mode(uri), uri.host()) {
            (Err(e), _) => return Err(TurnFailure::Unreached(connect_error(target, e, &secrets))),
            (Ok(_), None) => {
                let e = tungstenite::Error::Url(tungstenite::error::UrlError::NoHostName);
                return Err(TurnFailure::Unreached(connect_error(target, e, &secrets)));
            }
            (Ok(_), Some(host)) => host.to_string(),
        };
        let tls = uri.scheme_str() == Some("wss");
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        // The connection is made here, not by tungstenite, so that one the
        // agent never took (nothing reached it) is told apart from a
        // handshake it does not finish: only to an address the server may
        // call (see `outbound`). For `wss://` the connection is made once
        // its TLS is set up, as an `https://` one is: a TLS setup that fails
        // or is never answered reached no one.
        let connecting = async {
            let unreached = |e: &dyn std::fmt::Display| {
                TurnFailure::Unreached(format!("could not connect to the agent at {target} for turn 0: {e}"))
            };
            let addresses = outbound.addresses(&host, port).await.map_err(|refused| {
                TurnFailure::Unreached(format!("the agent at {target} was not called for turn 0: {refused}"))
            })?;
            let stream = tokio::net::TcpStream::connect(&addresses[..]).await.map_err(|e| unreached(&e))?;
            // No Nagle: our frames are small and their send time is when
            // latency starts.
            let _ = stream.set_nodelay(true);
            if !tls {
                return Ok(MaybeTlsStream::Plain(stream));
            }
            let config = tls_config().map_err(|e| unreached(&e))?;
            let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
                .map_err(|e| unreached(&e))?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map(MaybeTlsStream::Rustls)
                .map_err(|e| unreached(&format_args!("TLS: {e}")))
        };
        let stream = match tokio::time::timeout_at(limit, connecting).await {
            Ok(stream) => stream?,
            Err(_) if deadline_binds => return Err(TurnFailure::DeadlineUnreached),
            Err(_) => {
                return Err(TurnFailure::Unreached(format!(
                    "could not connect to the agent at {target} for turn 0 within {} ms",
                    turn_timeout.as_millis()
                )))
            }
        };
        let handshake = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
        match tokio::time::timeout_at(limit, handshake).await {
            Ok(Ok((ws, _))) => Ok(WsAgent {
                ws,
                call_id: plan.call_id.clone(),
                secrets: secrets.iter().map(|s| s.to_string()).collect(),
                turn_timeout,
                ended: None,
                heard: std::collections::VecDeque::new(),
                heard_bytes: 0,
                heard_all: false,
            }),
            Ok(Err(e)) => Err(TurnFailure::Agent(connect_error(target, e, &secrets))),
            Err(_) if deadline_binds => Err(TurnFailure::Deadline(None)),
            Err(_) => Err(TurnFailure::Agent(format!(
                "the agent at {target} did not accept the websocket connection for turn 0 within {} ms",
                turn_timeout.as_millis()
            ))),
        }
    }

    /// `start` (turn 0) and/or the caller's line, and the agent's turn.
    pub(super) async fn exchange(
        &mut self,
        turn: u32,
        line: Option<&str>,
        deadline: Instant,
    ) -> Result<Reply, TurnFailure> {
        if turn == 0 {
            // Whether the agent is to greet: without it, an agent could
            // only guess from how long no line follows.
            let start = json!({"type": "start", "call_id": self.call_id, "agent_greets": line.is_none()});
            self.send(turn, start, deadline).await?;
        }
        if let Some(line) = line {
            self.send(turn, json!({"type": "message", "role": "user", "content": line}), deadline).await?;
        }
        self.collect(turn, Instant::now(), deadline).await
    }

    async fn send(&mut self, turn: u32, frame: Value, deadline: Instant) -> Result<(), TurnFailure> {
        let (limit, deadline_binds) = turn_limit(self.turn_timeout, deadline);
        match tokio::time::timeout_at(limit, self.ws.send(Message::text(frame.to_string()))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(TurnFailure::Agent(
                read_error(&format!("during turn {turn}"), &e)
                    .unwrap_or_else(|| format!("could not send turn {turn} to the agent: {e}")),
            )),
            Err(_) if deadline_binds => Err(TurnFailure::Deadline(None)),
            Err(_) => Err(TurnFailure::Agent(format!(
                "could not send turn {turn} to the agent within {} ms",
                self.turn_timeout.as_millis()
            ))),
        }
    }

    /// While the caller makes its next line (a simulated caller's LLM may
    /// take seconds): takes in the next frame the agent sends, with when it
    /// came, for [`WsAgent::late`], which read it only once the line was
    /// made and timed it then. Never resolves before a turn has ended, once
    /// the stream has ended or failed, or past the size a turn may have or
    /// as many frames as it may have control frames (what is held stays
    /// bounded; `late` reads the rest as it did). Cancel-safe.
    pub(super) async fn listen(&mut self) {
        let full = self.heard_bytes > MAX_REPLY_BYTES || self.heard.len() >= MAX_CONTROL_FRAMES;
        if self.ended.is_none() || self.heard_all || full {
            return std::future::pending().await;
        }
        let next = self.ws.next().await;
        let at = Instant::now();
        match &next {
            Some(Ok(message)) => self.heard_bytes = self.heard_bytes.saturating_add(message.len()),
            _ => self.heard_all = true,
        }
        self.heard.push_back((at, next));
    }

    /// The frames that arrived since the last agent turn ended (at its
    /// `turn_end`, or after its silence) and before the caller's next line:
    /// they belong to that turn, not to the reply to the next line, whose
    /// latency must be counted from the line. Called right before the line
    /// goes out; returns them as a continuation of the ended turn (its
    /// `sent_at` and `first_at`), or `None` when none came. Reads only what
    /// is already there; stops at `end_call`.
    pub(super) async fn late(&mut self) -> Result<Option<Reply>, TurnFailure> {
        let Some(ended) = &self.ended else { return Ok(None) };
        let (turn, mut size, mut controls) = (ended.turn, ended.size, ended.controls);
        let mut late = Reply::new(ended.sent_at);
        late.first_at = ended.first_at;
        // Lets the runtime take in what reached the socket meanwhile.
        tokio::task::yield_now().await;
        let when = format!("after turn {turn}");
        self.heard_bytes = 0;
        while !late.end_call {
            // What was taken in while the caller made its line, as of when
            // it came; then only what is already there (`unconstrained`, so
            // the runtime's budget cannot cut the reading short).
            let (at, next) = match self.heard.pop_front() {
                Some(heard) => heard,
                None if self.heard_all => break,
                None => match tokio::task::unconstrained(self.ws.next()).now_or_never() {
                    Some(next) => (Instant::now(), next),
                    None => break,
                },
            };
            let text = match frame_text(turn, &when, next, &self.secrets) {
                Ok(Some(text)) => text,
                Ok(None) => match control(&mut controls, &when) {
                    Ok(()) => continue,
                    Err(failure) => return Err(after(failure, late, size)),
                },
                Err(failure) => return Err(after(failure, late, size)),
            };
            // A second `turn_end` ends nothing more.
            if let Err(failure) = absorb(&mut late, &mut size, turn, &when, &text, &self.secrets, at) {
                return Err(after(failure, late, size));
            }
        }
        if let Some(ended) = &mut self.ended {
            ended.size = size;
            ended.controls = controls;
        }
        Ok(late.last_at.is_some().then_some(late))
    }

    /// The agent's turn: frames until `turn_end`, `end_call`, or a silence
    /// of the turn timeout after at least one frame. Only frames read after
    /// the caller's line went out (`sent_at`) are the turn's: those sent
    /// between turns were taken by [`WsAgent::late`] first. A turn whose
    /// text frames come to more than [`MAX_REPLY_BYTES`] is an agent error,
    /// as an http reply of that size is.
    async fn collect(&mut self, turn: u32, sent_at: Instant, deadline: Instant) -> Result<Reply, TurnFailure> {
        self.ended = None;
        let when = format!("during turn {turn}");
        let mut reply = Reply::new(sent_at);
        let mut size = 0usize;
        let mut controls = 0usize;
        loop {
            let silence_ends = later(reply.last_at.unwrap_or(sent_at), self.turn_timeout);
            let (limit, deadline_binds) =
                if deadline <= silence_ends { (deadline, true) } else { (silence_ends, false) };
            let next = match tokio::time::timeout_at(limit, self.ws.next()).await {
                Ok(next) => next,
                Err(_) if deadline_binds => return Err(TurnFailure::Deadline(reply.first_at.map(|_| reply))),
                Err(_) if reply.first_at.is_some() => return Ok(self.ended(turn, reply, size, controls)),
                Err(_) => {
                    return Err(TurnFailure::Agent(format!(
                        "the agent sent nothing for turn {turn} within {} ms",
                        self.turn_timeout.as_millis()
                    )))
                }
            };
            let text = match frame_text(turn, &when, next, &self.secrets) {
                Ok(Some(text)) => text,
                Ok(None) => match control(&mut controls, &when) {
                    Ok(()) => continue,
                    Err(failure) => return Err(after(failure, reply, size)),
                },
                Err(failure) => return Err(after(failure, reply, size)),
            };
            let turn_end = match absorb(&mut reply, &mut size, turn, &when, &text, &self.secrets, Instant::now()) {
                Ok(turn_end) => turn_end,
                Err(failure) => return Err(after(failure, reply, size)),
            };
            if reply.end_call {
                return Ok(reply);
            }
            if turn_end {
                return Ok(self.ended(turn, reply, size, controls));
            }
        }
    }

    /// `reply` ended the agent's turn `turn` without ending the call.
    fn ended(&mut self, turn: u32, reply: Reply, size: usize, controls: usize) -> Reply {
        self.ended = Some(Ended { turn, sent_at: reply.sent_at, first_at: reply.first_at, size, controls });
        reply
    }

    /// Ends the connection: with `hang_up`, the caller's `end_call` first;
    /// with `drain`, waits for the agent's close so the close is a clean
    /// handshake (not after an agent error: a failing agent may never
    /// answer). Best effort, bounded by the turn timeout.
    pub(super) async fn close(mut self: Box<Self>, hang_up: bool, drain: bool) {
        let closing = async {
            if hang_up {
                let _ = self.ws.send(Message::text(json!({"type": "end_call"}).to_string())).await;
            }
            let _ = self.ws.close(None).await;
            if drain {
                while let Some(Ok(_)) = self.ws.next().await {}
            }
        };
        let _ = tokio::time::timeout(self.turn_timeout, closing).await;
    }
}

/// The text of a frame the agent sent for turn `turn` (`when`: "during
/// turn N" or "after turn N", for errors); `None` for a control frame, which tungstenite
/// answers itself. A close says its code and reason (`secrets` taken out):
/// often the one thing that says why the agent went away.
fn frame_text(
    turn: u32,
    when: &str,
    next: Option<Result<Message, tungstenite::Error>>,
    secrets: &[String],
) -> Result<Option<String>, TurnFailure> {
    match next {
        None | Some(Ok(Message::Close(None))) => Err(TurnFailure::Agent(closed(when))),
        Some(Ok(Message::Close(Some(frame)))) => {
            let reason = match frame.reason.trim() {
                "" => String::new(),
                reason => {
                    format!(": {}", excerpt(reason, 200, &secrets.iter().map(String::as_str).collect::<Vec<_>>()))
                }
            };
            Err(TurnFailure::Agent(format!("{} (close code {}{reason})", closed(when), u16::from(frame.code))))
        }
        Some(Err(tungstenite::Error::Capacity(CapacityError::MessageTooLong { .. }))) => {
            Err(TurnFailure::Agent(too_large(turn)))
        }
        Some(Err(e)) => Err(TurnFailure::Agent(
            read_error(when, &e).unwrap_or_else(|| format!("the websocket connection failed {when}: {e}")),
        )),
        Some(Ok(Message::Text(text))) => Ok(Some(text.to_string())),
        Some(Ok(Message::Binary(_))) => Err(TurnFailure::Agent(format!(
            "the agent sent a binary frame {when}; the protocol's frames are JSON text"
        ))),
        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => Ok(None),
    }
}

fn parse_frame(when: &str, text: &str, secrets: &[String]) -> Result<Frame, String> {
    // Only a refused frame is quoted, its secrets taken out (before it is
    // clipped: a clipped secret is no longer found).
    let hidden = |quote: &str, max: usize| excerpt(quote, max, &secrets.iter().map(String::as_str).collect::<Vec<_>>());
    let quoted = || hidden(text, 200);
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("the agent sent a frame that is not JSON {when} ({e}): {}", quoted()))?;
    let Value::Object(frame) = value else {
        return Err(format!("the agent sent a frame that is not a JSON object {when}: {}", quoted()));
    };
    let shape = |what: &str| format!("the agent sent a `{what}` frame {when}: {}", quoted());
    match frame.get("type").and_then(Value::as_str) {
        Some("message") => match frame.get("content") {
            Some(Value::String(content)) => Ok(Frame::Message(content.clone())),
            _ => Err(format!("{} (a `message` frame needs a string `content`)", shape("message"))),
        },
        Some("tool_call") => {
            let Some(name) = frame.get("name").and_then(Value::as_str) else {
                return Err(format!("{} (a `tool_call` frame needs a string `name`)", shape("tool_call")));
            };
            let arguments = match frame.get("arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(arguments)) => arguments.clone(),
                Some(_) => return Err(format!("{} (`arguments` must be an object)", shape("tool_call"))),
            };
            Ok(Frame::ToolCall(name.to_string(), arguments))
        }
        Some("end_call") => Ok(Frame::EndCall),
        Some("turn_end") => Ok(Frame::TurnEnd),
        Some(other) => Err(format!(
            "the agent sent a frame of unknown type `{}` {when} (expected message, tool_call, end_call or turn_end)",
            hidden(other, 40)
        )),
        None => Err(format!("the agent sent a frame without a string `type` {when}: {}", quoted())),
    }
}

/// `failure` of the agent partway through its turn (or after it, in frames
/// that still belong to it), with what it had sent of it (`reply`, whose
/// text frames came to `size` bytes), to be kept; not a turn larger than a
/// reply may be.
fn after(failure: TurnFailure, reply: Reply, size: usize) -> TurnFailure {
    match failure {
        TurnFailure::Agent(reason) if reply.last_at.is_some() && size <= MAX_REPLY_BYTES => {
            TurnFailure::AgentAfter(reason, Box::new(reply))
        }
        other => other,
    }
}

/// Counts a ping or pong of a turn (`when`: "during turn N" or "after turn
/// N"); past [`MAX_CONTROL_FRAMES`], the agent has failed.
fn control(controls: &mut usize, when: &str) -> Result<(), TurnFailure> {
    *controls += 1;
    if *controls > MAX_CONTROL_FRAMES {
        return Err(TurnFailure::Agent(format!(
            "the agent sent more than {MAX_CONTROL_FRAMES} ping or pong frames {when}"
        )));
    }
    Ok(())
}

fn too_large(turn: u32) -> String {
    format!("the agent's reply to turn {turn} is larger than {MAX_REPLY_BYTES} bytes")
}

fn closed(when: &str) -> String {
    format!("the agent closed the connection {when}")
}

/// The errors that mean the agent went away, said as such.
fn read_error(when: &str, e: &tungstenite::Error) -> Option<String> {
    use std::io::ErrorKind;
    match e {
        tungstenite::Error::ConnectionClosed
        | tungstenite::Error::AlreadyClosed
        | tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => Some(closed(when)),
        tungstenite::Error::Io(io)
            if matches!(io.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof) =>
        {
            Some(closed(when))
        }
        _ => None,
    }
}

fn connect_error(target: &str, e: tungstenite::Error, secrets: &[&str]) -> String {
    match e {
        tungstenite::Error::Http(response) => {
            let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            let status = response.status().as_u16();
            let mut refused =
                format!("the agent at {target} refused the websocket connection for turn 0 with HTTP {status}");
            // A redirect is not followed (the channel's headers go only to
            // its target): where it pointed is the target to give instead.
            if let Some(location) = crate::engine::redirect_location(response.status(), response.headers()) {
                let location = excerpt(&location, 300, secrets);
                refused.push_str(&format!(
                    ", a redirect to {location} that is not followed (give the channel that target)"
                ));
            }
            match body.trim() {
                "" => refused,
                body => format!("{refused}: {}", excerpt(body, 300, secrets)),
            }
        }
        tungstenite::Error::Url(e) => format!("the channel target `{target}` is not a usable websocket URL: {e}"),
        e => format!("could not connect to the agent at {target} for turn 0: {e}"),
    }
}

/// The TLS setup for `wss://`, built once: the platform's trust, as for
/// `https://` targets.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|builder| builder.with_platform_verifier())
                .map(|builder| Arc::new(builder.with_no_client_auth()))
                .map_err(|e| format!("TLS for wss:// targets could not be set up: {e}"))
        })
        .clone()
}

/// Adds one frame of turn `turn` (its `text`) to `reply`: its words, tool
/// call or `end_call`, counting its size against the reply's limit.
/// Returns whether it was a `turn_end`.
fn absorb(
    reply: &mut Reply,
    size: &mut usize,
    turn: u32,
    when: &str,
    text: &str,
    secrets: &[String],
    at: Instant,
) -> Result<bool, TurnFailure> {
    *size = size.saturating_add(text.len());
    if *size > MAX_REPLY_BYTES {
        return Err(TurnFailure::Agent(too_large(turn)));
    }
    reply.arrived(at);
    match parse_frame(when, text, secrets).map_err(TurnFailure::Agent)? {
        Frame::Message(content) => reply.said(content, at),
        Frame::ToolCall(name, arguments) => reply.tool_calls.push((name, arguments)),
        Frame::EndCall => reply.end_call = true,
        Frame::TurnEnd => return Ok(true),
    }
    Ok(false)
}
