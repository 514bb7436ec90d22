//! The workers: tasks in the server process that take runs from the queue
//! and hold their conversations.
//!
//! A conversation is I/O-bound (it mostly waits for the agent), so a worker
//! is a tokio task, not a thread: `--workers` (default
//! [`DEFAULT_WORKERS`]) conversations run at once per server. One dispatcher
//! task claims runs when there are free slots (woken when runs are queued or
//! a conversation ends, and every [`POLL`] in case), one keeper task renews
//! this process's leases and requeues expired ones, one task sends webhooks.
//! Each of those three is started again if it panics ([`supervised`]); a
//! run's task that panics ends its run (see [`end_after_a_panic`]).
//!
//! On start, every run still marked `running` belonged to a process that
//! died (the data dir lock guarantees there is no other server), so it is
//! requeued at once with `attempt + 1`. On a clean shutdown no run is
//! claimed any more, the runs in flight are told to stop and let end for a
//! while (one whose conversation was over records its end), and those still
//! held then are put back in the queue with the same attempt.

use crate::engine::outbound::Outbound;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use rusqlite::{params, OptionalExtension as _};
use serde_json::{Map, Value};
use sparring_server::types;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::queue::{self, Claimed, Finish};
use super::{conversation, evaluate, webhooks, AgentEndpoint, CallPlan, LlmEndpoint};
use crate::failure::{Failure, Result};
use crate::{credits, ids, AppState};

pub const DEFAULT_WORKERS: u32 = 256;
pub const DEFAULT_PER_USER: u32 = 128;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(500);
/// How long a stopping server waits for its runs in flight once it told
/// them to stop (see [`Engine::shutdown`]).
pub const RUNS_WAIT: Duration = Duration::from_secs(5);
const WEBHOOK_POLL: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Conversations at once in this server.
    pub workers: u32,
    /// Conversations at once for one user (fairness).
    pub per_user: u32,
    /// How long a claim holds without renewal.
    pub lease: Duration,
    /// Whether agents, LLM endpoints and webhook receivers may be at
    /// private or local addresses (see `outbound`).
    pub allow_private_targets: bool,
    /// Panics a test arms in the engine's own tasks (test builds only).
    #[cfg(feature = "fault-injection")]
    pub faults: Faults,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: DEFAULT_WORKERS,
            per_user: DEFAULT_PER_USER,
            lease: DEFAULT_LEASE,
            allow_private_targets: false,
            #[cfg(feature = "fault-injection")]
            faults: Faults::default(),
        }
    }
}

/// The engine's long-lived tasks, as [`supervised`] and the log name them.
pub const DISPATCHER: &str = "dispatcher";
pub const LEASE_KEEPER: &str = "lease keeper";
pub const WEBHOOK_SENDER: &str = "webhook sender";

/// How long [`supervised`] waits before starting a task again the first
/// time, and at most.
const FIRST_RESTART_WAIT: Duration = Duration::from_secs(1);
const LAST_RESTART_WAIT: Duration = Duration::from_secs(60);

/// Runs the task that `make` makes, and makes it again each time it
/// panics (a defect of ours; the panic itself reaches stderr through the
/// panic hook). Unsupervised, a dispatcher, lease keeper or webhook sender
/// that panicked would stop claiming, renewing or sending until the server
/// restarted, while the API went on taking runs as if all were well. What
/// a task held in memory is gone with it, and what it left is what a
/// restart of the server finds: a run it claimed and did not start
/// expires, and is queued again by the lease keeper; a delivery it did not
/// record is due, and sent again.
///
/// The first restart waits [`FIRST_RESTART_WAIT`], each next one twice as
/// long, up to [`LAST_RESTART_WAIT`]; a task that ran that long before it
/// panicked starts again after the first wait. Returns when the task ends
/// of itself (the webhook sender when told to stop), or when `stop` is
/// cancelled during a wait; aborting the task that runs this drops both.
pub(crate) async fn supervised<F, T>(
    log: slog::Logger,
    task: &'static str,
    stop: Option<CancellationToken>,
    mut make: F,
) where
    F: FnMut() -> T,
    T: std::future::Future<Output = ()>,
{
    let mut wait = FIRST_RESTART_WAIT;
    loop {
        let started = tokio::time::Instant::now();
        if std::panic::AssertUnwindSafe(make()).catch_unwind().await.is_ok() {
            return;
        }
        if started.elapsed() >= LAST_RESTART_WAIT {
            wait = FIRST_RESTART_WAIT;
        }
        slog::error!(log, "an engine task panicked; it starts again";
                     "task" => task, "in_ms" => wait.as_millis() as u64);
        let stopped = async {
            match &stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped => return,
        }
        wait = (wait * 2).min(LAST_RESTART_WAIT);
    }
}

