//! The ID token of the bench user: signed with the test suite's issuer key
//! (`tests/fixtures/issuer-key.pem`), verified by the server against a JWKS
//! file (`--oidc-jwks`), as an offline deployment does.

use std::path::Path;

use openidconnect::core::{
    CoreIdToken, CoreIdTokenClaims, CoreJsonWebKeySet, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey,
};
use openidconnect::{
    Audience, EmptyAdditionalClaims, EndUserEmail, IssuerUrl, JsonWebKeyId, PrivateSigningKey as _, StandardClaims,
    SubjectIdentifier,
};

pub const ISSUER: &str = "https://issuer.bench.invalid";
pub const AUDIENCE: &str = "sparring-bench";
const KEY_PEM: &str = include_str!("../../tests/fixtures/issuer-key.pem");
const KID: &str = "bench-1";

fn signing_key() -> anyhow::Result<CoreRsaPrivateSigningKey> {
    CoreRsaPrivateSigningKey::from_pem(KEY_PEM, Some(JsonWebKeyId::new(KID.to_string())))
        .map_err(|e| anyhow::anyhow!("reading the issuer key: {e}"))
}

/// Writes the issuer's public keys, for `--oidc-jwks`.
pub fn write_jwks(path: &Path) -> anyhow::Result<()> {
    let jwks = CoreJsonWebKeySet::new(vec![signing_key()?.as_verification_key()]);
    std::fs::write(path, serde_json::to_vec(&jwks)?)?;
    Ok(())
}

/// An RS256 ID token for `subject`, valid for `valid_for`.
pub fn sign(subject: &str, valid_for: chrono::Duration) -> anyhow::Result<String> {
    let now = chrono::Utc::now();
    let claims = CoreIdTokenClaims::new(
        IssuerUrl::new(ISSUER.to_string())?,
        vec![Audience::new(AUDIENCE.to_string())],
        now + valid_for,
        now - chrono::Duration::seconds(60),
        StandardClaims::new(SubjectIdentifier::new(subject.to_string()))
            .set_email(Some(EndUserEmail::new(format!("{subject}@example.com")))),
        EmptyAdditionalClaims {},
    );
    let token = CoreIdToken::new(claims, &signing_key()?, CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256, None, None)
        .map_err(|e| anyhow::anyhow!("signing the ID token: {e}"))?;
    Ok(token.to_string())
}
