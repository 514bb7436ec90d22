//! Personas: who calls. The character a simulated caller plays (and, on
//! voice channels, how it sounds).
//!
//! A persona keeps its `name` in a column and every other editable field in
//! `document` (the JSON the API shows). Absent fields take their defaults on
//! create: empty description and prompt, `en-US`, no accent or gender, the
//! server's default voice at speed 1.0, no background noise (volume 0),
//! `interruption_level` none, `verbosity` and `patience` medium, no tags.
//!
//! `PATCH` merges: an absent field is unchanged, `accent: null` and
//! `gender: null` clear those (the other fields cannot be null), `tags: []`
//! removes every tag. A body that changes nothing writes nothing.
//!
//! Names are unique within a project (409 `name_taken`). Viewers and
//! reviewers read; editors and owners create, change and delete.
//! Deleting a persona that a scenario (its `default_persona_id`) or a test
//! (`persona_ids`) still uses is a 409 `in_use` naming them.

use rusqlite::{params, OptionalExtension as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, BodyFields, Caller};
use std::sync::LazyLock;

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::{ids, validate, AppState};

pub const DEFAULT_LANGUAGE: &str = "en-US";
pub const DEFAULT_SPEED: f64 = 1.0;
const MIN_SPEED: f64 = 0.5;
const MAX_SPEED: f64 = 2.0;
/// Accent, gender, voice provider and voice id.
const MAX_SHORT: usize = 100;
/// How many referrers a 409 `in_use` names.
const SHOWN: usize = 10;

/// The editable fields besides `name`, as stored in `document` and shown by
/// the API.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PersonaDoc {
    description: String,
    prompt: String,
    language: String,
    accent: Option<String>,
    gender: Option<String>,
    voice: types::PersonaVoice,
    background_noise: types::BackgroundNoise,
    background_noise_volume: f64,
    interruption_level: types::InterruptionLevel,
    verbosity: types::PersonaLevel,
    patience: types::PersonaLevel,
    tags: Vec<String>,
}

impl Default for PersonaDoc {
    fn default() -> Self {
        PersonaDoc {
            description: String::new(),
            prompt: String::new(),
            language: DEFAULT_LANGUAGE.to_string(),
            accent: None,
            gender: None,
            voice: types::PersonaVoice { provider: None, voice_id: None, speed: DEFAULT_SPEED },
            background_noise: types::BackgroundNoise::None,
            background_noise_volume: 0.0,
            interruption_level: types::InterruptionLevel::None,
            verbosity: types::PersonaLevel::Medium,
            patience: types::PersonaLevel::Medium,
            tags: Vec::new(),
        }
    }
}

// Field checks, shared by create and update.

fn description(value: &str) -> Result<String> {
    validate::text("description", value, validate::MAX_DESCRIPTION)
}

fn prompt(value: &str) -> Result<String> {
    validate::text("prompt", value, validate::MAX_PROMPT)
}

/// A short optional text (accent, gender, voice provider and id): when given,
/// 1 to 100 characters, not blank (null, or leaving it out, means none).
fn short(field: &str, value: &str) -> Result<String> {
    if value.trim().is_empty() {
        return Err(Failure::invalid(field, "must not be empty or blank; send null (or leave it out) for none"));
    }
    let n = value.chars().count();
    if n > MAX_SHORT {
        return Err(Failure::invalid(field, format_args!("must be at most {MAX_SHORT} characters, got {n}")));
    }
    if value.chars().any(char::is_control) {
        return Err(Failure::invalid(field, "must not contain control characters"));
    }
    Ok(value.to_string())
}

fn number(field: &str, value: f64, min: f64, max: f64) -> Result<f64> {
    if !value.is_finite() {
        return Err(Failure::invalid(field, format_args!("must be a number from {min} to {max}")));
    }
    validate::range(field, value, min, max)
}

