//! The SQLite database: one writer with group commit, a bounded pool of
//! readers, WAL.
//!
//! SQLite allows one writer at a time; rather than let connections contend
//! for the write lock (and fail with `SQLITE_BUSY` under load), all writes go
//! through the single writer connection, in `BEGIN IMMEDIATE` transactions
//! that take the lock up front, so a transaction never has to be retried
//! halfway. Reads use their own connections and, thanks to WAL, never wait
//! for the writer.
//!
//! `synchronous = FULL`: a write is on disk when its transaction commits, so
//! an acknowledged request survives a crash or power loss. That fsync is
//! most of a small write's cost, so writes are **group-committed**: a writer
//! thread takes every write waiting for it, runs them in one transaction,
//! commits once, and only then answers each of them. Each write is still
//! all-or-nothing (a failed one leaves no trace and the others go on: it is
//! rolled back to a `SAVEPOINT` of its own, or, if nothing but writes that
//! can run again was kept before it, with the transaction, those writes
//! running again in the next; see `commit_group`), writes still
//! apply one after another in the order they were taken, readers never see
//! a write before it is durable, and a write is acknowledged only once its
//! commit is on disk. If the commit itself fails, every write of the group
//! fails with it. The writer's WAL writes reach the kernel as one `pwrite`
//! per 128 KB of a commit rather than two per page (see `wal_writes`).
//!
//! Reads run on the calling task's thread, each on a pooled connection (so
//! prepared statements stay cached). They are short indexed lookups and
//! pages of at most 200 rows (tens to a few hundred µs, the database in the
//! page cache); handing each to another thread and back costs two thread
//! switches, which on a two-core machine cost more than the read itself
//! (see BENCHMARKS.md). The pool holds one connection per thread that reads
//! at once, which the runtime's worker count bounds.
//!
//! Checkpoints (copying the WAL back into the database file, with an fsync
//! of it) run passively on a thread of their own, never in the writer's
//! commit. Only starting the WAL over needs the writer: between two groups,
//! once that thread has copied nearly everything, so writes wait behind a
//! few milliseconds of it (see `checkpoints`).
//!
//! The schema is the numbered files in `impl/migrations/`, applied in order
//! on open and recorded in `PRAGMA user_version`.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub use rusqlite::hooks::Action;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

/// The migrations, in order. Append only: a released file never changes.
/// A migration: its SQL, then, for what SQL cannot compute, a Rust step in
/// the same transaction (written against the schema of its own version).
type Migration = (&'static str, &'static str, Option<fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>>);

const MIGRATIONS: &[Migration] = &[
    ("0001_foundation", include_str!("../migrations/0001_foundation.sql"), None),
    ("0002_projects_and_testing_model", include_str!("../migrations/0002_projects_and_testing_model.sql"), None),
    ("0003_engine", include_str!("../migrations/0003_engine.sql"), None),
    ("0004_reviews", include_str!("../migrations/0004_reviews.sql"), None),
    ("0005_read_paths", include_str!("../migrations/0005_read_paths.sql"), Some(crate::tests::serve_all)),
    ("0006_key_versions", include_str!("../migrations/0006_key_versions.sql"), None),
    ("0007_test_listing", include_str!("../migrations/0007_test_listing.sql"), None),
    ("0008_no_key_versions", include_str!("../migrations/0008_no_key_versions.sql"), None),
    ("0009_payer", include_str!("../migrations/0009_payer.sql"), None),
    ("0010_run_limits", include_str!("../migrations/0010_run_limits.sql"), None),
    ("0011_tests_as_queued", include_str!("../migrations/0011_tests_as_queued.sql"), None),
    ("0012_test_names_as_queued", include_str!("../migrations/0012_test_names_as_queued.sql"), None),
    ("0013_idempotency_keys", include_str!("../migrations/0013_idempotency_keys.sql"), None),
    ("0014_phone_number_rows", include_str!("../migrations/0014_phone_number_rows.sql"), None),
    ("0015_tests_by_project", include_str!("../migrations/0015_tests_by_project.sql"), None),
    ("0016_former_members", include_str!("../migrations/0016_former_members.sql"), None),
    ("0017_billing_owner", include_str!("../migrations/0017_billing_owner.sql"), None),
    ("0018_results_say_blinded", include_str!("../migrations/0018_results_say_blinded.sql"), None),
    ("0019_pages_from_their_cursor", include_str!("../migrations/0019_pages_from_their_cursor.sql"), None),
    ("0020_run_prices", include_str!("../migrations/0020_run_prices.sql"), None),
    (
        "0021_calibration_metrics_kept",
        include_str!("../migrations/0021_calibration_metrics_kept.sql"),
        Some(crate::reviews::calibration::keep_all),
    ),
    ("0022_result_verdicts", include_str!("../migrations/0022_result_verdicts.sql"), None),
    (
        "0023_reviews_by_calibration_in_order",
        include_str!("../migrations/0023_reviews_by_calibration_in_order.sql"),
        None,
    ),
    (
        "0024_results_without_a_call",
        include_str!("../migrations/0024_results_without_a_call.sql"),
        Some(results_without_a_call),
    ),
    ("0025_ledger_by_filter", include_str!("../migrations/0025_ledger_by_filter.sql"), None),
    ("0026_activity_about_a_user", include_str!("../migrations/0026_activity_about_a_user.sql"), None),
    ("0027_reviews_by_filter_and_project", include_str!("../migrations/0027_reviews_by_filter_and_project.sql"), None),
];

/// Migration 0024's step, after its SQL made `test_results.call_id`
/// nullable by editing the table's definition: the schema version goes up
/// (so that SQLite reads the definition again), the column is checked to be
/// nullable now (a definition not written as 0003 wrote it would have been
/// left as it was), and the results already stored of runs that made no
/// call (their run's `call_id` is null once it ended) name none either.
fn results_without_a_call(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let version: i64 = tx.pragma_query_value(None, "schema_version", |r| r.get(0))?;
    tx.pragma_update(None, "schema_version", version + 1)?;
    let not_null: bool =
        tx.query_row("SELECT \"notnull\" FROM pragma_table_info('test_results') WHERE name = 'call_id'", [], |r| {
            r.get(0)
        })?;
    if not_null {
        let failed = rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR);
        return Err(rusqlite::Error::SqliteFailure(failed, Some("test_results.call_id is still NOT NULL".into())));
    }
    tx.execute_batch(
        "UPDATE test_results
         SET call_id = NULL,
             document = CASE WHEN json_valid(document) THEN json_set(document, '$.call_id', NULL) ELSE document END
         WHERE call_id IS NOT NULL
           AND run_id IN (SELECT id FROM runs WHERE call_id IS NULL AND test_result_id IS NOT NULL)",
    )
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database task failed: {0}")]
    Task(String),
    /// A write's transaction could not be committed: the disk (or the
    /// filesystem's quota) is full. Nothing of it was kept.
    #[error("the disk is full: {0}")]
    Full(String),
    /// A write's transaction could not be committed: the database cannot be
    /// written (a file made read-only or immutable, a file system remounted
    /// read-only, the database file moved away, a failing disk). Nothing of
    /// it was kept.
    #[error("the database cannot be written: {0}")]
    Unwritable(String),
    #[error("database {path} has schema version {found}, newer than this build knows ({known}); upgrade sparring")]
    TooNew { path: PathBuf, found: usize, known: usize },
}

impl StoreError {
    /// Whether the write failed for want of disk space (then nothing of it
    /// was kept, and writes work again once there is room).
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Full(_) => true,
            StoreError::Sqlite(e) => is_full(e),
            _ => false,
        }
    }

    /// Whether the write failed because the database cannot be written
    /// (then nothing of it was kept, and writes work again once it can).
    pub fn is_unwritable(&self) -> bool {
        match self {
            StoreError::Unwritable(_) => true,
            StoreError::Sqlite(e) => is_unwritable(e),
            _ => false,
        }
    }
}

fn is_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// What SQLite answers a write the storage refuses: `SQLITE_READONLY` (and
/// its kinds: the file moved away, …), or the `unix` VFS's failed `pwrite`
/// (`EROFS`, `EPERM` on an immutable file, `EIO`).
fn is_unwritable(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == rusqlite::ErrorCode::ReadOnly || f.extended_code == rusqlite::ffi::SQLITE_IOERR_WRITE)
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Why a group's transaction failed, given to each of its writes.
#[derive(Debug)]
struct GroupError {
    message: String,
    full: bool,
    unwritable: bool,
}

impl GroupError {
    fn of(e: &rusqlite::Error) -> GroupError {
        GroupError { message: e.to_string(), full: is_full(e), unwritable: is_unwritable(e) }
    }

    fn other(message: impl Into<String>) -> GroupError {
        GroupError { message: message.into(), full: false, unwritable: false }
    }
}

impl From<&GroupError> for StoreError {
    fn from(e: &GroupError) -> StoreError {
        if e.full {
            StoreError::Full(e.message.clone())
        } else if e.unwritable {
            StoreError::Unwritable(e.message.clone())
        } else {
            StoreError::Task(e.message.clone())
        }
    }
}

#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// Shared with the writer thread, and locked directly by
    /// [`Store::write_blocking`].
    writer: Arc<Mutex<Connection>>,
    /// To the writer thread; it stops when the last `Store` is dropped.
    jobs: mpsc::Sender<Job>,
    readers: Mutex<Vec<Connection>>,
    /// Caches kept in front of the store (see [`Store::watch`]); the
    /// writer's update hook marks them.
    watches: Arc<Watches>,
    /// Held by the checkpointer thread while it checkpoints, and by
    /// [`Store::checkpoint_all`]: SQLite refuses a second checkpoint at once
    /// without waiting (no busy handler).
    checkpointing: Arc<Mutex<()>>,
}

/// A write waiting for the writer thread (see [`Store::write_then`]).
type Job = Box<dyn Write>;

/// The group's transaction, or why none could be begun.
type GroupTx<'t, 'c> = Result<&'t rusqlite::Transaction<'c>, &'t GroupError>;

/// A write as the writer thread sees it.
trait Write: Send {
    /// Runs the write in the group's transaction (given why none could be
    /// begun instead, fails without running); whether what it did is to be
    /// kept. Runs again only if [`Write::again`].
    fn run(&mut self, tx: GroupTx<'_, '_>) -> bool;
    /// Whether it can run again in a later transaction, its own having been
    /// rolled back (see [`Store::write_then_again`]).
    fn again(&self) -> bool;
    /// Answers the caller with what its last run gave, given how its
    /// transaction ended (a failed write's answer is its own error).
    fn answer(self: Box<Self>, commit: Result<(), &GroupError>);
}

/// A write and its caller's answer, until its transaction ends.
struct Pending<T, E, F, G> {
    f: F,
    again: bool,
    /// What the last run gave.
    result: Option<Result<T, E>>,
    /// Runs once the write is durable, before it is answered.
    committed: G,
    answer: tokio::sync::oneshot::Sender<Result<T, E>>,
}

