//! ID tokens from a loopback OpenID Connect issuer that this test runs: its
//! own RSA keys, discovery document and JWKS served over HTTP.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use common::oidc::{jwks_of, sign, signing_key, valid, Token, AUDIENCE, ISSUER_KEY, OTHER_KEY};
use common::{error_body, TestServer};
use dropshot::{ApiDescription, HttpError, HttpResponseOk, RequestContext, ServerBuilder};
use openidconnect::core::{CoreJsonWebKeySet, CoreJwsSigningAlgorithm};
use openidconnect::PrivateSigningKey as _;
use sparring_impl::oidc::IssuerConfig;

struct Issuer {
    /// Set once the server has bound its port.
    url: OnceLock<String>,
    /// The keys it publishes (a test rotates them).
    jwks: Mutex<serde_json::Value>,
    jwks_fetches: AtomicUsize,
    /// How long it takes to answer for its keys (a slow issuer).
    jwks_delay: Mutex<Duration>,
}

impl Issuer {
    fn url(&self) -> String {
        self.url.get().expect("set at start").clone()
    }
}

#[dropshot::endpoint { method = GET, path = "/.well-known/openid-configuration" }]
async fn discovery(rqctx: RequestContext<Arc<Issuer>>) -> Result<HttpResponseOk<serde_json::Value>, HttpError> {
    let url = rqctx.context().url();
    Ok(HttpResponseOk(serde_json::json!({
        "issuer": url,
        "authorization_endpoint": format!("{url}/authorize"),
        "jwks_uri": format!("{url}/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
    })))
}

#[dropshot::endpoint { method = GET, path = "/jwks" }]
async fn jwks_document(rqctx: RequestContext<Arc<Issuer>>) -> Result<HttpResponseOk<serde_json::Value>, HttpError> {
    rqctx.context().jwks_fetches.fetch_add(1, Ordering::SeqCst);
    let delay = *rqctx.context().jwks_delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    Ok(HttpResponseOk(rqctx.context().jwks.lock().unwrap().clone()))
}

fn published_jwks() -> serde_json::Value {
    jwks_of(ISSUER_KEY, "k1")
}

/// Starts the loopback issuer; returns it and its URL.
async fn start_issuer() -> (Arc<Issuer>, dropshot::HttpServer<Arc<Issuer>>) {
    let issuer = Arc::new(Issuer {
        url: OnceLock::new(),
        jwks: Mutex::new(published_jwks()),
        jwks_fetches: AtomicUsize::new(0),
        jwks_delay: Mutex::new(Duration::ZERO),
    });
    let mut api = ApiDescription::new();
    api.register(discovery).unwrap();
    api.register(jwks_document).unwrap();
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let bind_address = "127.0.0.1:0".parse().unwrap();
    let server = ServerBuilder::new(api, issuer.clone(), log)
        .config(dropshot::ConfigDropshot { bind_address, ..Default::default() })
        .start()
        .unwrap();
    // The documents name the URL, known once the port is bound; nothing
    // asks for them before this returns.
    issuer.url.set(format!("http://{}", server.local_addr())).unwrap();
    (issuer, server)
}

async fn status_with_token(s: &TestServer, token: &str) -> u16 {
    let resp = s.http.get(s.url("/v1/api-keys")).bearer_auth(token).send().await.unwrap();
    let status = resp.status().as_u16();
    if status == 401 {
        assert!(resp.headers().get("www-authenticate").is_some());
        let (_, body) = error_body(resp).await;
        assert_eq!(body["error_code"], "unauthenticated");
    }
    status
}

async fn oidc_users(s: &TestServer, subject: &str) -> i64 {
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let subject = subject.to_string();
    store
        .read::<_, sparring_impl::store::StoreError, _>(move |tx| {
            Ok(tx.query_row("SELECT count(*) FROM users WHERE oidc_subject = ?1", [subject], |r| r.get(0))?)
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn id_tokens_from_a_discovered_issuer() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = TestServer::start_with_oidc(vec![IssuerConfig {
        issuer: url.clone(),
        audience: AUDIENCE.into(),
        jwks_file: None,
    }])
    .await;

    // Valid: 200, and the user exists (once, however often they call).
    assert_eq!(status_with_token(&s, &sign(valid(&url, "alice"))).await, 200);
    assert_eq!(status_with_token(&s, &sign(valid(&url, "alice"))).await, 200);
    assert_eq!(oidc_users(&s, "alice").await, 1);

    // Each way a token can be wrong: 401.
    let expired = sign(Token { expires_in: -120, ..valid(&url, "alice") });
    let wrong_audience = sign(Token { audience: "someone-else", ..valid(&url, "alice") });
    let wrong_issuer = sign(Token { issuer: "http://127.0.0.1:1", ..valid(&url, "alice") });
    let bad_signature = sign(Token { key_pem: OTHER_KEY, ..valid(&url, "alice") });
    let unknown_kid = sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(&url, "alice") });
    let alg_none = {
        let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let payload = valid_payload(&url);
        format!("{}.{}.", b64(serde_json::json!({"alg": "none", "typ": "JWT"})), b64(payload))
    };
    for (name, token) in [
        ("expired", expired),
        ("wrong audience", wrong_audience),
        ("wrong issuer", wrong_issuer),
        ("bad signature", bad_signature),
        ("unknown kid", unknown_kid.clone()),
        ("alg none", alg_none),
        ("garbage", "not.a.token".to_string()),
    ] {
        assert_eq!(status_with_token(&s, &token).await, 401, "{name}");
    }

    // Unknown kids refetch the keys at most once a minute.
    let before = issuer.jwks_fetches.load(Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(status_with_token(&s, &unknown_kid).await, 401);
    }
    assert!(issuer.jwks_fetches.load(Ordering::SeqCst) - before <= 1);

    // If x-api-key is present it alone decides: a bad key with a good
    // token is a 401.
    let resp = s
        .http
        .get(s.url("/v1/api-keys"))
        .header("x-api-key", "spk_wrong")
        .bearer_auth(sign(valid(&url, "alice")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

fn valid_payload(url: &str) -> serde_json::Value {
    let now = chrono::Utc::now().timestamp();
    serde_json::json!({"iss": url, "aud": AUDIENCE, "sub": "alice", "exp": now + 600, "iat": now - 60})
}

#[tokio::test]
async fn fifty_concurrent_creates_from_zero_keys_give_exactly_twenty_five() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = TestServer::start_with_oidc(vec![IssuerConfig {
        issuer: url.clone(),
        audience: AUDIENCE.into(),
        jwks_file: None,
    }])
    .await;
    let token = sign(valid(&url, "carol"));
    let mut tasks = Vec::new();
    for i in 0..50 {
        let http = s.http.clone();
        let (u, token) = (s.url("/v1/api-keys"), token.clone());
        tasks.push(tokio::spawn(async move {
            http.post(u)
                .bearer_auth(token)
                .json(&serde_json::json!({"label": format!("k{i}")}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let statuses: Vec<u16> = futures::future::join_all(tasks).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 25, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 25, "{statuses:?}");
}

#[tokio::test]
async fn id_tokens_verified_with_an_offline_key_set() {
    let dir = tempfile::tempdir().unwrap();
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, published_jwks().to_string()).unwrap();
    // Nothing listens at this issuer URL: the keys come from the file only.
    let url = "https://issuer.invalid";
    let s = TestServer::start_with_oidc(vec![IssuerConfig {
        issuer: url.into(),
        audience: AUDIENCE.into(),
        jwks_file: Some(jwks_path),
    }])
    .await;
    let token = sign(valid(url, "dave"));
    assert_eq!(status_with_token(&s, &token).await, 200);
    assert_eq!(status_with_token(&s, &sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(url, "dave") })).await, 401);

    // The same valid token twice: refused, as any credential header sent twice.
    let bearer = format!("Bearer {token}");
    let resp = s.http.get(s.url("/v1/api-keys")).header("authorization", &bearer).header("authorization", &bearer);
    let (status, body) = error_body(resp.send().await.unwrap()).await;
    assert_eq!((status, body["error_code"].as_str()), (401, Some("unauthenticated")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("one `authorization` header"), "{body}");
}

/// One issuer configured twice, for two clients (say a web app and a CLI):
/// tokens for either audience are accepted, for any other refused. The
/// same issuer with two key sets is refused at startup.
#[tokio::test]
async fn an_issuer_given_for_two_audiences_accepts_either() {
    let dir = tempfile::tempdir().unwrap();
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, published_jwks().to_string()).unwrap();
    let url = "https://issuer.invalid";
    let config = |audience: &str| IssuerConfig {
        issuer: url.into(),
        audience: audience.into(),
        jwks_file: Some(jwks_path.clone()),
    };
    let s = TestServer::start_with_oidc(vec![config("web-client"), config("cli-client")]).await;
    for audience in ["web-client", "cli-client"] {
        assert_eq!(status_with_token(&s, &sign(Token { audience, ..valid(url, "gina") })).await, 200, "{audience}");
    }
    assert_eq!(status_with_token(&s, &sign(Token { audience: "other", ..valid(url, "gina") })).await, 401);
    // A token for both is for either; one also for a client not configured
    // here is refused (OpenID Connect Core 3.1.3.7: no untrusted audience).
    let for_audiences = |audiences: serde_json::Value| {
        let mut payload = valid_payload(url);
        payload["sub"] = "gina".into();
        payload["aud"] = audiences;
        payload["azp"] = "web-client".into();
        sign_payload(payload)
    };
    assert_eq!(status_with_token(&s, &for_audiences(serde_json::json!(["web-client", "cli-client"]))).await, 200);
    assert_eq!(status_with_token(&s, &for_audiences(serde_json::json!(["web-client", "other"]))).await, 401);

    let other = dir.path().join("other.json");
    std::fs::write(&other, jwks_of(OTHER_KEY, "k2").to_string()).unwrap();
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let two_key_sets = vec![config("web-client"), IssuerConfig { jwks_file: Some(other), ..config("cli-client") }];
    let refused = sparring_impl::oidc::Oidc::new(
        two_key_sets,
        sparring_impl::oidc::REFETCH_INTERVAL,
        sparring_impl::oidc::KEYS_MAX_AGE,
        &log,
    )
    .await
    .err()
    .expect("one issuer, two key sets");
    assert!(refused.to_string().contains("given twice with different key sets"), "{refused}");
}

/// Keys are fetched again once older than their maximum age, though no
/// token asks for a key the server does not hold: a key the issuer withdrew
/// stops being trusted, remembered tokens signed with it included.
#[tokio::test]
async fn keys_older_than_their_maximum_age_are_fetched_again() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let config = IssuerConfig { issuer: url.clone(), audience: AUDIENCE.into(), jwks_file: None };
    let s = TestServer::start_configured(vec![config], |c| {
        c.oidc_refetch_interval = Duration::ZERO;
        c.oidc_keys_max_age = Duration::from_millis(300);
    })
    .await;
    let old = sign(valid(&url, "hana"));
    assert_eq!(status_with_token(&s, &old).await, 200, "verified, and remembered");
    let fetches = issuer.jwks_fetches.load(Ordering::SeqCst);
    // The issuer withdraws k1; only tokens signed with it come.
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status_with_token(&s, &old).await == 200 {
        assert!(std::time::Instant::now() < deadline, "a withdrawn key is still trusted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(issuer.jwks_fetches.load(Ordering::SeqCst) > fetches);
    assert_eq!(status_with_token(&s, &sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(&url, "hana") })).await, 200);
}

#[tokio::test]
async fn activity_records_name_the_id_token_actor() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = TestServer::start_with_oidc(vec![IssuerConfig {
        issuer: url.clone(),
        audience: AUDIENCE.into(),
        jwks_file: None,
    }])
    .await;
    let token = sign(valid(&url, "erin"));
    let resp = s
        .http
        .post(s.url("/v1/projects"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"name": "by token"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let project: serde_json::Value = resp.json().await.unwrap();
    let id = project["id"].as_str().unwrap();
    let resp =
        s.http.get(s.url(&format!("/v1/activity/resource/project/{id}"))).bearer_auth(&token).send().await.unwrap();
    let history: serde_json::Value = resp.json().await.unwrap();
    let record = &history["activity"][0];
    assert_eq!(record["action"], "project.create");
    assert_eq!(record["actor"]["credential"], "id_token");
    assert!(record["actor"]["api_key_id"].is_null());
    assert!(record["actor"]["user_id"].as_str().unwrap().starts_with("usr_"));
    assert!(!history.to_string().contains(&token), "the token is never recorded");
}

/// A server trusting the loopback issuer at `url` that fetches its keys
/// again at most once per `interval` (the server's minute would make these
/// tests wait).
async fn start_refetching(url: &str, interval: Duration) -> TestServer {
    let issuer = IssuerConfig { issuer: url.to_string(), audience: AUDIENCE.into(), jwks_file: None };
    TestServer::start_configured(vec![issuer], |c| c.oidc_refetch_interval = interval).await
}

#[tokio::test]
async fn keys_the_issuer_rotates_are_fetched_and_tokens_of_withdrawn_keys_refused() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, Duration::ZERO).await;
    let old = sign(valid(&url, "frank"));
    assert_eq!(status_with_token(&s, &old).await, 200);

    // The issuer rotates: it publishes k2 and withdraws k1.
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    // The server holds k1 until a token needs a key it does not hold.
    let new = sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(&url, "frank") });
    let fetches = issuer.jwks_fetches.load(Ordering::SeqCst);
    assert_eq!(status_with_token(&s, &new).await, 200);
    assert_eq!(issuer.jwks_fetches.load(Ordering::SeqCst), fetches + 1);
    // The token verified with k1 before is not accepted from memory any
    // more: checked again, its key is no longer published.
    assert_eq!(status_with_token(&s, &old).await, 401);
    assert_eq!(status_with_token(&s, &new).await, 200);
}

/// A token whose check began with the keys as they were and ended after a
/// refetch replaced them must not be remembered as verified: it would be
/// accepted from memory until its `exp`, although the issuer no longer
/// publishes its key. Many first uses of tokens signed with a key about to be
/// withdrawn run at once, and the refetch happens among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_checked_while_the_keys_are_refetched_is_not_remembered() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    // Once the keys are refetched, the next refetch (which would forget
    // the tokens of k1, the wrongly remembered ones too) waits this long,
    // longer than the rest of the test.
    let interval = Duration::from_secs(5);
    let s = Arc::new(start_refetching(&url, interval).await);
    let started = tokio::time::Instant::now();
    // The user exists before the race, so the racing requests only read.
    assert_eq!(status_with_token(&s, &sign(valid(&url, "grace"))).await, 200);

    // Distinct tokens (each its own expiry), all signed with k1.
    const TOKENS: usize = 200;
    let tokens: Arc<Vec<String>> = {
        let url = url.clone();
        let sign_all =
            move || (0..TOKENS as i64).map(|i| sign(Token { expires_in: 600 + i, ..valid(&url, "grace") })).collect();
        Arc::new(tokio::task::spawn_blocking(sign_all).await.unwrap())
    };
    let k2 = sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(&url, "grace") });
    // The issuer withdraws k1; the server still holds it, and may refetch
    // (its start fetched the keys).
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    tokio::time::sleep_until(started + interval).await;
    let race = tokio::time::Instant::now();

    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (s, tokens, next, accepted) = (s.clone(), tokens.clone(), next.clone(), accepted.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= TOKENS {
                    break;
                }
                if status_with_token(&s, &tokens[i]).await == 200 {
                    accepted.lock().unwrap().push(i);
                }
            }
        }));
    }
    // With the first quarter under way, a k2 token makes the server refetch.
    while next.load(Ordering::SeqCst) < TOKENS / 4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(status_with_token(&s, &k2).await, 200);
    for task in tasks {
        task.await.unwrap();
    }
    let accepted = accepted.lock().unwrap().clone();
    // All but the 16 in flight at the refetch were checked with k1 held.
    assert!(accepted.len() >= TOKENS / 4 - 16, "the tokens before the refetch were accepted: {}", accepted.len());
    assert!(accepted.len() < TOKENS, "the tokens after the refetch were refused");
    // Every k1 token is refused now, whenever it was first seen.
    let mut remembered = Vec::new();
    for &i in &accepted {
        if status_with_token(&s, &tokens[i]).await == 200 {
            remembered.push(i);
        }
    }
    eprintln!("signed in {:?}, raced and checked in {:?}", race - started, race.elapsed());
    assert!(remembered.is_empty(), "tokens signed with the withdrawn k1 still accepted: {remembered:?}");
}

