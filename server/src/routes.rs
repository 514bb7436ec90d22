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
//! A request is walked over [`Routes`], a table of the paths as the spec
//! documents them that only compares the path's segments (no allocation). A
//! path matches the most specific documented path, a literal segment before
//! a variable (OpenAPI's rule: `/reviews/reviewers` is that path, not
//! `/reviews/{id}`), so the answer follows the documented paths where
//! dropshot's routes merge them (see `bridge`): `DELETE /reviews/reviewers`
//! is a 405 that allows `GET`, where the router would hand it to
//! `DELETE /reviews/{id}`, and a 405's `Allow` names the methods of that
//! path alone, not of every operation the route serves. A request the walk
//! cannot be sure of (an encoded or dot segment, a route taking the rest of
//! the path) is left to a second copy of the server's router, whose
//! refusal is answered with its own status and `Allow`.

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
    let routes = Routes::new(router.endpoints(None).flat_map(|(path, method, _)| documented(path, method)));
    let lookup = move |method: &Method, path: &str| router.lookup_route(method, path.into(), Some(&VERSION)).err();
    VersionPolicy::Dynamic(Box::new(KnownRoutes { routes, lookup: Box::new(lookup) }))
}

/// The documented paths a route of dropshot's serves with `method`: those
/// of the operations bridged onto it (several, where operations with
/// literal segments share one route), or its own.
fn documented(path: String, method: String) -> Vec<(String, String)> {
    let bridged: Vec<(String, String)> = crate::BRIDGED_ROUTES
        .iter()
        .filter(|b| b.route_path == path && b.method == method)
        .map(|b| (b.spec_path.to_string(), method.clone()))
        .collect();
    if bridged.is_empty() {
        vec![(path, method)]
    } else {
        bridged
    }
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
        match self.routes.find(path) {
            Found::Path(methods) if methods.contains(method) => Ok(VERSION),
            Found::Path(methods) => {
                let mut refused = no_route(&methods.iter().map(Method::as_str).collect::<Vec<_>>());
                refused.internal_message = format!("{method} is not a method of the documented path of {path}");
                Err(refused)
            }
            Found::None => {
                let mut refused = no_route(&[]);
                refused.internal_message = format!("no documented path matches {path}");
                Err(refused)
            }
            Found::Unsure => match (self.lookup)(method, path) {
                None => Ok(VERSION),
                Some(refused) => Err(with_error_code(refused)),
            },
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

/// The documented paths, as a tree of path segments, for a walk that
/// allocates nothing but for a segment with a `%`, which it decodes. What
/// it is unsure of (a dot segment, a segment not UTF-8 once decoded, a
/// route ending in a `{rest:.*}` variable) is left to the router's lookup.
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
            if let Ok(method) = method.parse::<Method>() {
                node.methods.push(method);
                node.methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                node.methods.dedup();
            }
        }
        root
    }

    /// The documented path `path` is, most specific first: at each segment
    /// a literal before a variable, and the variable tried when the literal
    /// leads to no path.
    fn find(&self, path: &str) -> Found<'_> {
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        match self.walk(&mut segments.clone()) {
            Found::None if segments.any(undecided) => Found::Unsure,
            found => found,
        }
    }

    fn walk<'a, 'p>(&'a self, segments: &mut (impl Iterator<Item = &'p str> + Clone)) -> Found<'a> {
        let Some(segment) = segments.next() else {
            return match (self.rest, self.methods.is_empty()) {
                (true, _) => Found::Unsure,
                (false, true) => Found::None,
                (false, false) => Found::Path(&self.methods),
            };
        };
        if self.rest || dot(segment) {
            return Found::Unsure;
        }
        // As the router reads it: `review%65rs` is `reviewers`.
        let Some(segment) = decoded(segment) else { return Found::Unsure };
        if let Some((_, next)) = self.literals.iter().find(|(s, _)| **s == *segment) {
            match next.walk(&mut segments.clone()) {
                Found::None => {}
                found => return found,
            }
        }
        match &self.variable {
            Some(next) => next.walk(segments),
            None => Found::None,
        }
    }
}

