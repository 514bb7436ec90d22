//! ID tokens from configured OpenID Connect issuers.
//!
//! Each issuer is an issuer URL and the audiences (client ids) one of which
//! its tokens must carry (an issuer configured twice, for two clients,
//! accepts either). Its signing keys come from the issuer's discovery
//! document and JWKS over HTTP, or from a JWKS file (offline). Keys are
//! cached; a token signed with a key the cache does not hold (an unknown
//! `kid`: the issuer rotated its keys) triggers one refetch, at most once a
//! minute per issuer ([`REFETCH_INTERVAL`]), so a stream of bogus tokens
//! cannot turn into a stream of requests to the issuer; a token that needs
//! a key while a fetch is under way waits for that fetch instead. Keys older than
//! [`KEYS_MAX_AGE`] are fetched again in the background, so a key the issuer
//! withdrew stops being trusted within that time even when no token asks
//! for a new one. Signature, `iss`, `aud` and `exp` are
//! checked by `openidconnect`; only asymmetric algorithms are accepted (never
//! `none`). `nbf` and `iat`, which it does not check, are checked here: not
//! in the future, beyond [`CLOCK_SKEW`].
//!
//! A client sends the same token with every request for up to an hour, and
//! checking its RSA signature is most of what a bearer request costs, so a
//! verified token is remembered (by its blake3) with whom it names until its
//! `exp`: the same token again is accepted without a second signature check,
//! and never after it expires. With it is remembered the key that checked
//! its signature: refetching an issuer's keys forgets the tokens checked
//! with a key the issuer no longer publishes (the next use of one is
//! checked again, and refused), and keeps the others, so that a rotation at
//! the issuer (a key added beside the old one, or another withdrawn) does
//! not make every client's next request a full check. A check that began
//! with a key and ends after a refetch withdrew it is not remembered.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use openidconnect::core::{
    CoreIdToken, CoreIdTokenVerifier, CoreJsonWebKey, CoreJsonWebKeySet, CoreJwsSigningAlgorithm, CoreProviderMetadata,
};
use openidconnect::{Audience, ClaimsVerificationError, ClientId, IssuerUrl, Nonce, SignatureVerificationError};

/// The least time between two fetches of an issuer's keys prompted by
/// tokens (the server's setting; tests shorten it).
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(60);

/// How long fetched keys are trusted before they are fetched again (the
/// server's setting; tests shorten it).
pub const KEYS_MAX_AGE: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct IssuerConfig {
    pub issuer: String,
    pub audience: String,
    /// A JWKS file to use instead of discovery.
    pub jwks_file: Option<PathBuf>,
}

/// What a verified ID token says about its holder.
#[derive(Clone, Debug)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// The `email` claim, only if `email_verified` is true (the boolean, or
    /// the string "true") and it is an address as `users::email` takes one
    /// (trimmed).
    pub email: Option<String>,
    /// The `name` claim, as `users::display_name` keeps it.
    pub name: Option<String>,
}

pub struct Oidc {
    issuers: Vec<Arc<Issuer>>,
    shared: Arc<Shared>,
    /// Tokens checked in full (see [`Oidc::signature_checks`]).
    checks: AtomicU64,
}

/// What a background refetch needs beside its issuer.
struct Shared {
    http: OidcHttp,
    verified: Verified,
    refetch_interval: Duration,
    keys_max_age: Duration,
}

/// Tokens already verified: blake3 of a token → what its check found.
#[derive(Default)]
struct Verified(Mutex<HashMap<[u8; 32], Remembered>>);

/// A verified token: the identity it proved, when it expires, and the key
/// its signature was checked with.
struct Remembered {
    identity: Identity,
    exp: DateTime<Utc>,
    key: KeyPrint,
}

/// A signing key as its issuer publishes it: the blake3 of its JSON. The
/// same key in two fetched key sets has the same print; a key changed in
/// any way has another.
type KeyPrint = [u8; 32];

fn key_print(key: &CoreJsonWebKey) -> Option<KeyPrint> {
    serde_json::to_vec(key).ok().map(|json| *blake3::hash(&json).as_bytes())
}

/// An issuer's keys as held, with the print of each.
struct Keys {
    set: CoreJsonWebKeySet,
    prints: HashSet<KeyPrint>,
}

impl Keys {
    fn new(set: CoreJsonWebKeySet) -> Keys {
        let prints = set.keys().iter().filter_map(key_print).collect();
        Keys { set, prints }
    }
}

