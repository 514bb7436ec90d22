//! `sparring-bench api`: the whole benchmark run.
//!
//! 1. A fresh data dir under the work dir (on the same disk as the build, so
//!    `synchronous = FULL` pays for a real fsync).
//! 2. `sparring serve` on it; keys, projects and tests through the API; the
//!    server stopped; test results inserted by SQL (see `seed`).
//! 3. `sparring serve` started again (so its peak RSS is the load's, not
//!    the seeding's) beside the baseline, each scenario checked once.
//! 4. Warm-up, then `rounds` rounds: in each, for every scenario, the
//!    baseline and then the scenario, `duration` each. A ratio is taken
//!    between the two runs next to each other, so a machine that slows down
//!    for a while slows both. During every run of the server its data dir
//!    is held in memory (see `Pinned`).
//! 5. The table: medians over the rounds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::process::{self, free_port, Log, Server};
use crate::report::{Report, Row, RunPair};
use crate::scenarios::{self, Scenario};
use crate::seed::{self, Scale, Seeded};
use crate::wrk::{self, Load};
use crate::{report, token};

#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The `sparring` binary (a release build).
    #[arg(long)]
    sparring: PathBuf,
    /// Where the data dir, scripts and results go (emptied first).
    #[arg(long, default_value = "target/bench-api")]
    work_dir: PathBuf,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per wrk run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Seconds of warm-up per scenario and for the baseline.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    #[arg(long, default_value_t = 64)]
    connections: u32,
    /// wrk threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Only these scenarios (comma-separated: keys, bearer, test, list,
    /// result, post, mix).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// For working on the server: reuse the data seeded by an earlier run
    /// in the same work dir (copied, so the seeded data stays as it was)
    /// instead of seeding anew. The figures in BENCHMARKS.md never use it.
    #[arg(long)]
    reuse_seed: bool,
    #[command(flatten)]
    scale: Scale,
}

const SUBJECT: &str = "bench-user";

fn sparring_command(o: &Options, data_dir: &Path, jwks: &Path, port: u16) -> Command {
    let mut c = Command::new(&o.sparring);
    c.arg("serve")
        .arg("--bind")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--oidc-issuer", token::ISSUER, "--oidc-audience", token::AUDIENCE, "--oidc-jwks"])
        .arg(jwks)
        .args(["--log-format", "json"]);
    c
}

/// Copies the seeded data dir to `to`, and returns once both are on disk.
/// A copy left to the kernel's writeback (~700 MB, and as much again from
/// the seeding) is written out during the runs instead, and an fsync of the
/// server's WAL then waits behind it: ext4 commits one journal for every
/// file. Measured: a `POST` answered after 390 ms, against 13 ms at most on
/// a copy synced first (BENCHMARKS.md).
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let copy = to.join(entry.file_name());
        std::fs::copy(entry.path(), &copy)?;
        for path in [entry.path(), copy] {
            std::fs::File::open(&path)?.sync_all().with_context(|| format!("syncing {}", path.display()))?;
        }
    }
    std::fs::File::open(to)?.sync_all()?;
    Ok(())
}

/// The data dir's files mapped and locked in memory by this process while
/// the server runs under load, so its reads find the database in the page
/// cache.
///
/// This VM runs DAMON proactive reclaim (`/sys/kernel/mm/damon/admin`: a
/// `pageout` scheme for memory accessed at most once in 5 s for 30 s, up to
/// 2 GB/s), so database pages a scenario does not touch are paged out while
/// others run: 1.2 GB of cached database fell to 77 MB in 50 s idle, and
/// `GET /v1/test-results/{id}` on a cold cache served 3,300 req/s against
/// 27,700 warm, every miss a disk read on a runtime worker. Reading the
/// files just before each run was not enough: result reads late in a run
/// still fell to 0.19 of the baseline with a p99 of 205 ms. A server with
/// this database on a machine with this much free memory keeps it cached;
/// the benchmark measures that server. The pages are the page cache's, not
/// the server's: its peak RSS does not include them.
struct Pinned {
    _maps: Vec<memmap2::Mmap>,
}

impl Pinned {
    fn data_dir(data_dir: &Path) -> anyhow::Result<Pinned> {
        let mut maps = Vec::new();
        for entry in std::fs::read_dir(data_dir)? {
            let path = entry?.path();
            let meta = std::fs::metadata(&path)?;
            if !meta.is_file() || meta.len() == 0 {
                continue;
            }
            let file = std::fs::File::open(&path)?;
            // SAFETY: the mapping is only locked, never read through; a
            // file the server shortens meanwhile (the WAL) is not touched.
            let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }
                .with_context(|| format!("mapping {}", path.display()))?;
            map.lock().with_context(|| format!("locking {} in memory (mlock)", path.display()))?;
            maps.push(map);
        }
        Ok(Pinned { _maps: maps })
    }
}

