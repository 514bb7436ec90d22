//! Tests as served, and callers' roles in projects, kept in memory so that
//! `GET /v1/tests/{id}` (what dashboards and CI poll) costs two map lookups
//! instead of a database read. `GET /v1/test-results/{id}` checks the
//! caller's role here as well.
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
//!
//! Also kept: the newest tests of a project, for the first page of `GET
//! /v1/tests?project_id=…` (what a dashboard of a project polls), enough
//! for the largest page and the test after it. Here a new test does change
//! what is kept, and the kept tests are added to rather than emptied:
//! `tests::create` adds its test once its write is durable and before it
//! is answered ([`TestCache::created`], through `Store::write_then`),
//! which also refuses what any read begun before then would keep. That is
//! the only way the server creates tests; another would have to add its
//! tests here too. Updates and deletions empty everything, as above.

use std::collections::HashMap;
use std::sync::Arc;

use crate::access::Role;
use crate::pagination::MAX_LIMIT;
use crate::store::{Action, Store, Watched};

/// More bytes of tests than this and the tests start over (a bound on
/// memory whatever the number of tests: 10,000 tests of `cargo xtask bench
/// api` hold ~15 MB).
const MAX_BYTES: usize = 32 * 1024 * 1024;

/// More memberships than this and they start over.
const MAX_ROLES: usize = 100_000;

/// The newest tests kept per project: the largest page and the test after
/// it (which says whether there is a next page).
pub const NEWEST: usize = MAX_LIMIT as usize + 1;

/// More bytes of projects' newest tests than this and they start over
/// (~180 KB per project of `cargo xtask bench api`).
const MAX_NEWEST_BYTES: usize = 16 * 1024 * 1024;

/// The changes that make what is kept stale. A project's deletion deletes
/// its tests and members by cascade, which the store sees as such.
const WATCHED: &[(&str, &[Action])] = &[
    ("tests", &[Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
    ("project_members", &[Action::SQLITE_INSERT, Action::SQLITE_UPDATE, Action::SQLITE_DELETE]),
];

#[derive(Clone)]
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
    /// Project id → its newest tests.
    newest: HashMap<String, Newest>,
    /// Bytes of ids and JSON in `newest`.
    newest_bytes: usize,
}

/// A test as a page lists it: its id and served JSON.
pub type Listed = (String, Arc<str>);

/// A project's newest tests.
struct Newest {
    /// (test id, served JSON), newest first (by id, as the listing orders),
    /// at most [`NEWEST`].
    tests: Vec<Listed>,
    /// Whether `tests` are all the project's tests.
    all: bool,
}

fn size_of(test_id: &str, served: &str) -> usize {
    test_id.len() + served.len()
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

    /// A project's `n` newest tests (all of them, if it has fewer), newest
    /// first, and the caller's role there, if both are kept.
    pub fn newest(&self, project_id: &str, user_id: &str, n: usize) -> Option<(Role, Vec<Listed>)> {
        self.kept.read(|kept| {
            let newest = kept.newest.get(project_id)?;
            if newest.tests.len() < n && !newest.all {
                return None;
            }
            let role = *kept.roles.get(user_id)?.get(project_id)?;
            Some((role, newest.tests.iter().take(n).cloned().collect()))
        })
    }

    /// A member's role in a project, if kept (`GET /v1/test-results/{id}`
    /// checks it here too).
    pub fn role(&self, user_id: &str, project_id: &str) -> Option<Role> {
        self.kept.read(|kept| kept.roles.get(user_id)?.get(project_id).copied())
    }

    /// To take before reading the database, and give to [`TestCache::keep`],
    /// [`TestCache::keep_newest`] or [`TestCache::keep_role`].
    pub fn generation(&self) -> u64 {
        self.kept.generation()
    }

    /// Keeps a project's newest tests (at most [`NEWEST`], newest first: all
    /// of them if fewer) and a member's role there, found by a read that
    /// started at `generation`, unless a change came since.
    pub fn keep_newest(&self, generation: u64, project_id: &str, mut tests: Vec<Listed>, user_id: &str, role: Role) {
        self.kept.keep(generation, |kept| {
            let all = tests.len() < NEWEST;
            tests.truncate(NEWEST);
            let size: usize = project_id.len() + tests.iter().map(|(id, served)| size_of(id, served)).sum::<usize>();
            if let Some(old) = kept.newest.remove(project_id) {
                kept.newest_bytes -= project_id.len() + old.tests.iter().map(|(id, s)| size_of(id, s)).sum::<usize>();
            }
            if kept.newest_bytes + size > MAX_NEWEST_BYTES {
                kept.newest.clear();
                kept.newest_bytes = 0;
            }
            // Tests of up to a request body each: one project's may be more
            // than the bound alone, and are then not kept.
            if size <= MAX_NEWEST_BYTES {
                kept.newest.insert(project_id.to_string(), Newest { tests, all });
                kept.newest_bytes += size;
            }
            keep_role(kept, user_id, project_id, role);
        });
    }

    /// A test just created: its write is durable and not yet answered (see
    /// the module's doc). Added to its project's newest tests if they are
    /// kept; reads begun before now keep nothing.
    pub fn created(&self, test_id: &str, project_id: &str, served: Arc<str>) {
        self.kept.change(|kept| {
            let Some(newest) = kept.newest.get_mut(project_id) else { return };
            // Ids order by creation time, but two creates may commit in the
            // other order.
            let at = newest.tests.partition_point(|(id, _)| id.as_str() > test_id);
            if newest.tests.get(at).is_some_and(|(id, _)| id == test_id) {
                return;
            }
            if at == newest.tests.len() && !newest.all {
                // Older than every kept test of a project with more: not
                // among its newest.
                return;
            }
            kept.newest_bytes += size_of(test_id, &served);
            newest.tests.insert(at, (test_id.to_string(), served));
            if newest.tests.len() > NEWEST {
                if let Some((id, served)) = newest.tests.pop() {
                    kept.newest_bytes -= size_of(&id, &served);
                }
                newest.all = false;
            }
            // Kept tests grow by creates too: past the bound, they start over.
            if kept.newest_bytes > MAX_NEWEST_BYTES {
                kept.newest.clear();
                kept.newest_bytes = 0;
            }
        });
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
            if kept.tests.insert(test_id.to_string(), (project_id.to_string(), served)).is_none() {
                kept.bytes += size;
            }
            keep_role(kept, user_id, project_id, role);
        });
    }

    /// Keeps a member's role found by a read that started at `generation`,
    /// unless the cache was emptied since.
    pub fn keep_role(&self, generation: u64, user_id: &str, project_id: &str, role: Role) {
        self.kept.keep(generation, |kept| keep_role(kept, user_id, project_id, role));
    }
}

