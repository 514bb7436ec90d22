//! A real Sparring server for tests: `sparring_impl::start` on an ephemeral
//! loopback port, over a fresh SQLite file in a temporary data dir, with its
//! log captured so tests can check what it wrote.
#![allow(dead_code)]

pub mod engine;
pub mod oidc;
pub mod process;
pub mod spec;

use std::io::Write;
use std::sync::{Arc, Mutex};

use slog::Drain as _;
use sparring_impl::oidc::IssuerConfig;

/// A loopback port that refuses connections for as long as this lives: a
/// socket bound to it that never listens. A port that was merely bound and
/// let go can be taken by another test's server before it is used, and then
/// answers where a refusal was expected.
pub struct ClosedPort {
    _held: tokio::net::TcpSocket,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind(([127, 0, 0, 1], 0).into()).unwrap();
        let port = held.local_addr().unwrap().port();
        ClosedPort { _held: held, port }
    }

    /// `http://127.0.0.1:{port}/http`, a channel target that is not there.
    pub fn http_target(&self) -> String {
        format!("http://127.0.0.1:{}/http", self.port)
    }
}

/// A loopback port where a connection is never made for as long as this
/// lives, as at an address that does not answer: a listener with a backlog
/// of 0 whose accept queue is full of connections it never accepts, so
/// Linux drops the SYN of a new one (which the connecting side sends again
/// 1 s later, then 2 s after that, and so on) and the connect hangs, until
/// [`UnansweredPort::next`] makes room. (The engine's unit tests have the
/// same in `sparring_impl::engine::unanswered_port`.)
pub struct UnansweredPort {
    listener: tokio::net::TcpListener,
    queued: Vec<tokio::net::TcpStream>,
    pub port: u16,
}

impl UnansweredPort {
    pub async fn new() -> UnansweredPort {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
        let listener = socket.listen(0).unwrap();
        let address = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        loop {
            let connecting = tokio::net::TcpStream::connect(address);
            match tokio::time::timeout(std::time::Duration::from_millis(200), connecting).await {
                Ok(stream) => queued.push(stream.unwrap()),
                Err(_) => return UnansweredPort { listener, queued, port: address.port() },
            }
            assert!(queued.len() < 16, "the accept queue of a backlog of 0 never filled");
        }
    }

    /// Sockets connecting to it now, their SYN sent (and dropped): read
    /// from the kernel's table of IPv4 TCP sockets.
    pub fn connecting(&self) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let syn_sent = |line: &&str| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields.get(2).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            port == Some(self.port) && fields.get(3) == Some(&"02")
        };
        table.lines().skip(1).filter(syn_sent).count()
    }

    /// The next connection not its own: makes room in the accept queue
    /// (accepting its own queued connections and closing them) for it.
    pub async fn next(&mut self) -> tokio::net::TcpStream {
        let own: std::collections::HashSet<_> = self.queued.iter().map(|s| s.local_addr().unwrap()).collect();
        loop {
            let (stream, peer) = self.listener.accept().await.unwrap();
            if !own.contains(&peer) {
                return stream;
            }
        }
    }
}

#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    pub fn contents(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

pub struct TestServer {
    pub base: String,
    pub admin_key: String,
    pub log: LogBuffer,
    pub data_dir: tempfile::TempDir,
    pub http: reqwest::Client,
    server: Option<sparring_impl::RunningServer>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with_oidc(Vec::new()).await
    }

    pub async fn start_with_oidc(oidc: Vec<IssuerConfig>) -> TestServer {
        Self::start_configured(oidc, |_| {}).await
    }

    /// A server whose configuration `adjust` changes (workers, credits, …).
    pub async fn start_configured(
        oidc: Vec<IssuerConfig>,
        adjust: impl FnOnce(&mut sparring_impl::Config),
    ) -> TestServer {
        let data_dir = tempfile::tempdir().unwrap();
        let log = LogBuffer::default();
        // Debug level, so that anything a handler logs is in the buffer.
        let drain = slog_bunyan::with_name("sparring-test", log.clone()).build();
        let logger = slog::Logger::root(Mutex::new(drain).fuse(), slog::o!());
        let mut config = sparring_impl::Config {
            bind: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.path().to_path_buf(),
            oidc,
            oidc_refetch_interval: sparring_impl::oidc::REFETCH_INTERVAL,
            oidc_keys_max_age: sparring_impl::oidc::KEYS_MAX_AGE,
            secret_key_file: None,
            // The agents and stand-ins of the tests listen on loopback.
            engine: sparring_impl::engine::worker::EngineConfig { allow_private_targets: true, ..Default::default() },
            starting_credits: sparring_impl::credits::DEFAULT_STARTING_CREDITS,
            body_idle_timeout: sparring_server::BODY_IDLE_TIMEOUT,
        };
        adjust(&mut config);
        let server = sparring_impl::start(config, logger).await.unwrap();
        let admin_key = server.first_start_key.clone().expect("a fresh database gets an admin key");
        TestServer {
            base: format!("http://{}", server.local_addr()),
            admin_key,
            log,
            data_dir,
            http: reqwest::Client::new(),
            server: Some(server),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The generated client, authenticated with `key`.
    pub fn client(&self, key: &str) -> sparring_client::Client {
        sparring_client::Client::with_api_key(&format!("{}/v1", self.base), key).unwrap()
    }

    /// A key for another user, made the way an operator would (`sparring
    /// admin create-key`, through the server's admin socket).
    pub async fn key_for_user(&self, email: &str) -> String {
        sparring_impl::admin::create_key(self.data_dir.path(), email.to_string(), "test".to_string()).await.unwrap()
    }

    pub async fn get(&self, path: &str, key: &str) -> reqwest::Response {
        self.http.get(self.url(path)).header("x-api-key", key).send().await.unwrap()
    }

    pub async fn post_json(&self, path: &str, key: &str, body: &str) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Stops the server and returns the database file's bytes (WAL
    /// checkpointed into it by the close).
    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await.unwrap();
        }
    }

    /// Every byte the server stored: the database and its WAL.
    pub fn stored_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.data_dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                all.extend(std::fs::read(path).unwrap());
            }
        }
        all
    }
}

