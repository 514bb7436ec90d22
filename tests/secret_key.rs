//! The server's secret key: created with mode 0600, rotated with every
//! stored secret re-sealed, never while a server holds the data dir.

mod common;

use common::{contains, TestServer};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn rotation_reseals_everything_and_needs_the_server_stopped() {
    let mut s = TestServer::start().await;
    let key_file = s.data_dir.path().join("secret.key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let secret = "whsec_rotate_me_0123456789";
    let project = s
        .expect(
            Method::POST,
            "/v1/projects",
            &s.admin_key,
            Some(json!({"name": "sealed", "webhook_url": "https://hooks.example.com/x", "webhook_secret": secret})),
            200,
        )
        .await;
    assert_eq!(project["webhook_secret_configured"], true);

    // Not while the server runs.
    let busy = sparring_impl::rotate_secret_key(s.data_dir.path(), None).await;
    assert!(busy.unwrap_err().to_string().contains("in use"));

    s.stop().await;
    assert!(!contains(&s.stored_bytes(), secret), "the secret is sealed at rest");
    assert!(!s.log.contents().contains(secret), "the secret is never logged");
    let history = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let changes: Vec<String> = history
        .read::<_, sparring_impl::store::StoreError, _>(|tx| {
            let mut stmt = tx.prepare("SELECT changes FROM activity")?;
            let rows = stmt.query_map([], |r| r.get(0))?.collect::<Result<Vec<String>, _>>()?;
            Ok(rows)
        })
        .await
        .unwrap();
    assert!(changes.iter().any(|c| c.contains("webhook_secret") && c.contains("***")), "{changes:?}");
    let before = std::fs::read(&key_file).unwrap();
    assert_eq!(sparring_impl::rotate_secret_key(s.data_dir.path(), None).await.unwrap(), 1);
    let after = std::fs::read(&key_file).unwrap();
    assert_ne!(before, after);
    assert!(!s.data_dir.path().join("secret.key.previous").exists());
    // Every value opens with the new key (a second rotation opens them all).
    assert_eq!(sparring_impl::rotate_secret_key(s.data_dir.path(), None).await.unwrap(), 1);

    // Another key (a wrong --secret-key-file) opens none of them: the
    // server does not start on it.
    let elsewhere = tempfile::tempdir().unwrap();
    let wrong = elsewhere.path().join("secret.key");
    sparring_impl::secrets::Secrets::load_or_create(&wrong).unwrap();
    let config = sparring_impl::Config {
        bind: "127.0.0.1:0".parse().unwrap(),
        data_dir: s.data_dir.path().to_path_buf(),
        oidc: Vec::new(),
        oidc_refetch_interval: sparring_impl::oidc::REFETCH_INTERVAL,
        oidc_keys_max_age: sparring_impl::oidc::KEYS_MAX_AGE,
        secret_key_file: Some(wrong),
        engine: Default::default(),
        starting_credits: sparring_impl::credits::DEFAULT_STARTING_CREDITS,
        body_idle_timeout: sparring_server::BODY_IDLE_TIMEOUT,
    };
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let refused = sparring_impl::start(config, log).await.err().expect("a key that opens nothing");
    let message = format!("{refused:#}");
    assert!(message.contains("does not open what") && message.contains("webhook_secret"), "{message}");
}

/// A secret sent in the wrong shape (a string where the credentials object
/// goes, a number for a webhook secret, a header value that is not a
/// string) is refused without being echoed: not in the error the client
/// gets, not in the log.
#[tokio::test]
async fn a_misshapen_secret_is_not_echoed_in_the_error_or_the_log() {
    let s = TestServer::start().await;
    let project = s.create_project(&s.admin_key, "p").await;
    let cases = [
        (
            "/v1/integrations",
            json!({"project_id": project, "provider": "openai_compatible", "name": "llm",
                   "config": {"base_url": "https://llm.example.com/v1", "model": "m"},
                   "credentials": "sk-live-misshapen-0123456789"}),
            "sk-live-misshapen-0123456789",
        ),
        ("/v1/projects", json!({"name": "q", "webhook_secret": 918273645546372819_i64}), "918273645546372819"),
        (
            "/v1/channels",
            json!({"project_id": project, "name": "c", "kind": "http", "target": "https://agent.example.com",
                   "headers": {"authorization": ["Bearer tok-misshapen-0123456789"]}}),
            "tok-misshapen-0123456789",
        ),
    ];
    for (path, body, secret) in &cases {
        let resp = s.post_json(path, &s.admin_key, &body.to_string()).await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 400, "{path}: {text}");
        assert!(!text.contains(secret), "{path}: the secret is in the error: {text}");
    }
    let log = s.log.contents();
    for (_, _, secret) in &cases {
        assert!(!log.contains(secret), "the secret {secret} is in the log");
    }
}