impl<T, E, F, G> Write for Pending<T, E, F, G>
where
    T: Send,
    E: From<StoreError> + Send,
    F: FnMut(&rusqlite::Transaction<'_>) -> Result<T, E> + Send,
    G: FnOnce(&T) + Send,
{
    fn run(&mut self, tx: GroupTx<'_, '_>) -> bool {
        // What a run before this one gave is gone with its transaction.
        self.result = None;
        let result = match tx {
            Ok(tx) => (self.f)(tx),
            Err(e) => Err(E::from(StoreError::from(e))),
        };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn again(&self) -> bool {
        self.again
    }

    fn answer(self: Box<Self>, commit: Result<(), &GroupError>) {
        let answer = match (self.result, commit) {
            (Some(Ok(_)) | None, Err(e)) => Err(E::from(StoreError::from(e))),
            (Some(result), _) => result,
            (None, Ok(())) => Err(E::from(StoreError::Task("the write did not run".into()))),
        };
        if let Ok(value) = &answer {
            (self.committed)(value);
        }
        // The caller may have gone away; the write stands.
        let _ = self.answer.send(answer);
    }
}

/// The most writes in one group: bounds how long the first of them waits.
const MAX_GROUP: usize = 64;

impl Store {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub fn open(path: &Path) -> StoreResult<Store> {
        configure_memory();
        // The writer's WAL writes are gathered until its commit's sync (see
        // `wal_writes`), which is right only if it syncs at every commit.
        let mut writer =
            Connection::open_with_flags_and_vfs(path, OpenFlags::default(), crate::wal_writes::register())?;
        configure(&writer)?;
        let synchronous: i64 = writer.pragma_query_value(None, "synchronous", |r| r.get(0))?;
        assert_eq!(synchronous, 2, "the writer must sync at every commit (synchronous = FULL)");
        // Nor does it write frames before its commit: a transaction that
        // spilled them and then rolled back would leave them gathered, and
        // another process (`sparring admin grant-credits`) may commit its
        // own frames at those offsets before the writer next touches the
        // WAL, which would then write the stale ones over them. A large
        // transaction holds its pages in memory instead.
        writer.pragma_update(None, "cache_spill", false)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        // The checkpointer thread checkpoints instead (see the module doc).
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        // After a burst of writes, the WAL file shrinks back to this.
        writer.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
        migrate(&mut writer, path)?;
        let watches = Arc::new(Watches::default());
        {
            let watches = watches.clone();
            writer.update_hook(Some(move |action, _: &str, table: &str, _| watches.saw(table, action)))?;
        }
        let writer = Arc::new(Mutex::new(writer));
        let (jobs, queue) = mpsc::channel();
        let (wrote, written) = mpsc::sync_channel(1);
        let restart = Arc::new(AtomicBool::new(false));
        let thread = |name: &str| std::thread::Builder::new().name(name.into());
        let started = |e: std::io::Error| StoreError::Task(format!("starting a database thread: {e}"));
        {
            let writer = writer.clone();
            let restart = restart.clone();
            let watches = watches.clone();
            thread("sparring-writer")
                .spawn(move || essential("writer", || write_groups(&writer, &queue, &wrote, &restart, &watches)))
                .map_err(started)?;
        }
        let checkpointing = Arc::new(Mutex::new(()));
        {
            let path = path.to_path_buf();
            let checkpointing = checkpointing.clone();
            thread("sparring-checkpoint")
                .spawn(move || essential("checkpointer", || checkpoints(&path, &written, &restart, &checkpointing)))
                .map_err(started)?;
        }
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer,
                jobs,
                readers: Mutex::new(Vec::new()),
                watches,
                checkpointing,
            }),
        })
    }

    /// Keeps a cache in front of the store correct: `stale` runs after
    /// every transaction that changed a row of one of `on`'s tables in one
    /// of the ways listed (triggers and cascades included: SQLite's update
    /// hook sees them), and before any write of it is answered, so a
    /// caller that saw its write acknowledged never reads the cache from
    /// before it. Also after a transaction that failed or rolled such a
    /// change back (harmless: the cache is only emptied).
    ///
    /// Only writes through this store are seen, and only to rowid tables
    /// (the hook is not called for `WITHOUT ROWID` ones), nor rows an
    /// `INSERT OR REPLACE` deletes: a cache may depend only on what the
    /// server alone writes, the way it writes it. Of the commands run
    /// beside a server, `sparring admin create-key` goes through it (see
    /// `admin`) and `admin grant-credits` writes `users` and the credit
    /// ledger directly.
    pub fn watch(&self, on: &'static [(&'static str, &'static [Action])], stale: impl Fn() + Send + Sync + 'static) {
        self.inner.watches.list.write().unwrap_or_else(|p| p.into_inner()).push(Watch {
            on,
            changed: AtomicBool::new(false),
            stale: Box::new(stale),
        });
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` once in the writer's transaction, in a savepoint of its own
    /// unless nothing was kept before it there (see `commit_group`): what
    /// `f` did is kept if it returns `Ok` and undone otherwise, and the
    /// answer comes once the transaction is committed (durable).
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        self.write_then(f, |_| ()).await
    }

    /// [`Store::write`], then `committed` with what `f` returned, once the
    /// write is durable and before it is answered (on the writer thread:
    /// keep it to a few map operations). Only for a write that `f` kept and
    /// whose transaction committed. For a cache that a write adds to rather
    /// than empties (see `test_cache`).
    pub async fn write_then<T, E, F, G>(&self, f: F, committed: G) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
        G: FnOnce(&T) + Send + 'static,
    {
        let mut f = Some(f);
        // Never run twice: `again` is false.
        let once = move |tx: &rusqlite::Transaction<'_>| match f.take() {
            Some(f) => f(tx),
            None => Err(E::from(StoreError::Task("a write ran twice".into()))),
        };
        self.send(once, false, committed).await
    }

    /// [`Store::write_then`] for a write that can run again: `f` may be
    /// called more than once, each time in a new transaction where nothing
    /// it did before is left, and only what its last run gave is answered
    /// (so it must do nothing outside the transaction). Such a write runs
    /// without a savepoint of its own whenever every write kept before it in
    /// its transaction can run again too: should it fail having changed
    /// something, the transaction is rolled back and those writes run again
    /// in the next one. A savepoint copies each page its write changes into
    /// a journal (~9 % of the writer's instructions for a create of a test,
    /// BENCHMARKS.md).
    pub async fn write_then_again<T, E, F, G>(&self, f: F, committed: G) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnMut(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
        G: FnOnce(&T) + Send + 'static,
    {
        self.send(f, true, committed).await
    }

    async fn send<T, E, F, G>(&self, f: F, again: bool, committed: G) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnMut(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
        G: FnOnce(&T) + Send + 'static,
    {
        let (answer, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(Pending { f, again, result: None, committed, answer });
        self.inner.jobs.send(job).map_err(|_| E::from(StoreError::Task("the database writer has stopped".into())))?;
        rx.await.map_err(|_| E::from(StoreError::Task("the write panicked; it was rolled back".into())))?
    }

    /// A write in a transaction of its own, on the current thread, for
    /// callers that are already off the async runtime (admin commands,
    /// tests): commits if `f` returns `Ok`, rolls back otherwise.
    pub fn write_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        E: From<StoreError>,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
    {
        // A panic while holding the lock poisons it; the connection itself
        // is still usable (the transaction rolled back on drop).
        let mut conn = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(StoreError::from)?;
        let value = f(&tx).and_then(|v| tx.commit().map(|()| v).map_err(|e| E::from(StoreError::from(e))));
        self.inner.watches.ended();
        value
    }

    /// Copies everything the WAL holds into the database file and empties
    /// the WAL: for a server's shutdown, after its last write, so that a
    /// stopped server's database file is whole without its `-wal` (the
    /// passive checkpoints run [`CHECKPOINT_EVERY`] after writes, so the
    /// last writes before a stop, the last uses of keys among them, were
    /// left in the WAL). Waits for a checkpoint in progress, and up to the
    /// busy timeout for reads; fails if one still holds the WAL then
    /// (nothing is lost: the WAL stays, and the next open reads it).
    pub fn checkpoint_all(&self) -> StoreResult<()> {
        let conn = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _alone = self.inner.checkpointing.lock().unwrap_or_else(|p| p.into_inner());
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
        if busy != 0 {
            return Err(StoreError::Task("the WAL could not be emptied: a read or checkpoint still held it".into()));
        }
        Ok(())
    }

    /// Runs `f` on a reader connection, in a read transaction (a
    /// consistent snapshot), on the current thread (see the module's doc).
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        E: From<StoreError>,
        F: FnOnce(&Connection) -> Result<T, E>,
    {
        self.read_blocking(f)
    }

    /// [`Store::read`], for callers off the async runtime.
    ///
    /// The transaction is begun and ended by statements prepared once per
    /// connection: rusqlite's `Transaction` parses its `BEGIN` at every
    /// use, which was 4 % of the instructions of a page of keys (callgrind,
    /// BENCHMARKS.md). So `f` gets the connection, inside the transaction.
    pub fn read_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        E: From<StoreError>,
        F: FnOnce(&Connection) -> Result<T, E>,
    {
        self.with_reader(|conn| {
            let run = |sql: &str| execute_cached(conn, sql);
            run("BEGIN DEFERRED").map_err(StoreError::from)?;
            let value = f(conn);
            // A read changes nothing; `COMMIT` only ends it (and should it
            // fail, `with_reader` closes the connection, which does).
            if run("COMMIT").is_err() {
                let _ = run("ROLLBACK");
            }
            value
        })
    }

    /// The first row of one statement (`None` if it has none), mapped by
    /// `f`, on a reader connection, on the current thread.
    ///
    /// One statement reads one snapshot by itself, so unlike [`Store::read`]
    /// no transaction is begun and ended around it: for the most read
    /// document, a test result, those two statements were 5 % of its
    /// instructions (callgrind, BENCHMARKS.md). Taking a row rather than
    /// the connection keeps the read to that one statement.
    pub fn read_row<T, E, P, F>(&self, sql: &str, params: P, f: F) -> Result<Option<T>, E>
    where
        E: From<StoreError>,
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.with_reader(|conn| {
            let mut statement = conn.prepare_cached(sql).map_err(StoreError::from)?;
            Ok(statement.query_row(params, f).optional().map_err(StoreError::from)?)
        })
    }

    /// Runs `f` with a pooled reader connection (opening one if none is
    /// free), then pools it again unless `f` left it inside a transaction:
    /// such a connection is dropped, and closing it ends the transaction.
    fn with_reader<T, E>(&self, f: impl FnOnce(&Connection) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let pooled = self.inner.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => open_reader(&self.inner.path)?,
        };
        let value = f(&conn);
        if conn.is_autocommit() {
            self.inner.readers.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        }
        value
    }
}

/// Runs the body of a thread the store cannot do without, and ends the
/// process should it panic. A write's own panic is caught and rolled back
/// (`commit_group`); one after it, in a cache's callback as a write is
/// answered (`Store::write_then`, `Store::watch`), would end the writer
/// thread, leaving a server that answers every later write with an error
/// and a cache that may no longer match the database, and one on the
/// checkpointer would let the WAL grow without bound. Stopped instead, the
/// next start recovers from what is on disk, every write answered as done
/// among it.
fn essential(name: &str, body: impl FnOnce()) {
    if std::panic::catch_unwind(AssertUnwindSafe(body)).is_err() {
        eprintln!("sparring: the database {name} thread panicked; stopping so that the next start recovers");
        std::process::abort();
    }
}

/// The writer thread: takes what is waiting (at most [`MAX_GROUP`]) and
/// commits it as one group, until the store is dropped. Tells the
/// checkpointer after each group.
fn write_groups(
    writer: &Mutex<Connection>,
    queue: &mpsc::Receiver<Job>,
    wrote: &mpsc::SyncSender<()>,
    restart: &AtomicBool,
    watches: &Watches,
) {
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let mut conn = writer.lock().unwrap_or_else(|p| p.into_inner());
        commit_group(&mut conn, group, watches);
        // Between groups the writer holds no lock: the one moment a
        // checkpoint can copy every frame and start the WAL over (see
        // `checkpoints`). Writes queue meanwhile and form the next group.
        if restart.swap(false, Ordering::Relaxed) {
            // It waits for the readers of the WAL to finish, every write
            // waiting behind it: ours read for well under a millisecond, but
            // another process's (`sparring admin backup`, a `sqlite3` shell)
            // may read for seconds. Not long, then: if a reader is still
            // there, the WAL starts over after a later group instead.
            let _ = conn.busy_timeout(RESTART_WAIT);
            let _ = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()));
            let _ = conn.busy_timeout(BUSY_TIMEOUT);
        }
        drop(conn);
        // Full means the checkpointer already has news.
        let _ = wrote.try_send(());
    }
}

/// How often the WAL is checkpointed while writes come in.
///
/// Short, so that each checkpoint's burst of writes to the database file
/// stays small: the writer's commits that overlap a checkpoint take longer
/// (nearly every group over 4 ms in `POST /v1/tests` under load overlapped
/// one), and at 200 ms a checkpoint copied ~20,000 frames (80 MB) at a
/// time. At 25 ms that `POST`'s p99 fell from 19–22 ms to 12–13, for ~4 %
/// of its throughput (BENCHMARKS.md). A quiet server still checkpoints once
/// after its last writes.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(25);

/// WAL frames (pages) beyond which a checkpoint also restarts the WAL.
const RESTART_FRAMES: i64 = 4096;

/// The checkpointer thread: after writes, at most every
/// [`CHECKPOINT_EVERY`], copies what the WAL holds into the database file
/// (`PASSIVE`: it never waits for, nor blocks, the writer or a reader).
///
/// A passive checkpoint alone never shrinks the WAL under sustained writes:
/// SQLite starts the WAL over only when a write begins with every frame
/// copied back, and by the time a checkpoint ends new frames have come. The
/// WAL then grows without bound (to 945 MB in a minute of `POST /v1/tests`
/// in `cargo xtask bench api`), and every read looks each page up in a WAL
/// index that grows with it. Nor can this thread take the write lock for a
/// `RESTART` checkpoint: the writer takes it again the moment it commits,
/// and a busy handler that polls loses that race every time. So once the
/// WAL holds more than [`RESTART_FRAMES`], this thread asks the writer, which
/// runs a `RESTART` checkpoint between two groups: it copies the few frames
/// written since the passive one (which did the bulk of the copying without
/// blocking anyone), waits for readers to leave the old frames (short
/// reads), and the next write starts the WAL over (`journal_size_limit` then
/// trims the file). Stops with the writer.
fn checkpoints(path: &Path, written: &mpsc::Receiver<()>, restart: &AtomicBool, checkpointing: &Mutex<()>) {
    let conn = match Connection::open(path).map_err(StoreError::from).and_then(|c| configure(&c).map(|()| c)) {
        Ok(c) => c,
        // Without it the WAL is checkpointed when the last connection
        // closes; nothing is lost.
        Err(_) => return,
    };
    while written.recv().is_ok() {
        std::thread::sleep(CHECKPOINT_EVERY);
        let alone = checkpointing.lock().unwrap_or_else(|p| p.into_inner());
        // A failed checkpoint (a reader holding an old snapshot, the disk)
        // is simply tried again after the next writes.
        let Ok((frames, mut left)) = passive(&conn) else { continue };
        if frames <= RESTART_FRAMES {
            continue;
        }
        // The writer's `RESTART` copies what came during this checkpoint
        // and fsyncs the database file, every write waiting meanwhile: under
        // sustained `POST`s that was ~1,000 frames and a median pause of
        // 11 ms. Each further passive checkpoint copies only what came
        // during the previous one, so a few bring it down to ~150 frames
        // and 4 ms (BENCHMARKS.md).
        for _ in 0..CATCH_UP_ROUNDS {
            if left <= RESTART_LEFT {
                break;
            }
            match passive(&conn) {
                Ok((_, l)) => left = l,
                Err(_) => break,
            }
        }
        drop(alone);
        // Many frames that catching up could not copy (it leaves ~150
        // under sustained writes) are behind a reader's snapshot (another
        // process's long read): a `RESTART` would only wait for it. Asked
        // again after later writes.
        if left < RESTART_FRAMES / 4 {
            restart.store(true, Ordering::Relaxed);
        }
    }
}

/// At most this many frames left for the writer's `RESTART` to copy.
const RESTART_LEFT: i64 = 128;

/// How long the writer's `RESTART` waits for the WAL's readers.
const RESTART_WAIT: Duration = Duration::from_millis(50);

/// How long a connection waits for a lock another holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Passive checkpoints run after the one that found the WAL long, to bring
/// what is left under [`RESTART_LEFT`].
const CATCH_UP_ROUNDS: usize = 4;

/// A passive checkpoint and a sync of the database file, then the frames in
/// the WAL and those not copied yet (a reader still needs them, or they came
/// after it began: what the checkpoint itself reports is the WAL as it
/// began).
///
/// SQLite syncs the database file only after a checkpoint that copies every
/// frame, which under sustained writes is only the writer's `RESTART`: that
/// sync then wrote back all that the passive checkpoints had copied since
/// the last restart, every write waiting (under `POST /v1/tests`: median
/// 2.1 ms, up to 7.5). Synced here, off the writer, after each passive
/// checkpoint, the restart's sync has only its own copies to write (median
/// 1.3 ms, at most 2.0; BENCHMARKS.md).
fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    if let Err(e) = sync_database(conn) {
        // The kernel reports a failed write-back once to each open file.
        // Having seen it here, a later checkpoint on this connection would
        // sync without error though pages were lost, count every frame as
        // copied, and let the next write start the WAL over on top of the
        // only good copy of those pages. Ended now, the process leaves the
        // WAL with every frame since its last restart, and the next start
        // recovers from it (as PostgreSQL does on a failed fsync).
        eprintln!(
            "sparring: syncing the database file after a checkpoint failed ({e}); stopping so that \
             the next start recovers every acknowledged write from the WAL"
        );
        std::process::abort();
    }
    conn.query_row("PRAGMA wal_checkpoint(NOOP)", [], |r| {
        let (frames, copied): (i64, i64) = (r.get(1)?, r.get(2)?);
        Ok((frames, frames - copied))
    })
}

/// Syncs the database file through `conn`'s own handle on it (SQLite's
/// file, so that no other descriptor of the file is opened and closed: a
/// close drops every POSIX lock the process holds on the file).
fn sync_database(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::ffi;
    let failed = |rc| Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn` is open, and `file` receives a pointer to SQLite's
    // file of its main database, valid while the connection is open.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast::<std::ffi::c_void>(),
        )
    };
    if rc != ffi::SQLITE_OK || file.is_null() {
        return failed(if rc == ffi::SQLITE_OK { ffi::SQLITE_MISUSE } else { rc });
    }
    // SAFETY: `file` is SQLite's, as above; a file that is not open has no
    // methods, and then nothing is called. The connection is this thread's
    // alone, so nothing else uses the file meanwhile.
    let rc = unsafe {
        match (*file).pMethods.as_ref().and_then(|m| m.xSync) {
            Some(sync) => sync(file, ffi::SQLITE_SYNC_NORMAL),
            None => ffi::SQLITE_MISUSE,
        }
    };
    if rc != ffi::SQLITE_OK {
        return failed(rc);
    }
    Ok(())
}

