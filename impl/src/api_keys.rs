//! API keys: creation, listing, revocation, rotation, and lookup by secret.
//!
//! A key is `spk_` followed by 43 base64url characters (256 random bits).
//! Only its blake3 hash is stored; the raw key exists in memory for the one
//! response that shows it. A user has at most [`MAX_ACTIVE_KEYS`] active
//! keys; the count and the insert happen in one write transaction, and all
//! writes are serialized (see `store`), so concurrent creates cannot exceed it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::LazyLock;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use rand::RngCore as _;
use rusqlite::{params, OptionalExtension as _};

use crate::activity::{self, Record};
use crate::auth::{Actor, LastUsed, PendingUses};
use crate::key_cache::KeyCache;
use crate::pagination::{PageRequest, PageSql, AFTER};
use crate::store::{Action, Store, StoreError, Watched};
use crate::{ids, written};
use sparring_server::{Caller, Credential};

pub const MAX_ACTIVE_KEYS: i64 = 25;
pub const KEY_PREFIX: &str = "spk_";
/// How much of a key is shown in listings: `spk_` and 8 characters.
const DISPLAY_PREFIX_LEN: usize = 12;
pub const MAX_LABEL_CHARS: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("{0}")]
    InvalidLabel(String),
    #[error("you already have {MAX_ACTIVE_KEYS} active API keys; revoke one before creating another")]
    LimitReached,
    #[error("no API key with id `{0}`")]
    NotFound(String),
    #[error("API key `{0}` is revoked; a revoked key cannot be rotated")]
    Revoked(String),
    #[error("the API key this request was made with was revoked before it was done; nothing was changed")]
    CredentialRevoked,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rusqlite::Error> for ApiKeyError {
    fn from(e: rusqlite::Error) -> Self {
        ApiKeyError::Store(e.into())
    }
}

/// A key label: 1 to 100 Unicode scalar values, not blank, no control
/// characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyLabel(String);

