//! The API keys recently found valid, so that authenticating a key costs a
//! hash and a map lookup instead of a database read.
//!
//! Only valid keys are kept: an unknown key is looked up in the database
//! every time, so a key made while the server was down, or by another
//! process, works at once. Revoking or rotating a key forgets it after the
//! change commits and before the response is sent, so the old secret fails
//! on the very next request. A lookup that raced with a revocation cannot
//! put the key back: it notes the cache's generation before reading the
//! database and keeps its answer only if nothing was forgotten since.

use std::collections::HashMap;
use std::sync::Mutex;

/// More entries than this and the cache starts over (a bound on memory
/// whatever the number of keys; every entry is a valid, in-use key).
const MAX_ENTRIES: usize = 100_000;

#[derive(Default)]
pub struct KeyCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// blake3 of the raw key → (key id, user id).
    by_hash: HashMap<[u8; 32], (String, String)>,
    /// Bumped by every [`KeyCache::forget`].
    generation: u64,
}

impl KeyCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key with this hash, if it was found valid and not forgotten
    /// since: `(key id, user id)`.
    pub fn get(&self, hash: &[u8; 32]) -> Option<(String, String)> {
        self.lock().by_hash.get(hash).cloned()
    }

    /// To take before reading the database, and give to
    /// [`KeyCache::remember`].
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps a key found valid by a read that started at `generation`,
    /// unless a key was forgotten since (the read may predate it).
    pub fn remember(&self, generation: u64, hash: [u8; 32], key_id: String, user_id: String) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.by_hash.len() >= MAX_ENTRIES {
            inner.by_hash.clear();
        }
        inner.by_hash.insert(hash, (key_id, user_id));
    }

    /// Forgets a key whose secret stopped working (revoked, rotated). Call
    /// it after the change is committed, before answering.
    pub fn forget(&self, key_id: &str) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.by_hash.retain(|_, (id, _)| id != key_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str) -> (String, String) {
        (k.to_string(), "usr_1".to_string())
    }

    #[test]
    fn keeps_valid_keys_until_forgotten() {
        let cache = KeyCache::default();
        let g = cache.generation();
        cache.remember(g, [1; 32], "key_a".into(), "usr_1".into());
        cache.remember(g, [2; 32], "key_b".into(), "usr_1".into());
        assert_eq!(cache.get(&[1; 32]), Some(entry("key_a")));
        cache.forget("key_a");
        assert_eq!(cache.get(&[1; 32]), None);
        assert_eq!(cache.get(&[2; 32]), Some(entry("key_b")));
    }

    #[test]
    fn a_lookup_that_started_before_a_revocation_is_not_kept() {
        let cache = KeyCache::default();
        // A request reads the database (the key is still active) …
        let g = cache.generation();
        // … the key is revoked and forgotten meanwhile …
        cache.forget("key_a");
        // … and the request's answer must not bring it back.
        cache.remember(g, [1; 32], "key_a".into(), "usr_1".into());
        assert_eq!(cache.get(&[1; 32]), None);
        // A lookup after the revocation is kept (it read the new state).
        let g = cache.generation();
        cache.remember(g, [2; 32], "key_b".into(), "usr_1".into());
        assert_eq!(cache.get(&[2; 32]), Some(entry("key_b")));
    }
}
