//! Cursor pagination for every list: `?limit=` (default 50, at most 200)
//! and `?cursor=`, newest first.
//!
//! A cursor is the last returned id, base64url-encoded so clients treat it as
//! opaque. Lists order by id, which orders by creation time (see `ids`), and
//! a page starts strictly after its cursor, so items inserted between two
//! page requests never shift what the next page returns. A list takes only
//! a cursor it could have issued: an id of its own kind (`<prefix>_` and
//! its 32 hex digits), or a row number for a list without ids of its own; a
//! made-up, cut-short or other list's cursor is refused, not read as some
//! other page.

use base64::Engine as _;

pub const DEFAULT_LIMIT: i32 = 50;
pub const MAX_LIMIT: i32 = 200;

#[derive(Clone, Debug)]
pub struct PageRequest {
    pub limit: usize,
    /// Return items strictly after this id (in list order).
    pub after: Option<String>,
}

/// Callers name the parameter (`Failure::invalid("cursor", e)`).
#[derive(Debug, thiserror::Error)]
#[error("not a cursor this server issued")]
pub struct InvalidCursor;

impl PageRequest {
    /// A page of a list of ids made with `prefix` (see `ids::new_id`).
    pub fn parse(limit: Option<i32>, cursor: Option<&str>, prefix: &str) -> Result<PageRequest, InvalidCursor> {
        Self::parse_with(limit, cursor, |id| crate::ids::is_id(id, prefix))
    }

    /// A page of a list ordered by a row number that never changes or is
    /// reused (SQLite's `AUTOINCREMENT`), whose cursor is the number of the
    /// last item returned.
    pub fn parse_sequence(
        limit: Option<i32>,
        cursor: Option<&str>,
    ) -> Result<(PageRequest, Option<i64>), InvalidCursor> {
        let page = Self::parse_with(limit, cursor, |p| p.len() <= 18 && p.bytes().all(|b| b.is_ascii_digit()))?;
        let after = page.after.as_deref().map(|a| a.parse::<i64>().map_err(|_| InvalidCursor)).transpose()?;
        Ok((page, after))
    }

    /// A page of a list ordered by a time, then by an id made with `prefix`
    /// (members, by when they were added): the cursor is the last item's
    /// [`timed_cursor`](Self::timed_cursor). Gives the time as stored
    /// (`ids::format_time`) and the id to page after.
    pub fn parse_timed(
        limit: Option<i32>,
        cursor: Option<&str>,
        prefix: &str,
    ) -> Result<(PageRequest, Option<(String, String)>), InvalidCursor> {
        let page = Self::parse_with(limit, cursor, |c| split_timed(c, prefix).is_some())?;
        let after = page.after.as_deref().and_then(|c| split_timed(c, prefix));
        Ok((page, after))
    }

    /// What [`parse_timed`](Self::parse_timed) takes: `<time in Unix
    /// microseconds>.<id>`.
    pub fn timed_cursor(time: &chrono::DateTime<chrono::Utc>, id: &str) -> String {
        format!("{}.{id}", time.timestamp_micros())
    }

