//! Who is calling: `x-api-key` or an OpenID Connect ID token.
//!
//! Runs before anything else about a request is looked at (the generated
//! `Input` extractor calls it first). If `x-api-key` is present it alone
//! decides; either header sent twice is refused. An API key costs a hash
//! and, once it has been seen valid, a map lookup (see `key_cache`; the
//! first use is one indexed read), and no write: its `last_used_at` is noted
//! in memory and written by a background task every few seconds, coalesced
//! per key. A revoked or rotated-away key fails on the very next request:
//! revoking and rotating forget it from the cache before they answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dropshot::{HttpError, RequestInfo};
use sparring_server::{unauthorized, Authenticator, Caller, Credential};

use crate::api_keys;
use crate::store::Store;
use crate::{users, AppState};

/// Who a change is attributed to in the activity log.
#[derive(Clone, Debug)]
pub enum Actor {
    Caller(Caller),
    /// The server itself (bootstrap, admin CLI, workers).
    System,
}

impl Actor {
    pub fn user_id(&self) -> Option<&str> {
        match self {
            Actor::Caller(c) => Some(&c.user_id),
            Actor::System => None,
        }
    }

    pub fn credential_kind(&self) -> &'static str {
        match self {
            Actor::Caller(Caller { credential: Credential::ApiKey { .. }, .. }) => "api_key",
            Actor::Caller(Caller { credential: Credential::IdToken { .. }, .. }) => "id_token",
            Actor::System => "system",
        }
    }

    pub fn api_key_id(&self) -> Option<&str> {
        match self {
            Actor::Caller(Caller { credential: Credential::ApiKey { key_id }, .. }) => Some(key_id),
            _ => None,
        }
    }
}

const MISSING: &str = "missing credential: send `x-api-key: <key>` or `Authorization: Bearer <ID token>`";

impl Authenticator for AppState {
    fn authenticate<'a>(
        &'a self,
        request: &'a RequestInfo,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, HttpError>> + Send + 'a>> {
        Box::pin(async move {
            let headers = request.headers();
            // Either header sent twice is refused, whichever decides.
            let (key, auth) = (only_one(headers, "x-api-key")?, only_one(headers, "authorization")?);
            if let Some(key) = key {
                let key = key.to_str().map_err(|_| unauthorized("invalid API key"))?.trim();
                return self.authenticate_key(key).await;
            }
            if let Some(auth) = auth {
                let auth = auth.to_str().map_err(|_| unauthorized("invalid Authorization header"))?;
                let token = match auth.split_once(' ') {
                    Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                    _ => return Err(unauthorized("the Authorization header must be `Bearer <ID token>`")),
                };
                return self.authenticate_id_token(token).await;
            }
            Err(unauthorized(MISSING))
        })
    }
}

/// The value of credential header `name`, if it was sent once. Sent more
/// than once it is refused rather than one of its values picked: which one
/// a proxy or a client library keeps differs, and a request must not be
/// allowed or refused by which it was.
fn only_one<'h>(headers: &'h http::HeaderMap, name: &str) -> Result<Option<&'h http::HeaderValue>, HttpError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(unauthorized(format!("send one `{name}` header, not several")));
    }
    Ok(first)
}

impl AppState {
    async fn authenticate_key(&self, key: &str) -> Result<Caller, HttpError> {
        if !api_keys::looks_like_key(key) {
            return Err(unauthorized("invalid API key"));
        }
        let hash = api_keys::hash_key(key);
        let (key_id, user_id) = match self.keys.get(&hash) {
            Some(found) => found,
            None => {
                let generation = self.keys.generation();
                let found = api_keys::find_active(&self.store, hash)
                    .await
                    .map_err(|e| HttpError::for_internal_error(e.to_string()))?;
                let Some((key_id, user_id)) = found else {
                    return Err(unauthorized("invalid API key (unknown, rotated or revoked)"));
                };
                self.keys.remember(generation, hash, key_id.clone(), user_id.clone());
                (key_id, user_id)
            }
        };
        self.last_used.note(&key_id);
        Ok(Caller { user_id, credential: Credential::ApiKey { key_id } })
    }

    async fn authenticate_id_token(&self, token: &str) -> Result<Caller, HttpError> {
        if self.oidc.is_empty() {
            return Err(unauthorized("this server accepts no ID tokens (no OpenID Connect issuer is configured)"));
        }
        let identity = self.oidc.verify(token).await.map_err(unauthorized)?;
        let cache_key = (identity.issuer.clone(), identity.subject.clone());
        let cached = self.oidc_users.lock().unwrap_or_else(|p| p.into_inner()).get(&cache_key).cloned();
        let user_id = match cached {
            // A user without an address is looked up again when a token
            // brings one, which may become theirs (unless it was found
            // another user's, which it stays).
            Some(known) if known.settled_for(identity.email.as_deref()) => known.user_id,
            _ => {
                // A first sign-in makes the user: a write, refused as every
                // write is when the disk is full.
                let signed_in = users::ensure_for_identity(&self.store, identity.clone())
                    .await
                    .map_err(crate::http::store_http_error)?;
                let user_id = signed_in.user_id.clone();
                self.oidc_users.lock().unwrap_or_else(|p| p.into_inner()).insert(cache_key, signed_in);
                user_id
            }
        };
        Ok(Caller { user_id, credential: Credential::IdToken { issuer: identity.issuer, subject: identity.subject } })
    }
}

