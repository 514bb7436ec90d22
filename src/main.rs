//! `sparring`: the server binary and its admin commands.
//!
//! `sparring` (or `sparring serve`) serves the API; `sparring admin …` works
//! on a data dir directly, for scripts and bootstrapping.

/// `println!`, but a stdout that cannot be written (a reader that closed it
/// early: `sparring run … | head -n1`, or a full disk) is not an error: what
/// would have been printed is lost, the command's work, report and exit code
/// are not. (`println!` panics there, exit 101; Rust ignores SIGPIPE.) What
/// must be seen or said to be lost, as a new key, is written otherwise.
macro_rules! out {
    () => {{
        let _ = crate::remote::write_stdout(format_args!("\n"));
    }};
    ($($arg:tt)*) => {{
        let _ = crate::remote::write_stdout(format_args!("{}\n", format_args!($($arg)*)));
    }};
}

/// `eprintln!`, but a stderr that cannot be written (the same reader:
/// `sparring run … 2>&1 | head -n1`) is not an error either: the progress
/// and the messages are lost, never the exit code, the report or the cancel
/// of a batch run given up. (`eprintln!` panics there, exit 101.)
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod agent;
mod demo;
mod remote;
mod result;
mod run;
mod signals;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use slog::Drain as _;
use sparring_impl::oidc::IssuerConfig;

