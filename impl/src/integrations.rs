//! Integrations: connections to an external provider — an OpenAI-compatible
//! LLM endpoint (the simulated caller and `llm_judge` evaluators) or a
//! telephony account (`twilio`, `telnyx`, `vonage`; what `phone` and `sip`
//! channels call through).
//!
//! - `config` is non-secret and shown as stored. What it must hold depends
//!   on the provider ([`check_config`]); keys that look like secrets are
//!   refused there, so a secret sent in the wrong field is not stored in
//!   the clear.
//! - `credentials` are write-only: one JSON object sealed with the server's
//!   key (context `integration:<id>:credentials`), never returned, logged or
//!   put in activity. The read side shows `credentials_configured`; activity
//!   shows the credentials' keys with every value masked. An empty object is
//!   the same as none.
//! - Phone numbers belong to telephony integrations only, in the order
//!   given (`integration_phone_numbers.position`).
//! - Names are unique within a project (409 `name_taken`). Deleting an
//!   integration a channel or an `llm_judge` still uses is a 409 `in_use`.
//!
//! Viewers and reviewers read; editors and owners create, change and delete.

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, BodyFields, Caller};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::{ids, validate, AppState};

pub const MAX_PHONE_NUMBERS: usize = 100;
const MAX_PHONE_LABEL: usize = 100;
const MAX_MODEL: usize = 200;
const MAX_ACCOUNT_SID: usize = 100;
const MASKED: &str = "***";

/// `config` keys refused as secrets (compared case-insensitively): they
/// belong in `credentials`.
const SECRET_LOOKING_KEYS: &[&str] = &[
    "api_key",
    "apikey",
    "api_secret",
    "auth_token",
    "access_token",
    "token",
    "secret",
    "client_secret",
    "password",
    "private_key",
];

/// Whether `provider` places calls (and so may have phone numbers and serve
/// `phone` and `sip` channels).
pub fn is_telephony(provider: types::IntegrationProvider) -> bool {
    !matches!(provider, types::IntegrationProvider::OpenaiCompatible)
}

pub(crate) fn credentials_context(integration_id: &str) -> String {
    format!("integration:{integration_id}:credentials")
}

/// What each provider's `config` must hold:
/// - `openai_compatible`: `base_url` (an http or https URL with no query or
///   fragment: `/chat/completions` is appended to it), `model` (a non-empty
///   string) and, if given, `temperature` (a number from 0 to 2); other keys
///   are kept as given.
/// - `twilio`: `account_sid` (a non-empty string).
/// - `telnyx`, `vonage`: any object; what a call needs there (connection or
///   application ids) depends on the account's setup and is the provider's
///   to check when a call is placed.
///
/// For every provider, no key may look like a secret.
fn check_config(provider: types::IntegrationProvider, config: &Map<String, Value>) -> Result<()> {
    check_config_shape(config)?;
    let string = |key: &str| -> Result<&str> {
        let field = format!("config.{key}");
        match config.get(key) {
            None | Some(Value::Null) => {
                Err(Failure::invalid(&field, format_args!("is required for {provider} integrations")))
            }
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(Failure::invalid(&field, "must be a string")),
        }
    };
    match provider {
        types::IntegrationProvider::OpenaiCompatible => {
            let base_url = validate::url("config.base_url", string("base_url")?, &["http", "https"])?;
            if url::Url::parse(&base_url).is_ok_and(|u| u.query().is_some() || u.fragment().is_some()) {
                return Err(Failure::invalid(
                    "config.base_url",
                    "must have no query or fragment: requests go to the base URL followed by `/chat/completions`",
                ));
            }
            validate::required_text("config.model", string("model")?, MAX_MODEL)?;
            // Read as a number when a request is made: anything else was
            // dropped there without a word.
            match config.get("temperature") {
                None | Some(Value::Null) => {}
                Some(t) if t.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t)) => {}
                Some(_) => return Err(Failure::invalid("config.temperature", "must be a number from 0 to 2")),
            }
        }
        types::IntegrationProvider::Twilio => {
            validate::required_text("config.account_sid", string("account_sid")?, MAX_ACCOUNT_SID)?;
        }
        types::IntegrationProvider::Telnyx | types::IntegrationProvider::Vonage => {}
    }
    Ok(())
}

/// An LLM endpoint this server will call (see `engine::outbound`), given
/// with a new integration.
fn check_base_url(state: &AppState, config: &Map<String, Value>) -> Result<()> {
    match config.get("base_url").and_then(Value::as_str) {
        Some(url) => {
            crate::engine::outbound::check_given(state.engine.allows_private_targets(), "config.base_url", url)
        }
        None => Ok(()),
    }
}