/// The longest `sub` OpenID Connect allows (Core 1.0, section 2).
const MAX_SUBJECT: usize = 255;

/// More verified tokens than this and the expired ones are dropped (all of
/// them if none has expired): a bound on memory, whatever the traffic.
const MAX_VERIFIED: usize = 10_000;

impl Verified {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Remembered>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity a remembered token proved, unless it has expired.
    fn get(&self, hash: &[u8; 32], now: DateTime<Utc>) -> Option<Identity> {
        let mut tokens = self.lock();
        match tokens.get(hash) {
            Some(remembered) if now < remembered.exp => Some(remembered.identity.clone()),
            Some(_) => {
                tokens.remove(hash);
                None
            }
            None => None,
        }
    }

    /// Remembers a checked token, if its issuer still publishes the key it
    /// was checked with (`published`, asked under the lock): a refetch may
    /// have withdrawn that key while the token was checked. A refetch
    /// replaces the keys before it forgets the tokens of withdrawn ones
    /// ([`Verified::forget_withdrawn`], under the same lock), so either this
    /// sees the keys it brought or it forgets this token.
    fn put(
        &self,
        hash: [u8; 32],
        remembered: Remembered,
        now: DateTime<Utc>,
        published: impl FnOnce(&KeyPrint) -> bool,
    ) {
        let mut tokens = self.lock();
        if !published(&remembered.key) {
            return;
        }
        if tokens.len() >= MAX_VERIFIED {
            tokens.retain(|_, r| now < r.exp);
            if tokens.len() >= MAX_VERIFIED {
                tokens.clear();
            }
        }
        tokens.insert(hash, remembered);
    }

    /// Forgets the tokens of `issuer` checked with a key it no longer
    /// publishes (not in `published`, the keys a refetch brought): the next
    /// use of one is checked again, and refused. Those of keys it still
    /// publishes stay remembered.
    fn forget_withdrawn(&self, issuer: &str, published: &HashSet<KeyPrint>) {
        self.lock().retain(|_, r| r.identity.issuer != issuer || published.contains(&r.key));
    }
}

/// What the full check of a token found: whom it names, when it expires,
/// and the key that checked its signature (none if that key could not be
/// printed: then the token is not remembered).
struct Checked {
    identity: Identity,
    exp: DateTime<Utc>,
    key: Option<KeyPrint>,
}

/// `openidconnect`'s HTTP client: our reqwest client (the one the rest of
/// the build uses).
struct OidcHttp(reqwest::Client);

impl<'c> openidconnect::AsyncHttpClient<'c> for OidcHttp {
    type Error = reqwest::Error;
    type Future = Pin<Box<dyn Future<Output = Result<openidconnect::HttpResponse, reqwest::Error>> + Send + 'c>>;

    fn call(&'c self, request: openidconnect::HttpRequest) -> Self::Future {
        Box::pin(fetch(&self.0, request))
    }
}

struct Issuer {
    config: IssuerConfig,
    /// Every audience configured for this issuer.
    audiences: Vec<String>,
    url: IssuerUrl,
    keys: RwLock<Arc<Keys>>,
    fetches: Mutex<Fetches>,
    /// Told when a fetch ends, however it ends.
    fetch_ended: tokio::sync::Notify,
}

#[derive(Default)]
struct Fetches {
    /// The last fetch begun, whatever came of it.
    tried: Option<Instant>,
    /// The last fetch that brought keys.
    fetched: Option<Instant>,
    /// A fetch is under way.
    running: bool,
}

/// A fetch claimed by [`Issuer::claim_fetch`]: while it lives the fetch
/// counts as under way, and when it is dropped (the fetch ended, or the
/// request running it went away) those waiting for it are told.
struct FetchClaim(Arc<Issuer>);

impl Drop for FetchClaim {
    fn drop(&mut self) {
        self.0.fetches.lock().unwrap_or_else(|p| p.into_inner()).running = false;
        self.0.fetch_ended.notify_waiters();
    }
}