/// Panics that an engine test arms in the engine's own tasks (test builds
/// only: the `fault-injection` feature): each armed task panics once, the
/// next time it has work in hand ([`DISPATCHER`] just after it claimed
/// runs, [`LEASE_KEEPER`] at its next tick, [`WEBHOOK_SENDER`] when it has
/// found deliveries due). Clones share what is armed.
#[cfg(feature = "fault-injection")]
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<Mutex<Vec<&'static str>>>);

#[cfg(feature = "fault-injection")]
impl Faults {
    pub fn arm(&self, task: &'static str) {
        self.0.lock().expect("not poisoned").push(task);
    }

    /// Panics if `task` is armed, disarming it.
    pub(crate) fn fire(&self, task: &str) {
        let mut armed = self.0.lock().expect("not poisoned");
        if let Some(at) = armed.iter().position(|t| *t == task) {
            armed.remove(at);
            drop(armed);
            panic!("a fault injected by a test into the engine's {task}");
        }
    }
}

pub struct Engine {
    config: EngineConfig,
    /// This process's lease owner id.
    owner: String,
    wake: Notify,
    /// Runs in flight here: run id → the call id of its claim and its stop
    /// signal. A run claimed again here while the task of an earlier claim
    /// lives (its lease ran out) has one entry, the later claim's: the
    /// earlier task is stopped, and its end removes nothing of the later's.
    running: Mutex<HashMap<String, (String, CancellationToken)>>,
    http: Outbound,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The task of each run held here (see [`hold`]).
    holding: tokio_util::task::TaskTracker,
    /// The webhook sender and what tells it to stop (see
    /// [`Engine::stop_webhooks`]).
    webhooks: Mutex<Option<(tokio::task::JoinHandle<()>, CancellationToken)>>,
    /// Set by [`Engine::shutdown`] before it stops the runs in flight: a
    /// conversation that ends for that reason is not a cancelled run, and
    /// goes back to the queue.
    stopping: std::sync::atomic::AtomicBool,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        let http = Outbound::new(config.allow_private_targets, usize::try_from(config.workers).unwrap_or(256));
        Engine {
            config,
            owner: ids::new_id("wrk"),
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            http,
            tasks: Mutex::new(Vec::new()),
            holding: tokio_util::task::TaskTracker::new(),
            webhooks: Mutex::new(None),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// This process's lease owner id.
    #[cfg(test)]
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The panics a test armed in the engine's tasks.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn faults(&self) -> &Faults {
        &self.config.faults
    }