/// Users are found by email (`admin create-key`, adding a member), so an ID
/// token's `email` claim counts only if the issuer verified it: otherwise
/// whoever signed in first claiming an address would take its place.
#[tokio::test]
async fn an_unverified_email_claim_is_not_the_users_email() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let victim = "victim@example.com";
    let claims_it = |subject| sign(Token { email: Some(victim), email_verified: false, ..valid(&url, subject) });

    // Mallory signs in claiming the address, unverified.
    let mallory = claims_it("mallory");
    assert_eq!(status_with_token(&s, &mallory).await, 200);
    // The operator makes a key for the address: not Mallory's account.
    let victim_key = s.key_for_user(victim).await;
    let project = s.create_project(&victim_key, "the victim's").await;
    let resp = s.http.get(s.url(&format!("/v1/projects/{project}"))).bearer_auth(&mallory).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);

    // Adding the address to a project adds the one whose issuer verified it.
    let verified = sign(Token { email: Some("verified@example.com"), ..valid(&url, "vera") });
    let unverified =
        sign(Token { email: Some("verified@example.com"), email_verified: false, ..valid(&url, "ursula") });
    assert_eq!(status_with_token(&s, &unverified).await, 200);
    assert_eq!(status_with_token(&s, &verified).await, 200);
    let owner = s.key_for_user("owner@example.com").await;
    let shared = s.create_project(&owner, "shared").await;
    let add = serde_json::json!({"email": "verified@example.com", "role": "editor"});
    s.expect(reqwest::Method::POST, &format!("/v1/projects/{shared}/members"), &owner, Some(add), 200).await;
    let sees = |token: String| {
        let (http, u) = (s.http.clone(), s.url(&format!("/v1/projects/{shared}")));
        async move { http.get(u).bearer_auth(token).send().await.unwrap().status().as_u16() }
    };
    assert_eq!((sees(verified).await, sees(unverified).await), (200, 404));
    // An unverified claim alone names nobody.
    let ghost = sign(Token { email: Some("ghost@example.com"), email_verified: false, ..valid(&url, "ghost") });
    assert_eq!(status_with_token(&s, &ghost).await, 200);
    let add = serde_json::json!({"email": "ghost@example.com", "role": "viewer"});
    let resp = s.send_json(reqwest::Method::POST, &format!("/v1/projects/{shared}/members"), &owner, Some(add)).await;
    let (status, body) = error_body(resp).await;
    assert_eq!((status, body["error_code"].as_str()), (404, Some("not_found")), "{body}");
}