impl Oidc {
    /// Sets up the issuers; JWKS files are read now, discovery is attempted
    /// now and retried on demand if the issuer is unreachable, at most once
    /// per `refetch_interval` (as are refetches for unknown key ids).
    pub async fn new(
        configs: Vec<IssuerConfig>,
        refetch_interval: Duration,
        keys_max_age: Duration,
        log: &slog::Logger,
    ) -> anyhow::Result<Oidc> {
        let http = reqwest::Client::builder()
            // Following redirects from an issuer is an SSRF risk.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()?;
        let mut issuers: Vec<Issuer> = Vec::new();
        for config in configs {
            // The same issuer again: another audience it may carry, with
            // the same keys.
            let same = |i: &&mut Issuer| i.config.issuer.trim_end_matches('/') == config.issuer.trim_end_matches('/');
            if let Some(known) = issuers.iter_mut().find(|i| same(i)) {
                if known.config.jwks_file != config.jwks_file {
                    anyhow::bail!(
                        "--oidc-issuer {} is given twice with different key sets (--oidc-jwks): one issuer has one",
                        config.issuer
                    );
                }
                if !known.audiences.contains(&config.audience) {
                    known.audiences.push(config.audience);
                }
                continue;
            }
            let url = IssuerUrl::new(config.issuer.clone())
                .map_err(|e| anyhow::anyhow!("--oidc-issuer {}: {e}", config.issuer))?;
            if config.audience.trim().is_empty() {
                anyhow::bail!(
                    "--oidc-audience is empty (for {}): give the client id its ID tokens are issued for",
                    config.issuer
                );
            }
            let keys = match &config.jwks_file {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("--oidc-jwks {}: {e}", path.display()))?;
                    let value: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| anyhow::anyhow!("--oidc-jwks {}: {e}", path.display()))?;
                    // A set with no key to verify with would refuse every
                    // token, and the server start as if all were well.
                    if !holds_a_public_key(&value) {
                        anyhow::bail!(
                            "--oidc-jwks {}: holds no public key to verify ID tokens with (an RSA key needs `n` and \
                             `e`; an EC key `crv`, `x` and `y`; an OKP key `crv` and `x`)",
                            path.display()
                        );
                    }
                    serde_json::from_value(value).map_err(|e| anyhow::anyhow!("--oidc-jwks {}: {e}", path.display()))?
                }
                None => CoreJsonWebKeySet::new(Vec::new()),
            };
            let audiences = vec![config.audience.clone()];
            issuers.push(Issuer {
                config,
                audiences,
                url,
                keys: RwLock::new(Arc::new(Keys::new(keys))),
                fetches: Mutex::new(Fetches::default()),
                fetch_ended: tokio::sync::Notify::new(),
            });
        }
        let shared =
            Arc::new(Shared { http: OidcHttp(http), verified: Verified::default(), refetch_interval, keys_max_age });
        let oidc = Oidc { issuers: issuers.into_iter().map(Arc::new).collect(), shared, checks: AtomicU64::new(0) };
        for issuer in &oidc.issuers {
            if issuer.config.jwks_file.is_none() {
                if let Err(e) = oidc.shared.refetch(issuer).await {
                    slog::warn!(log, "OpenID Connect discovery failed; will retry when a token needs it";
                        "issuer" => &issuer.config.issuer, "error" => e);
                }
            }
        }
        Ok(oidc)
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// How many tokens were checked in full (signature and claims) rather
    /// than found among those remembered: the work that remembering saves
    /// (tests count it).
    pub fn signature_checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// Verifies an ID token; the error is a message for the 401.
    pub async fn verify(&self, token: &str) -> Result<Identity, String> {
        self.refresh_old_keys();
        let hash = *blake3::hash(token.as_bytes()).as_bytes();
        if let Some(identity) = self.shared.verified.get(&hash, Utc::now()) {
            return Ok(identity);
        }
        let (checked, issuer) = self.verify_signed(token).await?;
        if let Some(key) = checked.key {
            let remembered = Remembered { identity: checked.identity.clone(), exp: checked.exp, key };
            self.shared.verified.put(hash, remembered, Utc::now(), |key| issuer.publishes(key));
        }
        Ok(checked.identity)
    }

    /// Starts a background refetch of each discovered issuer's keys that
    /// are older than `keys_max_age` (or were never fetched), at most once
    /// per `refetch_interval`; until it ends, the keys held are used. The
    /// refetch forgets the remembered tokens of keys it no longer finds, so
    /// a token of a withdrawn key is refused from then on.
    fn refresh_old_keys(&self) {
        for issuer in self.issuers.iter().filter(|i| i.config.jwks_file.is_none()) {
            let Some(claim) = issuer.claim_fetch(self.shared.refetch_interval, Some(self.shared.keys_max_age)) else {
                continue;
            };
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let _ = shared.fetch(claim).await;
            });
        }
    }

    /// The full check of a token not seen before: signature, `iss`, `aud`,
    /// `exp`. Also returns the issuer whose key checked it.
    async fn verify_signed(&self, token: &str) -> Result<(Checked, &Issuer), String> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        let parsed: CoreIdToken = token.parse().map_err(|_| malformed(token))?;
        let iss = unverified_issuer(token).ok_or("the ID token has no `iss` claim")?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.config.issuer.trim_end_matches('/') == iss.trim_end_matches('/'))
            .ok_or_else(|| "the ID token's issuer is not accepted by this server".to_string())?;

        let verified = match issuer.verify(&parsed) {
            Err(ClaimsVerificationError::SignatureVerification(SignatureVerificationError::NoMatchingKey))
                if issuer.config.jwks_file.is_none() =>
            {
                // Maybe the issuer rotated its keys: fetch them, or wait
                // for the fetch under way.
                if self.shared.refetch(issuer).await.is_ok() {
                    issuer.verify(&parsed).map_err(describe)
                } else {
                    Err(describe(ClaimsVerificationError::SignatureVerification(
                        SignatureVerificationError::NoMatchingKey,
                    )))
                }
            }
            other => other.map_err(describe),
        }?;
        // The signature holds, so the payload is the issuer's.
        check_not_before(token, Utc::now())?;
        // Users are keyed by issuer and subject: a token must name someone,
        // within what OpenID Connect allows a subject (Core 1.0, 2: at most
        // 255 ASCII characters), so that no token makes a key of any size.
        let subject = &verified.identity.subject;
        if subject.is_empty() {
            return Err("the ID token's `sub` claim is empty: it names no one".into());
        }
        if subject.len() > MAX_SUBJECT || !subject.is_ascii() {
            return Err(format!(
                "the ID token's `sub` claim is not a subject OpenID Connect allows (at most {MAX_SUBJECT} ASCII \
                 characters)"
            ));
        }
        Ok((verified, issuer))
    }
}

