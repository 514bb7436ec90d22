//! The authentication path, piece by piece and whole: `cargo xtask bench auth`
//! (extra arguments go to criterion; the figures are kept in BENCHMARKS.md).
//!
//! Every request pays for authentication before anything else, so this is
//! where a regression in the per-request floor shows first. Everything
//! measured is the crate's own code on a real SQLite file in a temp dir;
//! nothing is mocked. The request is a `dropshot::RequestInfo` built from an
//! `http::Request` without a socket: HTTP parsing and routing are the `api`
//! benchmark's business (`cargo xtask bench api`).
//!
//! `api_key/…` (one user with 25 keys, made by `users::create_key_for_email`,
//! as `sparring admin create-key` does):
//! - `hash_key`: blake3 of the raw key, paid by every request with a key.
//! - `cache_hit`: `KeyCache::get` of a key already found valid (`remember`ed).
//! - `find_active`: the cold path's one indexed read, for a key not in the
//!   cache (first use, or after a restart).
//! - `authenticate_warm` / `authenticate_cold`: `AppState::authenticate`, the
//!   `Authenticator` every generated endpoint calls, on a request carrying
//!   `x-api-key`: shape check, hash, cache hit or read, `last_used_at` noted in
//!   memory. `cold` forgets the key from the cache before every iteration
//!   (untimed), so each one does the database read.
//!
//! `id_token/…` (an offline issuer: a JWKS file, RS256 tokens signed with
//! the test suite's issuer key as `bench/src/token.rs` does):
//! - `verify_first`: `Oidc::verify` of a token it has not seen: parse, RSA
//!   signature, claims, then remembered. Signing costs far more than
//!   verifying, so distinct tokens are signed up front; a fresh `Oidc` (no
//!   token remembered) takes over every [`TOKENS`] tokens, outside the timing.
//! - `verify_repeat`: the same token again (blake3 and a map lookup).
//! - `authenticate_first` / `authenticate_repeat`: `AppState::authenticate`
//!   with `Authorization: Bearer`, for a user already signed in (its issuer
//!   and subject → user id is in memory): a client's new token, then the
//!   same token on its following requests.

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use dropshot::RequestInfo;
use openidconnect::core::{
    CoreIdToken, CoreIdTokenClaims, CoreJsonWebKeySet, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey,
};
use openidconnect::{
    Audience, EmptyAdditionalClaims, EndUserEmail, IssuerUrl, JsonWebKeyId, PrivateSigningKey as _, StandardClaims,
    SubjectIdentifier,
};
use sparring_impl::api_keys::{self, ApiKeyLabel};
use sparring_impl::auth::LastUsed;
use sparring_impl::engine::worker::{Engine, EngineConfig};
use sparring_impl::key_cache::KeyCache;
use sparring_impl::oidc::{IssuerConfig, Oidc};
use sparring_impl::secrets::Secrets;
use sparring_impl::{users, AppState};
use sparring_server::{Authenticator as _, Caller, Credential};
use tokio::runtime::Runtime;

const ISSUER: &str = "https://issuer.bench.invalid";
const AUDIENCE: &str = "sparring-bench";
const SUBJECT: &str = "bench-user";
const KEY_PEM: &str = include_str!("../../tests/fixtures/issuer-key.pem");
const KID: &str = "bench-1";
const EMAIL: &str = "bench@example.com";
/// As many as a user may have (`api_keys::MAX_ACTIVE_KEYS`).
const KEYS: usize = 25;
/// Distinct ID tokens signed up front for the first-verification benches.
const TOKENS: usize = 256;

fn signing_key() -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(KEY_PEM, Some(JsonWebKeyId::new(KID.to_string())))
        .expect("tests/fixtures/issuer-key.pem is an RSA private key")
}

/// The issuer's public keys, for `IssuerConfig::jwks_file`.
fn write_jwks(path: &Path) {
    let jwks = CoreJsonWebKeySet::new(vec![signing_key().as_verification_key()]);
    std::fs::write(path, serde_json::to_vec(&jwks).expect("a JWKS serializes")).expect("writing the JWKS file");
}

