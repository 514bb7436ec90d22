//! Parsing of input fields shared by several resources. Each function takes
//! the field's name (as the client wrote it, e.g. `steps[2].say`) so that a
//! failure is a 400 `invalid_<field>` whose message names it.

use std::fmt::Display;

use crate::failure::{Failure, Result};

pub const MAX_NAME: usize = 100;
pub const MAX_DESCRIPTION: usize = 2000;
pub const MAX_PROMPT: usize = 20_000;
pub const MAX_TAGS: usize = 50;
pub const MAX_TAG: usize = 100;
/// A tool's name (`tool_called`).
pub const MAX_TOOL: usize = 200;
/// Free-form JSON objects (an integration's `config` and `credentials`, a
/// `tool_called` evaluator's `arguments`): at most this many bytes once
/// written as JSON…
pub const MAX_FREE_FORM_BYTES: usize = 16 * 1024;
/// …and nested at most this deep (the object itself is level 1). What the
/// request held at depth 120 would be deeper than the 128 levels JSON
/// readers (serde_json's included) accept once wrapped in a page of a list,
/// an activity record or a webhook.
pub const MAX_FREE_FORM_DEPTH: usize = 16;

/// A name: 1 to 100 characters, not blank, no control characters.
///
/// Here and below, `field` is anything that displays as the field's name
/// (`format_args!("{list}[{i}].name")`): it is written only for a failure.
pub fn name(field: impl Display, value: &str) -> Result<String> {
    check_name(field, value)?;
    Ok(value.to_string())
}

/// [`name`], without a copy of the value.
pub fn check_name(field: impl Display, value: &str) -> Result<()> {
    let n = value.chars().count();
    if value.trim().is_empty() {
        return Err(Failure::invalid(&field.to_string(), "must not be empty or blank"));
    }
    if n > MAX_NAME {
        return Err(Failure::invalid(
            &field.to_string(),
            format_args!("must be at most {MAX_NAME} characters, got {n}"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Failure::invalid(&field.to_string(), "must not contain control characters"));
    }
    Ok(())
}

/// Free text up to `max` characters; line breaks and tabs allowed, other
/// control characters not.
pub fn text(field: impl Display, value: &str, max: usize) -> Result<String> {
    check_text(field, value, max)?;
    Ok(value.to_string())
}

/// [`text`], without a copy of the value.
pub fn check_text(field: impl Display, value: &str, max: usize) -> Result<()> {
    let n = value.chars().count();
    if n > max {
        return Err(Failure::invalid(&field.to_string(), format_args!("must be at most {max} characters, got {n}")));
    }
    if value.chars().any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r') {
        return Err(Failure::invalid(
            &field.to_string(),
            "must not contain control characters other than line breaks and tabs",
        ));
    }
    Ok(())
}

/// Non-empty free text up to `max` characters.
pub fn required_text(field: impl Display, value: &str, max: usize) -> Result<String> {
    check_required_text(field, value, max)?;
    Ok(value.to_string())
}

/// [`required_text`], without a copy of the value.
pub fn check_required_text(field: impl Display, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Failure::invalid(&field.to_string(), "must not be empty or blank"));
    }
    check_text(field, value, max)
}