/// What any provider's `config` must be: small and shallow
/// ([`validate::free_form`]), with no key that looks like a secret, at any
/// depth (a secret nested in an object of the config is shown as plainly).
fn check_config_shape(config: &Map<String, Value>) -> Result<()> {
    validate::free_form("config", config)?;
    if let Some(key) = secret_looking_key(config) {
        return Err(Failure::invalid(
            "config",
            format_args!(
                "`{key}` looks like a secret; send it in `credentials`, which are stored encrypted and never shown"
            ),
        ));
    }
    Ok(())
}

/// The first key of `object`, or of an object anywhere inside it, that is
/// one of [`SECRET_LOOKING_KEYS`]; as deep as the object is nested, which
/// [`validate::free_form`] bounds.
fn secret_looking_key(object: &Map<String, Value>) -> Option<&str> {
    fn inside(value: &Value) -> Option<&str> {
        match value {
            Value::Object(object) => secret_looking_key(object),
            Value::Array(items) => items.iter().find_map(inside),
            _ => None,
        }
    }
    object.iter().find_map(|(key, value)| {
        let secret = SECRET_LOOKING_KEYS.iter().any(|s| s.eq_ignore_ascii_case(key));
        if secret {
            Some(key.as_str())
        } else {
            inside(value)
        }
    })
}

/// A phone number, checked.
#[derive(Clone, Debug)]
struct Number {
    number: String,
    label: String,
    direction: types::PhoneDirection,
}

/// Numbers as E.164, labels as text, at most [`MAX_PHONE_NUMBERS`], none
/// twice.
fn parse_numbers(list: &[types::PhoneNumber]) -> Result<Vec<Number>> {
    if list.len() > MAX_PHONE_NUMBERS {
        return Err(Failure::invalid(
            "phone_numbers",
            format_args!("at most {MAX_PHONE_NUMBERS} numbers, got {}", list.len()),
        ));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, p) in list.iter().enumerate() {
        let number = validate::e164(&format!("phone_numbers[{i}].number"), &p.number)?;
        let label = validate::text(format_args!("phone_numbers[{i}].label"), &p.label, MAX_PHONE_LABEL)?;
        if let Some(first) = seen.insert(p.number.as_str(), i) {
            return Err(Failure::invalid(
                "phone_numbers",
                format_args!("`{number}` is listed twice (at {first} and {i})"),
            ));
        }
        out.push(Number { number, label, direction: p.direction });
    }
    Ok(out)
}

fn check_numbers_allowed(provider: types::IntegrationProvider, numbers: &[Number]) -> Result<()> {
    if !numbers.is_empty() && !is_telephony(provider) {
        return Err(Failure::invalid(
            "phone_numbers",
            format_args!("only telephony integrations (twilio, telnyx, vonage) have phone numbers, not {provider}"),
        ));
    }
    Ok(())
}

fn numbers_changes(numbers: &[Number]) -> Value {
    numbers
        .iter()
        .map(|n| json!({"number": n.number, "label": n.label, "direction": n.direction.to_string()}))
        .collect()
}

/// Credentials as activity shows them: their keys, every value masked.
fn masked(credentials: Option<&Map<String, Value>>) -> Value {
    match credentials {
        None => Value::Null,
        Some(c) => c.keys().map(|k| (k.clone(), json!(MASKED))).collect::<Map<_, _>>().into(),
    }
}

/// Seals non-empty credentials; empty ones are none.
fn seal_credentials(state: &AppState, id: &str, credentials: &Map<String, Value>) -> Result<Option<Vec<u8>>> {
    if credentials.is_empty() {
        return Ok(None);
    }
    validate::free_form("credentials", credentials)?;
    // Sent as a bearer token, so read as a string: anything else was
    // dropped there without a word, and the provider asked with no key.
    match credentials.get("api_key") {
        None => {}
        Some(Value::String(key)) if !key.trim().is_empty() => {}
        Some(_) => return Err(Failure::invalid("credentials.api_key", "must be a non-empty string")),
    }
    let plain = serde_json::to_vec(credentials).map_err(|e| Failure::invalid("credentials", e))?;
    Ok(Some(state.secrets.seal(&plain, &credentials_context(id))))
}

// Reading.

const COLUMNS: &str = "i.id, i.project_id, i.provider, i.name, i.config, i.credentials IS NOT NULL, \
                       i.created_at, i.updated_at";

fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

/// An integration without its phone numbers (see [`with_numbers`]).
fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Integration> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let provider: String = row.get(2)?;
    let config: String = row.get(4)?;
    Ok(types::Integration {
        id: row.get(0)?,
        project_id: row.get(1)?,
        provider: provider.parse().map_err(|e| conversion(2, e))?,
        name: row.get(3)?,
        config: serde_json::from_str(&config).map_err(|e| conversion(4, e))?,
        credentials_configured: row.get(5)?,
        phone_numbers: Vec::new(),
        created_at: time(6)?,
        updated_at: time(7)?,
    })
}

fn number_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, types::PhoneNumber)> {
    let number: String = row.get(1)?;
    let label: String = row.get(2)?;
    let direction: String = row.get(3)?;
    Ok((
        row.get(0)?,
        types::PhoneNumber {
            number: number.try_into().map_err(|e| conversion(1, e))?,
            label: label.try_into().map_err(|e| conversion(2, e))?,
            direction: direction.parse().map_err(|e| conversion(3, e))?,
        },
    ))
}

fn with_numbers(tx: &rusqlite::Connection, mut integration: types::Integration) -> Result<types::Integration> {
    integration.phone_numbers = tx
        .prepare_cached(
            "SELECT position, number, label, direction FROM integration_phone_numbers
             WHERE integration_id = ?1 ORDER BY position",
        )?
        .query_map(params![integration.id], number_from_row)?
        .map(|r| r.map(|(_, n)| n))
        .collect::<rusqlite::Result<_>>()?;
    Ok(integration)
}

pub(crate) fn load(tx: &rusqlite::Connection, id: &str) -> Result<types::Integration> {
    let found = tx
        .prepare_cached(&format!("SELECT {COLUMNS} FROM integrations i WHERE i.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("integration", id))?;
    with_numbers(tx, found)
}

/// The provider of an integration, if it exists.
pub fn provider_of(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Option<types::IntegrationProvider>> {
    let provider: Option<String> = tx
        .prepare_cached("SELECT provider FROM integrations WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    provider.map(|p| p.parse().map_err(|e| Failure::from(conversion(0, e)))).transpose()
}

// Writing.

/// Makes `numbers` the integration's list, in their order. A number it
/// keeps keeps its row, and with it its `seq`, by which the list pages
/// (newest first): a page never moves under a change of the list. Numbers
/// new to it get new rows, the first given last, so that newest first
/// lists the numbers registered together in the order given.
fn replace_numbers(tx: &rusqlite::Transaction<'_>, id: &str, numbers: &[Number]) -> Result<()> {
    let listed = Value::from_iter(numbers.iter().map(|n| json!(n.number))).to_string();
    tx.prepare_cached(
        "DELETE FROM integration_phone_numbers
         WHERE integration_id = ?1 AND number NOT IN (SELECT value FROM json_each(?2))",
    )?
    .execute(params![id, listed])?;
    let mut upsert = tx.prepare_cached(
        "INSERT INTO integration_phone_numbers (integration_id, position, number, label, direction)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (integration_id, number)
         DO UPDATE SET position = excluded.position, label = excluded.label, direction = excluded.direction",
    )?;
    for (position, n) in numbers.iter().enumerate().rev() {
        upsert.execute(params![id, position as i64, n.number, n.label, n.direction.to_string()])?;
    }
    Ok(())
}

/// 409 `name_taken` if another integration of the project has this name.
fn check_name_free(tx: &rusqlite::Transaction<'_>, project_id: &str, name: &str, except: &str) -> Result<()> {
    access::check_name_free(tx, "integrations", "an integration", project_id, name, except)
}

/// The ids of a page of one project's integrations (`?1`), newest first,
/// of the provider `?2` (all when NULL), after the cursor `?3`, at most
/// `?4` (see [`PageSql`]): in order from `integrations_by_project`, no
/// sort, and the walk stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT i.id FROM integrations i WHERE i.project_id = ?1 AND (?2 IS NULL OR i.provider = ?2) {AFTER}
             ORDER BY i.id DESC LIMIT ?4"
        ),
        "AND i.id < ?3",
    )
});