impl Shared {
    /// Fetches the issuer's discovery document and keys, unless a fetch
    /// began less than `refetch_interval` ago; if that fetch is still under
    /// way, waits for it to end (a token that needs a key it may bring is
    /// checked again with what it brought).
    async fn refetch(&self, issuer: &Arc<Issuer>) -> Result<(), String> {
        match issuer.claim_fetch(self.refetch_interval, None) {
            Some(claim) => self.fetch(claim).await,
            None if issuer.wait_for_fetch().await => Ok(()),
            None => Err("keys were fetched too recently".into()),
        }
    }

    /// The fetch itself, once claimed.
    async fn fetch(&self, claim: FetchClaim) -> Result<(), String> {
        let issuer = &claim.0;
        // Discovery fetches the JWKS the document names, too.
        let metadata = CoreProviderMetadata::discover_async(issuer.url.clone(), &self.http)
            .await
            .map_err(|e| format!("discovery: {e}"))?;
        let keys = Arc::new(Keys::new(metadata.jwks().clone()));
        *issuer.keys.write().unwrap_or_else(|p| p.into_inner()) = keys.clone();
        issuer.fetches.lock().unwrap_or_else(|p| p.into_inner()).fetched = Some(Instant::now());
        // A token verified with a key the issuer no longer publishes must be
        // checked again (after the keys are replaced: see `Verified::put`).
        self.verified.forget_withdrawn(&issuer.config.issuer, &keys.prints);
        Ok(())
    }
}

impl Issuer {
    /// Whether a fetch may begin now (none began in the last `interval`,
    /// and, given `max_age`, the keys held are older than it or were never
    /// fetched); if so, it is counted as begun, and under way until the
    /// claim is dropped.
    fn claim_fetch(self: &Arc<Self>, interval: Duration, max_age: Option<Duration>) -> Option<FetchClaim> {
        let mut fetches = self.fetches.lock().unwrap_or_else(|p| p.into_inner());
        if fetches.tried.is_some_and(|t| t.elapsed() < interval) {
            return None;
        }
        if let (Some(max_age), Some(fetched)) = (max_age, fetches.fetched) {
            if fetched.elapsed() < max_age {
                return None;
            }
        }
        fetches.tried = Some(Instant::now());
        fetches.running = true;
        Some(FetchClaim(self.clone()))
    }

