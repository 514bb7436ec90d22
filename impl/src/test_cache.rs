//! Tests as served, and callers' roles in projects, kept in memory so that
//! `GET /v1/tests/{id}` (what dashboards and CI poll) costs two map lookups
//! instead of a database read.
//!
//! What is kept is exactly what the read would find: a test's stored
//! `served` JSON and its project, and a member's role. Both change only by
//! the server's own writes (`sparring admin grant-credits`, run beside a
//! server, writes neither), which the store reports
//! ([`Store::watch`]): an update or deletion of a test, or any change to a
//! membership (a project's deletion included), empties the cache after the
//! change commits and before it is answered. So a removed member, a changed
//! role or a deleted test is seen by the very next request. A new test
//! changes nothing kept (only tests found are), so creating tests, the
//! common write, leaves the cache alone.
//!
//! A read that raced with a change cannot put the old state back: it notes
//! the cache's generation before reading the database and keeps its answer
//! only if nothing was emptied since (`store::Watched`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::access::Role;
use crate::store::{Action, Store, Watched};

/// More bytes of tests than this and the tests start over (a bound on
/// memory whatever the number of tests: 10,000 tests of `cargo xtask bench
/// api` hold ~15 MB).
const MAX_BYTES: usize = 32 * 1024 * 1024;

/// More memberships than this and they start over.
const MAX_ROLES: usize = 100_000;

/// The changes that make what is kept stale. A project's deletion deletes
/// its tests and members by cascade, which the store sees as such.
const WATCHED: &[(&str, &[Action])] = &[
    ("tests", &[Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
    ("project_members", &[Action::SQLITE_INSERT, Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
];

pub struct TestCache {
    kept: Arc<Watched<Kept>>,
}

#[derive(Default)]
struct Kept {
    /// Test id → (project id, served JSON).
    tests: HashMap<String, (String, Arc<str>)>,
    /// Bytes of ids and JSON in `tests`.
    bytes: usize,
    /// User id → project id → the member's role.
    roles: HashMap<String, HashMap<String, Role>>,
    /// Entries in `roles`.
    role_count: usize,
}

/// A test as a caller may read it.
pub struct Found {
    pub served: Arc<str>,
    pub role: Role,
}

impl TestCache {
    /// A cache kept correct by `store`'s writes.
    pub fn watching(store: &Store) -> TestCache {
        TestCache { kept: Watched::new(store, WATCHED) }
    }

    /// The test and the caller's role in its project, if both are kept.
    pub fn get(&self, test_id: &str, user_id: &str) -> Option<Found> {
        self.kept.read(|kept| {
            let (project_id, served) = kept.tests.get(test_id)?;
            let role = *kept.roles.get(user_id)?.get(project_id)?;
            Some(Found { served: served.clone(), role })
        })
    }

    /// To take before reading the database, and give to [`TestCache::keep`].
    pub fn generation(&self) -> u64 {
        self.kept.generation()
    }

    /// Keeps a test and a member's role found by a read that started at
    /// `generation`, unless the cache was emptied since (the read may
    /// predate the change that emptied it).
    pub fn keep(&self, generation: u64, test_id: &str, project_id: &str, served: Arc<str>, user_id: &str, role: Role) {
        self.kept.keep(generation, |kept| {
            let size = test_id.len() + project_id.len() + served.len();
            if kept.bytes + size > MAX_BYTES {
                kept.tests.clear();
                kept.bytes = 0;
            }
            if kept.role_count >= MAX_ROLES {
                kept.roles.clear();
                kept.role_count = 0;
            }
            if kept.tests.insert(test_id.to_string(), (project_id.to_string(), served)).is_none() {
                kept.bytes += size;
            }
            if kept.roles.entry(user_id.to_string()).or_default().insert(project_id.to_string(), role).is_none() {
                kept.role_count += 1;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(s: &str) -> Arc<str> {
        s.into()
    }

    #[test]
    fn a_test_is_found_only_with_the_callers_role_in_its_project() {
        let cache = TestCache { kept: Arc::default() };
        let g = cache.generation();
        cache.keep(g, "tst_1", "prj_1", served("{}"), "usr_1", Role::Viewer);
        let found = cache.get("tst_1", "usr_1").unwrap();
        assert_eq!((&*found.served, found.role), ("{}", Role::Viewer));
        // Another user, even a member of another project, is not found.
        cache.keep(g, "tst_2", "prj_2", served("[]"), "usr_2", Role::Owner);
        assert!(cache.get("tst_1", "usr_2").is_none());
        assert!(cache.get("tst_2", "usr_1").is_none());
        assert!(cache.get("tst_3", "usr_1").is_none());
    }

    #[test]
    fn a_read_that_began_before_the_cache_was_emptied_is_not_kept() {
        let cache = TestCache { kept: Arc::default() };
        let before = cache.generation();
        cache.keep(before, "tst_1", "prj_1", served("{}"), "usr_1", Role::Owner);
        cache.kept.reset();
        assert!(cache.get("tst_1", "usr_1").is_none());
        cache.keep(before, "tst_1", "prj_1", served("{\"old\":1}"), "usr_1", Role::Owner);
        assert!(cache.get("tst_1", "usr_1").is_none());
        cache.keep(cache.generation(), "tst_1", "prj_1", served("{}"), "usr_1", Role::Owner);
        assert!(cache.get("tst_1", "usr_1").is_some());
    }

    #[test]
    fn the_tests_kept_stay_under_their_bound() {
        let cache = TestCache { kept: Arc::default() };
        let g = cache.generation();
        let big: Arc<str> = "x".repeat(MAX_BYTES / 4).into();
        for i in 0..10 {
            cache.keep(g, &format!("tst_{i}"), "prj_1", big.clone(), "usr_1", Role::Owner);
            assert!(cache.kept.read(|kept| kept.bytes) <= MAX_BYTES);
        }
        assert!(cache.get("tst_9", "usr_1").is_some());
        assert!(cache.get("tst_0", "usr_1").is_none());
    }
}