    fn parse_with(
        limit: Option<i32>,
        cursor: Option<&str>,
        issued: impl Fn(&str) -> bool,
    ) -> Result<PageRequest, InvalidCursor> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT) as usize;
        let after = match cursor {
            // An empty cursor is no cursor this server issued: read as the
            // first page, a client that sent a missing `next_cursor` as
            // `cursor=` would read the first page again, for ever.
            None => None,
            Some(c) => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).map_err(|_| InvalidCursor)?;
                let id = String::from_utf8(bytes).map_err(|_| InvalidCursor)?;
                if id.is_empty() || !issued(&id) {
                    return Err(InvalidCursor);
                }
                Some(id)
            }
        };
        Ok(PageRequest { limit, after })
    }

    /// How many rows to fetch: one more than the page, to know if another
    /// page follows.
    pub fn fetch_limit(&self) -> i64 {
        self.limit as i64 + 1
    }

    /// A page of `rows` (at most the page's size) cut short before its size,
    /// for another reason than the end of the list: the next page starts
    /// after its last row.
    pub fn finish_early<T>(&self, mut rows: Vec<T>, id_of: impl Fn(&T) -> String) -> Page<T> {
        rows.truncate(self.limit);
        let next_cursor = rows.last().map(|last| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id_of(last)));
        Page { items: rows, next_cursor }
    }

    /// [`finish`](Self::finish) for a list whose items may each be up to a
    /// request body in size: the page ends early after the item that takes
    /// it past [`PAGE_BYTES`] when another follows. `rows` holds what
    /// [`PageRows::read`] kept.
    pub fn finish_sized<T>(
        &self,
        mut rows: Vec<T>,
        size_of: impl Fn(&T) -> usize,
        id_of: impl Fn(&T) -> String,
    ) -> Page<T> {
        let mut bytes = 0;
        let cut = rows.iter().take(self.limit).position(|row| {
            bytes += size_of(row);
            bytes > PAGE_BYTES
        });
        match cut {
            Some(last) if last + 1 < rows.len() => {
                rows.truncate(last + 1);
                self.finish_early(rows, id_of)
            }
            _ => self.finish(rows, id_of),
        }
    }

    pub fn finish<T>(&self, rows: Vec<T>, id_of: impl Fn(&T) -> String) -> Page<T> {
        if rows.len() > self.limit {
            self.finish_early(rows, id_of)
        } else {
            Page { items: rows, next_cursor: None }
        }
    }
}

/// Past this many bytes of items, each up to a request body (1 MiB) in
/// size, a page ends before its `limit`, with its cursor: a page of 200 was
/// otherwise up to 200 MB to read, hold and write for one request.
pub const PAGE_BYTES: usize = 8 << 20;

/// The rows of a page of such a list, as they are read: up to the one that
/// takes them past [`PAGE_BYTES`], and the one after it (which says whether
/// a page cut there has a next one), and no more.
pub struct PageRows<T> {
    pub rows: Vec<T>,
    bytes: usize,
}

impl<T> Default for PageRows<T> {
    fn default() -> Self {
        PageRows { rows: Vec::new(), bytes: 0 }
    }
}

impl<T> PageRows<T> {
    /// Keeps `row`, of `size` bytes; false once no more is needed.
    pub fn read(&mut self, row: T, size: usize) -> bool {
        let more = self.bytes <= PAGE_BYTES;
        self.bytes += size;
        self.rows.push(row);
        more
    }
}

