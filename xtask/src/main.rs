//! Project chores: `cargo xtask <verb>`.
//!
//! - `regen [--check]`: generate `server/src/generated.rs` (the dropshot API
//!   trait and its types) and `client/src/generated.rs` (the progenitor
//!   client) from `spec/openapi.json`; with `--check`, fail with a diff when
//!   the checked-in files differ from what the spec generates.
//! - `bench api|engine|auth`: the API benchmark against a bare dropshot
//!   baseline, the engine's benchmark, and the micro-benchmark of
//!   authentication (see `bench.rs`).

mod bench;
mod not_null;
mod regen;
mod routes;
mod server_gen;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Sparring's project chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Regenerate the server trait and the client from spec/openapi.json.
    Regen {
        /// Generate in memory and fail (with a diff) if the files would change.
        #[arg(long)]
        check: bool,
        /// Read this spec instead of spec/openapi.json (for trying a change).
        #[arg(long, hide = true)]
        spec: Option<PathBuf>,
    },
    /// Run a benchmark (not part of CI); figures go in BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// The API under load against a bare dropshot server (release build,
    /// seeded data, wrk). Arguments after `--` go to `sparring-bench api`.
    Api {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The engine: a batch of 1,000 conversations against the reference
    /// agent at 500 ms and 0 ms reply latency (release build). Arguments
    /// after `--` go to `sparring-bench engine`.
    Engine {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The criterion micro-benchmark of authentication; arguments go to
    /// criterion.
    Auth {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn workspace_root() -> PathBuf {
    // xtask/ is one level below the workspace root. `cargo run` sets the
    // variable at run time too, which is right even when the binary was built
    // from another copy of the tree.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let manifest_dir = manifest_dir.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.parent().map(PathBuf::from).unwrap_or_default()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = workspace_root();
    let result = match cli.command {
        Command::Regen { check, spec } => regen::run(&root, spec.as_deref(), check),
        Command::Bench { which: Bench::Api { args } } => bench::api(&root, &args),
        Command::Bench { which: Bench::Engine { args } } => bench::engine(&root, &args),
        Command::Bench { which: Bench::Auth { args } } => bench::auth(&root, &args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