/// The wire type holds the provider and voice id to 1 to 100 characters;
/// [`short`] refuses them blank or with control characters.
fn voice(v: &types::PersonaVoice) -> Result<types::PersonaVoice> {
    if let Some(provider) = &v.provider {
        short("voice.provider", provider)?;
    }
    if let Some(voice_id) = &v.voice_id {
        short("voice.voice_id", voice_id)?;
    }
    Ok(types::PersonaVoice {
        provider: v.provider.clone(),
        voice_id: v.voice_id.clone(),
        speed: number("voice.speed", v.speed, MIN_SPEED, MAX_SPEED)?,
    })
}

fn volume(value: f64) -> Result<f64> {
    number("background_noise_volume", value, 0.0, 1.0)
}

fn tags<T: std::ops::Deref<Target = String>>(values: &[T]) -> Result<Vec<String>> {
    let values: Vec<String> = values.iter().map(|t| t.to_string()).collect();
    validate::tags("tags", &values)
}

/// 409 `name_taken` if another persona of the project has this name.
fn check_name_free(tx: &rusqlite::Transaction<'_>, project_id: &str, name: &str, except: &str) -> Result<()> {
    access::check_name_free(tx, "personas", "a persona", project_id, name, except)
}

/// The persona as the activity log shows it (every editable field).
fn shown(name: &str, doc: &PersonaDoc) -> Value {
    let mut v = serde_json::to_value(doc).unwrap_or_default();
    v["name"] = json!(name);
    v
}

// Reading.

const COLUMNS: &str = "t.id, t.project_id, t.name, t.document, t.created_at, t.updated_at";

fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Persona> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let document: String = row.get(3)?;
    let d: PersonaDoc = serde_json::from_str(&document).map_err(|e| conversion(3, e))?;
    Ok(types::Persona {
        id: row.get(0)?,
        project_id: row.get(1)?,
        name: row.get(2)?,
        description: d.description,
        prompt: d.prompt,
        language: d.language,
        accent: d.accent,
        gender: d.gender,
        voice: d.voice,
        background_noise: d.background_noise,
        background_noise_volume: d.background_noise_volume,
        interruption_level: d.interruption_level,
        verbosity: d.verbosity,
        patience: d.patience,
        tags: d.tags,
        created_at: time(4)?,
        updated_at: time(5)?,
    })
}

pub(crate) fn load(tx: &rusqlite::Connection, id: &str) -> Result<types::Persona> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM personas t WHERE t.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("persona", id))
}

/// The ids of a page of one project's personas (`?1`), newest first, with
/// the tag `?2` (all when NULL), after the cursor `?3`, at most `?4` (see
/// [`PageSql`]): in order from `personas_by_project`, no sort, and the
/// walk stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT t.id FROM personas t
             WHERE t.project_id = ?1
               AND (?2 IS NULL OR EXISTS (SELECT 1 FROM json_each(t.document, '$.tags') WHERE value = ?2))
               {AFTER}
             ORDER BY t.id DESC LIMIT ?4"
        ),
        "AND t.id < ?3",
    )
});

