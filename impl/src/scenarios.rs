//! Scenarios: what the caller wants, and what counts as success.
//!
//! `scripted` scenarios have fixed caller lines (`steps`, at least one, each
//! with the checks on the agent's reply); `simulated` ones an LLM playing the
//! persona toward `goal` (required), and no steps. `success_criteria` apply
//! to the whole conversation. Every evaluator list is checked when saved
//! (see `evaluators`), and every `llm_judge` must name an `openai_compatible`
//! integration of the same project; those integrations are recorded in
//! `scenario_judges` so they cannot be deleted from under the scenario.
//!
//! A scenario keeps `name`, `mode`, `default_persona_id` (a persona of the
//! same project) and `version` in columns, the rest in `document`. `PUT`
//! replaces the whole editable part (absent optional fields reset to their
//! defaults) and adds 1 to `version`; results keep the version they ran.
//!
//! A result is judged by the scenario's evaluators (a step's named `step N:
//! <name>`, then the success criteria) and its test's, and no two may
//! share a name: a success criterion named as a step's evaluation is a 400,
//! and a `PUT` that names an evaluation as an evaluator of a test playing
//! the scenario a 409 `in_use` naming the test.
//!
//! Viewers and reviewers read; editors and owners create, replace and
//! delete. Deleting a scenario a test still uses is a 409 `in_use`.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use rusqlite::{params, OptionalExtension as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sparring_server::{params as p, types, Caller};

use crate::access::{self, Need};
use crate::activity::{self, Record};
use crate::auth::Actor;
use crate::failure::{Failure, Result};
use crate::pagination::{self, PageRequest, PageSql, AFTER};
use crate::{evaluators, ids, validate, AppState};

pub const DEFAULT_MAX_TURNS: u32 = 20;
pub const MAX_TURNS: u32 = 500;
pub const MAX_DURATION_S: u32 = 3600;
pub const MAX_STEPS: usize = 200;
/// Evaluators in one scenario, its steps' `expect` and `success_criteria`
/// together (each list is also at most `evaluators::MAX_EVALUATORS`)…
pub const MAX_SCENARIO_EVALUATORS: usize = 1000;
/// …of which `regex`: each is compiled when the scenario is saved and in
/// every run, which costs up to milliseconds apiece.
pub const MAX_SCENARIO_REGEXES: usize = 100;
/// How many referrers a 409 `in_use` names.
const SHOWN: usize = 10;

/// The editable fields besides those in columns, as stored in `document`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ScenarioDoc {
    description: String,
    first_message: Option<String>,
    steps: Vec<types::ScenarioStep>,
    goal: Option<String>,
    /// Simulated mode: the `openai_compatible` integration playing the caller.
    #[serde(default)]
    integration_id: Option<String>,
    success_criteria: Vec<types::Evaluator>,
    max_turns: u32,
    /// `None` until the project's default is filled in (in the transaction).
    max_duration_s: Option<u32>,
    tags: Vec<String>,
}

/// The editable part of a scenario, checked.
struct ScenarioInput {
    name: String,
    mode: types::ScenarioMode,
    default_persona_id: Option<String>,
    doc: ScenarioDoc,
    /// Every `llm_judge`: the field naming its integration, and the id.
    judges: Vec<(String, String)>,
}

/// The request fields, the same for create and replace.
struct Given<'a> {
    name: &'a str,
    mode: types::ScenarioMode,
    description: Option<&'a str>,
    first_message: Option<&'a str>,
    steps: &'a [types::ScenarioStep],
    goal: Option<&'a str>,
    integration_id: Option<&'a str>,
    success_criteria: &'a [types::Evaluator],
    default_persona_id: Option<&'a str>,
    max_turns: Option<u32>,
    max_duration_s: Option<u32>,
    tags: Vec<String>,
}