/// Runs the group's writes in one transaction, commits, then answers them.
/// A write is undone alone if it fails: rolled back to a savepoint of its
/// own, or, run without one (see [`Store::write_then_again`]), with the
/// transaction, the writes kept before it running again in the next. If
/// SQLite loses the transaction halfway (a statement on a full disk or an
/// I/O error with no statement journal to undo it alone rolls back the
/// whole transaction), the writes kept so far that can run again run again
/// in a new transaction with the rest; those that cannot are answered with
/// that error (`Full` on a full disk: the API's 503 `storage_full`).
fn commit_group(conn: &mut Connection, group: Vec<Job>, watches: &Watches) {
    let mut pending: VecDeque<Job> = group.into();
    while !pending.is_empty() {
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                let e = GroupError::of(&e);
                for mut job in pending {
                    job.run(Err(&e));
                    job.answer(Err(&e));
                }
                return;
            }
        };
        // The writes run in this transaction and kept, in order.
        let mut kept: Vec<Job> = Vec::new();
        let mut lost: Option<GroupError> = None;
        // A write run without a savepoint failed having changed something:
        // the transaction is rolled back, and what was kept runs again.
        let mut undo = false;
        // SQLite rolled the transaction back itself: every write of it is
        // answered or pending again.
        let mut rolled_back = false;
        // The writes that failed, undone.
        let mut failed: Vec<Job> = Vec::new();
        let run = |sql: &str| execute_cached(&tx, sql);
        while let Some(mut job) = pending.pop_front() {
            // Without a savepoint when rolling back the transaction and
            // running again what it kept would undo this write alone (as
            // when nothing was kept yet, the write that can not run again
            // included).
            let bare = kept.iter().all(|k| k.again());
            if !bare {
                if let Err(e) = run("SAVEPOINT job") {
                    let e = GroupError::of(&e);
                    job.run(Err(&e));
                    job.answer(Err(&e));
                    lost = Some(e);
                    break;
                }
            }
            let before = tx.total_changes();
            // A panicking write is undone like a failed one; its caller
            // sees the dropped answer as an error.
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| job.run(Ok(&tx))));
            let keep = matches!(ran, Ok(true));
            if tx.is_autocommit() {
                // SQLite rolled the transaction back under this write (a
                // statement on a full disk, an I/O error), with what the
                // writes before it did. Those that can run again do, in
                // the next transaction; the others, and this one, are
                // told why (a full disk is the API's 503, not a 500).
                let e = rolled_back_by(&tx);
                if ran.is_ok() {
                    job.answer(Err(&e));
                }
                let (again, lost): (Vec<Job>, Vec<Job>) = kept.drain(..).partition(|k| k.again());
                for job in lost.into_iter().chain(failed.drain(..)) {
                    job.answer(Err(&e));
                }
                for job in again.into_iter().rev() {
                    pending.push_front(job);
                }
                rolled_back = true;
                break;
            }
            if keep {
                kept.push(job);
                if !bare {
                    if let Err(e) = run("RELEASE job") {
                        lost = Some(GroupError::of(&e));
                        break;
                    }
                }
                continue;
            }
            // A failed write's answer is its own error, given once its
            // transaction ends.
            if ran.is_ok() {
                failed.push(job);
            }
            if !bare {
                if let Err(e) = run("ROLLBACK TO job").and_then(|()| run("RELEASE job")) {
                    lost = Some(GroupError::of(&e));
                    break;
                }
            } else if tx.total_changes() != before {
                // SQLite undoes what a failed statement itself changed, so
                // a write that failed having changed nothing needs no undo.
                undo = true;
                break;
            }
        }
        let commit = match lost {
            Some(e) => {
                drop(tx);
                Err(e)
            }
            None if rolled_back => {
                drop(tx);
                watches.ended();
                continue;
            }
            None if undo => {
                // Should the rollback fail and leave the transaction open,
                // beginning the next one fails and answers every write.
                let _ = tx.rollback();
                watches.ended();
                for job in failed {
                    job.answer(Ok(()));
                }
                for job in kept.into_iter().rev() {
                    pending.push_front(job);
                }
                continue;
            }
            None => tx.commit().map_err(|e| {
                stop_if_sync_failed(&e);
                GroupError::of(&e)
            }),
        };
        watches.ended();
        for job in kept.into_iter().chain(failed) {
            job.answer(commit.as_ref().map(|_| ()));
        }
    }
}

