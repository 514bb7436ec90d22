//! Tests: runnable cases. A test plays a scenario against a channel with
//! some personas (none = the scenario's default persona), `iterations`
//! times each, adds its own `evaluators` to the scenario's success criteria,
//! and passes when at least `pass_threshold` of its iterations pass.
//!
//! The channel, the scenario and every persona must be of the test's
//! project (a 400 naming the field otherwise, `persona_ids[2]` and the
//! like). A test without personas needs a scenario with a default persona.
//! Every `llm_judge` must name an `openai_compatible` integration of the
//! project; those are recorded in `test_judges` so they cannot be deleted
//! from under the test.
//!
//! A result is judged by the scenario's evaluators and the test's, and no
//! two of them may share a name: a test evaluator with a name that one of
//! the scenario's evaluations has in results (a success criterion's, `step
//! N: <name>` of a step's) is a 400 naming it (`scenario_id` when only the
//! scenario was changed).
//!
//! A test keeps `name`, `channel_id` and `scenario_id` in columns, its
//! personas in order in `test_personas`, the rest in `document`, and the
//! whole of it as the API shows it in `served`, rewritten by every write
//! (see [`serve`]): reads answer with that text as it is. `PATCH`
//! merges: absent fields are unchanged, a given list replaces the stored one
//! (`persona_ids: []` falls back to the scenario's default persona).
//!
//! Viewers and reviewers read; editors and owners create, change and delete.
//! Deleting a test a batch still includes is a 409 `in_use`.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::SubsecRound as _;

use rusqlite::{params, OptionalExtension as _};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, BodyFields, Caller, Json};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageRows};
use crate::{evaluators, ids, scenarios, test_cache, validate, written, AppState};

pub const DEFAULT_ITERATIONS: u32 = 1;
pub const MAX_ITERATIONS: u32 = 100;
pub const DEFAULT_PASS_THRESHOLD: f64 = 1.0;
pub const MAX_PERSONAS: usize = 100;
/// How many referrers a 409 `in_use` names.
const SHOWN: usize = 10;

/// The editable fields besides those in columns (and `test_personas`), as
/// stored in `document`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TestDoc {
    description: String,
    iterations: u32,
    evaluators: Vec<types::Evaluator>,
    pass_threshold: f64,
    tags: Vec<String>,
}

// Parsing, field by field (shared by create and update).

fn description(d: &str) -> Result<String> {
    validate::text("description", d, validate::MAX_DESCRIPTION)
}

fn iterations(n: u32) -> Result<u32> {
    validate::range("iterations", n, 1, MAX_ITERATIONS)
}

fn pass_threshold(t: f64) -> Result<f64> {
    if !t.is_finite() || !(0.0..=1.0).contains(&t) {
        return Err(Failure::invalid("pass_threshold", format_args!("must be from 0 to 1, got {t}")));
    }
    Ok(t)
}