/// A token with exactly this payload, signed with the published key `k1`.
fn sign_payload(payload: serde_json::Value) -> String {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "k1"});
    let signed = format!("{}.{}", b64(header.to_string().as_bytes()), b64(payload.to_string().as_bytes()));
    let signature =
        signing_key(ISSUER_KEY, "k1").sign(&CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256, signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64(&signature))
}

/// `openidconnect` checks `exp` but not `nbf` (RFC 7519: the token "MUST
/// NOT be accepted" before it) nor `iat`: a token its issuer says is not
/// valid yet, or was issued later than now, is refused, beyond a minute of
/// clock skew.
#[tokio::test]
async fn a_token_not_valid_yet_is_refused() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let now = chrono::Utc::now().timestamp();
    let with = |claim: &str, value: i64| {
        let mut payload = valid_payload(&url);
        payload[claim] = value.into();
        sign_payload(payload)
    };
    assert_eq!(status_with_token(&s, &sign_payload(valid_payload(&url))).await, 200, "the payload as it is");
    assert_eq!(status_with_token(&s, &with("nbf", now - 60)).await, 200, "valid since a minute ago");
    assert_eq!(status_with_token(&s, &with("nbf", now + 10)).await, 200, "within the clock skew");
    assert_eq!(status_with_token(&s, &with("nbf", now + 3600)).await, 401, "valid only in an hour");
    assert_eq!(status_with_token(&s, &with("iat", now + 3600)).await, 401, "issued in an hour");
    let resp = s.http.get(s.url("/v1/api-keys")).bearer_auth(with("nbf", now + 3600)).send().await.unwrap();
    let (_, body) = error_body(resp).await;
    assert!(body["message"].as_str().unwrap().contains("not valid yet"), "{body}");
}