pub async fn list(state: &AppState, caller: Caller, query: p::ListIntegrationsQuery) -> Result<types::IntegrationList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "int").map_err(|e| Failure::invalid("cursor", e))?;
    let provider = query.provider.map(|p| p.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![provider, page.after, page.fetch_limit()],
            )?;
            let page = page.finish(ids, String::clone);
            let integrations = page.items.iter().map(|id| load(tx, id)).collect::<Result<_>>()?;
            Ok(types::IntegrationList { integrations, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn create(
    state: &AppState,
    caller: Caller,
    body: types::CreateIntegrationRequest,
) -> Result<types::Integration> {
    let provider = body.provider;
    let name = validate::name("name", &body.name)?;
    check_config(provider, &body.config)?;
    check_base_url(state, &body.config)?;
    let numbers = parse_numbers(&body.phone_numbers)?;
    check_numbers_allowed(provider, &numbers)?;
    let id = ids::new_id("int");
    let sealed = seal_credentials(state, &id, &body.credentials)?;
    let changes = activity::Changes::from(json!({
        "provider": provider.to_string(),
        "name": name,
        "config": body.config,
        "credentials": masked(sealed.as_ref().map(|_| &body.credentials)),
        "phone_numbers": numbers_changes(&numbers),
    }));
    let config = Value::Object(body.config).to_string();
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &body.project_id, Need::Edit)?;
            check_name_free(tx, &body.project_id, &name, &id)?;
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO integrations (id, project_id, provider, name, config, credentials, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
                params![id, body.project_id, provider.to_string(), name, config, sealed, now],
            )?;
            replace_numbers(tx, &id, &numbers)?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "integration.create",
                    resource_type: "integration",
                    resource_id: &id,
                    project_id: Some(&body.project_id),
                    summary: format!("created {provider} integration \"{name}\""),
                    changes,
                },
            )?;
            load(tx, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetIntegrationPath) -> Result<types::Integration> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "integrations", "integration", &path.id, Need::Read)?;
            load(tx, &path.id)
        })
        .await
}