    /// Tells the dispatcher that runs may be waiting.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn workers(&self) -> u32 {
        self.config.workers
    }

    /// Whether agents, LLMs and webhook receivers may be at private
    /// addresses (`--allow-private-targets`).
    pub fn allows_private_targets(&self) -> bool {
        self.config.allow_private_targets
    }

    pub fn busy(&self) -> u32 {
        self.running.lock().expect("not poisoned").len() as u32
    }

    /// Stops these runs at their next turn (those running here).
    pub fn cancel_runs(&self, run_ids: &[String]) {
        let running = self.running.lock().expect("not poisoned");
        for id in run_ids {
            if let Some((_, token)) = running.get(id) {
                token.cancel();
            }
        }
    }

    /// Recovers runs of a dead process and starts the tasks.
    pub async fn start(state: Arc<AppState>) -> anyhow::Result<()> {
        let recovered = state.store.write(|tx| queue::requeue_expired(tx, i64::MAX)).await?;
        if recovered > 0 {
            slog::info!(state.log, "requeued runs left running by a stopped server"; "runs" => recovered);
        }
        let engine = state.engine.clone();
        let log = &state.log;
        let tasks = vec![
            tokio::spawn(supervised(log.clone(), DISPATCHER, None, {
                let state = state.clone();
                move || dispatch(state.clone())
            })),
            tokio::spawn(supervised(log.clone(), LEASE_KEEPER, None, {
                let state = state.clone();
                move || keep_leases(state.clone())
            })),
        ];
        engine.tasks.lock().expect("not poisoned").extend(tasks);
        let stop = CancellationToken::new();
        let sender = tokio::spawn(supervised(log.clone(), WEBHOOK_SENDER, Some(stop.clone()), {
            let (state, stop) = (state.clone(), stop.clone());
            let http = Outbound::for_webhooks(engine.config.allow_private_targets);
            move || webhooks::run(state.clone(), http.clone(), WEBHOOK_POLL, stop.clone())
        }));
        *engine.webhooks.lock().expect("not poisoned") = Some((sender, stop));
        engine.wake();
        Ok(())
    }

    /// Stops the tasks and puts the runs in flight back in the queue, and,
    /// side by side, stops the webhook sender (see
    /// [`Engine::stop_webhooks`]): the stop takes the longer of the two
    /// waits, not both.
    ///
    /// No run is claimed from its start: a stopping server starts no call
    /// that it would cut off at its next turn. The runs are told to stop (at their next turn), and then given up
    /// to [`RUNS_WAIT`] to end: one whose conversation was over (being
    /// judged, or its end being written) records its end, rather than be
    /// put back in the queue and held again, its agent called a second
    /// time, after the restart; one stopped mid-call writes nothing, and
    /// goes back to the queue, as does one still in a turn after the wait.
    ///
    /// The runtime has several threads, and aborting a task does not stop
    /// a poll of it under way on another one: the dispatcher may be
    /// between reading how many slots are free and queuing its claim, or
    /// between its claim's answer and putting the runs' tokens in
    /// `running`. So each task is awaited once aborted, which returns only
    /// when the task is dropped: any write it queued (a claim) is then
    /// ahead of `release` in the writer's queue, and `release` puts back
    /// the runs it claimed (it takes every run this owner holds). Nor can
    /// a token be put in `running` after the loop below went through it:
    /// the dispatcher is gone by then, and should it not be, its spawn
    /// path (`hold_claimed`) reads `stopping` under the lock this loop
    /// holds. (A test cannot stop a poll at those points without a hook in
    /// the dispatcher, hence the argument here.)
    pub async fn shutdown(state: &AppState) -> anyhow::Result<()> {
        let (released, ()) = tokio::join!(Engine::stop_runs(state), state.engine.stop_webhooks());
        released
    }

    /// The runs' part of [`Engine::shutdown`].
    async fn stop_runs(state: &AppState) -> anyhow::Result<()> {
        let engine = &state.engine;
        let tasks: Vec<_> = engine.tasks.lock().expect("not poisoned").drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            // Cancelled (or ended by a panic, already logged): either way,
            // dropped.
            let _ = task.await;
        }
        {
            let running = engine.running.lock().expect("not poisoned");
            engine.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            for (_, token) in running.values() {
                token.cancel();
            }
        }
        engine.holding.close();
        if tokio::time::timeout(RUNS_WAIT, engine.holding.wait()).await.is_err() {
            slog::warn!(state.log, "stopping: runs still in a turn go back to the queue";
                        "runs" => engine.busy(), "waited_s" => RUNS_WAIT.as_secs());
        }
        let owner = engine.owner.clone();
        state.store.write(move |tx| queue::release(tx, &owner)).await?;
        Ok(())
    }
}

impl Engine {
    /// Stops the webhook sender: no attempt starts after this, and those
    /// under way are let end (and be recorded) for up to
    /// [`webhooks::STOP_WAIT`] (see [`webhooks::run`]). A stopping server
    /// runs it beside the wait for its requests, so that it adds nothing
    /// to a stop when no receiver is slow; [`Engine::shutdown`] runs it
    /// too (a second call returns at once).
    pub async fn stop_webhooks(&self) {
        let sender = self.webhooks.lock().expect("not poisoned").take();
        if let Some((task, stop)) = sender {
            stop.cancel();
            // Ended by a panic (already logged): gone all the same.
            let _ = task.await;
        }
    }

