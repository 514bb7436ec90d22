//! The SQLite database: one writer, a pool of readers, WAL.
//!
//! SQLite allows one writer at a time; rather than let connections contend
//! for the write lock (and fail with `SQLITE_BUSY` under load), all writes go
//! through the single writer connection, each in a `BEGIN IMMEDIATE`
//! transaction that takes the lock up front, so a transaction never has to
//! be retried halfway. Reads use their own connections and, thanks to WAL,
//! never wait for the writer. Every call runs on tokio's blocking pool.
//!
//! `synchronous = FULL`: a write is on disk when its transaction returns, so
//! an acknowledged request survives a crash or power loss.
//!
//! The schema is the numbered files in `impl/migrations/`, applied in order
//! on open and recorded in `PRAGMA user_version`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

/// The migrations, in order. Append only: a released file never changes.
const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_foundation", include_str!("../migrations/0001_foundation.sql")),
    ("0002_projects_and_testing_model", include_str!("../migrations/0002_projects_and_testing_model.sql")),
    ("0003_engine", include_str!("../migrations/0003_engine.sql")),
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database task failed: {0}")]
    Task(String),
    #[error("database {path} has schema version {found}, newer than this build knows ({known}); upgrade sparring")]
    TooNew { path: PathBuf, found: usize, known: usize },
}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub fn open(path: &Path) -> StoreResult<Store> {
        let mut writer = Connection::open(path)?;
        configure(&writer)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        migrate(&mut writer, path)?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(writer),
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the writer; commits if
    /// it returns `Ok`, rolls back otherwise.
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.write_blocking(f))
            .await
            .map_err(|e| E::from(StoreError::Task(e.to_string())))?
    }

    /// [`Store::write`] on the current thread, for callers that are
    /// already off the async runtime (admin commands).
    pub fn write_blocking<T, E, F>(&self, f: F) -> Result<T, E>
    where
        E: From<StoreError>,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E>,
    {
        // A panic while holding the lock poisons it; the connection itself
        // is still usable (the transaction rolled back on drop).
        let mut conn = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(StoreError::from)?;
        let value = f(&tx)?;
        tx.commit().map_err(StoreError::from)?;
        Ok(value)
    }

    /// Runs `f` on a reader connection (a consistent snapshot).
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let mut conn = match pooled {
                Some(c) => c,
                None => open_reader(&inner.path)?,
            };
            let result = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(StoreError::from)?;
                let value = f(&tx)?;
                tx.finish().map_err(StoreError::from)?;
                Ok(value)
            })();
            inner.readers.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
            result
        })
        .await
        .map_err(|e| E::from(StoreError::Task(e.to_string())))?
    }
}

fn configure(conn: &Connection) -> StoreResult<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(())
}

fn open_reader(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    configure(&conn)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection, path: &Path) -> StoreResult<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(0);
    if version > MIGRATIONS.len() {
        return Err(StoreError::TooNew { path: path.to_path_buf(), found: version, known: MIGRATIONS.len() });
    }
    for (i, (_name, sql)) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let n: i64 = store
            .read::<_, StoreError, _>(|tx| Ok(tx.query_row("SELECT count(*) FROM users", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(n, 1);
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
        let n: i64 = store
            .read::<_, StoreError, _>(|tx| Ok(tx.query_row("SELECT count(*) FROM users", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(n, 0);
    }
}
