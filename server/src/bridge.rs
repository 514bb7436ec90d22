use async_trait::async_trait;
use dropshot::{
    ApiEndpointBodyContentType, ErrorStatusCode, ExtractorMetadata, HttpError, RequestContext, ServerContext,
    SharedExtractor,
};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// A documented operation whose path dropshot's router cannot hold as
/// written, and the route that serves it instead.
///
/// The generated endpoint for such an operation is registered at
/// `route_path`; before it calls the implementation it checks `literals` (a
/// route variable that must equal the literal segment the spec has there;
/// otherwise 404) and maps `renames` (route variable → spec parameter). The
/// drift test uses the same table to map dropshot's document back onto the
/// spec's paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgedRoute {
    pub operation_id: &'static str,
    pub method: &'static str,
    /// The path as documented, with the base path.
    pub spec_path: &'static str,
    /// The path dropshot routes, with the base path.
    pub route_path: &'static str,
    /// `(route variable, literal)` pairs.
    pub literals: &'static [(&'static str, &'static str)],
    /// `(route variable, spec parameter)` pairs.
    pub renames: &'static [(&'static str, &'static str)],
}

/// The route variables of a bridged operation (see
/// `xtask/src/server_gen.rs`), which know the literal segments the
/// documented path has where the route has variables.
pub trait RouteLiterals {
    /// `Ok` when the request is for this operation; otherwise the answer
    /// for its path and method (see [`no_route`]).
    fn check(&self) -> Result<(), HttpError>;
}

/// A bridged operation's path: its route variables, extracted as
/// `dropshot::Path<R>` extracts (and documents) them, then checked against
/// the documented literals. [`Input`](crate::Input) reads the path before
/// the query and the body, so a path that is not this operation's is
/// answered as one (404, or 405) before anything else is looked at.
pub struct RoutePath<R>(R);

impl<R> RoutePath<R> {
    pub fn into_inner(self) -> R {
        self.0
    }
}

#[async_trait]
impl<R> SharedExtractor for RoutePath<R>
where
    R: RouteLiterals + DeserializeOwned + JsonSchema + Send + Sync + 'static,
{
    async fn from_request<Context: ServerContext>(rqctx: &RequestContext<Context>) -> Result<Self, HttpError> {
        let route = <dropshot::Path<R> as SharedExtractor>::from_request(rqctx).await?.into_inner();
        route.check()?;
        Ok(RoutePath(route))
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <dropshot::Path<R> as SharedExtractor>::metadata(body_content_type)
    }
}

/// The answer for a request that reached a bridged route but none of its
/// operations, or that dropshot's router refused (see `routes`): what the
/// router answers for a path it does not hold with this method, with an
/// error code. `allow` is the methods that other operations serve at
/// this very path (sorted, as dropshot lists them): none is a 404, some a
/// 405 with one `Allow` header each.
pub fn no_route(allow: &[&str]) -> HttpError {
    if allow.is_empty() {
        return ApiError::<()>::not_found("no route matches this path").into();
    }
    let mut e: HttpError = ApiError::<()>::new(
        ErrorStatusCode::METHOD_NOT_ALLOWED,
        crate::ErrorCode::METHOD_NOT_ALLOWED,
        format!("this path takes only {}", allow.join(", ")),
    )
    .into();
    for method in allow {
        // A method's name is valid header text.
        let _ = e.add_header(http::header::ALLOW, *method);
    }
    e
}

/// The query of an operation served by a shared route's endpoint (see
/// `xtask/src/server_gen.rs`): that endpoint learns which operation it
/// serves only from the path, so it reads the query afterwards, with the
/// same errors as the `Input` extractor.
pub async fn shared_query<Q, C>(rqctx: &dropshot::RequestContext<C>) -> Result<Q, dropshot::HttpError>
where
    Q: serde::de::DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static,
    C: dropshot::ServerContext,
{
    let query = <crate::Query<Q> as SharedExtractor>::from_request(rqctx).await?;
    Ok(query.into_inner())
}
