//! The README's commands, run as written, in the order a reader meets them.
//!
//! `README.md` is read at run time. Every fenced block in it is either run
//! against the real binary (`sparring serve` and `sparring agent` started as
//! the README starts them, on ephemeral loopback ports, in a temporary
//! working directory that holds the server's `./sparring-data`), or named in
//! [`SKIPPED`] with the reason; a block that is neither fails the test, as
//! does a command of a run block that the test does not know how to run.
//!
//! `curl` lines run through `sh` with the real `curl`, the `sparring` lines
//! through `sh` with the built binary first on `PATH`. What is substituted,
//! and only that: the addresses (`127.0.0.1:8080`, the server;
//! `127.0.0.1:9090`, the reference agent; `https://sparring.example.com`,
//! the server again) and each placeholder id (`prj_...`, `key_…`, …, and
//! `spk_...`, the key the first start printed) by the latest real id of its
//! kind the walk made; a command naming several of one kind (the three
//! reviewers) gets the latest that many, in the order they were made. Every
//! command must succeed (curl's status 2xx, `sparring`'s exit 0), and what the
//! README says around it is checked too.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::process::{Proc, BIN};
use regex::Regex;
use serde_json::Value;

/// Blocks this test does not run, found by a line of theirs, and why.
const SKIPPED: &[(&str, &str)] = &[
    (
        "cargo test --workspace",
        "build and test lines (cargo): the test suite is this, and the server is started as the next block's \
         `serve --allow-private-targets`, which this test runs",
    ),
    (
        "uses: actions/upload-artifact@v4",
        "GitHub Actions YAML: its `run:` line is the CI block's `sparring run --batch … --junit sparring.xml`, \
         which this test runs",
    ),
    (
        "def verified(secret: str, signature: str, body: bytes",
        "Python run by a webhook receiver, no command to a server; the signature it checks (HMAC-SHA256 of \
         `t.body`) is checked by tests/engine.rs `webhooks_are_signed_and_retried_until_delivered`",
    ),
    (
        "let keys = client.list_api_keys().send().await?.into_inner();",
        "the Rust client: `Client::with_api_key` on `<base>/v1` is how every test's client is made \
         (tests/common/mod.rs `TestServer::client`), and `list_api_keys().send().await?.into_inner()` is \
         tests/api_keys.rs's; client/examples/first_hour.rs runs in tests/tests_batches.rs \
         `a_first_hour_through_the_generated_client`",
    ),
    ("cargo xtask regen --check", "cargo: the generator, which .ci/run checks (`cargo xtask regen --check`)"),
    ("cargo xtask bench api", "cargo: the benchmarks, which no test runs"),
];

/// The block that is a synopsis of the commands, not commands to run: each
/// option and environment variable it names must be one `sparring help
/// <command>` lists for that command.
const SYNOPSIS: &str = "sparring [serve] [--bind ADDR]";

/// The `cargo run --release -- …` lines of a run block that start nothing
/// here, and why.
const SKIPPED_CARGO_RUNS: &[(&str, &str)] =
    &[("demo", "the demo is tests/binary.rs `the_demo_runs_a_batch_and_prints_its_results`")];

/// A fenced block of the README.
struct Block {
    lang: String,
    /// Its first line's number in README.md.
    line: usize,
    text: String,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut found = Vec::new();
    // (lang, line, indent of the fence, lines)
    let mut open: Option<(String, usize, usize, Vec<String>)> = None;
    for (i, line) in readme.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(lang) = trimmed.strip_prefix("```") {
                    open = Some((lang.trim().to_string(), i + 1, indent, Vec::new()));
                }
            }
            Some((lang, at, fence_indent, lines)) => {
                if trimmed.starts_with("```") {
                    found.push(Block { lang: lang.clone(), line: *at, text: lines.join("\n") });
                    open = None;
                } else {
                    lines.push(line.get(*fence_indent..).unwrap_or(trimmed).to_string());
                }
            }
        }
    }
    assert!(open.is_none(), "README.md: a fenced block is never closed");
    found
}

