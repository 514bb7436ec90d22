//! Test support: an [`Outcome`] builder, scenarios and evaluators from
//! JSON, and a loopback chat-completions double (a real HTTP server on
//! 127.0.0.1 speaking the OpenAI protocol) for `llm_judge`.

use std::sync::{Arc, Mutex};

use dropshot::{ApiDescription, Body, HttpError, RequestContext, ServerBuilder, TypedBody};
use serde_json::{json, Value};
use sparring_server::types::{
    self, CallMetrics, EndedReason, Evaluator, LatencyPercentiles, ToolCall, TranscriptTurn, TurnRole,
};

use crate::engine::{LlmEndpoint, Outcome};

/// Builds an [`Outcome`] turn by turn; metrics are computed from the turns
/// as the conversation measures them (turns of both roles; nearest-rank
/// percentiles of the agent turns' latencies).
pub struct OutcomeBuilder {
    transcript: Vec<TranscriptTurn>,
    tool_calls: Vec<ToolCall>,
    ended_reason: EndedReason,
    error: Option<String>,
    step_replies: Vec<Vec<usize>>,
    clock_ms: i64,
}

impl OutcomeBuilder {
    pub fn new() -> Self {
        OutcomeBuilder {
            transcript: Vec::new(),
            tool_calls: Vec::new(),
            ended_reason: EndedReason::CallerDone,
            error: None,
            step_replies: Vec::new(),
            clock_ms: 0,
        }
    }

    fn turn(mut self, role: TurnRole, text: &str, latency_ms: Option<i64>) -> Self {
        let start_ms = self.clock_ms + latency_ms.unwrap_or(0);
        let end_ms = start_ms + 1000;
        self.clock_ms = end_ms;
        self.transcript.push(TranscriptTurn { role, text: text.to_string(), start_ms, end_ms, latency_ms });
        self
    }

    pub fn caller(self, text: &str) -> Self {
        self.turn(TurnRole::Caller, text, None)
    }

    pub fn agent(self, text: &str, latency_ms: i64) -> Self {
        self.turn(TurnRole::Agent, text, Some(latency_ms))
    }

    /// A tool call belonging to the last turn.
    pub fn tool(mut self, name: &str, arguments: Value) -> Self {
        let Value::Object(arguments) = arguments else { panic!("tool arguments must be an object") };
        let turn = i32::try_from(self.transcript.len()).unwrap() - 1;
        self.tool_calls.push(ToolCall { name: name.to_string(), arguments, turn });
        self
    }

    /// The transcript indices of the agent's reply to the next step.
    pub fn step(mut self, reply: &[usize]) -> Self {
        self.step_replies.push(reply.to_vec());
        self
    }

    pub fn ended(mut self, reason: EndedReason) -> Self {
        self.ended_reason = reason;
        self
    }

    pub fn error(mut self, error: &str) -> Self {
        self.error = Some(error.to_string());
        self
    }

    pub fn build(self) -> Outcome {
        let mut latencies: Vec<i64> = self.transcript.iter().filter_map(|t| t.latency_ms).collect();
        latencies.sort_unstable();
        let rank =
            |p: usize| (!latencies.is_empty()).then(|| latencies[(latencies.len() * p).div_ceil(100).max(1) - 1]);
        Outcome {
            started_at: chrono::Utc::now(),
            duration_ms: u64::try_from(self.clock_ms).unwrap(),
            metrics: CallMetrics {
                turns: i32::try_from(self.transcript.len()).unwrap(),
                time_to_first_word_ms: self.transcript.iter().find(|t| t.role == TurnRole::Agent).map(|t| t.start_ms),
                latency_ms: LatencyPercentiles { p50: rank(50), p90: rank(90), p95: rank(95), max: rank(100) },
            },
            transcript: self.transcript,
            tool_calls: self.tool_calls,
            ended_reason: self.ended_reason,
            error: self.error,
            caller_error: false,
            step_replies: self.step_replies,
            reached_agent: true,
        }
    }
}

