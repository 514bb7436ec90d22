//! Resource ids: `<type prefix>_<UUIDv7 as 32 hex digits>`.
//!
//! The prefix tells a person what an id is; UUIDv7 puts the creation time
//! first, so ids sort by creation time (newest-first lists order by id).

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// Whether `id` is one [`new_id`] made with `prefix`.
pub fn is_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The current time as stored and shown: RFC 3339 UTC with microseconds.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    let t = chrono::Utc::now();
    // Round-trip through the stored text form so an in-memory value equals
    // what a later read returns.
    parse_time(&format_time(&t)).unwrap_or(t)
}

pub fn format_time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

pub fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&chrono::Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation() {
        let ids: Vec<String> = (0..1000).map(|_| new_id("key")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert!(ids[0].starts_with("key_") && ids[0].len() == 4 + 32);
        assert!(ids.iter().all(|id| is_id(id, "key")));
        assert!(!is_id(&ids[0], "usr") && !is_id(&ids[0][..30], "key") && !is_id("key_zzzz", "key"));
    }
}
