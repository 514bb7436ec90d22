//! Responses written as JSON straight from stored text (see
//! `sparring_server::Json::written`).
//!
//! The hot reads keep what they answer as JSON encoded from the generated
//! types when it was written: a test (`tests.served`), a test result
//! (`test_results.document`). Decoding it into those types only for dropshot
//! to encode it again was most of their cost (serde's internally tagged
//! `Evaluator` buffers every evaluator, chrono formats timestamps a character
//! at a time), so they answer with the stored text, and a page of them is
//! the texts put together ([`page`]). A page of API keys is written from its
//! columns (`api_keys::written_key`, with [`push_string`] and [`push_time`]).
//! `tests/written.rs` checks that each says the same JSON value as the typed
//! path.

use std::borrow::Cow;

/// `{"<field>": [items…], "next_cursor": cursor | null}`: a page of a list,
/// its items already JSON.
pub fn page<'a>(field: &str, items: impl IntoIterator<Item = &'a str>, next_cursor: Option<&str>) -> String {
    let items: Vec<&str> = items.into_iter().collect();
    let size = items.iter().map(|i| i.len() + 1).sum();
    page_with(field, items, size, |out, item| out.push_str(item), next_cursor)
}

/// [`page`], each item written into the page by `write` (`size`: about how
/// many bytes the items take).
pub fn page_with<T>(
    field: &str,
    items: impl IntoIterator<Item = T>,
    size: usize,
    mut write: impl FnMut(&mut String, T),
    next_cursor: Option<&str>,
) -> String {
    let mut out = String::with_capacity(size + field.len() + 80);
    out.push('{');
    push_string(&mut out, field);
    out.push_str(":[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(&mut out, item);
    }
    out.push_str(r#"],"next_cursor":"#);
    match next_cursor {
        Some(c) => push_string(&mut out, c),
        None => out.push_str("null"),
    }
    out.push('}');
    out
}

/// A JSON string, escaped as serde_json escapes it (`"`, `\\` and the
/// control characters below U+0020; nothing else).
///
/// Nearly every string written here (ids, labels, prefixes, times) needs no
/// escaping: they are checked for that with a loop the compiler vectorises
/// and copied as they are. serde_json's writer looks up every byte in a
/// table and was a sixth of the instructions of a page of API keys.
pub fn push_string(out: &mut String, s: &str) {
    let special = s.bytes().fold(0u8, |any, b| any | u8::from(b < 0x20) | u8::from(b == b'"') | u8::from(b == b'\\'));
    if special == 0 {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).expect("a string always encodes"));
    }
}

/// A stored timestamp as a JSON string (see [`wire_time`]).
pub fn push_time(out: &mut String, stored: &str) {
    push_string(out, &wire_time(stored));
}

/// A timestamp as stored (`ids::format_time`: RFC 3339, microseconds, `Z`)
/// as the generated types write it (chrono's serde: as many fractional
/// digits as needed, 0, 3, 6 or 9).
pub fn wire_time(stored: &str) -> Cow<'_, str> {
    let Some(body) = stored.strip_suffix('Z') else { return Cow::Borrowed(stored) };
    let Some((seconds, fraction)) = body.rsplit_once('.') else { return Cow::Borrowed(stored) };
    if fraction.len() != 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Cow::Borrowed(stored);
    }
    if fraction == "000000" {
        Cow::Owned(format!("{seconds}Z"))
    } else if fraction.ends_with("000") {
        Cow::Owned(format!("{seconds}.{}Z", &fraction[..3]))
    } else {
        Cow::Borrowed(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_time_is_chronos_serde_form() {
        for stored in [
            "2026-11-23T10:51:39.123456Z",
            "2026-11-23T10:51:39.123000Z",
            "2026-11-23T10:51:39.000000Z",
            "2026-11-23T10:51:39.000001Z",
            "2026-11-23T10:51:39.100000Z",
        ] {
            let parsed = crate::ids::parse_time(stored).unwrap();
            assert_eq!(crate::ids::format_time(&parsed), stored, "stored form");
            let typed = serde_json::to_string(&parsed).unwrap();
            assert_eq!(typed, format!("\"{}\"", wire_time(stored)), "{stored}");
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut samples: Vec<String> =
            ["", "plain", "key_2Fz9", "ünïcödé ✓", "tab\there", "q\"uote", "back\\slash", "\u{7f}del"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        samples.extend((0u8..0x80).map(|b| format!("a{}b", b as char)));
        for s in samples {
            let mut out = String::new();
            push_string(&mut out, &s);
            assert_eq!(out, serde_json::to_string(&s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn times_and_pages_are_json() {
        let mut t = String::new();
        push_time(&mut t, "2026-11-23T10:51:39.120000Z");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&t).unwrap(),
            serde_json::json!("2026-11-23T10:51:39.120Z")
        );
        let p = page("xs", [r#"{"x":1}"#, "2"], Some("abc"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&p).unwrap(),
            serde_json::json!({"xs": [{"x": 1}, 2], "next_cursor": "abc"})
        );
        let p = page("xs", [], None);
        assert_eq!(p, r#"{"xs":[],"next_cursor":null}"#);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&p).unwrap(),
            serde_json::json!({"xs": [], "next_cursor": null})
        );
    }
}
