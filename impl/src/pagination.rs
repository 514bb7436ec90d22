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
            None | Some("") => None,
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

    pub fn finish<T>(&self, mut rows: Vec<T>, id_of: impl Fn(&T) -> String) -> Page<T> {
        let next_cursor = if rows.len() > self.limit {
            rows.truncate(self.limit);
            rows.last().map(|last| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id_of(last)))
        } else {
            None
        };
        Page { items: rows, next_cursor }
    }
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
