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
//! columns ([`Object`]). `tests/written.rs` checks that each says the same
//! JSON value as the typed path.

use std::borrow::Cow;

/// Writes one JSON object a member at a time.
pub struct Object {
    out: Vec<u8>,
    empty: bool,
}

impl Object {
    pub fn with_capacity(capacity: usize) -> Object {
        let mut out = Vec::with_capacity(capacity);
        out.push(b'{');
        Object { out, empty: true }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        push_string(&mut self.out, key);
        self.out.push(b':');
    }

    /// `"key": "value"`, escaped.
    pub fn string(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        push_string(&mut self.out, value);
        self
    }

    /// `"key": value` with `value` already JSON.
    pub fn raw(&mut self, key: &str, json: &str) -> &mut Self {
        self.key(key);
        self.out.extend_from_slice(json.as_bytes());
        self
    }

    /// `"key": "time"`, a stored timestamp (see [`wire_time`]).
    pub fn time(&mut self, key: &str, stored: &str) -> &mut Self {
        self.key(key);
        push_string(&mut self.out, &wire_time(stored));
        self
    }

    pub fn finish(mut self) -> String {
        self.out.push(b'}');
        String::from_utf8(self.out).expect("only UTF-8 is written")
    }
}

/// `{"<field>": [items…], "next_cursor": cursor | null}`: a page of a list,
/// its items already JSON.
pub fn page<'a>(field: &str, items: impl IntoIterator<Item = &'a str>, next_cursor: Option<&str>) -> String {
    let mut list = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push_str(item);
    }
    list.push(']');
    let mut o = Object::with_capacity(list.len() + 80);
    o.raw(field, &list);
    match next_cursor {
        Some(c) => o.string("next_cursor", c),
        None => o.raw("next_cursor", "null"),
    };
    o.finish()
}

/// A JSON string, escaped as serde_json escapes it.
fn push_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing a string to memory cannot fail");
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
    fn objects_and_pages_are_json() {
        let mut o = Object::with_capacity(16);
        o.string("a", "q\"uote\n\u{1}").raw("b", "[1,2]").time("c", "2026-11-23T10:51:39.120000Z");
        let v: serde_json::Value = serde_json::from_str(&o.finish()).unwrap();
        assert_eq!(v, serde_json::json!({"a": "q\"uote\n\u{1}", "b": [1, 2], "c": "2026-11-23T10:51:39.120Z"}));
        let p = page("xs", [r#"{"x":1}"#, "2"], Some("abc"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&p).unwrap(),
            serde_json::json!({"xs": [{"x": 1}, 2], "next_cursor": "abc"})
        );
        let p = page("xs", [], None);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&p).unwrap(),
            serde_json::json!({"xs": [], "next_cursor": null})
        );
    }
}
