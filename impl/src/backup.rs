//! `sparring admin backup`: a copy of a data dir that a server can start on,
//! made beside a running server or not.
//!
//! The database is copied by SQLite's `VACUUM INTO` in one read transaction,
//! so the copy is one consistent moment of it (the server's writes go on
//! meanwhile; those committed after the moment are not in it), compacted,
//! with no write-ahead log beside it. The secret key goes with it, or the
//! stored secrets (credentials, header values, webhook secrets) could never be
//! read again; and the previous keys of a rotation that did not finish, which
//! some secrets may still be sealed with. Those keys must open the copy's
//! sealed secrets, as a server started on it checks; a key that does not
//! (another data dir's, a wrong `--secret-key-file`) is refused before the
//! copy is named as a database.
//!
//! A key rotation (`admin rotate-secret-key`, with the server stopped) could
//! change the key files while the copy is made, so that the copied database
//! and the copied key disagree; the key files are read before and after the
//! copy, and the copy is made again if they changed.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::{secrets, store, DATABASE_FILE};

/// What a backup holds.
#[derive(Debug)]
pub struct Backup {
    pub database_bytes: u64,
    pub schema_version: usize,
    /// Stored secrets sealed in the copy.
    pub sealed: usize,
    /// Whether the secret key (and any previous ones) went with it.
    pub with_key: bool,
}

/// The key files' contents: the current key and the previous ones.
#[derive(PartialEq)]
struct Keys {
    current: Option<Vec<u8>>,
    previous: Option<Vec<u8>>,
}

impl Keys {
    fn read(key_path: &Path) -> anyhow::Result<Keys> {
        let read = |p: &Path| match std::fs::read(p) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
        };
        Ok(Keys { current: read(key_path)?, previous: read(&secrets::previous_path(key_path))? })
    }
}

