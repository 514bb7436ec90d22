//! The real `sparring` binary as a child process: first-start key, admin
//! commands, signals, logs.
//!
//! Nothing here sleeps to wait for an event: the child's output is read by
//! threads that wake the test on every line, and every wait has a deadline.

use serde_json::Value;

mod common;
use common::process::{run, serve};

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn is_key(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("spk_") else { return false };
    rest.len() == 43 && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Every `spk_…` token in `text`.
fn keys_in(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("spk_") {
        let token: String =
            rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect();
        rest = &rest[i + token.len()..];
        keys.push(token);
    }
    keys
}

/// A data dir as a server leaves it, with no user yet: the admin commands
/// work on an existing one only.
fn data_dir_at(path: &std::path::Path) {
    drop(sparring_impl::open_store(path).unwrap());
}

/// The server on a fresh data dir, and the key its first start printed.
fn first_start(data_dir: &std::path::Path) -> (common::process::Server, String) {
    let server = serve(data_dir);
    server.proc.expect("the first-start key on stdout", |o| o.stdout.contains("/v1/api-keys\n"));
    let key = keys_in(&server.proc.stdout())[0].clone();
    assert!(is_key(&key), "not a key: {key}");
    (server, key)
}

#[tokio::test]
async fn first_start_prints_one_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let client = http();

    let mut server = serve(dir.path());
    // The message is printed whole; its last line is the curl example.
    server
        .proc
        .expect("the first-start key on stdout", |o| o.stdout.contains("spk_") && o.stdout.contains("/v1/api-keys\n"));
    let stdout = server.proc.stdout();
    let keys = keys_in(&stdout);
    assert!(!keys.is_empty(), "{stdout}");
    let key = keys[0].clone();
    assert!(is_key(&key), "not a key: {key}");
    assert!(keys.iter().all(|k| *k == key), "one key only: {keys:?}");
    let curl = stdout.lines().map(str::trim).find(|l| l.starts_with("curl")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(curl.contains(&key) && curl.contains(&server.url("/v1/api-keys")), "{curl}");
    // The admin's email is named: the admin commands take it (`--user`).
    assert!(stdout.contains("admin@localhost"), "{stdout}");
    let data_dir = dir.path().to_str().unwrap();
    let (status, out, err) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "admin@localhost", "--amount", "5"]);
    assert!(status.success() && out.contains("admin@localhost now has"), "{status}: {out}{err}");

    let resp = client.get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let list: Value = resp.json().await.unwrap();
    assert_eq!(list["keys"].as_array().unwrap().len(), 1, "{list}");

    server.stop();

    // Second start on the same data dir: no new key, the first one works.
    let mut server = serve(dir.path());
    let resp = client.get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    server.stop();
    let stdout = server.proc.stdout();
    assert!(!stdout.contains("spk_"), "a key on the second start: {stdout}");
}

/// A stopped server leaves its data whole in `sparring.db`: the WAL is
/// emptied at shutdown, after the last write (the last uses of keys, written
/// as the server stops), so a copy of that one file is a backup.
#[tokio::test]
async fn a_stopped_server_leaves_its_data_in_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, key) = first_start(dir.path());
    let resp = http().get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    server.stop();

    let db = dir.path().join(sparring_impl::DATABASE_FILE);
    let wal = dir.path().join(format!("{}-wal", sparring_impl::DATABASE_FILE));
    let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(wal_len, 0, "the WAL still holds {wal_len} bytes after a stop");
    // The database file alone, copied without its WAL, holds the last write.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(&db, copy.path().join(sparring_impl::DATABASE_FILE)).unwrap();
    let store = sparring_impl::open_store(copy.path()).unwrap();
    let used: Option<String> = store
        .read_blocking(|c| {
            c.query_row("SELECT last_used_at FROM api_keys", [], |r| r.get(0))
                .map_err(sparring_impl::store::StoreError::from)
        })
        .unwrap();
    assert!(used.is_some(), "the key's last use, written as the server stopped, is not in the database file");
}

/// The admin commands that write to a stopped server's data dir leave it as
/// the stop did: everything in `sparring.db`, the WAL emptied. A copy of
/// that file with the key file is a backup (README), also after
/// `admin rotate-secret-key`, which must run with the server stopped and
/// whose re-sealed secrets were left in the WAL: the copy held the old
/// sealing beside the new key, and a server refused to start on it.
#[tokio::test]
async fn admin_commands_on_a_stopped_server_leave_their_writes_in_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let (mut server, key) = first_start(dir.path());
    seal_a_secret(&server, &key).await;
    server.stop();

    let wal = dir.path().join(format!("{}-wal", sparring_impl::DATABASE_FILE));
    let wal_len = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let (status, stdout, stderr) = run(&["admin", "rotate-secret-key", "--data-dir", data_dir]);
    assert!(status.success() && stdout.contains("re-sealed 1 stored secrets"), "{stdout}{stderr}");
    assert_eq!(wal_len(), 0, "rotate-secret-key left its writes in the WAL");
    let (status, _, stderr) =
        run(&["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(wal_len(), 0, "create-key left its writes in the WAL");
    let (status, _, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", "5"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(wal_len(), 0, "grant-credits left its writes in the WAL");

    // `sparring.db` and `secret.key` alone: a server starts on them (the
    // key opens the secrets sealed there), with the key made and the grant.
    let copy = tempfile::tempdir().unwrap();
    for file in [sparring_impl::DATABASE_FILE, "secret.key"] {
        std::fs::copy(dir.path().join(file), copy.path().join(file)).unwrap();
    }
    let mut restored =
        common::process::Proc::spawn(&["serve", "--bind", "127.0.0.1:0", "--data-dir", copy.path().to_str().unwrap()]);
    restored.expect("the server to end or serve", |o| o.closed() || o.stderr.contains(common::process::SERVING));
    let stderr = restored.stderr();
    assert!(stderr.contains(common::process::SERVING), "no server on the copied files: {stderr}");
    assert!(restored.terminate().success(), "{}", restored.stderr());
    let store = sparring_impl::open_store(copy.path()).unwrap();
    let (keys, credits): (i64, i64) = store
        .read_blocking(|c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM api_keys WHERE label = 'deploy'),
                        (SELECT count(*) FROM transactions WHERE amount = 5)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sparring_impl::store::StoreError::from)
        })
        .unwrap();
    assert_eq!((keys, credits), (1, 1), "the copy lacks the key made or the grant");
}

/// A connection whose `POST` declares 100 bytes of body and sends 4, once
/// the server has accepted it: a request in flight until it is cut off.
fn a_request_whose_body_never_comes(server: &mut common::process::Server, key: &str) -> std::net::TcpStream {
    use std::io::Write as _;
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut stuck = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stuck,
        "POST /v1/projects HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {key}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"na"
    )
    .unwrap();
    let accepted = format!("\"remote_addr\":\"{}\"", stuck.local_addr().unwrap());
    server.proc.expect("the connection accepted", |o| o.stderr.contains(&accepted));
    stuck
}

/// A client that never finishes its request (a body promised and never
/// sent whole) does not keep a server asked to stop from stopping: the wait
/// for requests in flight is bounded, and the stop still writes what it must
/// on its way out (the key's last use, the WAL emptied into the database).
#[tokio::test]
async fn a_request_that_never_finishes_does_not_keep_the_server_from_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, key) = first_start(dir.path());
    let resp = http().get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let stuck = a_request_whose_body_never_comes(&mut server, &key);
    let asked = std::time::Instant::now();
    server.stop();
    assert!(asked.elapsed() < std::time::Duration::from_secs(20), "the stop took {:?}", asked.elapsed());
    drop(stuck);

    let wal = dir.path().join(format!("{}-wal", sparring_impl::DATABASE_FILE));
    let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(wal_len, 0, "the WAL still holds {wal_len} bytes after a stop");
    let store = sparring_impl::open_store(dir.path()).unwrap();
    let (used, projects): (Option<String>, i64) = store
        .read_blocking(|c| {
            Ok::<_, sparring_impl::store::StoreError>((
                c.query_row("SELECT last_used_at FROM api_keys", [], |r| r.get(0))?,
                c.query_row("SELECT count(*) FROM projects", [], |r| r.get(0))?,
            ))
        })
        .unwrap();
    assert!(used.is_some(), "the key's last use was not written as the server stopped");
    assert_eq!(projects, 0, "the request never sent whole made a project");
}