/// The `llm_judge` evaluators of a list: the field of each integration id,
/// and the id.
fn judges_of(list: &str, evaluators: &[types::Evaluator]) -> Vec<(String, String)> {
    evaluators
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            types::Evaluator::LlmJudge { integration_id, .. } => {
                Some((format!("{list}[{i}].integration_id"), integration_id.clone()))
            }
            _ => None,
        })
        .collect()
}

impl ScenarioInput {
    fn parse(g: Given<'_>) -> Result<ScenarioInput> {
        let name = validate::name("name", g.name)?;
        let description = validate::text("description", g.description.unwrap_or(""), validate::MAX_DESCRIPTION)?;
        let first_message = g
            .first_message
            .map(|m| {
                if m.trim().is_empty() {
                    return Err(Failure::invalid(
                        "first_message",
                        "must not be empty or blank; leave it out when the agent greets first",
                    ));
                }
                validate::text("first_message", m, validate::MAX_PROMPT)
            })
            .transpose()?;
        let goal = g.goal.map(|m| validate::required_text("goal", m, validate::MAX_PROMPT)).transpose()?;
        let mut judges = Vec::new();
        match g.mode {
            types::ScenarioMode::Scripted => {
                if g.steps.is_empty() {
                    return Err(Failure::invalid("steps", "a scripted scenario needs at least one step"));
                }
                if g.integration_id.is_some() {
                    return Err(Failure::invalid(
                        "integration_id",
                        "only a simulated scenario has an integration playing the caller; leave it out in scripted mode",
                    ));
                }
            }
            types::ScenarioMode::Simulated => {
                if goal.is_none() {
                    return Err(Failure::invalid(
                        "goal",
                        "is required for a simulated scenario: what the caller tries to achieve",
                    ));
                }
                if !g.steps.is_empty() {
                    return Err(Failure::invalid(
                        "steps",
                        "a simulated scenario has no steps (the LLM plays the persona toward `goal`); \
                         use mode `scripted` for fixed caller lines",
                    ));
                }
                match g.integration_id {
                    None => {
                        return Err(Failure::invalid(
                            "integration_id",
                            "is required for a simulated scenario: the `openai_compatible` integration whose model \
                             plays the caller",
                        ))
                    }
                    Some(id) => judges.push(("integration_id".to_string(), id.to_string())),
                }
            }
        }
        if g.steps.len() > MAX_STEPS {
            return Err(Failure::invalid("steps", format_args!("at most {MAX_STEPS} steps, got {}", g.steps.len())));
        }
        // Counted before any is compiled.
        let all = || g.steps.iter().flat_map(|s| s.expect.iter()).chain(g.success_criteria.iter());
        let total = all().count();
        if total > MAX_SCENARIO_EVALUATORS {
            return Err(Failure::invalid(
                "steps",
                format_args!(
                    "at most {MAX_SCENARIO_EVALUATORS} evaluators in a scenario (steps' `expect` and \
                     `success_criteria` together), got {total}"
                ),
            ));
        }
        let regexes = all().filter(|e| matches!(e, types::Evaluator::Regex { .. })).count();
        if regexes > MAX_SCENARIO_REGEXES {
            return Err(Failure::invalid(
                "steps",
                format_args!(
                    "at most {MAX_SCENARIO_REGEXES} `regex` evaluators in a scenario (steps' `expect` and \
                     `success_criteria` together), got {regexes}"
                ),
            ));
        }
        for (i, step) in g.steps.iter().enumerate() {
            validate::required_text(format_args!("steps[{i}].say"), &step.say, validate::MAX_PROMPT)?;
            let field = format!("steps[{i}].expect");
            evaluators::check_list(&field, &step.expect)?;
            judges.extend(judges_of(&field, &step.expect));
        }
        evaluators::check_list("success_criteria", g.success_criteria)?;
        judges.extend(judges_of("success_criteria", g.success_criteria));
        check_names_apart(g.steps, g.success_criteria)?;
        let max_turns = validate::range("max_turns", g.max_turns.unwrap_or(DEFAULT_MAX_TURNS), 1, MAX_TURNS)?;
        let max_duration_s =
            g.max_duration_s.map(|d| validate::range("max_duration_s", d, 1, MAX_DURATION_S)).transpose()?;
        let tags = validate::tags("tags", &g.tags)?;
        Ok(ScenarioInput {
            name,
            mode: g.mode,
            default_persona_id: g.default_persona_id.map(str::to_string),
            doc: ScenarioDoc {
                description,
                first_message,
                steps: g.steps.to_vec(),
                goal,
                integration_id: g.integration_id.map(str::to_string),
                success_criteria: g.success_criteria.to_vec(),
                max_turns,
                max_duration_s,
                tags,
            },
            judges,
        })
    }