/// The rows with these `ids`, in order, each read by `by_id` (a statement
/// whose `?1` is an id) with the length of its text column `sized` (the
/// document that makes it large), as [`PageRows`] keeps them: for
/// [`PageRequest::finish_sized`].
pub(crate) fn read_sized<T>(
    tx: &rusqlite::Connection,
    by_id: &str,
    ids: &[String],
    sized: usize,
    from_row: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<(T, usize)>> {
    let mut by_id = tx.prepare_cached(by_id)?;
    let mut read = PageRows::default();
    for id in ids {
        let (row, size) = by_id.query_row([id], |row| {
            let size = match row.get_ref(sized)? {
                rusqlite::types::ValueRef::Text(document) => document.len(),
                _ => 0,
            };
            Ok((from_row(row)?, size))
        })?;
        if !read.read((row, size), size) {
            break;
        }
    }
    Ok(read.rows)
}

fn split_timed(cursor: &str, prefix: &str) -> Option<(String, String)> {
    let (micros, id) = cursor.split_once('.')?;
    if micros.is_empty()
        || micros.len() > 18
        || !micros.bytes().all(|b| b.is_ascii_digit())
        || !crate::ids::is_id(id, prefix)
    {
        return None;
    }
    let time = chrono::DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    Some((crate::ids::format_time(&time), id.to_string()))
}

pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Where a list's SQL takes its cursor: [`PageSql::new`] puts the cursor's
/// condition here in a page after a cursor, and nothing in a first page.
/// (A comment, so that SQL holding it stays SQL.)
pub const AFTER: &str = "/* after the cursor */";

/// A list's SQL in its two forms: a first page's, and that of a page after a
/// cursor, whose condition on the cursor (`AND id < ?3`) is a range the
/// planner starts the list's index at. Written as one statement for both,
/// `(?3 IS NULL OR id < ?3)`, it is not a range (plans do not look at bound
/// values): a deep page then walked every item before its cursor. Each list
/// builds its `PageSql` once, in a `LazyLock`; the cursor's parameter keeps
/// its number in both forms, and is bound, unused, in a first page.
pub struct PageSql {
    first: String,
    after: String,
}

impl PageSql {
    /// `sql` holds [`AFTER`] once, where `condition` goes.
    pub fn new(sql: &str, condition: &str) -> PageSql {
        assert_eq!(sql.matches(AFTER).count(), 1, "a list's SQL holds `AFTER` once: {sql}");
        PageSql { first: sql.replace(AFTER, ""), after: sql.replace(AFTER, condition) }
    }

    /// The SQL of `page`.
    pub fn of(&self, page: &PageRequest) -> &str {
        self.of_cursor(page.after.is_some())
    }

    /// The SQL of a page with or without a cursor.
    pub fn of_cursor(&self, after: bool) -> &str {
        if after {
            &self.after
        } else {
            &self.first
        }
    }
}

/// The projects a page of a list across the caller's projects walks: only
/// `project_id` when one is asked for (the list checks the caller's access
/// to it first), else every project `user_id` is a member of.
pub(crate) fn projects_to_walk(
    tx: &rusqlite::Connection,
    user_id: &str,
    project_id: Option<&str>,
) -> rusqlite::Result<Vec<String>> {
    match project_id {
        Some(project_id) => Ok(vec![project_id.to_string()]),
        None => tx
            .prepare_cached("SELECT project_id FROM project_members WHERE user_id = ?1")?
            .query_map([user_id], |r| r.get(0))?
            .collect(),
    }
}

/// The ids of a page of a list across the caller's projects, or of the one
/// `project_id` asked for once the caller is found to read it: one walk per
/// project ([`projects_to_walk`]), merged ([`merge_walks`]).
pub(crate) fn ids_across_projects(
    tx: &rusqlite::Connection,
    user_id: &str,
    project_id: Option<&str>,
    sql: &str,
    page: &PageRequest,
    rest: &[&dyn rusqlite::ToSql],
) -> crate::failure::Result<Vec<String>> {
    if let Some(project_id) = project_id {
        crate::access::require(tx, user_id, project_id, crate::access::Need::Read)?;
    }
    let projects = projects_to_walk(tx, user_id, project_id)?;
    Ok(merge_walks(tx, sql, &projects, page, rest)?)
}

/// The ids of a page merged from one walk per project, newest first, at
/// most the page's [`fetch_limit`](PageRequest::fetch_limit): `sql` (a
/// [`PageSql`] form) gives one project's ids in order from its index on
/// (project, id), stopped at that limit, its project bound as `?1` and
/// `rest` as `?2` on. One statement over all the caller's projects
/// (`project_id IN (…)`) is in no index's order: it sorted every item of
/// every project of theirs after the cursor, for each page, however small.
pub(crate) fn merge_walks(
    tx: &rusqlite::Connection,
    sql: &str,
    projects: &[String],
    page: &PageRequest,
    rest: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<Vec<String>> {
    let keep = page.fetch_limit() as usize;
    let mut statement = tx.prepare_cached(sql)?;
    let mut ids: Vec<String> = Vec::new();
    for project_id in projects {
        let mut args: Vec<&dyn rusqlite::ToSql> = vec![project_id];
        args.extend_from_slice(rest);
        for id in statement.query_map(&args[..], |r| r.get::<_, String>(0))? {
            ids.push(id?);
        }
        if ids.len() > 2 * keep {
            ids.sort_unstable_by(|a, b| b.cmp(a));
            ids.truncate(keep);
        }
    }
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.truncate(keep);
    Ok(ids)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{Store, StoreError};

    /// Every list's SQL, and the step of its plan that reads the list's
    /// index from a page's cursor on.
    fn lists() -> Vec<(&'static PageSql, &'static str)> {
        vec![
            (&crate::api_keys::PAGE_SQL, "SEARCH api_keys USING COVERING INDEX api_keys_listing (user_id=? AND id<?)"),
            (&crate::batches::LIST_SQL, "SEARCH b USING COVERING INDEX batches_by_project (project_id=? AND id<?)"),
            (&crate::channels::LIST_SQL, "SEARCH c USING INDEX channels_by_project (project_id=? AND id<?)"),
            (&crate::credits::LIST_SQL, "SEARCH transactions USING INDEX transactions_by_user (user_id=? AND seq<?)"),
            (
                &crate::engine::webhooks::LIST_SQL,
                "SEARCH webhook_deliveries USING INDEX webhook_deliveries_by_project (project_id=? AND id<?)",
            ),
            (&crate::integrations::LIST_SQL, "SEARCH i USING INDEX integrations_by_project (project_id=? AND id<?)"),
            (
                &crate::integrations::PHONE_NUMBERS_SQL,
                "SEARCH integration_phone_numbers USING INDEX integration_phone_numbers_newest_first \
                 (integration_id=? AND seq<?)",
            ),
            (&crate::personas::LIST_SQL, "SEARCH t USING INDEX personas_by_project (project_id=? AND id<?)"),
            (&crate::projects::LIST_SQL, "SEARCH m USING INDEX project_members_by_user (user_id=? AND project_id<?)"),
            (
                &crate::projects::MEMBERS_SQL,
                "SEARCH m USING INDEX project_members_by_added (project_id=? AND (added_at,user_id)<(?,?))",
            ),
            (&crate::reviews::LIST_SQL, "SEARCH r USING INDEX reviews_by_project (project_id=? AND id<?)"),
            (
                &crate::reviews::calibration::LIST_SQL,
                "SEARCH calibrations USING INDEX calibrations_by_project (project_id=? AND id<?)",
            ),
            (
                &crate::runs::BATCH_RUNS_SQL,
                "SEARCH batch_runs USING INDEX batch_runs_by_project (project_id=? AND id<?)",
            ),
            (
                &crate::runs::BATCH_RUN_TESTS_SQL,
                "SEARCH t USING INDEX sqlite_autoindex_batch_run_tests_1 (batch_run_id=? AND test_id<?)",
            ),
            (&crate::runs::RUNS_SQL, "SEARCH runs USING INDEX runs_by_batch_run (batch_run_id=? AND id<?)"),
            (
                &crate::runs::TEST_RESULTS_SQL,
                "SEARCH test_results USING INDEX test_results_by_test (test_id=? AND id<?)",
            ),
            (&crate::scenarios::LIST_SQL, "SEARCH s USING INDEX scenarios_by_project (project_id=? AND id<?)"),
        ]
    }

    /// Runs `check` on a database holding the schema, in a transaction.
    pub(crate) fn on_schema(check: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<()> + Send + 'static) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).unwrap();
        store.write_blocking::<_, StoreError, _>(|tx| Ok(check(tx)?)).unwrap();
    }

    /// The steps of `sql`'s query plan, its parameters all NULL (plans do
    /// not look at bound values).
    pub(crate) fn plan(tx: &rusqlite::Connection, sql: &str) -> rusqlite::Result<Vec<String>> {
        let mut explain = tx.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
        let nulls = vec![rusqlite::types::Null; explain.parameter_count()];
        let plan = explain.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?.collect();
        plan
    }

    /// A page after a cursor reads each list's index from the cursor on,
    /// not every item before it; a first page has no cursor to start at.
    /// (`GET /v1/reviewers` is left out: a project's reviewers are found
    /// through its members, few, and the cursor filters them.)
    #[test]
    fn a_page_after_a_cursor_starts_its_index_at_the_cursor() {
        on_schema(|tx| {
            for (sql, step) in lists() {
                let after = plan(tx, sql.of_cursor(true))?;
                assert!(after.iter().any(|s| s == step), "{step}\n{after:#?}");
                let first = plan(tx, sql.of_cursor(false))?;
                assert!(!first.iter().any(|s| s.contains("<?")), "{first:#?}");
            }
            Ok(())
        });
    }

    /// Items up to a request body each: a page is read up to the item past
    /// `PAGE_BYTES` and the one after it, and ends after the first of them
    /// when the second is there; a page within its bytes ends as usual.
    #[test]
    fn a_page_of_big_items_ends_past_its_bytes() {
        let mib = 1 << 20;
        let page = PageRequest::parse(Some(50), None, "tst").unwrap();
        let mut read = PageRows::default();
        let mut offered = 0;
        for i in 0..20 {
            offered += 1;
            if !read.read(format!("tst_{:032}", 20 - i), mib) {
                break;
            }
        }
        // 9 items pass 8 MiB; the 10th says there is more.
        assert_eq!((offered, read.rows.len()), (10, 10));
        let cut = page.finish_sized(read.rows.clone(), |_| mib, String::clone);
        assert_eq!(cut.items.len(), 9);
        let cursor = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&cut.items[8]);
        assert_eq!(cut.next_cursor, Some(cursor));
        // The list's last items: nothing follows the one past the bytes.
        let last = page.finish_sized(read.rows[..9].to_vec(), |_| mib, String::clone);
        assert_eq!((last.items.len(), last.next_cursor), (9, None));
        // Small items: the limit decides.
        let small: Vec<String> = (0..51).map(|i| format!("tst_{i:032}")).collect();
        let page_of_small = page.finish_sized(small, |_| 100, String::clone);
        assert_eq!(page_of_small.items.len(), 50);
        assert!(page_of_small.next_cursor.is_some());
    }

    /// A page of a list across the caller's projects is read from each
    /// project's index in order and stops at the page's size: no sort of
    /// everything in the caller's projects (after the cursor), which read
    /// every one of them for each page, however small.
    #[test]
    fn a_page_across_the_callers_projects_sorts_nothing() {
        on_schema(|tx| {
            for sql in [
                &*crate::personas::LIST_SQL,
                &*crate::scenarios::LIST_SQL,
                &*crate::runs::BATCH_RUNS_SQL,
                &*crate::batches::LIST_SQL,
                &*crate::channels::LIST_SQL,
                &*crate::integrations::LIST_SQL,
                &*crate::projects::LIST_SQL,
                &*crate::reviews::LIST_SQL,
                &*crate::reviews::calibration::LIST_SQL,
            ] {
                for after in [false, true] {
                    let steps = plan(tx, sql.of_cursor(after))?;
                    assert!(!steps.iter().any(|s| s.contains("TEMP B-TREE")), "{steps:#?}");
                }
            }
            Ok(())
        });
    }

    /// A cursor given empty is refused, by every form of page, as any other
    /// cursor this server did not issue.
    #[test]
    fn an_empty_cursor_is_refused() {
        assert!(PageRequest::parse(None, Some(""), "tst").is_err());
        assert!(PageRequest::parse_sequence(None, Some("")).is_err());
        assert!(PageRequest::parse_timed(None, Some(""), "usr").is_err());
        assert!(PageRequest::parse(None, None, "tst").unwrap().after.is_none());
    }

    /// The cursor's condition goes where the SQL marks it, and only in a
    /// page after a cursor.
    #[test]
    fn the_cursor_condition_only_after_a_cursor() {
        let sql =
            PageSql::new(&format!("SELECT id FROM t WHERE x = ?1 {AFTER} ORDER BY id DESC LIMIT ?3"), "AND id < ?2");
        assert_eq!(sql.of_cursor(false), "SELECT id FROM t WHERE x = ?1  ORDER BY id DESC LIMIT ?3");
        assert_eq!(sql.of_cursor(true), "SELECT id FROM t WHERE x = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3");
        let page = PageRequest::parse(None, None, "tst").unwrap();
        assert_eq!(sql.of(&page), sql.of_cursor(false));
    }
}
