//! The Sparring server: the implementation of the generated API trait.
//!
//! A request flows: dropshot → the generated `*_endpoint` in
//! `sparring-server` (authenticates with [`auth`], unpacks and bridges the
//! path) → the method of [`http::ServerImpl`] named after the operation →
//! a domain module, which owns its SQL and runs it through [`store`].
//!
//! Where to go for an endpoint:
//! - API keys (`/api-keys…`): [`http`] → [`api_keys`].
//! - Authentication (every operation): [`auth`], [`oidc`], [`users`].
//! - Activity records written by mutations: [`activity`].
//! - Lists: [`pagination`]. Who may do what in a project: [`access`].
//! - Input parsing shared by resources: [`validate`]; the domain's error:
//!   [`failure`]; secrets at rest: [`secrets`].
//! - Projects and their members: [`projects`]; the testing model:
//!   [`integrations`], [`channels`], [`personas`], [`scenarios`], [`tests`],
//!   [`batches`] (evaluators parsed by [`evaluators`]).
//! - Starting and reading batch runs, runs, results and queue statistics:
//!   [`runs`]; the conversations themselves: [`engine`]; the ledger:
//!   [`credits`]; human review and calibration: [`reviews`].
//! - A feature not built yet (runs over `phone` and `sip` channels) answers
//!   501 `not_implemented` (`Failure::Unsupported`).

pub mod access;
pub mod activity;
pub mod admin;
pub mod allocator;
// The unit tests count what each thread allocates (`allocator::counting`).
#[cfg(test)]
#[global_allocator]
static COUNTING: allocator::counting::Counting = allocator::counting::Counting;
pub mod api_keys;
pub mod auth;
pub mod backup;
pub mod batches;
pub mod channels;
pub mod credits;
pub mod engine;
pub mod evaluators;
pub mod failure;
pub mod http;
pub mod ids;
pub mod integrations;
pub mod key_cache;
pub mod logging;
pub mod oidc;
pub mod pagination;
pub mod personas;
pub mod projects;
pub mod reseal;
pub mod reviews;
pub mod runs;
pub mod scenarios;
pub mod secrets;
pub mod store;
pub mod test_cache;
pub mod tests;
pub mod users;
pub mod validate;
mod wal_writes;
pub mod written;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use dropshot::{ConfigDropshot, HandlerTaskMode, HttpServer, ServerBuilder};
use sparring_server::ApiContext;

use crate::api_keys::RawKey;
use crate::auth::LastUsed;
use crate::engine::worker::{Engine, EngineConfig};
use crate::oidc::{IssuerConfig, Oidc};
use crate::secrets::Secrets;
use crate::store::Store;

/// The largest request body accepted (413 above it).
pub const REQUEST_BODY_MAX_BYTES: usize = 1024 * 1024;
pub const DATABASE_FILE: &str = "sparring.db";

#[derive(Clone, Debug)]
pub struct Config {
    pub bind: SocketAddr,
    pub data_dir: PathBuf,
    pub oidc: Vec<IssuerConfig>,
    /// The least time between two fetches of an issuer's keys
    /// ([`oidc::REFETCH_INTERVAL`] in the server).
    pub oidc_refetch_interval: std::time::Duration,
    /// How long an issuer's fetched keys are trusted before they are
    /// fetched again ([`oidc::KEYS_MAX_AGE`] in the server).
    pub oidc_keys_max_age: std::time::Duration,
    /// The secret key sealing stored secrets; `<data dir>/secret.key` if
    /// not given.
    pub secret_key_file: Option<PathBuf>,
    /// Workers, per-user limit and leases of the run queue.
    pub engine: EngineConfig,
    /// Credits a new user gets.
    pub starting_credits: i64,
    /// How long a request body may go without a byte before the request is
    /// a 408 ([`sparring_server::BODY_IDLE_TIMEOUT`] in the server).
    pub body_idle_timeout: std::time::Duration,
}

impl Config {
    pub fn secret_key_path(&self) -> PathBuf {
        self.secret_key_file.clone().unwrap_or_else(|| self.data_dir.join(secrets::KEY_FILE))
    }
}