#[derive(Parser)]
#[command(name = "sparring", version, about = "Sparring: tests voice-AI agents with simulated callers")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve(ServeArgs),
    /// Serve the reference agent under test (an appointment-booking voice
    /// agent, text only) over the http and websocket channel protocols.
    Agent(agent::AgentConfig),
    /// Show the whole product in one command: a server and reference agents
    /// on a temporary data dir, a project, a batch run with a live progress
    /// bar, and a results table.
    Demo(demo::DemoArgs),
    /// Run a batch, a channel's tests or a test on a Sparring server and wait
    /// for the verdict (the CI gate): exit 0 if every test met its pass
    /// threshold, 1 if not, 2 without a verdict.
    Run(run::RunArgs),
    /// Show one conversation: the verdict and why, the transcript with each
    /// agent reply's latency, the tool calls and every evaluation.
    Result(result::ResultArgs),
    /// Administer a data dir (`create-key` goes through the server running on
    /// it, if one is).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Create an API key for a user (created if needed); prints the raw key
    /// alone on stdout.
    CreateKey {
        /// The server's data dir (one `serve` made: it is not created).
        #[arg(long, env = "SPARRING_DATA_DIR", default_value = "./sparring-data")]
        data_dir: PathBuf,
        /// The user's email (the admin made by the first start is
        /// `admin@localhost`).
        #[arg(long)]
        user: String,
        /// The key's label, as `GET /v1/api-keys` lists it (1 to 100
        /// characters).
        #[arg(long)]
        label: String,
    },
    /// Add credits to a user's ledger (a negative amount takes some away; one
    /// that would go below zero is refused); prints the new balance.
    GrantCredits {
        /// The server's data dir (one `serve` made: it is not created).
        #[arg(long, env = "SPARRING_DATA_DIR", default_value = "./sparring-data")]
        data_dir: PathBuf,
        /// The user's email (the admin made by the first start is
        /// `admin@localhost`), or their id (`usr_…`, as a project's members
        /// list shows it: a user who signed in with no verified email has
        /// none).
        #[arg(long)]
        user: String,
        /// Credits to add; negative to take some away.
        #[arg(long, allow_hyphen_values = true)]
        amount: i64,
        /// What the entry is for, as the ledger shows it [default: "granted
        /// by an administrator", or "taken away by an administrator" for a
        /// negative amount]
        #[arg(long)]
        description: Option<String>,
    },
    /// Copy a data dir into a new directory a server can start on: the
    /// database as of one moment (beside a running server too) and the
    /// secret key. The copy holds everything the data dir does, secrets
    /// included: keep it as safe.
    Backup {
        /// The server's data dir (one `serve` made: it is not created).
        #[arg(long, env = "SPARRING_DATA_DIR", default_value = "./sparring-data")]
        data_dir: PathBuf,
        /// The key file, if not `<data dir>/secret.key`; copied as the
        /// backup's `secret.key`.
        #[arg(long, env = "SPARRING_SECRET_KEY_FILE")]
        secret_key_file: Option<PathBuf>,
        /// Where to write it: a directory that does not exist yet, or is
        /// empty.
        #[arg(long)]
        to: PathBuf,
    },
    /// Make a new secret key and re-seal every stored secret with it, in one
    /// transaction. Run it with the server stopped.
    RotateSecretKey {
        /// The server's data dir (one `serve` made: it is not created).
        #[arg(long, env = "SPARRING_DATA_DIR", default_value = "./sparring-data")]
        data_dir: PathBuf,
        /// The key file, if not `<data dir>/secret.key`.
        #[arg(long, env = "SPARRING_SECRET_KEY_FILE")]
        secret_key_file: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SPARRING_BIND", default_value = "127.0.0.1:8080")]
    bind: SocketAddr,
    /// Where the database and other state live (created if missing; the
    /// admin commands need one that exists).
    #[arg(long, env = "SPARRING_DATA_DIR", default_value = "./sparring-data")]
    data_dir: PathBuf,
    /// Accept ID tokens from this OpenID Connect issuer (repeatable; several
    /// in the variable are separated by commas, as for the two below).
    #[arg(long = "oidc-issuer", env = "SPARRING_OIDC_ISSUER", value_delimiter = ',')]
    oidc_issuers: Vec<String>,
    /// The audience (client id) ID tokens must carry: once for all issuers,
    /// or once per issuer in the same order.
    #[arg(long = "oidc-audience", env = "SPARRING_OIDC_AUDIENCE", value_delimiter = ',')]
    oidc_audiences: Vec<String>,
    /// Read the issuer's keys from this JWKS file instead of discovering them
    /// over HTTP (offline): once per issuer, in the same order.
    #[arg(long = "oidc-jwks", env = "SPARRING_OIDC_JWKS", value_delimiter = ',')]
    oidc_jwks: Vec<PathBuf>,
    /// The key that seals stored secrets (default `<data dir>/secret.key`;
    /// created if missing, unless the database holds secrets sealed with
    /// one: then the server refuses to start without it).
    #[arg(long, env = "SPARRING_SECRET_KEY_FILE")]
    secret_key_file: Option<PathBuf>,
    /// Conversations held at once by this server (they mostly wait on the
    /// network, so hundreds are normal).
    // At most what `GET /queue/stats` can say (`workers`, an int32).
    #[arg(long, env = "SPARRING_WORKERS", default_value_t = sparring_impl::engine::worker::DEFAULT_WORKERS,
          value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    workers: u32,
    /// Conversations held at once for one user, so one user's big batch
    /// cannot starve the others.
    #[arg(long, env = "SPARRING_MAX_CALLS_PER_USER", default_value_t = sparring_impl::engine::worker::DEFAULT_PER_USER,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_calls_per_user: u32,
    /// Credits a new user gets.
    #[arg(long, env = "SPARRING_STARTING_CREDITS", default_value_t = sparring_impl::credits::DEFAULT_STARTING_CREDITS,
          value_parser = clap::value_parser!(i64).range(0..), allow_hyphen_values = true)]
    starting_credits: i64,
    /// How long a worker's claim on a run lasts without renewal, in seconds
    /// (at most a day); runs of a server that died are retried after at
    /// most this long.
    #[arg(long, env = "SPARRING_LEASE_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    lease_seconds: u64,
    /// Let channels, LLM integrations and webhooks reach private and local
    /// addresses (loopback, 10/8, 192.168/16, link-local, …). Off, the
    /// server calls only public addresses, so that its tenants cannot reach
    /// its own network through it; on, for agents on your own machine or
    /// network (development, a private deployment).
    #[arg(long, env = "SPARRING_ALLOW_PRIVATE_TARGETS")]
    allow_private_targets: bool,
    /// Log format: JSON lines (bunyan) or human-readable.
    #[arg(long, env = "SPARRING_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Pretty,
}

impl ServeArgs {
    fn issuers(&self) -> anyhow::Result<Vec<IssuerConfig>> {
        let n = self.oidc_issuers.len();
        let audiences = &self.oidc_audiences;
        if n == 0 && (!audiences.is_empty() || !self.oidc_jwks.is_empty()) {
            anyhow::bail!("--oidc-audience and --oidc-jwks need --oidc-issuer");
        }
        if n > 0 && audiences.len() != 1 && audiences.len() != n {
            anyhow::bail!("give --oidc-audience once, or once per --oidc-issuer ({n})");
        }
        if !self.oidc_jwks.is_empty() && self.oidc_jwks.len() != n {
            anyhow::bail!("give --oidc-jwks once per --oidc-issuer ({n}), or not at all");
        }
        // Trimmed: a list in a variable is often written with spaces after
        // its commas ("https://a, https://b"), and an issuer or audience
        // with one would match no token, silently (an empty audience is
        // refused as the issuers are set up).
        let mut configs = Vec::with_capacity(n);
        for (i, issuer) in self.oidc_issuers.iter().enumerate() {
            let audience = audiences.get(i).unwrap_or(&audiences[0]).trim();
            let jwks_file = self.oidc_jwks.get(i).map(|path| match path.to_str() {
                Some(text) => PathBuf::from(text.trim()),
                None => path.clone(),
            });
            configs.push(IssuerConfig { issuer: issuer.trim().to_string(), audience: audience.to_string(), jwks_file });
        }
        Ok(configs)
    }
}

