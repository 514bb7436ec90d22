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

/// The query of an operation served by a shared route's endpoint (see
/// `xtask/src/server_gen.rs`): that endpoint learns which operation it
/// serves only from the path, so it reads the query afterwards, with the
/// same errors as the `Input` extractor.
pub async fn shared_query<Q, C>(rqctx: &dropshot::RequestContext<C>) -> Result<Q, dropshot::HttpError>
where
    Q: serde::de::DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static,
    C: dropshot::ServerContext,
{
    let query = <dropshot::Query<Q> as dropshot::SharedExtractor>::from_request(rqctx)
        .await
        .map_err(|e| crate::input::coded(e, crate::ErrorCode::INVALID_QUERY))?;
    Ok(query.into_inner())
}