/// Everything a request handler can reach.
pub struct AppState {
    pub store: Store,
    pub secrets: Secrets,
    pub oidc: Oidc,
    pub last_used: LastUsed,
    /// API keys already found valid (see `key_cache`).
    pub keys: key_cache::KeyCache,
    /// First pages of keys, while current (see `api_keys::list`).
    pub key_pages: api_keys::KeyPages,
    /// Tests, projects' newest tests and members' roles, for `GET
    /// /v1/tests/{id}` and the first page of a project's tests (see
    /// `test_cache`); made with [`test_cache::TestCache::watching`] on
    /// `store`.
    pub test_cache: test_cache::TestCache,
    /// The results in open calibrations, for `GET /v1/test-results/{id}`
    /// (see `reviews::blind::InOpenCalibrations`).
    pub in_open_calibrations: reviews::blind::InOpenCalibrations,
    /// (issuer, subject) → the user, for users already signed in. Public
    /// only so that `benches/auth.rs` can build an `AppState` without a
    /// server; nothing outside `auth` reads or writes it.
    pub oidc_users: Mutex<HashMap<(String, String), users::SignedIn>>,
    pub engine: Arc<Engine>,
    pub log: slog::Logger,
}

/// Creates `data_dir` if it is missing, readable by its owner only: it holds
/// transcripts, emails and the secret key. An existing one keeps the mode
/// its operator gave it.
pub fn create_data_dir(data_dir: &std::path::Path) -> anyhow::Result<()> {
    if data_dir.exists() && !data_dir.is_dir() {
        anyhow::bail!("data dir {} is not a directory", data_dir.display());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        builder.mode(0o700);
    }
    builder.create(data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))
}

/// Opens (creating if needed) the database in `data_dir`.
pub fn open_store(data_dir: &std::path::Path) -> anyhow::Result<Store> {
    create_data_dir(data_dir)?;
    let path = data_dir.join(DATABASE_FILE);
    // A new database is readable by its owner only, whatever the data
    // dir's mode (a volume made 0755): SQLite gives its `-wal` and `-shm`
    // files the database file's mode.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("creating database {}", path.display()))
            }
            _ => {}
        }
        // SQLite opens a file it may not write read-only, without a word,
        // and the first write then fails naming no file.
        if let Err(e) = std::fs::OpenOptions::new().write(true).open(&path) {
            return Err(e).with_context(|| {
                format!("database {} cannot be written by this user (its mode, owner or file system)", path.display())
            });
        }
    }
    Store::open(&path).with_context(|| format!("opening database {}", path.display()))
}

/// What opening `data_dir`'s database will do to it, to say before it is
/// done (a long migration must not look like a hang): `None` for a new
/// database, made at once, or one at this build's schema. What the version
/// cannot be read for, opening the store says.
pub fn migration_ahead(data_dir: &std::path::Path) -> Option<String> {
    let found = store::schema_version(&data_dir.join(DATABASE_FILE)).ok()?;
    (found > 0 && found < store::SCHEMA_VERSION)
        .then(|| format!("migrating the database from schema version {found} to {}", store::SCHEMA_VERSION))
}

/// [`open_store`] for an admin command run in a terminal, which says on
/// stderr what [`migration_ahead`] finds before doing it.
pub fn open_store_saying_so(data_dir: &std::path::Path) -> anyhow::Result<Store> {
    if let Some(migrating) = migration_ahead(data_dir) {
        eprintln!("{migrating} …");
    }
    open_store(data_dir)
}

/// Refuses a data dir with no database: an admin command works on the data
/// dir of a server, and one that made a new database (a typo, another
/// working directory than the server's) would hand out keys that work
/// nowhere. Only `serve` creates a data dir.
pub fn require_data_dir(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let path = data_dir.join(DATABASE_FILE);
    if !path.is_file() {
        anyhow::bail!(
            "no database at {}: is {dir} a data dir? (start `sparring serve --data-dir {dir}` first)",
            path.display(),
            dir = data_dir.display()
        );
    }
    Ok(())
}