/// At most [`MAX_PERSONAS`], none twice (order kept). Whether each is a
/// persona of the project is checked in the transaction.
fn persona_ids(ids: &[String]) -> Result<Vec<String>> {
    if ids.len() > MAX_PERSONAS {
        return Err(Failure::invalid(
            "persona_ids",
            format_args!("at most {MAX_PERSONAS} personas, got {}", ids.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        if !seen.insert(id.as_str()) {
            return Err(Failure::invalid(&format!("persona_ids[{i}]"), format_args!("`{id}` is listed twice")));
        }
    }
    Ok(ids.to_vec())
}

/// A test's evaluators, checked.
#[derive(Debug)]
struct Evaluators {
    list: Vec<types::Evaluator>,
    /// Every `llm_judge`: the field naming its integration, and the id.
    judges: Vec<(String, String)>,
}

fn checked_evaluators(list: Vec<types::Evaluator>) -> Result<Evaluators> {
    evaluators::check_list("evaluators", &list)?;
    let judges = list
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            types::Evaluator::LlmJudge { integration_id, .. } => {
                Some((format!("evaluators[{i}].integration_id"), integration_id.clone()))
            }
            _ => None,
        })
        .collect();
    Ok(Evaluators { list, judges })
}

fn tags<T: std::ops::Deref<Target = String>>(given: &[T]) -> Result<Vec<String>> {
    validate::tags("tags", &given.iter().map(|t| t.to_string()).collect::<Vec<_>>())
}

// References, checked in the transaction.

fn check_channel(tx: &rusqlite::Transaction<'_>, id: &str, project_id: &str) -> Result<()> {
    access::require_reference(tx, "channels", "channel_id", id, project_id)
}

fn check_scenario(tx: &rusqlite::Transaction<'_>, id: &str, project_id: &str) -> Result<()> {
    access::require_reference(tx, "scenarios", "scenario_id", id, project_id)
}

fn check_personas(tx: &rusqlite::Transaction<'_>, ids: &[String], project_id: &str) -> Result<()> {
    for (i, id) in ids.iter().enumerate() {
        access::require_reference(tx, "personas", &format!("persona_ids[{i}]"), id, project_id)?;
    }
    Ok(())
}

fn check_judges(tx: &rusqlite::Transaction<'_>, judges: &[(String, String)], project_id: &str) -> Result<()> {
    for (field, id) in judges {
        evaluators::check_judges(tx, field, &BTreeSet::from([id.clone()]), project_id)?;
    }
    Ok(())
}

/// A result is judged by the scenario's evaluators and then the test's
/// `evaluators`, and no two of them may share a name (see
/// `evaluators::scenario_evaluations`): 400 naming the test's evaluator
/// whose name the scenario gives one of its evaluations, or `scenario_id`
/// when only the scenario was changed (`given_evaluators` false).
fn check_names_apart(
    tx: &rusqlite::Transaction<'_>,
    evaluators: &[types::Evaluator],
    scenario_id: &str,
    given_evaluators: bool,
) -> Result<()> {
    if evaluators.is_empty() {
        return Ok(());
    }
    let taken = scenarios::evaluation_names(tx, scenario_id)?;
    for (i, e) in evaluators.iter().enumerate() {
        let name = evaluators::name_of(e);
        let Some((_, at)) = taken.iter().find(|(taken, _)| taken == name) else { continue };
        return Err(if given_evaluators {
            Failure::invalid(
                &format!("evaluators[{i}].name"),
                format_args!(
                    "`{name}` is also the name results give scenario `{scenario_id}`'s {at}; {}",
                    evaluators::NAMES_APART
                ),
            )
        } else {
            Failure::invalid(
                "scenario_id",
                format_args!(
                    "scenario `{scenario_id}` gives its {at} the name `{name}` in results, which this test's \
                     evaluators[{i}] has; {}",
                    evaluators::NAMES_APART
                ),
            )
        });
    }
    Ok(())
}

/// A test without personas plays the scenario's default persona, so the
/// scenario must have one.
fn check_someone_calls(tx: &rusqlite::Transaction<'_>, persona_ids: &[String], scenario_id: &str) -> Result<()> {
    if !persona_ids.is_empty() {
        return Ok(());
    }
    let default: Option<String> = tx
        .prepare_cached("SELECT default_persona_id FROM scenarios WHERE id = ?1")?
        .query_row(params![scenario_id], |r| r.get(0))
        .optional()?
        .flatten();
    if default.is_none() {
        return Err(Failure::invalid(
            "persona_ids",
            format_args!(
                "is empty and scenario `{scenario_id}` has no default persona; a test needs a persona: \
                 name at least one, or give the scenario a `default_persona_id`"
            ),
        ));
    }
    Ok(())
}

fn write_personas(tx: &rusqlite::Transaction<'_>, test_id: &str, persona_ids: &[String]) -> Result<()> {
    tx.prepare_cached("DELETE FROM test_personas WHERE test_id = ?1")?.execute(params![test_id])?;
    insert_personas(tx, test_id, persona_ids)
}

fn insert_personas(tx: &rusqlite::Transaction<'_>, test_id: &str, persona_ids: &[String]) -> Result<()> {
    let mut insert =
        tx.prepare_cached("INSERT INTO test_personas (test_id, position, persona_id) VALUES (?1, ?2, ?3)")?;
    for (position, id) in persona_ids.iter().enumerate() {
        insert.execute(params![test_id, position as i64, id])?;
    }
    Ok(())
}

fn write_judges(tx: &rusqlite::Transaction<'_>, test_id: &str, judges: &[(String, String)]) -> Result<()> {
    tx.prepare_cached("DELETE FROM test_judges WHERE test_id = ?1")?.execute(params![test_id])?;
    insert_judges(tx, test_id, judges)
}

fn insert_judges(tx: &rusqlite::Transaction<'_>, test_id: &str, judges: &[(String, String)]) -> Result<()> {
    let ids: BTreeSet<&str> = judges.iter().map(|(_, id)| id.as_str()).collect();
    let mut insert = tx.prepare_cached("INSERT INTO test_judges (test_id, integration_id) VALUES (?1, ?2)")?;
    for id in ids {
        insert.execute(params![test_id, id])?;
    }
    Ok(())
}

// Reading.

/// A test's columns, its personas in order (a JSON array, so a page of
/// tests is one query rather than one more per test) last.
const COLUMNS: &str = "t.id, t.project_id, t.name, t.channel_id, t.scenario_id, t.document, t.created_at, t.updated_at,
     (SELECT json_group_array(persona_id)
      FROM (SELECT persona_id FROM test_personas WHERE test_id = t.id ORDER BY position))";

fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

/// A test from a row of [`COLUMNS`].
fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Test> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let document: String = row.get(5)?;
    let d: TestDoc = serde_json::from_str(&document).map_err(|e| conversion(5, e))?;
    let personas: String = row.get(8)?;
    Ok(types::Test {
        id: row.get(0)?,
        project_id: row.get(1)?,
        name: row.get(2)?,
        channel_id: row.get(3)?,
        scenario_id: row.get(4)?,
        persona_ids: serde_json::from_str(&personas).map_err(|e| conversion(8, e))?,
        description: d.description,
        iterations: std::num::NonZeroU32::new(d.iterations).ok_or_else(|| conversion(5, "zero iterations"))?,
        evaluators: d.evaluators,
        pass_threshold: d.pass_threshold,
        tags: d.tags,
        created_at: time(6)?,
        updated_at: time(7)?,
    })
}

/// `test` as the API shows it: what `served` holds.
fn served(test: &types::Test) -> Result<String> {
    Parts::of(test).and_then(|parts| served_with(test, &parts)).map_err(|e| Failure::from(conversion(0, e)))
}

