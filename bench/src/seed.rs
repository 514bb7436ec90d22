//! The data the API is measured on: one user with 25 API keys, 10 projects
//! with 1,000 tests each (and the personas, scenario and channel they use),
//! and 100,000 test results with 20-turn transcripts.
//!
//! Keys, projects and tests go through the API, as a user would make them
//! (one durable transaction each; 10,000 tests take well under a minute
//! with 16 requests in flight). Test results are the engine's output, which
//! has no API to create them: they are inserted by SQL into its tables with
//! the server stopped, each row what the engine writes (see [`results`]).

use std::time::Instant;

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub mod results;

/// How much to seed (the defaults are the issue's).
#[derive(Clone, Debug, clap::Args)]
pub struct Scale {
    /// API keys of the bench user (the most a user may have is 25).
    #[arg(long, default_value_t = 25)]
    pub keys: usize,
    #[arg(long, default_value_t = 10)]
    pub projects: usize,
    #[arg(long, default_value_t = 1000)]
    pub tests_per_project: usize,
    #[arg(long, default_value_t = 100_000)]
    pub results: usize,
    /// Turns per test result transcript.
    #[arg(long, default_value_t = 20)]
    pub turns: usize,
}

/// One project's resources a test needs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProjectParts {
    pub id: String,
    pub channel_id: String,
    pub scenario_id: String,
    pub persona_id: String,
    /// The project's seeded tests.
    #[serde(default)]
    pub test_ids: Vec<String>,
}

/// What was seeded, for the scenarios (saved as `manifest.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Seeded {
    /// One of the bench user's keys (the scenarios authenticate with it).
    pub api_key: String,
    /// The OpenID Connect subject of the bench user.
    pub subject: String,
    pub projects: Vec<ProjectParts>,
    pub test_ids: Vec<String>,
    /// Empty when the engine's tables do not exist in this build.
    pub result_ids: Vec<String>,
    /// How long each part took, for the report.
    pub timings: Vec<(String, f64)>,
}

/// A client of the server being seeded.
struct Api {
    base: String,
    http: reqwest::Client,
    auth: (&'static str, String),
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req =
            self.http.request(method.clone(), format!("{}{path}", self.base)).header(self.auth.0, &self.auth.1);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{method} {path}: {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }

    async fn create(&self, path: &str, body: Value) -> anyhow::Result<String> {
        let created = self.send(reqwest::Method::POST, path, Some(body)).await?;
        created["id"].as_str().map(str::to_string).with_context(|| format!("POST {path}: no id in {created}"))
    }
}

/// A test as a team writes one: a few evaluators, tags, a persona.
pub fn test_body(p: &ProjectParts, name: &str) -> Value {
    json!({
        "project_id": p.id,
        "name": name,
        "description": "Books a cleaning for next week and checks the agent confirms the date and time.",
        "channel_id": p.channel_id,
        "scenario_id": p.scenario_id,
        "persona_ids": [p.persona_id],
        "iterations": 3,
        "pass_threshold": 0.67,
        "tags": ["regression", "booking"],
        "evaluators": [
            {"type": "contains", "name": "confirms", "text": "confirmed"},
            {"type": "not_contains", "name": "no apology loop", "text": "sorry, sorry"},
            {"type": "max_latency_ms", "name": "snappy", "percentile": "p95", "ms": 1500}
        ]
    })
}

/// Seeds users, keys, projects and tests through the API of the server at
/// `base`. `id_token` signs in the bench user (created by that first
/// request), who then creates everything else.
pub async fn via_api(base: &str, id_token: &str, subject: &str, scale: &Scale) -> anyhow::Result<Seeded> {
    let http = reqwest::Client::new();
    let as_user =
        Api { base: base.to_string(), http: http.clone(), auth: ("authorization", format!("Bearer {id_token}")) };
    let mut timings = Vec::new();

    let t = Instant::now();
    let mut api_key = None;
    for i in 0..scale.keys {
        let created = as_user
            .send(reqwest::Method::POST, "/v1/api-keys", Some(json!({"label": format!("ci runner {i}")})))
            .await?;
        api_key.get_or_insert(
            created["apiKey"].as_str().with_context(|| format!("no apiKey in the created key: {created}"))?.to_string(),
        );
    }
    let api_key = api_key.context("seeding needs at least one key")?;
    timings.push((format!("{} API keys (API)", scale.keys), t.elapsed().as_secs_f64()));
    let api = Api { base: base.to_string(), http, auth: ("x-api-key", api_key.clone()) };

    let t = Instant::now();
    let mut projects = Vec::new();
    for i in 0..scale.projects {
        let id = api
            .create(
                "/v1/projects",
                json!({"name": format!("voice agent {i}"), "description": "Front-desk agent of a dental clinic"}),
            )
            .await?;
        let persona_id = api
            .create(
                "/v1/personas",
                json!({"project_id": id, "name": "busy parent", "description": "Calls between two meetings",
                       "prompt": "You are in a hurry and want a cleaning next week.", "tags": ["impatient"]}),
            )
            .await?;
        let scenario_id = api
            .create(
                "/v1/scenarios",
                json!({"project_id": id, "name": "book a cleaning", "mode": "scripted",
                "default_persona_id": persona_id,
                "steps": [
                    {"say": "Hi, I'd like to book a cleaning.", "expect": []},
                    {"say": "Next Tuesday morning, please.",
                     "expect": [{"type": "contains", "name": "offers a time", "text": "Tuesday"}]},
                    {"say": "Yes, that works. Thanks!", "expect": []}
                ]}),
            )
            .await?;
        let channel_id = api
            .create(
                "/v1/channels",
                // Never called (the results are written by SQL); named by a
                // host, as the server refuses a private address it is given.
                json!({"project_id": id, "name": "staging agent", "kind": "http",
                       "target": "https://agent.example.com/turn"}),
            )
            .await?;
        projects.push(ProjectParts { id, channel_id, scenario_id, persona_id, test_ids: Vec::new() });
    }
    timings.push((
        format!("{} projects with their persona, scenario, channel (API)", scale.projects),
        t.elapsed().as_secs_f64(),
    ));

    let t = Instant::now();
    let bodies: Vec<(usize, Value)> = projects
        .iter()
        .enumerate()
        .flat_map(|(n, p)| {
            (0..scale.tests_per_project).map(move |i| (n, test_body(p, &format!("booking regression {i}"))))
        })
        .collect();
    let total = bodies.len();
    let created: Vec<(usize, String)> = futures::stream::iter(bodies)
        .map(|(n, body)| {
            let api = &api;
            async move { Ok::<_, anyhow::Error>((n, api.create("/v1/tests", body).await?)) }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let mut test_ids = Vec::with_capacity(total);
    for (n, id) in created {
        projects[n].test_ids.push(id.clone());
        test_ids.push(id);
    }
    let secs = t.elapsed().as_secs_f64();
    timings.push((format!("{total} tests (API, 16 in flight: {:.0}/s)", total as f64 / secs), secs));

    Ok(Seeded { api_key, subject: subject.to_string(), projects, test_ids, result_ids: Vec::new(), timings })
}