/// The store for an admin command that writes to the database itself, beside
/// a running server or not (SQLite serializes its writes with the server's),
/// and the data dir's lock if no server held it. Beside a running server
/// the database must already be at this build's schema: migrating it would
/// change tables under a server of an older build that still uses them.
pub fn open_store_for_admin(data_dir: &std::path::Path) -> anyhow::Result<(Store, Option<DataDirLock>)> {
    require_data_dir(data_dir)?;
    let lock = try_lock_data_dir(data_dir)?;
    if lock.is_none() {
        let path = data_dir.join(DATABASE_FILE);
        let found = store::schema_version(&path).with_context(|| format!("reading {}", path.display()))?;
        if found < store::SCHEMA_VERSION {
            anyhow::bail!(
                "the server running on {} has an older schema (version {found}) than this build's ({}); \
                 restart it with this build first, or stop it",
                data_dir.display(),
                store::SCHEMA_VERSION
            );
        }
    }
    Ok((open_store_saying_so(data_dir)?, lock))
}

/// Empties the WAL into `sparring.db` once an admin command has written to a
/// data dir no server runs on (it holds the data dir's lock), as a server's
/// stop does ([`Store::checkpoint_all`]): the database file alone is then
/// whole, and a copy of it with the key file a backup. The WAL was left
/// holding the command's writes, `admin rotate-secret-key`'s re-sealed
/// secrets among them: such a copy held the old sealing beside the new key.
/// Not emptied (a reader such as a `sqlite3` shell holds it), nothing is
/// lost: the WAL stays and the next open reads it; that is said on stderr.
pub async fn leave_database_whole(store: &Store) {
    let store = store.clone();
    let emptied = tokio::task::spawn_blocking(move || store.checkpoint_all()).await;
    if let Some(e) = match emptied {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(e.to_string()),
    } {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "warning: the write is done, but the database's WAL could not be emptied into its file ({e}): copy \
             the `-wal` file with the database, or use `sparring admin backup`"
        );
    }
}

/// Held by whatever owns a data dir exclusively (the server, a key
/// rotation): two servers on one database, or a rotation under a running
/// server that still holds the old key, would corrupt it.
pub struct DataDirLock {
    _file: std::fs::File,
}

pub const LOCK_FILE: &str = "sparring.lock";

pub fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<DataDirLock> {
    try_lock_data_dir(data_dir)?.ok_or_else(|| {
        anyhow::anyhow!("{} is in use by another sparring process (a running server?)", data_dir.display())
    })
}