/// Why SQLite rolled back the transaction of `conn` under a write: the
/// error of the write's statement that failed (`SQLITE_FULL`, an I/O
/// error), the last one the connection saw.
fn rolled_back_by(conn: &Connection) -> GroupError {
    use rusqlite::ffi;
    // SAFETY: `conn` is open; these read its last error and nothing else.
    let (code, message) = unsafe {
        let handle = conn.handle();
        let message = std::ffi::CStr::from_ptr(ffi::sqlite3_errmsg(handle)).to_string_lossy().into_owned();
        (ffi::sqlite3_extended_errcode(handle), message)
    };
    if code == ffi::SQLITE_OK {
        return GroupError::other("the transaction was rolled back by the database");
    }
    GroupError::of(&rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(message)))
}

/// Ends the process when a commit's sync of the WAL failed, as a failed
/// sync of the database file does (see `passive`): the kernel may have
/// dropped the frames it could not write back and reports that once, so
/// the frames of this commit may be on disk, whole and marked committed,
/// though every write of it is answered as failed; a later commit would
/// sync without error over the same file. Stopped now, the next start
/// recovers from the WAL as it is on disk, and no write was answered as
/// done that is not.
fn stop_if_sync_failed(e: &rusqlite::Error) {
    use rusqlite::ffi;
    if let rusqlite::Error::SqliteFailure(failure, _) = e {
        if matches!(failure.extended_code, ffi::SQLITE_IOERR_FSYNC | ffi::SQLITE_IOERR_DIR_FSYNC) {
            eprintln!("sparring: syncing the WAL at a commit failed ({e}); stopping so that the next start recovers from what is on disk");
            std::process::abort();
        }
    }
}

/// A value kept in memory in front of the store, set back to its default
/// after every transaction that made one of the changes it watches (see
/// [`Store::watch`]), before that write is answered.
///
/// A read of the database that raced with such a change must not put the
/// old state back: take [`Watched::generation`] before reading and give it
/// to [`Watched::keep`], which keeps what was read only if the value was
/// not set back meanwhile.
pub struct Watched<T> {
    kept: std::sync::RwLock<(T, u64)>,
}

impl<T: Default + Send + Sync + 'static> Watched<T> {
    /// A value set back by the changes `on` names in `store`.
    pub fn new(store: &Store, on: &'static [(&'static str, &'static [Action])]) -> Arc<Watched<T>> {
        let watched = Arc::new(Watched::default());
        let kept = watched.clone();
        store.watch(on, move || kept.reset());
        watched
    }

    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.kept.read().unwrap_or_else(|p| p.into_inner()).0)
    }

    /// To take before reading the database, and give to [`Watched::keep`].
    pub fn generation(&self) -> u64 {
        self.kept.read().unwrap_or_else(|p| p.into_inner()).1
    }

    /// Runs `f` on the value, unless it was set back since `generation`.
    pub fn keep(&self, generation: u64, f: impl FnOnce(&mut T)) {
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        if kept.1 == generation {
            f(&mut kept.0);
        }
    }

    /// Changes the value in step with a write that just committed, and
    /// refuses what reads begun before it would keep (they may predate the
    /// write).
    pub fn change(&self, f: impl FnOnce(&mut T)) {
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        f(&mut kept.0);
        kept.1 += 1;
    }

    /// Sets the value back to its default.
    pub(crate) fn reset(&self) {
        let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
        *kept = (T::default(), kept.1 + 1);
    }
}

impl<T: Default> Default for Watched<T> {
    /// A value no store watches (for tests).
    fn default() -> Self {
        Watched { kept: std::sync::RwLock::new((T::default(), 0)) }
    }
}

/// The caches watching the store's writes (see [`Store::watch`]).
#[derive(Default)]
struct Watches {
    list: std::sync::RwLock<Vec<Watch>>,
}

struct Watch {
    on: &'static [(&'static str, &'static [Action])],
    /// Set by the update hook during a transaction, taken when it ends.
    changed: AtomicBool,
    stale: Box<dyn Fn() + Send + Sync>,
}

impl Watches {
    fn list(&self) -> std::sync::RwLockReadGuard<'_, Vec<Watch>> {
        self.list.read().unwrap_or_else(|p| p.into_inner())
    }

    /// From the writer's update hook: a row of `table` was changed.
    fn saw(&self, table: &str, action: Action) {
        for w in self.list().iter() {
            if w.on.iter().any(|(t, actions)| *t == table && actions.contains(&action)) {
                w.changed.store(true, Ordering::Relaxed);
            }
        }
    }

    /// A transaction of the writer ended (committed, failed or rolled
    /// back), before any of its writes is answered.
    fn ended(&self) {
        for w in self.list().iter() {
            if w.changed.swap(false, Ordering::Relaxed) {
                (w.stale)();
            }
        }
    }
}

/// Runs a statement that takes no parameters and returns no rows (`BEGIN`,
/// `COMMIT`, savepoints), prepared once per connection rather than parsed
/// at every use as `execute_batch` does.
fn execute_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(drop)
}

/// SQLite's memory, configured once, before this module opens its first
/// connection (so before SQLite is first used in the process, unless a
/// command opened a database otherwise first: then SQLite refuses it,
/// `SQLITE_MISUSE`, and nothing changes).
///
/// - **Page caches keep their memory.** A connection empties its cache
///   whenever the database changed since its last read, so under writes a
///   reader starts nearly every read with an empty cache; by default it then
///   frees each page it held and allocates them again one by one as the read
///   fetches them (a tenth of the CPU of reads mixed with writes: `malloc`,
///   `free` and glibc's consolidation, `perf record`). With an initial bulk
///   allocation as large as the cache (SQLite caps it at `cache_size`),
///   emptied pages go back to the connection's own free list.
/// - **mimalloc, without SQLite's allocation statistics.** Each write's
///   savepoint copies every page it changes into an in-memory sub-journal in
///   1 KB chunks, freed when the savepoint is released: ~70 allocations
///   and frees per `POST /v1/tests`, which glibc served at ~360
///   instructions each once its per-thread cache of such chunks ran out,
///   each behind SQLite's statistics mutex (callgrind, `POST` scenario:
///   494k instructions per request, 475k without the statistics, 442k with
///   mimalloc too; BENCHMARKS.md). Nothing here reads the statistics.
fn configure_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use rusqlite::ffi;
        use std::ffi::{c_int, c_void};
        // 2 MiB, in KiB as SQLite reads a negative count: at least the
        // default `cache_size` (-2000), so the bulk covers a whole cache.
        const BULK_KIB: c_int = -2048;
        let mimalloc = ffi::sqlite3_mem_methods {
            xMalloc: Some(mi_malloc),
            xFree: Some(mi_free),
            xRealloc: Some(mi_realloc),
            xSize: Some(mi_size),
            xRoundup: Some(mi_roundup),
            xInit: Some(mi_init),
            xShutdown: Some(mi_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: each option gets exactly the arguments SQLite documents
        // for it: `SQLITE_CONFIG_PAGECACHE` no buffer of ours (SQLite
        // allocates the bulk per connection), a size and a count;
        // `SQLITE_CONFIG_MEMSTATUS` an int; `SQLITE_CONFIG_MALLOC` a pointer
        // to methods that SQLite copies before returning, each a function
        // below that keeps SQLite's allocation contract. Before SQLite is
        // initialized nothing else uses it (and `Once` runs this once);
        // after, every call is refused, harmless.
        unsafe {
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_PAGECACHE, std::ptr::null_mut::<c_void>(), 0 as c_int, BULK_KIB);
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int);
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &mimalloc as *const ffi::sqlite3_mem_methods);
        }
    });
}

// SQLite's allocation methods on mimalloc. SQLite calls `xMalloc` and
// `xRealloc` with sizes from 1 to under 2^31 (it answers 0 and larger itself),
// `xRealloc` and `xFree` with pointers `xMalloc` or `xRealloc` returned, and
// needs 8-byte alignment, which mimalloc gives every allocation.
unsafe extern "C" fn mi_malloc(n: std::ffi::c_int) -> *mut std::ffi::c_void {
    // SAFETY: any size; null on failure, as SQLite expects.
    unsafe { libmimalloc_sys::mi_malloc(n as usize) }
}

unsafe extern "C" fn mi_free(p: *mut std::ffi::c_void) {
    // SAFETY: `p` came from `mi_malloc` or `mi_realloc` (SQLite's contract).
    unsafe { libmimalloc_sys::mi_free(p) }
}

unsafe extern "C" fn mi_realloc(p: *mut std::ffi::c_void, n: std::ffi::c_int) -> *mut std::ffi::c_void {
    // SAFETY: as `mi_free`; null on failure leaves `p` allocated, as SQLite
    // expects.
    unsafe { libmimalloc_sys::mi_realloc(p, n as usize) }
}

unsafe extern "C" fn mi_size(p: *mut std::ffi::c_void) -> std::ffi::c_int {
    // SAFETY: as `mi_free`. At least the size asked for (which is under
    // 2^31: only a rounding up could pass it).
    let size = unsafe { libmimalloc_sys::mi_usable_size(p) };
    std::ffi::c_int::try_from(size).unwrap_or(std::ffi::c_int::MAX)
}

unsafe extern "C" fn mi_roundup(n: std::ffi::c_int) -> std::ffi::c_int {
    // What SQLite's own methods do: a multiple of 8.
    (n + 7) & !7
}

unsafe extern "C" fn mi_init(_: *mut std::ffi::c_void) -> std::ffi::c_int {
    rusqlite::ffi::SQLITE_OK
}

unsafe extern "C" fn mi_shutdown(_: *mut std::ffi::c_void) {}

/// Statements kept prepared per connection: every statement the API runs
/// (the default, 16, is fewer, and a statement pushed out is parsed and
/// planned again on its next use).
const STATEMENT_CACHE: usize = 256;

fn configure(conn: &Connection) -> StoreResult<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans never depend on the values bound (SQLite's "query planner
    // stability guarantee"). Without it SQLite plans `LIMIT ?`, `? IS
    // NULL`, and a query that a partial index might serve, for the values
    // bound, and marks the statement to be re-prepared when they change;
    // rusqlite clears the bindings of every statement returned to its cache,
    // so every cached statement was parsed and planned again at each use
    // (a fifth of the CPU of `GET /v1/api-keys`). Write a filter that should
    // use an index into the SQL rather than as `(? IS NULL OR …)`.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Temporary files in memory: above all the sub-journal of each write's
    // savepoint, which would otherwise spill to a file once a group has
    // changed more than 64 KiB.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(())
}

fn open_reader(path: &Path) -> StoreResult<Connection> {
    configure_memory();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    configure(&conn)?;
    Ok(conn)
}