/// The channels, scenarios and tests that use an integration, as
/// `kind id "name"` (the first few).
fn referrers(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Vec<String>> {
    const SHOWN: usize = 10;
    let mut found: Vec<String> = tx
        .prepare_cached(
            "SELECT 'channel', id, name FROM channels WHERE integration_id = ?1
             UNION ALL
             SELECT 'scenario', s.id, s.name FROM scenario_judges j JOIN scenarios s ON s.id = j.scenario_id
             WHERE j.integration_id = ?1
             UNION ALL
             SELECT 'test', t.id, t.name FROM test_judges j JOIN tests t ON t.id = j.test_id
             WHERE j.integration_id = ?1
             LIMIT ?2",
        )?
        .query_map(params![id, SHOWN as i64 + 1], |r| {
            Ok(format!("{} {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if found.len() > SHOWN {
        found.truncate(SHOWN);
        found.push("others".into());
    }
    Ok(found)
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteIntegrationPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "integrations", "integration", &path.id, Need::Edit)?;
            let using = referrers(tx, &path.id)?;
            if !using.is_empty() {
                return Err(Failure::in_use("integration", &path.id, &using));
            }
            crate::runs::refuse_if_runs_bound(tx, &project_id, "integration", crate::runs::BoundTo::Judge(&path.id))?;
            let name: String =
                tx.query_row("SELECT name FROM integrations WHERE id = ?1", params![path.id], |r| r.get(0))?;
            // Its phone numbers go with it (ON DELETE CASCADE).
            tx.execute("DELETE FROM integrations WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "integration.delete",
                    resource_type: "integration",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted integration \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

/// `PATCH`: `name`, `config` (replaced whole, checked against the
/// provider), `credentials` (an object replaces them, `null` or `{}` removes
/// them) and `phone_numbers` (the list replaced whole); absent fields are
/// unchanged. Only what differs is written and recorded; a body that
/// changes nothing writes nothing.
pub async fn update(
    state: &AppState,
    caller: Caller,
    path: p::UpdateIntegrationPath,
    body: types::UpdateIntegrationRequest,
    fields: BodyFields,
) -> Result<types::Integration> {
    let name = if fields.has("name") {
        let name = body.name.as_ref().ok_or_else(|| Failure::invalid("name", "must not be null"))?;
        Some(validate::name("name", name)?)
    } else {
        None
    };
    let config = fields.has("config").then_some(body.config);
    if let Some(config) = &config {
        check_config_shape(config)?;
    }
    let allow_private = state.engine.allows_private_targets();
    // `None`: unchanged; `Some(None)`: removed.
    let credentials = if fields.has("credentials") {
        let given = body.credentials.unwrap_or_default();
        let sealed = seal_credentials(state, &path.id, &given)?;
        let shown = masked(sealed.as_ref().map(|_| &given));
        Some((shown, sealed))
    } else {
        None
    };
    let numbers = fields.has("phone_numbers").then(|| parse_numbers(&body.phone_numbers)).transpose()?;
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "integrations", "integration", &path.id, Need::Edit)?;
            let before = load(tx, &path.id)?;
            if let Some(config) = &config {
                check_config(before.provider, config)?;
                // Stored credentials go only where they were given for.
                let url = |c: &Map<String, Value>| c.get("base_url").and_then(Value::as_str).map(str::to_string);
                if let Some(now) = url(config).filter(|now| url(&before.config).as_ref() != Some(now)) {
                    crate::engine::outbound::check_given(allow_private, "config.base_url", &now)?;
                }
                if let (Some(was), Some(now)) = (url(&before.config), url(config)) {
                    if credentials.is_none() && before.credentials_configured && !validate::same_destination(&was, &now)
                    {
                        return Err(Failure::invalid(
                            "credentials",
                            format_args!(
                                "`config.base_url` moves from `{was}` to `{now}`, another origin: give `credentials` \
                                 again (or `null` for none), since stored credentials only go where they were set"
                            ),
                        ));
                    }
                }
            }
            if let Some(numbers) = &numbers {
                check_numbers_allowed(before.provider, numbers)?;
            }
            // Only what differs from the stored integration is written and
            // recorded; credentials are write-only, so given ones count as a
            // change unless there are none either side.
            let name = name.filter(|n| *n != before.name);
            let config = config.filter(|c| *c != before.config);
            let credentials = credentials.filter(|(_, sealed)| sealed.is_some() || before.credentials_configured);
            let numbers = numbers.filter(|numbers| {
                numbers.len() != before.phone_numbers.len()
                    || numbers
                        .iter()
                        .zip(&before.phone_numbers)
                        .any(|(n, b)| n.number != *b.number || n.label != *b.label || n.direction != b.direction)
            });
            if name.is_none() && config.is_none() && credentials.is_none() && numbers.is_none() {
                return Ok(before);
            }
            let mut changes = Map::new();
            if let Some(name) = &name {
                check_name_free(tx, &project_id, name, &path.id)?;
                tx.execute("UPDATE integrations SET name = ?2 WHERE id = ?1", params![path.id, name])?;
                changes.insert("name".into(), json!(name));
            }
            if let Some(config) = config {
                let text = Value::Object(config.clone()).to_string();
                tx.execute("UPDATE integrations SET config = ?2 WHERE id = ?1", params![path.id, text])?;
                changes.insert("config".into(), Value::Object(config));
            }
            if let Some((shown, sealed)) = credentials {
                tx.execute("UPDATE integrations SET credentials = ?2 WHERE id = ?1", params![path.id, sealed])?;
                changes.insert("credentials".into(), shown);
            }
            if let Some(numbers) = &numbers {
                replace_numbers(tx, &path.id, numbers)?;
                changes.insert("phone_numbers".into(), numbers_changes(numbers));
            }
            tx.execute(
                "UPDATE integrations SET updated_at = ?2 WHERE id = ?1",
                params![path.id, ids::format_time(&ids::now())],
            )?;
            let shown_name = name.as_deref().unwrap_or(&before.name);
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "integration.update",
                    resource_type: "integration",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!(
                        "updated integration \"{shown_name}\" ({})",
                        changes.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                    ),
                    changes: Value::Object(changes).into(),
                },
            )?;
            load(tx, &path.id)
        })
        .await
}

/// A page of an integration's phone numbers (see [`PageSql`]).
pub(crate) static PHONE_NUMBERS_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT seq, number, label, direction FROM integration_phone_numbers
             WHERE integration_id = ?1 {AFTER} ORDER BY seq DESC LIMIT ?3"
        ),
        "AND seq < ?2",
    )
});