/// `{error_code, message, request_id}`, checked for shape.
pub async fn error_body(resp: reqwest::Response) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    let header_id = resp.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string());
    let body: serde_json::Value = resp.json().await.unwrap();
    for field in ["error_code", "message", "request_id"] {
        assert!(body[field].is_string(), "error body lacks {field}: {body}");
    }
    assert_eq!(Some(body["request_id"].as_str().unwrap().to_string()), header_id, "request id in body and header");
    (status, body)
}

/// Every item of the list at `path` (with its query, and its `limit` if
/// any), following the cursors, in the order served.
pub async fn items_of_pages(s: &TestServer, key: &str, path: &str, field: &str) -> Vec<serde_json::Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let at = cursor.as_ref().map(|c| format!("{sep}cursor={c}")).unwrap_or_default();
        let page = s.expect(reqwest::Method::GET, &format!("{path}{at}"), key, None, 200).await;
        items.extend(page[field].as_array().unwrap().iter().cloned());
        assert!(items.len() <= 10_000, "the pages of {path} do not end");
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return items,
        }
    }
}

/// [`items_of_pages`]: each item's `item_key` (its `id`, or what names it).
pub async fn keys_of_pages(s: &TestServer, key: &str, path: &str, field: &str, item_key: &str) -> Vec<String> {
    let items = items_of_pages(s, key, path, field).await;
    items.iter().map(|v| v[item_key].as_str().unwrap().to_string()).collect()
}

/// Another id of the same kind that does not exist: the last hex digit
/// changed.
pub fn missing_id(id: &str) -> String {
    let mut s = id.to_string();
    let last = s.pop().unwrap();
    s.push(if last == '0' { '1' } else { '0' });
    s
}

pub fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A project with one member of each role, and an outsider.
pub struct Team {
    pub project_id: String,
    pub owner: String,
    pub editor: String,
    pub reviewer: String,
    pub viewer: String,
    /// Signed in, not a member.
    pub outsider: String,
}

impl Team {
    /// `(role name, key)` for every role and the outsider, most to least
    /// privileged.
    pub fn all(&self) -> [(&'static str, &str); 5] {
        [
            ("owner", &self.owner),
            ("editor", &self.editor),
            ("reviewer", &self.reviewer),
            ("viewer", &self.viewer),
            ("outsider", &self.outsider),
        ]
    }
}

impl TestServer {
    pub async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<serde_json::Value>,
    ) -> reqwest::Response {
        let mut req = self.http.request(method, self.url(path)).header("x-api-key", key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send().await.unwrap()
    }

    /// Sends and expects `status`, returning the JSON body.
    pub async fn expect(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<serde_json::Value>,
        status: u16,
    ) -> serde_json::Value {
        let resp = self.send_json(method.clone(), path, key, body).await;
        let got = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert_eq!(got, status, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Creates a project owned by `key`'s user; returns its id.
    pub async fn create_project(&self, key: &str, name: &str) -> String {
        let body =
            self.expect(reqwest::Method::POST, "/v1/projects", key, Some(serde_json::json!({"name": name})), 200).await;
        body["id"].as_str().unwrap().to_string()
    }

    /// Adds the user with `email` to the project as `role`, as `owner`;
    /// the member as answered.
    pub async fn add_member(&self, owner: &str, project_id: &str, email: &str, role: &str) -> serde_json::Value {
        self.expect(
            reqwest::Method::POST,
            &format!("/v1/projects/{project_id}/members"),
            owner,
            Some(serde_json::json!({"email": email, "role": role})),
            200,
        )
        .await
    }

    /// A user per role in a new project (each with their own key), and an
    /// outsider.
    pub async fn team(&self, name: &str) -> Team {
        let tag = &uuid_like();
        let owner = self.key_for_user(&format!("owner-{tag}@example.com")).await;
        let project_id = self.create_project(&owner, name).await;
        let mut keys = Vec::new();
        for role in ["editor", "reviewer", "viewer"] {
            let email = format!("{role}-{tag}@example.com");
            let key = self.key_for_user(&email).await;
            self.add_member(&owner, &project_id, &email, role).await;
            keys.push(key);
        }
        let outsider = self.key_for_user(&format!("outsider-{tag}@example.com")).await;
        let mut keys = keys.into_iter();
        Team {
            project_id,
            owner,
            editor: keys.next().unwrap(),
            reviewer: keys.next().unwrap(),
            viewer: keys.next().unwrap(),
            outsider,
        }
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}