/// Evaluators from their wire JSON (an array).
pub fn evaluators(list: Value) -> Vec<Evaluator> {
    serde_json::from_value(list).expect("evaluators")
}

/// A scripted scenario with these steps and success criteria (wire JSON).
pub fn scenario(steps: Value, success_criteria: Value) -> types::Scenario {
    serde_json::from_value(json!({
        "id": "scn_1", "project_id": "prj_1", "name": "scenario", "description": "", "mode": "scripted",
        "first_message": null, "goal": null, "integration_id": null, "default_persona_id": null, "max_duration_s": 300, "max_turns": 50,
        "steps": steps, "success_criteria": success_criteria, "tags": [], "version": 1,
        "created_at": "2025-01-01T00:00:00Z", "updated_at": "2025-01-01T00:00:00Z",
    }))
    .expect("scenario")
}

/// A request the double received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub authorization: Option<String>,
    pub body: Value,
}

/// Decides the answer from (authorization header or "", last user message):
/// (status, content). Status 200 wraps the content in a chat completion;
/// any other status sends it as the body.
type Answer = Box<dyn Fn(&str, &str) -> (u16, String) + Send + Sync>;

struct DoubleState {
    answer: Answer,
    /// When set, no request is answered until this many have arrived.
    gate: Option<tokio::sync::Barrier>,
    requests: Mutex<Vec<Recorded>>,
}

/// A chat-completions endpoint on 127.0.0.1.
pub struct ChatDouble {
    pub url: String,
    state: Arc<DoubleState>,
    _server: dropshot::HttpServer<Arc<DoubleState>>,
}

#[dropshot::endpoint { method = POST, path = "/chat/completions" }]
async fn chat_completions(
    rqctx: RequestContext<Arc<DoubleState>>,
    body: TypedBody<Value>,
) -> Result<http::Response<Body>, HttpError> {
    let state = rqctx.context();
    let authorization =
        rqctx.request.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = body.into_inner();
    state.requests.lock().unwrap().push(Recorded { authorization: authorization.clone(), body: body.clone() });
    if let Some(gate) = &state.gate {
        gate.wait().await;
    }
    let user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let (status, content) = (state.answer)(authorization.as_deref().unwrap_or(""), user);
    let body = if status == 200 {
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).to_string()
    } else {
        content
    };
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

impl ChatDouble {
    /// Answers each request with `answer(last user message)`.
    pub async fn start(answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static) -> Self {
        Self::launch(Box::new(move |_, user| answer(user)), None)
    }

    /// Answers with `answer(authorization, last user message)`.
    pub async fn start_raw(answer: impl Fn(&str, &str) -> (u16, String) + Send + Sync + 'static) -> Self {
        Self::launch(Box::new(answer), None)
    }

    /// Holds every answer until `n` requests have arrived.
    pub async fn start_gated(n: usize, answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static) -> Self {
        Self::launch(Box::new(move |_, user| answer(user)), Some(tokio::sync::Barrier::new(n)))
    }

    fn launch(answer: Answer, gate: Option<tokio::sync::Barrier>) -> Self {
        let state = Arc::new(DoubleState { answer, gate, requests: Mutex::new(Vec::new()) });
        let mut api = ApiDescription::new();
        api.register(chat_completions).unwrap();
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let server = ServerBuilder::new(api, state.clone(), log)
            .config(dropshot::ConfigDropshot {
                bind_address: "127.0.0.1:0".parse().unwrap(),
                // A judge's request (its instructions, the transcript) is
                // larger than dropshot's default 1 KiB.
                default_request_body_max_bytes: 256 * 1024,
                ..Default::default()
            })
            .start()
            .unwrap();
        ChatDouble { url: format!("http://{}", server.local_addr()), state, _server: server }
    }

    /// The integration a judge would use, with `api_key` as its credential.
    pub fn endpoint(&self, api_key: Option<&str>) -> LlmEndpoint {
        LlmEndpoint {
            base_url: self.url.clone(),
            model: "judge-model".to_string(),
            temperature: Some(0.0),
            api_key: api_key.map(str::to_string),
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}