/// A page is merged from one walk per project of the caller's (only the
/// one asked for, when it is), each stopped at the page's size: one
/// statement over all of them sorted every persona of every project of
/// theirs (after the cursor) for each page.
pub async fn list(state: &AppState, caller: Caller, query: p::ListPersonasQuery) -> Result<types::PersonaList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "per").map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![query.tag, page.after, page.fetch_limit()],
            )?;
            // A persona is up to about 100 KB (its prompt and description):
            // the page ends early past `PAGE_BYTES` of their documents.
            let by_id = format!("SELECT {COLUMNS} FROM personas t WHERE t.id = ?1");
            let rows = pagination::read_sized(tx, &by_id, &ids, 3, from_row)?;
            let page = page.finish_sized(rows, |(_, size)| *size, |(t, _)| t.id.clone());
            let personas = page.items.into_iter().map(|(t, _)| t).collect();
            Ok(types::PersonaList { personas, next_cursor: page.next_cursor })
        })
        .await
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreatePersonaRequest) -> Result<types::Persona> {
    let name = validate::name("name", &body.name)?;
    let defaults = PersonaDoc::default();
    let doc = PersonaDoc {
        description: body.description.as_deref().map(|s| description(s)).transpose()?.unwrap_or_default(),
        prompt: body.prompt.as_deref().map(|s| prompt(s)).transpose()?.unwrap_or_default(),
        language: match body.language.as_deref() {
            Some(l) => validate::language("language", l)?,
            None => defaults.language,
        },
        accent: body.accent.as_deref().map(|s| short("accent", s)).transpose()?,
        gender: body.gender.as_deref().map(|s| short("gender", s)).transpose()?,
        voice: body.voice.as_ref().map(voice).transpose()?.unwrap_or(defaults.voice),
        background_noise: body.background_noise.unwrap_or(defaults.background_noise),
        background_noise_volume: body.background_noise_volume.map(volume).transpose()?.unwrap_or(0.0),
        interruption_level: body.interruption_level.unwrap_or(defaults.interruption_level),
        verbosity: body.verbosity.unwrap_or(defaults.verbosity),
        patience: body.patience.unwrap_or(defaults.patience),
        tags: tags(&body.tags)?,
    };
    let document = serde_json::to_string(&doc).map_err(|e| Failure::invalid("body", e))?;
    let id = ids::new_id("per");
    let project_id = body.project_id;
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &project_id, Need::Edit)?;
            check_name_free(tx, &project_id, &name, &id)?;
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO personas (id, project_id, name, document, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                params![id, project_id, name, document, now],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "persona.create",
                    resource_type: "persona",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary: format!("created persona \"{name}\""),
                    changes: shown(&name, &doc).into(),
                },
            )?;
            load(tx, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetPersonaPath) -> Result<types::Persona> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "personas", "persona", &path.id, Need::Read)?;
            load(tx, &path.id)
        })
        .await
}

