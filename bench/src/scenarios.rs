//! The scenarios: what each sends, what it must answer, and its target.
//!
//! Each is a wrk script (see [`crate::wrk`]) plus one request sent before
//! the load to check that the scenario measures what it says (a 25-key list,
//! a 50-test page, a 20-turn result), since wrk itself only counts statuses.

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

use crate::seed::{self, ProjectParts, Scale, Seeded};

/// The issue's target for a scenario: requests/s as a share of the
/// baseline's in the same run, and p99 latency, both at 64 connections.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub ratio: f64,
    pub p99_ms: f64,
}

/// The request sent once before the load, and what its answer must hold.
pub struct Check {
    pub method: reqwest::Method,
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Value>,
    pub expect: Expect,
}

/// Says what is wrong with an answer, if anything.
pub type Expect = Box<dyn Fn(&Value) -> anyhow::Result<()> + Send + Sync>;

pub struct Scenario {
    /// For `--only`.
    pub key: &'static str,
    pub title: &'static str,
    pub target: Option<Target>,
    /// `init` and `request` (Lua).
    pub lua: String,
    pub check: Option<Check>,
}

/// A Lua string literal holding `s` as is.
fn lua_str(s: &str) -> String {
    let mut level = String::new();
    while s.contains(&format!("]{level}]")) {
        level.push('=');
    }
    format!("[{level}[{s}]{level}]")
}

fn path_str(p: &Path) -> String {
    lua_str(&p.display().to_string())
}

fn count(v: &Value, field: &str) -> usize {
    v[field].as_array().map_or(0, Vec::len)
}

fn expect_len(field: &'static str, n: usize) -> Expect {
    Box::new(move |v| {
        anyhow::ensure!(count(v, field) == n, "expected {n} `{field}`, got {}: {v}", count(v, field));
        Ok(())
    })
}

/// The files the scripts read: ids one per line, projects as
/// `id\tchannel\tscenario\tpersona`.
pub struct DataFiles {
    pub tests: std::path::PathBuf,
    pub results: std::path::PathBuf,
    pub projects: std::path::PathBuf,
}

pub fn write_data_files(dir: &Path, seeded: &Seeded) -> anyhow::Result<DataFiles> {
    let files = DataFiles {
        tests: dir.join("tests.txt"),
        results: dir.join("results.txt"),
        projects: dir.join("projects.txt"),
    };
    std::fs::write(&files.tests, seeded.test_ids.join("\n"))?;
    std::fs::write(&files.results, seeded.result_ids.join("\n"))?;
    let projects: Vec<String> = seeded
        .projects
        .iter()
        .map(|p| format!("{}\t{}\t{}\t{}", p.id, p.channel_id, p.scenario_id, p.persona_id))
        .collect();
    std::fs::write(&files.projects, projects.join("\n"))?;
    Ok(files)
}

/// `POST /v1/tests` bodies: the seeded tests' shape (see
/// [`seed::test_body`]) as a Lua format string over the project's ids and a
/// per-thread counter, and the Lua arguments that fill it, in the order
/// their places appear in the JSON.
fn post_template() -> anyhow::Result<(String, String)> {
    let p = ProjectParts {
        id: "@P@".into(),
        channel_id: "@C@".into(),
        scenario_id: "@S@".into(),
        persona_id: "@R@".into(),
        test_ids: Vec::new(),
    };
    let mut json = serde_json::to_string(&seed::test_body(&p, "@N@"))?;
    anyhow::ensure!(!json.contains('%'), "the test body must not contain `%`");
    let places = [("@P@", "p[1]"), ("@C@", "p[2]"), ("@S@", "p[3]"), ("@R@", "p[4]"), ("@N@", "tid, n")];
    let mut found: Vec<(usize, &str, &str)> = Vec::new();
    for (place, arg) in places {
        let at = json.find(place).with_context(|| format!("{place} is not in the test body"))?;
        found.push((at, place, arg));
    }
    found.sort();
    for (_, place, _) in &found {
        json = json.replacen(place, if *place == "@N@" { "load %d-%d" } else { "%s" }, 1);
    }
    let args: Vec<&str> = found.iter().map(|(_, _, arg)| *arg).collect();
    Ok((json, args.join(", ")))
}