/// Sign-in and adding a member compare addresses case aside; so does
/// `admin create-key`: a key made for an address whose owner signed in with
/// it spelled otherwise is theirs, not a second, empty account beside it
/// (which adding the address to a project would then pick from at random).
#[tokio::test]
async fn a_key_made_for_an_address_in_other_case_is_the_signed_in_users() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let token = sign(Token { email: Some("Hana@Example.com"), ..valid(&url, "hana") });
    let resp = s
        .http
        .post(s.url("/v1/projects"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"name": "hana's"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let project: serde_json::Value = resp.json().await.unwrap();
    let key = s.key_for_user("hana@example.com").await;
    let seen = s.expect(reqwest::Method::GET, "/v1/projects", &key, None, 200).await;
    assert_eq!(seen["projects"][0]["id"], project["id"], "the key acts as the user who signed in: {seen}");
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let users: i64 = store
        .read::<_, sparring_impl::store::StoreError, _>(|tx| {
            Ok(tx.query_row("SELECT count(*) FROM users WHERE email = 'hana@example.com' COLLATE NOCASE", [], |r| {
                r.get(0)
            })?)
        })
        .await
        .unwrap();
    assert_eq!(users, 1);
}

/// A token signed with a key the issuer has just published, sent while the
/// server is fetching the issuer's keys (another such token made it refetch,
/// or the keys it held were old and are being refreshed), waits for that
/// fetch: refused, it would be refused for a key the server is about to
/// hold, and a refetch of its own is not allowed so soon after that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_of_a_new_key_waits_for_the_fetch_under_way() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let interval = Duration::from_secs(1);
    let new_key = |i: i64| sign(Token { key_pem: OTHER_KEY, kid: "k2", expires_in: 600 + i, ..valid(&url, "ivan") });

    // Several first uses of tokens of a new key at once: one refetches, the
    // others come while it runs.
    let s = start_refetching(&url, interval).await;
    assert_eq!(status_with_token(&s, &sign(valid(&url, "ivan"))).await, 200);
    tokio::time::sleep(interval).await;
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    *issuer.jwks_delay.lock().unwrap() = Duration::from_millis(500);
    let fetches = issuer.jwks_fetches.load(Ordering::SeqCst);
    let tokens: Vec<String> = (0..8).map(new_key).collect();
    let statuses = futures::future::join_all(tokens.iter().map(|t| status_with_token(&s, t))).await;
    assert_eq!(statuses, vec![200; 8], "tokens of the key being fetched");
    assert_eq!(issuer.jwks_fetches.load(Ordering::SeqCst), fetches + 1, "one fetch for all of them");

    // The keys held are old: the first request starts a refresh in the
    // background, and its token, of a key only the refresh brings, waits.
    *issuer.jwks.lock().unwrap() = published_jwks();
    *issuer.jwks_delay.lock().unwrap() = Duration::ZERO;
    let config = IssuerConfig { issuer: url.clone(), audience: AUDIENCE.into(), jwks_file: None };
    let s = TestServer::start_configured(vec![config], |c| {
        c.oidc_refetch_interval = interval;
        c.oidc_keys_max_age = Duration::from_millis(100);
    })
    .await;
    assert_eq!(status_with_token(&s, &sign(valid(&url, "ivan"))).await, 200);
    tokio::time::sleep(interval).await;
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    *issuer.jwks_delay.lock().unwrap() = Duration::from_millis(500);
    assert_eq!(status_with_token(&s, &new_key(100)).await, 200, "a token of the key the refresh brings");
}

