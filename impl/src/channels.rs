//! Channels: how the agent under test is reached.
//!
//! The kind decides the target: `http` an http(s) URL (one POST per caller
//! turn), `websocket` a ws(s) URL, `phone` an E.164 number and `sip` a
//! `sip:`/`sips:` URI — the last two through a telephony integration of the
//! same project (`integration_id`, required there and refused for the
//! others). The kind never changes; a changed target must still suit it.
//!
//! `headers` are sent to the agent. Their names are public (`header_names`,
//! lower-case and sorted); their values are write-only: the map is sealed as
//! one JSON object (context `channel:<id>:headers`), never returned, logged
//! or put in activity (which shows the names with masked values).
//!
//! Names are unique within a project (409 `name_taken`). Deleting a channel
//! a test still uses is a 409 `in_use`. Viewers and reviewers read; editors
//! and owners create, change and delete.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, BodyFields, Caller};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::{ids, integrations, validate, AppState};

pub const DEFAULT_TURN_TIMEOUT_MS: i32 = 10_000;
pub const DEFAULT_MAX_CALL_DURATION_S: u32 = 600;
pub const MAX_HEADERS: usize = 50;
const MAX_HEADER_NAME: usize = 100;
const MAX_HEADER_VALUE: usize = 4096;
const MASKED: &str = "***";

/// Headers a channel may not set: the one Sparring sends itself (the call
/// id the agent reports back), and those that belong to the connection
/// rather than the request (RFC 9110 §7.6.1 hop-by-hop, plus framing).
const RESERVED_HEADERS: &[&str] = &[
    "x-sparring-call-id",
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

pub(crate) fn headers_context(channel_id: &str) -> String {
    format!("channel:{channel_id}:headers")
}

/// Whether a channel of this kind calls through a telephony integration.
fn needs_integration(kind: types::ChannelKind) -> bool {
    matches!(kind, types::ChannelKind::Phone | types::ChannelKind::Sip)
}

/// The target, checked against the kind.
fn check_target(kind: types::ChannelKind, target: &str) -> Result<String> {
    match kind {
        types::ChannelKind::Http => validate::url("target", target, &["http", "https"]),
        types::ChannelKind::Websocket => validate::url("target", target, &["ws", "wss"]),
        types::ChannelKind::Phone => validate::e164("target", target),
        types::ChannelKind::Sip => sip_uri("target", target),
    }
}

/// A SIP URI (RFC 3261 §19.1): `sip:` or `sips:`, an optional user part
/// without a password, a host (name, IPv4 or `[IPv6]`), an optional port,
/// then any `;parameters` and `?headers`.
fn sip_uri(field: &str, value: &str) -> Result<String> {
    let rest = ["sips:", "sip:"]
        .iter()
        .find_map(|scheme| {
            let head = value.get(..scheme.len())?;
            head.eq_ignore_ascii_case(scheme).then(|| &value[scheme.len()..])
        })
        .ok_or_else(|| Failure::invalid(field, "must be a `sip:` or `sips:` URI"))?;
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Failure::invalid(field, "must not contain spaces or control characters"));
    }
    let address = rest.split([';', '?']).next().unwrap_or("");
    let host_port = match address.rsplit_once('@') {
        Some(("", _)) => return Err(Failure::invalid(field, "has an empty user part")),
        Some((user, _)) if user.contains(':') => {
            return Err(Failure::invalid(field, "must not carry a password; use headers or credentials instead"))
        }
        Some((_, host_port)) => host_port,
        None => address,
    };
    let port = if let Some(v6) = host_port.strip_prefix('[') {
        let (ip, after) = v6.split_once(']').ok_or_else(|| Failure::invalid(field, "has an unclosed `[`"))?;
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(Failure::invalid(field, format_args!("`[{ip}]` is not an IPv6 address")));
        }
        match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| Failure::invalid(field, "has a bad port"))?),
        }
    } else {
        let (host, port) = match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        };
        let host_ok = !host.is_empty()
            && !host.starts_with(['.', '-'])
            && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !host_ok {
            return Err(Failure::invalid(field, "must have a host, like `sip:agent@sip.example.com`"));
        }
        port
    };
    if let Some(port) = port {
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
            return Err(Failure::invalid(field, "has a bad port"));
        }
    }
    Ok(value.to_string())
}