/// Copies `data_dir` (its key at `key_file`, or the data dir's own) to
/// `to`, a directory that must not exist or be empty. `copying` is told the
/// bytes of data the copy is about to read (what the database holds, its
/// free pages left out), once, before it starts.
pub fn backup(
    data_dir: &Path,
    key_file: Option<PathBuf>,
    to: &Path,
    copying: impl FnOnce(u64),
) -> anyhow::Result<Backup> {
    crate::require_data_dir(data_dir)?;
    let source = data_dir.join(DATABASE_FILE);
    let found = store::schema_version(&source).with_context(|| format!("reading {}", source.display()))?;
    if found > store::SCHEMA_VERSION {
        anyhow::bail!(
            "{} was written by a newer build (schema version {found}, this build's is {}): back it up with that \
             build",
            data_dir.display(),
            store::SCHEMA_VERSION
        );
    }
    // The copy is written under another name, and renamed once whole: an
    // interrupted backup leaves no file a server would start on.
    let partial = to.join(format!("{DATABASE_FILE}.partial"));
    match std::fs::read_dir(to) {
        Ok(entries) => {
            // What an earlier backup that failed left is no reason to
            // refuse: it is written over.
            let mut others = entries.filter(|e| e.as_ref().map_or(true, |e| e.path() != partial));
            if others.next().is_some() {
                anyhow::bail!("{} is not empty: back up into a new directory", to.display());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", to.display())),
    }
    // Readable by its owner only, like the data dir: it holds the same. An
    // empty directory given keeps the mode it was made with otherwise.
    let parents = parents_to_sync(to);
    crate::create_data_dir(to)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} readable by its owner only", to.display()))?;
    }
    let key_path = key_file.unwrap_or_else(|| data_dir.join(secrets::KEY_FILE));
    let copy = to.join(DATABASE_FILE);
    let mut keys = None;
    let mut copying = Some(copying);
    for _ in 0..3 {
        let before = Keys::read(&key_path)?;
        let _ = std::fs::remove_file(&partial);
        // Made empty and readable by its owner only before SQLite writes
        // into it (`VACUUM INTO` takes an empty file), so the copy is 0600
        // like the database it copies, wherever it is moved later.
        write_private(&partial, &[])?;
        let conn = rusqlite::Connection::open_with_flags(&source, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .with_context(|| format!("opening {}", source.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        if let Some(say) = copying.take() {
            let pages = |pragma: &str| conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get::<_, i64>(0));
            let used = (pages("page_count")? - pages("freelist_count")?) * pages("page_size")?;
            say(u64::try_from(used).unwrap_or(0));
        }
        let target = partial.to_str().with_context(|| format!("{} is not UTF-8", partial.display()))?;
        conn.execute("VACUUM INTO ?1", [target]).with_context(|| format!("copying {}", source.display()))?;
        drop(conn);
        if Keys::read(&key_path)? == before {
            keys = Some(before);
            break;
        }
    }
    let keys = keys.context("the secret key kept changing during the copy (a key rotation?): try again")?;

    // On disk before it is named as a database, whatever SQLite synced.
    std::fs::File::open(&partial)?.sync_all()?;
    let conn = rusqlite::Connection::open(&partial)?;
    let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        anyhow::bail!("the copy does not check out ({check}); it is left at {}", partial.display());
    }
    // Refused for its key, the copy is removed: a whole copy of the data
    // (transcripts, emails) left in a directory made for a backup is one
    // more to keep safe, and the next attempt copies afresh anyway.
    let refuse = |e: anyhow::Error| {
        let _ = std::fs::remove_file(&partial);
        e
    };
    let sealed = crate::reseal::count_sealed(&conn)?;
    if sealed > 0 && keys.current.is_none() {
        drop(conn);
        return Err(refuse(anyhow::anyhow!(
            "the database holds {sealed} sealed secrets but there is no secret key at {}: give the key file the \
             server uses with --secret-key-file (the backup is not made, and its copy removed)",
            key_path.display(),
        )));
    }
    // The keys that go with the copy must open it, as a server started on
    // it requires (`start`): another data dir's key, or a wrong
    // --secret-key-file, would make a backup whose secrets are lost.
    if let Some(current) = &keys.current {
        let secrets = match secrets::Secrets::from_contents(&key_path, current, keys.previous.as_deref()) {
            Ok(secrets) => secrets,
            Err(e) => {
                drop(conn);
                return Err(refuse(anyhow::Error::new(e).context("the backup is not made, and its copy removed")));
            }
        };
        if let Some(context) = crate::reseal::key_opens(&conn, &secrets)? {
            drop(conn);
            let advice = "Give the key file the server uses with --secret-key-file (or SPARRING_SECRET_KEY_FILE); the \
                          backup is not made, and its copy removed";
            return Err(refuse(crate::reseal::wrong_key(&key_path, "the database", &context, advice)));
        }
    }
    drop(conn);
    let to_key = to.join(secrets::KEY_FILE);
    for (bytes, path) in [(&keys.current, to_key.clone()), (&keys.previous, secrets::previous_path(&to_key))] {
        if let Some(bytes) = bytes {
            write_private(&path, bytes)?;
        }
    }
    std::fs::rename(&partial, &copy)
        .with_context(|| format!("renaming {} to {}", partial.display(), copy.display()))?;
    // The backup is durable once the directories naming its files are:
    // `to`, then its parent and those of the directories made for it.
    std::fs::File::open(to)?.sync_all()?;
    for dir in &parents {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(Backup {
        database_bytes: std::fs::metadata(&copy)?.len(),
        schema_version: found,
        sealed,
        with_key: keys.current.is_some(),
    })
}

/// The directories whose entries name `to` or a directory that creating
/// `to` makes, nearest first: `to`'s parent, and up to the first directory
/// that exists. Read before `to` is created.
fn parents_to_sync(to: &Path) -> Vec<PathBuf> {
    let mut parents = Vec::new();
    let mut dir = to;
    while let Some(parent) = dir.parent() {
        let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
        parents.push(parent.to_path_buf());
        if parent.exists() {
            break;
        }
        dir = parent;
    }
    parents
}

/// Writes `bytes` to a new file at `path` readable by its owner only, and
/// syncs it.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut f = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `to`'s parent always (its entry for `to`), and each directory made
    /// for `to` has its parent synced too, up to one that was there.
    #[test]
    fn the_directories_naming_a_new_backup_are_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let nested = t.join("a/b/c");
        assert_eq!(parents_to_sync(&nested), [t.join("a/b"), t.join("a"), t.to_path_buf()]);
        std::fs::create_dir(t.join("a")).unwrap();
        assert_eq!(parents_to_sync(&nested), [t.join("a/b"), t.join("a")]);
        std::fs::create_dir_all(&nested).unwrap();
        assert_eq!(parents_to_sync(&nested), [t.join("a/b")]);
        assert_eq!(parents_to_sync(Path::new("nightly")), [Path::new(".")]);
        assert_eq!(parents_to_sync(Path::new("/")), Vec::<PathBuf>::new());
    }
}