/// A user whose first sign-in carried no verified address (a client that
/// did not ask for the `email` scope, an address not verified yet) gets the
/// first verified one a later token carries, unless another user has it:
/// users are found by email, and one who signed in with a verified address
/// must be found by it.
#[tokio::test]
async fn a_verified_email_of_a_later_sign_in_becomes_the_users() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let ivy = |verified: bool, expires_in: i64| {
        sign(Token { email: Some("Ivy@example.com"), email_verified: verified, expires_in, ..valid(&url, "ivy") })
    };
    let first = ivy(false, 600);
    assert_eq!(status_with_token(&s, &first).await, 200);
    let owner = s.key_for_user("owner@example.com").await;
    let project = s.create_project(&owner, "ivy's team").await;
    let members = format!("/v1/projects/{project}/members");
    let add = serde_json::json!({"email": "ivy@example.com", "role": "viewer"});
    let resp = s.send_json(reqwest::Method::POST, &members, &owner, Some(add.clone())).await;
    assert_eq!(resp.status().as_u16(), 404, "no verified address yet");

    assert_eq!(status_with_token(&s, &ivy(true, 601)).await, 200);
    let member = s.expect(reqwest::Method::POST, &members, &owner, Some(add), 200).await;
    assert_eq!(member["email"], "Ivy@example.com", "{member}");
    assert_eq!(oidc_users(&s, "ivy").await, 1, "the same user");
    let resp = s.http.get(s.url(&format!("/v1/projects/{project}"))).bearer_auth(&first).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "the user who signed in first is the member");

    // An address another user has stays theirs.
    let other = |verified: bool, expires_in: i64| {
        sign(Token { email: Some("ivy@example.com"), email_verified: verified, expires_in, ..valid(&url, "ivy2") })
    };
    assert_eq!(status_with_token(&s, &other(false, 600)).await, 200);
    assert_eq!(status_with_token(&s, &other(true, 601)).await, 200);
    let resp =
        s.http.get(s.url(&format!("/v1/projects/{project}"))).bearer_auth(other(true, 602)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404, "not the member");
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let emails: i64 = store
        .read::<_, sparring_impl::store::StoreError, _>(|tx| {
            Ok(tx.query_row("SELECT count(*) FROM users WHERE email = 'ivy@example.com' COLLATE NOCASE", [], |r| {
                r.get(0)
            })?)
        })
        .await
        .unwrap();
    assert_eq!(emails, 1);
}