/// [`lock_data_dir`], or `None` if another process holds the lock.
pub fn try_lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<Option<DataDirLock>> {
    create_data_dir(data_dir)?;
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(DataDirLock { _file: file })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// `sparring admin rotate-secret-key`: a new secret key, and every stored
/// secret re-sealed with it in one transaction (see `secrets::rotate`). The
/// server must be stopped.
pub async fn rotate_secret_key(data_dir: &std::path::Path, key_file: Option<PathBuf>) -> anyhow::Result<usize> {
    require_data_dir(data_dir)?;
    let _lock = lock_data_dir(data_dir)?;
    let store = open_store_saying_so(data_dir)?;
    let key_path = key_file.unwrap_or_else(|| data_dir.join(secrets::KEY_FILE));
    if !key_path.exists() {
        let sealed = store.read_blocking(|c| reseal::count_sealed(c).map_err(store::StoreError::from))?;
        if sealed > 0 {
            anyhow::bail!(
                "no secret key at {}, but the database holds {sealed} secrets sealed with one: give the key file \
                 the server uses with --secret-key-file",
                key_path.display()
            );
        }
        anyhow::bail!("no secret key at {}: nothing was ever sealed with it", key_path.display());
    }
    let sealing = store.clone();
    let resealed = tokio::task::spawn_blocking(move || {
        // The key files are written around this one transaction.
        secrets::rotate(&key_path, |secrets| sealing.write_blocking(|tx| reseal::reseal_all(tx, secrets)))
    })
    .await??;
    leave_database_whole(&store).await;
    Ok(resealed)
}

/// How long a stop waits for the requests in flight: ours answer in
/// milliseconds; what is still in flight after this is a client that stopped
/// sending its request or reading its answer.
pub const REQUESTS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct RunningServer {
    _lock: DataDirLock,
    server: HttpServer<ApiContext>,
    state: Arc<AppState>,
    flusher: tokio::task::JoinHandle<()>,
    /// Answers `sparring admin` commands run beside the server (see
    /// `admin`), and its socket's path.
    admin: Option<(tokio::task::JoinHandle<()>, tokio_util::task::TaskTracker, PathBuf)>,
    /// On the first start of a fresh database: the admin's API key, to show
    /// once.
    pub first_start_key: Option<String>,
}

impl RunningServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Stops accepting connections and lets in-flight requests finish (for
    /// up to [`REQUESTS_WAIT`]) while, side by side, the engine stops (see
    /// [`Engine::shutdown`]: no run is claimed any more, the runs in flight
    /// stop at their next turn and are let end for up to
    /// [`engine::worker::RUNS_WAIT`], those whose conversation was over
    /// recording it, the others going back to the queue; webhook attempts
    /// under way are let end for up to [`engine::webhooks::STOP_WAIT`]),
    /// closes the admin socket, writes pending
    /// `last_used_at` times, and empties the WAL into the database file
    /// (see [`Store::checkpoint_all`]). A step that fails does not skip
    /// the ones after it: the stop goes to its end, then gives the first
    /// error (and logs any later one).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let mut failed: Vec<anyhow::Error> = Vec::new();
        // A client that stops sending its request halfway (or reading its
        // answer) would otherwise hold the stop for as long as it likes, and
        // a stop that never ends is ended with SIGKILL: the runs in flight
        // then wait out their leases, the last uses of keys are lost, and the
        // WAL is left. A request still being sent when cut off here was
        // never run; an answer not read, cut off, was already written.
        // Beside it, the engine stops: the webhook attempts and the runs
        // under way are let end (and be recorded) for up to as long, and no
        // other starts.
        let (closed, stopped) =
            tokio::join!(tokio::time::timeout(REQUESTS_WAIT, self.server.close()), Engine::shutdown(&self.state));
        match closed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(anyhow::anyhow!(e).context("closing the HTTP server")),
            Err(_) => slog::warn!(self.state.log, "stopping: requests still in flight are cut off";
                                  "waited_s" => REQUESTS_WAIT.as_secs()),
        }
        if let Err(e) = stopped {
            // The runs it could not put back are requeued by the next
            // start, as after a crash.
            failed.push(e.context("stopping the engine"));
        }
        self.flusher.abort();
        if let Some((task, answering, path)) = self.admin {
            task.abort();
            // Ended (not just asked to end) before the drain, so that no
            // connection is accepted after it began.
            let _ = task.await;
            let _ = std::fs::remove_file(path);
            admin::drain(answering, &self.state.log).await;
        }
        if let Err(e) = self.state.last_used.flush(&self.state.store).await {
            failed.push(anyhow::Error::new(e).context("writing last_used_at"));
        }
        let store = self.state.store.clone();
        match tokio::task::spawn_blocking(move || store.checkpoint_all()).await {
            Ok(Ok(())) => {}
            // Nothing is lost: the next open reads the WAL.
            Ok(Err(e)) => slog::warn!(self.state.log, "the WAL was left as it is"; "error" => %e),
            Err(e) => failed.push(anyhow::Error::new(e).context("emptying the WAL")),
        }
        let mut failed = failed.into_iter();
        let Some(first) = failed.next() else { return Ok(()) };
        for later in failed {
            slog::error!(self.state.log, "stopping"; "error" => format!("{later:#}"));
        }
        Err(first)
    }
}

/// How the server's dropshot is configured; public so that the benchmark's
/// baseline (a bare dropshot server, `bench/`) runs with exactly the same.
pub fn dropshot_config(bind: SocketAddr) -> ConfigDropshot {
    ConfigDropshot {
        bind_address: bind,
        default_request_body_max_bytes: REQUEST_BODY_MAX_BYTES,
        // Handlers run to completion even if the client goes away, so a
        // write is never cut off halfway by a disconnect.
        default_handler_task_mode: HandlerTaskMode::Detached,
        ..Default::default()
    }
}