/// RS256 ID tokens for [`SUBJECT`], each expiring a second after the one
/// before (the same claims would sign to the same token, and a repeat is not
/// a first verification).
fn sign_tokens(n: usize) -> Vec<String> {
    let key = signing_key();
    let now = chrono::Utc::now();
    let tokens: Vec<String> = (0..n)
        .map(|i| {
            let claims = CoreIdTokenClaims::new(
                IssuerUrl::new(ISSUER.to_string()).expect("a valid issuer URL"),
                vec![Audience::new(AUDIENCE.to_string())],
                now + chrono::Duration::hours(1) + chrono::Duration::seconds(i as i64),
                now - chrono::Duration::seconds(60),
                StandardClaims::new(SubjectIdentifier::new(SUBJECT.to_string()))
                    .set_email(Some(EndUserEmail::new(format!("{SUBJECT}@example.com")))),
                EmptyAdditionalClaims {},
            );
            CoreIdToken::new(claims, &key, CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256, None, None)
                .expect("signing an ID token")
                .to_string()
        })
        .collect();
    assert_eq!(tokens.iter().collect::<HashSet<_>>().len(), n, "the tokens must be distinct");
    tokens
}

fn log() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

/// An `Oidc` trusting the bench issuer's JWKS file, with no token verified.
async fn fresh_oidc(jwks: &Path) -> Oidc {
    let issuer = IssuerConfig {
        issuer: ISSUER.to_string(),
        audience: AUDIENCE.to_string(),
        jwks_file: Some(jwks.to_path_buf()),
    };
    Oidc::new(vec![issuer], sparring_impl::oidc::REFETCH_INTERVAL, sparring_impl::oidc::KEYS_MAX_AGE, &log())
        .await
        .expect("setting up the offline issuer")
}

fn request(header: &str, value: &str) -> RequestInfo {
    let request = http::Request::builder().uri("/v1/projects").header(header, value).body(()).expect("a valid request");
    RequestInfo::new(&request, "127.0.0.1:40000".parse().expect("a socket address"))
}

fn bearer(token: &str) -> RequestInfo {
    request("authorization", &format!("Bearer {token}"))
}

/// A server's state without the server: the store, issuer and caches that
/// `start` would build, on a fresh data dir.
struct Fixture {
    state: AppState,
    /// The raw keys of the bench user, all active.
    keys: Vec<String>,
    user_id: String,
    jwks: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = sparring_impl::open_store(dir.path()).expect("opening the database");
    let mut keys = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        let label = ApiKeyLabel::parse(&format!("bench {i}")).expect("a valid label");
        let raw = users::create_key_for_email(&store, EMAIL.to_string(), label).await.expect("creating an API key");
        keys.push(raw.expose());
    }
    let (_, user_id) = api_keys::find_active(&store, api_keys::hash_key(&keys[0]))
        .await
        .expect("reading the database")
        .expect("the key just created is active");
    let jwks = dir.path().join("jwks.json");
    write_jwks(&jwks);
    let state = AppState {
        test_cache: sparring_impl::test_cache::TestCache::watching(&store),
        key_pages: sparring_impl::api_keys::KeyPages::watching(&store),
        in_open_calibrations: sparring_impl::reviews::blind::InOpenCalibrations::watching(&store),
        store,
        secrets: Secrets::load_or_create(&dir.path().join(sparring_impl::secrets::KEY_FILE))
            .expect("creating the secret key"),
        oidc: fresh_oidc(&jwks).await,
        last_used: LastUsed::default(),
        keys: KeyCache::default(),
        oidc_users: Mutex::new(HashMap::new()),
        engine: Arc::new(Engine::new(EngineConfig::default())),
        log: log(),
    };
    Fixture { state, keys, user_id, jwks, _dir: dir }
}