/// The parts of a test that each of its JSON texts holds (`served`,
/// `document`, a create's activity record), written once: its evaluators
/// (serde's internally tagged enums, a third of a create's serializing)
/// and its times (chrono writes them a piece at a time).
struct Parts {
    evaluators: Box<RawValue>,
    created_at: Box<RawValue>,
    /// `None`: the same as `created_at` (a new test).
    updated_at: Option<Box<RawValue>>,
}

impl Parts {
    fn of(test: &types::Test) -> serde_json::Result<Parts> {
        Ok(Parts {
            evaluators: serde_json::value::to_raw_value(&test.evaluators)?,
            created_at: serde_json::value::to_raw_value(&test.created_at)?,
            updated_at: match test.updated_at == test.created_at {
                true => None,
                false => Some(serde_json::value::to_raw_value(&test.updated_at)?),
            },
        })
    }
}

/// A [`types::Test`] as its derived `Serialize` writes it (the same
/// members in the same order), with [`Parts`] written already.
/// `written_test_is_the_generated_types_json` holds it to that.
#[derive(Serialize)]
struct ServedTest<'a> {
    channel_id: &'a str,
    created_at: &'a RawValue,
    description: &'a str,
    evaluators: &'a RawValue,
    id: &'a str,
    iterations: std::num::NonZeroU32,
    name: &'a str,
    pass_threshold: f64,
    persona_ids: &'a [String],
    project_id: &'a str,
    scenario_id: &'a str,
    tags: &'a [String],
    updated_at: &'a RawValue,
}

fn served_with(test: &types::Test, parts: &Parts) -> serde_json::Result<String> {
    // Every member named: a member added to the generated type fails to
    // compile here rather than go missing from what is served.
    let types::Test {
        channel_id,
        created_at: _,
        description,
        evaluators: _,
        id,
        iterations,
        name,
        pass_threshold,
        persona_ids,
        project_id,
        scenario_id,
        tags,
        updated_at: _,
    } = test;
    serde_json::to_string(&ServedTest {
        channel_id,
        created_at: &parts.created_at,
        description,
        evaluators: &parts.evaluators,
        id,
        iterations: *iterations,
        name,
        pass_threshold: *pass_threshold,
        persona_ids,
        project_id,
        scenario_id,
        tags,
        updated_at: parts.updated_at.as_deref().unwrap_or(&parts.created_at),
    })
}

/// A [`TestDoc`] as it is encoded, from a test and its evaluators written
/// already: what every write of a test stores as its `document` (`TestDoc`
/// is read).
#[derive(Serialize)]
struct WrittenDoc<'a> {
    description: &'a str,
    iterations: u32,
    evaluators: &'a RawValue,
    pass_threshold: f64,
    tags: &'a [String],
}

fn document_with(test: &types::Test, evaluators: &RawValue) -> serde_json::Result<String> {
    serde_json::to_string(&WrittenDoc {
        description: &test.description,
        iterations: test.iterations.get(),
        evaluators,
        pass_threshold: test.pass_threshold,
        tags: &test.tags,
    })
}

/// Stores `test` as the API shows it, for the reads (`served`). Every
/// write of a test ends with it, in its transaction (a create writes it
/// with the row).
fn serve(tx: &rusqlite::Transaction<'_>, test: &types::Test) -> Result<()> {
    tx.prepare_cached("UPDATE tests SET served = ?2 WHERE id = ?1")?.execute(params![test.id, served(test)?])?;
    Ok(())
}

/// Migration 0005's step: `served` for every test there is.
pub(crate) fn serve_all(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let ids: Vec<String> =
        tx.prepare("SELECT id FROM tests")?.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
    for id in ids {
        load(tx, &id)
            .and_then(|test| serve(tx, &test))
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(format!("test `{id}` as served: {e:?}").into()))?;
    }
    Ok(())
}

pub(crate) fn load(tx: &rusqlite::Connection, id: &str) -> Result<types::Test> {
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM tests t WHERE t.id = ?1"))?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("test", id))
}

/// The editable fields as the activity log shows them, in the order of a
/// JSON object's keys (sorted), so that a create writes them straight from
/// the test and an update's diff of [`shown`] maps reads the same.
#[derive(Serialize)]
struct Shown<'a, E: ?Sized = [types::Evaluator]> {
    channel_id: &'a str,
    description: &'a str,
    evaluators: &'a E,
    iterations: u32,
    name: &'a str,
    pass_threshold: f64,
    persona_ids: &'a [String],
    scenario_id: &'a str,
    tags: &'a [String],
}

impl<'a> Shown<'a> {
    fn of(t: &'a types::Test) -> Shown<'a> {
        Shown::with(t, &t.evaluators)
    }
}

impl<'a, E: ?Sized> Shown<'a, E> {
    /// With the evaluators as given (written already, for a create).
    fn with(t: &'a types::Test, evaluators: &'a E) -> Shown<'a, E> {
        Shown {
            channel_id: &t.channel_id,
            description: &t.description,
            evaluators,
            iterations: t.iterations.get(),
            name: &t.name,
            pass_threshold: t.pass_threshold,
            persona_ids: &t.persona_ids,
            scenario_id: &t.scenario_id,
            tags: &t.tags,
        }
    }
}