    /// In the transaction: the references (persona, judges) must be of
    /// `project_id`, and an absent `max_duration_s` takes the project's.
    fn resolve(&mut self, tx: &rusqlite::Transaction<'_>, project_id: &str) -> Result<()> {
        if let Some(persona) = &self.default_persona_id {
            access::require_reference(tx, "personas", "default_persona_id", persona, project_id)?;
        }
        for (field, id) in &self.judges {
            evaluators::check_judges(tx, field, &BTreeSet::from([id.clone()]), project_id)?;
        }
        if self.doc.max_duration_s.is_none() {
            let project_default: u32 =
                tx.query_row("SELECT max_call_duration_s FROM projects WHERE id = ?1", params![project_id], |r| {
                    r.get(0)
                })?;
            self.doc.max_duration_s = Some(project_default.clamp(1, MAX_DURATION_S));
        }
        Ok(())
    }

    /// The names of the evaluations it gives each result (see
    /// [`evaluators::scenario_evaluations`]).
    fn evaluations(&self) -> Vec<(String, String)> {
        evaluations_of(&self.doc.steps, &self.doc.success_criteria)
    }

    fn judge_ids(&self) -> BTreeSet<&str> {
        self.judges.iter().map(|(_, id)| id.as_str()).collect()
    }

    /// The scenario as the activity log shows it (every editable field).
    fn shown(&self) -> Map<String, Value> {
        let mut v = match serde_json::to_value(&self.doc) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        v.insert("name".into(), json!(self.name));
        v.insert("mode".into(), json!(self.mode));
        v.insert("default_persona_id".into(), json!(self.default_persona_id));
        v
    }
}

fn evaluations_of(steps: &[types::ScenarioStep], criteria: &[types::Evaluator]) -> Vec<(String, String)> {
    let steps: Vec<Vec<&str>> = steps.iter().map(|s| s.expect.iter().map(evaluators::name_of).collect()).collect();
    let criteria: Vec<&str> = criteria.iter().map(evaluators::name_of).collect();
    evaluators::scenario_evaluations(&steps, &criteria)
}

/// Each list's names differ (`evaluators::check_list`), and so do those of
/// different steps (numbered): a success criterion can still be named as a
/// step's evaluation is in results (`step 1: confirms`). 400 naming it.
fn check_names_apart(steps: &[types::ScenarioStep], criteria: &[types::Evaluator]) -> Result<()> {
    let evaluations = evaluations_of(steps, criteria);
    let mut seen = std::collections::HashMap::with_capacity(evaluations.len());
    for (name, at) in &evaluations {
        if let Some(first) = seen.insert(name.as_str(), at.as_str()) {
            return Err(Failure::invalid(
                &format!("{at}.name"),
                format_args!("`{name}` is also the name results give {first}; {}", evaluators::NAMES_APART),
            ));
        }
    }
    Ok(())
}