/// The email of the user an ID token with this subject made, if any.
async fn email_of(s: &TestServer, subject: &str) -> Option<String> {
    let store = sparring_impl::open_store(s.data_dir.path()).unwrap();
    let subject = subject.to_string();
    store
        .read::<_, sparring_impl::store::StoreError, _>(move |tx| {
            Ok(tx.query_row("SELECT email FROM users WHERE oidc_subject = ?1", [subject], |r| r.get(0))?)
        })
        .await
        .unwrap()
}

/// Some issuers (Amazon Cognito among them) send `email_verified` as the
/// string "true" or "false": it is read as the boolean it spells, and the
/// sign-in goes on. A value that is neither a boolean nor one of those
/// strings is refused, with a message that names the claim.
#[tokio::test]
async fn an_email_verified_claim_sent_as_a_string_is_the_boolean_it_spells() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let with = |subject: &str, verified: serde_json::Value| {
        let mut payload = valid_payload(&url);
        payload["sub"] = subject.into();
        payload["email"] = format!("{subject}@example.com").into();
        payload["email_verified"] = verified;
        sign_payload(payload)
    };
    assert_eq!(status_with_token(&s, &with("kate", "true".into())).await, 200, "\"true\"");
    assert_eq!(status_with_token(&s, &with("liam", "false".into())).await, 200, "\"false\"");
    assert_eq!(status_with_token(&s, &with("lena", true.into())).await, 200, "a boolean, as before");
    assert_eq!(email_of(&s, "kate").await.as_deref(), Some("kate@example.com"));
    assert_eq!(email_of(&s, "liam").await, None, "not verified");
    assert_eq!(email_of(&s, "lena").await.as_deref(), Some("lena@example.com"));
    // The address verified as "true" finds its user, as a boolean's does.
    let owner = s.key_for_user("owner@example.com").await;
    let project = s.create_project(&owner, "kate's team").await;
    let add = serde_json::json!({"email": "kate@example.com", "role": "viewer"});
    s.expect(reqwest::Method::POST, &format!("/v1/projects/{project}/members"), &owner, Some(add), 200).await;
    let resp =
        s.http.get(s.url(&format!("/v1/projects/{project}"))).bearer_auth(with("kate", "true".into())).send().await;
    assert_eq!(resp.unwrap().status().as_u16(), 200);

    for odd in [serde_json::json!("yes"), serde_json::json!("TRUE"), serde_json::json!(1)] {
        let resp = s.http.get(s.url("/v1/api-keys")).bearer_auth(with("mia", odd.clone())).send().await.unwrap();
        let (status, body) = error_body(resp).await;
        assert_eq!((status, body["error_code"].as_str()), (401, Some("unauthenticated")), "{odd}: {body}");
        assert!(body["message"].as_str().unwrap().contains("`email_verified`"), "{odd}: {body}");
    }
    assert_eq!(oidc_users(&s, "mia").await, 0);
}