fn logger(format: LogFormat) -> slog::Logger {
    match format {
        LogFormat::Json => sparring_impl::logging::json_to_stderr(),
        LogFormat::Pretty => {
            let decorator = slog_term::TermDecorator::new().stderr().build();
            sparring_impl::logging::logger(slog_term::FullFormat::new(decorator).build().fuse())
        }
    }
}

/// mimalloc rather than glibc's allocator: a page of tests (50 served
/// documents, ~42 KB) allocates and frees strings of a few hundred bytes to
/// tens of KB on two runtime threads, and glibc spent a tenth of such a
/// request in `malloc`, `free` and `malloc_consolidate` (`perf record`). A/B
/// on fresh copies of the benchmark's data: a page of tests 17–20k → 26k
/// req/s, the 90/10 mix 20–21k → 24k (BENCHMARKS.md). SQLite allocates
/// from mimalloc too (`sparring_impl::store`, `configure_memory`). Through
/// `sparring_impl::allocator`, which takes mimalloc's plain calls for the
/// alignments every block has (see there).
#[global_allocator]
static GLOBAL: sparring_impl::allocator::MiMalloc = sparring_impl::allocator::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `run --junit FILE` with arguments clap refuses still leaves
            // the report a pipeline publishes, saying why nothing ran.
            if e.use_stderr() {
                run::report_bad_arguments(std::env::args_os().skip(1), &e.render().to_string());
            }
            e.exit()
        }
    };
    // Every conversation in flight holds a socket (two for the demo's own
    // agent), and the default soft limit of many systems (1024) is below
    // what `--workers` allows; the hard limit is what the system grants.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        say!("warning: could not raise the open-file limit: {e}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            say!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => serve(cli.serve).await,
            Some(Command::Serve(args)) => serve(args).await,
            Some(Command::Admin { command }) => admin(command).await,
            Some(Command::Agent(config)) => run_agent(config).await,
            Some(Command::Demo(args)) => demo::run(args).await,
            Some(Command::Run(args)) => return Ok(run::main(args).await),
            Some(Command::Result(args)) => result::main(args).await,
        }
        .map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // Not `eprintln!`: with stderr closed (`… 2>&1 | head -n1`) it
            // panics, and the exit code would be 101, not the failure's.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // From before the server starts: a SIGTERM sent once it logs "serving"
    // shuts it down gracefully, however soon it comes.
    let mut interrupts = signals::Interrupts::listen();
    let log = logger(args.log_format);
    #[allow(clippy::needless_update, reason = "test builds' engine has a field more, its faults")]
    let engine = sparring_impl::engine::worker::EngineConfig {
        workers: args.workers,
        per_user: args.max_calls_per_user,
        lease: std::time::Duration::from_secs(args.lease_seconds),
        allow_private_targets: args.allow_private_targets,
        ..Default::default()
    };
    let config = sparring_impl::Config {
        bind: args.bind,
        data_dir: args.data_dir.clone(),
        oidc: args.issuers()?,
        oidc_refetch_interval: sparring_impl::oidc::REFETCH_INTERVAL,
        oidc_keys_max_age: sparring_impl::oidc::KEYS_MAX_AGE,
        secret_key_file: args.secret_key_file.clone(),
        engine,
        starting_credits: args.starting_credits,
        body_idle_timeout: sparring_server::BODY_IDLE_TIMEOUT,
    };
    let server = sparring_impl::start(config, log.clone()).await?;
    let addr = server.local_addr();
    slog::info!(log, "serving"; "address" => %addr, "data_dir" => %args.data_dir.display());
    if let Some(key) = &server.first_start_key {
        // Shown once: only its hash is stored. A stdout that cannot take it
        // (a full disk, a pipe its reader closed) is said, with what to do,
        // rather than a panic that stops the server with the key shown to
        // no one.
        let shown = {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            writeln!(
                stdout,
                "\nA new database was created in {dir}, with an admin user\n\
                 (email {email}, for `sparring admin … --user`) and this API key.\n\
                 It is shown only now; keep it somewhere safe:\n\n    {key}\n\n\
                 Try it:\n\n    curl -H 'x-api-key: {key}' http://{addr}/v1/api-keys\n",
                dir = args.data_dir.display(),
                email = sparring_impl::users::ADMIN_EMAIL,
            )
            .and_then(|()| stdout.flush())
        };
        if let Err(e) = shown {
            slog::error!(log, "the admin user's first API key could not be printed on stdout; make it a key with \
                               `sparring admin create-key --user {} --label LABEL`", sparring_impl::users::ADMIN_EMAIL;
                         "error" => %e);
        }
    }
    let signal = interrupts.recv().await;
    slog::info!(log, "shutting down: finishing in-flight requests"; "signal" => signal);
    // A second signal ends the process at once: what was acknowledged is
    // durable, and a run in flight goes back to the queue when its lease
    // ends, as after a crash. An operator need not wait out the stop (up
    // to its 5 s for requests, the engine's runs and webhooks side by side,
    // then the checkpoint's).
    let forced = log.clone();
    tokio::spawn(async move {
        let signal = interrupts.recv().await;
        slog::warn!(forced, "stopping at once: a second signal came during the stop"; "signal" => signal);
        // The log is written by its own thread; give it a moment.
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::process::exit(if signal == "SIGTERM" { 143 } else { 130 });
    });
    server.shutdown().await
}