    /// Waits for the fetch under way, if there is one, to end; whether
    /// there was one. (Bounded: a fetch is two requests with a timeout.)
    async fn wait_for_fetch(&self) -> bool {
        let mut waited = false;
        loop {
            let mut ended = std::pin::pin!(self.fetch_ended.notified());
            // Listening before looking: an end between the two is not missed.
            ended.as_mut().enable();
            if !self.fetches.lock().unwrap_or_else(|p| p.into_inner()).running {
                return waited;
            }
            ended.await;
            waited = true;
        }
    }

    /// Whether the keys held hold this one.
    fn publishes(&self, key: &KeyPrint) -> bool {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).prints.contains(key)
    }

    /// Checks `token` against each audience in turn: the first it is for
    /// decides; for none, the audience's error.
    fn verify(&self, token: &CoreIdToken) -> Result<Checked, ClaimsVerificationError> {
        let mut refused = None;
        for audience in &self.audiences {
            match self.verify_for(token, audience) {
                Err(e @ ClaimsVerificationError::InvalidAudience(_)) => refused = Some(e),
                other => return other,
            }
        }
        Err(refused.unwrap_or_else(|| ClaimsVerificationError::InvalidAudience("no audience configured".into())))
    }

    fn verify_for(&self, token: &CoreIdToken, audience: &str) -> Result<Checked, ClaimsVerificationError> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        let verifier = CoreIdTokenVerifier::new_public_client(
            ClientId::new(audience.to_string()),
            self.url.clone(),
            keys.set.clone(),
        )
        .set_allowed_algs([
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha384,
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha512,
            CoreJwsSigningAlgorithm::RsaSsaPssSha256,
            CoreJwsSigningAlgorithm::RsaSsaPssSha384,
            CoreJwsSigningAlgorithm::RsaSsaPssSha512,
            CoreJwsSigningAlgorithm::EcdsaP256Sha256,
            CoreJwsSigningAlgorithm::EcdsaP384Sha384,
            CoreJwsSigningAlgorithm::EdDsa,
        ])
        // A token may name several audiences: besides `audience`, only
        // those configured for this issuer are trusted (OpenID Connect Core
        // 3.1.3.7); any other refuses it, as `openidconnect` does by default.
        .set_other_audience_verifier_fn(|other: &Audience| self.audiences.iter().any(|a| a == other.as_str()));
        // Bearer tokens presented to an API carry no nonce of ours.
        let claims = token.claims(&verifier, |_: Option<&Nonce>| Ok(()))?;
        let identity = Identity {
            issuer: self.config.issuer.clone(),
            subject: claims.subject().as_str().to_string(),
            // Only an address the issuer verified: users are found by email
            // (`admin create-key`, adding a member), so an unverified claim
            // would let anyone take an address's place. And only one in the
            // form those take (trimmed, NAME@DOMAIN, at most 320 characters):
            // any other is no address anyone could find the user by.
            email: claims
                .email()
                .filter(|_| claims.email_verified() == Some(true))
                .and_then(|e| crate::users::email(e.as_str()).ok()),
            name: claims.name().and_then(|n| n.get(None)).and_then(|n| crate::users::display_name(n.as_str())),
        };
        // The key the check used: the one key of the set that the token's
        // `kid` and algorithm pick.
        let key = token.signing_key(&verifier).ok().and_then(key_print);
        Ok(Checked { identity, exp: claims.expiration(), key })
    }
}

async fn fetch(
    http: &reqwest::Client,
    request: openidconnect::HttpRequest,
) -> Result<openidconnect::HttpResponse, reqwest::Error> {
    let (parts, body) = request.into_parts();
    let response = http.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body).send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?.to_vec();
    let mut out = openidconnect::HttpResponse::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

fn describe(e: ClaimsVerificationError) -> String {
    match e {
        ClaimsVerificationError::Expired(_) => "the ID token has expired".into(),
        ClaimsVerificationError::InvalidAudience(_) => "the ID token is not for this server's audience".into(),
        ClaimsVerificationError::InvalidIssuer(_) => "the ID token's issuer is not accepted by this server".into(),
        ClaimsVerificationError::SignatureVerification(SignatureVerificationError::NoMatchingKey) => {
            "the ID token is signed with a key the issuer does not publish".into()
        }
        ClaimsVerificationError::SignatureVerification(_) => "the ID token's signature is not valid".into(),
        _ => "the ID token is not valid".into(),
    }
}