/// The integration's phone numbers, newest first (by the row each was
/// registered with, see [`replace_numbers`]); the cursor is the last
/// returned one's `seq`, which no change of the list moves.
pub async fn list_phone_numbers(
    state: &AppState,
    caller: Caller,
    path: p::ListIntegrationPhoneNumbersPath,
    query: p::ListIntegrationPhoneNumbersQuery,
) -> Result<types::PhoneNumberList> {
    let (page, after) =
        PageRequest::parse_sequence(query.limit, query.cursor.as_deref()).map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "integrations", "integration", &path.id, Need::Read)?;
            let rows = tx
                .prepare_cached(PHONE_NUMBERS_SQL.of_cursor(after.is_some()))?
                .query_map(params![path.id, after, page.fetch_limit()], number_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let page = page.finish(rows, |(seq, _)| seq.to_string());
            Ok(types::PhoneNumberList {
                phone_numbers: page.items.into_iter().map(|(_, n)| n).collect(),
                next_cursor: page.next_cursor,
            })
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use types::IntegrationProvider as P;

    fn code(r: Result<()>) -> String {
        match r {
            Err(Failure::Invalid { code, .. }) => code,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn config_is_checked_per_provider() {
        let llm = obj(json!({"base_url": "https://api.example.com/v1", "model": "gpt-4o-mini", "temperature": 0.2}));
        assert!(check_config(P::OpenaiCompatible, &llm).is_ok());
        assert_eq!(code(check_config(P::OpenaiCompatible, &obj(json!({"model": "m"})))), "invalid_base_url");
        assert_eq!(
            code(check_config(P::OpenaiCompatible, &obj(json!({"base_url": "ftp://x", "model": "m"})))),
            "invalid_base_url"
        );
        assert_eq!(
            code(check_config(P::OpenaiCompatible, &obj(json!({"base_url": "http://x", "model": " "})))),
            "invalid_model"
        );
        assert_eq!(
            code(check_config(P::OpenaiCompatible, &obj(json!({"base_url": "http://x", "model": 4})))),
            "invalid_model"
        );
        // `/chat/completions` is appended: into a query or fragment, it
        // would never reach the path.
        for base_url in ["http://x/v1?key=1", "http://x/v1#top", "http://x/v1?"] {
            let config = obj(json!({"base_url": base_url, "model": "m"}));
            assert_eq!(code(check_config(P::OpenaiCompatible, &config)), "invalid_base_url", "{base_url}");
        }
        for temperature in [json!("hot"), json!(-0.1), json!(2.5), json!([1])] {
            let config = obj(json!({"base_url": "http://x", "model": "m", "temperature": temperature}));
            assert_eq!(code(check_config(P::OpenaiCompatible, &config)), "invalid_temperature", "{temperature}");
        }
        for temperature in [json!(0), json!(2), json!(null)] {
            let config = obj(json!({"base_url": "http://x", "model": "m", "temperature": temperature}));
            assert!(check_config(P::OpenaiCompatible, &config).is_ok(), "{temperature}");
        }
        assert!(check_config(P::Twilio, &obj(json!({"account_sid": "AC123"}))).is_ok());
        assert_eq!(code(check_config(P::Twilio, &obj(json!({})))), "invalid_account_sid");
        assert!(check_config(P::Telnyx, &obj(json!({}))).is_ok());
        assert!(check_config(P::Vonage, &obj(json!({"application_id": "a"}))).is_ok());
        assert_eq!(code(check_config(P::Vonage, &obj(json!({"Auth_Token": "x"})))), "invalid_config");
        // At any depth: a secret nested in the config is as much in the clear.
        let nested = obj(json!({"base_url": "http://x", "model": "m", "extra_body": {"auth": {"API_KEY": "sk"}}}));
        assert_eq!(code(check_config(P::OpenaiCompatible, &nested)), "invalid_config");
        assert_eq!(code(check_config(P::Telnyx, &obj(json!({"profiles": [{"token": "t"}]})))), "invalid_config");
        assert!(check_config(P::Telnyx, &obj(json!({"profiles": [{"name": "token"}]}))).is_ok());
    }

    #[test]
    fn phone_numbers_are_checked() {
        let n = |number: &str| types::PhoneNumber {
            number: number.try_into().unwrap(),
            label: "".try_into().unwrap(),
            direction: types::PhoneDirection::Both,
        };
        assert_eq!(parse_numbers(&[n("+14155550100"), n("+14155550101")]).unwrap().len(), 2);
        assert!(matches!(
            parse_numbers(&[n("+14155550100"), n("+14155550100")]),
            Err(Failure::Invalid { code, .. }) if code == "invalid_phone_numbers"
        ));
        let many: Vec<_> = (0..=MAX_PHONE_NUMBERS).map(|i| n(&format!("+1415555{i:04}"))).collect();
        assert!(parse_numbers(&many).is_err());
        assert!(check_numbers_allowed(P::OpenaiCompatible, &parse_numbers(&[n("+14155550100")]).unwrap()).is_err());
        assert!(check_numbers_allowed(P::OpenaiCompatible, &[]).is_ok());
    }
}