/// The commands of a shell block: a line break ends one unless it is
/// escaped or inside quotes. Comments are left out.
fn commands(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current = String::new();
    let (mut single, mut double) = (false, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => {
                single = !single;
                current.push(c);
            }
            '"' if !single => {
                double = !double;
                current.push(c);
            }
            '\\' if !single => {
                current.push(c);
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '#' if !single && !double && (current.is_empty() || current.ends_with(char::is_whitespace)) => {
                while chars.peek().is_some_and(|&n| n != '\n') {
                    chars.next();
                }
            }
            '\n' if !single && !double => {
                if !current.trim().is_empty() {
                    found.push(current.trim().to_string());
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    assert!(!single && !double, "a quote is never closed in:\n{text}");
    if !current.trim().is_empty() {
        found.push(current.trim().to_string());
    }
    found
}

/// The README's inline code span that starts with `start` (a command its
/// text gives); a span broken across lines is one line.
fn inline_command(readme: &str, start: &str) -> String {
    let text = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = text.find(&format!("`{start}")).unwrap_or_else(|| panic!("README.md no longer says `{start}…`"));
    let span = &text[at + 1..];
    span[..span.find('`').unwrap()].to_string()
}

/// What a command run through `sh` did.
#[derive(Debug)]
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// A placeholder id: `prj_...` or `prj_…`.
fn placeholder() -> Regex {
    Regex::new(r"\b([a-z]{3})_(?:\.\.\.|…)").unwrap()
}

/// A real id, as the server makes them.
fn real_id() -> Regex {
    Regex::new(r"\b([a-z]{3})_[0-9a-f]{32}\b").unwrap()
}

fn is_real_id(s: &str) -> bool {
    let re = Regex::new(r"^[a-z]{3}_[0-9a-f]{32}$").unwrap();
    re.is_match(s)
}

/// The values a CI job would have in its environment.
const GIT_SHA: &str = "3f1c2ab";
const CI_JOB_URL: &str = "https://ci.example.com/jobs/42";

/// The reviewers of the calibration: the README's `ana@example.com`, and two
/// more made and added the same way.
const REVIEWERS: [&str; 3] = ["ana@example.com", "ben@example.com", "chloe@example.com"];

struct Reviewer {
    email: String,
    key: String,
    id: Option<String>,
}

struct Walk {
    readme: String,
    /// The working directory of every command: the server's
    /// `./sparring-data`, and the files commands write.
    dir: tempfile::TempDir,
    /// Holds `sparring`, first on the commands' `PATH`.
    bin_dir: tempfile::TempDir,
    server: Option<Proc>,
    server_addr: Option<String>,
    agent: Option<Proc>,
    agent_addr: Option<String>,
    admin_key: Option<String>,
    /// Real ids by kind, in the order they were made or last named.
    ids: HashMap<String, Vec<String>>,
    /// The shell variables set so far (`KEY=…`, `export …`).
    prelude: Vec<String>,
    reviewers: Vec<Reviewer>,
    /// Secrets the README's commands made: (what, secret).
    ci_secret: Option<String>,
    rotated_secret: Option<String>,
    /// `sparring run` lines run, for the checks at the end.
    runs: usize,
}

impl Walk {
    fn new(readme: String) -> Walk {
        let bin_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(BIN, bin_dir.path().join("sparring")).unwrap();
        Walk {
            readme,
            dir: tempfile::tempdir().unwrap(),
            bin_dir,
            server: None,
            server_addr: None,
            agent: None,
            agent_addr: None,
            admin_key: None,
            ids: HashMap::new(),
            prelude: Vec::new(),
            reviewers: Vec::new(),
            ci_secret: None,
            rotated_secret: None,
            runs: 0,
        }
    }

    fn server_addr(&self) -> &str {
        self.server_addr.as_deref().expect("a command to the server before the README started one")
    }

    fn admin_key(&self) -> &str {
        self.admin_key.as_deref().unwrap()
    }

    fn made(&mut self, id: &str) {
        let kind = id[..3].to_string();
        let ids = self.ids.entry(kind).or_default();
        ids.retain(|i| i != id);
        ids.push(id.to_string());
    }

    fn latest(&self, kind: &str) -> String {
        self.ids.get(kind).and_then(|ids| ids.last()).unwrap_or_else(|| panic!("no {kind}_ id made yet")).clone()
    }

    /// Records the ids an answer names: the top-level ids of an object (not
    /// those inside a list of items), its own `id` last.
    fn record(&mut self, answer: &str) {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(answer) else {
            for id in real_id().find_iter(answer).map(|m| m.as_str().to_string()).collect::<Vec<_>>() {
                self.made(&id);
            }
            return;
        };
        let mut own = None;
        for (name, value) in &fields {
            let strings: Vec<&str> = match value {
                Value::String(s) => vec![s.as_str()],
                Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            for s in strings.into_iter().filter(|s| is_real_id(s)) {
                if name == "id" {
                    own = Some(s.to_string());
                } else {
                    self.made(s);
                }
            }
        }
        if let Some(id) = own {
            self.made(&id);
        }
    }

    /// The command with the addresses and placeholder ids made real.
    fn substitute(&self, command: &str) -> String {
        let re = placeholder();
        let mut wanted: HashMap<String, usize> = HashMap::new();
        for caps in re.captures_iter(command) {
            *wanted.entry(caps[1].to_string()).or_default() += 1;
        }
        let mut used: HashMap<String, usize> = HashMap::new();
        let real = re.replace_all(command, |caps: &regex::Captures| {
            let kind = &caps[1];
            let made: &[String] = if kind == "spk" {
                std::slice::from_ref(self.admin_key.as_ref().expect("a key before the first start printed one"))
            } else {
                self.ids.get(kind).map(Vec::as_slice).unwrap_or_default()
            };
            let want = if kind == "spk" { 1 } else { wanted[kind] };
            assert!(
                made.len() >= want,
                "README.md uses {want} {kind}_ id(s) before any command it gives made that many:\n{command}"
            );
            let n = used.entry(kind.to_string()).or_default();
            let id = made[made.len() - want + (*n % want)].clone();
            *n += 1;
            id
        });
        let mut real = real.into_owned();
        if let Some(addr) = &self.server_addr {
            real =
                real.replace("127.0.0.1:8080", addr).replace("https://sparring.example.com", &format!("http://{addr}"));
        }
        if let Some(addr) = &self.agent_addr {
            real = real.replace("127.0.0.1:9090", addr);
        }
        real
    }

    /// `script` run by `sh` after the shell variables set so far, in the
    /// walk's directory, with `sparring` on the `PATH` and a CI job's
    /// variables in the environment.
    fn sh(&self, script: &str) -> Ran {
        let mut cmd = Command::new("sh");
        let full = format!("{}\n{script}", self.prelude.join("\n"));
        cmd.arg("-c").arg(full).current_dir(self.dir.path());
        for (name, _) in std::env::vars() {
            if name.starts_with("SPARRING_") || name.to_ascii_lowercase().ends_with("_proxy") {
                cmd.env_remove(name);
            }
        }
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", self.bin_dir.path().display()))
            .env("GIT_SHA", GIT_SHA)
            .env("CI_JOB_URL", CI_JOB_URL)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        let output = match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(output) => output.unwrap(),
            Err(_) => {
                let _ = Command::new("kill").arg("-KILL").arg(format!("-{pid}")).status();
                let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
                panic!("did not end within 3 minutes: {script}");
            }
        };
        Ran {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// A `curl` line: its status (which must be 2xx) and body.
    fn curl(&mut self, command: &str) -> (u16, Value) {
        let real = self.substitute(command);
        let (status, body) = self.curl_raw(&real);
        assert!((200..300).contains(&status), "{command}\nanswered {status}: {body}");
        self.record(&body);
        let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{command}\nnot JSON ({e}): {body}"));
        (status, json)
    }

    /// A real `curl` line, its status and body, whatever they are.
    fn curl_raw(&self, real: &str) -> (u16, String) {
        assert!(real.starts_with("curl "), "{real}");
        let ran = self.sh(&real.replacen("curl ", "curl -w '\\n%{http_code}' ", 1));
        assert_eq!(ran.code, Some(0), "{real}\ncurl failed: {ran:?}");
        let (body, status) = ran.stdout.rsplit_once('\n').unwrap_or(("", &ran.stdout));
        (status.trim().parse().unwrap_or_else(|_| panic!("{real}\nno status: {ran:?}")), body.to_string())
    }

    /// `GET /v1{path}` with `key`, as the test's own check (not a README
    /// command): the status and body.
    fn get(&self, path: &str, key: &str) -> (u16, String) {
        self.curl_raw(&format!("curl -s -H 'x-api-key: {key}' 'http://{}/v1{path}'", self.server_addr()))
    }

    fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.get(path, self.admin_key());
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    fn run_block(&mut self, block: &Block) {
        let assignment = Regex::new(r"^[A-Z_][A-Z0-9_]*=").unwrap();
        for command in commands(&block.text) {
            let first = command.split_whitespace().next().unwrap();
            match first {
                "cargo" => self.cargo_run(&command),
                "curl" => self.curl_step(&command),
                "sparring" => self.sparring_step(&command),
                "export" => self.assign(&command),
                _ if assignment.is_match(&command) => self.assign(&command),
                _ => panic!("README.md:{}: a command this test does not run: {command}", block.line),
            }
        }
    }

    fn assign(&mut self, command: &str) {
        let real = self.substitute(command);
        let ran = self.sh(&real);
        assert_eq!(ran.code, Some(0), "{command}: {ran:?}");
        self.prelude.push(real);
    }

    /// `cargo run --release -- ARGS`: the built binary with those arguments.
    fn cargo_run(&mut self, command: &str) {
        let args = command
            .strip_prefix("cargo run --release -- ")
            .unwrap_or_else(|| panic!("a cargo line this test does not run: {command}"));
        let args: Vec<&str> = args.split_whitespace().collect();
        match args[0] {
            "agent" => self.start_agent(&args),
            "serve" => self.start_server(&args),
            other => {
                SKIPPED_CARGO_RUNS
                    .iter()
                    .find(|(what, _)| *what == other)
                    .unwrap_or_else(|| panic!("a cargo line this test does not run: {command}"));
            }
        }
    }

    /// `sparring agent --bind 127.0.0.1:9090`, on a free port instead.
    fn start_agent(&mut self, args: &[&str]) {
        let args: Vec<&str> = args.iter().map(|a| if *a == "127.0.0.1:9090" { "127.0.0.1:0" } else { a }).collect();
        assert!(args.contains(&"127.0.0.1:0"), "the agent is no longer started on 127.0.0.1:9090: {args:?}");
        let proc = Proc::spawn(&args);
        proc.expect("the agent's targets", |o| o.stdout.contains("channel targets:"));
        let stdout = proc.stdout();
        let line = stdout.lines().find(|l| l.contains("listening on http://")).unwrap();
        let addr = line[line.find("http://").unwrap() + "http://".len()..].trim().to_string();
        // "it prints both when it starts"
        for target in [format!("http://{addr}/http"), format!("ws://{addr}/ws")] {
            assert!(stdout.contains(&target), "the agent does not print {target}: {stdout}");
        }
        // "Its bare address answers `404` to every turn."
        let turn = r#"{"call_id": "c", "turn": 0, "event": "start", "message": {"role": "user", "content": "Hi"}}"#;
        let bare = format!("curl -s -X POST -H 'content-type: application/json' -d '{turn}' http://{addr}/");
        assert_eq!(self.curl_raw(&bare).0, 404, "the agent's bare address answers a turn");
        self.agent = Some(proc);
        self.agent_addr = Some(addr);
    }

    /// `sparring serve ARGS` on a free port, in the walk's directory, with
    /// its default data dir (`./sparring-data`) there.
    fn start_server(&mut self, args: &[&str]) {
        let (proc, addr) = self.serve(args, |o| o.stdout.contains("/v1/api-keys\n"));
        self.server = Some(proc);
        self.server_addr = Some(addr);
        self.first_start();
    }

    /// `sparring ARGS --bind <a free port>` in the walk's directory, once
    /// `ready` holds for its output; and its address.
    fn serve(&self, args: &[&str], ready: impl Fn(&common::process::Output) -> bool) -> (Proc, String) {
        for _attempt in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let bind = format!("127.0.0.1:{port}");
            let mut all: Vec<&str> = args.to_vec();
            all.extend(["--bind", &bind]);
            let mut cmd = Command::new(BIN);
            cmd.args(&all).current_dir(self.dir.path());
            let proc = spawn_in(cmd, &all);
            match proc.wait_for(&ready) {
                Ok(()) => return (proc, bind),
                Err(e) if e.contains("starting the server") => continue,
                Err(e) => panic!("starting the server: {e}"),
            }
        }
        panic!("no free port after 3 attempts");
    }

    /// "`sparring admin backup --to NEW_DIR` (beside a running server, or
    /// not) writes a directory a server can start on (`sparring serve
    /// --data-dir NEW_DIR`)", readable by its owner only.
    fn backup(&mut self) {
        let backup = inline_command(&self.readme, "sparring admin backup --to NEW_DIR").replace("NEW_DIR", "backup");
        self.sparring(&backup);
        let dir = self.dir.path().join("backup");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700, "{backup}: the directory is not its owner's only");
        let serve = inline_command(&self.readme, "sparring serve --data-dir NEW_DIR").replace("NEW_DIR", "backup");
        let args: Vec<&str> = serve.split_whitespace().skip(1).collect();
        let (_restored, addr) = self.serve(&args, |o| o.stderr.contains("serving"));
        let projects = format!("curl -s -H 'x-api-key: {}' http://{addr}/v1/projects", self.admin_key());
        let (status, body) = self.curl_raw(&projects);
        assert!(status == 200 && body.contains("checkout agent"), "{serve}: {status} {body}");
    }

    /// The first start printed one key for `admin@localhost`, and a `curl`
    /// line to try it, which works.
    fn first_start(&mut self) {
        let stdout = self.server.as_ref().unwrap().stdout();
        let keys: Vec<&str> =
            Regex::new(r"spk_[A-Za-z0-9_-]{43}").unwrap().find_iter(&stdout).map(|m| m.as_str()).collect();
        assert!(!keys.is_empty() && keys.iter().all(|k| *k == keys[0]), "{stdout}");
        assert!(stdout.contains("admin@localhost"), "the admin's email is not said: {stdout}");
        self.admin_key = Some(keys[0].to_string());
        assert!(self.dir.path().join("sparring-data").join("sparring.db").exists(), "no ./sparring-data");
        let try_it = stdout.lines().map(str::trim).find(|l| l.starts_with("curl ")).expect("a curl line to try");
        let (status, body) = self.curl_raw(&try_it.replacen("curl ", "curl -s ", 1));
        assert_eq!(status, 200, "{try_it}: {body}");
    }

    /// The README's way to make the admin another key.
    fn admin_create_key(&mut self) {
        let command = inline_command(&self.readme, "sparring admin create-key --user admin@localhost");
        let ran = self.sparring(&command.replace("LABEL", "laptop"));
        let key = ran.stdout.trim();
        assert!(key.starts_with("spk_") && ran.stdout.lines().count() == 1, "{command}: the key alone: {ran:?}");
        // It is the admin's: it sees the key the first start printed.
        let (status, body) = self.get("/api-keys", key);
        assert_eq!(status, 200, "{command}: the key does not work: {body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["keys"].as_array().unwrap().len(), 2, "{body}");
    }

    /// A `sparring` line, which must exit 0 and never print the key it was
    /// given.
    fn sparring(&mut self, command: &str) -> Ran {
        let real = self.substitute(command);
        let ran = self.sh(&real);
        assert_eq!(ran.code, Some(0), "{command}\n(as {real})\n{ran:?}");
        let key = self.admin_key();
        assert!(!ran.stdout.contains(key) && !ran.stderr.contains(key), "{command}: the key was printed: {ran:?}");
        ran
    }

    fn curl_step(&mut self, command: &str) {
        let method =
            Regex::new(r"-X\s+([A-Z]+)").unwrap().captures(command).map_or("GET".to_string(), |c| c[1].to_string());
        // The URL curl is given is the command's last (a body may name others).
        let url = Regex::new(r"https?://[^\s']+").unwrap().find_iter(command).last().unwrap().as_str().to_string();
        let path = url[url.find("/v1").unwrap_or_else(|| panic!("not an API URL: {command}"))..].to_string();
        let shape = placeholder().replace_all(&path, "{$1}").into_owned();
        match (method.as_str(), shape.split('?').next().unwrap()) {
            ("GET", "/v1/api-keys") => {
                let (_, answer) = self.curl(command);
                // "Your keys (never their secrets)"
                assert!(answer["keys"].as_array().is_some_and(|k| !k.is_empty()), "{answer}");
                let secret = Regex::new(r"spk_[A-Za-z0-9_-]{43}").unwrap();
                assert!(!secret.is_match(&answer.to_string()) && !answer.to_string().contains("apiKey"), "{answer}");
            }
            ("POST", "/v1/api-keys") => {
                let (status, answer) = self.curl(command);
                assert_eq!(status, 201, "{answer}");
                let secret = answer["apiKey"].as_str().unwrap().to_string();
                assert_eq!(self.get("/api-keys", &secret).0, 200, "the new key does not work");
                self.ci_secret = Some(secret);
            }
            ("POST", "/v1/api-keys/{key}/rotate") => {
                let (_, answer) = self.curl(command);
                let new = answer["apiKey"].as_str().unwrap().to_string();
                // "the old secret stops working at once"
                let old = self.ci_secret.clone().expect("a key to rotate");
                assert_eq!(self.get("/api-keys", &old).0, 401, "the old secret still works after the rotate");
                assert_eq!(self.get("/api-keys", &new).0, 200, "the rotated secret does not work");
                self.rotated_secret = Some(new);
            }
            ("DELETE", "/v1/api-keys/{key}") => {
                let (_, answer) = self.curl(command);
                let secret = self.rotated_secret.clone().expect("a rotated key to revoke");
                assert_eq!(self.get("/api-keys", &secret).0, 401, "the revoked key still works: {answer}");
            }
            ("POST", "/v1/projects") => {
                let (_, answer) = self.curl(command);
                // "you are its owner"
                assert_eq!(answer["role"], "owner", "{answer}");
            }
            ("GET", "/v1/projects/{prj}/members") => {
                let (_, answer) = self.curl(command);
                let members = answer["members"].as_array().unwrap();
                assert!(members.iter().any(|m| m["email"] == "admin@localhost" && m["role"] == "owner"), "{answer}");
            }
            ("GET", "/v1/activity") => {
                let (_, answer) = self.curl(command);
                let project = self.latest("prj");
                let records = answer["activity"].as_array().unwrap_or_else(|| panic!("{answer}"));
                assert!(
                    records.iter().any(|r| r["action"] == "project.create" && r["resource_id"] == project.as_str()),
                    "no project.create record: {answer}"
                );
                assert!(records.iter().all(|r| r["project_id"] == project.as_str()), "another project's: {answer}");
                // "newest first"
                let ids: Vec<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
                assert!(ids.windows(2).all(|w| w[0] > w[1]), "{answer}");
            }
            ("POST", "/v1/projects/{prj}/members") => self.add_reviewers(command),
            ("POST", "/v1/reviews/calibration") => {
                let (_, answer) = self.curl(command);
                let batch_run = self.get_json(&format!("/batch-runs/{}", self.latest("brn")));
                let results = batch_run["counts"]["total"].as_u64().unwrap();
                // "Draw 20 results of a batch run (…; fewer when fewer remain)"
                assert_eq!(answer["test_result_ids"].as_array().unwrap().len() as u64, results.min(20), "{answer}");
                let reviewers: Vec<Value> = self.reviewers.iter().map(|r| Value::from(r.id.clone().unwrap())).collect();
                assert_eq!(answer["reviewer_ids"].as_array().unwrap(), &reviewers, "{answer}");
                assert_eq!(answer["status"], "open", "{answer}");
            }
            ("POST", "/v1/reviews") => self.label(command),
            ("GET", "/v1/reviews/calibration/{cal}") => {
                let (_, answer) = self.curl(command);
                // "the metrics fill in as labels arrive": the three labels
                // of one result are in.
                assert_eq!(answer["progress"]["labels_done"], 3, "{answer}");
                assert!(answer["overall"].is_object(), "{answer}");
            }
            ("GET", "/v1/openapi.json") => {
                let (_, answer) = self.curl(command);
                let spec: Value = serde_json::from_str(
                    &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/spec/openapi.json")).unwrap(),
                )
                .unwrap();
                assert!(answer == spec, "GET /v1/openapi.json is not spec/openapi.json");
            }
            ("POST", "/v1/channels" | "/v1/personas" | "/v1/scenarios" | "/v1/tests" | "/v1/batches") => {
                let (_, answer) = self.curl(command);
                let kind = match shape.as_str() {
                    "/v1/channels" => "chn",
                    "/v1/personas" => "per",
                    "/v1/scenarios" => "scn",
                    "/v1/tests" => "tst",
                    _ => "bat",
                };
                assert!(answer["id"].as_str().is_some_and(|id| id.starts_with(kind)), "{answer}");
            }
            (method, path) => panic!("a curl line this test does not check: {method} {path}\n{command}"),
        }
    }

    /// "Someone to review: a user (made by `sparring admin create-key --user
    /// EMAIL --label LABEL`, …) added to the project by email": three, for
    /// the calibration that follows, each made and added as the README says.
    fn add_reviewers(&mut self, command: &str) {
        let create_key = inline_command(&self.readme, "sparring admin create-key --user EMAIL");
        assert!(command.contains(REVIEWERS[0]), "the README no longer adds {}: {command}", REVIEWERS[0]);
        for email in REVIEWERS {
            let ran = self.sparring(&create_key.replace("EMAIL", email).replace("LABEL", "reviewing"));
            let key = ran.stdout.trim().to_string();
            assert!(key.starts_with("spk_"), "{create_key}: {ran:?}");
            // "the key's `api_key.create` record, by the system, is in that
            // user's `GET /v1/activity`"
            let (status, activity) = self.get("/activity", &key);
            let activity: Value = serde_json::from_str(&activity).unwrap();
            assert!(
                status == 200
                    && activity["activity"].as_array().unwrap().iter().any(|r| r["action"] == "api_key.create"
                        && r["actor"]["credential"] == "system"
                        && r["actor"]["user_id"].is_null()),
                "{email}: no api_key.create record by the system: {activity}"
            );
            let (_, answer) = self.curl(&command.replace(REVIEWERS[0], email));
            // "the answer has their usr_ id"
            let id = answer["user_id"].as_str().unwrap_or_else(|| panic!("no user_id: {answer}")).to_string();
            assert!(id.starts_with("usr_") && answer["email"] == email && answer["role"] == "reviewer", "{answer}");
            self.reviewers.push(Reviewer { email: email.to_string(), key, id: Some(id) });
        }
    }

    /// "each labels with POST /v1/reviews": the line, run by each reviewer
    /// with their own key.
    fn label(&mut self, command: &str) {
        let calibration = self.latest("cal");
        let result = self.latest("trs");
        for i in 0..self.reviewers.len() {
            let (email, key, id) = {
                let r = &self.reviewers[i];
                (r.email.clone(), r.key.clone(), r.id.clone().unwrap())
            };
            self.prelude.push(format!("KEY={key}"));
            let (_, answer) = self.curl(command);
            self.prelude.pop();
            assert_eq!(answer["reviewer_id"], id.as_str(), "{email}: {answer}");
            assert_eq!(answer["test_result_id"], result.as_str(), "{answer}");
            assert_eq!(
                answer["calibration_id"],
                calibration.as_str(),
                "{email}'s label is not the calibration's: {answer}"
            );
        }
    }

    fn sparring_step(&mut self, command: &str) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.get(1).copied() {
            Some("run") => self.sparring_run(command),
            Some("result") => {
                let ran = self.sparring(command);
                // "the verdict and why, the transcript with each agent
                // reply's latency, … every evaluation"
                let result = self.latest("trs");
                let out = &ran.stdout;
                assert!(out.starts_with(&format!("result {result}: PASSED")), "{command}: {ran:?}");
                assert!(Regex::new(r"agent +\d+ ms +Your appointment is confirmed").unwrap().is_match(out), "{out}");
                assert!(out.contains("evaluations:") && out.contains("pass  step 1: confirms"), "{out}");
            }
            _ => panic!("a sparring line this test does not run: {command}"),
        }
    }

    fn sparring_run(&mut self, command: &str) {
        let ran = self.sparring(command);
        self.runs += 1;
        let before: Vec<String> = self.ids.get("brn").cloned().unwrap_or_default();
        self.record(&ran.stdout);
        self.record(&ran.stderr);
        let batch_run = self.latest("brn");
        assert!(!before.contains(&batch_run), "{command}: no batch run started: {ran:?}");
        let read = self.get_json(&format!("/batch-runs/{batch_run}"));
        if command.contains("--no-wait") {
            // "print the batch run's id and return"
            assert_eq!(ran.stdout.trim(), batch_run, "{command}: {ran:?}");
            return;
        }
        assert_eq!(read["status"], "completed", "{command}: {read}");
        assert_eq!(read["passed"], true, "{command}: {read}");
        // "A run reserves its worst case up front: 1 credit per started
        // minute of every conversation at its longest" (the scenario's
        // `max_duration_s`, 60), and a conversation costs 1 credit per
        // started minute, at least 1: these took seconds.
        let runs = read["counts"]["total"].as_i64().unwrap();
        assert!(runs > 0 && read["credits_reserved"] == runs && read["credits_charged"] == runs, "{read}");
        if command.contains("--metadata") {
            assert_eq!(read["metadata"]["commit"], GIT_SHA, "{read}");
            assert_eq!(read["metadata"]["job"], CI_JOB_URL, "{read}");
        }
        if command.contains("--json") {
            // "the batch run as JSON on stdout"
            let printed: Value =
                serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{command}: {e}: {ran:?}"));
            assert_eq!(printed["id"], batch_run.as_str(), "{printed}");
            assert_eq!(printed["passed"], true, "{printed}");
        }
        if let Some(path) = Regex::new(r"--junit\s+(\S+)").unwrap().captures(command).map(|c| c[1].to_string()) {
            let report = std::fs::read_to_string(self.dir.path().join(&path))
                .unwrap_or_else(|e| panic!("{command}: no report at {path}: {e}"));
            // "a test case per test"
            assert_eq!(report.matches("<testcase").count(), 1, "{report}");
            assert!(report.contains("<testsuite") && report.contains("name=\"books tuesday\""), "{report}");
            assert!(!report.contains("<failure") && !report.contains("<error"), "{report}");
        }
    }

    /// The tests of the run block's `sparring run --channel`/`--test` lines
    /// are the ones the README made: their batch runs hold that test.
    fn finish(&mut self) {
        assert!(self.runs >= 6, "fewer `sparring run` lines ran than the README gives: {}", self.runs);
        // "the secret is in the response, and nowhere else, ever"
        let secrets = [self.ci_secret.clone().unwrap(), self.rotated_secret.clone().unwrap()];
        let (_, keys) = self.get("/api-keys", self.admin_key());
        let (_, activity) = self.get("/activity", self.admin_key());
        let server = self.server.as_ref().unwrap();
        let logs = format!("{}{}", server.stdout(), server.stderr());
        for secret in &secrets {
            for (what, text) in [("the key list", &keys), ("the activity", &activity), ("the server's output", &logs)] {
                assert!(!text.contains(secret.as_str()), "a secret is in {what}");
            }
        }
        self.backup();
        // `sparring result trs_…` (in the text): one of the conversations.
        let result = inline_command(&self.readme, "sparring result trs_");
        self.sparring_step(&result);
    }
}

/// Each line of the synopsis (`sparring COMMAND OPTIONS… # VARIABLES`,
/// continued on indented lines) names only options and environment
/// variables that `sparring help COMMAND` lists.
fn synopsis_matches_help(block: &Block) {
    let mut entries: Vec<String> = Vec::new();
    for line in block.text.lines() {
        if line.starts_with("sparring ") {
            entries.push(line.to_string());
        } else {
            entries.last_mut().unwrap_or_else(|| panic!("a synopsis line of no command: {line}")).push_str(line);
        }
    }
    let option = Regex::new(r"--[a-z][a-z-]*").unwrap();
    let variable = Regex::new(r"SPARRING_[A-Z_]+").unwrap();
    assert!(entries.len() >= 9, "{}", block.text);
    for entry in entries {
        // `sparring [serve] …` names `serve`; `sparring admin create-key …`,
        // `admin create-key`.
        let command: Vec<&str> = entry
            .split_whitespace()
            .skip(1)
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
            .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-'))
            .collect();
        assert!(!command.is_empty(), "{entry}");
        let help = std::process::Command::new(BIN).arg("help").args(&command).output().unwrap();
        assert!(help.status.success(), "sparring help {command:?}: {help:?}");
        let help = String::from_utf8_lossy(&help.stdout);
        for named in option.find_iter(&entry).chain(variable.find_iter(&entry)) {
            let named = named.as_str();
            assert!(
                Regex::new(&format!(r"{}\b", regex::escape(named))).unwrap().is_match(&help),
                "the README's synopsis gives `sparring {}` {named}, which its help does not list:\n{help}",
                command.join(" ")
            );
        }
    }
}

/// `cmd` as a [`Proc`]: its output collected, killed on drop.
fn spawn_in(mut cmd: Command, args: &[&str]) -> Proc {
    for (name, _) in std::env::vars() {
        if name.starts_with("SPARRING_") {
            cmd.env_remove(name);
        }
    }
    Proc::spawn_command(cmd, &format!("sparring {}", args.join(" ")))
}

#[test]
fn the_readme_s_commands_work_as_written() {
    if Command::new("curl").arg("--version").stdout(Stdio::null()).status().is_err() {
        eprintln!("SKIPPED: the README's commands need `curl`, which is not installed (.ci/run installs it)");
        return;
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let all = blocks(&readme);
    for (marker, reason) in SKIPPED {
        let holding = all.iter().filter(|b| b.text.contains(marker)).count();
        assert_eq!(holding, 1, "{holding} README blocks hold {marker:?}, skipped because {reason}");
    }
    let mut walk = Walk::new(readme.clone());
    let mut admin_key_made = false;
    for block in &all {
        if SKIPPED.iter().any(|(marker, _)| block.text.contains(marker)) {
            continue;
        }
        if block.text.contains(SYNOPSIS) {
            synopsis_matches_help(block);
            continue;
        }
        assert!(
            block.lang == "sh",
            "README.md:{}: a new ```{} block that this test neither runs nor skips (SKIPPED, with why):\n{}",
            block.line,
            block.lang,
            block.text
        );
        walk.run_block(block);
        if walk.server.is_some() && !admin_key_made {
            admin_key_made = true;
            // Right after the server: "make the admin a key with `sparring
            // admin create-key --user admin@localhost --label LABEL`".
            walk.admin_create_key();
        }
    }
    walk.finish();
}