/// Key id → microseconds since the epoch of its newest use not yet written,
/// or 0 once written. Hashed with foldhash: the ids are the server's own,
/// not chosen by a caller.
type Uses = HashMap<String, AtomicI64, foldhash::fast::RandomState>;

/// `last_used_at` times not yet written, per key.
///
/// Every request with an API key notes its use, and a page of keys reads
/// the note of each key it lists, so neither takes a lock that makes the
/// other wait: a key already in the map is noted with an atomic store under
/// the shared lock, and a listing takes the shared lock once for its page.
/// Only a key's first use since the last flush, and the flush itself, take
/// the exclusive lock.
#[derive(Default)]
pub struct LastUsed {
    pending: RwLock<Uses>,
}

/// A view of the pending uses, for a page of keys (see
/// [`LastUsed::reader`]).
pub struct PendingUses<'a> {
    pending: RwLockReadGuard<'a, Uses>,
}

impl PendingUses<'_> {
    /// The newest use of `key_id` not yet written.
    pub fn get(&self, key_id: &str) -> Option<DateTime<Utc>> {
        self.pending.get(key_id).and_then(pending_time)
    }

    /// The newest use not yet written of each item's key (`id`), in the
    /// items' order. Few keys have uses pending (a flush writes them every
    /// [`LastUsed::FLUSH_EVERY`]), usually fewer than a page has keys: then
    /// each pending use is matched to the page's keys by comparing ids,
    /// instead of hashing every key of the page (25 hashed lookups were 5 %
    /// of the instructions of a page of keys, callgrind, BENCHMARKS.md).
    pub fn of<T>(&self, items: &[T], id: impl Fn(&T) -> &str) -> Vec<Option<DateTime<Utc>>> {
        if self.pending.len() >= items.len() {
            return items.iter().map(|item| self.get(id(item))).collect();
        }
        let mut times = vec![None; items.len()];
        for (key_id, t) in self.pending.iter() {
            if let Some(i) = items.iter().position(|item| id(item) == key_id) {
                times[i] = pending_time(t);
            }
        }
        times
    }
}

/// A pending use's time; none once it is written (0).
fn pending_time(micros: &AtomicI64) -> Option<DateTime<Utc>> {
    match micros.load(Ordering::Relaxed) {
        0 => None,
        m => DateTime::from_timestamp_micros(m),
    }
}

impl LastUsed {
    pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

    fn read(&self) -> RwLockReadGuard<'_, Uses> {
        self.pending.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Uses> {
        self.pending.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a use of `key_id` now. Times are kept to the microsecond, as
    /// stored (`ids::format_time`).
    pub(crate) fn note(&self, key_id: &str) {
        let now = Utc::now().timestamp_micros();
        if let Some(t) = self.read().get(key_id) {
            t.fetch_max(now, Ordering::Relaxed);
            return;
        }
        self.write().entry(key_id.to_string()).or_default().fetch_max(now, Ordering::Relaxed);
    }

    /// The pending uses, to show in a listing: hold it no longer than the
    /// listing's read.
    pub fn reader(&self) -> PendingUses<'_> {
        PendingUses { pending: self.read() }
    }

    /// Writes what is pending. A failed write keeps it for the next flush;
    /// a use noted while the write runs stays pending.
    pub async fn flush(&self, store: &Store) -> Result<(), crate::store::StoreError> {
        let batch: Vec<(String, i64)> = {
            let mut pending = self.write();
            // Keys not used since the last flush leave the map.
            pending.retain(|_, t| t.load(Ordering::Relaxed) != 0);
            pending.iter().map(|(k, t)| (k.clone(), t.load(Ordering::Relaxed))).collect()
        };
        if batch.is_empty() {
            return Ok(());
        }
        let times = batch
            .iter()
            .filter_map(|(k, micros)| Some((k.clone(), DateTime::from_timestamp_micros(*micros)?)))
            .collect();
        api_keys::record_last_used(store, times).await?;
        let pending = self.read();
        for (k, micros) in batch {
            if let Some(t) = pending.get(&k) {
                // Unless a newer use came meanwhile.
                let _ = t.compare_exchange(micros, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_use_noted_is_pending_and_a_later_one_is_not_older() {
        let last_used = LastUsed::default();
        assert_eq!(last_used.reader().get("key_a"), None);
        last_used.note("key_a");
        let first = last_used.reader().get("key_a").expect("pending after a use");
        assert!((Utc::now() - first).num_seconds().abs() < 5);
        last_used.note("key_a");
        assert!(last_used.reader().get("key_a").unwrap() >= first);
        assert_eq!(last_used.reader().get("key_b"), None);
    }

    /// A page's pending uses are the same whether the page has more keys
    /// than have uses pending or fewer, and in the page's order.
    #[test]
    fn a_page_gets_each_of_its_keys_pending_use_however_many_are_pending() {
        let last_used = LastUsed::default();
        last_used.note("key_b");
        last_used.note("key_z");
        let b = last_used.reader().get("key_b");
        assert!(b.is_some());
        // More keys asked about than pending: matched by a pass over those.
        let page = ["key_a", "key_b", "key_c"];
        assert_eq!(last_used.reader().of(&page, |k| k), vec![None, b, None]);
        // Fewer: looked up one by one.
        let page = ["key_b"];
        assert_eq!(last_used.reader().of(&page, |k| k), vec![b]);
        let page = ["key_c"];
        assert_eq!(last_used.reader().of(&page, |k| k), vec![None]);
        assert_eq!(last_used.reader().of::<&str>(&[], |k| k), vec![]);
    }
}