/// The names of the evaluations scenario `id` gives each result (see
/// [`evaluators::scenario_evaluations`]), read from its stored document for
/// its evaluators' names only.
pub fn evaluation_names(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Vec<(String, String)>> {
    #[derive(Deserialize)]
    struct Names {
        steps: Vec<StepNames>,
        success_criteria: Vec<evaluators::Named>,
    }
    #[derive(Deserialize)]
    struct StepNames {
        expect: Vec<evaluators::Named>,
    }
    let document: String =
        tx.prepare_cached("SELECT document FROM scenarios WHERE id = ?1")?.query_row(params![id], |r| r.get(0))?;
    let names: Names = serde_json::from_str(&document).map_err(|e| Failure::from(conversion(0, e)))?;
    let steps: Vec<Vec<&str>> =
        names.steps.iter().map(|s| s.expect.iter().map(|e| e.name.as_str()).collect()).collect();
    let criteria: Vec<&str> = names.success_criteria.iter().map(|e| e.name.as_str()).collect();
    Ok(evaluators::scenario_evaluations(&steps, &criteria))
}

/// A result of a test is judged by its scenario's evaluators and the
/// test's: a change that gives one of the scenario's evaluations the name
/// of an evaluator of a test that plays it is a 409 `in_use` naming those
/// tests (at most 5, then "others").
fn check_no_test_has_a_name(tx: &rusqlite::Transaction<'_>, scenario_id: &str, input: &ScenarioInput) -> Result<()> {
    #[derive(Deserialize)]
    struct TestNames {
        evaluators: Vec<evaluators::Named>,
    }
    let evaluations = input.evaluations();
    let taken: std::collections::HashMap<&str, &str> =
        evaluations.iter().map(|(name, at)| (name.as_str(), at.as_str())).collect();
    let mut named = Vec::new();
    let mut query = tx.prepare_cached("SELECT id, name, document FROM tests WHERE scenario_id = ?1 ORDER BY id")?;
    let mut rows = query.query(params![scenario_id])?;
    while let Some(row) = rows.next()? {
        let document: String = row.get(2)?;
        let test: TestNames = serde_json::from_str(&document).map_err(|e| Failure::from(conversion(2, e)))?;
        let Some((name, at)) = test.evaluators.iter().find_map(|e| taken.get_key_value(e.name.as_str())) else {
            continue;
        };
        if named.len() == 5 {
            named.push("others".to_string());
            break;
        }
        let (id, test_name): (String, String) = (row.get(0)?, row.get(1)?);
        named.push(format!("test {id} {test_name:?} (`{name}`, the name results give {at})"));
    }
    if named.is_empty() {
        return Ok(());
    }
    Err(Failure::Conflict {
        code: "in_use",
        message: format!(
            "evaluators of tests that play this scenario have the names of its evaluations: {}; {}: rename them \
             here or in those tests first",
            named.join(", "),
            evaluators::NAMES_APART
        ),
    })
}

fn write_judges(tx: &rusqlite::Transaction<'_>, scenario_id: &str, judges: &BTreeSet<&str>) -> Result<()> {
    tx.execute("DELETE FROM scenario_judges WHERE scenario_id = ?1", params![scenario_id])?;
    let mut insert = tx.prepare_cached("INSERT INTO scenario_judges (scenario_id, integration_id) VALUES (?1, ?2)")?;
    for id in judges {
        insert.execute(params![scenario_id, id])?;
    }
    Ok(())
}

// Reading.

const COLUMNS: &str = "s.id, s.project_id, s.name, s.mode, s.default_persona_id, s.version, s.document, \
                       s.created_at, s.updated_at";

fn conversion(column: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.to_string().into())
}

