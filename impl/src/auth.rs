//! Who is calling: `x-api-key` or an OpenID Connect ID token.
//!
//! Runs before anything else about a request is looked at (the generated
//! `Input` extractor calls it first). If `x-api-key` is present it alone
//! decides. An API key costs a hash and, once it has been seen valid, a map
//! lookup (see `key_cache`; the first use is one indexed read), and no
//! write: its `last_used_at` is noted in memory and written by a background
//! task every few seconds, coalesced per key. A revoked or rotated-away key
//! fails on the very next request: revoking and rotating forget it from the
//! cache before they answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
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
            if let Some(key) = headers.get("x-api-key") {
                let key = key.to_str().map_err(|_| unauthorized("invalid API key"))?.trim();
                return self.authenticate_key(key).await;
            }
            if let Some(auth) = headers.get(http::header::AUTHORIZATION) {
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
            Some(id) => id,
            None => {
                let id = users::ensure_for_identity(&self.store, identity.clone())
                    .await
                    .map_err(|e| HttpError::for_internal_error(e.to_string()))?;
                self.oidc_users.lock().unwrap_or_else(|p| p.into_inner()).insert(cache_key, id.clone());
                id
            }
        };
        Ok(Caller { user_id, credential: Credential::IdToken { issuer: identity.issuer, subject: identity.subject } })
    }
}

/// `last_used_at` times not yet written, per key.
#[derive(Default)]
pub struct LastUsed {
    pending: Mutex<HashMap<String, DateTime<Utc>>>,
}

impl LastUsed {
    pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

    fn note(&self, key_id: &str) {
        let now = crate::ids::now();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        match pending.get_mut(key_id) {
            Some(t) => *t = now,
            None => {
                pending.insert(key_id.to_string(), now);
            }
        }
    }

    /// The newest use not yet written, to show in listings.
    pub fn pending(&self, key_id: &str) -> Option<DateTime<Utc>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).get(key_id).copied()
    }

    /// Writes what is pending. A failed write keeps it for the next flush.
    pub async fn flush(&self, store: &Store) -> Result<(), crate::store::StoreError> {
        let batch: Vec<(String, DateTime<Utc>)> = {
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.iter().map(|(k, v)| (k.clone(), *v)).collect()
        };
        api_keys::record_last_used(store, batch.clone()).await?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in batch {
            if pending.get(&k) == Some(&v) {
                pending.remove(&k);
            }
        }
        Ok(())
    }
}