/// A second signal during the stop ends the process at once (exit 128 +
/// the signal), rather than after the stop's wait for requests in flight.
#[tokio::test]
async fn a_second_signal_during_the_stop_ends_the_process_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, key) = first_start(dir.path());
    // The stop waits 5 s for it.
    let stuck = a_request_whose_body_never_comes(&mut server, &key);
    server.proc.signal("TERM");
    server.proc.expect("the stop begun", |o| o.stderr.contains("shutting down: finishing in-flight requests"));
    server.proc.signal("INT");
    let status = server.proc.wait_exit();
    assert_eq!(status.code(), Some(130), "{status}\n{}", server.proc.stderr());
    assert!(server.proc.stderr().contains("a second signal came during the stop"), "{}", server.proc.stderr());
    drop(stuck);
    // What was acknowledged is there: the next start opens the data dir.
    let store = sparring_impl::open_store(dir.path()).unwrap();
    let keys: i64 = store
        .read_blocking(|c| {
            Ok::<_, sparring_impl::store::StoreError>(c.query_row("SELECT count(*) FROM api_keys", [], |r| r.get(0))?)
        })
        .unwrap();
    assert_eq!(keys, 1);
}

/// A key made whose printing fails (stdout a full disk) is a failure that
/// says which key to revoke, without the key: `println!` panicked (101),
/// and the key was left active, shown to no one.
#[test]
fn admin_create_key_that_cannot_print_the_key_says_which_to_revoke() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = std::process::Command::new(common::process::BIN)
        .args(["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the key was made but could not be printed"), "{stderr}");
    assert!(stderr.contains("ops@example.com") && stderr.contains("\"deploy\""), "{stderr}");
    assert!(keys_in(&stderr).iter().all(|k| !is_key(k)), "the key itself: {stderr}");
    // The prefix it names is the key's, as `GET /v1/api-keys` shows it.
    let store = sparring_impl::open_store(dir.path()).unwrap();
    let prefix: String = store
        .read_blocking(|c| {
            Ok::<_, sparring_impl::store::StoreError>(c.query_row(
                "SELECT prefix FROM api_keys WHERE label = 'deploy'",
                [],
                |r| r.get(0),
            )?)
        })
        .unwrap();
    assert!(stderr.contains(&format!("prefix {prefix}")), "{prefix}: {stderr}");
}

#[tokio::test]
async fn admin_create_key_prints_the_key_alone() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let args = ["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"];
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (status, stdout, stderr) = run(&args);
        assert!(status.success(), "{status}: {stderr}");
        let printed = stdout.trim();
        assert_eq!(printed.lines().count(), 1, "{stdout:?}");
        assert!(is_key(printed), "not a key alone: {stdout:?}");
        keys.push(printed.to_string());
    }
    assert_ne!(keys[0], keys[1], "each run makes a new key");

    let client = http();
    let mut server = serve(dir.path());
    for key in &keys {
        let resp = client.get(server.url("/v1/api-keys")).header("x-api-key", key).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let list: Value = resp.json().await.unwrap();
        let listed = list["keys"].as_array().unwrap();
        assert_eq!(listed.len(), 2, "{list}");
        assert!(listed.iter().all(|k| k["label"] == "deploy"), "{list}");
        assert!(listed.iter().any(|k| key.starts_with(k["prefix"].as_str().unwrap())), "{list}");
    }
    server.stop();
    // The database already had a user: no first-start admin key.
    assert!(!server.proc.stdout().contains("spk_"), "{}", server.proc.stdout());
}

/// A key `admin create-key` made for a user (without a server, or through
/// the one running) is in that user's activity: its `api_key.create`
/// record, by the system, was about no one's who could read it, so a user
/// could not see that a key of theirs had been made. Another user sees
/// only the records of their own keys.
#[tokio::test]
async fn a_key_an_administrator_made_is_in_its_users_activity() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let key_for = |email: &str, label: &str| {
        let (status, stdout, stderr) =
            run(&["admin", "create-key", "--data-dir", data_dir, "--user", email, "--label", label]);
        assert!(status.success(), "{stderr}");
        stdout.trim().to_string()
    };
    let first = key_for("ops@example.com", "first");
    let mut server = serve(dir.path());
    key_for("ops@example.com", "second");
    let other = key_for("someone@example.com", "theirs");
    let get = |key: &str, path: &str| {
        let request = http().get(server.url(path)).header("x-api-key", key);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let keys = get(&first, "/v1/api-keys").await;
    let key_ids: Vec<&Value> = keys["keys"].as_array().unwrap().iter().map(|k| &k["id"]).collect();
    let created = |list: &Value| -> Vec<(Value, Value, Value)> {
        list["activity"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["action"].clone(), r["resource_id"].clone(), r["actor"]["credential"].clone()))
            .collect()
    };
    let made = |id: &Value| (Value::from("api_key.create"), id.clone(), Value::from("system"));
    let mine = get(&first, "/v1/activity?resource_type=api_key").await;
    assert_eq!(created(&mine), [made(key_ids[0]), made(key_ids[1])], "{mine:#}");
    let theirs = get(&other, "/v1/activity?resource_type=api_key").await;
    assert_eq!(created(&theirs).len(), 1, "{theirs:#}");
    assert!(!created(&theirs).iter().any(|(_, id, _)| key_ids.contains(&id)), "{theirs:#}");
    server.stop();
}

/// A data dir the server or an admin command creates is its owner's alone:
/// it holds transcripts, emails and the secret key. One that exists keeps
/// its mode.
#[cfg(unix)]
#[tokio::test]
async fn a_new_data_dir_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let by_server = dir.path().join("served");
    let mut server = serve(&by_server);
    assert_eq!(mode(&by_server), 0o700);
    server.stop();

    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o750)).unwrap();
    let mut server = serve(&shared);
    assert_eq!(mode(&shared), 0o750, "an existing data dir keeps its mode");
    // Its database is the owner's alone all the same (SQLite gives the
    // `-wal` and `-shm` files the database's mode).
    for file in ["sparring.db", "sparring.db-wal", "sparring.db-shm"] {
        assert_eq!(mode(&shared.join(file)), 0o600, "{file}");
    }
    server.stop();
}

/// `--workers` is refused past what `GET /queue/stats` can say (`workers`
/// is an int32): 3,000,000,000 started a server whose stats said
/// -1,294,967,296 workers.
#[test]
fn workers_past_what_the_stats_can_say_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("sparring-data");
    let args = ["serve", "--data-dir", data_dir.to_str().unwrap(), "--workers", "3000000000"];
    let (status, _, stderr) = run(&args);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--workers") && stderr.contains("2147483647"), "{stderr}");
    assert!(!data_dir.exists(), "a refused start made a data dir");
}