    /// The stop signal of `run`, just claimed, now in `running`; `None`
    /// once [`Engine::shutdown`] is stopping the runs in flight (then the
    /// run is not held: it would never be stopped). `stopping` is read
    /// under the lock that shutdown holds as it sets it and goes through
    /// `running`, so a token is either put in before (and cancelled there)
    /// or not at all.
    fn hold_claimed(&self, run: &Claimed) -> Option<CancellationToken> {
        let mut running = self.running.lock().expect("not poisoned");
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let token = CancellationToken::new();
        if let Some((_, earlier)) = running.insert(run.run_id.clone(), (run.call_id.clone(), token.clone())) {
            // Its lease ran out and its end will not be recorded.
            earlier.cancel();
        }
        Some(token)
    }
}

async fn dispatch(state: Arc<AppState>) {
    let engine = state.engine.clone();
    loop {
        let free = engine.config.workers.saturating_sub(engine.busy()) as usize;
        let claimed = if free == 0 {
            Vec::new()
        } else {
            let owner = engine.owner.clone();
            let per_user = i64::from(engine.config.per_user);
            let lease_ms = engine.config.lease.as_millis() as i64;
            let claim = move |tx: &rusqlite::Transaction<'_>| -> Result<Vec<Claimed>> {
                Ok(queue::claim(tx, &owner, free, per_user, lease_ms)?)
            };
            match state.store.write(claim).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    slog::warn!(state.log, "claiming runs failed; will retry"; "error" => %e);
                    Vec::new()
                }
            }
        };
        #[cfg(feature = "fault-injection")]
        if !claimed.is_empty() {
            engine.faults().fire(DISPATCHER);
        }
        let full = !claimed.is_empty() && claimed.len() == free;
        for run in claimed {
            let Some(token) = engine.hold_claimed(&run) else {
                // Stopping: `release` puts it back in the queue.
                break;
            };
            let state = state.clone();
            engine.holding.spawn(async move {
                let (run_id, call_id) = (run.run_id.clone(), run.call_id.clone());
                // A panic in the run's task (a defect of ours) would
                // otherwise end the task here with the run still in
                // `running`: its slot taken and its lease renewed for as
                // long as the server runs, its batch run never ending.
                let held = std::panic::AssertUnwindSafe(hold(&state, run.clone(), token)).catch_unwind().await;
                if held.is_err() {
                    end_after_a_panic(&state, &run).await;
                }
                let mut running = state.engine.running.lock().expect("not poisoned");
                if running.get(&run_id).is_some_and(|(held, _)| *held == call_id) {
                    running.remove(&run_id);
                }
                drop(running);
                state.engine.wake();
            });
        }
        if full {
            // There may be more to claim as soon as a slot frees.
            tokio::task::yield_now().await;
        }
        tokio::select! {
            _ = engine.wake.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

async fn keep_leases(state: Arc<AppState>) {
    let engine = state.engine.clone();
    let lease_ms = engine.config.lease.as_millis() as i64;
    let mut tick = tokio::time::interval(engine.config.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        #[cfg(feature = "fault-injection")]
        engine.faults().fire(LEASE_KEEPER);
        let owner = engine.owner.clone();
        // A run claimed but not yet in this list was given a whole lease
        // by its claim.
        let held: Vec<String> = engine.running.lock().expect("not poisoned").keys().cloned().collect();
        let renewed = state
            .store
            .write(move |tx| {
                queue::renew(tx, &owner, &held, lease_ms)?;
                queue::requeue_expired(tx, queue::now_ms())
            })
            .await;
        match renewed {
            Ok(0) => {}
            Ok(n) => {
                slog::info!(state.log, "requeued runs whose lease expired"; "runs" => n);
                engine.wake();
            }
            Err(e) => {
                let e: Failure = e;
                slog::warn!(state.log, "renewing leases failed; will retry"; "error" => %e);
            }
        }
    }
}

/// Everything a run needs from the database, secrets opened.
struct Loaded {
    plan: CallPlan,
    test: types::Test,
    channel_id: String,
    judges: HashMap<String, LlmEndpoint>,
    metadata: Map<String, Value>,
    /// The most the conversation may cost.
    worst_case: i64,
}

impl Loaded {
    /// Every secret value the run sends: the channel's header values and
    /// the LLM keys (see [`super::redact`]).
    fn secrets(&self) -> Vec<&str> {
        let headers = self.plan.agent.headers.iter().map(|(_, value)| value.as_str());
        let llms = self.plan.caller_llm.iter().chain(self.judges.values());
        headers.chain(llms.filter_map(|llm| llm.api_key.as_deref())).collect()
    }
}

/// Why a run could not start, in words for its `error`.
struct Unrunnable(String);

fn load(state: &AppState, tx: &rusqlite::Connection, run: &Claimed) -> Result<Result<Loaded, Unrunnable>> {
    let mut test = match crate::tests::load(tx, &run.test_id) {
        Ok(t) => t,
        Err(Failure::NotFound(_)) => return Ok(Err(Unrunnable("the test was deleted before the run started".into()))),
        Err(e) => return Err(e),
    };
    // The channel and evaluators the test had when the run was queued
    // (none kept for batch runs queued before they were).
    let as_queued: Option<(Option<String>, Option<String>)> = tx
        .prepare_cached("SELECT channel_id, evaluators FROM batch_run_tests WHERE batch_run_id = ?1 AND test_id = ?2")?
        .query_row(params![run.batch_run_id, run.test_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((Some(channel_id), Some(evaluators))) = as_queued {
        test.channel_id = channel_id;
        test.evaluators = serde_json::from_str(&evaluators)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e)))?;
    }
    let scenario = match crate::scenarios::load(tx, &run.scenario_id) {
        Ok(s) => s,
        Err(Failure::NotFound(_)) => {
            return Ok(Err(Unrunnable("the scenario was deleted before the run started".into())))
        }
        Err(e) => return Err(e),
    };
    let persona = match &run.persona_id {
        Some(id) => match crate::personas::load(tx, id) {
            Ok(p) => Some(p),
            Err(Failure::NotFound(_)) => {
                return Ok(Err(Unrunnable(format!("persona `{id}` was deleted before the run started"))))
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let channel = match crate::channels::load(tx, &test.channel_id) {
        Ok(c) => c,
        Err(Failure::NotFound(_)) => {
            return Ok(Err(Unrunnable("the channel was deleted before the run started".into())))
        }
        Err(e) => return Err(e),
    };
    let sealed: Option<Vec<u8>> =
        tx.query_row("SELECT headers FROM channels WHERE id = ?1", params![channel.id], |r| r.get(0))?;
    let headers: Vec<(String, String)> = match sealed {
        None => Vec::new(),
        Some(sealed) => {
            let plain = match state.secrets.open(&sealed, &crate::channels::headers_context(&channel.id)) {
                Ok(p) => p,
                Err(e) => return Ok(Err(Unrunnable(format!("the channel's header values cannot be opened: {e}")))),
            };
            let map: std::collections::BTreeMap<String, String> = serde_json::from_slice(&plain).unwrap_or_default();
            map.into_iter().collect()
        }
    };
    let project_limit: u32 =
        tx.query_row("SELECT max_call_duration_s FROM projects WHERE id = ?1", params![run.project_id], |r| r.get(0))?;
    // Never longer than was priced when the credits were reserved (a limit
    // raised since then would cost more than the reservation covers); a
    // limit lowered since then applies.
    let priced: Option<u32> =
        tx.query_row("SELECT max_duration_s FROM runs WHERE id = ?1", params![run.run_id], |r| r.get(0))?;
    let limit_s = scenario
        .max_duration_s
        .get()
        .min(channel.max_call_duration_s.get())
        .min(project_limit)
        .min(priced.unwrap_or(u32::MAX));

    // Every LLM the run talks to: the simulated caller and the judges.
    let mut wanted = BTreeSet::new();
    if let Some(id) = &scenario.integration_id {
        wanted.insert(id.clone());
    }
    let lists = scenario.steps.iter().map(|s| &s.expect).chain([&scenario.success_criteria, &test.evaluators]);
    for list in lists {
        for e in list {
            if let types::Evaluator::LlmJudge { integration_id, .. } = e {
                wanted.insert(integration_id.clone());
            }
        }
    }
    let mut llms = HashMap::new();
    for id in wanted {
        let row: Option<(String, Option<Vec<u8>>)> = tx
            .query_row("SELECT config, credentials FROM integrations WHERE id = ?1", params![id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((config, sealed)) = row else { continue };
        let config: Map<String, Value> = serde_json::from_str(&config).unwrap_or_default();
        let credentials: Option<Map<String, Value>> = match sealed {
            Some(s) => match state.secrets.open(&s, &crate::integrations::credentials_context(&id)) {
                Ok(plain) => serde_json::from_slice(&plain).ok(),
                Err(e) => {
                    return Ok(Err(Unrunnable(format!("integration `{id}`'s credentials cannot be opened: {e}"))))
                }
            },
            None => None,
        };
        if let Some(llm) = LlmEndpoint::from_integration(&config, credentials.as_ref()) {
            llms.insert(id, llm);
        }
    }
    let metadata: String =
        tx.query_row("SELECT metadata FROM batch_runs WHERE id = ?1", params![run.batch_run_id], |r| r.get(0))?;
    let plan = CallPlan {
        call_id: run.call_id.clone(),
        caller_llm: scenario.integration_id.as_ref().and_then(|id| llms.get(id).cloned()),
        max_turns: scenario.max_turns.get(),
        max_duration: Duration::from_secs(u64::from(limit_s)),
        agent: AgentEndpoint {
            kind: channel.kind,
            target: channel.target.clone(),
            headers,
            turn_timeout: Duration::from_millis(channel.turn_timeout_ms.max(1) as u64),
        },
        scenario,
        persona,
    };
    Ok(Ok(Loaded {
        plan,
        channel_id: channel.id,
        test,
        judges: llms,
        metadata: match serde_json::from_str(&metadata) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        },
        worst_case: credits::worst_case(limit_s),
    }))
}

/// Holds one run: loads it, talks, judges, and records the end.
async fn hold(state: &Arc<AppState>, run: Claimed, token: CancellationToken) {
    let engine = &state.engine;
    let owner = engine.owner.clone();
    // Its batch run may have been cancelled as the run was claimed: after
    // the claim, before the run's token was in `running` for the cancel to
    // find. The token is in `running` before this read begins, so a cancel
    // committed after it finds the token, and one committed before it is
    // seen here.
    let loaded = {
        let state2 = state.clone();
        let run = run.clone();
        state
            .store
            .read(move |tx| {
                if queue::cancel_requested(tx, &run.batch_run_id)? {
                    return Ok(None);
                }
                load(&state2, tx, &run).map(Some)
            })
            .await
    };
    let finished = match loaded {
        Err(e) => {
            // The database failed; leave the lease to expire and the run to
            // be retried.
            slog::error!(state.log, "loading a run failed"; "run_id" => &run.run_id, "error" => %e);
            return;
        }
        // Ended as a queued run is by a cancel: no call, no result, no
        // charge.
        Ok(None) => {
            let why = "cancelled before its call began".to_string();
            end_without_call(state, &run, types::RunStatus::Cancelled, why).await
        }
        Ok(Some(Err(Unrunnable(reason)))) => end_without_call(state, &run, types::RunStatus::Error, reason).await,
        Ok(Some(Ok(loaded))) => {
            let (result, call_made) = converse_and_judge(engine, &run, &loaded, &token).await;
            if result.ended_reason == types::EndedReason::Cancelled
                && engine.stopping.load(std::sync::atomic::Ordering::SeqCst)
            {
                // Stopped by the shutdown, not by a cancel: `queue::release`
                // puts it back in the queue (or ends it, if its batch run
                // was cancelled too), whichever write comes first.
                return;
            }
            let credits = result.credits;
            let status = match (result.ended_reason, result.status) {
                (types::EndedReason::Cancelled, _) => types::RunStatus::Cancelled,
                (_, Some(types::TestResultStatus::Passed)) => types::RunStatus::Passed,
                (_, Some(types::TestResultStatus::Failed)) => types::RunStatus::Failed,
                // `None` only ever marks a result hidden from a blind
                // reviewer; the engine always sets it.
                (_, Some(types::TestResultStatus::Error) | None) => types::RunStatus::Error,
            };
            let run = run.clone();
            state
                .store
                .write(move |tx| {
                    let end = Finish { status, result: Some(&result), error: None, credits, call_made };
                    queue::finish(tx, &owner, &run, end)
                })
                .await
        }
    };
    match finished {
        Ok(true) => {}
        Ok(false) => {
            slog::warn!(state.log, "a run ended after its lease was lost; its result was not recorded";
                        "run_id" => &run.run_id);
        }
        Err(e) => slog::error!(state.log, "recording a run's end failed"; "run_id" => &run.run_id, "error" => %e),
    }
}

/// Ends a run whose task panicked (its panic already written to stderr by
/// the panic hook): as an error, charged nothing, since what it cost is
/// unknown and the fault is ours. Its call id is kept: the agent may have
/// had the call. Written only if the run is still this server's.
async fn end_after_a_panic(state: &Arc<AppState>, run: &Claimed) {
    slog::error!(state.log, "a run's task panicked; the run ends as an error, charged nothing";
                 "run_id" => &run.run_id);
    if let Err(e) = end_without_result(state, run, types::RunStatus::Error, PANICKED.into(), true).await {
        slog::error!(state.log, "recording the end of a run whose task panicked failed";
                     "run_id" => &run.run_id, "error" => %e);
    }
}

/// With the `fault-injection` feature (test builds only), a run of a test
/// whose name starts with this panics after its call, before it is judged:
/// how the engine's tests make a run's task panic.
#[cfg(feature = "fault-injection")]
pub const PANIC_AFTER_THE_CALL: &str = "fault injection: panic after the call";

/// The `error` of a run whose task panicked.
pub const PANICKED: &str = "Sparring failed while running this call (a fault of the service, not of the agent); \
                            the run was not charged";

/// Ends a held run that made no call, and so has no result and costs
/// nothing, saying `why`.
async fn end_without_call(
    state: &Arc<AppState>,
    run: &Claimed,
    status: types::RunStatus,
    why: String,
) -> crate::failure::Result<bool> {
    end_without_result(state, run, status, why, false).await
}

/// Ends a held run with no result, charged nothing, saying `why`; its call
/// id kept when `call_made`.
async fn end_without_result(
    state: &Arc<AppState>,
    run: &Claimed,
    status: types::RunStatus,
    why: String,
    call_made: bool,
) -> crate::failure::Result<bool> {
    let (owner, run) = (state.engine.owner.clone(), run.clone());
    state
        .store
        .write(move |tx| {
            let end = Finish { status, result: None, error: Some(&why), credits: 0, call_made };
            queue::finish(tx, &owner, &run, end)
        })
        .await
}

/// The conversation's result, and whether a call was made (a connection
/// to the agent, which was sent the call id).
async fn converse_and_judge(
    engine: &Engine,
    run: &Claimed,
    loaded: &Loaded,
    token: &CancellationToken,
) -> (types::TestResult, bool) {
    let mut outcome = conversation::converse(&engine.http, &loaded.plan, token).await;
    #[cfg(feature = "fault-injection")]
    if loaded.test.name.starts_with(PANIC_AFTER_THE_CALL) {
        panic!("a fault injected by the test {:?}, after its call", loaded.test.name);
    }
    // What the engine keeps and evaluates from what an agent or an LLM
    // answered holds none of the secrets it was sent with.
    let secrets = loaded.secrets();
    let redaction = super::Redaction::of(&secrets);
    redaction.apply_to_conversation(&mut outcome);
    let evaluated =
        evaluate::evaluate(&engine.http, &loaded.plan.scenario, &loaded.test.evaluators, &outcome, &loaded.judges)
            .await;
    let verdict = evaluate::verdict(&outcome, &evaluated);
    let (status, failure_reason) = if outcome.ended_reason == types::EndedReason::Cancelled {
        let turns = outcome.transcript.len();
        (types::TestResultStatus::Error, Some(format!("cancelled after {turns} turns")))
    } else {
        (verdict.status, verdict.failure_reason)
    };
    let ended_at = outcome.started_at + chrono::Duration::milliseconds(outcome.duration_ms as i64);
    let now = ids::now();
    // What the engine wrote from what an agent or an LLM answered.
    let failure_reason = failure_reason.map(|r| redaction.apply(r));
    let evaluations = evaluated
        .into_iter()
        .map(|e| types::EvaluationResult { reason: redaction.apply(e.result.reason), ..e.result })
        .collect();
    let result = types::TestResult {
        id: ids::new_id("trs"),
        project_id: run.project_id.clone(),
        run_id: run.run_id.clone(),
        batch_run_id: run.batch_run_id.clone(),
        test_id: run.test_id.clone(),
        // The id the agent was sent; none was when it was never reached.
        call_id: outcome.reached_agent.then(|| run.call_id.clone()),
        scenario_id: loaded.plan.scenario.id.clone(),
        scenario_version: loaded.plan.scenario.version,
        persona_id: run.persona_id.clone(),
        channel_id: loaded.channel_id.clone(),
        iteration: std::num::NonZeroU32::new(run.iteration).unwrap_or(std::num::NonZeroU32::MIN),
        status: Some(status),
        score: Some(verdict.score),
        failure_reason,
        ended_reason: outcome.ended_reason,
        started_at: outcome.started_at,
        ended_at,
        duration_ms: outcome.duration_ms as i64,
        transcript: outcome.transcript,
        tool_calls: outcome.tool_calls,
        metrics: outcome.metrics,
        evaluations,
        blinded: None,
        credits: if outcome.reached_agent { credits::cost_of(outcome.duration_ms).min(loaded.worst_case) } else { 0 },
        metadata: loaded.metadata.clone(),
        created_at: now,
        updated_at: now,
    };
    (result, outcome.reached_agent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn quiet() -> slog::Logger {
        slog::Logger::root(slog::Discard, slog::o!())
    }

    /// A task that panics every time is started again after 1, 2, 4, …
    /// seconds, up to a minute, and not again once told to stop; one that
    /// ends of itself is not started again. (Time is tokio's paused clock:
    /// the waits are counted, not slept.)
    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_starts_again_ever_later_until_stopped() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let t0 = tokio::time::Instant::now();
        let supervising = tokio::spawn(supervised(quiet(), "test task", Some(stop.clone()), {
            let starts = starts.clone();
            move || {
                starts.lock().unwrap().push(t0.elapsed().as_secs());
                async { panic!("always") }
            }
        }));
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert_eq!(*starts.lock().unwrap(), [0, 1, 3, 7, 15, 31, 63, 123, 183]);
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(1), supervising).await.expect("stopped in its wait").unwrap();

        let ran = Arc::new(AtomicU32::new(0));
        supervised(quiet(), "test task", None, {
            let ran = ran.clone();
            move || {
                ran.fetch_add(1, Ordering::SeqCst);
                async {}
            }
        })
        .await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    /// A task that ran a minute before it panicked waits the first wait
    /// again, not the last one doubled.
    #[tokio::test(start_paused = true)]
    async fn a_task_that_ran_a_minute_waits_the_first_wait_again() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let t0 = tokio::time::Instant::now();
        let supervising = tokio::spawn(supervised(quiet(), "test task", None, {
            let starts = starts.clone();
            move || {
                let mut starts_now = starts.lock().unwrap();
                starts_now.push(t0.elapsed().as_secs());
                // The third run lasts 90 s before its panic.
                let lasts = if starts_now.len() == 3 { 90 } else { 0 };
                async move {
                    tokio::time::sleep(Duration::from_secs(lasts)).await;
                    panic!("again")
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(99)).await;
        supervising.abort();
        // Its panic at 93 s is followed by the first wait, 1 s, and the
        // next ones by 2 s, 4 s, ….
        assert_eq!(*starts.lock().unwrap(), [0, 1, 3, 94, 96]);
    }
}