impl ApiKeyLabel {
    pub fn parse(label: &str) -> Result<ApiKeyLabel, ApiKeyError> {
        let chars = label.chars().count();
        if chars == 0 {
            return Err(ApiKeyError::InvalidLabel("label: must not be empty".into()));
        }
        if chars > MAX_LABEL_CHARS {
            return Err(ApiKeyError::InvalidLabel(format!(
                "label: must be at most {MAX_LABEL_CHARS} characters, got {chars}"
            )));
        }
        if label.trim().is_empty() {
            return Err(ApiKeyError::InvalidLabel("label: must not be blank".into()));
        }
        if label.chars().any(char::is_control) {
            return Err(ApiKeyError::InvalidLabel("label: must not contain control characters".into()));
        }
        Ok(ApiKeyLabel(label.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A raw key, shown once. Deliberately not `Debug`/`Display`, so it cannot
/// end up in a log line by accident.
pub struct RawKey(String);

impl RawKey {
    pub fn generate() -> RawKey {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        RawKey(format!("{KEY_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// Hands the secret out, for the one response that shows it.
    pub fn expose(self) -> String {
        self.0
    }

    pub fn hash(&self) -> [u8; 32] {
        hash_key(&self.0)
    }

    pub fn display_prefix(&self) -> String {
        display_prefix_of(&self.0)
    }
}

/// The part of a key that lists show (`prefix`), by which its owner tells
/// it from their others.
pub fn display_prefix_of(raw: &str) -> String {
    raw.chars().take(DISPLAY_PREFIX_LEN).collect()
}

pub fn hash_key(raw: &str) -> [u8; 32] {
    *blake3::hash(raw.as_bytes()).as_bytes()
}

/// Whether `raw` has the shape of a key (cheap check before any lookup).
pub fn looks_like_key(raw: &str) -> bool {
    raw.len() == KEY_PREFIX.len() + 43
        && raw.starts_with(KEY_PREFIX)
        && raw[KEY_PREFIX.len()..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[derive(Clone, Debug)]
pub struct ApiKey {
    pub id: String,
    pub user_id: String,
    pub label: String,
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, user_id, label, prefix, created_at, last_used_at, revoked_at";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKey> {
    let time = |i: usize| -> rusqlite::Result<Option<DateTime<Utc>>> {
        Ok(row.get::<_, Option<String>>(i)?.as_deref().and_then(ids::parse_time))
    };
    Ok(ApiKey {
        id: row.get(0)?,
        user_id: row.get(1)?,
        label: row.get(2)?,
        prefix: row.get(3)?,
        created_at: time(4)?.unwrap_or_default(),
        last_used_at: time(5)?,
        revoked_at: time(6)?,
    })
}

fn get_own(tx: &rusqlite::Transaction<'_>, user_id: &str, key_id: &str) -> Result<ApiKey, ApiKeyError> {
    tx.query_row(
        &format!("SELECT {COLUMNS} FROM api_keys WHERE id = ?1 AND user_id = ?2"),
        params![key_id, user_id],
        from_row,
    )
    .optional()?
    .ok_or_else(|| ApiKeyError::NotFound(key_id.to_string()))
}

/// A request made with an API key that is revoked by the time its write
/// runs changes no key: checked in the write's transaction, since the key
/// was checked as the request came in, and a key revoked meanwhile (a
/// stolen one, revoked in a hurry) must not leave a new key or secret
/// behind it.
fn credential_still_active(tx: &rusqlite::Transaction<'_>, actor: &Actor) -> Result<(), ApiKeyError> {
    let Actor::Caller(Caller { credential: Credential::ApiKey { key_id }, .. }) = actor else {
        return Ok(());
    };
    let active: bool = tx
        .prepare_cached("SELECT revoked_at IS NULL FROM api_keys WHERE id = ?1")?
        .query_row(params![key_id], |r| r.get(0))
        .optional()?
        .unwrap_or(false);
    if active {
        Ok(())
    } else {
        Err(ApiKeyError::CredentialRevoked)
    }
}

/// Inserts a key for `user_id` inside `tx` (shared with the admin CLI and
/// the first-start bootstrap).
pub fn insert(
    tx: &rusqlite::Transaction<'_>,
    actor: &Actor,
    user_id: &str,
    label: &ApiKeyLabel,
) -> Result<(ApiKey, RawKey), ApiKeyError> {
    credential_still_active(tx, actor)?;
    let active: i64 = tx.query_row(
        "SELECT count(*) FROM api_keys WHERE user_id = ?1 AND revoked_at IS NULL",
        params![user_id],
        |r| r.get(0),
    )?;
    if active >= MAX_ACTIVE_KEYS {
        return Err(ApiKeyError::LimitReached);
    }
    let raw = RawKey::generate();
    let key = ApiKey {
        id: ids::new_id("key"),
        user_id: user_id.to_string(),
        label: label.as_str().to_string(),
        prefix: raw.display_prefix(),
        created_at: ids::now(),
        last_used_at: None,
        revoked_at: None,
    };
    tx.execute(
        "INSERT INTO api_keys (id, user_id, label, prefix, key_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![key.id, key.user_id, key.label, key.prefix, &raw.hash()[..], ids::format_time(&key.created_at)],
    )?;
    // A key made for a user by someone else (the admin CLI, the first
    // start) is about them: they read its record as their own.
    let about = (actor.user_id() != Some(user_id)).then_some(user_id);
    activity::record_about(
        tx,
        actor,
        about,
        Record {
            action: "api_key.create",
            resource_type: "api_key",
            resource_id: &key.id,
            project_id: None,
            summary: format!("created API key \"{}\" ({}…)", key.label, key.prefix),
            changes: serde_json::json!({"label": key.label, "prefix": key.prefix}).into(),
        },
    )?;
    Ok((key, raw))
}

pub async fn create(
    store: &Store,
    actor: Actor,
    user_id: String,
    label: ApiKeyLabel,
) -> Result<(ApiKey, RawKey), ApiKeyError> {
    store.write(move |tx| insert(tx, &actor, &user_id, &label)).await
}

/// A page of `user_id`'s keys, newest first, as the API shows them, written
/// as JSON (see `written`; listing keys is what dashboards poll).
/// `last_used` has each key's newest use not yet stored.
///
/// The first page is kept in `pages` and answered from there, with no
/// database read, until a change to any API key empties `pages` (see
/// [`KeyPages`]): reading and writing 25 keys was three quarters of the
/// request, and the read transaction that checked whether a kept page was
/// still current was a quarter of what remained (BENCHMARKS.md).
pub async fn list(
    store: &Store,
    pages: &KeyPages,
    user_id: String,
    page: PageRequest,
    last_used: &LastUsed,
) -> Result<String, ApiKeyError> {
    if page.after.is_none() {
        if let Some(kept) = pages.get(&user_id).filter(|p| p.limit == page.limit) {
            return Ok(kept.write(&last_used.reader()));
        }
    }
    let generation = pages.generation();
    store
        .read(move |tx| {
            let read = read_page(tx, &user_id, &page)?;
            if page.after.is_some() {
                return Ok(read.write(&last_used.reader()));
            }
            Ok(pages.keep(generation, user_id, read).write(&last_used.reader()))
        })
        .await
}

/// A page of the caller's API keys (see [`PageSql`]).
pub(crate) static PAGE_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!("SELECT {COLUMNS} FROM api_keys WHERE user_id = ?1 {AFTER} ORDER BY id DESC LIMIT ?3"),
        "AND id < ?2",
    )
});

fn read_page(tx: &rusqlite::Connection, user_id: &str, page: &PageRequest) -> Result<KeyPage, ApiKeyError> {
    let mut stmt = tx.prepare_cached(PAGE_SQL.of(page))?;
    let rows = stmt
        .query_map(params![user_id, page.after, page.fetch_limit()], written_key)?
        .collect::<Result<Vec<_>, _>>()?;
    let read = page.finish(rows, |k| k.id.clone());
    Ok(KeyPage { limit: page.limit, keys: read.items, next_cursor: read.next_cursor })
}

/// A page of keys as read from the database: each key's JSON is written
/// but for `last_used_at`, which moves with every use and is filled in by
/// [`KeyPage::write`].
pub struct KeyPage {
    limit: usize,
    keys: Vec<WrittenKey>,
    next_cursor: Option<String>,
}

struct WrittenKey {
    id: String,
    /// The key's JSON, split at `last_used_at`'s value.
    json: String,
    split: usize,
    /// `last_used_at` as stored.
    last_used: Option<String>,
}

impl KeyPage {
    /// `{"keys":[…],"next_cursor":…}`, each key with the later of its
    /// stored and its pending last use.
    fn write(&self, pending: &PendingUses<'_>) -> String {
        let size = self.keys.iter().map(|k| k.json.len() + 40).sum();
        let write_key = |out: &mut String, (key, pending): (&WrittenKey, Option<DateTime<Utc>>)| {
            out.push_str(&key.json[..key.split]);
            // Stored times all have `ids::format_time`'s fixed width, so
            // the later of two is the greater string.
            let pending = pending.map(|t| ids::format_time(&t));
            match (key.last_used.as_deref(), pending.as_deref()) {
                (Some(a), Some(b)) => written::push_time(out, a.max(b)),
                (Some(t), None) | (None, Some(t)) => written::push_time(out, t),
                (None, None) => out.push_str("null"),
            }
            out.push_str(&key.json[key.split..]);
        };
        let pending = pending.of(&self.keys, |k| &k.id);
        written::page_with("keys", self.keys.iter().zip(pending), size, write_key, self.next_cursor.as_deref())
    }
}

/// Users kept at most; past it [`KeyPages`] starts over. A bound on memory:
/// a page of 25 keys is ~7 KB, and even pages of 200 (revoked keys
/// included) would stay under 64 MB.
const MAX_KEPT_PAGES: usize = 1024;

/// The first page of keys of the users who listed theirs lately (see
/// [`list`]).
///
/// Emptied by the store after every transaction that inserts, updates or
/// deletes a row of `api_keys` (`Store::watch`), before any write of it is
/// answered: a key made, revoked, rotated or relabelled, and the periodic
/// write of last uses. Keys are written only by the server while it runs:
/// `sparring admin create-key` beside it goes through it (see `admin`). A
/// read that raced with a change keeps its page only if nothing was emptied
/// since it began (`store::Watched`).
pub struct KeyPages {
    /// User id → the first page of their keys.
    first: Arc<Watched<HashMap<String, Arc<KeyPage>, foldhash::fast::RandomState>>>,
}

impl KeyPages {
    /// Pages kept correct by `store`'s writes.
    pub fn watching(store: &Store) -> KeyPages {
        const WATCHED: &[(&str, &[Action])] =
            &[("api_keys", &[Action::SQLITE_INSERT, Action::SQLITE_UPDATE, Action::SQLITE_DELETE])];
        KeyPages { first: Watched::new(store, WATCHED) }
    }

    fn get(&self, user_id: &str) -> Option<Arc<KeyPage>> {
        self.first.read(|first| first.get(user_id).cloned())
    }

    fn generation(&self) -> u64 {
        self.first.generation()
    }

    /// Keeps a page read by a read that began at `generation`, unless the
    /// pages were emptied since; either way returns it.
    fn keep(&self, generation: u64, user_id: String, page: KeyPage) -> Arc<KeyPage> {
        let page = Arc::new(page);
        self.first.keep(generation, |first| {
            if first.len() >= MAX_KEPT_PAGES && !first.contains_key(&user_id) {
                first.clear();
            }
            first.insert(user_id, page.clone());
        });
        page
    }
}

/// A row of [`COLUMNS`] as the API's `ApiKey`, written as JSON.
///
/// The member names and punctuation are written as literal pieces and only
/// the values go through [`written::push_string`]: a member at a time was a
/// fifth of a page's instructions. `tests/written.rs` checks the result
/// against the typed path.
fn written_key(row: &rusqlite::Row<'_>) -> rusqlite::Result<WrittenKey> {
    let text = |i: usize| -> rusqlite::Result<Option<&str>> {
        row.get_ref(i)?
            .as_str_or_null()
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
    };
    let id = text(0)?.unwrap_or_default();
    let revoked_at = text(6)?;
    let mut o = String::with_capacity(256);
    o.push_str(r#"{"id":"#);
    written::push_string(&mut o, id);
    o.push_str(r#","label":"#);
    written::push_string(&mut o, text(2)?.unwrap_or_default());
    o.push_str(r#","prefix":"#);
    written::push_string(&mut o, text(3)?.unwrap_or_default());
    o.push_str(match revoked_at {
        Some(_) => r#","revoked":true,"created_at":"#,
        None => r#","revoked":false,"created_at":"#,
    });
    written::push_time(&mut o, text(4)?.unwrap_or_default());
    o.push_str(r#","last_used_at":"#);
    let split = o.len();
    o.push_str(r#","revoked_at":"#);
    match revoked_at {
        Some(t) => written::push_time(&mut o, t),
        None => o.push_str("null"),
    }
    o.push('}');
    Ok(WrittenKey { id: id.to_owned(), json: o, split, last_used: text(5)?.map(str::to_owned) })
}

pub struct Revoked {
    pub key: ApiKey,
    pub already_revoked: bool,
}

/// Revokes one of `user_id`'s keys; revoking a revoked key changes nothing.
/// The key stops working before this returns (`cache` forgets it once the
/// revocation is committed).
pub async fn revoke(
    store: &Store,
    cache: &KeyCache,
    actor: Actor,
    user_id: String,
    key_id: String,
) -> Result<Revoked, ApiKeyError> {
    let revoked = store
        .write::<_, ApiKeyError, _>(move |tx| {
            let mut key = get_own(tx, &user_id, &key_id)?;
            if key.revoked_at.is_some() {
                return Ok(Revoked { key, already_revoked: true });
            }
            let now = ids::now();
            tx.execute("UPDATE api_keys SET revoked_at = ?1 WHERE id = ?2", params![ids::format_time(&now), key.id])?;
            key.revoked_at = Some(now);
            activity::record(
                tx,
                &actor,
                Record {
                    action: "api_key.revoke",
                    resource_type: "api_key",
                    resource_id: &key.id,
                    project_id: None,
                    summary: format!("revoked API key \"{}\" ({}…)", key.label, key.prefix),
                    changes: serde_json::json!({"revoked": true}).into(),
                },
            )?;
            Ok(Revoked { key, already_revoked: false })
        })
        .await?;
    cache.forget(&revoked.key.id);
    Ok(revoked)
}

/// Replaces the secret of an active key; the old secret stops working
/// before this returns (`cache` forgets it once the change is committed).
pub async fn rotate(
    store: &Store,
    cache: &KeyCache,
    actor: Actor,
    user_id: String,
    key_id: String,
) -> Result<(ApiKey, RawKey), ApiKeyError> {
    let rotated = store
        .write::<_, ApiKeyError, _>(move |tx| {
            credential_still_active(tx, &actor)?;
            let mut key = get_own(tx, &user_id, &key_id)?;
            if key.revoked_at.is_some() {
                return Err(ApiKeyError::Revoked(key.id));
            }
            let raw = RawKey::generate();
            let old_prefix = std::mem::replace(&mut key.prefix, raw.display_prefix());
            tx.execute(
                "UPDATE api_keys SET key_hash = ?1, prefix = ?2 WHERE id = ?3",
                params![&raw.hash()[..], key.prefix, key.id],
            )?;
            activity::record(
                tx,
                &actor,
                Record {
                    action: "api_key.rotate",
                    resource_type: "api_key",
                    resource_id: &key.id,
                    project_id: None,
                    summary: format!("rotated API key \"{}\"", key.label),
                    changes: serde_json::json!({"prefix": {"from": old_prefix, "to": key.prefix}}).into(),
                },
            )?;
            Ok((key, raw))
        })
        .await?;
    cache.forget(&rotated.0.id);
    Ok(rotated)
}

/// The active key with this hash: `(key id, user id)`.
pub async fn find_active(store: &Store, hash: [u8; 32]) -> Result<Option<(String, String)>, StoreError> {
    store
        .read(move |tx| {
            let mut stmt =
                tx.prepare_cached("SELECT id, user_id FROM api_keys WHERE key_hash = ?1 AND revoked_at IS NULL")?;
            Ok(stmt.query_row(params![&hash[..]], |r| Ok((r.get(0)?, r.get(1)?))).optional()?)
        })
        .await
}

/// Writes coalesced `last_used_at` times (key id → time), keeping the later
/// of the stored and the new one.
pub async fn record_last_used(store: &Store, used: Vec<(String, DateTime<Utc>)>) -> Result<(), StoreError> {
    if used.is_empty() {
        return Ok(());
    }
    store
        .write(move |tx| {
            let mut stmt = tx.prepare_cached(
                "UPDATE api_keys SET last_used_at = ?1 WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at < ?1)",
            )?;
            for (id, at) in &used {
                stmt.execute(params![ids::format_time(at), id])?;
            }
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(ApiKeyLabel::parse("ci").is_ok());
        assert!(ApiKeyLabel::parse(&"é".repeat(100)).is_ok());
        assert!(ApiKeyLabel::parse(&"é".repeat(101)).is_err());
        assert!(ApiKeyLabel::parse("").is_err());
        assert!(ApiKeyLabel::parse("  \t").is_err());
        assert!(ApiKeyLabel::parse("a\u{7}b").is_err());
        assert!(ApiKeyLabel::parse("a\nb").is_err());
    }

    #[test]
    fn keys_have_256_random_bits_and_a_recognisable_prefix() {
        let a = RawKey::generate();
        let b = RawKey::generate();
        assert_ne!(a.hash(), b.hash());
        let a = a.expose();
        assert!(looks_like_key(&a), "{}", a.len());
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&a[KEY_PREFIX.len()..]).unwrap();
        assert_eq!(decoded.len(), 32);
        assert!(!looks_like_key("spk_short"));
    }

    /// A key created or rotated by a request whose own key was revoked
    /// after it came in is refused in the write (the revoke committed
    /// first); made with the server's own authority, or with an ID token,
    /// there is no key to check.
    #[tokio::test]
    async fn a_request_whose_key_was_revoked_meanwhile_changes_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        let ci = ApiKeyLabel::parse("ci").unwrap();
        let (user_id, first, second) = store
            .write::<_, ApiKeyError, _>(move |tx| {
                let user_id = crate::users::ensure_by_email(tx, "revoked@example.com")?;
                let (first, _) = insert(tx, &Actor::System, &user_id, &ci)?;
                let (second, _) = insert(tx, &Actor::System, &user_id, &ci)?;
                Ok((user_id, first.id, second.id))
            })
            .await
            .unwrap();
        let with = |key_id: &str| {
            Actor::Caller(Caller { user_id: user_id.clone(), credential: Credential::ApiKey { key_id: key_id.into() } })
        };
        let cache = KeyCache::default();
        revoke(&store, &cache, Actor::System, user_id.clone(), first.clone()).await.unwrap();
        let label = ApiKeyLabel::parse("after").unwrap();
        let created = create(&store, with(&first), user_id.clone(), label.clone()).await.err();
        assert!(matches!(created, Some(ApiKeyError::CredentialRevoked)), "{created:?}");
        let rotated = rotate(&store, &cache, with(&first), user_id.clone(), second.clone()).await.err();
        assert!(matches!(rotated, Some(ApiKeyError::CredentialRevoked)), "{rotated:?}");
        let count = |store: &Store| {
            store.read_blocking::<i64, StoreError, _>(|tx| {
                Ok(tx.query_row("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL", [], |r| r.get(0))?)
            })
        };
        assert_eq!(count(&store).unwrap(), 1, "nothing created");
        // With a key still active, both go through.
        create(&store, with(&second), user_id.clone(), label).await.unwrap();
        rotate(&store, &cache, with(&second), user_id.clone(), second.clone()).await.unwrap();
        assert_eq!(count(&store).unwrap(), 2);
    }

    /// A kept page holds `last_used_at` as stored and adds the uses not yet
    /// written; once they are written (and no longer pending) the page must
    /// be read again, or the use would vanish from the listing.
    #[tokio::test]
    async fn a_kept_page_shows_a_use_once_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        let (user_id, key_id) = store
            .write::<_, ApiKeyError, _>(|tx| {
                let user_id = crate::users::ensure_by_email(tx, "used@example.com")?;
                let (key, _) = insert(tx, &Actor::System, &user_id, &ApiKeyLabel::parse("ci").unwrap())?;
                Ok((user_id, key.id))
            })
            .await
            .unwrap();
        let (pages, last_used) = (KeyPages::watching(&store), LastUsed::default());
        let listed = || async {
            let json =
                list(&store, &pages, user_id.clone(), PageRequest::parse(None, None, "key").unwrap(), &last_used);
            let page: serde_json::Value = serde_json::from_str(&json.await.unwrap()).unwrap();
            page["keys"][0]["last_used_at"].clone()
        };
        assert_eq!(listed().await, serde_json::Value::Null);
        last_used.note(&key_id);
        let pending = listed().await;
        assert!(pending.is_string(), "a pending use is shown: {pending}");
        last_used.flush(&store).await.unwrap();
        assert_eq!(listed().await, pending, "the written use is shown");
    }
}
