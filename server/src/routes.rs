//! Error codes on the answers of dropshot's own router.
//!
//! A path dropshot holds no route for is a 404, and a method no route of the
//! path takes a 405 with `Allow`; dropshot writes both itself, with no
//! `error_code`, where every other error of the API has one (`not_found`,
//! `method_not_allowed`: DESIGN §2). A typed client that reads the error body
//! (an older server than the client, a mistyped path) then fails to read it
//! instead of showing the error. dropshot has no hook on those answers, but
//! it asks a [`DynamicVersionPolicy`] for every request before it routes it,
//! and an error from the policy is the answer. So [`known_routes`] is a
//! policy that answers a request dropshot's router would refuse, with the
//! same status and `Allow` as the router, and an `error_code`, and lets every
//! other request through (the API has one version, so the one it names is
//! any).
//!
//! The refusal is found by the router itself, a second copy of the server's:
//! its lookup is the same code over the same routes, so the status and
//! `Allow` are the router's own. A lookup allocates every segment of the
//! path, so a request is first walked over [`Routes`], a table of the same
//! routes that only compares the path's segments: one it matches, with its
//! method, goes through without the lookup.

use dropshot::semver::Version;
use dropshot::{ApiDescription, DynamicVersionPolicy, ErrorStatusCode, HttpError, ServerContext, VersionPolicy};
use http::Method;

use crate::{no_route, ApiError, ErrorCode};

/// What dropshot logs when a policy refuses a request; `known_routes`
/// refuses only what the router would, which dropshot logs as a completed
/// request anyway, so a logger may leave this record out.
pub const REFUSAL_LOG_MESSAGE: &str = "failed to determine request API version";

/// The version every request is routed as: the API's routes are all
/// unversioned, so they serve any.
const VERSION: Version = Version::new(1, 0, 0);

/// The policy that puts error codes on the router's 404 and 405 (see the
/// module's documentation). `api` must describe the server's routes: the
/// same description the server is built from, built a second time.
pub fn known_routes<C: ServerContext>(api: ApiDescription<C>) -> VersionPolicy {
    let router = api.into_router();
    let routes = Routes::new(router.endpoints(None).map(|(path, method, _)| (path, method)));
    let lookup = move |method: &Method, path: &str| router.lookup_route(method, path.into(), Some(&VERSION)).err();
    VersionPolicy::Dynamic(Box::new(KnownRoutes { routes, lookup: Box::new(lookup) }))
}

type Lookup = Box<dyn Fn(&Method, &str) -> Option<HttpError> + Send + Sync>;

struct KnownRoutes {
    routes: Routes,
    lookup: Lookup,
}

impl std::fmt::Debug for KnownRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownRoutes").field("routes", &self.routes).finish_non_exhaustive()
    }
}

impl DynamicVersionPolicy for KnownRoutes {
    fn request_extract_version(
        &self,
        request: &http::Request<dropshot::Body>,
        _log: &slog::Logger,
    ) -> Result<Version, HttpError> {
        let (method, path) = (request.method(), request.uri().path());
        if self.routes.holds(method, path) {
            return Ok(VERSION);
        }
        match (self.lookup)(method, path) {
            None => Ok(VERSION),
            Some(refused) => Err(with_error_code(refused)),
        }
    }
}

/// The router's refusal with the API's `error_code`: a 404 or 405 as a
/// bridged route answers one ([`no_route`], with the methods the router's
/// `Allow` names), anything else (a path whose segments are not UTF-8 once
/// decoded, or `.`/`..`) as an invalid path; the router's reason kept for
/// the log.
fn with_error_code(refused: HttpError) -> HttpError {
    let mut coded = match refused.status_code {
        ErrorStatusCode::NOT_FOUND | ErrorStatusCode::METHOD_NOT_ALLOWED => {
            let allow: Vec<&str> = refused
                .headers
                .iter()
                .flat_map(|headers| headers.get_all(http::header::ALLOW))
                .filter_map(|v| v.to_str().ok())
                .collect();
            no_route(&allow)
        }
        status => ApiError::<()>::new(
            status,
            ErrorCode::INVALID_PATH,
            format!("the path is not valid: {}", refused.external_message),
        )
        .into(),
    };
    coded.internal_message = refused.internal_message;
    coded
}

/// The routes, as a tree of path segments, for a walk that allocates
/// nothing. Only a match counts: anything it is unsure of (a segment with a
/// `%`, a dot segment, a route ending in a `{rest:.*}` variable) is left to
/// the router's lookup.
#[derive(Debug, Default)]
struct Routes {
    /// Literal segments and what follows them.
    literals: Vec<(Box<str>, Routes)>,
    /// A `{variable}` segment and what follows it.
    variable: Option<Box<Routes>>,
    /// A route ends in a variable that takes the rest of the path.
    rest: bool,
    /// The methods of the route that ends here.
    methods: Vec<Method>,
}

impl Routes {
    fn new(routes: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut root = Routes::default();
        for (path, method) in routes {
            let mut node = &mut root;
            for segment in path.split('/').filter(|s| !s.is_empty()) {
                if segment.starts_with('{') && segment.ends_with('}') {
                    if segment.contains(":.*") {
                        node.rest = true;
                        break;
                    }
                    node = node.variable.get_or_insert_with(Default::default);
                } else {
                    let at = match node.literals.iter().position(|(s, _)| &**s == segment) {
                        Some(at) => at,
                        None => {
                            node.literals.push((segment.into(), Routes::default()));
                            node.literals.len() - 1
                        }
                    };
                    node = &mut node.literals[at].1;
                }
            }
            if let Ok(method) = method.parse() {
                node.methods.push(method);
            }
        }
        root
    }

    /// Whether a route surely takes `method` at `path`.
    fn holds(&self, method: &Method, path: &str) -> bool {
        let mut node = self;
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            if node.rest || segment.contains('%') || segment == "." || segment == ".." {
                return false;
            }
            node = match node.literals.iter().find(|(s, _)| &**s == segment) {
                Some((_, next)) => next,
                None => match &node.variable {
                    Some(next) => next,
                    None => return false,
                },
            };
        }
        !node.rest && node.methods.contains(method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        Routes::new(
            [
                ("/v1/tests", "GET"),
                ("/v1/tests", "POST"),
                ("/v1/tests/{id}", "GET"),
                ("/v1/tests/{id}/results", "GET"),
                ("/v1/files/{rest:.*}", "GET"),
            ]
            .map(|(p, m)| (p.to_string(), m.to_string())),
        )
    }

    #[test]
    fn a_route_s_path_and_method_are_held_and_nothing_else_is() {
        let r = routes();
        for (method, path) in [
            (Method::GET, "/v1/tests"),
            (Method::POST, "/v1/tests"),
            (Method::GET, "/v1/tests/tst_1"),
            (Method::GET, "/v1/tests/tst_1/results"),
            (Method::GET, "//v1//tests/"),
        ] {
            assert!(r.holds(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::DELETE, "/v1/tests"),
            (Method::GET, "/v1"),
            (Method::GET, "/"),
            (Method::GET, "/v1/tests/tst_1/other"),
            (Method::GET, "/v1/tests/tst_1/results/more"),
            (Method::GET, "/v2/tests"),
            // Left to the router: it decodes, and refuses dot segments.
            (Method::GET, "/v1/t%65sts"),
            (Method::GET, "/v1/tests/../tests"),
            (Method::GET, "/v1/files/a/b"),
            (Method::GET, "/v1/files"),
        ] {
            assert!(!r.holds(&method, path), "{method} {path}");
        }
    }
}