fn keep_role(kept: &mut Kept, user_id: &str, project_id: &str, role: Role) {
    if kept.role_count >= MAX_ROLES {
        kept.roles.clear();
        kept.role_count = 0;
    }
    if kept.roles.entry(user_id.to_string()).or_default().insert(project_id.to_string(), role).is_none() {
        kept.role_count += 1;
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
    fn a_role_kept_alone_is_the_members_in_that_project_only() {
        let cache = TestCache { kept: Arc::default() };
        let before = cache.generation();
        cache.keep_role(before, "usr_1", "prj_1", Role::Reviewer);
        assert_eq!(cache.role("usr_1", "prj_1"), Some(Role::Reviewer));
        assert_eq!((cache.role("usr_1", "prj_2"), cache.role("usr_2", "prj_1")), (None, None));
        cache.kept.reset();
        assert_eq!(cache.role("usr_1", "prj_1"), None);
        cache.keep_role(before, "usr_1", "prj_1", Role::Owner);
        assert_eq!(cache.role("usr_1", "prj_1"), None, "read before the cache was emptied");
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

    fn t(id: &str) -> Listed {
        (id.to_string(), served("{}"))
    }

    /// Ids of a project's `n` newest tests, checking the bytes counted.
    fn newest(cache: &TestCache, project_id: &str, n: usize) -> Option<Vec<String>> {
        let counted = cache.kept.read(|kept| {
            let sum = |n: &Newest| n.tests.iter().map(|(id, s)| size_of(id, s)).sum::<usize>();
            kept.newest.iter().map(|(p, n)| p.len() + sum(n)).sum::<usize>()
        });
        assert_eq!(cache.kept.read(|kept| kept.newest_bytes), counted);
        let (_, tests) = cache.newest(project_id, "usr_1", n)?;
        Some(tests.into_iter().map(|(id, _)| id).collect())
    }

    #[test]
    fn a_created_test_joins_its_projects_newest_in_id_order() {
        let cache = TestCache { kept: Arc::default() };
        // Nothing kept: a created test keeps nothing.
        cache.created("tst_5", "prj_1", served("{}"));
        assert!(newest(&cache, "prj_1", 1).is_none());
        let g = cache.generation();
        cache.keep_newest(g, "prj_1", vec![t("tst_4"), t("tst_2")], "usr_1", Role::Viewer);
        // Every test of the project is kept (fewer than `NEWEST`): any page.
        assert_eq!(newest(&cache, "prj_1", 51).unwrap(), ["tst_4", "tst_2"]);
        assert_eq!(newest(&cache, "prj_1", 1).unwrap(), ["tst_4"]);
        assert!(cache.newest("prj_1", "usr_2", 1).is_none(), "another user's role is not kept");
        // Two creates may commit out of their ids' order; each is kept once.
        for id in ["tst_3", "tst_6", "tst_1", "tst_3"] {
            cache.created(id, "prj_1", served("{}"));
        }
        assert_eq!(newest(&cache, "prj_1", 51).unwrap(), ["tst_6", "tst_4", "tst_3", "tst_2", "tst_1"]);
        // Another project's test is not this one's.
        cache.created("tst_7", "prj_2", served("{}"));
        assert_eq!(newest(&cache, "prj_1", 1).unwrap(), ["tst_6"]);
        // A read begun before a create keeps nothing: it may not have seen it.
        cache.keep_newest(g, "prj_2", vec![], "usr_1", Role::Owner);
        assert!(newest(&cache, "prj_2", 1).is_none());
        // Emptied by a change: nothing kept.
        cache.kept.reset();
        assert!(newest(&cache, "prj_1", 1).is_none());
    }

    #[test]
    fn a_project_with_more_tests_than_kept_keeps_only_its_newest() {
        let cache = TestCache { kept: Arc::default() };
        let id = |i: usize| format!("tst_{i:04}");
        let many = (0..NEWEST + 10).rev().map(|i| t(&id(i))).collect();
        cache.keep_newest(cache.generation(), "prj_1", many, "usr_1", Role::Owner);
        let kept = newest(&cache, "prj_1", NEWEST).unwrap();
        assert_eq!((kept.len(), &kept[0], &kept[NEWEST - 1]), (NEWEST, &id(NEWEST + 9), &id(10)));
        assert!(newest(&cache, "prj_1", NEWEST + 1).is_none(), "the page after the kept ones is not kept");
        // Older than every kept test of a project with more: not among them.
        cache.created(&id(5), "prj_1", served("{}"));
        assert_eq!(newest(&cache, "prj_1", NEWEST).unwrap(), kept);
        // Newer: first, and the oldest kept goes.
        cache.created(&id(9999), "prj_1", served("{}"));
        let now = newest(&cache, "prj_1", NEWEST).unwrap();
        assert_eq!((now.len(), &now[0], &now[1], &now[NEWEST - 1]), (NEWEST, &id(9999), &id(NEWEST + 9), &id(11)));

        // A project with one test fewer than kept: all of them, until it has
        // more than `NEWEST`.
        let few = (0..NEWEST - 1).rev().map(|i| t(&id(i))).collect();
        cache.keep_newest(cache.generation(), "prj_2", few, "usr_1", Role::Owner);
        assert_eq!(newest(&cache, "prj_2", NEWEST + 1).unwrap().len(), NEWEST - 1);
        cache.created(&id(NEWEST), "prj_2", served("{}"));
        assert_eq!(newest(&cache, "prj_2", NEWEST + 1).unwrap().len(), NEWEST);
        cache.created(&id(NEWEST + 1), "prj_2", served("{}"));
        assert!(newest(&cache, "prj_2", NEWEST + 1).is_none());
        assert_eq!(newest(&cache, "prj_2", NEWEST).unwrap()[NEWEST - 1], id(1));
    }

    /// Tests are up to a request body in size (1 MiB): a project's newest,
    /// whether read at once or made one by one after, stay under their
    /// bound as well.
    #[test]
    fn the_newest_tests_kept_stay_under_their_bound() {
        let cache = TestCache { kept: Arc::default() };
        let big: Arc<str> = "x".repeat(MAX_NEWEST_BYTES / 4).into();
        let id = |i: usize| format!("tst_{i:04}");
        let bytes = || cache.kept.read(|kept| kept.newest_bytes);
        // Read at once: more than the bound is not kept.
        let many = (0..8).rev().map(|i| (id(i), big.clone())).collect();
        cache.keep_newest(cache.generation(), "prj_1", many, "usr_1", Role::Owner);
        assert!(bytes() <= MAX_NEWEST_BYTES, "{}", bytes());
        assert!(cache.newest("prj_1", "usr_1", 1).is_none());
        // Made one by one after a read of a project with none.
        cache.keep_newest(cache.generation(), "prj_2", vec![], "usr_1", Role::Owner);
        for i in 0..8 {
            cache.created(&id(100 + i), "prj_2", big.clone());
            assert!(bytes() <= MAX_NEWEST_BYTES, "after {} tests: {}", i + 1, bytes());
        }
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