/// Seeds `seed_dir` from nothing (see `seed`); returns what it made.
async fn seed_fresh(o: &Options, seed_dir: &Path, jwks: &Path, id_token: &str) -> anyhow::Result<Seeded> {
    let data_dir = seed_dir.join("data");
    let port = free_port()?;
    let log = seed_dir.join("seeding-server.log");
    println!("seeding {} …", data_dir.display());
    let server = Server::spawn(
        "sparring (seeding)",
        sparring_command(o, &data_dir, jwks, port),
        format!("127.0.0.1:{port}").parse()?,
        Log::File(&log),
        "/v1/openapi.json",
    )
    .await?;
    let mut seeded = seed::via_api(&format!("http://{}", server.addr), id_token, SUBJECT, &o.scale).await?;
    server.stop()?;

    let t = Instant::now();
    match seed::results::insert(&data_dir, &seeded, &o.scale)? {
        Some(ids) => {
            let secs = t.elapsed().as_secs_f64();
            seeded.timings.push((
                format!(
                    "{} test results, {} turns each (SQL, {:.0}/s)",
                    ids.len(),
                    o.scale.turns,
                    ids.len() as f64 / secs
                ),
                secs,
            ));
            seeded.result_ids = ids;
        }
        None => println!("this build has no test_results table: the test-result scenario is pending"),
    }
    for (what, secs) in &seeded.timings {
        println!("  seeded {what} in {secs:.1} s");
    }
    std::fs::write(seed_dir.join("manifest.json"), serde_json::to_vec_pretty(&seeded)?)?;
    Ok(seeded)
}

/// Sends a scenario's check request; fails unless it is answered as
/// expected.
async fn check(base: &str, s: &Scenario) -> anyhow::Result<()> {
    let Some(c) = &s.check else { return Ok(()) };
    let mut req = reqwest::Client::new().request(c.method.clone(), format!("{base}{}", c.path));
    for (k, v) in &c.headers {
        req = req.header(*k, v);
    }
    if let Some(body) = &c.body {
        req = req.json(body);
    }
    let resp = req.send().await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "{}: {} {} answered {status}: {text}", s.title, c.method, c.path);
    (c.expect)(&serde_json::from_str(&text)?).with_context(|| format!("{}: {} {}", s.title, c.method, c.path))
}

/// Runs `load` against `server`, noting the server's CPU time per request
/// (in all and by thread) and how idle the machine was.
fn measured(server: &Server, load: impl FnOnce() -> anyhow::Result<wrk::Outcome>) -> anyhow::Result<wrk::Outcome> {
    let (before, threads_before, machine_before) =
        (server.cpu_seconds()?, server.cpu_seconds_by_thread()?, process::machine_ticks()?);
    let mut outcome = load()?;
    let (after, threads_after, machine_after) =
        (server.cpu_seconds()?, server.cpu_seconds_by_thread()?, process::machine_ticks()?);
    let per_request = |seconds: f64| seconds * 1e6 / outcome.requests.max(1) as f64;
    outcome.server_cpu_us = per_request(after - before);
    outcome.server_cpu_us_by_thread = threads_after
        .iter()
        .map(|(name, s)| (name.clone(), per_request(s - threads_before.get(name).copied().unwrap_or(0.0))))
        .filter(|(_, us)| *us > 0.0)
        .collect();
    let (idle, all) = (machine_after.0 - machine_before.0, machine_after.1 - machine_before.1);
    outcome.machine_idle = idle as f64 / all.max(1) as f64;
    Ok(outcome)
}