/// The admin commands work on a server's data dir: one that is not there
/// (a typo, another working directory than the server's) is refused, not
/// made, so that no key is printed that works nowhere.
#[test]
fn the_admin_commands_need_an_existing_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("sparring-data");
    let at = missing.to_str().unwrap();
    let with_empty_dir = dir.path().join("empty");
    std::fs::create_dir(&with_empty_dir).unwrap();
    for data_dir in [at, with_empty_dir.to_str().unwrap()] {
        for args in [
            vec!["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"],
            vec!["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", "5"],
            vec!["admin", "rotate-secret-key", "--data-dir", data_dir],
        ] {
            let (status, stdout, stderr) = run(&args);
            assert_eq!(status.code(), Some(1), "{args:?}: {stdout}");
            assert!(!stdout.contains("spk_"), "{args:?}: {stdout}");
            let says = format!(
                "no database at {}: is {data_dir} a data dir?",
                std::path::Path::new(data_dir).join("sparring.db").display()
            );
            assert!(stderr.contains(&says), "{args:?}: {stderr}");
        }
    }
    assert!(!missing.exists(), "an admin command made a data dir");
    assert_eq!(std::fs::read_dir(&with_empty_dir).unwrap().count(), 0, "an admin command wrote in a directory");
}

/// `--user` is the address people type: trimmed, and found case aside,
/// so that a pasted ` Bob@Example.com ` is Bob, not a second user; and an
/// address without a name or a domain is refused.
#[tokio::test]
async fn admin_create_key_finds_the_user_by_the_address_as_typed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, _) = first_start(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let create = |user: &str| run(&["admin", "create-key", "--data-dir", data_dir, "--user", user, "--label", "ci"]);
    let (status, bob, stderr) = create("bob@example.com");
    assert!(status.success(), "{stderr}");
    let (status, pasted, stderr) = create(" Bob@Example.com \t");
    assert!(status.success(), "{stderr}");
    let keys_of = |key: String| {
        let url = server.url("/v1/api-keys");
        async move { http().get(url).header("x-api-key", key.trim()).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let (bob_keys, pasted_keys) = (keys_of(bob).await, keys_of(pasted).await);
    let ids = |keys: &Value| keys["keys"].as_array().unwrap().iter().map(|k| k["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&bob_keys).len(), 2, "one user with both keys: {bob_keys}");
    assert_eq!(ids(&bob_keys), ids(&pasted_keys));
    for user in ["@", "bob@", "@example.com", "bob smith@example.com", "bob"] {
        let (status, stdout, stderr) = create(user);
        assert!(!status.success() && !stdout.contains("spk_"), "{user:?} accepted: {stdout}");
        assert!(stderr.contains("--user"), "{user:?}: {stderr}");
    }
    server.stop();
}

/// Beside a running server, `sparring admin create-key` makes the key
/// through it (its admin socket): the key works, and a listing the server
/// kept shows it at once. With the server gone, it writes directly again.
#[tokio::test]
async fn admin_create_key_beside_a_running_server_goes_through_it() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let args = ["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "first"];
    let (status, stdout, stderr) = run(&args);
    assert!(status.success(), "{status}: {stderr}");
    let first = stdout.trim().to_string();

    let mut server = serve(dir.path());
    let socket = dir.path().join(sparring_impl::admin::SOCKET_FILE);
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let client = http();
    let listed = |key: String| {
        let (client, url) = (client.clone(), server.url("/v1/api-keys"));
        async move {
            let resp = client.get(url).header("x-api-key", key).send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            let list: Value = resp.json().await.unwrap();
            list["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k["label"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(first.clone()).await, ["first"]);
    let args = ["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "second"];
    let (status, stdout, stderr) = run(&args);
    assert!(status.success(), "{status}: {stderr}");
    let second = stdout.trim().to_string();
    assert!(is_key(&second), "{stdout:?}");
    assert_eq!(listed(first.clone()).await, ["second", "first"]);
    assert_eq!(listed(second).await, ["second", "first"]);
    // A bad request is refused by the command, naming what is wrong.
    let (status, _, stderr) =
        run(&["admin", "create-key", "--data-dir", data_dir, "--user", "not-an-email", "--label", "x"]);
    assert!(!status.success() && stderr.contains("email"), "{stderr}");

    server.stop();
    assert!(!socket.exists(), "the socket outlived the server");
    let args = ["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "third"];
    let (status, _, stderr) = run(&args);
    assert!(status.success(), "{status}: {stderr}");
}

/// The admin socket answers a request it cannot take with an error saying
/// why, and does nothing for it: one with a field it does not know (a newer
/// command's option, which it would otherwise drop without a word), one that
/// is not UTF-8, one of an unknown kind.
#[tokio::test]
async fn the_admin_socket_refuses_a_malformed_request_and_says_why() {
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let mut server = serve(dir.path());
    let socket = dir.path().join(sparring_impl::admin::SOCKET_FILE);
    let requests: [&[u8]; 4] = [
        b"{\"create_key\":{\"email\":\"ops@example.com\",\"label\":\"ci\",\"expires_in_days\":30}}\n",
        b"{\"create_key\":{\"email\":\"ops@example.com\",\"label\":\"\xff\xfe\"}}\n",
        b"{\"delete_key\":{\"email\":\"ops@example.com\"}}\n",
        b"\n",
    ];
    for request in requests {
        let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        conn.write_all(request).unwrap();
        let mut answer = String::new();
        std::io::BufReader::new(&conn).read_line(&mut answer).unwrap();
        let said = String::from_utf8_lossy(request);
        let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{said}: {e}: {answer:?}"));
        let error = answer["error"].as_str().unwrap_or_else(|| panic!("{said}: not refused: {answer}"));
        assert!(error.starts_with("not an admin request"), "{said}: {error}");
    }
    server.stop();
    let store = sparring_impl::open_store(dir.path()).unwrap();
    let keys: i64 = store
        .read_blocking(|c| {
            c.query_row(
                "SELECT count(*) FROM api_keys k JOIN users u ON u.id = k.user_id WHERE u.email = 'ops@example.com'",
                [],
                |r| r.get(0),
            )
            .map_err(sparring_impl::store::StoreError::from)
        })
        .unwrap();
    assert_eq!(keys, 0, "a refused request made a key");
}

/// A `sparring admin` connection the server accepted before it was told
/// to stop is answered before it exits: a key it makes is shown, not made
/// and lost with the process.
#[tokio::test]
async fn an_admin_request_accepted_before_a_stop_is_answered() {
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let mut server = serve(dir.path());
    let mut conn = std::os::unix::net::UnixStream::connect(dir.path().join(sparring_impl::admin::SOCKET_FILE)).unwrap();
    // Accepted by now (an idle server; nothing says so), then the stop; the
    // request comes once the stopping server waits for it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.proc.signal("TERM");
    server.proc.expect("the stop to wait for the admin request", |o| {
        o.stderr.contains("stopping: answering the admin requests accepted")
    });
    conn.write_all(b"{\"create_key\":{\"email\":\"late@example.com\",\"label\":\"late\"}}\n").unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(&conn).read_line(&mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"));
    let key = answer["key"].as_str().unwrap_or_else(|| panic!("no key: {answer}")).to_string();
    let status = server.proc.wait_exit();
    assert!(status.success(), "{status}\n{}", server.proc.stderr());

    // The key shown is the one made.
    let server = serve(dir.path());
    let resp = http().get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn admin_grant_credits_adds_to_the_ledger_and_never_below_zero() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let (status, stdout, _) =
        run(&["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"]);
    assert!(status.success());
    let key = stdout.trim().to_string();
    let grant = |amount: &str| {
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", amount])
    };
    let (status, stdout, stderr) = grant("250");
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "ops@example.com now has 1250 credits", "the starting 1000 plus 250");
    let (status, _, stderr) = grant("-5000");
    assert!(!status.success());
    assert!(stderr.contains("below zero"), "{stderr}");
    // Past the largest balance: refused and said, not wrapped around.
    let (status, _, stderr) = grant(&i64::MAX.to_string());
    assert!(!status.success() && stderr.contains("would pass the largest balance"), "{stderr}");
    let (status, _, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "nobody@example.com", "--amount", "1"]);
    assert!(!status.success() && stderr.contains("no user"), "{stderr}");
    // Nothing to grant, or a description that is no line of text: refused,
    // nothing written.
    let (status, _, stderr) = grant("0");
    assert!(!status.success() && stderr.contains("--amount 0 grants nothing"), "{stderr}");
    for description in ["", "  ", "two\nlines"] {
        let (status, _, stderr) = run(&[
            "admin",
            "grant-credits",
            "--data-dir",
            data_dir,
            "--user",
            "ops@example.com",
            "--amount",
            "1",
            "--description",
            description,
        ]);
        assert!(!status.success() && stderr.contains("--description"), "{description:?}: {stderr}");
    }

    // Beside a running server too; the user found with case aside is named
    // by their stored address, not as typed.
    let mut server = serve(dir.path());
    let (status, stdout, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "OPS@Example.COM", "--amount", "100"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "ops@example.com now has 1350 credits");
    let (status, _, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "OPS@Example.COM", "--amount", "-5000"]);
    assert!(!status.success() && stderr.contains("ops@example.com has 1350 credits"), "{stderr}");
    // Some taken away, with no description given: the ledger does not say
    // they were granted.
    let (status, stdout, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", "-50"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "ops@example.com now has 1300 credits");
    // Named by id, as a project's members list shows the user.
    let project: Value = http()
        .post(server.url("/v1/projects"))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"name": "ops"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let members = server.url(&format!("/v1/projects/{}/members", project["id"].as_str().unwrap()));
    let members: Value = http().get(members).header("x-api-key", &key).send().await.unwrap().json().await.unwrap();
    let user_id = members["members"][0]["user_id"].as_str().unwrap().to_string();
    let (status, stdout, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", &user_id, "--amount", "7"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "ops@example.com now has 1307 credits");
    // An id given in upper case, or cut short, is said to be no user's id,
    // not an unknown email.
    for wrong in [user_id.to_uppercase(), "usr_nope".to_string()] {
        let (status, _, stderr) =
            run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", &wrong, "--amount", "7"]);
        assert!(!status.success(), "{wrong}");
        assert!(stderr.contains(&format!("no user with id {wrong} (a user id is `usr_` and 32")), "{stderr}");
    }
    let resp = http().get(server.url("/v1/transactions")).header("x-api-key", &key).send().await.unwrap();
    let ledger: Value = resp.json().await.unwrap();
    let entries: Vec<(String, i64, i64, String)> = ledger["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap().to_string(),
                t["amount"].as_i64().unwrap(),
                t["balance_after"].as_i64().unwrap(),
                t["description"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let entry =
        |kind: &str, amount, balance, description: &str| (kind.to_string(), amount, balance, description.into());
    let granted = "granted by an administrator";
    assert_eq!(
        entries,
        [
            entry("grant", 7, 1307, granted),
            entry("adjustment", -50, 1300, "taken away by an administrator"),
            entry("grant", 100, 1350, granted),
            entry("grant", 250, 1250, granted),
            entry("grant", 1000, 1000, "starting credits")
        ]
    );
    server.stop();
}

/// A grant (or a taking away) of credits is a mutation like any other: it
/// writes one activity record, in its transaction, by the administrator (the
/// system, as the ledger entry says "an administrator"), about the ledger
/// entry it made, with the amount and the balance after. The user whose
/// credits they are reads it through the activity operations, as they read
/// their own records; no one else does. A refused grant records nothing.
#[tokio::test]
async fn admin_grant_credits_writes_an_activity_record_its_user_reads() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let key_for = |email: &str| {
        let (status, stdout, stderr) =
            run(&["admin", "create-key", "--data-dir", data_dir, "--user", email, "--label", "deploy"]);
        assert!(status.success(), "{stderr}");
        stdout.trim().to_string()
    };
    let grant = |amount: &str| {
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", amount])
    };
    let key = key_for("ops@example.com");
    // Without a server, and beside one.
    assert!(grant("250").0.success());
    assert!(!grant("-5000").0.success(), "below zero: refused, nothing recorded");
    let server = serve(dir.path());
    assert!(grant("-50").0.success());
    let other = key_for("someone@example.com");

    let get = |key: String, path: String| {
        let request = http().get(server.url(&path)).header("x-api-key", key);
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let (_, ledger) = get(key.clone(), "/v1/transactions".into()).await;
    let entries = ledger["transactions"].as_array().unwrap();
    let (taken, granted) = (&entries[0], &entries[1]);
    assert_eq!((taken["amount"].as_i64(), granted["amount"].as_i64()), (Some(-50), Some(250)), "{ledger:#}");

    let (status, listed) = get(key.clone(), "/v1/activity?resource_type=transaction".into()).await;
    assert_eq!(status, 200, "{listed}");
    let records = listed["activity"].as_array().unwrap();
    assert_eq!(records.len(), 2, "one record per grant made, none for the refused one: {listed:#}");
    for (record, entry, action, balance) in
        [(&records[0], taken, "transaction.adjust", 1200), (&records[1], granted, "transaction.grant", 1250)]
    {
        assert_eq!(record["actor"], serde_json::json!({"user_id": null, "credential": "system", "api_key_id": null}));
        assert_eq!(record["action"], action, "{record:#}");
        assert_eq!(record["resource_id"], entry["id"], "{record:#}");
        assert_eq!(record["project_id"], Value::Null);
        assert_eq!(record["changes"]["amount"], entry["amount"], "{record:#}");
        assert_eq!(record["changes"]["balance_after"], balance, "{record:#}");
        assert_eq!(record["changes"]["description"], entry["description"], "{record:#}");
        // One at a time, and as the entry's history, to its user only.
        let id = record["id"].as_str().unwrap();
        assert_eq!(get(key.clone(), format!("/v1/activity/{id}")).await, (200, record.clone()));
        assert_eq!(get(other.clone(), format!("/v1/activity/{id}")).await.0, 404);
        let history = format!("/v1/activity/resource/transaction/{}", entry["id"].as_str().unwrap());
        assert_eq!(get(key.clone(), history.clone()).await.1["activity"], serde_json::json!([record]));
        assert_eq!(get(other.clone(), history).await.1["activity"], serde_json::json!([]));
    }
    let (_, theirs) = get(other.clone(), "/v1/activity?resource_type=transaction".into()).await;
    assert_eq!(theirs["activity"], serde_json::json!([]), "{theirs:#}");
    let mut server = server;
    server.stop();
}

/// A newer build's `admin grant-credits` beside a running server of an older
/// one must not migrate the database under it. The older server is played
/// by this test: it holds the data dir's lock, and the database says it is
/// one version behind.
#[test]
fn admin_grant_credits_does_not_migrate_under_an_older_running_server() {
    let dir = tempfile::tempdir().unwrap();
    data_dir_at(dir.path());
    let data_dir = dir.path().to_str().unwrap();
    let (status, _, stderr) =
        run(&["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"]);
    assert!(status.success(), "{stderr}");
    let db = dir.path().join(sparring_impl::DATABASE_FILE);
    let older = sparring_impl::store::SCHEMA_VERSION as i64 - 1;
    let version = || -> i64 {
        rusqlite::Connection::open(&db).unwrap().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap()
    };
    rusqlite::Connection::open(&db).unwrap().pragma_update(None, "user_version", older).unwrap();
    let server_lock = sparring_impl::lock_data_dir(dir.path()).unwrap();

    let (status, stdout, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", "5"]);
    assert!(!status.success(), "{stdout}");
    assert!(stderr.contains("older schema"), "{stderr}");
    assert_eq!(version(), older, "the database was not migrated");
    drop(server_lock);
}

/// `sparring demo` shows the whole product: a real batch run against the
/// reference agents, with the buggy agent's test failing for its real reason.
#[test]
fn the_demo_runs_a_batch_and_prints_its_results() {
    let (status, stdout, stderr) = run(&["demo"]);
    assert!(status.success(), "{status}: {stderr}\n{stdout}");
    let row = |name: &str| stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {stdout}"));
    assert!(row("Books over http").contains("100%"), "{stdout}");
    assert!(row("Books over websocket").contains("100%"), "{stdout}");
    let buggy = row("Books the right day (buggy agent)");
    assert!(buggy.contains(" 0%") && buggy.contains("right day"), "{buggy}");
    assert!(stdout.contains("passed: false (the CI gate)"), "{stdout}");
    assert!(stdout.contains("/v1/batch-runs/brn_"), "{stdout}");
    // Every URL printed to paste into a shell is quoted: one with a query
    // (`?`) is a glob to zsh, which refuses it unquoted.
    let activity = stdout.lines().find(|l| l.contains("/v1/activity?")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(activity.contains(" 'http://127.0.0.1:") && activity.ends_with('\''), "{activity}");
    assert!(stdout.contains(" sparring run --url http://127.0.0.1:") && stdout.contains(" --batch bat_"), "{stdout}");
    // How each test did, and one failed conversation to read.
    assert!(stdout.lines().any(|l| l.contains("/v1/batch-runs/brn_") && l.ends_with("/tests'")), "{stdout}");
    let result = stdout.lines().find(|l| l.contains(" sparring result --url http://127.0.0.1:"));
    assert!(result.is_some_and(|l| l.contains(" trs_")), "{stdout}");
}

/// A share of failing replies over 1 (or below 0) is refused, not taken as
/// "every reply".
#[test]
fn the_reference_agent_refuses_an_error_rate_that_is_no_share() {
    for rate in ["2", "-0.5", "NaN"] {
        let (status, _, stderr) = run(&["agent", "--bind", "127.0.0.1:0", &format!("--error-rate={rate}")]);
        assert_eq!(status.code(), Some(2), "{rate}: {stderr}");
        assert!(stderr.contains("--error-rate") && stderr.contains("must be from 0 to 1"), "{rate}: {stderr}");
    }
}

/// `sparring agent` says where to point channels: the protocols are served
/// at `/http` and `/ws`, and a channel at the bare address gets a 404 on
/// every turn.
#[tokio::test]
async fn the_reference_agent_prints_its_channel_targets() {
    let agent = common::process::Proc::spawn(&["agent", "--bind", "127.0.0.1:0"]);
    agent.expect("the channel targets", |o| o.stdout.contains("channel targets:"));
    let stdout = agent.stdout();
    let line = stdout.lines().find(|l| l.starts_with("channel targets:")).unwrap();
    let http_target = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap();
    let ws_target = line.split_whitespace().find(|w| w.starts_with("ws://")).unwrap();
    assert!(http_target.ends_with("/http") && ws_target.ends_with("/ws"), "{line}");
    let turn = serde_json::json!({"call_id": "call_1", "turn": 0, "event": "start", "message": null});
    let resp = http().post(http_target).json(&turn).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{http_target}");
    let reply: Value = resp.json().await.unwrap();
    assert!(reply["messages"].is_array(), "{reply}");
}

#[test]
fn bad_label_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    for label in ["", "   ", &"x".repeat(101)] {
        let (status, stdout, stderr) =
            run(&["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", label]);
        assert!(!status.success(), "label {label:?} accepted: {stdout}");
        assert!(stderr.contains("label"), "label {label:?}: stderr does not mention the label: {stderr}");
        assert!(!stdout.contains("spk_"), "label {label:?}: a key was printed: {stdout}");
    }
}

#[tokio::test]
async fn logs_are_json_and_carry_the_request_id_but_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, key) = first_start(dir.path());

    let client = http();
    let resp = client.get(server.url("/v1/api-keys")).header("x-api-key", &key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let req_id = resp.headers().get("x-request-id").expect("x-request-id header").to_str().unwrap().to_string();
    assert!(!req_id.is_empty());
    // A wrong key (one character changed) is not logged either.
    let mut wrong = key.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    let resp = client.get(server.url("/v1/api-keys")).header("x-api-key", &wrong).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    server.stop();
    let stderr = server.proc.stderr();
    let mut lines = 0;
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok_and(|v| v.is_object()), "not a JSON log line: {line}");
        lines += 1;
    }
    assert!(lines > 0);
    let needle = format!("\"req_id\":\"{req_id}\"");
    assert!(stderr.lines().any(|l| l.contains(&needle)), "no log line with {needle}:\n{stderr}");
    assert!(!stderr.contains(&key[12..]), "the key is in the log");
    assert!(!stderr.contains(&wrong[12..]), "a wrong key is in the log");
}

/// A first start that fails after the database was made (here: the address
/// is taken) must not lose the admin's key: the next start that serves
/// prints it, since no other start ever will.
#[test]
fn a_first_start_that_cannot_bind_does_not_lose_the_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bind = taken.local_addr().unwrap().to_string();
    let (status, stdout, stderr) = run(&["serve", "--bind", &bind, "--data-dir", data_dir]);
    assert!(!status.success(), "served on a taken address: {stdout}");
    assert!(stderr.contains(&bind), "the error does not name the address: {stderr}");
    assert!(stderr.contains("in use"), "the error does not say why: {stderr}");
    assert!(!stdout.contains("spk_"), "a key was printed by a server that never served: {stdout}");
    drop(taken);

    let mut server = serve(dir.path());
    let printed = server.proc.wait_for(|o| o.stdout.contains("/v1/api-keys\n"));
    server.stop();
    assert!(printed.is_ok(), "the admin key was never shown: {}", server.proc.stdout());
}

/// A first start whose stdout cannot take the key (a full disk, a pipe its
/// reader closed) goes on serving, and says in its log how to make the
/// admin a key; it crashed, with the key made and shown to no one.
#[test]
fn a_first_start_that_cannot_print_the_key_serves_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let log = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(common::process::BIN)
        .args(["serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = "sparring admin create-key --user admin@localhost";
    let deadline = std::time::Instant::now() + common::process::DEADLINE;
    while !std::fs::read_to_string(&log).unwrap().contains(said) {
        let ended = child.try_wait().unwrap();
        assert!(
            ended.is_none() && std::time::Instant::now() < deadline,
            "{ended:?}: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(child.try_wait().unwrap(), None, "{}", std::fs::read_to_string(&log).unwrap());
    let status = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(status.success());
    let ended = child.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(ended.success(), "{ended}: {logged}");
    assert!(!logged.contains("spk_"), "the key was logged: {logged}");
}

/// A project with a webhook secret: the database then holds a sealed value.
async fn seal_a_secret(server: &common::process::Server, key: &str) {
    let resp = http()
        .post(server.url("/v1/projects"))
        .header("x-api-key", key)
        .json(&serde_json::json!({"name": "p", "webhook_url": "https://hooks.example.com/x", "webhook_secret": "whsec_0123456789"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// A data dir whose database holds sealed secrets and whose secret key file
/// is gone: the server refuses to start, rather than make a new key that
/// opens none of them (and that the next start would take as the key).
#[tokio::test]
async fn a_missing_secret_key_is_not_replaced_under_sealed_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, key) = first_start(dir.path());
    seal_a_secret(&server, &key).await;
    server.stop();

    let key_file = dir.path().join("secret.key");
    std::fs::remove_file(&key_file).unwrap();
    let mut again =
        common::process::Proc::spawn(&["serve", "--bind", "127.0.0.1:0", "--data-dir", dir.path().to_str().unwrap()]);
    again.expect("the server to end or serve", |o| o.closed() || o.stderr.contains(common::process::SERVING));
    let stderr = again.stderr();
    assert!(!stderr.contains(common::process::SERVING), "served without the key that sealed its secrets: {stderr}");
    assert!(!again.wait_exit().success());
    assert!(stderr.contains("secret.key"), "the error does not name the key file: {stderr}");
    assert!(!key_file.exists(), "a new secret key was made");
}

/// A damaged `secret.key.previous` (kept by an unfinished rotation) stops
/// the server and a rotation, and the error names that file, not the key
/// file beside it that is fine.
#[tokio::test]
async fn a_damaged_previous_key_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let (mut server, _) = first_start(dir.path());
    server.stop();
    std::fs::write(dir.path().join("secret.key.previous"), "not a key\n").unwrap();
    for args in [
        &["serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir][..],
        &["admin", "rotate-secret-key", "--data-dir", data_dir],
    ] {
        let (status, _, stderr) = run(args);
        assert!(!status.success(), "{args:?}: {stderr}");
        let error = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{args:?}: {stderr}"));
        assert!(error.contains("secret.key.previous"), "{args:?}: the error does not name the damaged file: {error}");
    }
}

/// `admin rotate-secret-key` without the key file that sealed the data
/// dir's secrets (the server ran with `--secret-key-file`) refuses, and
/// says the database holds sealed secrets rather than that nothing was
/// ever sealed.
#[tokio::test]
async fn a_rotation_without_the_key_file_does_not_say_nothing_was_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("sparring.key");
    let mut server = common::process::serve_with(dir.path(), &["--secret-key-file", key_file.to_str().unwrap()]);
    server.proc.expect("the first-start key on stdout", |o| o.stdout.contains("/v1/api-keys\n"));
    let key = keys_in(&server.proc.stdout())[0].clone();
    seal_a_secret(&server, &key).await;
    server.stop();

    let (status, _, stderr) = run(&["admin", "rotate-secret-key", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(!status.success(), "{stderr}");
    assert!(!stderr.contains("nothing was ever sealed"), "a false reason: {stderr}");
    assert!(stderr.contains("--secret-key-file"), "the error does not point at --secret-key-file: {stderr}");
}

/// `admin backup` beside a running server: a directory another server starts
/// on, holding the data as of the backup (not what came after) and the
/// secret key that opens its sealed secrets; it never writes over anything.
#[tokio::test]
async fn a_backup_made_beside_a_running_server_starts_a_server_that_reads_its_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let (mut server, key) = first_start(dir.path());
    seal_a_secret(&server, &key).await;
    let backups = tempfile::tempdir().unwrap();
    let to = backups.path().join("nightly");
    let to_str = to.to_str().unwrap();

    let (status, stdout, stderr) = run(&["admin", "backup", "--data-dir", data_dir, "--to", to_str]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("1 sealed secrets, with the secret key"), "{stdout}");
    // Said before the copy starts, with how much it copies.
    assert!(stderr.contains(&format!("backing up {data_dir} to {to_str} (copying ")), "{stderr}");
    assert!(stderr.contains(" MB) …"), "{stderr}");
    // Written after the backup: not in it.
    let later = http()
        .post(server.url("/v1/projects"))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"name": "after the backup"}))
        .send()
        .await
        .unwrap();
    assert_eq!(later.status().as_u16(), 200);
    // Into a directory that holds anything: refused, nothing touched.
    let (status, _, stderr) = run(&["admin", "backup", "--data-dir", data_dir, "--to", to_str]);
    assert!(!status.success() && stderr.contains("is not empty"), "{stderr}");
    // A backup refused for its key (here: pointed at a key file that is
    // not there, under sealed secrets) removes its copy, a whole copy of
    // the data it was left as; trying again into the same directory works.
    let retried = backups.path().join("retried");
    let retried_str = retried.to_str().unwrap();
    let missing = backups.path().join("no.key");
    let (status, _, stderr) = run(&[
        "admin",
        "backup",
        "--data-dir",
        data_dir,
        "--secret-key-file",
        missing.to_str().unwrap(),
        "--to",
        retried_str,
    ]);
    assert!(!status.success() && stderr.contains("no secret key at"), "{stderr}");
    assert!(stderr.contains("the backup is not made, and its copy removed"), "{stderr}");
    assert!(!retried.join("sparring.db.partial").exists(), "{stderr}");
    let (status, stdout, stderr) = run(&["admin", "backup", "--data-dir", data_dir, "--to", retried_str]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("with the secret key"), "{stdout}");
    assert!(!retried.join("sparring.db.partial").exists() && retried.join("sparring.db").exists());
    server.stop();

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&to), 0o700);
        assert_eq!(mode(&to.join("secret.key")), 0o600);
        assert_eq!(mode(&to.join("sparring.db")), 0o600, "the copy is readable by its owner only, as the database is");
    }
    let names: std::collections::BTreeSet<String> =
        std::fs::read_dir(&to).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["secret.key", "sparring.db"].map(String::from).into(), "nothing partial is left");

    // A server on the backup: the key works, the project is there with its
    // webhook secret, the later one is not.
    let restored = common::process::serve(&to);
    restored.proc.expect("the server to serve", |o| o.stderr.contains(common::process::SERVING));
    let listed: serde_json::Value =
        http().get(restored.url("/v1/projects")).header("x-api-key", &key).send().await.unwrap().json().await.unwrap();
    let names: Vec<&str> = listed["projects"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["p"], "{listed}");
    assert_eq!(listed["projects"][0]["webhook_secret_configured"], true);
    let mut restored = restored;
    restored.stop();
    // Its sealed secret opens with the copied key: a rotation re-seals it.
    let (status, stdout, stderr) = run(&["admin", "rotate-secret-key", "--data-dir", to_str]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("re-sealed 1 stored secrets"), "{stdout}");

    // A data dir that is not one: said, and no directory made.
    let nowhere = backups.path().join("from-nothing");
    let (status, _, stderr) = run(&[
        "admin",
        "backup",
        "--data-dir",
        backups.path().join("none").to_str().unwrap(),
        "--to",
        nowhere.to_str().unwrap(),
    ]);
    assert!(!status.success() && stderr.contains("no database at"), "{stderr}");
    assert!(!nowhere.exists());

    // Into an empty directory made by someone else's umask: made the
    // owner's only too, or the copy would be there for every user to read.
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        let open = backups.path().join("open");
        std::fs::DirBuilder::new().mode(0o755).create(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (status, _, stderr) = run(&["admin", "backup", "--data-dir", data_dir, "--to", open.to_str().unwrap()]);
        assert!(status.success(), "{stderr}");
        assert_eq!(std::fs::metadata(&open).unwrap().permissions().mode() & 0o777, 0o700);
    }
}

/// `admin backup` with a key that opens none of the data dir's sealed
/// secrets (another data dir's, a wrong `--secret-key-file`) refuses: it
/// says which key file, and leaves nothing that looks like a backup.
#[tokio::test]
async fn a_backup_with_a_key_that_opens_nothing_sealed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let (mut server, key) = first_start(dir.path());
    seal_a_secret(&server, &key).await;
    server.stop();
    let elsewhere = tempfile::tempdir().unwrap();
    let wrong = elsewhere.path().join("other.key");
    sparring_impl::secrets::Secrets::load_or_create(&wrong).unwrap();
    let to = elsewhere.path().join("backup");

    let (status, stdout, stderr) = run(&[
        "admin",
        "backup",
        "--data-dir",
        data_dir,
        "--secret-key-file",
        wrong.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
    ]);
    assert!(!status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains("backed up"), "{stdout}");
    let error = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(error.contains(wrong.to_str().unwrap()), "the error does not name the key file: {error}");
    assert!(error.contains("SPARRING_SECRET_KEY_FILE"), "the error does not say what to do: {error}");
    assert!(!to.join("sparring.db").exists() && !to.join("secret.key").exists(), "a backup that looks made");
    // Nor a copy of the data left behind.
    assert!(error.contains("the backup is not made, and its copy removed"), "{error}");
    let left: Vec<_> = std::fs::read_dir(&to).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");

    // With the data dir's own key, into the same directory: made.
    let (status, stdout, stderr) = run(&["admin", "backup", "--data-dir", data_dir, "--to", to.to_str().unwrap()]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("1 sealed secrets, with the secret key"), "{stdout}");
}

/// A start that migrates the database says so before it does, and only
/// then: not on a new data dir, not on one already at this build's schema.
#[test]
fn a_start_that_migrates_the_database_says_so_first() {
    let dir = tempfile::tempdir().unwrap();
    // A database as the first release left it: its first migration alone.
    let conn = rusqlite::Connection::open(dir.path().join(sparring_impl::DATABASE_FILE)).unwrap();
    conn.execute_batch(include_str!("../impl/migrations/0001_foundation.sql")).unwrap();
    conn.pragma_update(None, "user_version", 1).unwrap();
    drop(conn);

    let mut server = serve(dir.path());
    let stderr = server.proc.stderr();
    let said =
        format!(r#""msg":"migrating the database from schema version 1 to {}""#, sparring_impl::store::SCHEMA_VERSION);
    let at = stderr.find(&said).unwrap_or_else(|| panic!("no {said} in: {stderr}"));
    assert!(at < stderr.find(common::process::SERVING).unwrap(), "{stderr}");
    server.stop();
    // At this build's schema now: nothing to say.
    let mut again = serve(dir.path());
    assert!(!again.proc.stderr().contains("migrating"), "{}", again.proc.stderr());
    again.stop();
    let fresh = tempfile::tempdir().unwrap();
    let (mut new, _) = first_start(fresh.path());
    assert!(!new.proc.stderr().contains("migrating"), "{}", new.proc.stderr());
    new.stop();
}

/// The admin commands that open the database themselves (no server holds
/// the data dir) migrate it as a start does, and say so on stderr first.
#[test]
fn an_admin_command_that_migrates_the_database_says_so_first() {
    // A data dir as the first release left it: its first migration alone.
    let old_data_dir = || {
        let dir = tempfile::tempdir().unwrap();
        let conn = rusqlite::Connection::open(dir.path().join(sparring_impl::DATABASE_FILE)).unwrap();
        conn.execute_batch(include_str!("../impl/migrations/0001_foundation.sql")).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        dir
    };
    let said = format!("migrating the database from schema version 1 to {}", sparring_impl::store::SCHEMA_VERSION);

    let dir = old_data_dir();
    let data_dir = dir.path().to_str().unwrap();
    let (status, stdout, stderr) =
        run(&["admin", "create-key", "--data-dir", data_dir, "--user", "ops@example.com", "--label", "deploy"]);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&said), "{stderr}");
    assert_eq!(keys_in(&stdout).len(), 1, "the key alone on stdout: {stdout}");
    // At this build's schema now: nothing to say.
    let (status, _, stderr) =
        run(&["admin", "grant-credits", "--data-dir", data_dir, "--user", "ops@example.com", "--amount", "5"]);
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("migrating"), "{stderr}");

    // The other two say it too, whatever comes of the command after it
    // (the user is unknown, the data dir has no secret key).
    for command in [
        &["admin", "grant-credits", "--user", "ops@example.com", "--amount", "5", "--data-dir"][..],
        &["admin", "rotate-secret-key", "--data-dir"][..],
    ] {
        let dir = old_data_dir();
        let (_, _, stderr) = run(&[command, &[dir.path().to_str().unwrap()]].concat());
        assert!(stderr.starts_with(&said), "{command:?}: {stderr}");
    }
}

/// `sparring demo`'s data dir is its owner's alone, as every data dir.
#[cfg(unix)]
#[test]
fn the_demo_data_dir_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let mut demo = common::process::Proc::spawn(&["demo", "--keep-running"]);
    demo.expect("the data dir", |o| o.stdout.contains("(data in "));
    let stdout = demo.stdout();
    let at = stdout.find("(data in ").unwrap() + "(data in ".len();
    let dir = std::path::PathBuf::from(&stdout[at..at + stdout[at..].find(')').unwrap()]);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
    let mode = std::fs::metadata(dir.join("sparring.db")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    demo.terminate();
}

/// Ctrl-C during the demo (its batch run), or SIGTERM while it keeps
/// running, stops it as its end does: its temporary data dir, which holds
/// the secret key beside a database with the demo's LLM key sealed in it,
/// is removed.
#[cfg(unix)]
#[test]
fn a_demo_stopped_by_a_signal_removes_its_data_dir() {
    let data_dir = |demo: &common::process::Proc| {
        demo.expect("the data dir", |o| o.stdout.contains("(data in "));
        let stdout = demo.stdout();
        let at = stdout.find("(data in ").unwrap() + "(data in ".len();
        std::path::PathBuf::from(&stdout[at..at + stdout[at..].find(')').unwrap()])
    };
    let mut demo = common::process::Proc::spawn(&["demo"]);
    let dir = data_dir(&demo);
    assert!(dir.join("secret.key").exists(), "{}", dir.display());
    demo.signal("INT");
    let status = demo.wait_exit();
    assert_eq!(status.code(), Some(1), "{status}: {}\n{}", demo.stdout(), demo.stderr());
    assert!(demo.stderr().contains("interrupted (SIGINT): the demo stops"), "{}", demo.stderr());
    assert!(!dir.exists(), "{} is left", dir.display());

    let mut demo = common::process::Proc::spawn(&["demo", "--keep-running"]);
    let dir = data_dir(&demo);
    demo.expect("the demo to end", |o| o.stdout.contains("keep running; Ctrl-C to stop"));
    let status = demo.terminate();
    assert!(status.success(), "{status}: {}", demo.stderr());
    assert!(!dir.exists(), "{} is left", dir.display());
}

/// A bad `serve` value is refused and named, not changed into another.
#[test]
fn out_of_range_serve_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    for (flag, value) in [
        ("--workers", "0"),
        ("--max-calls-per-user", "0"),
        ("--lease-seconds", "0"),
        // Past a day: a crashed server's runs would wait longer for a retry,
        // and a lease this long in milliseconds wraps below zero.
        ("--lease-seconds", "86401"),
        ("--lease-seconds", "18446744073709551"),
        ("--starting-credits", "-5"),
        ("--starting-credits=-5", ""),
    ] {
        let mut args = vec!["serve", "--bind", "127.0.0.1:0", "--data-dir", data_dir, flag];
        if !value.is_empty() {
            args.push(value);
        }
        let (status, _, stderr) = run(&args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        let name = flag.split('=').next().unwrap();
        assert!(stderr.contains("invalid value '") && stderr.contains(name), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a server started");
}

/// Errors that say what is wrong: a data dir that is a file, a port in use
/// for the agent (with the cause), an empty result id.
#[test]
fn misdirected_commands_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, "").unwrap();
    let (status, _, stderr) = run(&["serve", "--bind", "127.0.0.1:0", "--data-dir", file.to_str().unwrap()]);
    assert!(!status.success());
    assert!(stderr.contains(&format!("data dir {} is not a directory", file.display())), "{stderr}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bind = taken.local_addr().unwrap().to_string();
    let (status, _, stderr) = run(&["agent", "--bind", &bind]);
    assert!(!status.success());
    assert!(stderr.contains(&format!("failed to bind to {bind}: ")), "the cause is said: {stderr}");

    let (status, _, stderr) = run(&["result", "", "--api-key", "spk_x", "--url", "http://127.0.0.1:9"]);
    assert!(!status.success());
    assert!(stderr.contains("give the id of a test result"), "{stderr}");
}

/// `sparring` with `args`, its stdout closed before it writes anything (a
/// reader that stopped early: `| head -n1`).
fn with_stdout_closed(args: &[&str]) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(common::process::BIN)
        .args(args)
        .env_remove("SPARRING_DEMO_LLM_BASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// The commands that print what they did do it all the same when stdout
/// cannot take it: a reader that closed the pipe early (`| head -n1`) had
/// what it wanted, and a full disk is said, with what was done. `println!`
/// panicked in each (exit 101 and a backtrace), after the credits were
/// granted or the backup made, and the agent died before it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_do_their_work_when_stdout_cannot_take_their_lines() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    // The first start makes the admin user.
    first_start(dir.path()).0.stop();
    let closed = with_stdout_closed;
    let full = |args: &[&str]| {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        Command::new(common::process::BIN).args(args).stdin(Stdio::null()).stdout(full).output().unwrap()
    };
    let grant = ["admin", "grant-credits", "--data-dir", data_dir, "--user", "admin@localhost", "--amount", "5"];
    let out = closed(&grant);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{}: {stderr}", out.status);
    let out = full(&grant);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("admin@localhost now has 1010 credits (done, but stdout could not take"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let backup = dir.path().join("backup");
    let out = closed(&["admin", "backup", "--data-dir", data_dir, "--to", backup.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{}: {stderr}", out.status);
    assert!(backup.join("sparring.db").is_file(), "{stderr}");

    // The agent serves, and says in its log where.
    let full_stdout = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let mut agent = Command::new(common::process::BIN)
        .args(["agent", "--bind", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(full_stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut said = String::new();
    let address = loop {
        let mut line = String::new();
        if log.read_line(&mut line).unwrap() == 0 {
            panic!("the agent ended: {said}");
        }
        said.push_str(&line);
        if line.contains("could not print the address on stdout") {
            let at = line.split("address: ").nth(1).unwrap_or_else(|| panic!("{line}"));
            break at.split([',', ' ', '\n']).next().unwrap().to_string();
        }
    };
    let turn = serde_json::json!({"call_id": "call_1", "turn": 0, "event": "start", "message": null});
    let resp = http().post(format!("http://{address}/http")).json(&turn).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{said}");
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// The demo refuses an LLM endpoint that is not an http(s) URL before it
/// starts anything (it was the server's 400 once the project was made, in
/// the client's debug words), and it runs to its end, its temp dir removed,
/// for a reader that stopped after the first line (`sparring demo | head
/// -n1`): `println!` panicked there, exit 101 and a backtrace.
#[test]
fn the_demo_refuses_a_bad_llm_url_and_outlives_a_closed_stdout() {
    for url in ["notaurl", "ftp://llm.example.com/v1"] {
        let (status, _, stderr) = run(&["demo", "--llm-base-url", url]);
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--llm-base-url") && stderr.contains("must look like https://host"), "{stderr}");
        assert!(!stderr.contains("Error Response"), "{stderr}");
    }
    let out = with_stdout_closed(&["demo"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{}: {stderr}", out.status);
}

/// A start refused for its configuration (a port taken, an OIDC key set
/// that cannot be read or holds no key, an empty audience, a key file in no
/// directory) says why and leaves no data dir behind: the database and a
/// new secret key were made before these were looked at. An OIDC key set
/// with no key, or an empty audience, started a server that refused every
/// ID token.
#[test]
fn a_start_refused_for_its_configuration_leaves_no_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_at = taken.local_addr().unwrap().to_string();
    std::fs::write(path("empty.json"), r#"{"keys": []}"#).unwrap();
    std::fs::write(path("keyless.json"), r#"{"keys": [{"kty": "RSA", "kid": "k1"}]}"#).unwrap();
    let (missing, empty, keyless) = (path("missing.json"), path("empty.json"), path("keyless.json"));
    let oidc = |jwks: &str| {
        ["--oidc-issuer", "https://issuer.example", "--oidc-audience", "x", "--oidc-jwks", jwks]
            .map(String::from)
            .to_vec()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--bind".into(), taken_at.clone()], "Address already in use"),
        (oidc(&missing), "--oidc-jwks"),
        (oidc(&empty), "holds no public key to verify ID tokens with"),
        (oidc(&keyless), "holds no public key to verify ID tokens with"),
        (
            ["--oidc-issuer", "https://issuer.example", "--oidc-audience", " "].map(String::from).to_vec(),
            "--oidc-audience is empty",
        ),
        (vec!["--secret-key-file".into(), path("nowhere/secret.key")], "no directory"),
    ];
    let new = path("new");
    for (extra, said) in cases {
        let mut args = vec!["serve", "--data-dir", &new];
        if !extra.contains(&"--bind".to_string()) {
            args.extend(["--bind", "127.0.0.1:0"]);
        }
        args.extend(extra.iter().map(String::as_str));
        let (status, _, stderr) = run(&args);
        assert_eq!(status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains(said), "{extra:?}: {stderr}");
        assert!(!std::path::Path::new(&new).exists(), "{extra:?} left a data dir: {stderr}");
    }
    drop(taken);
}

/// Several issuers in the variables, written with a space after each
/// comma: each is taken trimmed. The issuer kept its space, matched no
/// token, and the server started all the same; the key file's path kept
/// its own and was not found.
#[tokio::test]
async fn oidc_lists_in_the_variables_may_have_spaces_after_their_commas() {
    use common::oidc::{jwks_of, sign, valid, AUDIENCE, ISSUER_KEY, OTHER_KEY};
    let dir = tempfile::tempdir().unwrap();
    let (b_jwks, a_jwks) = (dir.path().join("b.json"), dir.path().join("a.json"));
    std::fs::write(&b_jwks, jwks_of(OTHER_KEY, "k2").to_string()).unwrap();
    std::fs::write(&a_jwks, jwks_of(ISSUER_KEY, "k1").to_string()).unwrap();
    let data_dir = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bind = format!("127.0.0.1:{port}");
    let jwks = format!("{}, {}", b_jwks.display(), a_jwks.display());
    let mut server = common::process::Server {
        proc: common::process::Proc::spawn_with_env(
            &["serve", "--bind", &bind, "--data-dir", data_dir.to_str().unwrap(), "--log-format", "json"],
            &[
                ("SPARRING_OIDC_ISSUER", "https://b.example, https://a.example"),
                ("SPARRING_OIDC_AUDIENCE", &format!("{AUDIENCE} ")),
                ("SPARRING_OIDC_JWKS", &jwks),
            ],
        ),
        base: format!("http://{bind}"),
    };
    server.proc.expect("the server to serve", |o| o.stderr.contains(common::process::SERVING));
    let token = sign(valid("https://a.example", "alice"));
    let resp = http().get(server.url("/v1/api-keys")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{}", resp.text().await.unwrap());
    server.stop();
}

/// A database file this user may not write is named at start, with why:
/// SQLite opened it read-only without a word, and the first write failed
/// naming no file ("attempt to write a readonly database"). Root may write
/// any file, so as root the server runs as `nobody` (`setpriv`).
#[test]
fn a_database_this_user_cannot_write_is_named_at_start() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let data_dir = dir.path().join("data");
    let data_dir = data_dir.to_str().unwrap();
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    // A copy `nobody` can reach (the build's directory may be root's alone).
    let bin = dir.path().join("sparring");
    if root {
        std::fs::copy(common::process::BIN, &bin).unwrap();
    }
    let command = || {
        let mut cmd = if root {
            let mut cmd = std::process::Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&bin);
            cmd
        } else {
            std::process::Command::new(common::process::BIN)
        };
        cmd.args(["serve", "--data-dir", data_dir, "--bind", "127.0.0.1:0", "--log-format", "json"]);
        cmd
    };
    let mut first = common::process::Proc::spawn_command(command(), "the first start");
    first.expect("the server to serve", |o| o.stderr.contains(common::process::SERVING));
    assert!(first.terminate().success(), "{}", first.stderr());
    let database = dir.path().join("data/sparring.db");
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o444)).unwrap();
    let mut again = common::process::Proc::spawn_command(command(), "the start on a read-only database");
    let status = again.wait_exit();
    let stderr = again.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let said = format!("database {} cannot be written by this user", database.display());
    assert!(stderr.contains(&said) && stderr.contains("Permission denied"), "{stderr}");
}
