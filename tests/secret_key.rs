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
}