/// The schema version this build migrates databases to.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// The schema version of the database at `path` (0 if there is none yet),
/// read without changing anything.
pub fn schema_version(path: &Path) -> StoreResult<usize> {
    if !path.exists() {
        return Ok(0);
    }
    let version: i64 = open_reader(path)?.pragma_query_value(None, "user_version", |r| r.get(0))?;
    Ok(usize::try_from(version).unwrap_or(0))
}

fn migrate(conn: &mut Connection, path: &Path) -> StoreResult<()> {
    migrate_to(conn, path, MIGRATIONS.len())
}

/// Migrates up to schema version `to` (for tests of a migration: the
/// database as it was just before it).
fn migrate_to(conn: &mut Connection, path: &Path, to: usize) -> StoreResult<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(0);
    if version > MIGRATIONS.len() {
        return Err(StoreError::TooNew { path: path.to_path_buf(), found: version, known: MIGRATIONS.len() });
    }
    for (i, (_name, sql, step)) in MIGRATIONS.iter().enumerate().take(to).skip(version) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        if let Some(step) = step {
            step(&tx)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkpointer syncs the database file through SQLite's own file,
    /// which a database with no file (in memory) does not have.
    #[test]
    fn the_database_file_is_synced_through_sqlites_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("db.sqlite")).unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);").unwrap();
        sync_database(&conn).unwrap();
        let memory = Connection::open_in_memory().unwrap();
        memory.execute_batch("CREATE TABLE t (x)").unwrap();
        assert!(sync_database(&memory).is_err());
    }

    /// Migration 0005 gives the tests that were already there their
    /// `served` JSON: the same text a write of the test stores today.
    #[test]
    fn tests_written_before_0005_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[4].0.starts_with("0005"));
            migrate_to(&mut conn, &path, 4).unwrap();
            conn.execute_batch(
                r#"INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't');
                   INSERT INTO personas VALUES ('per_1', 'prj_1', 'Dana', '{}', 't', 't');
                   INSERT INTO personas VALUES ('per_2', 'prj_1', 'Lee', '{}', 't', 't');
                   INSERT INTO channels VALUES ('chn_1', 'prj_1', 'web', 'http', 'https://a.example', NULL, '[]',
                                                NULL, 1000, 600, 't', 't');
                   INSERT INTO scenarios VALUES ('scn_1', 'prj_1', 's', 'scripted', 'per_1', 1, '{}', 't', 't');
                   INSERT INTO tests VALUES ('tst_1', 'prj_1', 'a "test"', 'chn_1', 'scn_1',
                       '{"description":"d","iterations":2,"evaluators":[{"type":"contains","name":"c","text":"x","case_sensitive":false,"critical":true}],"pass_threshold":0.5,"tags":["t"]}',
                       '2026-11-23T10:00:00.123000Z', '2026-11-23T10:00:01.000000Z');
                   INSERT INTO test_personas VALUES ('tst_1', 0, 'per_2'), ('tst_1', 1, 'per_1');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let (served, typed) = store
            .read_blocking::<_, crate::failure::Failure, _>(|tx| {
                let served: String = tx.query_row("SELECT served FROM tests WHERE id = 'tst_1'", [], |r| r.get(0))?;
                Ok((served, crate::tests::load(tx, "tst_1")?))
            })
            .unwrap();
        assert_eq!(served, serde_json::to_string(&typed).unwrap());
        let v: serde_json::Value = serde_json::from_str(&served).unwrap();
        assert_eq!(v["persona_ids"], serde_json::json!(["per_2", "per_1"]));
        assert_eq!(v["name"], "a \"test\"");
        assert_eq!(v["created_at"], "2026-11-23T10:00:00.123Z");
        assert_eq!(v["updated_at"], "2026-11-23T10:00:01Z");
        assert_eq!(v["evaluators"][0]["text"], "x");
    }

    /// Migration 0014 gives the phone numbers already registered rows that
    /// page newest first in the order the integration shows them (their
    /// list order), and keeps that order.
    #[test]
    fn phone_numbers_registered_before_0014_page_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[13].0.starts_with("0014"));
            migrate_to(&mut conn, &path, 13).unwrap();
            conn.execute_batch(
                r#"INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't');
                   INSERT INTO integrations VALUES ('int_1', 'prj_1', 'twilio', 'tel', '{}', NULL, 't', 't');
                   INSERT INTO integration_phone_numbers VALUES ('int_1', 1, '+14155550102', 'b', 'both'),
                       ('int_1', 0, '+14155550101', 'a', 'inbound'), ('int_1', 2, '+14155550100', '', 'outbound');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let (newest_first, shown) = store
            .read_blocking::<_, crate::failure::Failure, _>(|tx| {
                let newest_first = tx
                    .prepare(
                        "SELECT number FROM integration_phone_numbers WHERE integration_id = 'int_1' ORDER BY seq DESC",
                    )?
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok((newest_first, crate::integrations::load(tx, "int_1")?))
            })
            .unwrap();
        let in_order = ["+14155550101", "+14155550102", "+14155550100"];
        assert_eq!(newest_first, in_order);
        assert_eq!(shown.phone_numbers.iter().map(|n| n.number.as_str()).collect::<Vec<_>>(), in_order);
        assert_eq!(shown.phone_numbers[0].label.as_str(), "a");
    }

    /// A panic on the writer thread after a commit (here in the callback
    /// that runs as the write is answered) ends the process, rather than
    /// leave it unable to write; the committed write is kept. Run in a child
    /// process: this test's binary again, told by an environment variable.
    #[test]
    fn a_panic_on_the_writer_after_a_commit_ends_the_process_and_keeps_the_write() {
        const CHILD: &str = "SPARRING_TEST_WRITER_PANIC_DB";
        if let Some(path) = std::env::var_os(CHILD) {
            let store = Store::open(Path::new(&path)).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let written = runtime.block_on(store.write_then(
                |tx| tx.execute_batch("CREATE TABLE kept (x); INSERT INTO kept VALUES (1);").map_err(StoreError::from),
                |_| panic!("a cache's callback failed"),
            ));
            // Stopped before the answer is read, the process never gets
            // here; should it, it does not end as aborted.
            std::thread::sleep(Duration::from_secs(5));
            eprintln!("the write was answered: {written:?}");
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let test = "store::tests::a_panic_on_the_writer_after_a_commit_ends_the_process_and_keeps_the_write";
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(CHILD, &path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&child.stderr);
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child.status.signal(), Some(6), "aborted (SIGABRT): {:?}\n{stderr}", child.status);
        assert!(stderr.contains("the database writer thread panicked"), "{stderr}");
        let kept: i64 = Connection::open(&path).unwrap().query_row("SELECT x FROM kept", [], |r| r.get(0)).unwrap();
        assert_eq!(kept, 1);
    }

    /// A test result is answered as its stored document (`runs`,
    /// `readable_result`): one stored before `blinded` was a field of
    /// `TestResult` (schema version 3) says it too once migrated, `null`,
    /// as the spec requires, and says the same as the typed result.
    #[test]
    fn results_stored_before_blinding_say_they_are_not_blinded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let typed: sparring_server::types::TestResult = serde_json::from_value(serde_json::json!({
            "id": "trs_1", "project_id": "prj_1", "run_id": "run_1", "batch_run_id": "brn_1", "test_id": "tst_1",
            "call_id": "call_1", "scenario_id": "scn_1", "scenario_version": 1, "persona_id": "per_1",
            "channel_id": "chn_1", "iteration": 1, "status": "passed", "score": 1.0, "failure_reason": null,
            "ended_reason": "caller_done", "started_at": "2026-11-23T01:00:00Z", "ended_at": "2026-11-23T01:00:02Z",
            "duration_ms": 2000,
            "transcript": [{"role": "caller", "text": "Hi.", "start_ms": 0, "end_ms": 0, "latency_ms": null},
                           {"role": "agent", "text": "Hello.", "start_ms": 10, "end_ms": 20, "latency_ms": 10}],
            "tool_calls": [],
            "metrics": {"turns": 2, "time_to_first_word_ms": 10,
                        "latency_ms": {"p50": 10, "p90": 10, "p95": 10, "max": 10}},
            "evaluations": [], "blinded": null, "credits": 1, "metadata": {},
            "created_at": "2026-11-23T01:00:02Z", "updated_at": "2026-11-23T01:00:02Z"
        }))
        .unwrap();
        // As the engine of schema version 3 wrote it: the same, without `blinded`.
        let mut old = serde_json::to_value(&typed).unwrap();
        assert!(old.as_object_mut().unwrap().remove("blinded").is_some());
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[3].0.starts_with("0004"));
            migrate_to(&mut conn, &path, 3).unwrap();
            conn.execute_batch("INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't');")
                .unwrap();
            conn.execute(
                "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status, created_at,
                                           document)
                 VALUES ('trs_1', 'prj_1', 'run_1', 'brn_1', 'tst_1', 'call_1', 'passed', 't', ?1)",
                [old.to_string()],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let document: String = store
            .read_blocking::<_, StoreError, _>(|c| {
                Ok(c.query_row("SELECT document FROM test_results WHERE id = 'trs_1'", [], |r| r.get(0))?)
            })
            .unwrap();
        let served: serde_json::Value = serde_json::from_str(&document).unwrap();
        assert_eq!(served.get("blinded"), Some(&serde_json::Value::Null), "{document}");
        assert_eq!(served, serde_json::to_value(&typed).unwrap());
    }

    /// Migration 0017 keeps the payer every project had: of its owners, the
    /// one who had been a member longest (an earlier owner who became an
    /// editor no longer counts).
    #[test]
    fn projects_made_before_0017_keep_their_payer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[16].0.starts_with("0017"));
            migrate_to(&mut conn, &path, 16).unwrap();
            conn.execute_batch(
                r#"INSERT INTO users (id, email, name, created_at) VALUES ('usr_a', 'a@x', 'a', 't'),
                       ('usr_b', 'b@x', 'b', 't'), ('usr_c', 'c@x', 'c', 't');
                   INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't'),
                                                            ('prj_2', 'q', '', 600, 10, 't', 't');
                   INSERT INTO project_members VALUES ('prj_1', 'usr_a', 'editor', '2026-01-01T00:00:00Z'),
                       ('prj_1', 'usr_c', 'owner', '2026-03-01T00:00:00Z'),
                       ('prj_1', 'usr_b', 'owner', '2026-02-01T00:00:00Z'),
                       ('prj_2', 'usr_a', 'owner', '2026-01-01T00:00:00Z');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let payers = store
            .read_blocking::<_, StoreError, _>(|tx| {
                Ok(["prj_1", "prj_2"].map(|p| crate::credits::payer_of(tx, p).unwrap()))
            })
            .unwrap();
        assert_eq!(payers, ["usr_b", "usr_a"]);
    }

    /// Migration 0020 gives the tests and scenarios already there what a
    /// start prices them from (iterations, pass threshold, longest call),
    /// as their documents say.
    #[test]
    fn tests_and_scenarios_made_before_0020_can_be_priced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[19].0.starts_with("0020"));
            migrate_to(&mut conn, &path, 19).unwrap();
            conn.execute_batch(
                r#"INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't');
                   INSERT INTO channels VALUES ('chn_1', 'prj_1', 'web', 'http', 'https://a.example', NULL, '[]',
                                                NULL, 1000, 600, 't', 't');
                   INSERT INTO scenarios VALUES ('scn_1', 'prj_1', 's', 'scripted', NULL, 1,
                       '{"description":"","steps":[],"success_criteria":[],"max_turns":10,"max_duration_s":90,"tags":[]}',
                       't', 't');
                   INSERT INTO tests (id, project_id, name, channel_id, scenario_id, document, created_at, updated_at)
                   VALUES ('tst_1', 'prj_1', 't', 'chn_1', 'scn_1',
                       '{"description":"","iterations":7,"evaluators":[],"pass_threshold":0.25,"tags":[]}', 't', 't');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let priced = store
            .read_blocking::<_, StoreError, _>(|tx| {
                let test: (u32, f64) =
                    tx.query_row("SELECT iterations, pass_threshold FROM tests WHERE id = 'tst_1'", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?;
                let scenario: u32 = tx.query_row(
                    "SELECT max_duration_s FROM scenarios INDEXED BY scenarios_priced WHERE id = 'scn_1'",
                    [],
                    |r| r.get(0),
                )?;
                Ok((test, scenario))
            })
            .unwrap();
        assert_eq!(priced, ((7, 0.25), 90));
    }

    /// Migration 0021 keeps the metrics of the calibrations already
    /// complete, as their labels and results give them then, and reads of
    /// them answer those from then on, whatever becomes of the results; an
    /// open one keeps none, and one whose metrics cannot be measured (a
    /// document that is not a result) is left without rather than stop the
    /// start.
    #[test]
    fn calibrations_complete_before_0021_keep_their_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[20].0.starts_with("0021"));
            migrate_to(&mut conn, &path, 20).unwrap();
            conn.execute_batch(
                r#"INSERT INTO users (id, email, name, created_at) VALUES ('usr_o', 'o@x', 'o', 't'),
                       ('usr_r', 'r@x', 'r', 't');
                   INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't');
                   INSERT INTO project_members VALUES ('prj_1', 'usr_o', 'owner', 't'),
                       ('prj_1', 'usr_r', 'reviewer', 't');
                   INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                             created_at, document)
                   VALUES ('trs_p', 'prj_1', 'run_1', 'brn_1', 'tst_1', 'call_1', 'passed', 't',
                           '{"status":"passed","evaluations":[{"name":"e","passed":true}]}'),
                          ('trs_f', 'prj_1', 'run_2', 'brn_1', 'tst_1', 'call_2', 'failed', 't',
                           '{"status":"failed","evaluations":[{"name":"e","passed":false}]}'),
                          ('trs_x', 'prj_1', 'run_3', 'brn_1', 'tst_1', 'call_3', 'failed', 't', 'not a result');
                   INSERT INTO calibrations (id, project_id, created_by, status, sample, created_at, closed_at)
                   VALUES ('cal_1', 'prj_1', 'usr_o', 'complete', NULL, '2026-11-01T00:00:00Z',
                           '2026-11-02T00:00:00Z'),
                          ('cal_2', 'prj_1', 'usr_o', 'complete', NULL, '2026-11-01T00:00:00Z',
                           '2026-11-02T00:00:00Z'),
                          ('cal_3', 'prj_1', 'usr_o', 'open', NULL, '2026-11-03T00:00:00Z', NULL);
                   INSERT INTO calibration_results VALUES ('cal_1', 'trs_p', 0), ('cal_1', 'trs_f', 1),
                       ('cal_2', 'trs_x', 0), ('cal_3', 'trs_p', 0);
                   INSERT INTO calibration_reviewers VALUES ('cal_1', 'usr_r', 0), ('cal_2', 'usr_r', 0),
                       ('cal_3', 'usr_o', 0);
                   INSERT INTO reviews VALUES
                       ('rev_1', 'prj_1', 'trs_p', 'usr_r', 'fail', '[{"name":"e","passed":false}]', '', 'cal_1', 't', 't'),
                       ('rev_2', 'prj_1', 'trs_f', 'usr_r', 'fail', '[{"name":"e","passed":false}]', '', 'cal_1', 't', 't');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let read = |id: &'static str| {
            store
                .read_blocking::<_, StoreError, _>(|tx| {
                    let kept: Option<String> =
                        tx.query_row("SELECT metrics FROM calibrations WHERE id = ?1", [id], |r| r.get(0))?;
                    let seen = (id == "cal_1").then(|| {
                        let c = crate::reviews::calibration::view(tx, "usr_o", id).unwrap();
                        serde_json::to_value((c.overall, c.per_evaluator, c.disagreements)).unwrap()
                    });
                    Ok((kept, seen))
                })
                .unwrap()
        };
        let (kept, seen) = read("cal_1");
        assert!(kept.is_some());
        // trs_p: automated pass, labelled fail; trs_f: fail, as labelled.
        // Agreement ½, Cohen's κ 0 (chance ½), TNR ½; one label per result
        // (no Fleiss' κ), no human pass (no TPR). The same for "e".
        let metrics = serde_json::json!({
            "agreement_rate": 0.5, "cohens_kappa": 0.0, "fleiss_kappa": null, "true_negative_rate": 0.5,
            "true_positive_rate": null,
            "undefined_reasons": {
                "fleiss_kappa": "no subject has labels from two reviewers or more",
                "true_positive_rate": "no result has a human-majority pass"
            }
        });
        let disagreement = |evaluator: Option<&str>| {
            serde_json::json!({"test_result_id": "trs_p", "evaluator": evaluator, "human_label": false,
                               "automated_label": true})
        };
        let expected = serde_json::json!([
            metrics,
            [{"name": "e", "metrics": metrics}],
            [disagreement(None), disagreement(Some("e"))]
        ]);
        assert_eq!(seen, Some(expected.clone()));
        assert_eq!(read("cal_2").0, None, "its result is no result: measured on read, as before");
        assert_eq!(read("cal_3").0, None, "open: measured on read");
        // Kept: a result going away later changes nothing.
        Connection::open(&path).unwrap().execute("DELETE FROM test_results WHERE id = 'trs_p'", []).unwrap();
        assert_eq!(read("cal_1").1, Some(expected));
    }

    /// Migration 0022 keeps, beside each result stored before it, the
    /// automated verdicts of its document (its overall one, and each
    /// evaluation's name and `passed`, in order), as the engine keeps them
    /// for each result it stores; a document that is not JSON gets none.
    #[test]
    fn results_stored_before_0022_keep_their_verdicts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[21].0.starts_with("0022"));
            migrate_to(&mut conn, &path, 21).unwrap();
            conn.execute_batch(
                r#"INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't');
                   INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                             created_at, document)
                   VALUES ('trs_p', 'prj_1', 'run_1', 'brn_1', 'tst_1', 'call_1', 'passed', 't',
                           '{"status":"passed","evaluations":[{"name":"a","passed":true,"score":1.0},
                                                             {"name":"b","passed":false,"score":0.0}]}'),
                          ('trs_f', 'prj_1', 'run_2', 'brn_1', 'tst_1', 'call_2', 'failed', 't',
                           '{"status":"failed","evaluations":[]}'),
                          ('trs_e', 'prj_1', 'run_3', 'brn_1', 'tst_1', 'call_3', 'error', 't', '{"status":"error"}'),
                          ('trs_x', 'prj_1', 'run_4', 'brn_1', 'tst_1', 'call_4', 'failed', 't', 'not a result');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let kept = store
            .read_blocking::<_, StoreError, _>(|tx| {
                let rows = tx
                    .prepare("SELECT test_result_id, passed, evaluations FROM result_verdicts ORDER BY test_result_id")?
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?, r.get::<_, String>(2)?)))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(rows)
            })
            .unwrap();
        let kept: Vec<(&str, bool, serde_json::Value)> =
            kept.iter().map(|(id, passed, e)| (id.as_str(), *passed, serde_json::from_str(e).unwrap())).collect();
        assert_eq!(
            kept,
            [
                ("trs_e", false, serde_json::json!([])),
                ("trs_f", false, serde_json::json!([])),
                ("trs_p", true, serde_json::json!([{"name": "a", "passed": true}, {"name": "b", "passed": false}])),
            ]
        );
    }

    /// Migration 0024: a result's `call_id` may be null. The results already
    /// stored of runs that made no call (their run's `call_id` null) name
    /// none, in the column the lookup by call id reads and in the document
    /// answered; the others keep theirs; the table's reviews are all still
    /// there (a rebuilt table would have taken them with it); and two
    /// results without a call can be stored.
    #[test]
    fn results_stored_before_0024_of_runs_without_a_call_name_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert!(MIGRATIONS[23].0.starts_with("0024"));
            migrate_to(&mut conn, &path, 23).unwrap();
            conn.execute_batch(
                r#"INSERT INTO users (id, email, name, created_at) VALUES ('usr_r', 'r@x', 'r', 't');
                   INSERT INTO projects (id, name, description, max_call_duration_s, default_concurrency, created_at,
                                         updated_at) VALUES ('prj_1', 'p', '', 600, 10, 't', 't');
                   INSERT INTO batch_runs (id, project_id, user_id, source, status, concurrency, metadata,
                                           created_at, updated_at)
                   VALUES ('brn_1', 'prj_1', 'usr_r', 'batch', 'completed', 10, '{}', 't', 't');
                   INSERT INTO runs (id, batch_run_id, project_id, user_id, test_id, scenario_id, iteration, status,
                                     call_id, test_result_id, queued_at, queued_ms, created_at, updated_at)
                   VALUES ('run_1', 'brn_1', 'prj_1', 'usr_r', 'tst_1', 'scn_1', 1, 'error', NULL, 'trs_1', 't', 0,
                           't', 't'),
                          ('run_2', 'brn_1', 'prj_1', 'usr_r', 'tst_1', 'scn_1', 2, 'passed', 'call_2', 'trs_2', 't',
                           0, 't', 't');
                   INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                             created_at, document)
                   VALUES ('trs_1', 'prj_1', 'run_1', 'brn_1', 'tst_1', 'call_1', 'error', 't',
                           '{"id":"trs_1","call_id":"call_1","status":"error"}'),
                          ('trs_2', 'prj_1', 'run_2', 'brn_1', 'tst_1', 'call_2', 'passed', 't',
                           '{"id":"trs_2","call_id":"call_2","status":"passed"}');
                   INSERT INTO reviews VALUES
                       ('rev_1', 'prj_1', 'trs_1', 'usr_r', 'fail', '[]', '', NULL, 't', 't'),
                       ('rev_2', 'prj_1', 'trs_2', 'usr_r', 'pass', '[]', '', NULL, 't', 't');"#,
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let (results, reviews) = store
            .read_blocking::<_, StoreError, _>(|tx| {
                let results: Vec<(String, Option<String>, serde_json::Value)> = tx
                    .prepare("SELECT id, call_id, document ->> '$.call_id' FROM test_results ORDER BY id")?
                    .query_map([], |r| {
                        let in_document: Option<String> = r.get(2)?;
                        Ok((r.get(0)?, r.get(1)?, serde_json::json!(in_document)))
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                let reviews: i64 = tx.query_row("SELECT count(*) FROM reviews", [], |r| r.get(0))?;
                Ok((results, reviews))
            })
            .unwrap();
        assert_eq!(
            results,
            [
                ("trs_1".to_string(), None, serde_json::Value::Null),
                ("trs_2".to_string(), Some("call_2".to_string()), serde_json::json!("call_2"))
            ]
        );
        assert_eq!(reviews, 2);
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                               created_at, document)
                     VALUES ('trs_3', 'prj_1', 'run_3', 'brn_1', 'tst_1', NULL, 'error', 't', '{}'),
                            ('trs_4', 'prj_1', 'run_4', 'brn_1', 'tst_1', NULL, 'error', 't', '{}')",
                )?;
                let check: String = tx.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
                assert_eq!(check, "ok");
                Ok(())
            })
            .unwrap();
    }

    /// Under writes that never pause (each its own group, as `write` sends
    /// them to the writer thread), the WAL is still started over once it
    /// holds more than [`RESTART_FRAMES`]: a passive checkpoint alone would
    /// let it grow without bound.
    #[tokio::test]
    async fn the_wal_starts_over_under_sustained_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, path) = filler_store(dir.path());
        let observer = Connection::open(&path).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut most = 0;
        loop {
            assert!(std::time::Instant::now() < deadline, "the WAL never started over (it reached {most} frames)");
            write_filler(&store).await;
            let frames = wal_frames(&observer);
            if most > RESTART_FRAMES && frames < most / 2 {
                break;
            }
            most = most.max(frames);
        }
        // The WAL went past the threshold, then began again from its start,
        // while nothing but writes happened.
        assert!(most > RESTART_FRAMES);
    }

    /// A write larger than the page cache that fails writes nothing to the
    /// WAL: the writer never spills frames before its commit, so none can
    /// be left gathered by the rollback (see `wal_writes`).
    #[tokio::test]
    async fn a_large_write_that_fails_leaves_the_wal_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = filler_store(dir.path());
        let wal = dir.path().join("db.sqlite-wal");
        let before = std::fs::metadata(&wal).unwrap().len();
        // ~16 MB of pages, eight times the default cache, then a failure.
        let failed = store
            .write::<(), StoreError, _>(|tx| {
                let n = tx.execute(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
                     INSERT INTO filler SELECT randomblob(4000) FROM n",
                    [],
                )?;
                assert_eq!(n, 4000);
                Err(rusqlite::Error::QueryReturnedNoRows.into())
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(std::fs::metadata(&wal).unwrap().len(), before, "frames of a failed write reached the WAL");
        assert_eq!(rows(&store, "filler").await, 0);
    }

    /// Another process's long read (a backup, a `sqlite3` shell) holds its
    /// snapshot of the WAL: the WAL cannot start over meanwhile, and writes
    /// go on rather than wait for the reader (each `RESTART` waited the
    /// whole busy timeout, 10 s, and was asked again after the next group).
    /// Once the reader is gone, the WAL starts over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_read_elsewhere_does_not_hold_up_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, path) = filler_store(dir.path());
        write_filler(&store).await;
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader.query_row("SELECT count(*) FROM filler", [], |r| r.get(0)).unwrap();
        // 16 pages a write: past RESTART_FRAMES twice over.
        let mut slowest = Duration::ZERO;
        for _ in 0..(2 * RESTART_FRAMES / 16) {
            slowest = slowest.max(write_filler(&store).await);
        }
        assert!(slowest < BUSY_TIMEOUT / 2, "a write waited {slowest:?} for the reader");
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        let observer = Connection::open(&path).unwrap();
        let most = wal_frames(&observer);
        assert!(most > RESTART_FRAMES, "the reader kept the WAL from starting over: {most} frames");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while wal_frames(&observer) >= most {
            assert!(std::time::Instant::now() < deadline, "the WAL never started over once the reader left");
            write_filler(&store).await;
        }
    }

    /// The rows of `table`, read through `store`.
    async fn rows(store: &Store, table: &'static str) -> i64 {
        store
            .read::<i64, StoreError, _>(move |c| {
                Ok(c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?)
            })
            .await
            .unwrap()
    }

    /// A store on a new file in `dir` with a table `filler`, and the file.
    fn filler_store(dir: &Path) -> (Store, std::path::PathBuf) {
        let path = dir.join("db.sqlite");
        let store = Store::open(&path).unwrap();
        store.write_blocking::<_, StoreError, _>(|tx| Ok(tx.execute_batch("CREATE TABLE filler (b BLOB)")?)).unwrap();
        (store, path)
    }

    /// Writes 64 KiB to `filler`: 16 pages, so the WAL passes
    /// [`RESTART_FRAMES`] in a few hundred writes. Returns how long it took.
    async fn write_filler(store: &Store) -> Duration {
        let at = std::time::Instant::now();
        store
            .write::<_, StoreError, _>(|tx| {
                Ok(tx.execute("INSERT INTO filler VALUES (randomblob(65536))", []).map(drop)?)
            })
            .await
            .unwrap();
        at.elapsed()
    }

    /// The frames in the WAL, as `observer` (another connection) sees it.
    fn wal_frames(observer: &Connection) -> i64 {
        observer.query_row("PRAGMA wal_checkpoint(NOOP)", [], |r| r.get(1)).unwrap()
    }

    /// A read is one snapshot: a write committed while it runs is not
    /// seen by its later statements, and the next read sees it. The
    /// connection is pooled again once the read has ended, and used next.
    #[test]
    fn a_read_sees_one_snapshot_and_the_next_read_sees_what_came_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let add = |id: &str| {
            let sql = format!("INSERT INTO users (id, name, created_at) VALUES ('{id}', 'a', 'now')");
            store.write_blocking::<_, StoreError, _>(|tx| Ok(tx.execute(&sql, []).map(drop)?)).unwrap();
        };
        let count = |c: &Connection| c.query_row("SELECT count(*) FROM users", [], |r| r.get::<_, i64>(0));
        add("usr_1");
        let (before, after) = store
            .read_blocking::<_, StoreError, _>(|c| {
                let before = count(c)?;
                add("usr_2");
                Ok((before, count(c)?))
            })
            .unwrap();
        assert_eq!((before, after), (1, 1));
        assert_eq!(store.inner.readers.lock().unwrap().len(), 1);
        assert_eq!(store.read_blocking::<_, StoreError, _>(|c| Ok(count(c)?)).unwrap(), 2);
        assert_eq!(store.inner.readers.lock().unwrap().len(), 1);
    }

    /// A row read is its statement alone: it finds a row or none, sees what
    /// was committed before it, fails cleanly on a bad statement, and each
    /// time leaves its connection pooled outside any transaction.
    #[test]
    fn a_row_read_sees_what_came_before_it_and_leaves_no_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let add = |id: &str, name: &str| {
            let sql = format!("INSERT INTO users (id, name, created_at) VALUES ('{id}', '{name}', 'now')");
            store.write_blocking::<_, StoreError, _>(|tx| Ok(tx.execute(&sql, []).map(drop)?)).unwrap();
        };
        let name = |id: &str| {
            store.read_row::<_, StoreError, _, _>("SELECT name FROM users WHERE id = ?1", [id], |r| {
                r.get::<_, String>(0)
            })
        };
        let pooled_outside_a_transaction = || {
            let readers = store.inner.readers.lock().unwrap();
            readers.len() == 1 && readers[0].is_autocommit()
        };
        add("usr_1", "one");
        assert_eq!(name("usr_1").unwrap().as_deref(), Some("one"));
        assert!(pooled_outside_a_transaction());
        assert_eq!(name("usr_2").unwrap(), None);
        add("usr_2", "two");
        assert_eq!(name("usr_2").unwrap().as_deref(), Some("two"));
        assert!(pooled_outside_a_transaction());
        let bad = store.read_row::<i64, StoreError, _, _>("SELECT nothing FROM users", [], |r| r.get(0));
        assert!(bad.is_err());
        assert!(pooled_outside_a_transaction());
    }

    #[tokio::test]
    async fn migrates_once_and_reads_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = Store::open(&path).unwrap();
        store
            .write::<_, StoreError, _>(|tx| {
                tx.execute("INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'a', 'now')", [])?;
                Ok(())
            })
            .await
            .unwrap();
        drop(store);
        // Reopening applies nothing twice and keeps the data.
        let store = Store::open(&path).unwrap();
        assert_eq!(rows(&store, "users").await, 1);
    }

    /// A write whose commit finds the disk full fails as `Full` (the API's
    /// 503 `storage_full`), keeps nothing, and leaves the store working: the
    /// next write, once there is room, commits, and reads went on.
    #[tokio::test]
    async fn a_write_on_a_full_disk_fails_as_full_and_the_next_one_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = Store::open(&path).unwrap();
        let add = |id: &'static str| {
            store.write::<(), StoreError, _>(move |tx| {
                tx.execute("INSERT INTO users (id, name, created_at) VALUES (?1, 'a', 'now')", [id])?;
                Ok(())
            })
        };
        add("usr_before").await.unwrap();
        crate::wal_writes::full_disk::set(&path, true);
        let refused = add("usr_full").await;
        crate::wal_writes::full_disk::set(&path, false);
        let e = refused.expect_err("a commit on a full disk");
        assert!(e.is_full(), "{e}");
        assert!(matches!(e, StoreError::Full(_)), "{e:?}");
        assert_eq!(rows(&store, "users").await, 1, "nothing of the refused write was kept");
        add("usr_after").await.unwrap();
        assert_eq!(rows(&store, "users").await, 2);
        // And other failures are not taken for a full disk.
        let duplicate = add("usr_after").await.expect_err("a duplicate id");
        assert!(!duplicate.is_full(), "{duplicate}");
    }

    #[tokio::test]
    async fn a_failed_write_rolls_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let r = store
            .write::<(), StoreError, _>(|tx| {
                tx.execute("INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'a', 'now')", [])?;
                tx.execute("INSERT INTO users (id, name, created_at) VALUES ('usr_1', 'b', 'now')", [])?;
                Ok(())
            })
            .await;
        assert!(r.is_err());
        assert_eq!(rows(&store, "users").await, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_committed_together_stay_all_or_nothing_each() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        // Many writes at once, so that groups of several form; every third
        // one fails halfway, one panics.
        let writes = (0..60).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write::<_, StoreError, _>(move |tx| {
                        tx.execute(
                            "INSERT INTO users (id, name, created_at) VALUES (?1, 'a', 'now')",
                            [format!("usr_{i}")],
                        )?;
                        if i == 31 {
                            panic!("a write that panics");
                        }
                        if i % 3 == 0 {
                            // A duplicate id: the second statement fails.
                            tx.execute(
                                "INSERT INTO users (id, name, created_at) VALUES (?1, 'b', 'now')",
                                [format!("usr_{i}")],
                            )?;
                        }
                        Ok(i)
                    })
                    .await
            })
        });
        let results = futures::future::join_all(writes).await;
        for (i, r) in results.into_iter().enumerate() {
            let r = r.unwrap();
            assert_eq!(r.is_ok(), i % 3 != 0 && i != 31, "write {i}: {:?}", r.err());
        }
        // Reopened: what was acknowledged is there, nothing else.
        drop(store);
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let ids = column(&store, "SELECT id FROM users ORDER BY CAST(substr(id, 5) AS INTEGER)").await;
        let expected: Vec<String> = (0..60).filter(|i| i % 3 != 0 && *i != 31).map(|i| format!("usr_{i}")).collect();
        assert_eq!(ids, expected);
    }

    /// The write that holds the writer thread (see [`hold_writer`]).
    type Held<'s> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, StoreError>> + 's>>;

    /// Holds the writer thread in a write of its own until `release` is
    /// sent, so that the writes queued meanwhile form one group; the write
    /// holding it answers `true` once let go.
    async fn hold_writer(store: &Store) -> (std::sync::mpsc::Sender<()>, Held<'_>) {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (began, beginning) = std::sync::mpsc::channel::<()>();
        let mut holding: Held<'_> = Box::pin(store.write::<_, StoreError, _>(move |_| {
            began.send(()).unwrap();
            Ok(held.recv().is_ok())
        }));
        assert!(futures::poll!(&mut holding).is_pending());
        beginning.recv().unwrap();
        (release, holding)
    }

    fn insert_user(tx: &rusqlite::Transaction<'_>, i: usize) -> rusqlite::Result<usize> {
        tx.execute("INSERT INTO users (id, name, created_at) VALUES (?1, 'a', 'now')", [format!("usr_{i}")])
    }

    /// One group, its jobs in a known order: a failing first job (run
    /// without a savepoint: its transaction is rolled back and the rest go
    /// on in another), a failing job after good ones (rolled back to its
    /// savepoint), good ones around them.
    #[tokio::test]
    async fn a_group_whose_first_write_fails_keeps_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let (release, holding) = hold_writer(&store).await;
        let fails = [true, false, false, true, false];
        let mut group = Vec::new();
        for (i, fail) in fails.into_iter().enumerate() {
            let mut write = Box::pin(store.write::<_, StoreError, _>(move |tx| {
                insert_user(tx, i)?;
                if fail {
                    // A duplicate id: the second statement fails.
                    insert_user(tx, i)?;
                }
                Ok(i)
            }));
            // Polled once, the write is queued.
            assert!(futures::poll!(&mut write).is_pending());
            group.push(write);
        }
        release.send(()).unwrap();
        assert!(holding.await.unwrap());
        for (i, (write, fail)) in group.into_iter().zip(fails).enumerate() {
            let r = write.await;
            assert_eq!(r.is_err(), fail, "write {i}: {r:?}");
        }
        assert_eq!(column(&store, "SELECT id FROM users ORDER BY id").await, ["usr_1", "usr_2", "usr_4"]);
    }

    /// A statement that finds the disk full (here: past the writer's
    /// `max_page_count`) with no statement journal to undo it alone makes
    /// SQLite roll back the whole transaction, and with it the writes kept
    /// before it in the group. Each of those gets a true answer: one that
    /// can run again runs again in the next transaction, one that cannot is
    /// told the disk is full (503 `storage_full`), as the failed write is;
    /// the writes after them go on. They were told the database had rolled
    /// back their transaction, a 500.
    #[tokio::test]
    async fn a_statement_on_a_full_disk_answers_every_write_of_its_group() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        // No page can be added: a user fits in the table's page, a user of
        // 1 MiB does not.
        store
            .write::<_, StoreError, _>(|tx| {
                let pages: i64 = tx.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                let max: i64 = tx.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| r.get(0))?;
                assert_eq!(max, pages);
                Ok(())
            })
            .await
            .unwrap();
        let (release, holding) = hold_writer(&store).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let mut again = Box::pin(store.write_then_again(
            move |tx| {
                counted.fetch_add(1, Ordering::Relaxed);
                Ok::<_, StoreError>(insert_user(tx, 0)?)
            },
            |_| (),
        ));
        let mut once = Box::pin(store.write(|tx| Ok::<_, StoreError>(insert_user(tx, 1)?)));
        let mut fills = Box::pin(store.write(|tx| {
            let name = "x".repeat(1 << 20);
            Ok::<_, StoreError>(
                tx.execute("INSERT INTO users (id, name, created_at) VALUES ('usr_2', ?1, 'now')", [name])?,
            )
        }));
        let mut after = Box::pin(store.write(|tx| Ok::<_, StoreError>(insert_user(tx, 3)?)));
        // Polled in this order, they are queued in it: one group.
        assert!(futures::poll!(&mut again).is_pending());
        assert!(futures::poll!(&mut once).is_pending());
        assert!(futures::poll!(&mut fills).is_pending());
        assert!(futures::poll!(&mut after).is_pending());
        release.send(()).unwrap();
        assert!(holding.await.unwrap());
        let fills = fills.await.expect_err("a user past the pages the database may have");
        assert!(fills.is_full(), "{fills:?}");
        let once = once.await.expect_err("rolled back with the transaction, and it cannot run again");
        assert!(once.is_full(), "{once:?}");
        assert_eq!(again.await.unwrap(), 1);
        assert_eq!(runs.load(Ordering::Relaxed), 2, "run again in the next transaction");
        assert_eq!(after.await.unwrap(), 1);
        assert_eq!(column(&store, "SELECT id FROM users ORDER BY id").await, ["usr_0", "usr_3"]);
    }

    /// Writes that can run again run without savepoints: one that fails
    /// having changed something is undone with its transaction and the
    /// writes kept before it run again; one that fails having changed
    /// nothing undoes nothing; after a write that can run only once, the
    /// rest run in savepoints again.
    #[tokio::test]
    async fn a_write_that_can_run_again_is_undone_alone_without_a_savepoint() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let (release, holding) = hold_writer(&store).await;
        #[derive(Clone, Copy, PartialEq, Debug)]
        enum Does {
            Insert,
            FailUnchanged,
            FailChanged,
            PanicChanged,
        }
        use Does::*;
        // (what it does, whether it can run again, how many times it runs)
        let writes = [
            (Insert, true, 3),
            (Insert, true, 3),
            (FailUnchanged, true, 1),
            (FailChanged, true, 1),
            (Insert, true, 2),
            (PanicChanged, true, 1),
            (Insert, false, 1),
            (FailChanged, true, 1),
            (Insert, true, 1),
        ];
        let runs: Arc<Vec<AtomicUsize>> = Arc::new(writes.iter().map(|_| AtomicUsize::new(0)).collect());
        let mut group = Vec::new();
        for (i, (does, again, _)) in writes.into_iter().enumerate() {
            let runs = runs.clone();
            let f = move |tx: &rusqlite::Transaction<'_>| {
                runs[i].fetch_add(1, Ordering::Relaxed);
                match does {
                    Insert => insert_user(tx, i)?,
                    FailUnchanged => {
                        tx.execute("UPDATE users SET name = 'b' WHERE id = 'usr_none'", [])?;
                        return Err(StoreError::Task("refused".into()));
                    }
                    FailChanged => {
                        insert_user(tx, i)?;
                        // A duplicate id: the second statement fails.
                        insert_user(tx, i)?
                    }
                    PanicChanged => {
                        insert_user(tx, i)?;
                        panic!("a write that panics");
                    }
                };
                Ok(i)
            };
            let mut write: std::pin::Pin<Box<dyn std::future::Future<Output = Result<usize, StoreError>>>> =
                if again { Box::pin(store.write_then_again(f, |_| ())) } else { Box::pin(store.write(f)) };
            assert!(futures::poll!(&mut write).is_pending());
            group.push(write);
        }
        release.send(()).unwrap();
        assert!(holding.await.unwrap());
        for (i, (write, (does, _, times))) in group.into_iter().zip(writes).enumerate() {
            let r = write.await;
            assert_eq!(r.is_ok(), does == Insert, "write {i}: {r:?}");
            assert_eq!(runs[i].load(Ordering::Relaxed), times, "runs of write {i}");
        }
        assert_eq!(
            column(&store, "SELECT id FROM users ORDER BY id").await,
            ["usr_0", "usr_1", "usr_4", "usr_6", "usr_8"]
        );
    }

    /// What makes an acknowledged write durable: the writer commits in WAL
    /// mode with `synchronous = FULL` (the WAL synced at every commit), and
    /// readers (which never commit) open the database the same way.
    #[tokio::test]
    async fn every_connection_commits_in_wal_with_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let modes = |c: &Connection| -> Result<(String, i64), StoreError> {
            Ok((
                c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?,
                c.query_row("PRAGMA synchronous", [], |r| r.get(0))?,
            ))
        };
        let full = 2;
        assert_eq!(store.write(move |tx| modes(tx)).await.unwrap(), ("wal".to_string(), full));
        assert_eq!(store.write_blocking(|tx| modes(tx)).unwrap(), ("wal".to_string(), full));
        assert_eq!(store.read(modes).await.unwrap(), ("wal".to_string(), full));
    }

    /// The first column of every row `sql` gives, as text.
    async fn column(store: &Store, sql: &'static str) -> Vec<String> {
        store
            .read::<_, StoreError, _>(|tx| {
                Ok(tx.prepare(sql)?.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?)
            })
            .await
            .unwrap()
    }

    #[test]
    fn cached_statements_are_not_prepared_again_at_each_use() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let sql = "SELECT id FROM api_keys WHERE user_id = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3";
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                for limit in [10, 20, 10, 51] {
                    let mut stmt = tx.prepare_cached(sql)?;
                    stmt.query_map(rusqlite::params!["usr_1", None::<String>, limit], |r| r.get::<_, String>(0))?
                        .for_each(drop);
                }
                let stmt = tx.prepare_cached(sql)?;
                assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
                Ok(())
            })
            .unwrap();
    }

    /// A watch is told of the changes it names, by either kind of write,
    /// cascades included, before the write is answered; not of others.
    #[tokio::test]
    async fn a_watch_sees_the_changes_it_names_before_the_write_is_answered() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                tx.execute_batch(
                    "CREATE TABLE parent (id TEXT PRIMARY KEY);
                     CREATE TABLE child (id TEXT PRIMARY KEY, parent TEXT REFERENCES parent (id) ON DELETE CASCADE);",
                )?;
                Ok(())
            })
            .unwrap();
        let told = Arc::new(AtomicUsize::new(0));
        {
            let told = told.clone();
            store.watch(&[("child", &[Action::SQLITE_UPDATE, Action::SQLITE_DELETE])], move || {
                told.fetch_add(1, Ordering::SeqCst);
            });
        }
        let write = |sql: &'static str| {
            let store = store.clone();
            async move { store.write(move |tx| tx.execute_batch(sql).map_err(StoreError::from)).await.unwrap() }
        };
        let told = || told.load(Ordering::SeqCst);
        // Inserts are not watched; another table's update is not either.
        write("INSERT INTO parent VALUES ('p'); INSERT INTO child VALUES ('c1', 'p'), ('c2', 'p');").await;
        write("UPDATE parent SET id = id").await;
        assert_eq!(told(), 0);
        // Once per transaction, however many rows changed.
        write("UPDATE child SET id = id").await;
        assert_eq!(told(), 1);
        store
            .write_blocking(|tx| tx.execute_batch("UPDATE child SET id = id WHERE id = 'c1'").map_err(StoreError::from))
            .unwrap();
        assert_eq!(told(), 2);
        // Rows deleted by a cascade from another table.
        write("DELETE FROM parent").await;
        assert_eq!(told(), 3);
        // A write that failed and was rolled back still tells (harmless).
        let failed: Result<(), StoreError> = store
            .write(|tx| {
                tx.execute_batch("INSERT INTO parent VALUES ('q'); INSERT INTO child VALUES ('c3', 'q');")?;
                tx.execute_batch("DELETE FROM child")?;
                Err(StoreError::Task("refused".into()))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(told(), 4);
        write("INSERT INTO parent VALUES ('r')").await;
        assert_eq!(told(), 4);
    }
}