async fn run_agent(config: agent::AgentConfig) -> anyhow::Result<()> {
    let mut interrupts = signals::Interrupts::listen();
    let log = logger(LogFormat::Pretty);
    let server = agent::serve(config, log.clone()).await?;
    // Scripts and tests read the address from the first line.
    let addr = server.local_addr();
    // A stdout that cannot take the lines (a full disk, a closed pipe) is
    // said in the log; the agent serves all the same.
    if let Err(e) = remote::write_stdout(format_args!(
        "listening on http://{addr}\nchannel targets: http://{addr}/http (kind http), ws://{addr}/ws (kind websocket)\n"
    )) {
        slog::warn!(log, "could not print the address on stdout; the agent serves all the same";
                    "address" => %addr, "error" => %e);
    }
    interrupts.recv().await;
    server.close().await.map_err(|e| anyhow::anyhow!(e))
}

/// Says on stdout what an admin command did. It is done either way: a
/// reader that closed the pipe had what it wanted, and a stdout that cannot
/// take the line otherwise (a full disk) is an error that says it was done.
fn confirm(done: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    remote::write_stdout(format_args!("{done}\n"))
        .map_err(|e| anyhow::anyhow!("{done} (done, but stdout could not take this line: {e})"))
}

async fn admin(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::CreateKey { data_dir, user, label } => {
            let key = sparring_impl::admin::create_key(&data_dir, user.clone(), label.clone()).await?;
            // `println!` panicked when stdout could not take it (a full
            // disk, a closed pipe), after the key was made: an active key
            // shown to no one. Say so, and which key it is (never the key).
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{key}").and_then(|()| stdout.flush()).map_err(|e| {
                let prefix = sparring_impl::api_keys::display_prefix_of(&key);
                anyhow::anyhow!(
                    "the key was made but could not be printed ({e}): revoke it (for {user}, label {label:?}, \
                     prefix {prefix}; `GET /v1/api-keys` lists it) and make another"
                )
            })
        }
        AdminCommand::GrantCredits { data_dir, user, amount, description } => {
            // As `create-key` keeps it (the lookup is case aside).
            let user = user.trim().to_string();
            let (store, lock) = sparring_impl::open_store_for_admin(&data_dir)?;
            let (user, balance) = sparring_impl::credits::admin_grant_async(&store, user, amount, description).await?;
            // Beside a running server, its own checkpoints and stop do it.
            if lock.is_some() {
                sparring_impl::leave_database_whole(&store).await;
            }
            confirm(format_args!("{user} now has {balance} credits"))
        }
        AdminCommand::Backup { data_dir, secret_key_file, to } => {
            let (from, into) = (data_dir.clone(), to.clone());
            // A large database takes a while to copy: said before it starts.
            let backing_up = format!("backing up {} to {}", data_dir.display(), to.display());
            let copying = move |bytes: u64| say!("{backing_up} (copying {:.1} MB) …", bytes as f64 / 1e6);
            let made = tokio::task::spawn_blocking(move || {
                sparring_impl::backup::backup(&from, secret_key_file, &into, copying)
            })
            .await??;
            confirm(format_args!(
                "backed up {} to {}: {:.1} MB of database at schema version {}, {} sealed secrets, {}",
                data_dir.display(),
                to.display(),
                made.database_bytes as f64 / 1e6,
                made.schema_version,
                made.sealed,
                if made.with_key { "with the secret key (keep the backup as safe)" } else { "no secret key" }
            ))
        }
        AdminCommand::RotateSecretKey { data_dir, secret_key_file } => {
            let n = sparring_impl::rotate_secret_key(&data_dir, secret_key_file).await?;
            confirm(format_args!("re-sealed {n} stored secrets with a new secret key"))
        }
    }
}
