//! Sparring's HTTP API, as a dropshot API trait with the types of its wire.
//!
//! `generated.rs` is written by `cargo xtask regen` from `spec/openapi.json`
//! and never edited by hand; it holds `types` (every schema of the spec),
//! `params` (path, query and header parameters), the `SparringApi` trait and the
//! table of bridged routes. This file and its siblings hold the few pieces the
//! generated code is written against:
//!
//! - [`ApiError`]: the error body `{error_code, message, request_id}`, typed by
//!   the spec schema it documents as (`Error` or `ApiKeyError`).
//! - [`Input`]: one extractor per endpoint that authenticates the caller
//!   *before* it looks at the path, the query or the body, so that a missing
//!   or invalid credential is a 401 whatever else is wrong with the request.
//! - [`ApiContext`]: the server context: an [`Authenticator`] and the
//!   implementation's state.
//! - [`Reply`] and [`Json`]: what every endpoint returns: a success body
//!   that is a value of the spec's type or that value already written as
//!   JSON, documented as the type either way.
//! - [`BridgedRoute`]: how a documented path that dropshot's router cannot
//!   hold is served (see `xtask/src/routes.rs`), and [`RoutePath`], the
//!   path extractor that checks its literal segments.
//! - [`known_routes`]: error codes on the 404 and 405 dropshot's router
//!   answers itself.
//!
//! The implementation lives in `sparring-impl`; this crate has no logic.

mod bridge;
mod error;
#[allow(clippy::all, unused_imports, dead_code, missing_docs)]
mod generated;
mod input;
mod reply;
mod routes;

pub use bridge::{no_route, shared_query, BridgedRoute, RouteLiterals, RoutePath};
pub use error::{ApiError, ErrorCode};
pub use generated::*;
pub use input::{
    not_null, unauthorized, ApiContext, Authenticator, BodyFields, Caller, Credential, Headers, Input, JsonBody,
    Nothing, OptionalJsonBody, Query, BODY_IDLE_TIMEOUT,
};
pub use reply::{Json, Reply};
pub use routes::{known_routes, REFUSAL_LOG_MESSAGE};