/// A token must name someone: one whose `sub` is empty is refused (401),
/// and no account keyed by the issuer and "" is made. An `email` claim that
/// is not an address as the API takes one elsewhere (adding a member, `admin
/// create-key`: NAME@DOMAIN, no whitespace inside, at most 320 characters,
/// surrounding whitespace trimmed) is no address: the user is made without
/// one.
#[tokio::test]
async fn an_empty_subject_is_refused_and_a_malformed_email_is_not_kept() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let nobody = sign(Token { email: Some("nobody@example.com"), ..valid(&url, "") });
    let resp = s.http.get(s.url("/v1/api-keys")).bearer_auth(&nobody).send().await.unwrap();
    assert!(resp.headers().get("www-authenticate").is_some());
    let (status, body) = error_body(resp).await;
    assert_eq!((status, body["error_code"].as_str()), (401, Some("unauthenticated")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("`sub`"), "{body}");
    assert_eq!(oidc_users(&s, "").await, 0, "no account for the empty subject");
    // Refused every time, not remembered.
    assert_eq!(status_with_token(&s, &nobody).await, 401);
    // Nor a subject over OpenID Connect's 255 ASCII characters, or not
    // ASCII; one of 255 is.
    let (longest, too_long) = ("s".repeat(255), "s".repeat(256));
    for (subject, status) in [(too_long.as_str(), 401), ("søren", 401), (longest.as_str(), 200)] {
        assert_eq!(status_with_token(&s, &sign(valid(&url, subject))).await, status, "{subject}");
        assert_eq!(oidc_users(&s, subject).await, i64::from(status == 200), "{subject}");
    }

    let long = format!("{}@example.com", "p".repeat(320));
    for (subject, email, kept) in [
        ("nora", "not an address", None),
        ("omar", "omar@", None),
        ("olga", "@example.com", None),
        ("otto", "otto smith@example.com", None),
        ("pete", long.as_str(), None),
        ("pia", "  Pia@Example.com\n", Some("Pia@Example.com")),
    ] {
        assert_eq!(status_with_token(&s, &sign(Token { email: Some(email), ..valid(&url, subject) })).await, 200);
        assert_eq!(email_of(&s, subject).await.as_deref(), kept, "{email:?}");
    }
    // The trimmed address finds its user, as adding a member looks it up.
    let owner = s.key_for_user("owner@example.com").await;
    let project = s.create_project(&owner, "pia's team").await;
    let add = serde_json::json!({"email": "pia@example.com", "role": "viewer"});
    s.expect(reqwest::Method::POST, &format!("/v1/projects/{project}/members"), &owner, Some(add), 200).await;
}

