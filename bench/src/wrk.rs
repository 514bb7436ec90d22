//! The load generator: wrk, driven by a Lua script per scenario.
//!
//! wrk rather than oha: it is a few thousand lines of C with an event loop
//! per thread, so on a two-core machine it takes less of the CPU the server
//! needs, and its Lua `request()` hook makes every request different (a
//! random test among 10,000, a 90/10 mix decided per request on every
//! connection), which a fixed-URL generator cannot. Every scenario, the
//! baseline included, goes through the same `request()` hook, so the
//! generator's own cost per request is alike on both sides of a ratio; and
//! the hook picks among requests built once rather than building one
//! (`scenarios::init`), so that wrk's garbage collector does not hold up
//! its connections.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub connections: u32,
    pub threads: u32,
    pub duration: Duration,
}

/// What one wrk run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub requests: u64,
    pub duration_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Responses with a status of 400 or more, and socket errors.
    pub status_errors: u64,
    pub socket_errors: u64,
    /// The server's CPU time per request, in µs (user + system, all its
    /// threads): what a request costs, less sensitive than throughput to
    /// what else the machine is doing. Filled in by the caller.
    #[serde(default)]
    pub server_cpu_us: f64,
    /// The same by thread name, µs a request. Filled in by the caller.
    #[serde(default)]
    pub server_cpu_us_by_thread: std::collections::BTreeMap<String, f64>,
    /// The machine's CPU time spent idle (or waiting for I/O) during the
    /// run, as a share: how near both cores were to saturated. Filled in by
    /// the caller.
    #[serde(default)]
    pub machine_idle: f64,
}

impl Outcome {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
    }
}

/// The part of every script after the scenario's `request` function:
/// per-thread random seeds, and a JSON line with the results.
const COMMON_LUA: &str = r#"
local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("tid", thread_count)
end

function lines(path)
  local t = {}
  for l in io.lines(path) do
    if l ~= "" then t[#t + 1] = l end
  end
  return t
end

function fields(line)
  local t = {}
  for f in string.gmatch(line, "[^\t]+") do t[#t + 1] = f end
  return t
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,"status_errors":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
"#;

/// A complete script: `body` defines `init(args)` (which must call
/// `math.randomseed` with `tid`) and `request()`.
pub fn script(body: &str) -> String {
    format!("-- Written by sparring-bench (bench/src/wrk.rs).\n{COMMON_LUA}\n{body}\n")
}

/// Runs wrk against `addr` with `script_path`; fails if any request failed.
pub fn run(addr: SocketAddr, script_path: &Path, load: Load) -> anyhow::Result<Outcome> {
    let out = Command::new("wrk")
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{}s", load.duration.as_secs().max(1)))
        .args(["--timeout", "10s", "-s"])
        .arg(script_path)
        .arg(format!("http://{addr}"))
        .output()
        .context("running wrk (is it installed? `cargo xtask bench api` installs it)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "wrk failed ({}): {}{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("BENCH "))
        .with_context(|| format!("no result line in wrk's output: {stdout}{}", String::from_utf8_lossy(&out.stderr)))?;
    let outcome: Outcome = serde_json::from_str(line).with_context(|| format!("reading wrk's result: {line}"))?;
    anyhow::ensure!(
        outcome.status_errors == 0 && outcome.socket_errors == 0,
        "{} of {} requests failed ({} with a status ≥ 400, {} socket errors); a failing request is not a measurement",
        outcome.status_errors + outcome.socket_errors,
        outcome.requests,
        outcome.status_errors,
        outcome.socket_errors
    );
    Ok(outcome)
}