fn nonzero(column: usize, n: u32) -> rusqlite::Result<std::num::NonZeroU32> {
    std::num::NonZeroU32::new(n).ok_or_else(|| conversion(column, "zero"))
}

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Scenario> {
    let time = |i: usize| row.get::<_, String>(i).map(|s| ids::parse_time(&s).unwrap_or_default());
    let mode: String = row.get(3)?;
    let document: String = row.get(6)?;
    let d: ScenarioDoc = serde_json::from_str(&document).map_err(|e| conversion(6, e))?;
    Ok(types::Scenario {
        id: row.get(0)?,
        project_id: row.get(1)?,
        name: row.get(2)?,
        mode: mode.parse().map_err(|e| conversion(3, e))?,
        default_persona_id: row.get(4)?,
        version: nonzero(5, row.get(5)?)?,
        description: d.description,
        first_message: d.first_message,
        steps: d.steps,
        goal: d.goal,
        integration_id: d.integration_id,
        success_criteria: d.success_criteria,
        max_turns: nonzero(6, d.max_turns)?,
        max_duration_s: nonzero(6, d.max_duration_s.unwrap_or(0))?,
        tags: d.tags,
        created_at: time(7)?,
        updated_at: time(8)?,
    })
}

/// The statement [`load`] reads a scenario with.
static LOAD_SQL: LazyLock<String> = LazyLock::new(|| format!("SELECT {COLUMNS} FROM scenarios s WHERE s.id = ?1"));

pub(crate) fn load(tx: &rusqlite::Connection, id: &str) -> Result<types::Scenario> {
    tx.prepare_cached(&LOAD_SQL)?
        .query_row(params![id], from_row)
        .optional()?
        .ok_or_else(|| Failure::not_found("scenario", id))
}

/// The ids of a page of one project's scenarios (`?1`), newest first, in
/// the mode `?2` and with the tag `?3` (all when NULL), after the cursor
/// `?4`, at most `?5` (see [`PageSql`]): in order from
/// `scenarios_by_project`, no sort, and the walk stops at the limit.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT s.id FROM scenarios s
             WHERE s.project_id = ?1 AND (?2 IS NULL OR s.mode = ?2)
               AND (?3 IS NULL OR EXISTS (SELECT 1 FROM json_each(s.document, '$.tags') WHERE value = ?3))
               {AFTER}
             ORDER BY s.id DESC LIMIT ?5"
        ),
        "AND s.id < ?4",
    )
});

/// A page is merged from one walk per project of the caller's (only the
/// one asked for, when it is), each stopped at the page's size: one
/// statement over all of them sorted every scenario of every project of
/// theirs (after the cursor) for each page.
pub async fn list(state: &AppState, caller: Caller, query: p::ListScenariosQuery) -> Result<types::ScenarioList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "scn").map_err(|e| Failure::invalid("cursor", e))?;
    let mode = query.mode.map(|m| m.to_string());
    state
        .store
        .read(move |tx| {
            let ids = pagination::ids_across_projects(
                tx,
                &caller.user_id,
                query.project_id.as_deref(),
                LIST_SQL.of(&page),
                &page,
                params![mode, query.tag, page.after, page.fetch_limit()],
            )?;
            // A scenario is up to a request body in size: the page ends
            // early past `PAGE_BYTES` of their documents.
            let rows = pagination::read_sized(tx, &LOAD_SQL, &ids, 6, from_row)?;
            let page = page.finish_sized(rows, |(_, size)| *size, |(s, _)| s.id.clone());
            let scenarios = page.items.into_iter().map(|(s, _)| s).collect();
            Ok(types::ScenarioList { scenarios, next_cursor: page.next_cursor })
        })
        .await
}

fn tag_strings<T: std::ops::Deref<Target = String>>(tags: &[T]) -> Vec<String> {
    tags.iter().map(|t| t.to_string()).collect()
}