/// The server's routes: the spec's operations and its own document.
fn api_description() -> anyhow::Result<dropshot::ApiDescription<ApiContext>> {
    let mut api = sparring_server::sparring_api_mod::api_description::<http::ServerImpl>()
        .map_err(|e| anyhow::anyhow!("building the API description: {e}"))?;
    api.register(http::openapi_document).map_err(|e| anyhow::anyhow!("registering /v1/openapi.json: {e}"))?;
    Ok(api)
}

pub async fn start(config: Config, log: slog::Logger) -> anyhow::Result<RunningServer> {
    // What the configuration alone decides is checked before the data dir
    // is made: a start refused for a mistyped flag leaves no database and
    // no secret key behind (where a mistyped --data-dir pointed, too).
    let oidc = Oidc::new(config.oidc.clone(), config.oidc_refetch_interval, config.oidc_keys_max_age, &log).await?;
    // Bound once and let go (a port taken meanwhile is still said, by the
    // server's own bind below).
    std::net::TcpListener::bind(config.bind)
        .map_err(|e| anyhow::anyhow!("starting the server on {}: {e}", config.bind))?;
    let key_path = config.secret_key_path();
    if let Some(dir) = key_path.parent().filter(|d| *d != config.data_dir && !d.as_os_str().is_empty()) {
        if !key_path.exists() && !dir.is_dir() {
            anyhow::bail!("--secret-key-file {}: no directory {} to make it in", key_path.display(), dir.display());
        }
    }
    let lock = lock_data_dir(&config.data_dir)?;
    // Migrations run as the store opens, before anything else is logged: a
    // long one is said first, so that a start that seems to hang does not.
    if let Some(migrating) = migration_ahead(&config.data_dir) {
        slog::info!(log, "{}", migrating; "database" => %config.data_dir.join(DATABASE_FILE).display());
    }
    let store = open_store(&config.data_dir)?;
    if !key_path.exists() {
        // A new key opens none of what the old one sealed, and the next
        // start would take it for the key: only a database with nothing
        // sealed gets one.
        let sealed = store.read_blocking(|c| reseal::count_sealed(c).map_err(store::StoreError::from))?;
        if sealed > 0 {
            anyhow::bail!(
                "no secret key at {}, but {} holds {sealed} secrets sealed with one: restore the key file (or \
                 give its path with --secret-key-file); a new key would open none of them",
                key_path.display(),
                store.path().display()
            );
        }
    }
    let secrets = Secrets::load_or_create(&key_path)?;
    // A key that opens nothing sealed (another data dir's, a wrong
    // --secret-key-file) would start a server whose every webhook and
    // credentialed call fails.
    let refused = store.read_blocking(|c| reseal::key_opens(c, &secrets).map_err(store::StoreError::from))?;
    if let Some(context) = refused {
        let database = store.path().display().to_string();
        return Err(reseal::wrong_key(&key_path, &database, &context, "(give its path with --secret-key-file)"));
    }
    let starting_credits = config.starting_credits;
    store.write(move |tx| credits::set_starting_credits(tx, starting_credits).map_err(store::StoreError::from)).await?;
    let test_cache = test_cache::TestCache::watching(&store);
    let key_pages = api_keys::KeyPages::watching(&store);
    let in_open_calibrations = reviews::blind::InOpenCalibrations::watching(&store);
    let state = Arc::new(AppState {
        store,
        test_cache,
        in_open_calibrations,
        secrets,
        oidc,
        last_used: LastUsed::default(),
        keys: key_cache::KeyCache::default(),
        key_pages,
        oidc_users: Mutex::new(HashMap::new()),
        engine: Arc::new(Engine::new(config.engine.clone())),
        log: log.clone(),
    });

    let server = ServerBuilder::new(
        api_description()?,
        ApiContext::new(state.clone()).with_body_idle_timeout(config.body_idle_timeout),
        logging::without_route_refusals(&log),
    )
    .config(dropshot_config(config.bind))
    .version_policy(sparring_server::known_routes(api_description()?))
    .start()
    .map_err(|e| {
        // dropshot's message ("failed to bind to ADDR") leaves out why:
        // the cause ("Address already in use") is its source.
        let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
        anyhow::anyhow!("starting the server on {}: {e}{cause}", config.bind)
    })?;

    let flusher = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(LastUsed::FLUSH_EVERY);
            loop {
                tick.tick().await;
                if let Err(e) = state.last_used.flush(&state.store).await {
                    slog::warn!(state.log, "writing last_used_at failed; will retry"; "error" => %e);
                }
            }
        })
    };

    Engine::start(state.clone()).await?;

    // Last of what can fail: the admin's key is shown only by the start
    // that makes it, so a start that failed after making it would lose it.
    let first_start_key = users::bootstrap_admin(&state.store).await?.map(RawKey::expose);

    // Without the socket the server still serves; `sparring admin
    // create-key` beside it then says it cannot reach it.
    let admin = match admin::bind(&config.data_dir) {
        Ok((listener, path)) => {
            let answering = tokio_util::task::TaskTracker::new();
            Some((tokio::spawn(admin::serve(listener, state.clone(), answering.clone())), answering, path))
        }
        Err(e) => {
            slog::warn!(log, "no admin socket: `sparring admin create-key` cannot reach this server"; "error" => format!("{e:#}"));
            None
        }
    };

    Ok(RunningServer { _lock: lock, server, state, flusher, admin, first_start_key })
}