/// How far the issuer's clock may be ahead of ours: a token issued (`iat`)
/// or valid from (`nbf`) up to this far in our future is accepted.
pub const CLOCK_SKEW: chrono::Duration = chrono::Duration::seconds(60);

/// `nbf` and `iat`, which `openidconnect` does not check: a token is not
/// accepted before the time its issuer says it becomes valid (RFC 7519
/// 4.1.5), nor if it says it was issued later than now (beyond
/// [`CLOCK_SKEW`]). Read from a payload whose signature is verified.
fn check_not_before(token: &str, now: DateTime<Utc>) -> Result<(), String> {
    let Some(claims) = payload(token) else {
        return Err("the bearer token is not a well-formed ID token".into());
    };
    let latest = now + CLOCK_SKEW;
    for (claim, what) in [("nbf", "is not valid yet"), ("iat", "was issued in the future")] {
        let Some(value) = claims.get(claim) else { continue };
        // A NumericDate: seconds, possibly fractional.
        let Some(seconds) = value.as_f64() else {
            return Err(format!("the ID token's `{claim}` is not a time"));
        };
        if seconds > latest.timestamp() as f64 {
            return Err(format!("the ID token {what} (`{claim}`)"));
        }
    }
    Ok(())
}

/// Why a token could not be read. `email_verified` is a boolean (OpenID
/// Connect Core 5.1), or the string "true" or "false" that some issuers
/// (Amazon Cognito) send instead; `openidconnect` reads the claims before
/// the signature is checked and refuses the token over any other value,
/// which is then named, since the issuer's configuration, not the client,
/// is at fault.
fn malformed(token: &str) -> String {
    match payload(token).as_ref().and_then(|claims| claims.get("email_verified")) {
        Some(v) if !(v.is_boolean() || v.is_null() || v == "true" || v == "false") => {
            "the ID token's `email_verified` claim is neither a boolean nor \"true\" or \"false\"".into()
        }
        _ => "the bearer token is not a well-formed ID token".into(),
    }
}

/// A token's payload, decoded but not verified.
fn payload(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The `iss` claim, read without verification, to pick the issuer whose
/// keys verify the token.
fn unverified_issuer(token: &str) -> Option<String> {
    payload(token)?.get("iss")?.as_str().map(str::to_string)
}

/// Whether a JWKS document (`{"keys": [...]}`) holds a public key a
/// signature can be checked with.
fn holds_a_public_key(jwks: &serde_json::Value) -> bool {
    let has =
        |key: &serde_json::Value, fields: &[&str]| fields.iter().all(|f| key.get(*f).is_some_and(|v| v.is_string()));
    jwks.get("keys").and_then(serde_json::Value::as_array).is_some_and(|keys| {
        keys.iter().any(|key| match key.get("kty").and_then(serde_json::Value::as_str) {
            Some("RSA") => has(key, &["n", "e"]),
            Some("EC") => has(key, &["crv", "x", "y"]),
            Some("OKP") => has(key, &["crv", "x"]),
            _ => false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { issuer: "https://issuer.test".into(), subject: "alice".into(), email: None, name: None }
    }

    #[test]
    fn a_refetch_forgets_only_the_tokens_of_keys_it_no_longer_finds() {
        let verified = Verified::default();
        let (now, exp) = (Utc::now(), Utc::now() + chrono::Duration::minutes(10));
        let of = |identity: Identity, key: u8| Remembered { identity, exp, key: [key; 32] };
        let elsewhere = Identity { issuer: "https://other.test".into(), ..identity() };
        verified.put([1; 32], of(identity(), 10), now, |_| true);
        verified.put([2; 32], of(identity(), 20), now, |_| true);
        verified.put([3; 32], of(elsewhere, 10), now, |_| true);
        // The issuer withdraws key 10 and keeps 20.
        verified.forget_withdrawn("https://issuer.test", &HashSet::from([[20; 32]]));
        assert!(verified.get(&[1; 32], now).is_none(), "checked with the withdrawn key");
        assert_eq!(verified.get(&[2; 32], now).unwrap().subject, "alice", "checked with a key still published");
        assert!(verified.get(&[3; 32], now).is_some(), "another issuer's key 10");
        // A check that ends after its key was withdrawn is not remembered.
        verified.put([4; 32], of(identity(), 10), now, |key| *key == [20; 32]);
        assert!(verified.get(&[4; 32], now).is_none());
        // A remembered token, until it expires.
        assert!(verified.get(&[2; 32], exp).is_none());
    }
}