fn api_key(c: &mut Criterion, rt: &Runtime, f: &Fixture) {
    // A key in the middle of the user's 25.
    let key = &f.keys[KEYS / 2];
    let hash = api_keys::hash_key(key);
    let (key_id, user_id) = rt
        .block_on(api_keys::find_active(&f.state.store, hash))
        .expect("reading the database")
        .expect("the bench key is active");
    assert_eq!(user_id, f.user_id);

    let cache = KeyCache::default();
    for k in &f.keys {
        let hash = api_keys::hash_key(k);
        let found = rt.block_on(api_keys::find_active(&f.state.store, hash)).unwrap().expect("every key is active");
        cache.remember(cache.generation(), hash, found.0, found.1);
    }
    assert_eq!(cache.get(&hash), Some((key_id.clone(), user_id.clone())));

    let req = request("x-api-key", key);
    let expected = Caller { user_id: user_id.clone(), credential: Credential::ApiKey { key_id: key_id.clone() } };
    assert_eq!(rt.block_on(f.state.authenticate(&req)).expect("the key authenticates"), expected);

    // The async routines below move these references into their futures.
    let (state, req) = (&f.state, &req);
    let mut g = c.benchmark_group("api_key");
    g.bench_function("hash_key", |b| b.iter(|| api_keys::hash_key(black_box(key))));
    g.bench_function("cache_hit", |b| b.iter(|| cache.get(black_box(&hash))));
    g.bench_function("find_active", |b| {
        b.to_async(rt).iter(|| async move { api_keys::find_active(&state.store, black_box(hash)).await.unwrap() })
    });
    g.bench_function("authenticate_warm", |b| {
        b.to_async(rt).iter(|| async move { state.authenticate(black_box(req)).await.unwrap() })
    });
    g.bench_function("authenticate_cold", |b| {
        b.to_async(rt).iter_batched(
            || state.keys.forget(&key_id),
            |()| async move { state.authenticate(black_box(req)).await.unwrap() },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn id_token(c: &mut Criterion, rt: &Runtime, f: &mut Fixture) {
    let tokens = sign_tokens(TOKENS);
    let requests: Vec<RequestInfo> = tokens.iter().map(|t| bearer(t)).collect();

    // Signs the bench user in (creating it), as its first request would.
    let caller = rt.block_on(f.state.authenticate(&requests[0])).expect("the ID token authenticates");
    assert_eq!(caller.credential, Credential::IdToken { issuer: ISSUER.to_string(), subject: SUBJECT.to_string() });
    let identity = rt.block_on(f.state.oidc.verify(&tokens[0])).expect("the ID token verifies");
    assert_eq!((identity.issuer.as_str(), identity.subject.as_str()), (ISSUER, SUBJECT));

    let (first_token, first_request) = (tokens[0].as_str(), &requests[0]);
    let mut g = c.benchmark_group("id_token");
    g.bench_function("verify_first", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let oidc = fresh_oidc(&f.jwks).await;
                    let n = usize::try_from(left).unwrap_or(TOKENS).min(TOKENS);
                    let start = Instant::now();
                    for token in &tokens[..n] {
                        black_box(oidc.verify(black_box(token)).await.unwrap());
                    }
                    timed += start.elapsed();
                    left -= n as u64;
                }
                timed
            })
        })
    });
    {
        let state = &f.state;
        g.bench_function("verify_repeat", |b| {
            b.to_async(rt).iter(|| async move { state.oidc.verify(black_box(first_token)).await.unwrap() })
        });
        g.bench_function("authenticate_repeat", |b| {
            b.to_async(rt).iter(|| async move { state.authenticate(black_box(first_request)).await.unwrap() })
        });
    }
    g.bench_function("authenticate_first", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    // The user stays signed in; only the remembered tokens go.
                    f.state.oidc = fresh_oidc(&f.jwks).await;
                    let n = usize::try_from(left).unwrap_or(TOKENS).min(TOKENS);
                    let start = Instant::now();
                    for request in &requests[..n] {
                        black_box(f.state.authenticate(black_box(request)).await.unwrap());
                    }
                    timed += start.elapsed();
                    left -= n as u64;
                }
                timed
            })
        })
    });
    g.finish();
}

fn auth(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let mut f = rt.block_on(fixture());
    api_key(c, &rt, &f);
    id_token(c, &rt, &mut f);
}

criterion_group!(benches, auth);
criterion_main!(benches);