/// A server's configuration for a unit test: on an ephemeral loopback
/// port, no ID-token issuer, the defaults otherwise.
#[cfg(test)]
impl Config {
    pub(crate) fn for_test(data_dir: &std::path::Path, engine: EngineConfig) -> Config {
        Config {
            bind: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.to_path_buf(),
            oidc: Vec::new(),
            oidc_refetch_interval: oidc::REFETCH_INTERVAL,
            oidc_keys_max_age: oidc::KEYS_MAX_AGE,
            secret_key_file: None,
            engine,
            starting_credits: 0,
            body_idle_timeout: sparring_server::BODY_IDLE_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod stopping {
    use super::*;

    /// A stop whose engine fails (putting back the runs it holds: a write,
    /// here on a full disk) still does the rest of the stop: the admin
    /// socket is removed and the WAL emptied into the database file; the
    /// stop then says what failed. It returned at the engine's error, and
    /// left both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_whose_engine_fails_still_stops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::for_test(dir.path(), EngineConfig::default());
        let server = start(config, slog::Logger::root(slog::Discard, slog::o!())).await.unwrap();
        let socket = dir.path().join(admin::SOCKET_FILE);
        let database = dir.path().join(DATABASE_FILE);
        let wal = dir.path().join(format!("{DATABASE_FILE}-wal"));
        assert!(socket.exists());
        // A run this server holds, as if claimed: the stop puts it back in
        // the queue.
        let owner = server.state.engine.owner().to_string();
        server
            .state
            .store
            .write(move |tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'u', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, total, running,
                                             metadata, created_at, updated_at)
                     VALUES ('brn_1', 'prj_1', 'usr_1', 'test', 'running', 10, 1, 1, '{}', 't', 't');",
                )?;
                tx.execute(
                    "INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration, status,
                                       lease_owner, lease_expires_ms, queued_at, queued_ms, created_at, updated_at)
                     VALUES ('run_1', 'brn_1', 'prj_1', 'usr_1', 'tst_1', 'scn_1', 1, 'running', ?1, ?2, 't', 0, 't', 't')",
                    rusqlite::params![owner, i64::MAX],
                )?;
                Ok::<_, store::StoreError>(())
            })
            .await
            .unwrap();
        assert!(std::fs::metadata(&wal).unwrap().len() > 0);
        crate::wal_writes::full_disk::set(&database, true);
        let stopped = server.shutdown().await;
        crate::wal_writes::full_disk::set(&database, false);
        let e = stopped.expect_err("putting the run back failed");
        assert!(format!("{e:#}").contains("full"), "{e:#}");
        assert!(!socket.exists(), "the admin socket is left");
        assert_eq!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0), 0, "the WAL is left");
    }
}