/// The Lua every scenario's `init` starts with, and the functions that
/// make its requests.
///
/// A `GET` is built once per thread, the first time its kind is asked for
/// (a test's, a result's: one for each id), and each request picks one:
/// a string built per request is garbage, and LuaJIT's collector, catching
/// up with it over the tables of ids, held up a wrk thread's 32
/// connections (bench/HISTORY.md, "wrk's own pauses"). Only `POST` bodies are
/// made per request, since each names a new test. Building a kind takes a
/// thread ~0.1 s for 100,000 results, inside its run, so it can only lower
/// what the run measures.
fn init(files: &DataFiles, headers: &[(&str, &str)]) -> anyhow::Result<String> {
    let hdr: Vec<String> = headers.iter().map(|(k, v)| format!("[ {} ] = {}", lua_str(k), lua_str(v))).collect();
    let (body, args) = post_template()?;
    Ok(format!(
        r#"
post_body = {body}

function init(args)
  math.randomseed(tid * 7919 + os.time())
  hdr = {{ {hdr} }}
  json_hdr = {{ {hdr}, ["content-type"] = "application/json" }}
  projects = {{}}
  for _, l in ipairs(lines({projects})) do projects[#projects + 1] = fields(l) end
  n = 0
  built = {{}}
end

function pick(t) return t[math.random(#t)] end

-- The GET requests of `path`, one for each id `ids()` gives in place of
-- `@ID@` (or the one request, if `path` has no `@ID@`), built once.
function gets(path, ids)
  local t = built[path]
  if t == nil then
    t = {{}}
    local request = wrk.format("GET", path, hdr)
    local at = string.find(request, "@ID@", 1, true)
    if at == nil then
      t[1] = request
    else
      local head, tail = string.sub(request, 1, at - 1), string.sub(request, at + 4)
      for i, id in ipairs(ids()) do t[i] = head .. id .. tail end
    end
    built[path] = t
  end
  return t
end

function test_ids() return lines({tests}) end
function result_ids() return lines({results}) end
function project_ids()
  local t = {{}}
  for i, p in ipairs(projects) do t[i] = p[1] end
  return t
end

function get_test() return pick(gets("/v1/tests/@ID@", test_ids)) end
function get_result() return pick(gets("/v1/test-results/@ID@", result_ids)) end
function list_tests() return pick(gets("/v1/tests?project_id=@ID@&limit=50", project_ids)) end
function list_keys() return pick(gets("/v1/api-keys")) end
function post_test()
  n = n + 1
  local p = pick(projects)
  return wrk.format("POST", "/v1/tests", json_hdr, string.format(post_body, {args}))
end
"#,
        hdr = hdr.join(", "),
        tests = path_str(&files.tests),
        results = path_str(&files.results),
        projects = path_str(&files.projects),
        body = lua_str(&body),
    ))
}

/// The baseline's script: the same hooks, one constant request.
pub fn baseline(files: &DataFiles) -> anyhow::Result<String> {
    Ok(format!(
        "{}\nfunction request() return pick(gets(\"/v1/ping\")) end\n",
        init(files, &[("accept", "application/json")])?
    ))
}

pub fn all(seeded: &Seeded, id_token: &str, files: &DataFiles, scale: &Scale) -> anyhow::Result<Vec<Scenario>> {
    let key = seeded.api_key.as_str();
    let bearer = format!("Bearer {id_token}");
    let with_key = init(files, &[("x-api-key", key)])?;
    let with_token = init(files, &[("authorization", &bearer)])?;
    let script = |init: &str, request: &str| format!("{init}\nfunction request() return {request}() end\n");
    let key_header = vec![("x-api-key", key.to_string())];
    let first_test = seeded.test_ids.first().context("no seeded tests")?.clone();
    let p0 = seeded.projects.first().context("no seeded projects")?.clone();
    let (keys, turns) = (scale.keys, scale.turns);

    let mut out = vec![
        Scenario {
            key: "keys",
            title: "GET /v1/api-keys (x-api-key)",
            target: Some(Target { ratio: 0.6, p99_ms: 3.0 }),
            lua: script(&with_key, "list_keys"),
            check: Some(Check {
                method: reqwest::Method::GET,
                path: "/v1/api-keys".into(),
                headers: key_header.clone(),
                body: None,
                expect: expect_len("keys", keys),
            }),
        },
        Scenario {
            key: "bearer",
            title: "GET /v1/api-keys (bearer ID token)",
            target: Some(Target { ratio: 0.5, p99_ms: 3.0 }),
            lua: script(&with_token, "list_keys"),
            check: Some(Check {
                method: reqwest::Method::GET,
                path: "/v1/api-keys".into(),
                headers: vec![("authorization", bearer.clone())],
                body: None,
                expect: expect_len("keys", keys),
            }),
        },
        Scenario {
            key: "test",
            title: "GET /v1/tests/{id}",
            target: Some(Target { ratio: 0.5, p99_ms: 3.0 }),
            lua: script(&with_key, "get_test"),
            check: Some(Check {
                method: reqwest::Method::GET,
                path: format!("/v1/tests/{first_test}"),
                headers: key_header.clone(),
                body: None,
                expect: Box::new(move |v| {
                    anyhow::ensure!(v["id"] == first_test.as_str(), "not the test asked for: {v}");
                    Ok(())
                }),
            }),
        },
        Scenario {
            key: "list",
            title: "GET /v1/tests?project_id=…&limit=50",
            target: Some(Target { ratio: 0.2, p99_ms: 10.0 }),
            lua: script(&with_key, "list_tests"),
            check: Some(Check {
                method: reqwest::Method::GET,
                path: format!("/v1/tests?project_id={}&limit=50", p0.id),
                headers: key_header.clone(),
                body: None,
                expect: expect_len("tests", 50),
            }),
        },
    ];
    if let Some(first_result) = seeded.result_ids.first().cloned() {
        out.push(Scenario {
            key: "result",
            title: "GET /v1/test-results/{id} (20 turns)",
            target: Some(Target { ratio: 0.3, p99_ms: 5.0 }),
            lua: script(&with_key, "get_result"),
            check: Some(Check {
                method: reqwest::Method::GET,
                path: format!("/v1/test-results/{first_result}"),
                headers: key_header.clone(),
                body: None,
                expect: expect_len("transcript", turns),
            }),
        });
    }
    out.push(Scenario {
        key: "post",
        title: "POST /v1/tests (durable)",
        target: Some(Target { ratio: 0.1, p99_ms: 10.0 }),
        lua: script(&with_key, "post_test"),
        check: Some(Check {
            method: reqwest::Method::POST,
            path: "/v1/tests".into(),
            headers: key_header.clone(),
            body: Some(seed::test_body(&p0, "checked before the load")),
            expect: Box::new(|v| {
                anyhow::ensure!(v["id"].as_str().is_some_and(|id| id.starts_with("tst_")), "no test id: {v}");
                Ok(())
            }),
        }),
    });
    // 90 % reads spread over the read scenarios, 10 % test creations,
    // decided per request on every connection.
    let mix = if seeded.result_ids.is_empty() {
        "local r = math.random(100)\n  if r <= 10 then return post_test() elseif r <= 55 then return get_test() \
         elseif r <= 75 then return list_tests() else return list_keys() end"
    } else {
        "local r = math.random(100)\n  if r <= 10 then return post_test() elseif r <= 40 then return get_test() \
         elseif r <= 70 then return get_result() elseif r <= 85 then return list_tests() else return list_keys() end"
    };
    out.push(Scenario {
        key: "mix",
        title: "90/10 read/write mix",
        target: Some(Target { ratio: 0.4, p99_ms: 5.0 }),
        lua: format!("{with_key}\nfunction request()\n  {mix}\nend\n"),
        check: None,
    });
    Ok(out)
}