/// Header names (lower-cased, so sorted and unique case-insensitively) to
/// values. Error messages name the header, never its value. (A value
/// over [`MAX_HEADER_VALUE`] or with a character a header may not hold is
/// refused as the body is read, by the spec's `maxLength` and `pattern`;
/// both are checked here again, so that the bound holds should the spec's
/// lose them.)
fn parse_headers<V>(given: &HashMap<String, V>) -> Result<BTreeMap<String, String>>
where
    V: std::ops::Deref<Target: AsRef<str>>,
{
    if given.len() > MAX_HEADERS {
        return Err(Failure::invalid("headers", format_args!("at most {MAX_HEADERS} headers, got {}", given.len())));
    }
    let sorted: BTreeMap<&String, &str> = given.iter().map(|(name, value)| (name, (**value).as_ref())).collect();
    let mut out = BTreeMap::new();
    for (name, value) in sorted {
        if name.len() > MAX_HEADER_NAME {
            let start: String = name.chars().take(20).collect();
            return Err(Failure::invalid(
                "headers",
                format_args!("the name `{start}…` is longer than {MAX_HEADER_NAME} characters"),
            ));
        }
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Failure::invalid("headers", format_args!("{name:?} is not a valid HTTP header name")))?;
        let lower = header.as_str().to_string();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(Failure::invalid(
                "headers",
                format_args!("`{lower}` is set by Sparring or by the connection; a channel may not set it"),
            ));
        }
        if value.len() > MAX_HEADER_VALUE {
            return Err(Failure::invalid(
                "headers",
                format_args!("the value of `{lower}` is longer than {MAX_HEADER_VALUE} bytes"),
            ));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(Failure::invalid(
                "headers",
                format_args!("the value of `{lower}` is not a valid header value (visible ASCII, spaces and tabs)"),
            ));
        }
        if out.insert(lower.clone(), value.to_string()).is_some() {
            return Err(Failure::invalid(
                "headers",
                format_args!("`{lower}` is given twice (header names are case-insensitive)"),
            ));
        }
    }
    Ok(out)
}

/// Headers as stored: the sorted names (JSON) and the sealed map (none when
/// empty).
struct SealedHeaders {
    names: Vec<String>,
    sealed: Option<Vec<u8>>,
}

impl SealedHeaders {
    fn seal(state: &AppState, channel_id: &str, headers: &BTreeMap<String, String>) -> Result<SealedHeaders> {
        let sealed = if headers.is_empty() {
            None
        } else {
            let plain = serde_json::to_vec(headers).map_err(|e| Failure::invalid("headers", e))?;
            Some(state.secrets.seal(&plain, &headers_context(channel_id)))
        };
        Ok(SealedHeaders { names: headers.keys().cloned().collect(), sealed })
    }

    fn names_json(&self) -> String {
        json!(self.names).to_string()
    }

    /// As activity shows them: the names, every value masked; null for none.
    fn masked(&self) -> Value {
        if self.names.is_empty() {
            return Value::Null;
        }
        self.names.iter().map(|n| (n.clone(), json!(MASKED))).collect::<Map<_, _>>().into()
    }
}

/// `integration_id` against the kind: required (a telephony integration of
/// the project) for `phone` and `sip`, refused otherwise.
fn check_integration(
    tx: &rusqlite::Transaction<'_>,
    kind: types::ChannelKind,
    integration_id: Option<&str>,
    project_id: &str,
) -> Result<()> {
    match (needs_integration(kind), integration_id) {
        (false, None) => Ok(()),
        (false, Some(_)) => {
            Err(Failure::invalid("integration_id", format_args!("{kind} channels use no integration; leave it out")))
        }
        (true, None) => Err(Failure::invalid(
            "integration_id",
            format_args!("is required for {kind} channels: a telephony integration (twilio, telnyx or vonage)"),
        )),
        (true, Some(id)) => {
            access::require_reference(tx, "integrations", "integration_id", id, project_id)?;
            match integrations::provider_of(tx, id)? {
                Some(provider) if integrations::is_telephony(provider) => Ok(()),
                Some(provider) => Err(Failure::invalid(
                    "integration_id",
                    format_args!(
                        "`{id}` is a {provider} integration; {kind} channels need a telephony integration \
                         (twilio, telnyx or vonage)"
                    ),
                )),
                None => {
                    Err(Failure::invalid("integration_id", format_args!("`{id}` is not a resource of this project")))
                }
            }
        }
    }
}