/// [`Shown`] as a map, for an update to keep the fields that changed.
fn shown(t: &types::Test) -> Result<Map<String, Value>> {
    match serde_json::to_value(Shown::of(t)).map_err(|e| conversion(0, e))? {
        Value::Object(m) => Ok(m),
        other => Err(conversion(0, format_args!("the fields shown are not an object: {other}")).into()),
    }
}

/// The conditions a page of tests can be filtered by, in the order
/// [`page_sql`] takes them: channel, scenario, tag, and the cursor.
const PAGE_FILTERS: [&str; 4] = [
    "t.channel_id = ?",
    "t.scenario_id = ?",
    "EXISTS (SELECT 1 FROM json_each(t.document, '$.tags') WHERE value = ?)",
    "t.id < ?",
];

/// The SQL of a walk down one project's tests, newest first. Its
/// parameters: the project, then the value of each filter given, then the
/// limit. With `served`, it reads each test's id and served JSON (a page
/// of one project's tests); without, its id only (one project's share of a
/// page across the caller's projects, whose tests are read by id once
/// merged: one statement over all of them sorted every test of every
/// project of the caller's, served JSON included, for every page).
///
/// The tests come in order from the index `tests_by_project` (migration
/// 0015): no sort, and the walk stops at the limit. Only the filters given
/// are in the SQL (one cached statement per combination), so the planner
/// sees each one: it cannot use an index for `(? IS NULL OR …)` (see
/// `store` on why plans do not look at bound values).
fn page_sql(served: bool, given: [bool; 4]) -> String {
    let mut sql = String::from(if served { "SELECT t.id, t.served" } else { "SELECT t.id" });
    sql.push_str(" FROM tests t WHERE t.project_id = ?");
    for (condition, _) in PAGE_FILTERS.iter().zip(given).filter(|(_, given)| *given) {
        sql.push_str(" AND ");
        sql.push_str(condition);
    }
    sql.push_str(" ORDER BY t.id DESC LIMIT ?");
    sql
}

pub async fn list(state: &AppState, caller: Caller, query: p::ListTestsQuery) -> Result<Json<types::TestList>> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "tst").map_err(|e| Failure::invalid("cursor", e))?;
    let filters = [&query.channel_id, &query.scenario_id, &query.tag, &page.after];
    // The first page of a project's tests, unfiltered, is its newest tests,
    // kept in memory (`test_cache`).
    let newest = match &query.project_id {
        Some(project_id) if filters.iter().all(|f| f.is_none()) => Some(project_id.as_str()),
        _ => None,
    };
    let cache = &state.test_cache;
    if let Some(project_id) = newest {
        if let Some((role, tests)) = cache.newest(project_id, &caller.user_id, page.limit + 1) {
            access::check(role, Need::Read)?;
            return Ok(Json::written(page_of(&page, tests)));
        }
    }
    let generation = cache.generation();
    let given = filters.map(Option::is_some);
    let rows = state
        .store
        .read(|tx| {
            // A walk's parameters (see `page_sql`).
            let walk = |project_id: &str, limit: i64| {
                use rusqlite::types::Value as Param;
                let mut args = vec![Param::Text(project_id.to_string())];
                args.extend(filters.iter().filter_map(|v| v.as_ref().map(|v| Param::Text(v.to_string()))));
                args.push(Param::Integer(limit));
                rusqlite::params_from_iter(args)
            };
            // A test is up to a request body in size: read what `page_of`
            // needs (see `PageRows`), and no more.
            let (mut read, mut whole) = (PageRows::default(), true);
            let mut keep = |row: test_cache::Listed| {
                let size = row.1.len();
                let more = read.read(row, size);
                whole &= more;
                more
            };
            let role = match &query.project_id {
                Some(project_id) => {
                    let role = access::require(tx, &caller.user_id, project_id, Need::Read)?;
                    let limit = if newest.is_some() { test_cache::NEWEST as i64 } else { page.fetch_limit() };
                    let mut statement = tx.prepare_cached(&page_sql(true, given))?;
                    let mut found = statement.query(walk(project_id, limit))?;
                    while let Some(r) = found.next()? {
                        if !keep((r.get::<_, String>(0)?, Arc::<str>::from(r.get::<_, String>(1)?))) {
                            break;
                        }
                    }
                    Some(role)
                }
                None => {
                    // One walk per project of the caller's, merged: the
                    // filters given, then the limit (see `page_sql`).
                    let limit = page.fetch_limit();
                    let mut rest: Vec<&dyn rusqlite::ToSql> =
                        filters.iter().filter_map(|f| f.as_ref().map(|v| v as &dyn rusqlite::ToSql)).collect();
                    rest.push(&limit);
                    let ids = pagination::ids_across_projects(
                        tx,
                        &caller.user_id,
                        None,
                        &page_sql(false, given),
                        &page,
                        &rest,
                    )?;
                    let mut by_id = tx.prepare_cached("SELECT served FROM tests WHERE id = ?1")?;
                    for id in ids {
                        let served: String = by_id.query_row([&id], |r| r.get(0))?;
                        if !keep((id, served.into())) {
                            break;
                        }
                    }
                    None
                }
            };
            Ok::<_, Failure>((read.rows, role, whole))
        })
        .await?;
    let (rows, role, whole) = rows;
    if let (Some(project_id), Some(role), true) = (newest, role, whole) {
        let tests = rows.iter().take(page.limit + 1).cloned().collect();
        cache.keep_newest(generation, project_id, rows, &caller.user_id, role);
        return Ok(Json::written(page_of(&page, tests)));
    }
    Ok(Json::written(page_of(&page, rows)))
}