/// A refetch of an issuer's keys forgets only the tokens verified under a
/// key it no longer publishes. When the issuer adds a key (a rotation
/// begins), the tokens its clients already use stay remembered and are not
/// checked again (`Oidc::signature_checks` counts the full checks); once it
/// withdraws a key, a token of that key is refused at once, while those of
/// the keys it still publishes stay remembered.
#[tokio::test]
async fn a_refetch_forgets_only_the_tokens_of_keys_no_longer_published() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let config = IssuerConfig { issuer: url.clone(), audience: AUDIENCE.into(), jwks_file: None };
    let oidc = sparring_impl::oidc::Oidc::new(vec![config], Duration::ZERO, sparring_impl::oidc::KEYS_MAX_AGE, &log)
        .await
        .unwrap();
    let old = sign(valid(&url, "rosa"));
    assert_eq!(oidc.verify(&old).await.unwrap().subject, "rosa");
    let checks = oidc.signature_checks();
    oidc.verify(&old).await.unwrap();
    assert_eq!(oidc.signature_checks(), checks, "remembered");

    // The issuer begins a rotation: k2 beside k1. A token of k2 makes the
    // server fetch the keys.
    let both = CoreJsonWebKeySet::new(vec![
        signing_key(ISSUER_KEY, "k1").as_verification_key(),
        signing_key(OTHER_KEY, "k2").as_verification_key(),
    ]);
    *issuer.jwks.lock().unwrap() = serde_json::to_value(both).unwrap();
    let new = sign(Token { key_pem: OTHER_KEY, kid: "k2", ..valid(&url, "rosa") });
    let fetches = issuer.jwks_fetches.load(Ordering::SeqCst);
    oidc.verify(&new).await.unwrap();
    assert_eq!(issuer.jwks_fetches.load(Ordering::SeqCst), fetches + 1);
    let checks = oidc.signature_checks();
    oidc.verify(&old).await.unwrap();
    oidc.verify(&new).await.unwrap();
    assert_eq!(oidc.signature_checks(), checks, "k1 is still published: its token is not checked again");

    // It ends the rotation, withdrawing k1; a token of a key it never
    // published makes the server fetch the keys again.
    *issuer.jwks.lock().unwrap() = jwks_of(OTHER_KEY, "k2");
    let unknown = sign(Token { kid: "k3", ..valid(&url, "rosa") });
    assert!(oidc.verify(&unknown).await.is_err());
    assert_eq!(issuer.jwks_fetches.load(Ordering::SeqCst), fetches + 2);
    let checks = oidc.signature_checks();
    let refused = oidc.verify(&old).await.expect_err("k1 is withdrawn: its token is refused at once");
    assert!(refused.contains("does not publish"), "{refused}");
    oidc.verify(&new).await.unwrap();
    assert_eq!(oidc.signature_checks(), checks + 1, "only the token of the withdrawn key was checked again");
}

/// A `name` claim becomes the user's display name, shown in every page of
/// a project's members and reviewers: kept as the API keeps names (at most
/// 100 characters, no control character, trimmed), not as sent, which only
/// the size of a request's headers bounds.
#[tokio::test]
async fn a_name_claim_is_kept_as_the_api_keeps_names() {
    let (issuer, _issuer_server) = start_issuer().await;
    let url = issuer.url();
    let s = start_refetching(&url, sparring_impl::oidc::REFETCH_INTERVAL).await;
    let named = |subject: &str, name: &str| {
        let mut payload = valid_payload(&url);
        payload["sub"] = subject.into();
        payload["name"] = name.into();
        sign_payload(payload)
    };
    let name_of = |subject: &str| {
        let (store, subject) = (sparring_impl::open_store(s.data_dir.path()).unwrap(), subject.to_string());
        async move {
            store
                .read::<_, sparring_impl::store::StoreError, _>(move |tx| {
                    Ok(tx.query_row("SELECT name FROM users WHERE oidc_subject = ?1", [subject], |r| r.get(0))?)
                })
                .await
                .unwrap()
        }
    };
    let long = "n".repeat(50_000);
    for (subject, name, kept) in [
        ("tara", "Tara Lin", "Tara Lin".to_string()),
        ("uma", "  Uma\u{1b}[31m Roy\n", "Uma[31m Roy".to_string()),
        ("vic", long.as_str(), "n".repeat(100)),
        // Nothing left: the subject, as for a token without a name.
        ("walt", " \u{7} ", "walt".to_string()),
    ] {
        assert_eq!(status_with_token(&s, &named(subject, name)).await, 200, "{subject}");
        let got: String = name_of(subject).await;
        assert_eq!(got, kept, "{name:?}");
    }
    // Without a name, the email stands for it, kept the same way.
    let email = format!("{}@example.com", "e".repeat(200));
    assert_eq!(status_with_token(&s, &sign(Token { email: Some(&email), ..valid(&url, "xena") })).await, 200);
    let got: String = name_of("xena").await;
    assert_eq!(got, "e".repeat(100));
}