/// What refers to a persona: scenarios (as their default) and tests.
fn referrers(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Vec<String>> {
    let mut found: Vec<String> = tx
        .prepare_cached("SELECT id, name FROM scenarios WHERE default_persona_id = ?1 ORDER BY id LIMIT ?2")?
        .query_map(params![id, SHOWN as i64 + 1], |r| {
            Ok(format!("scenario {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let tests: Vec<String> = tx
        .prepare_cached(
            "SELECT DISTINCT t.id, t.name FROM test_personas tp JOIN tests t ON t.id = tp.test_id
             WHERE tp.persona_id = ?1 ORDER BY t.id LIMIT ?2",
        )?
        .query_map(params![id, SHOWN as i64 + 1], |r| {
            Ok(format!("test {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    found.extend(tests);
    if found.len() > SHOWN {
        found.truncate(SHOWN);
        found.push("others".into());
    }
    Ok(found)
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeletePersonaPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "personas", "persona", &path.id, Need::Edit)?;
            let using = referrers(tx, &path.id)?;
            if !using.is_empty() {
                return Err(Failure::in_use("persona", &path.id, &using));
            }
            crate::runs::refuse_if_runs_bound(tx, &project_id, "persona", crate::runs::BoundTo::Persona(&path.id))?;
            let name: String =
                tx.query_row("SELECT name FROM personas WHERE id = ?1", params![path.id], |r| r.get(0))?;
            tx.execute("DELETE FROM personas WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "persona.delete",
                    resource_type: "persona",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted persona \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

/// Fields that may not be `null` in a `PATCH` (leave them out to keep them).
const NOT_NULL: &[&str] = &[
    "name",
    "description",
    "prompt",
    "language",
    "voice",
    "background_noise",
    "background_noise_volume",
    "interruption_level",
    "verbosity",
    "patience",
    "tags",
];

/// The checked fields a `PATCH` sets, as JSON values of the document (and
/// the name).
struct PersonaPatch {
    name: Option<String>,
    set: Vec<(&'static str, Value)>,
}

impl PersonaPatch {
    fn parse(body: &types::UpdatePersonaRequest, fields: &BodyFields) -> Result<PersonaPatch> {
        for field in NOT_NULL {
            if fields.is_null(field) {
                return Err(Failure::invalid(field, "must not be null; leave it out to keep it"));
            }
        }
        let mut set: Vec<(&'static str, Value)> = Vec::new();
        if let Some(d) = &body.description {
            set.push(("description", json!(description(d)?)));
        }
        if let Some(p) = &body.prompt {
            set.push(("prompt", json!(prompt(p)?)));
        }
        if let Some(l) = &body.language {
            set.push(("language", json!(validate::language("language", l)?)));
        }
        for (field, given) in [("accent", body.accent.as_deref()), ("gender", body.gender.as_deref())] {
            if fields.has(field) {
                // Absent: unchanged; null: cleared.
                set.push((field, json!(given.map(|s| short(field, s)).transpose()?)));
            }
        }
        if let Some(v) = &body.voice {
            set.push(("voice", serde_json::to_value(voice(v)?).map_err(|e| Failure::invalid("voice", e))?));
        }
        if let Some(n) = body.background_noise {
            set.push(("background_noise", json!(n)));
        }
        if let Some(v) = body.background_noise_volume {
            set.push(("background_noise_volume", json!(volume(v)?)));
        }
        if let Some(l) = body.interruption_level {
            set.push(("interruption_level", json!(l)));
        }
        if let Some(l) = body.verbosity {
            set.push(("verbosity", json!(l)));
        }
        if let Some(l) = body.patience {
            set.push(("patience", json!(l)));
        }
        if fields.has("tags") {
            // `[]` removes every tag; absent keeps them.
            set.push(("tags", json!(tags(&body.tags)?)));
        }
        Ok(PersonaPatch { name: body.name.as_deref().map(|n| validate::name("name", n)).transpose()?, set })
    }
}

/// `PATCH`: absent fields are unchanged; `accent: null` and `gender: null`
/// clear; `tags: []` removes the tags. Only what differs is written and
/// recorded; a body that changes nothing writes nothing.
pub async fn update(
    state: &AppState,
    caller: Caller,
    path: p::UpdatePersonaPath,
    body: types::UpdatePersonaRequest,
    fields: BodyFields,
) -> Result<types::Persona> {
    let patch = PersonaPatch::parse(&body, &fields)?;
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "personas", "persona", &path.id, Need::Edit)?;
            let (before_name, document): (String, String) =
                tx.query_row("SELECT name, document FROM personas WHERE id = ?1", params![path.id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            let mut doc: Map<String, Value> =
                serde_json::from_str(&document).map_err(|e| Failure::from(conversion(3, e)))?;
            let mut changes = Map::new();
            if let Some(name) = &patch.name {
                if *name != before_name {
                    check_name_free(tx, &project_id, name, &path.id)?;
                    changes.insert("name".into(), json!(name));
                }
            }
            for (field, value) in &patch.set {
                if doc.get(*field) != Some(value) {
                    changes.insert(field.to_string(), value.clone());
                    doc.insert(field.to_string(), value.clone());
                }
            }
            if changes.is_empty() {
                return load(tx, &path.id);
            }
            // The merged document must still be a whole persona.
            let checked: PersonaDoc =
                serde_json::from_value(Value::Object(doc)).map_err(|e| Failure::from(conversion(3, e)))?;
            let name = patch.name.as_deref().unwrap_or(&before_name);
            tx.execute(
                "UPDATE personas SET name = ?2, document = ?3, updated_at = ?4 WHERE id = ?1",
                params![
                    path.id,
                    name,
                    serde_json::to_string(&checked).map_err(|e| Failure::from(conversion(3, e)))?,
                    ids::format_time(&ids::now())
                ],
            )?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "persona.update",
                    resource_type: "persona",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!(
                        "updated persona \"{name}\" ({})",
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
pub(crate) mod tests {
    use super::*;

    fn invalid(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(Failure::Invalid { code, message }) => format!("{code}: {message}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    /// A project with a persona, a channel, a scenario defaulting to the
    /// persona, and `tests` tests using both (rows written directly: the
    /// tests module is not needed for this).
    pub(crate) fn with_users_of_a_persona(tests: usize, check: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<()>) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO personas VALUES ('per_1', 'prj_1', 'caller', '{}', 't', 't');
                     INSERT INTO channels VALUES ('chn_1', 'prj_1', 'web', 'http', 'https://a.example', NULL, '[]',
                                                  NULL, 1000, 600, 't', 't');
                     INSERT INTO scenarios VALUES ('scn_1', 'prj_1', 'checkout', 'simulated', 'per_1', 1, '{}', 't', 't', 60);",
                )?;
                for i in 0..tests {
                    tx.execute(
                        "INSERT INTO tests (id, project_id, name, channel_id, scenario_id, document, created_at, updated_at)
                         VALUES (?1, 'prj_1', ?2, 'chn_1', 'scn_1', '{}', 't', 't')",
                        params![format!("tst_{i:02}"), format!("flow {i}")],
                    )?;
                    // The same persona twice in one test is named once.
                    for position in 0..2 {
                        tx.execute(
                            "INSERT INTO test_personas VALUES (?1, ?2, 'per_1')",
                            params![format!("tst_{i:02}"), position],
                        )?;
                    }
                }
                check(tx)
            })
            .unwrap();
    }

    #[test]
    fn scenarios_and_tests_using_a_persona_are_named() {
        with_users_of_a_persona(1, |tx| {
            assert_eq!(referrers(tx, "per_1")?, ["scenario scn_1 \"checkout\"", "test tst_00 \"flow 0\""]);
            assert!(referrers(tx, "per_2")?.is_empty());
            Ok(())
        });
        with_users_of_a_persona(12, |tx| {
            let named = referrers(tx, "per_1")?;
            assert_eq!(named.len(), SHOWN + 1);
            assert_eq!(named[SHOWN], "others");
            Ok(())
        });
    }

    #[test]
    fn voices_and_volumes_are_bounded() {
        let v = |speed: f64| types::PersonaVoice { provider: Some("azure".parse().unwrap()), voice_id: None, speed };
        assert!(voice(&v(0.5)).is_ok());
        assert!(voice(&v(2.0)).is_ok());
        assert!(invalid(voice(&v(0.49))).starts_with("invalid_speed: voice.speed:"));
        assert!(invalid(voice(&v(f64::NAN))).starts_with("invalid_speed: voice.speed:"));
        let blank = types::PersonaVoice { provider: Some(" ".parse().unwrap()), voice_id: None, speed: 1.0 };
        assert!(invalid(voice(&blank)).starts_with("invalid_provider: voice.provider:"));
        assert!(volume(0.0).is_ok() && volume(1.0).is_ok());
        assert!(invalid(volume(1.01)).starts_with("invalid_background_noise_volume:"));
        assert!(invalid(volume(f64::INFINITY)).starts_with("invalid_background_noise_volume:"));
    }

    #[test]
    fn the_default_document_round_trips() {
        let doc = PersonaDoc::default();
        let text = serde_json::to_string(&doc).unwrap();
        let back: PersonaDoc = serde_json::from_str(&text).unwrap();
        assert_eq!(back.language, "en-US");
        assert_eq!(
            serde_json::to_value(&back).unwrap()["voice"],
            json!({"provider": null, "voice_id": null, "speed": 1.0})
        );
    }
}