/// A segment the router refuses, a dot segment or one not UTF-8 once
/// decoded: left to it, for its 400. Any other is matched decoded, as the
/// router matches it.
fn undecided(segment: &str) -> bool {
    dot(segment) || decoded(segment).is_none()
}

fn dot(segment: &str) -> bool {
    segment == "." || segment == ".."
}

/// A segment percent-decoded, as the router decodes it, if UTF-8; one
/// without a `%` as it is, with no allocation.
fn decoded(segment: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !segment.contains('%') {
        return Some(std::borrow::Cow::Borrowed(segment));
    }
    percent_encoding::percent_decode_str(segment).decode_utf8().ok()
}

/// Which documented path a request's path is.
#[derive(Debug, PartialEq)]
enum Found<'a> {
    /// This one, which takes these methods.
    Path(&'a [Method]),
    /// None: a 404.
    None,
    /// Left to the router.
    Unsure,
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
                ("/v1/reviews/reviewers", "GET"),
                ("/v1/reviews/calibration", "GET"),
                ("/v1/reviews/calibration", "POST"),
                ("/v1/reviews/{id}", "DELETE"),
                ("/v1/test-results/{id}", "GET"),
                ("/v1/test-results/by-call/{callId}", "GET"),
            ]
            .map(|(p, m)| (p.to_string(), m.to_string())),
        )
    }

    #[test]
    fn a_path_is_the_most_specific_documented_path_it_matches() {
        let r = routes();
        let (get, post, delete) = (Method::GET, Method::POST, Method::DELETE);
        for (path, methods) in [
            ("/v1/tests", vec![get.clone(), post.clone()]),
            ("/v1/tests/tst_1", vec![get.clone()]),
            ("/v1/tests/tst_1/results", vec![get.clone()]),
            ("//v1//tests/", vec![get.clone(), post.clone()]),
            // A literal before a variable: these are not `/v1/reviews/{id}`.
            ("/v1/reviews/reviewers", vec![get.clone()]),
            ("/v1/reviews/calibration", vec![get.clone(), post.clone()]),
            ("/v1/reviews/rev_1", vec![delete.clone()]),
            // A literal that leads to no documented path: the variable.
            ("/v1/test-results/by-call", vec![get.clone()]),
            ("/v1/test-results/by-call/call_1", vec![get.clone()]),
            // Read decoded, as the router reads it.
            ("/v1/t%65sts", vec![get.clone(), post.clone()]),
            ("/v1/reviews/review%65rs", vec![get.clone()]),
            ("/v1/reviews/rev%5F1", vec![delete.clone()]),
            ("/v1/tests/a%2Fb", vec![get.clone()]),
        ] {
            assert_eq!(r.find(path), Found::Path(&methods), "{path}");
        }
        for path in ["/v1", "/", "/v1/tests/tst_1/other", "/v1/tests/tst_1/results/more", "/v2/tests", "/v2/t%65sts"] {
            assert_eq!(r.find(path), Found::None, "{path}");
        }
        // Left to the router: it refuses dot segments and a segment not
        // UTF-8 once decoded.
        for path in ["/v1/tests/../tests", "/v1/files/a/b", "/v1/files", "/v1/tests/%FF", "/v1/t%FFsts", "/v2/%FF"] {
            assert_eq!(r.find(path), Found::Unsure, "{path}");
        }
    }

    /// Operations bridged onto one route each keep their documented path.
    #[test]
    fn a_bridged_route_is_its_operations_documented_paths() {
        let shared = crate::BRIDGED_ROUTES.iter().find(|b| b.operation_id == "list_reviewers").unwrap();
        let paths = documented(shared.route_path.to_string(), "GET".to_string());
        let paths: Vec<&str> = paths.iter().map(|(p, _)| p.as_str()).collect();
        assert!(paths.contains(&"/v1/reviews/reviewers") && paths.contains(&"/v1/reviews/calibration"), "{paths:?}");
        assert!(!paths.contains(&shared.route_path), "{paths:?}");
        assert_eq!(documented("/v1/tests".into(), "GET".into()), [("/v1/tests".to_string(), "GET".to_string())]);
    }
}