/// 409 `name_taken` if another channel of the project has this name.
fn check_name_free(tx: &rusqlite::Transaction<'_>, project_id: &str, name: &str, except: &str) -> Result<()> {
    access::check_name_free(tx, "channels", "a channel", project_id, name, except)
}

// Reading.

const COLUMNS: &str = "c.id, c.project_id, c.name, c.kind, c.target, c.integration_id, c.header_names, \
                       c.turn_timeout_ms, c.max_call_duration_s, c.created_at, c.updated_at";

fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Channel> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let kind: String = row.get(3)?;
    let names: String = row.get(6)?;
    let duration: u32 = row.get(8)?;
    Ok(types::Channel {
        id: row.get(0)?,
        project_id: row.get(1)?,
        name: row.get(2)?,
        kind: kind.parse().map_err(|e| conversion(3, e))?,
        target: row.get(4)?,
        integration_id: row.get(5)?,
        header_names: serde_json::from_str(&names).map_err(|e| conversion(6, e))?,
        turn_timeout_ms: row.get(7)?,
        max_call_duration_s: std::num::NonZeroU32::new(duration).ok_or_else(|| conversion(8, "zero"))?,
        created_at: time(9)?,
        updated_at: time(10)?,
    })
}

pub(crate) fn load(tx: &rusqlite::Connection, id: &str) -> Result<types::Channel> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM channels c WHERE c.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("channel", id))
}

/// The ids of a page of one project's channels (`?1`), newest first, of
/// the kind `?2` (all when NULL), after the cursor `?3`, at most `?4` (see
/// [`PageSql`]): in order from `channels_by_project`, no sort, and the walk
/// stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT c.id FROM channels c WHERE c.project_id = ?1 AND (?2 IS NULL OR c.kind = ?2) {AFTER}
             ORDER BY c.id DESC LIMIT ?4"
        ),
        "AND c.id < ?3",
    )
});