pub async fn create(state: &AppState, caller: Caller, body: types::CreateScenarioRequest) -> Result<types::Scenario> {
    let mut input = ScenarioInput::parse(Given {
        name: &body.name,
        mode: body.mode,
        description: body.description.as_deref().map(String::as_str),
        first_message: body.first_message.as_deref().map(String::as_str),
        steps: &body.steps,
        goal: body.goal.as_deref().map(String::as_str),
        integration_id: body.integration_id.as_deref(),
        success_criteria: &body.success_criteria,
        default_persona_id: body.default_persona_id.as_deref(),
        max_turns: body.max_turns.map(|n| n.get()),
        max_duration_s: body.max_duration_s.map(|n| n.get()),
        tags: tag_strings(&body.tags),
    })?;
    let id = ids::new_id("scn");
    let project_id = body.project_id;
    state
        .store
        .write(move |tx| {
            access::require(tx, &caller.user_id, &project_id, Need::Edit)?;
            input.resolve(tx, &project_id)?;
            let document = serde_json::to_string(&input.doc).map_err(|e| Failure::from(conversion(6, e)))?;
            let now = ids::format_time(&ids::now());
            tx.execute(
                "INSERT INTO scenarios (id, project_id, name, mode, default_persona_id, version, document,
                                        created_at, updated_at, max_duration_s)
                 VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?7, ?8)",
                params![
                    id,
                    project_id,
                    input.name,
                    input.mode.to_string(),
                    input.default_persona_id,
                    document,
                    now,
                    input.doc.max_duration_s
                ],
            )?;
            write_judges(tx, &id, &input.judge_ids())?;
            let mut changes = input.shown();
            changes.insert("version".into(), json!(1));
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "scenario.create",
                    resource_type: "scenario",
                    resource_id: &id,
                    project_id: Some(&project_id),
                    summary: format!("created {} scenario \"{}\"", input.mode, input.name),
                    changes: Value::Object(changes).into(),
                },
            )?;
            load(tx, &id)
        })
        .await
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetScenarioPath) -> Result<types::Scenario> {
    state
        .store
        .read(move |tx| {
            access::require_resource(tx, &caller.user_id, "scenarios", "scenario", &path.id, Need::Read)?;
            load(tx, &path.id)
        })
        .await
}

/// A test that names no personas plays its scenario's default persona
/// (`POST` and `PATCH /tests` refuse one whose scenario has none), so the
/// default cannot be taken away from under such a test.
fn check_no_test_needs_the_default(tx: &rusqlite::Transaction<'_>, scenario_id: &str) -> Result<()> {
    let tests: Vec<(String, String)> = tx
        .prepare_cached(
            "SELECT t.id, t.name FROM tests t WHERE t.scenario_id = ?1
               AND NOT EXISTS (SELECT 1 FROM test_personas p WHERE p.test_id = t.id)
             ORDER BY t.id LIMIT 6",
        )?
        .query_map(params![scenario_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if tests.is_empty() {
        return Ok(());
    }
    let mut named: Vec<String> = tests.iter().take(5).map(|(id, name)| format!("test {id} {name:?}")).collect();
    if tests.len() > 5 {
        named.push("others".into());
    }
    Err(Failure::Conflict {
        code: "in_use",
        message: format!(
            "`default_persona_id` is played by {} (naming no personas); keep it, or give those tests \
             `persona_ids` first",
            named.join(", ")
        ),
    })
}

/// `PUT`: replaces the editable part (absent optional fields reset to their
/// defaults) and adds 1 to the version, even when nothing else changed.
pub async fn replace(
    state: &AppState,
    caller: Caller,
    path: p::ReplaceScenarioPath,
    body: types::ReplaceScenarioRequest,
) -> Result<types::Scenario> {
    let mut input = ScenarioInput::parse(Given {
        name: &body.name,
        mode: body.mode,
        description: body.description.as_deref().map(String::as_str),
        first_message: body.first_message.as_deref().map(String::as_str),
        steps: &body.steps,
        goal: body.goal.as_deref().map(String::as_str),
        integration_id: body.integration_id.as_deref(),
        success_criteria: &body.success_criteria,
        default_persona_id: body.default_persona_id.as_deref(),
        max_turns: body.max_turns.map(|n| n.get()),
        max_duration_s: body.max_duration_s.map(|n| n.get()),
        tags: tag_strings(&body.tags),
    })?;
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "scenarios", "scenario", &path.id, Need::Edit)?;
            input.resolve(tx, &project_id)?;
            let before = load(tx, &path.id)?;
            if input.default_persona_id.is_none() {
                check_no_test_needs_the_default(tx, &path.id)?;
            }
            check_no_test_has_a_name(tx, &path.id, &input)?;
            let version = before.version.get().checked_add(1).ok_or_else(|| Failure::Conflict {
                code: "version_limit",
                message: "this scenario cannot take another version; create a new one".into(),
            })?;
            let document = serde_json::to_string(&input.doc).map_err(|e| Failure::from(conversion(6, e)))?;
            tx.execute(
                "UPDATE scenarios SET name = ?2, mode = ?3, default_persona_id = ?4, version = ?5, document = ?6,
                        updated_at = ?7, max_duration_s = ?8
                 WHERE id = ?1",
                params![
                    path.id,
                    input.name,
                    input.mode.to_string(),
                    input.default_persona_id,
                    version,
                    document,
                    ids::format_time(&ids::now()),
                    input.doc.max_duration_s
                ],
            )?;
            write_judges(tx, &path.id, &input.judge_ids())?;
            // What changed: the fields whose value differs from before.
            let before_shown = match serde_json::to_value(&before) {
                Ok(Value::Object(m)) => m,
                _ => Map::new(),
            };
            let mut changes: Map<String, Value> =
                input.shown().into_iter().filter(|(k, v)| before_shown.get(k) != Some(v)).collect();
            changes.insert("version".into(), json!({"from": before.version.get(), "to": version}));
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "scenario.update",
                    resource_type: "scenario",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("replaced scenario \"{}\" (version {version})", input.name),
                    changes: Value::Object(changes).into(),
                },
            )?;
            load(tx, &path.id)
        })
        .await
}

