//! ID tokens for the tests: the RSA keys of a test issuer (`fixtures/`),
//! its JWKS, and tokens signed with them.
#![allow(dead_code)]

use openidconnect::core::{
    CoreIdToken, CoreIdTokenClaims, CoreJsonWebKeySet, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey,
};
use openidconnect::{
    Audience, EmptyAdditionalClaims, EndUserEmail, IssuerUrl, JsonWebKeyId, PrivateSigningKey as _, StandardClaims,
    SubjectIdentifier,
};

pub const AUDIENCE: &str = "sparring-test";
pub const ISSUER_KEY: &str = include_str!("../fixtures/issuer-key.pem");
pub const OTHER_KEY: &str = include_str!("../fixtures/other-key.pem");

pub fn signing_key(pem: &str, kid: &str) -> CoreRsaPrivateSigningKey {
    CoreRsaPrivateSigningKey::from_pem(pem, Some(JsonWebKeyId::new(kid.to_string()))).unwrap()
}

pub fn jwks_of(pem: &str, kid: &str) -> serde_json::Value {
    serde_json::to_value(CoreJsonWebKeySet::new(vec![signing_key(pem, kid).as_verification_key()])).unwrap()
}

pub struct Token<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    pub subject: &'a str,
    pub expires_in: i64,
    pub key_pem: &'a str,
    pub kid: &'a str,
    /// `<subject>@example.com` unless given.
    pub email: Option<&'a str>,
    pub email_verified: bool,
}

pub fn sign(t: Token<'_>) -> String {
    let now = chrono::Utc::now();
    let claims = CoreIdTokenClaims::new(
        IssuerUrl::new(t.issuer.to_string()).unwrap(),
        vec![Audience::new(t.audience.to_string())],
        now + chrono::Duration::seconds(t.expires_in),
        now - chrono::Duration::seconds(60),
        StandardClaims::new(SubjectIdentifier::new(t.subject.to_string()))
            .set_email(Some(EndUserEmail::new(
                t.email.map_or_else(|| format!("{}@example.com", t.subject), str::to_string),
            )))
            .set_email_verified(Some(t.email_verified)),
        EmptyAdditionalClaims {},
    );
    CoreIdToken::new(claims, &signing_key(t.key_pem, t.kid), CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256, None, None)
        .unwrap()
        .to_string()
}

pub fn valid<'a>(issuer: &'a str, subject: &'a str) -> Token<'a> {
    Token {
        issuer,
        audience: AUDIENCE,
        subject,
        expires_in: 600,
        key_pem: ISSUER_KEY,
        kid: "k1",
        email: None,
        email_verified: true,
    }
}