/// An E.164 phone number: `+`, then 2 to 15 digits, the first not 0.
pub fn e164(field: &str, value: &str) -> Result<String> {
    let digits = value.strip_prefix('+').unwrap_or("");
    let ok = (2..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0');
    if !ok {
        return Err(Failure::invalid(field, format_args!("`{value}` is not an E.164 number (like +14155550123)")));
    }
    Ok(value.to_string())
}

/// An absolute URL with one of `schemes` and a host.
pub fn url(field: &str, value: &str, schemes: &[&str]) -> Result<String> {
    let parsed =
        url::Url::parse(value).map_err(|e| Failure::invalid(field, format_args!("`{value}` is not a URL ({e})")))?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(Failure::invalid(
            field,
            format_args!("must be a {} URL, got `{}`", schemes.join(" or "), parsed.scheme()),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Failure::invalid(field, "must have a host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Failure::invalid(field, "must not carry credentials; use headers or credentials instead"));
    }
    Ok(value.to_string())
}

/// Whether a secret given to be sent to `before` may go to `after` without
/// being given again: the same origin (scheme, host and port) for URLs, the
/// same value for anything else (a phone number, a SIP URI). Secrets are
/// write-only, so a member who can change where they go but not read them
/// must not be able to send them somewhere else.
pub fn same_destination(before: &str, after: &str) -> bool {
    match (url::Url::parse(before), url::Url::parse(after)) {
        (Ok(a), Ok(b)) if a.has_host() && b.has_host() => a.origin() == b.origin(),
        _ => before == after,
    }
}

/// A BCP-47 language tag (`en`, `en-US`, `pt-BR`, `zh-Hant-TW`).
pub fn language(field: &str, value: &str) -> Result<String> {
    let tag = language_tags::LanguageTag::parse(value)
        .map_err(|e| Failure::invalid(field, format_args!("`{value}` is not a BCP-47 language tag ({e})")))?;
    tag.validate()
        .map_err(|e| Failure::invalid(field, format_args!("`{value}` is not a valid BCP-47 language tag ({e})")))?;
    Ok(value.to_string())
}

/// Tags: at most 50, each 1 to 50 characters without control characters;
/// duplicates removed, order kept.
pub fn tags(field: &str, values: &[String]) -> Result<Vec<String>> {
    if values.len() > MAX_TAGS {
        return Err(Failure::invalid(field, format_args!("at most {MAX_TAGS} tags, got {}", values.len())));
    }
    let mut out: Vec<String> = Vec::with_capacity(values.len());
    for (i, t) in values.iter().enumerate() {
        let n = t.chars().count();
        if t.trim().is_empty() || n > MAX_TAG || t.chars().any(char::is_control) {
            return Err(Failure::invalid(
                &format!("{field}[{i}]"),
                format_args!("a tag is 1 to {MAX_TAG} characters without control characters"),
            ));
        }
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    Ok(out)
}

/// A free-form JSON object: at most [`MAX_FREE_FORM_BYTES`] as JSON and
/// [`MAX_FREE_FORM_DEPTH`] levels deep.
pub fn free_form(field: impl Display, value: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
    fn depth(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    let deepest = 1 + value.values().map(depth).max().unwrap_or(0);
    if deepest > MAX_FREE_FORM_DEPTH {
        return Err(Failure::invalid(
            &field.to_string(),
            format_args!("must be nested at most {MAX_FREE_FORM_DEPTH} levels deep, got {deepest}"),
        ));
    }
    let size = serde_json::to_string(value).map(|s| s.len()).unwrap_or(usize::MAX);
    if size > MAX_FREE_FORM_BYTES {
        return Err(Failure::invalid(
            &field.to_string(),
            format_args!("must be at most {MAX_FREE_FORM_BYTES} bytes of JSON, got {size}"),
        ));
    }
    Ok(())
}

/// An integer within `min..=max`.
pub fn range<T: PartialOrd + Display + Copy>(field: impl Display, value: T, min: T, max: T) -> Result<T> {
    if value < min || value > max {
        return Err(Failure::invalid(&field.to_string(), format_args!("must be from {min} to {max}, got {value}")));
    }
    Ok(value)
}

/// The largest compiled `regex` evaluator: 256 KiB. Compiling one that
/// size takes milliseconds, when the pattern is saved and in every run;
/// `\d{3}-\d{4}`, `(?i)\bhello\b.*\bworld\b` or `.{100}` are far below,
/// `\w{10}` (Unicode word characters) is over.
pub const MAX_REGEX_BYTES: usize = 256 * 1024;

/// A regular expression that compiles within [`MAX_REGEX_BYTES`] (so a bad
/// one is a 400 now, not a failure when a test runs). Its length is the
/// wire type's to check (at most 2000 characters).
pub fn regex(field: impl Display, pattern: &str) -> Result<String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_REGEX_BYTES)
        .build()
        .map_err(|e| Failure::invalid(&field.to_string(), format_args!("is not a valid regular expression: {e}")))?;
    Ok(pattern.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<String>) -> String {
        match r {
            Err(Failure::Invalid { code, message }) => format!("{code}: {message}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn fields_are_named_in_codes_and_messages() {
        assert_eq!(code(name("name", " ")), "invalid_name: name: must not be empty or blank");
        assert!(code(e164("phone_numbers[1].number", "555")).starts_with("invalid_number: phone_numbers[1].number:"));
        assert!(code(text("steps[3]", &"x".repeat(11), 10)).starts_with("invalid_steps: steps[3]:"));
    }

    #[test]
    fn e164_numbers() {
        assert!(e164("n", "+14155550123").is_ok());
        for bad in ["14155550123", "+0123", "+1", "+1234567890123456", "+1-415-555", ""] {
            assert!(e164("n", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls() {
        assert!(url("u", "https://agent.example.com/turn", &["http", "https"]).is_ok());
        assert!(url("u", "wss://agent.example.com/ws", &["ws", "wss"]).is_ok());
        assert!(url("u", "ftp://x", &["http", "https"]).is_err());
        assert!(url("u", "https://user:pw@x.example", &["https"]).is_err());
        assert!(url("u", "not a url", &["https"]).is_err());
    }

    #[test]
    fn languages() {
        for ok in ["en", "en-US", "pt-BR", "zh-Hant-TW", "es-419"] {
            assert!(language("language", ok).is_ok(), "{ok}");
        }
        for bad in ["", "english", "en_US", "e"] {
            assert!(language("language", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn free_form_objects() {
        let nested = |levels: usize| {
            let mut v = serde_json::json!(1);
            for _ in 0..levels {
                v = serde_json::json!({ "a": v });
            }
            v.as_object().unwrap().clone()
        };
        assert!(free_form("config", &nested(MAX_FREE_FORM_DEPTH)).is_ok());
        assert!(code(free_form("config", &nested(MAX_FREE_FORM_DEPTH + 1)).map(|_| String::new()))
            .starts_with("invalid_config: config: must be nested at most"));
        let mut big = serde_json::Map::new();
        big.insert("k".into(), "x".repeat(MAX_FREE_FORM_BYTES).into());
        assert!(code(free_form("arguments", &big).map(|_| String::new())).starts_with("invalid_arguments:"));
    }

    #[test]
    fn regexes() {
        assert!(regex("pattern", r"^book(ed|ing)\s+\d+").is_ok());
        assert!(regex("pattern", "(unclosed").is_err());
        assert!(regex("pattern", ".{100}").is_ok());
        assert!(code(regex("pattern", r"\w{10}")).contains("exceeds size limit"));
    }
}
