//! One conversation with the agent under test.
//! PLACEHOLDER until the conversation branch is merged: every call ends in
//! an agent error saying so.

use tokio_util::sync::CancellationToken;

use super::{CallPlan, Outcome};
use sparring_server::types;

pub async fn converse(_http: &reqwest::Client, _plan: &CallPlan, _cancel: &CancellationToken) -> Outcome {
    Outcome {
        started_at: crate::ids::now(),
        duration_ms: 0,
        transcript: Vec::new(),
        tool_calls: Vec::new(),
        ended_reason: types::EndedReason::AgentError,
        error: Some("conversations are not built in this build".into()),
        metrics: types::CallMetrics {
            turns: 0,
            time_to_first_word_ms: None,
            latency_ms: types::LatencyPercentiles { p50: None, p90: None, p95: None, max: None },
        },
        step_replies: Vec::new(),
    }
}