pub async fn list(state: &AppState, caller: Caller, query: p::ListChannelsQuery) -> Result<types::ChannelList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "chn").map_err(|e| Failure::invalid("cursor", e))?;
    let kind = query.kind.map(|k| k.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![kind, page.after, page.fetch_limit()],
            )?;
            let page = page.finish(ids, String::clone);
            let channels = page.items.iter().map(|id| load(tx, id)).collect::<Result<Vec<_>>>()?;
            Ok(types::ChannelList { channels, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreateChannelRequest) -> Result<types::Channel> {
    let kind = body.kind;
    let name = validate::name("name", &body.name)?;
    let target = check_target(kind, &body.target)?;
    crate::engine::outbound::check_given(state.engine.allows_private_targets(), "target", &target)?;
    let headers = parse_headers(&body.headers)?;
    let turn_timeout_ms = validate::range("turn_timeout_ms", body.turn_timeout_ms, 100, 120_000)?;
    let max_call_duration_s = validate::range("max_call_duration_s", body.max_call_duration_s.get(), 1, 3600)?;
    let id = ids::new_id("chn");
    let headers = SealedHeaders::seal(state, &id, &headers)?;
    let integration_id = body.integration_id;
    let project_id = body.project_id;
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &project_id, Need::Edit)?;
            check_integration(tx, kind, integration_id.as_deref(), &project_id)?;
            check_name_free(tx, &project_id, &name, &id)?;
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO channels (id, project_id, name, kind, target, integration_id, header_names, headers,
                                       turn_timeout_ms, max_call_duration_s, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)",
                params![
                    id,
                    project_id,
                    name,
                    kind.to_string(),
                    target,
                    integration_id,
                    headers.names_json(),
                    headers.sealed,
                    turn_timeout_ms,
                    max_call_duration_s,
                    now
                ],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "channel.create",
                    resource_type: "channel",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary: format!("created {kind} channel \"{name}\""),
                    changes: json!({
                        "name": name,
                        "kind": kind.to_string(),
                        "target": target,
                        "integration_id": integration_id,
                        "headers": headers.masked(),
                        "turn_timeout_ms": turn_timeout_ms,
                        "max_call_duration_s": max_call_duration_s,
                    })
                    .into(),
                },
            )?;
            load(tx, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetChannelPath) -> Result<types::Channel> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "channels", "channel", &path.id, Need::Read)?;
            load(tx, &path.id)
        })
        .await
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteChannelPath) -> Result<types::Deleted> {
    const SHOWN: usize = 10;
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "channels", "channel", &path.id, Need::Edit)?;
            let mut using: Vec<String> = tx
                .prepare_cached("SELECT id, name FROM tests WHERE channel_id = ?1 ORDER BY id LIMIT ?2")?
                .query_map(params![path.id, SHOWN as i64 + 1], |r| {
                    Ok(format!("test {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            if !using.is_empty() {
                if using.len() > SHOWN {
                    using.truncate(SHOWN);
                    using.push("others".into());
                }
                return Err(Failure::in_use("channel", &path.id, &using));
            }
            crate::runs::refuse_if_runs_bound(tx, &project_id, "channel", crate::runs::BoundTo::Channel(&path.id))?;
            let name: String =
                tx.query_row("SELECT name FROM channels WHERE id = ?1", params![path.id], |r| r.get(0))?;
            tx.execute("DELETE FROM channels WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "channel.delete",
                    resource_type: "channel",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted channel \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

/// `PATCH`: absent fields are unchanged; `integration_id: null` removes the
/// integration (refused where the kind needs one), `headers: null` (or `{}`)
/// removes every header, an object replaces them all. The kind cannot be
/// changed. Only what differs is written and recorded; a body that changes
/// nothing writes nothing.
pub async fn update(
    state: &AppState,
    caller: Caller,
    path: p::UpdateChannelPath,
    body: types::UpdateChannelRequest,
    fields: BodyFields,
) -> Result<types::Channel> {
    for field in ["name", "target", "turn_timeout_ms", "max_call_duration_s"] {
        if fields.is_null(field) {
            return Err(Failure::invalid(field, "must not be null; leave it out to keep it"));
        }
    }
    let name = body.name.as_ref().map(|n| validate::name("name", n)).transpose()?;
    let target = body.target.map(String::from);
    let integration_id = fields.has("integration_id").then_some(body.integration_id);
    let headers = if fields.has("headers") {
        let parsed = parse_headers(&body.headers.unwrap_or_default())?;
        Some(SealedHeaders::seal(state, &path.id, &parsed)?)
    } else {
        None
    };
    let turn_timeout_ms =
        body.turn_timeout_ms.map(|t| validate::range("turn_timeout_ms", t, 100, 120_000)).transpose()?;
    let max_call_duration_s =
        body.max_call_duration_s.map(|d| validate::range("max_call_duration_s", d.get(), 1, 3600)).transpose()?;
    let allow_private = state.engine.allows_private_targets();
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "channels", "channel", &path.id, Need::Edit)?;
            let before = load(tx, &path.id)?;
            let target = target.map(|t| check_target(before.kind, &t)).transpose()?;
            if let Some(t) = target.as_ref().filter(|t| **t != before.target) {
                crate::engine::outbound::check_given(allow_private, "target", t)?;
            }
            if let Some(t) = &target {
                if headers.is_none()
                    && !before.header_names.is_empty()
                    && !validate::same_destination(&before.target, t)
                {
                    return Err(Failure::invalid(
                        "headers",
                        format_args!(
                            "the target moves from `{}` to `{t}`, another origin: give `headers` again (or `null` for \
                             none), since stored header values only go where they were set",
                            before.target
                        ),
                    ));
                }
            }
            if let Some(integration_id) = &integration_id {
                check_integration(tx, before.kind, integration_id.as_deref(), &project_id)?;
            }
            // Only what differs from the stored channel is written and
            // recorded; header values are write-only, so given ones count
            // as a change unless there are none either side.
            let name = name.filter(|n| *n != before.name);
            let target = target.filter(|t| *t != before.target);
            let integration_id = integration_id.filter(|i| *i != before.integration_id);
            let headers = headers.filter(|h| h.sealed.is_some() || !before.header_names.is_empty());
            let turn_timeout_ms = turn_timeout_ms.filter(|t| *t != before.turn_timeout_ms);
            let max_call_duration_s = max_call_duration_s.filter(|d| *d != before.max_call_duration_s.get());
            let mut changes = Map::new();
            if let Some(name) = &name {
                check_name_free(tx, &project_id, name, &path.id)?;
                tx.execute("UPDATE channels SET name = ?2 WHERE id = ?1", params![path.id, name])?;
                changes.insert("name".into(), json!(name));
            }
            if let Some(target) = &target {
                tx.execute("UPDATE channels SET target = ?2 WHERE id = ?1", params![path.id, target])?;
                changes.insert("target".into(), json!(target));
            }
            if let Some(integration_id) = &integration_id {
                tx.execute("UPDATE channels SET integration_id = ?2 WHERE id = ?1", params![path.id, integration_id])?;
                changes.insert("integration_id".into(), json!(integration_id));
            }
            if let Some(headers) = &headers {
                tx.execute(
                    "UPDATE channels SET header_names = ?2, headers = ?3 WHERE id = ?1",
                    params![path.id, headers.names_json(), headers.sealed],
                )?;
                changes.insert("headers".into(), headers.masked());
            }
            if let Some(t) = turn_timeout_ms {
                tx.execute("UPDATE channels SET turn_timeout_ms = ?2 WHERE id = ?1", params![path.id, t])?;
                changes.insert("turn_timeout_ms".into(), json!(t));
            }
            if let Some(d) = max_call_duration_s {
                tx.execute("UPDATE channels SET max_call_duration_s = ?2 WHERE id = ?1", params![path.id, d])?;
                changes.insert("max_call_duration_s".into(), json!(d));
            }
            if changes.is_empty() {
                return Ok(before);
            }
            tx.execute(
                "UPDATE channels SET updated_at = ?2 WHERE id = ?1",
                params![path.id, ids::format_time(&ids::now())],
            )?;
            let shown_name = name.as_deref().unwrap_or(&before.name);
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "channel.update",
                    resource_type: "channel",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!(
                        "updated channel \"{shown_name}\" ({})",
                        changes.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                    ),
                    changes: Value::Object(changes).into(),
                },
            )?;
            load(tx, &path.id)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use types::ChannelKind as K;

    #[test]
    fn targets_suit_the_kind() {
        assert!(check_target(K::Http, "https://agent.example.com/turn").is_ok());
        assert!(check_target(K::Http, "wss://agent.example.com/ws").is_err());
        assert!(check_target(K::Websocket, "wss://agent.example.com/ws").is_ok());
        assert!(check_target(K::Websocket, "https://agent.example.com").is_err());
        assert!(check_target(K::Phone, "+14155550123").is_ok());
        assert!(check_target(K::Phone, "https://x.example").is_err());
        for ok in [
            "sip:agent@sip.example.com",
            "sips:agent@sip.example.com:5061;transport=tls",
            "sip:sip.example.com",
            "SIP:+14155550123@10.0.0.1",
            "sip:agent@[2001:db8::1]:5060",
        ] {
            assert!(check_target(K::Sip, ok).is_ok(), "{ok}");
        }
        for bad in [
            "sip:",
            "sip:agent@",
            "sip:@host",
            "sip:agent:pw@host.example",
            "sip:agent@host.example:port",
            "sip:agent@ho st",
            "tel:+14155550123",
            "https://sip.example.com",
            "sip:agent@[nope]",
        ] {
            assert!(check_target(K::Sip, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_are_named_validly_and_not_reserved() {
        let h = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let parsed = parse_headers(&h(&[("X-Api-Key", "k"), ("authorization", "Bearer t")])).unwrap();
        assert_eq!(parsed.keys().collect::<Vec<_>>(), ["authorization", "x-api-key"]);
        for bad in [
            h(&[("bad name", "v")]),
            h(&[("", "v")]),
            h(&[("Host", "v")]),
            h(&[("X-Sparring-Call-Id", "v")]),
            h(&[("transfer-encoding", "v")]),
            h(&[("x-a", "line\nbreak")]),
            h(&[("X-A", "1"), ("x-a", "2")]),
        ] {
            assert!(parse_headers(&bad).is_err(), "{bad:?}");
        }
        let secret = "s3cr3t-value\u{7}";
        match parse_headers(&h(&[("x-a", secret)])) {
            Err(Failure::Invalid { code, message }) => {
                assert_eq!(code, "invalid_headers");
                assert!(!message.contains("s3cr3t"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let many: HashMap<String, String> = (0..=MAX_HEADERS).map(|i| (format!("x-h{i}"), "v".into())).collect();
        assert!(parse_headers(&many).is_err());
    }
}