/// A page of tests as served, from `page`'s rows: (id, served JSON), the
/// page's and at least one more if there is one. It ends early after the
/// test that takes it past `pagination::PAGE_BYTES` when another follows.
fn page_of(page: &PageRequest, rows: Vec<test_cache::Listed>) -> String {
    let page = page.finish_sized(rows, |(_, json)| json.len(), |(id, _)| id.clone());
    let tests = page.items.iter().map(|(_, json)| &**json);
    written::page("tests", tests, page.next_cursor.as_deref())
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreateTestRequest) -> Result<Json<types::Test>> {
    let name = validate::name("name", &body.name)?;
    let Evaluators { list: evaluators, judges } = checked_evaluators(body.evaluators)?;
    let description = description(body.description.as_deref().map(String::as_str).unwrap_or(""))?;
    iterations(body.iterations.get())?;
    let pass_threshold = pass_threshold(body.pass_threshold)?;
    let tags = tags(&body.tags)?;
    let personas = persona_ids(&body.persona_ids)?;
    // Everything that does not need the database is done here, on the
    // request's thread: the writer thread runs every write, one at a time,
    // so its share of a create is what bounds how many it can take.
    let now = ids::now().trunc_subsecs(6);
    let test = types::Test {
        id: ids::new_id("tst"),
        project_id: body.project_id,
        name,
        channel_id: body.channel_id,
        scenario_id: body.scenario_id,
        persona_ids: personas,
        description,
        iterations: body.iterations,
        evaluators,
        pass_threshold,
        tags,
        created_at: now,
        updated_at: now,
    };
    // The test's three texts (as stored, as served, as recorded) share its
    // evaluators and times, written once; the record is written from the
    // test, not through a map of values (which took as long as the rest of
    // the create's work on this thread).
    let parts = Parts::of(&test).map_err(|e| conversion(0, e))?;
    let document = document_with(&test, &parts.evaluators).map_err(|e| conversion(5, e))?;
    let served_json: Arc<str> = served_with(&test, &parts).map_err(|e| conversion(0, e))?.into();
    let changes = activity::Changes::of(&Shown::with(&test, &*parts.evaluators)).map_err(|e| conversion(0, e))?;
    // Not held across the write's wait.
    drop(parts);
    let created_at = ids::format_time(&now);
    let cache = state.test_cache.clone();
    let listed = served_json.clone();
    let answer = served_json.clone();
    let (id, project_id) = (test.id.clone(), test.project_id.clone());
    let user_id = caller.user_id.clone();
    let actor = Actor::Caller(caller);
    // Runs again if a write after it in its group fails (see
    // `Store::write_then_again`): it does nothing outside the transaction.
    state
        .store
        .write_then_again(
            move |tx| {
                let t = &test;
                access::require(tx, &user_id, &t.project_id, Need::Edit)?;
                check_channel(tx, &t.channel_id, &t.project_id)?;
                check_scenario(tx, &t.scenario_id, &t.project_id)?;
                check_personas(tx, &t.persona_ids, &t.project_id)?;
                check_someone_calls(tx, &t.persona_ids, &t.scenario_id)?;
                check_names_apart(tx, &t.evaluators, &t.scenario_id, true)?;
                check_judges(tx, &judges, &t.project_id)?;
                tx.prepare_cached(
                "INSERT INTO tests (id, project_id, name, channel_id, scenario_id, document, created_at, updated_at,
                                    served, iterations, pass_threshold)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                t.id,
                t.project_id,
                t.name,
                t.channel_id,
                t.scenario_id,
                document,
                created_at,
                &*served_json,
                t.iterations.get(),
                t.pass_threshold
            ])?;
                insert_personas(tx, &t.id, &t.persona_ids)?;
                insert_judges(tx, &t.id, &judges)?;
                activity::record(
                    tx,
                    &actor,
                    Record {
                        action: "test.create",
                        resource_type: "test",
                        resource_id: &t.id,
                        project_id: Some(&t.project_id),
                        summary: format!("created test \"{}\"", t.name),
                        changes: changes.clone(),
                    },
                )?;
                Ok::<_, Failure>(())
            },
            move |()| cache.created(&id, &project_id, listed),
        )
        .await?;
    // The answer is the test as served, already written.
    Ok(Json::written(answer.to_string()))
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetTestPath) -> Result<Json<types::Test>> {
    if let Some(found) = state.test_cache.get(&path.id, &caller.user_id) {
        access::check(found.role, Need::Read)?;
        return Ok(Json::written(found.served.to_string()));
    }
    let cache = &state.test_cache;
    let generation = cache.generation();
    state
        .store
        .read(move |tx| {
            // The test and the caller's role in its project in one query
            // (what `access::require_resource` and `load` do in two).
            let found = tx
                .prepare_cached(
                    "SELECT t.served, t.project_id, m.role FROM tests t
                     LEFT JOIN project_members m ON m.project_id = t.project_id AND m.user_id = ?2
                     WHERE t.id = ?1",
                )?
                .query_row(params![path.id, caller.user_id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<String>>(2)?))
                })
                .optional()?;
            // Outsiders get the same 404 as for a test that does not exist.
            let Some((test, project_id, Some(role))) = found else {
                return Err(Failure::not_found("test", &path.id));
            };
            let role = access::Role::parse(&role).ok_or_else(|| Failure::not_found("test", &path.id))?;
            let served: Arc<str> = test.into();
            cache.keep(generation, &path.id, &project_id, served.clone(), &caller.user_id, role);
            access::check(role, Need::Read)?;
            Ok(Json::written(served.to_string()))
        })
        .await
}