pub async fn run(o: Options) -> anyhow::Result<()> {
    let sparring = std::fs::canonicalize(&o.sparring).with_context(|| format!("{}", o.sparring.display()))?;
    let o = Options { sparring, ..o };
    std::fs::create_dir_all(&o.work_dir)?;
    let work = std::fs::canonicalize(&o.work_dir)?;
    let seed_dir = work.join("seeded");
    let run_dir = work.join("run");
    let jwks = work.join("jwks.json");
    token::write_jwks(&jwks)?;
    // Valid for the whole run, however long.
    let id_token = token::sign(SUBJECT, chrono::Duration::hours(12))?;

    let seeded = if o.reuse_seed && seed_dir.join("manifest.json").exists() {
        println!("reusing the data seeded in {}", seed_dir.display());
        serde_json::from_slice(&std::fs::read(seed_dir.join("manifest.json"))?)?
    } else {
        if seed_dir.exists() {
            std::fs::remove_dir_all(&seed_dir)?;
        }
        std::fs::create_dir_all(&seed_dir)?;
        seed_fresh(&o, &seed_dir, &jwks, &id_token).await?
    };
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)?;
    }
    let data_dir = run_dir.join("data");
    copy_dir(&seed_dir.join("data"), &data_dir)?;
    let files = scenarios::write_data_files(&run_dir, &seeded)?;

    let mut all = scenarios::all(&seeded, &id_token, &files, &o.scale)?;
    if !o.only.is_empty() {
        all.retain(|s| o.only.iter().any(|k| k == s.key));
        anyhow::ensure!(!all.is_empty(), "--only {} names no scenario", o.only.join(","));
    }
    let baseline_script = run_dir.join("baseline.lua");
    std::fs::write(&baseline_script, wrk::script(&scenarios::baseline(&files)?))?;
    let mut scripts = Vec::new();
    for s in &all {
        let path = run_dir.join(format!("{}.lua", s.key));
        std::fs::write(&path, wrk::script(&s.lua))?;
        scripts.push(path);
    }

    // The servers under load.
    let port = free_port()?;
    let sparring = Server::spawn(
        "sparring",
        sparring_command(&o, &data_dir, &jwks, port),
        format!("127.0.0.1:{port}").parse()?,
        Log::Discard,
        "/v1/openapi.json",
    )
    .await?;
    let bport = free_port()?;
    let mut bcmd = Command::new(std::env::current_exe()?);
    bcmd.args(["baseline", "--bind", &format!("127.0.0.1:{bport}")]);
    let baseline =
        Server::spawn("baseline", bcmd, format!("127.0.0.1:{bport}").parse()?, Log::Discard, "/v1/ping").await?;

    let base = format!("http://{}", sparring.addr);
    for s in &all {
        check(&base, s).await?;
    }

    let load = |secs: u64| Load { connections: o.connections, threads: o.threads, duration: Duration::from_secs(secs) };
    println!(
        "warming up ({} s per scenario), then {} rounds of {} s per run at {} connections ({} wrk threads)",
        o.warmup, o.rounds, o.duration, o.connections, o.threads
    );
    if o.warmup > 0 {
        wrk::run(baseline.addr, &baseline_script, load(o.warmup))?;
        for path in &scripts {
            let _pinned = Pinned::data_dir(&data_dir)?;
            wrk::run(sparring.addr, path, load(o.warmup))?;
        }
    }

    let mut pairs: Vec<Vec<RunPair>> = all.iter().map(|_| Vec::new()).collect();
    let mut baseline_peak = 0;
    for round in 1..=o.rounds {
        for (i, s) in all.iter().enumerate() {
            baseline.reset_peak()?;
            let b = measured(&baseline, || wrk::run(baseline.addr, &baseline_script, load(o.duration)))?;
            baseline_peak = baseline_peak.max(baseline.peak_rss_kib()?);
            sparring.reset_peak()?;
            let pinned = Pinned::data_dir(&data_dir)?;
            let r = measured(&sparring, || wrk::run(sparring.addr, &scripts[i], load(o.duration)))
                .with_context(|| format!("round {round}: {}", s.title))?;
            drop(pinned);
            let peak_kib = sparring.peak_rss_kib()?;
            println!(
                "  round {round} {:<40} {:>6.0} req/s (baseline {:>6.0}, ratio {:.2})  p50 {:.2} ms  p99 {:.2} ms  \
                 CPU {:.0} µs/req (baseline {:.0})  peak RSS {:.0} MB  idle {:.1} % (baseline {:.1} %)  [{}]",
                s.title,
                r.rps(),
                b.rps(),
                r.rps() / b.rps(),
                r.p50_us as f64 / 1e3,
                r.p99_us as f64 / 1e3,
                r.server_cpu_us,
                b.server_cpu_us,
                peak_kib as f64 / 1024.0,
                r.machine_idle * 100.0,
                b.machine_idle * 100.0,
                report::by_thread(&r.server_cpu_us_by_thread)
            );
            pairs[i].push(RunPair { baseline: b, scenario: r, peak_rss_kib: peak_kib });
        }
    }
    sparring.stop()?;
    drop(baseline);

    let rows = all.iter().zip(pairs).map(|(s, runs)| Row::new(s.title, s.target, runs)).collect();
    let report = Report {
        rows,
        baseline_peak_rss_kib: baseline_peak,
        seeding: seeded.timings.clone(),
        load: format!(
            "wrk, {} connections, {} threads, {} rounds of {} s per scenario, each after a {} s baseline run",
            o.connections, o.threads, o.rounds, o.duration, o.duration
        ),
        pending: if seeded.result_ids.is_empty() { vec!["GET /v1/test-results/{id}".into()] } else { vec![] },
    };
    let text = report::render(&report);
    println!("\n{text}");
    std::fs::write(work.join("results.md"), &text)?;
    std::fs::write(work.join("results.json"), serde_json::to_vec_pretty(&report)?)?;
    println!("(also in {})", work.join("results.md").display());
    Ok(())
}
