//! `sparring-bench`: the benchmarks behind `cargo xtask bench api` and
//! `cargo xtask bench engine`.
//!
//! - `api`: seeds a fresh data dir, starts `sparring serve` on it and the
//!   baseline beside it, and drives each scenario and the baseline in turn
//!   with wrk; prints the table `BENCHMARKS.md` keeps.
//! - `engine`: the engine's benchmark: a batch of many conversations
//!   against the reference agent (see `engine`).
//! - `baseline`: the bare dropshot server the ratios are taken against.
//!
//! Not part of any test run: CI only compiles it.

mod api;
mod baseline;
mod engine;
mod process;
mod report;
mod scenarios;
mod seed;
mod token;
mod wrk;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sparring-bench", about = "Sparring's API benchmark (run it with `cargo xtask bench api`)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seed, start both servers, run every scenario against the baseline.
    Api(api::Options),
    /// Run a batch of many conversations against the reference agent.
    Engine(engine::Options),
    /// Serve the baseline: a constant JSON object at GET /v1/ping.
    Baseline {
        #[arg(long)]
        bind: SocketAddr,
    },
}

/// The allocator of `sparring serve` (see `src/main.rs`), so that the
/// baseline differs from it only in the work behind each request.
#[global_allocator]
static GLOBAL: sparring_impl::allocator::MiMalloc = sparring_impl::allocator::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Baseline { bind } => baseline::serve(bind),
        Command::Api(options) => {
            tokio::runtime::Runtime::new().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(api::run(options)))
        }
        Command::Engine(options) => {
            tokio::runtime::Runtime::new().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(engine::run(options)))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