/// The tests that use a scenario (at most [`SHOWN`], then "others").
fn referrers(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<Vec<String>> {
    let mut using: Vec<String> = tx
        .prepare_cached("SELECT id, name FROM tests WHERE scenario_id = ?1 ORDER BY id LIMIT ?2")?
        .query_map(params![id, SHOWN as i64 + 1], |r| {
            Ok(format!("test {} \"{}\"", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    if using.len() > SHOWN {
        using.truncate(SHOWN);
        using.push("others".into());
    }
    Ok(using)
}

pub async fn delete(state: &AppState, caller: Caller, path: p::DeleteScenarioPath) -> Result<types::Deleted> {
    state
        .store
        .write(move |tx| {
            let (project_id, _) =
                access::require_resource(tx, &caller.user_id, "scenarios", "scenario", &path.id, Need::Edit)?;
            let using = referrers(tx, &path.id)?;
            if !using.is_empty() {
                return Err(Failure::in_use("scenario", &path.id, &using));
            }
            crate::runs::refuse_if_runs_bound(tx, &project_id, "scenario", crate::runs::BoundTo::Scenario(&path.id))?;
            let name: String =
                tx.query_row("SELECT name FROM scenarios WHERE id = ?1", params![path.id], |r| r.get(0))?;
            // Its judges go with it (ON DELETE CASCADE).
            tx.execute("DELETE FROM scenarios WHERE id = ?1", params![path.id])?;
            activity::record(
                tx,
                &Actor::Caller(caller),
                Record {
                    action: "scenario.delete",
                    resource_type: "scenario",
                    resource_id: &path.id,
                    project_id: Some(&project_id),
                    summary: format!("deleted scenario \"{name}\""),
                    changes: json!({"deleted": true}).into(),
                },
            )?;
            Ok(types::Deleted { id: path.id, deleted: true })
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluators(v: Value) -> Vec<types::Evaluator> {
        serde_json::from_value(v).unwrap()
    }

    fn steps(v: Value) -> Vec<types::ScenarioStep> {
        serde_json::from_value(v).unwrap()
    }

    fn given<'a>(mode: types::ScenarioMode, steps: &'a [types::ScenarioStep], goal: Option<&'a str>) -> Given<'a> {
        Given {
            name: "s",
            mode,
            description: None,
            first_message: None,
            steps,
            goal,
            integration_id: (mode == types::ScenarioMode::Simulated).then_some("int_caller"),
            success_criteria: &[],
            default_persona_id: None,
            max_turns: None,
            max_duration_s: None,
            tags: Vec::new(),
        }
    }

    fn invalid(r: Result<ScenarioInput>) -> String {
        match r {
            Err(Failure::Invalid { code, message }) => format!("{code}: {message}"),
            Err(other) => panic!("expected invalid, got {other:?}"),
            Ok(_) => panic!("expected invalid, got a scenario"),
        }
    }

    #[test]
    fn tests_using_a_scenario_are_named() {
        crate::personas::tests::with_users_of_a_persona(2, |tx| {
            assert_eq!(referrers(tx, "scn_1")?, ["test tst_00 \"flow 0\"", "test tst_01 \"flow 1\""]);
            assert!(referrers(tx, "scn_2")?.is_empty());
            Ok(())
        });
    }

    #[test]
    fn modes_decide_steps_and_goal() {
        use types::ScenarioMode::{Scripted, Simulated};
        let one = steps(json!([{"say": "hi", "expect": []}]));
        assert!(ScenarioInput::parse(given(Scripted, &one, None)).is_ok());
        assert!(invalid(ScenarioInput::parse(given(Scripted, &[], None))).starts_with("invalid_steps: steps:"));
        assert!(ScenarioInput::parse(given(Simulated, &[], Some("book a table"))).is_ok());
        assert!(invalid(ScenarioInput::parse(given(Simulated, &[], None))).starts_with("invalid_goal: goal:"));
        assert!(invalid(ScenarioInput::parse(given(Simulated, &[], Some(" ")))).starts_with("invalid_goal: goal:"));
        assert!(invalid(ScenarioInput::parse(given(Simulated, &one, Some("x")))).starts_with("invalid_steps:"));
        let no_llm = Given { integration_id: None, ..given(Simulated, &[], Some("book a table")) };
        assert!(invalid(ScenarioInput::parse(no_llm)).starts_with("invalid_integration_id: integration_id:"));
        let scripted_llm = Given { integration_id: Some("int_1"), ..given(Scripted, &one, None) };
        assert!(invalid(ScenarioInput::parse(scripted_llm)).starts_with("invalid_integration_id: integration_id:"));
        let blank = steps(json!([{"say": "hi", "expect": []}, {"say": "  ", "expect": []}]));
        assert!(invalid(ScenarioInput::parse(given(Scripted, &blank, None))).starts_with("invalid_say: steps[1].say:"));
    }

    #[test]
    fn judges_are_found_with_their_field() {
        let s = steps(json!([
            {"say": "hi", "expect": [
                {"type": "contains", "name": "a", "text": "hello"},
                {"type": "llm_judge", "name": "b", "integration_id": "int_1", "prompt": "ok?"}
            ]}
        ]));
        let criteria =
            evaluators(json!([{"type": "llm_judge", "name": "c", "integration_id": "int_2", "prompt": "ok?"}]));
        let mut g = given(types::ScenarioMode::Scripted, &s, None);
        g.success_criteria = &criteria;
        let input = ScenarioInput::parse(g).unwrap();
        assert_eq!(
            input.judges,
            vec![
                ("steps[0].expect[1].integration_id".to_string(), "int_1".to_string()),
                ("success_criteria[0].integration_id".to_string(), "int_2".to_string()),
            ]
        );
        assert_eq!(input.doc.max_turns, DEFAULT_MAX_TURNS);
    }
}