/// The batches that include a test (at most [`SHOWN`], then "others").
fn referrers(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Vec<String>> {
    let mut using: Vec<String> = tx
        .prepare_cached(
            "SELECT DISTINCT b.id, b.name FROM batch_tests bt JOIN batches b ON b.id = bt.batch_id
             WHERE bt.test_id = ?1 ORDER BY b.id LIMIT ?2",
        )?
        .query_map(params![id, SHOWN as i64 + 1], |r| {
            Ok(format!("batch {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if using.len() > SHOWN {
        using.truncate(SHOWN);
        using.push("others".into());
    }
    Ok(using)
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteTestPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) = access::require_resource(tx, &caller.user_id, "tests", "test", &path.id, Need::Edit)?;
            let active: i64 = tx.query_row(
                "SELECT count(*) FROM runs WHERE test_id = ?1 AND status IN ('queued', 'running')
                   AND batch_run_id IN (SELECT id FROM batch_runs WHERE status IN ('queued', 'running'))",
                params![path.id],
                |r| r.get(0),
            )?;
            if active > 0 {
                return Err(Failure::runs_active(
                    format_args!("test `{}` has {active} runs", path.id),
                    "cancel their batch runs",
                ));
            }
            let using = referrers(tx, &path.id)?;
            if !using.is_empty() {
                return Err(Failure::in_use("test", &path.id, &using));
            }
            let name: String = tx.query_row("SELECT name FROM tests WHERE id = ?1", params![path.id], |r| r.get(0))?;
            // Its personas and judges go with it (ON DELETE CASCADE).
            tx.execute("DELETE FROM tests WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "test.delete",
                    resource_type: "test",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted test \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

/// Fields that may not be `null` in a `PATCH` (leave them out to keep them;
/// `[]` empties a list).
const NOT_NULL: &[&str] = &[
    "name",
    "description",
    "channel_id",
    "scenario_id",
    "persona_ids",
    "iterations",
    "evaluators",
    "pass_threshold",
    "tags",
];

/// The checked fields a `PATCH` sets; `None` keeps the stored value.
#[derive(Default)]
struct TestPatch {
    name: Option<String>,
    description: Option<String>,
    channel_id: Option<String>,
    scenario_id: Option<String>,
    persona_ids: Option<Vec<String>>,
    iterations: Option<u32>,
    evaluators: Option<Evaluators>,
    pass_threshold: Option<f64>,
    tags: Option<Vec<String>>,
}

impl TestPatch {
    fn parse(body: &types::UpdateTestRequest, fields: &BodyFields) -> Result<TestPatch> {
        for field in NOT_NULL {
            if fields.is_null(field) {
                return Err(Failure::invalid(field, "must not be null; leave it out to keep it"));
            }
        }
        Ok(TestPatch {
            name: body.name.as_deref().map(|n| validate::name("name", n)).transpose()?,
            description: body.description.as_deref().map(|d| description(d)).transpose()?,
            channel_id: body.channel_id.clone(),
            scenario_id: body.scenario_id.clone(),
            // Lists: absent keeps them, `[]` empties them (the generated
            // type shows both as an empty list).
            persona_ids: fields.has("persona_ids").then(|| persona_ids(&body.persona_ids)).transpose()?,
            iterations: body.iterations.map(|n| iterations(n.get())).transpose()?,
            evaluators: fields.has("evaluators").then(|| checked_evaluators(body.evaluators.clone())).transpose()?,
            pass_threshold: body.pass_threshold.map(pass_threshold).transpose()?,
            tags: fields.has("tags").then(|| tags(&body.tags)).transpose()?,
        })
    }
}

/// `PATCH`: absent fields are unchanged; a given list replaces the stored
/// one (`persona_ids: []` falls back to the scenario's default persona,
/// which it must have). Only what differs is written and recorded; a body
/// that changes nothing writes nothing.
pub async fn update(
    state: &AppState,
    caller: Caller,
    path: p::UpdateTestPath,
    body: types::UpdateTestRequest,
    fields: BodyFields,
) -> Result<types::Test> {
    let patch = TestPatch::parse(&body, &fields)?;
    state
        .store
        .write(move |tx| {
            let (project_id, _) = access::require_resource(tx, &caller.user_id, "tests", "test", &path.id, Need::Edit)?;
            let before = load(tx, &path.id)?;
            if let Some(channel_id) = &patch.channel_id {
                check_channel(tx, channel_id, &project_id)?;
            }
            if let Some(scenario_id) = &patch.scenario_id {
                check_scenario(tx, scenario_id, &project_id)?;
            }
            if let Some(personas) = &patch.persona_ids {
                check_personas(tx, personas, &project_id)?;
            }
            if let Some(e) = &patch.evaluators {
                check_judges(tx, &e.judges, &project_id)?;
            }
            let mut after = before.clone();
            if let Some(v) = &patch.name {
                after.name = v.clone();
            }
            if let Some(v) = &patch.description {
                after.description = v.clone();
            }
            if let Some(v) = &patch.channel_id {
                after.channel_id = v.clone();
            }
            if let Some(v) = &patch.scenario_id {
                after.scenario_id = v.clone();
            }
            if let Some(v) = &patch.persona_ids {
                after.persona_ids = v.clone();
            }
            if let Some(v) = patch.iterations.and_then(std::num::NonZeroU32::new) {
                after.iterations = v;
            }
            if let Some(e) = &patch.evaluators {
                after.evaluators = e.list.clone();
            }
            if let Some(v) = patch.pass_threshold {
                after.pass_threshold = v;
            }
            if let Some(v) = &patch.tags {
                after.tags = v.clone();
            }
            // Who calls is decided by the personas and the scenario: when
            // either is given, the result must still have a caller.
            if patch.persona_ids.is_some() || patch.scenario_id.is_some() {
                check_someone_calls(tx, &after.persona_ids, &after.scenario_id)?;
            }
            // And its results' evaluations must still have names of their own.
            if patch.evaluators.is_some() || patch.scenario_id.is_some() {
                check_names_apart(tx, &after.evaluators, &after.scenario_id, patch.evaluators.is_some())?;
            }
            let before_shown = shown(&before)?;
            let changes: Map<String, Value> =
                shown(&after)?.into_iter().filter(|(k, v)| before_shown.get(k) != Some(v)).collect();
            if changes.is_empty() {
                return Ok(before);
            }
            // A document holds no times: of the test's [`Parts`], only its evaluators.
            let document = serde_json::value::to_raw_value(&after.evaluators)
                .and_then(|evaluators| document_with(&after, &evaluators))
                .map_err(|e| Failure::from(conversion(5, e)))?;
            tx.execute(
                "UPDATE tests SET name = ?2, channel_id = ?3, scenario_id = ?4, document = ?5, updated_at = ?6,
                                 iterations = ?7, pass_threshold = ?8
                 WHERE id = ?1",
                params![
                    path.id,
                    after.name,
                    after.channel_id,
                    after.scenario_id,
                    document,
                    ids::format_time(&ids::now()),
                    after.iterations.get(),
                    after.pass_threshold
                ],
            )?;
            if changes.contains_key("persona_ids") {
                write_personas(tx, &path.id, &after.persona_ids)?;
            }
            if let Some(e) = &patch.evaluators {
                write_judges(tx, &path.id, &e.judges)?;
            }
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "test.update",
                    resource_type: "test",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!(
                        "updated test \"{}\" ({})",
                        after.name,
                        changes.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                    ),
                    changes: Value::Object(changes).into(),
                },
            )?;
            let test = load(tx, &path.id)?;
            serve(tx, &test)?;
            Ok(test)
        })
        .await
}

#[cfg(test)]
mod unit {
    use super::*;

    fn invalid<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Failure::Invalid { code, message }) => format!("{code}: {message}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn fields_are_bounded_and_named() {
        assert_eq!(iterations(1).unwrap(), 1);
        assert_eq!(iterations(MAX_ITERATIONS).unwrap(), MAX_ITERATIONS);
        assert!(invalid(iterations(101)).starts_with("invalid_iterations: iterations:"));
        assert!(pass_threshold(0.0).is_ok() && pass_threshold(1.0).is_ok());
        for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
            assert!(invalid(pass_threshold(bad)).starts_with("invalid_pass_threshold: pass_threshold:"), "{bad}");
        }
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(persona_ids(&ids(&["per_b", "per_a"])).unwrap(), ids(&["per_b", "per_a"]));
        assert!(invalid(persona_ids(&ids(&["per_a", "per_b", "per_a"])))
            .starts_with("invalid_persona_ids: persona_ids[2]:"));
        let many: Vec<String> = (0..=MAX_PERSONAS).map(|i| format!("per_{i}")).collect();
        assert!(invalid(persona_ids(&many)).starts_with("invalid_persona_ids: persona_ids:"));
    }

    #[test]
    fn judges_are_found_with_their_field() {
        let list: Vec<types::Evaluator> = serde_json::from_value(json!([
            {"type": "contains", "name": "a", "text": "hello"},
            {"type": "llm_judge", "name": "b", "integration_id": "int_1", "prompt": "ok?"}
        ]))
        .unwrap();
        let checked = checked_evaluators(list).unwrap();
        assert_eq!(checked.list.len(), 2);
        assert_eq!(checked.judges, vec![("evaluators[1].integration_id".to_string(), "int_1".to_string())]);
        let twice: Vec<types::Evaluator> = serde_json::from_value(json!([
            {"type": "agent_ended_call", "name": "x"}, {"type": "agent_ended_call", "name": "x"}
        ]))
        .unwrap();
        assert!(invalid(checked_evaluators(twice)).starts_with("invalid_name: evaluators[1].name:"));
    }

    /// What a create writes from [`Parts`] is, byte for byte, what the
    /// generated type and [`TestDoc`] serialize to, for every kind of
    /// evaluator, text that needs escaping, times with and without a
    /// fraction, and an update's later `updated_at`.
    #[test]
    fn written_test_is_the_generated_types_json() {
        let evaluators: Vec<types::Evaluator> = serde_json::from_value(json!([
            {"type": "contains", "name": "a \"quoted\" name", "text": "hello\nthere \u{e9}"},
            {"type": "not_contains", "name": "b", "text": "sorry"},
            {"type": "regex", "name": "c", "pattern": "\\d{3}-\\d{4}"},
            {"type": "max_latency_ms", "name": "d", "ms": 1500, "percentile": "p95"},
            {"type": "max_turns", "name": "e", "turns": 12},
            {"type": "agent_ended_call", "name": "f"},
            {"type": "tool_called", "name": "g", "tool": "book", "arguments": {"day": "mon", "n": [1, 2.5, null]}},
            {"type": "llm_judge", "name": "h", "integration_id": "int_1", "prompt": "polite?\ttab"}
        ]))
        .unwrap();
        let at = |s: &str| ids::parse_time(s).unwrap();
        let mut tests = Vec::new();
        for (created, updated, evaluators, tags, personas) in [
            ("2026-11-25T04:49:01.433677Z", "2026-11-25T04:49:01.433677Z", evaluators.clone(), vec!["x", "y z"], 2),
            ("2026-11-25T04:49:01Z", "2026-11-25T04:49:01Z", Vec::new(), vec![], 0),
            ("2026-11-25T04:49:01.430Z", "2026-11-26T00:00:00.000001Z", evaluators, vec!["\u{1f600}"], 1),
        ] {
            tests.push(types::Test {
                id: "tst_1".into(),
                project_id: "prj_1".into(),
                name: "books \"a\" cleaning\\".into(),
                channel_id: "chn_1".into(),
                scenario_id: "scn_1".into(),
                persona_ids: (0..personas).map(|i| format!("per_{i}")).collect(),
                description: "line one\nline two \u{7f} </script>".into(),
                iterations: std::num::NonZeroU32::new(3).unwrap(),
                evaluators,
                pass_threshold: 0.67,
                tags: tags.into_iter().map(String::from).collect(),
                created_at: at(created),
                updated_at: at(updated),
            });
        }
        for test in &tests {
            let parts = Parts::of(test).unwrap();
            assert_eq!(served_with(test, &parts).unwrap(), serde_json::to_string(test).unwrap());
            assert_eq!(served(test).unwrap(), serde_json::to_string(test).unwrap());
            let doc = TestDoc {
                description: test.description.clone(),
                iterations: test.iterations.get(),
                evaluators: test.evaluators.clone(),
                pass_threshold: test.pass_threshold,
                tags: test.tags.clone(),
            };
            assert_eq!(document_with(test, &parts.evaluators).unwrap(), serde_json::to_string(&doc).unwrap());
            assert_eq!(
                serde_json::to_string(&Shown::with(test, &*parts.evaluators)).unwrap(),
                serde_json::to_string(&Shown::of(test)).unwrap()
            );
        }
    }

    /// A page of a project's tests is read in order from `tests_by_project`:
    /// no sort, and no scan of the project's other tests (see `page_sql`). A
    /// filter that stops the index from serving the order would show here.
    #[test]
    fn a_project_page_reads_its_tests_in_index_order() {
        crate::personas::tests::with_users_of_a_persona(3, |tx| {
            for (after, search) in [(false, "(project_id=?)"), (true, "(project_id=? AND id<?)")] {
                let sql = page_sql(true, [false, false, false, after]);
                let mut explain = tx.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let nulls = vec![rusqlite::types::Null; explain.parameter_count()];
                let plan = explain
                    .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                assert_eq!(plan, [format!("SEARCH t USING INDEX tests_by_project {search}")], "{sql}");
            }
            Ok(())
        });
    }

    /// Every statement a page of tests runs, with a project or across the
    /// caller's, any filters, after a cursor or not, reads an index in
    /// order: none sorts the tests of every project of the caller's.
    #[test]
    fn no_page_of_tests_sorts() {
        crate::personas::tests::with_users_of_a_persona(3, |tx| {
            for served in [true, false] {
                for n in 0..16 {
                    let given = [n & 1 != 0, n & 2 != 0, n & 4 != 0, n & 8 != 0];
                    let sql = page_sql(served, given);
                    let steps = crate::pagination::tests::plan(tx, &sql)?;
                    assert!(!steps.iter().any(|s| s.contains("TEMP B-TREE")), "{sql}\n{steps:#?}");
                }
            }
            Ok(())
        });
    }

    #[test]
    fn batches_including_a_test_are_named() {
        crate::personas::tests::with_users_of_a_persona(1, |tx| {
            assert!(referrers(tx, "tst_00")?.is_empty());
            for i in 0..12 {
                tx.execute(
                    "INSERT INTO batches VALUES (?1, 'prj_1', ?2, '', 10, 't', 't')",
                    params![format!("bat_{i:02}"), format!("suite {i}")],
                )?;
                // The same test twice in one batch is named once.
                for position in 0..2 {
                    tx.execute(
                        "INSERT INTO batch_tests VALUES (?1, ?2, 'tst_00')",
                        params![format!("bat_{i:02}"), position],
                    )?;
                }
                if i == 0 {
                    assert_eq!(referrers(tx, "tst_00")?, ["batch bat_00 \"suite 0\""]);
                }
            }
            let named = referrers(tx, "tst_00")?;
            assert_eq!(named.len(), SHOWN + 1);
            assert_eq!(named[SHOWN], "others");
            Ok(())
        });
    }
}
