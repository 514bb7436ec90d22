use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http_body::Body as _;

use async_trait::async_trait;
use dropshot::{
    ApiEndpointBodyContentType, ExclusiveExtractor, ExtensionMode, ExtractorMetadata, HttpError, RequestContext,
    RequestInfo, ServerContext, SharedExtractor, TypedBody, UntypedBody,
};
use schemars::schema::{RootSchema, Schema, SchemaObject, SingleOrVec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::error::{clip_message, code_for_status, ErrorCode};

/// Who is calling: the user a credential belongs to, and the credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user_id: String,
    pub credential: Credential,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// `x-api-key`; the key's id (never the secret).
    ApiKey { key_id: String },
    /// `Authorization: Bearer` with an OpenID Connect ID token.
    IdToken { issuer: String, subject: String },
}

/// Checks a request's credential. An `Err` is the response: use
/// [`unauthorized`] for a missing or invalid credential.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate<'a>(
        &'a self,
        request: &'a RequestInfo,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, HttpError>> + Send + 'a>>;
}

/// The dropshot server context of every Sparring server: the authenticator
/// the generated endpoints call before they look at anything else, and the
/// implementation's own state.
///
/// dropshot does not let an extractor's type name the API trait's
/// `Self::Context`, so [`Input`] cannot be generic over it; it finds this
/// concrete type instead, and the implementation gets its state back with
/// [`ApiContext::state`].
pub struct ApiContext {
    authenticator: Arc<dyn Authenticator>,
    state: Arc<dyn Any + Send + Sync>,
    body_idle_timeout: Duration,
}

/// How long a request body may go without a byte before the request is
/// answered 408 `request_timeout` and its connection closed: as long as
/// hyper waits for a request's headers.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

impl ApiContext {
    pub fn new<S: Authenticator>(state: Arc<S>) -> Self {
        ApiContext { authenticator: state.clone(), state, body_idle_timeout: BODY_IDLE_TIMEOUT }
    }

    /// With another wait than [`BODY_IDLE_TIMEOUT`] for a body's next byte.
    pub fn with_body_idle_timeout(mut self, timeout: Duration) -> Self {
        self.body_idle_timeout = timeout;
        self
    }

    /// The implementation's state, if it is an `S`.
    pub fn state<S: Any>(&self) -> Option<&S> {
        self.state.downcast_ref::<S>()
    }
}

/// The 401 every operation gives for a missing or invalid credential, with
/// the `WWW-Authenticate` challenge for both accepted credentials.
pub fn unauthorized(message: impl Into<String>) -> HttpError {
    let mut e = HttpError::for_client_error(
        Some(ErrorCode::UNAUTHENTICATED.to_string()),
        dropshot::ClientErrorStatusCode::UNAUTHORIZED,
        message.into(),
    );
    add_challenges(&mut e);
    e
}

/// The `WWW-Authenticate` challenge for both accepted credentials, which
/// every 401 carries (RFC 9110 15.5.2), whichever layer refuses.
pub(crate) fn add_challenges(e: &mut HttpError) {
    // Both values are static and valid header text.
    let _ = e.add_header(http::header::WWW_AUTHENTICATE, "Bearer realm=\"sparring\"");
    let _ = e.add_header(http::header::WWW_AUTHENTICATE, "ApiKey realm=\"sparring\", header=\"x-api-key\"");
}

/// Everything an endpoint takes from a request, extracted in a fixed order:
/// the path, then the caller, query, headers and body.
///
/// (The server context must be [`ApiContext`].)
///
/// dropshot runs separate extractors concurrently, so which error wins would
/// depend on timing; one extractor makes the order part of the contract.
/// `P` is `dropshot::Path<_>`, [`RoutePath`](crate::RoutePath) (a bridged
/// route's, whose literals are checked before the query and body are read)
/// or [`Nothing`]; `Q` is [`Query`] or [`Nothing`]; `B` is [`JsonBody`],
/// [`OptionalJsonBody`] or [`Nothing`]; `H` is [`Headers`] or [`Nothing`].
/// The OpenAPI metadata is theirs, so the document is what dropshot would
/// emit for them as separate arguments.
pub struct Input<P, Q, B, H = Nothing> {
    pub caller: Caller,
    pub path: P,
    pub query: Q,
    pub body: B,
    pub headers: H,
}

#[async_trait]
impl<P, Q, B, H> ExclusiveExtractor for Input<P, Q, B, H>
where
    P: SharedExtractor + 'static,
    Q: SharedExtractor + 'static,
    B: ExclusiveExtractor + 'static,
    H: SharedExtractor + 'static,
{
    async fn from_request<Context: ServerContext>(
        rqctx: &RequestContext<Context>,
        request: hyper::Request<dropshot::Body>,
    ) -> Result<Self, HttpError> {
        let context = api_context(rqctx)?;
        // The path first: a bridged route's path that is no operation's is
        // answered 404 or 405 before the credential is looked at, as
        // dropshot's router answers a path it does not hold.
        let path = P::from_request(rqctx).await.map_err(|e| coded(e, ErrorCode::INVALID_PATH))?;
        let caller = context.authenticator.authenticate(&rqctx.request).await?;
        let query = Q::from_request(rqctx).await.map_err(|e| coded(e, ErrorCode::INVALID_QUERY))?;
        let headers = H::from_request(rqctx).await.map_err(|e| coded(e, ErrorCode::INVALID_HEADER))?;
        let body = B::from_request(rqctx, request).await.map_err(|e| coded(e, ErrorCode::INVALID_BODY))?;
        Ok(Input { caller, path, query, body, headers })
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        let mut parameters = P::metadata(body_content_type.clone()).parameters;
        parameters.extend(Q::metadata(body_content_type.clone()).parameters);
        parameters.extend(H::metadata(body_content_type.clone()).parameters);
        parameters.extend(B::metadata(body_content_type).parameters);
        ExtractorMetadata { extension_mode: ExtensionMode::None, parameters }
    }
}

fn api_context<Context: ServerContext>(rqctx: &RequestContext<Context>) -> Result<&ApiContext, HttpError> {
    (&rqctx.server.private as &dyn Any).downcast_ref::<ApiContext>().ok_or_else(|| {
        HttpError::for_internal_error("the server context must be sparring_server::ApiContext".to_string())
    })
}

/// An operation's header parameters: the fields of `T`, each named (by
/// `serde(rename)`) as the header it is read from, and documented as
/// dropshot's `Header<T>` documents them.
///
/// Unlike `dropshot::Header`, which refuses a request when any of its
/// headers is not visible ASCII, this reads only the headers `T` names
/// (matched regardless of case): one of those given twice, or not as visible
/// ASCII, is a 400 `invalid_header`; every other header is left alone.
pub struct Headers<T>(T);

impl<T> Headers<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

#[async_trait]
impl<T> SharedExtractor for Headers<T>
where
    T: DeserializeOwned + JsonSchema + Send + Sync + 'static,
{
    async fn from_request<Context: ServerContext>(rqctx: &RequestContext<Context>) -> Result<Self, HttpError> {
        let bad = |message: String| HttpError::for_bad_request(Some(ErrorCode::INVALID_HEADER.to_string()), message);
        let schema = schemars::schema_for!(T);
        let names = schema.schema.object.as_ref().map(|o| o.properties.keys().cloned().collect()).unwrap_or(Vec::new());
        let mut found = serde_json::Map::new();
        for name in names {
            let mut values = rqctx.request.headers().get_all(name.as_str()).iter();
            let Some(value) = values.next() else { continue };
            if values.next().is_some() {
                return Err(bad(format!("header `{name}` must be given once")));
            }
            let value = value.to_str().map_err(|_| bad(format!("header `{name}` must be visible ASCII text")))?;
            found.insert(name, serde_json::Value::String(value.to_string()));
        }
        serde_json::from_value(serde_json::Value::Object(found)).map(Headers).map_err(|e| bad(format!("headers: {e}")))
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <dropshot::Header<T> as SharedExtractor>::metadata(body_content_type)
    }
}

/// An operation's query parameters, as `dropshot::Query<T>` reads (and
/// documents) them, but an error names the parameter it is about
/// (`limit: invalid digit found in string`).
pub struct Query<T>(T);

impl<T> Query<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

#[async_trait]
impl<T> SharedExtractor for Query<T>
where
    T: DeserializeOwned + JsonSchema + Send + Sync + 'static,
{
    async fn from_request<Context: ServerContext>(rqctx: &RequestContext<Context>) -> Result<Self, HttpError> {
        parse_query(rqctx.request.uri().query().unwrap_or("")).map(Query)
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <dropshot::Query<T> as SharedExtractor>::metadata(body_content_type)
    }
}

/// What `dropshot::Query` does (`serde_urlencoded`), with the path of the
/// error kept.
fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, HttpError> {
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path != "." { format!("{path}: {inner}") } else { inner.to_string() };
        let message = clip_message(format!("invalid query string: {message}"));
        HttpError::for_bad_request(Some(ErrorCode::INVALID_QUERY.to_string()), message)
    })
}

/// Gives dropshot's extractor errors (which carry no code) a stable one,
/// and clips their messages (which may quote what the client sent) as
/// [`ApiError`](crate::ApiError)'s are.
pub(crate) fn coded(mut error: HttpError, bad_request_code: &str) -> HttpError {
    error.external_message = clip_message(error.external_message);
    error.internal_message = clip_message(error.internal_message);
    if error.error_code.is_none() {
        let code = match error.status_code.as_u16() {
            400 => bad_request_code,
            _ => code_for_status(error.status_code),
        };
        error.error_code = Some(code.to_string());
    }
    error
}

/// The absent part of an [`Input`]: extracts nothing, documents nothing.
pub struct Nothing;

#[async_trait]
impl SharedExtractor for Nothing {
    async fn from_request<Context: ServerContext>(_rqctx: &RequestContext<Context>) -> Result<Self, HttpError> {
        Ok(Nothing)
    }

    fn metadata(_body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        ExtractorMetadata { extension_mode: ExtensionMode::None, parameters: Vec::new() }
    }
}

/// A required JSON body. Like `dropshot::TypedBody<T>` (whose OpenAPI
/// metadata it uses), but a parse error names the field it is about
/// (`label: invalid type: null, expected a string`) and carries the code
/// `invalid_<field>`, so a client can tell which input to fix.
///
/// It keeps the body's bytes, for [`JsonBody::into_parts`]: only a `PATCH`
/// asks which fields were sent, so only a `PATCH` reads them for it.
pub struct JsonBody<T>(T, UntypedBody);

impl<T> JsonBody<T> {
    pub fn into_inner(self) -> T {
        self.0
    }

    /// The body and which of its fields the client sent (for `PATCH`).
    pub fn into_parts(self) -> (T, BodyFields) {
        (self.0, BodyFields::of(self.1.as_bytes()))
    }
}

/// Reads a request field the spec makes optional and not nullable (the
/// generator marks each, see `xtask/src/not_null.rs`): absent is `None`
/// (with `#[serde(default)]`), a value is read as `T`, and `null` is refused
/// with the field named, rather than read as if the field were left out.
pub fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    match <Option<T> as serde::Deserialize>::deserialize(deserializer)? {
        Some(value) => Ok(Some(value)),
        None => Err(serde::de::Error::custom("must not be null; leave the field out instead")),
    }
}

/// The top-level fields a request body had. A `PATCH` merges: an absent
/// field is unchanged, `null` clears it, a value replaces it; the generated
/// types cannot tell absent from `null` (both are `None`), this can.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BodyFields {
    present: std::collections::BTreeSet<String>,
    null: std::collections::BTreeSet<String>,
}

impl BodyFields {
    fn of(bytes: &[u8]) -> BodyFields {
        // Only the top level's names and nulls: each value is skipped, not
        // built.
        type TopLevel = std::collections::BTreeMap<String, Option<serde::de::IgnoredAny>>;
        let mut fields = BodyFields::default();
        if let Ok(map) = serde_json::from_slice::<TopLevel>(bytes) {
            for (k, v) in map {
                if v.is_none() {
                    fields.null.insert(k.clone());
                }
                fields.present.insert(k);
            }
        }
        fields
    }

    /// Whether the body had this field (with any value, `null` included).
    pub fn has(&self, field: &str) -> bool {
        self.present.contains(field)
    }

    /// Whether the body set this field to `null`.
    pub fn is_null(&self, field: &str) -> bool {
        self.null.contains(field)
    }
}

#[async_trait]
impl<T> ExclusiveExtractor for JsonBody<T>
where
    T: DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static,
{
    async fn from_request<Context: ServerContext>(
        rqctx: &RequestContext<Context>,
        request: hyper::Request<dropshot::Body>,
    ) -> Result<Self, HttpError> {
        check_json_content_type(&request)?;
        let raw = read_body(rqctx, request).await?;
        let value = parse_json(raw.as_bytes())?;
        Ok(JsonBody(value, raw))
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <TypedBody<T> as ExclusiveExtractor>::metadata(body_content_type)
    }
}

/// Reads the whole body. Over the server's limit is a 413: dropshot's own
/// extractors answer 400 there, so the declared length is checked first and
/// dropshot's streaming check (for bodies without one) is mapped.
///
/// A body that stops coming is a 408 once no byte of it came for the
/// context's idle timeout ([`BODY_IDLE_TIMEOUT`]), and the connection is
/// closed: hyper bounds the wait for a request's headers, but nothing
/// bounded the wait for its body, so a client could hold a connection and
/// its task for as long as it liked.
async fn read_body<Context: ServerContext>(
    rqctx: &RequestContext<Context>,
    request: hyper::Request<dropshot::Body>,
) -> Result<UntypedBody, HttpError> {
    let idle = api_context(rqctx)?.body_idle_timeout;
    let stalled = Arc::new(AtomicBool::new(false));
    let request = if request.body().is_end_stream() {
        request
    } else {
        let stalled = stalled.clone();
        request.map(|body| dropshot::Body::wrap(IdleBody::new(body, idle, stalled)))
    };
    read_whole_body(rqctx, request).await.map_err(|e| {
        if stalled.load(Ordering::Relaxed) {
            let mut e = HttpError::for_client_error(
                Some(ErrorCode::REQUEST_TIMEOUT.to_string()),
                dropshot::ClientErrorStatusCode::REQUEST_TIMEOUT,
                format!("no byte of the request body came for {} s", idle.as_secs_f64()),
            );
            // The rest of the body, if it ever comes, is not read: the
            // connection cannot carry another request.
            let _ = e.add_header(http::header::CONNECTION, "close");
            e
        } else {
            e
        }
    })
}

/// A request body that fails once no frame of it came for `idle`, and says
/// so in `stalled`.
///
/// The timer is made and set only when the next frame is not there yet: a
/// body that came whole with its headers (most do) never has one.
struct IdleBody {
    inner: dropshot::Body,
    idle: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
    stalled: Arc<AtomicBool>,
}

impl IdleBody {
    fn new(inner: dropshot::Body, idle: Duration, stalled: Arc<AtomicBool>) -> IdleBody {
        IdleBody { inner, idle, sleep: None, armed: false, stalled }
    }
}

impl http_body::Body for IdleBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.armed = false;
                Poll::Ready(frame)
            }
            Poll::Pending => {
                if !this.armed {
                    this.armed = true;
                    let deadline = tokio::time::Instant::now() + this.idle;
                    match &mut this.sleep {
                        Some(sleep) => sleep.as_mut().reset(deadline),
                        None => this.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                let Some(sleep) = this.sleep.as_mut() else { unreachable!("armed above") };
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.stalled.store(true, Ordering::Relaxed);
                        Poll::Ready(Some(Err("the request body stopped coming".into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

async fn read_whole_body<Context: ServerContext>(
    rqctx: &RequestContext<Context>,
    request: hyper::Request<dropshot::Body>,
) -> Result<UntypedBody, HttpError> {
    let max = rqctx.request_body_max_bytes();
    let too_large = || {
        HttpError::for_client_error(
            Some(ErrorCode::BODY_TOO_LARGE.to_string()),
            dropshot::ClientErrorStatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than the limit of {max} bytes"),
        )
    };
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|&n| n > max as u64) {
        drain(request.into_body(), declared).await;
        return Err(too_large());
    }
    UntypedBody::from_request(rqctx, request).await.map_err(|e| {
        if e.external_message.starts_with("request body exceeded maximum size") {
            too_large()
        } else {
            e
        }
    })
}

/// The most of a body declared over the limit that is read, and dropped,
/// before the 413 is answered.
const DRAIN: u64 = 8 << 20;

/// Reads and drops a body declared over the limit, when it is not over by
/// much ([`DRAIN`]). A 413 answered while the client still sends the body,
/// and the connection then closed on the rest, reaches the client as a
/// reset, or a broken pipe as it writes, not as the 413. Each part comes
/// within the idle timeout (the body is read through it), or the read ends.
async fn drain(body: dropshot::Body, declared: u64) {
    if declared > DRAIN {
        return;
    }
    let mut body = std::pin::pin!(body);
    let mut read = 0;
    while let Some(Ok(frame)) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        read += frame.data_ref().map_or(0, |data| data.len() as u64);
        if read > declared {
            break;
        }
    }
}

/// A body that is not JSON is refused; no `content-type` at all is read as
/// JSON (what most clients mean).
fn check_json_content_type(request: &hyper::Request<dropshot::Body>) -> Result<(), HttpError> {
    let Some(value) = request.headers().get(http::header::CONTENT_TYPE) else {
        return Ok(());
    };
    let mime = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || mime.ends_with("+json") {
        return Ok(());
    }
    // Bad input, so 400 (DESIGN §2 uses no other status for it).
    Err(HttpError::for_bad_request(
        Some(ErrorCode::UNSUPPORTED_MEDIA_TYPE.to_string()),
        format!("request bodies are JSON: send `content-type: application/json`, not `{mime}`"),
    ))
}

/// serde's message without the value it quotes (`invalid type: string
/// "sk-…", expected a map` → `invalid type: string, expected a map`): a
/// misshapen value may be a secret (credentials, a header value, a webhook
/// secret), and the message is both answered and logged.
fn without_value(text: &str) -> String {
    // typify's refusal names only the pattern; the spec's are also said in
    // words.
    // (serde_json puts where it was after it.)
    if let Some((pattern, at)) = text.strip_prefix("doesn't match pattern \"").and_then(|rest| rest.split_once('"')) {
        if let Some((_, words)) = PATTERN_WORDS.iter().find(|(p, _)| *p == pattern) {
            return format!("must be {words} (the pattern {pattern}){at}");
        }
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        // The last `, expected`: the quoted value may hold one too.
        if let Some((unexpected, expected)) = text.strip_prefix(prefix).and_then(|rest| rest.rsplit_once(", expected "))
        {
            let kind = unexpected.split(['`', '"']).next().unwrap_or("").trim_end();
            // An integer past 64 bits is read as a float (`1e+20`): it was
            // a whole number, too large, not a float where one is refused.
            let too_large = kind == "floating point"
                && unexpected
                    .split('`')
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v.fract() == 0.0 && v.abs() >= 9.2e18);
            if too_large {
                return format!("number out of range, expected {expected}");
            }
            return format!("{prefix}{kind}, expected {expected}");
        }
    }
    text.to_string()
}

/// Each `pattern` of the spec, in words, for the message of a value that
/// does not match it (a test holds every pattern of the spec to have its
/// words here).
const PATTERN_WORDS: &[(&str, &str)] = &[
    (r"^\+[1-9][0-9]{1,14}$", "an E.164 number: `+`, then 2 to 15 digits, the first not 0"),
    (r"^[\x20-\x7E\t]*$", "visible ASCII, spaces and tabs (no line breaks)"),
];

fn parse_json<T: DeserializeOwned + JsonSchema + 'static>(bytes: &[u8]) -> Result<T, HttpError> {
    // Every request body of the API is an object; serde would otherwise
    // also accept a struct written as an array (`["ci"]`).
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        return Err(HttpError::for_bad_request(
            Some(ErrorCode::INVALID_BODY.to_string()),
            "invalid JSON body: the body starts with a byte order mark (EF BB BF), which JSON text must not \
             (RFC 8259, section 8.1); send the object without it"
                .to_string(),
        ));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(HttpError::for_bad_request(
            Some(ErrorCode::INVALID_BODY.to_string()),
            "invalid JSON body: the body must be a JSON object".to_string(),
        ));
    }
    // Tracking the path costs as much as the parse (7 % of a `POST
    // /v1/tests`'s instructions, callgrind, BENCHMARKS.md) and only an error
    // needs it: a body is parsed without it first, and a refused one again
    // with it, which refuses it the same way (the wrapper changes nothing
    // else), to say where.
    if let Ok(value) = serde_json::from_slice(bytes) {
        // serde reads a struct from an array of its fields' values too
        // (`"settings": [60, 4]`); only a body with an array can hold one.
        // The full check parses the body again and walks the schema (5.1 µs
        // for the benchmark's `POST /v1/tests` body, whose parse is 1.5); a
        // pass over the body against the type's shape, compiled once,
        // answers for nearly every body (1.1 µs), and leaves to it only one
        // it finds an array in where an object goes, or cannot be sure of.
        if bytes.contains(&b'[') && !arrays_fit::<T>(bytes) {
            objects_as_objects(schema_of::<T>(), bytes)?;
        }
        return Ok(value);
    }
    // A body that is not JSON (cut short, a stray character, trailing
    // characters) is the body's fault, not a field's: read as `T`, serde
    // would blame the field it was reading when the text ended (`{"name": `
    // is `invalid_name`), or one it found missing before it reached what
    // follows the object (`{} x` is `invalid_label`). Too deep a value, or a
    // number out of range, is JSON all the same: the field that holds it is
    // named below.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
        let text = e.to_string();
        if !text.starts_with("recursion limit exceeded") && !text.starts_with("number out of range") {
            return Err(HttpError::for_bad_request(
                Some(ErrorCode::INVALID_BODY.to_string()),
                format!("invalid JSON body: not JSON: {text}"),
            ));
        }
    }
    // An object given as an array is named as such, not by what serde
    // makes of the array (`[]` for an evaluator is "missing field `type`").
    objects_as_objects(schema_of::<T>(), bytes)?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().clone();
        let inner = e.into_inner();
        // The field the error is about: the one serde reports missing, or
        // the declared one where it happened.
        let text = without_value(&inner.to_string());
        let missing = text.strip_prefix("missing field `").and_then(|rest| rest.split('`').next()).map(str::to_string);
        let unknown = text.starts_with("unknown field");
        let inside = if unknown || missing.is_some() { None } else { field_inside::<T>(bytes, &path) };
        // What was found failing inside a variant says why itself.
        let text = match &inside {
            Some((_, why)) => without_value(why),
            None => text,
        };
        let inside = inside.map(|(key, _)| key);
        let field = if unknown {
            // The field is not ours to name a code after.
            None
        } else if missing.is_some() {
            missing
        } else if inside.is_some() {
            inside.clone()
        } else {
            declared_field(schema_of::<T>(), &path)
        };
        let code = match &field {
            Some(f)
                if !f.is_empty()
                    && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !f.chars().all(|c| c.is_ascii_digit()) =>
            {
                format!("invalid_{f}")
            }
            _ => ErrorCode::INVALID_BODY.to_string(),
        };
        let path = match &inside {
            Some(key) => format!("{path}.{key}"),
            None => path.to_string(),
        };
        let message = if path != "." { format!("{path}: {text}") } else { text };
        HttpError::for_bad_request(Some(code), format!("invalid JSON body: {message}"))
    })?;
    // Not reached in practice: `from_slice` above refused this body, and
    // the read with its path refuses the same bodies. Nor is a check for
    // trailing characters needed: the body was refused as not JSON.
    Ok(value)
}

/// The schema of `T`, made once per type (a request's body is checked
/// against it).
fn schema_of<T: JsonSchema + 'static>() -> &'static RootSchema {
    type Kept = std::sync::Mutex<std::collections::HashMap<std::any::TypeId, &'static RootSchema>>;
    static KEPT: std::sync::OnceLock<Kept> = std::sync::OnceLock::new();
    let kept = KEPT.get_or_init(Default::default);
    let mut kept = kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    kept.entry(std::any::TypeId::of::<T>()).or_insert_with(|| Box::leak(Box::new(schemars::schema_for!(T))))
}

/// Refuses an array where the schema has an object with declared
/// properties: serde's derived structs (and tagged enums) read one from an
/// array of their fields' values in order, so `"settings": [60, 4]` or
/// `"voice": ["tts", "v1", 1.0]` would be taken as the object. A body that
/// is not JSON is left to the caller.
fn objects_as_objects(root: &RootSchema, bytes: &[u8]) -> Result<(), HttpError> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(()) };
    let mut path = Vec::new();
    match shape(root, &[&root.schema], &value, &mut path) {
        Ok(()) => Ok(()),
        Err(()) => {
            let field = path.iter().rev().find_map(|p| p.strip_prefix('.')).unwrap_or("body").to_string();
            let code = if path.is_empty() { ErrorCode::INVALID_BODY.to_string() } else { format!("invalid_{field}") };
            let at = path.concat();
            let at = at.strip_prefix('.').unwrap_or(&at);
            Err(HttpError::for_bad_request(
                Some(code),
                format!("invalid JSON body: {at}: invalid type: sequence, expected an object"),
            ))
        }
    }
}

/// Where a type's arrays may be, from its schema as [`shape`] reads it:
/// compiled once per type (and thread) for [`arrays_fit`].
#[derive(Debug, Default)]
struct Shape {
    /// An object with declared properties, never an array: an array here is
    /// serde reading the object from its fields' values.
    object_only: bool,
    /// The declared properties (of every alternative); any other key's
    /// value is the client's.
    properties: std::collections::HashMap<String, Shape>,
    /// An array's items, when they are described.
    items: Option<Box<Shape>>,
    /// Past the depth compiled (a schema that refers back to itself): left
    /// to the full check.
    deeper: bool,
}

/// How deep [`Shape`] is compiled; the API's bodies nest far less.
const SHAPE_DEPTH: usize = 12;

impl Shape {
    fn of(root: &RootSchema, here: &[&SchemaObject], depth: usize) -> Shape {
        if depth == SHAPE_DEPTH {
            return Shape { deeper: true, ..Shape::default() };
        }
        let alternatives = alternatives(root, here);
        let mut keys: Vec<&String> =
            alternatives.iter().filter_map(|s| s.object.as_ref()).flat_map(|o| o.properties.keys()).collect();
        keys.sort();
        keys.dedup();
        let properties = keys
            .into_iter()
            .filter_map(|key| {
                let next = property_schemas(&alternatives, key);
                (!next.is_empty()).then(|| (key.clone(), Shape::of(root, &next, depth + 1)))
            })
            .collect();
        let items = item_schemas(&alternatives);
        let items = (!items.is_empty()).then(|| Box::new(Shape::of(root, &items, depth + 1)));
        Shape { object_only: object_only(&alternatives), properties, items, deeper: false }
    }
}

/// Whether every array of `bytes` is where `T`'s schema lets one be, read
/// in one pass that keeps nothing of the body; `false` also when it cannot
/// tell (then [`objects_as_objects`] decides, and says where).
fn arrays_fit<T: JsonSchema + 'static>(bytes: &[u8]) -> bool {
    use std::rc::Rc;
    thread_local! {
        static SHAPES: std::cell::RefCell<std::collections::HashMap<std::any::TypeId, Rc<Shape>>> =
            Default::default();
    }
    let shape = SHAPES.with(|shapes| {
        let mut shapes = shapes.borrow_mut();
        shapes
            .entry(std::any::TypeId::of::<T>())
            .or_insert_with(|| {
                let root = schema_of::<T>();
                Rc::new(Shape::of(root, &[&root.schema], 0))
            })
            .clone()
    });
    let mut de = serde_json::Deserializer::from_slice(bytes);
    matches!(serde::de::DeserializeSeed::deserialize(Fits(Some(&shape)), &mut de), Ok(true))
}

/// A value read against its [`Shape`] (`None`: anything, not looked into).
struct Fits<'s>(Option<&'s Shape>);

impl<'de> serde::de::DeserializeSeed<'de> for Fits<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        match self.0 {
            None => d.deserialize_ignored_any(serde::de::IgnoredAny).map(|_| true),
            Some(_) => d.deserialize_any(self),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Fits<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(true)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let Some(shape) = self.0 else { return Ok(true) };
        if shape.deeper || shape.object_only {
            return Ok(false);
        }
        while let Some(fits) = seq.next_element_seed(Fits(shape.items.as_deref()))? {
            if !fits {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let Some(shape) = self.0 else { return Ok(true) };
        if shape.deeper {
            return Ok(false);
        }
        while let Some(next) = map.next_key_seed(Property(&shape.properties))? {
            if !map.next_value_seed(Fits(next))? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A key, read as the declared property's [`Shape`] (`None` when it
/// declares none).
struct Property<'s>(&'s std::collections::HashMap<String, Shape>);

impl<'de, 's> serde::de::DeserializeSeed<'de> for Property<'s> {
    type Value = Option<&'s Shape>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, 's> serde::de::Visitor<'de> for Property<'s> {
    type Value = Option<&'s Shape>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.get(key))
    }
}

/// Whether the alternatives describe an object with declared properties
/// and never an array: where an array is serde reading the object from its
/// fields' values.
fn object_only(alternatives: &[&SchemaObject]) -> bool {
    let object = alternatives.iter().any(|s| s.object.as_ref().is_some_and(|o| !o.properties.is_empty()));
    let array = alternatives.iter().any(|s| {
        s.array.is_some()
            || s.instance_type.as_ref().is_some_and(|t| t.contains(&schemars::schema::InstanceType::Array))
    });
    object && !array
}

/// What the alternatives say an array's items are.
fn item_schemas<'a>(alternatives: &[&'a SchemaObject]) -> Vec<&'a SchemaObject> {
    alternatives
        .iter()
        .filter_map(|s| match s.array.as_ref()?.items.as_ref()? {
            SingleOrVec::Single(items) => as_object(items),
            SingleOrVec::Vec(_) => None,
        })
        .collect()
}

/// What the alternatives say the property `key` is.
fn property_schemas<'a>(alternatives: &[&'a SchemaObject], key: &str) -> Vec<&'a SchemaObject> {
    alternatives.iter().filter_map(|s| s.object.as_ref()?.properties.get(key)).filter_map(as_object).collect()
}

/// [`objects_as_objects`] at `value`, which `here` describes; on `Err`,
/// `path` holds where (`.steps`, `[0]`, …).
fn shape(
    root: &RootSchema,
    here: &[&SchemaObject],
    value: &serde_json::Value,
    path: &mut Vec<String>,
) -> Result<(), ()> {
    let alternatives = alternatives(root, here);
    match value {
        serde_json::Value::Array(items) => {
            if object_only(&alternatives) {
                return Err(());
            }
            let items_schemas = item_schemas(&alternatives);
            if items_schemas.is_empty() {
                return Ok(());
            }
            for (i, item) in items.iter().enumerate() {
                shape(root, &items_schemas, item, path).map_err(|()| path.insert(0, format!("[{i}]")))?;
            }
        }
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                let next = property_schemas(&alternatives, key);
                // A free-form object's keys are the client's.
                if !next.is_empty() {
                    shape(root, &next, v, path).map_err(|()| path.insert(0, format!(".{key}")))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The field of an internally tagged variant (an evaluator) that the error
/// at `path` is about. serde reads such a variant's fields from a copy of
/// them, so the path of an error inside one ends at the variant
/// (`evaluators[3]`), whatever field failed. Leaving out one field at a
/// time finds it: serde reads the fields in order and reports the first
/// that fails (a required one left out only once all were read), so the
/// error changes only when that one is left out. The tag is never left
/// out. The variant's fields are read in the order of their names here
/// (`serde_json::Map`'s), so the field and its error are both given: the
/// first of the field's errors in that order. `None` when `path` is not at
/// such a variant, or no field is found.
fn field_inside<T: DeserializeOwned + JsonSchema + 'static>(
    bytes: &[u8],
    path: &serde_path_to_error::Path,
) -> Option<(String, String)> {
    use serde_path_to_error::Segment;
    let whole: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let at = |mut v: &serde_json::Value| -> Option<serde_json::Value> {
        for segment in path {
            v = match segment {
                Segment::Seq { index } => v.get(*index)?,
                Segment::Map { key } => v.get(key)?,
                _ => return None,
            };
        }
        Some(v.clone())
    };
    let serde_json::Value::Object(variant) = at(&whole)? else { return None };
    let root = schema_of::<T>();
    let schemas = alternatives(root, &schemas_at(root, path)?);
    let declared = |key: &str| -> Vec<&SchemaObject> {
        schemas.iter().filter_map(|s| s.object.as_ref()?.properties.get(key)).filter_map(as_object).collect()
    };
    // A tag is a property whose value is one word.
    let is_tag = |key: &str| {
        let d = declared(key);
        !d.is_empty() && d.iter().all(|s| s.enum_values.as_ref().is_some_and(|e| e.len() == 1))
    };
    if !variant.keys().any(|k| is_tag(k)) {
        return None;
    }
    let error_of = |value: serde_json::Value| {
        serde_path_to_error::deserialize::<_, T>(value)
            .err()
            .map(|e| (e.path().to_string(), e.into_inner().to_string()))
    };
    // Read so, the body may fail first elsewhere: then nothing is said.
    let first = error_of(whole.clone()).filter(|(at, _)| *at == path.to_string())?;
    for key in variant.keys().filter(|k| !is_tag(k) && !declared(k).is_empty()) {
        let mut without = whole.clone();
        let mut v = &mut without;
        for segment in path {
            v = match segment {
                Segment::Seq { index } => v.get_mut(*index)?,
                Segment::Map { key } => v.get_mut(key)?,
                _ => return None,
            };
        }
        v.as_object_mut()?.remove(key);
        if error_of(without).as_ref() != Some(&first) {
            return Some((key.clone(), first.1));
        }
    }
    None
}

/// The schemas of the value at `path` (before their alternatives are
/// followed); `None` when the path leaves what the schema declares.
fn schemas_at<'a>(root: &'a RootSchema, path: &serde_path_to_error::Path) -> Option<Vec<&'a SchemaObject>> {
    use serde_path_to_error::Segment;
    let mut here = vec![&root.schema];
    for segment in path {
        here = match segment {
            Segment::Seq { .. } => alternatives(root, &here)
                .into_iter()
                .filter_map(|s| match s.array.as_ref()?.items.as_ref()? {
                    SingleOrVec::Single(items) => Some(items.as_ref()),
                    SingleOrVec::Vec(_) => None,
                })
                .filter_map(as_object)
                .collect(),
            Segment::Map { key } | Segment::Enum { variant: key } => alternatives(root, &here)
                .into_iter()
                .filter_map(|s| s.object.as_ref()?.properties.get(key))
                .filter_map(as_object)
                .collect(),
            Segment::Unknown => return None,
        };
        if here.is_empty() {
            return None;
        }
    }
    Some(here)
}

/// The property of the body's schema that the error at `path` is about,
/// for its code: the innermost one declared (`steps[2].expect[0]` →
/// `expect`). A free-form object's keys are the client's, not the schema's,
/// so a path that goes on into one (`metadata.n`, `headers.Authorization`)
/// stops at the property that holds it (`metadata`, `headers`). `None` when
/// the path names no declared property.
fn declared_field(root: &RootSchema, path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut here = vec![&root.schema];
    let mut field = None;
    for segment in path {
        let key = match segment {
            Segment::Seq { .. } => {
                here = alternatives(root, &here)
                    .into_iter()
                    .filter_map(|s| match s.array.as_ref()?.items.as_ref()? {
                        SingleOrVec::Single(items) => Some(items.as_ref()),
                        SingleOrVec::Vec(_) => None,
                    })
                    .filter_map(as_object)
                    .collect();
                continue;
            }
            Segment::Map { key } => key,
            Segment::Enum { variant } => variant,
            Segment::Unknown => break,
        };
        let next: Vec<&SchemaObject> = alternatives(root, &here)
            .into_iter()
            .filter_map(|s| s.object.as_ref()?.properties.get(key))
            .filter_map(as_object)
            .collect();
        if next.is_empty() {
            // A key of a free-form object (or of nothing the schema knows).
            break;
        }
        field = Some(key.clone());
        here = next;
    }
    field
}

fn as_object(schema: &Schema) -> Option<&SchemaObject> {
    match schema {
        Schema::Object(o) => Some(o),
        // `true` (any JSON value) declares no properties.
        Schema::Bool(_) => None,
    }
}

/// The schemas a value described by `schemas` may match: each of them, what
/// it refers to, and its `allOf`/`anyOf`/`oneOf` parts (an `Option`, a tagged
/// enum's variants), followed to any depth.
fn alternatives<'a>(root: &'a RootSchema, schemas: &[&'a SchemaObject]) -> Vec<&'a SchemaObject> {
    let mut out = Vec::new();
    let mut todo = schemas.to_vec();
    // Bounded, in case a schema refers back to itself.
    while let Some(s) = todo.pop().filter(|_| out.len() < 256) {
        out.push(s);
        if let Some(name) = s.reference.as_deref().and_then(|r| r.strip_prefix("#/definitions/")) {
            todo.extend(root.definitions.get(name).and_then(as_object));
        }
        if let Some(sub) = &s.subschemas {
            for list in [&sub.all_of, &sub.any_of, &sub.one_of].into_iter().flatten() {
                todo.extend(list.iter().filter_map(as_object));
            }
        }
    }
    out
}

/// A JSON body the client may omit (`requestBody.required: false`): an empty
/// (or whitespace) body is `None`, whatever its `content-type`; anything else
/// must be JSON and parse as `T`.
///
/// dropshot has no optional typed body; this documents itself as
/// `TypedBody<T>` would (dropshot marks every body required, which the drift
/// check's normalization records).
pub struct OptionalJsonBody<T>(Option<T>);

impl<T> OptionalJsonBody<T> {
    pub fn into_inner(self) -> Option<T> {
        self.0
    }
}

#[async_trait]
impl<T> ExclusiveExtractor for OptionalJsonBody<T>
where
    T: DeserializeOwned + schemars::JsonSchema + Send + Sync + 'static,
{
    async fn from_request<Context: ServerContext>(
        rqctx: &RequestContext<Context>,
        request: hyper::Request<dropshot::Body>,
    ) -> Result<Self, HttpError> {
        // An empty body is no body, whatever it is labelled: `curl -d ''`
        // sends one as `application/x-www-form-urlencoded`.
        let content_type = check_json_content_type(&request);
        let raw = read_body(rqctx, request).await?;
        let bytes = raw.as_bytes();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        content_type?;
        parse_json(bytes).map(|v| OptionalJsonBody(Some(v)))
    }

    fn metadata(body_content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <TypedBody<T> as ExclusiveExtractor>::metadata(body_content_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{params, types};

    /// The code and message `parse_json` refuses `body` with.
    fn refused<T: DeserializeOwned + JsonSchema + 'static>(body: &str) -> (String, String) {
        let e = parse_json::<T>(body.as_bytes()).err().unwrap_or_else(|| panic!("accepted: {body}"));
        (e.error_code.unwrap_or_default(), e.external_message)
    }

    /// `{"a": {"a": … 1}}`, `levels` objects deep.
    fn nested(levels: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels))
    }

    #[test]
    fn a_code_never_names_a_key_the_client_chose() {
        for (code, message, (got_code, got_message)) in [
            (
                "invalid_headers",
                "headers.Authorization: invalid type: integer, expected a string",
                refused::<types::UpdateChannelRequest>(r#"{"headers": {"Authorization": 5}}"#),
            ),
            ("invalid_metadata", "metadata.n: ", refused::<types::RunBatchRequest>(r#"{"metadata": {"n": 1e400}}"#)),
            (
                "invalid_metadata",
                "metadata.a.a",
                refused::<types::RunBatchRequest>(&format!(r#"{{"metadata": {}}}"#, nested(200))),
            ),
            (
                "invalid_config",
                "config.x.a",
                refused::<types::UpdateIntegrationRequest>(&format!(r#"{{"config": {{"x": {}}}}}"#, nested(200))),
            ),
            (
                "invalid_credentials",
                "credentials.api_key: ",
                refused::<types::UpdateIntegrationRequest>(r#"{"credentials": {"api_key": 1e400}}"#),
            ),
            // A free-form object inside a list inside a tagged variant.
            (
                "invalid_arguments",
                "evaluators[0].arguments.a",
                refused::<types::CreateTestRequest>(&format!(
                    r#"{{"evaluators": [{{"type": "tool_called", "name": "t", "tool": "t", "arguments": {}}}]}}"#,
                    nested(200)
                )),
            ),
            // A key that happens to be a declared name elsewhere is still the
            // client's.
            (
                "invalid_metadata",
                "metadata.name: ",
                refused::<types::RunBatchRequest>(r#"{"metadata": {"name": 1e400}}"#),
            ),
        ] {
            assert_eq!(got_code, code, "{got_message}");
            assert!(got_message.contains(message), "{got_message} names {message:?}");
        }
    }

    #[test]
    fn a_code_names_the_innermost_declared_property() {
        for (code, message, (got_code, got_message)) in [
            ("invalid_name", "name: ", refused::<types::UpdateChannelRequest>(r#"{"name": 5}"#)),
            ("invalid_metadata", "metadata: ", refused::<types::RunBatchRequest>(r#"{"metadata": 5}"#)),
            (
                "invalid_say",
                "steps[0].say: ",
                refused::<types::CreateScenarioRequest>(r#"{"steps": [{"say": 5, "expect": []}]}"#),
            ),
            (
                "invalid_type",
                "steps[0].expect[0].type: ",
                refused::<types::CreateScenarioRequest>(r#"{"steps": [{"say": "hi", "expect": [{"type": 5}]}]}"#),
            ),
            // serde reads a tagged variant's fields from a copy, where the
            // path ends at the variant: the field is found all the same.
            (
                "invalid_text",
                "steps[0].expect[0].text: ",
                refused::<types::CreateScenarioRequest>(
                    r#"{"steps": [{"say": "hi", "expect": [{"type": "contains", "name": "n", "text": 5}]}]}"#,
                ),
            ),
            // What serde reports missing is a declared field.
            ("invalid_mode", "missing field `mode`", refused::<types::CreateScenarioRequest>("{}")),
        ] {
            assert_eq!(got_code, code, "{got_message}");
            assert!(got_message.contains(message), "{got_message} names {message:?}");
        }
    }

    #[test]
    fn a_body_is_taken_whole_or_refused() {
        let body = r#"{"name": "n", "headers": {"X-K": "v"}, "turn_timeout_ms": 900}"#;
        let taken: types::UpdateChannelRequest = parse_json(body.as_bytes()).unwrap();
        assert_eq!(taken.name.as_deref().map(String::as_str), Some("n"));
        assert_eq!(taken.headers.unwrap().get("X-K").map(|v| v.as_str()), Some("v"));
        assert_eq!(taken.turn_timeout_ms, Some(900));
        for (bad, says) in [
            (format!("{body} {{}}"), "trailing characters"),
            (format!("{body}x"), "trailing characters"),
            (r#"{"name": 5}"#.to_string(), "name: invalid type"),
            ("[]".to_string(), "must be a JSON object"),
            // Past 64 bits serde_json reads a float: said as what it was.
            (
                r#"{"turn_timeout_ms": 99999999999999999999}"#.to_string(),
                "turn_timeout_ms: number out of range, expected",
            ),
            (r#"{"turn_timeout_ms": -1e20}"#.to_string(), "turn_timeout_ms: number out of range, expected"),
            (r#"{"turn_timeout_ms": 1.5}"#.to_string(), "turn_timeout_ms: invalid type: floating point, expected"),
        ] {
            let (code, message) = refused::<types::UpdateChannelRequest>(&bad);
            assert!(code.starts_with("invalid_"), "{bad}: {code}");
            assert!(message.contains(says), "{bad}: {message}");
        }
    }

    /// Text that is not JSON is the body's fault, whichever field serde was
    /// reading when it went wrong, or found missing before it got there.
    #[test]
    fn a_body_that_is_not_json_blames_no_field() {
        for (bad, says) in [
            (r#"{"label": "#, "EOF while parsing"),
            (r#"{"label": "ci""#, "EOF while parsing"),
            (r#"{"label": "ci" x}"#, "expected `,` or `}`"),
            ("{} x", "trailing characters"),
            (r#"{"label": 5 x"#, "expected `,` or `}`"),
            // Some editors and encoders put one before the text.
            ("\u{FEFF}{\"label\": \"ci\"}", "starts with a byte order mark"),
        ] {
            let (code, message) = refused::<types::CreateApiKeyRequest>(bad);
            assert_eq!(code, ErrorCode::INVALID_BODY, "{bad}: {message}");
            assert!(message.contains(says), "{bad}: {message}");
        }
        // Too deep, or a number out of range, is JSON: its field is named.
        let (code, message) = refused::<types::CreateApiKeyRequest>(r#"{"label": 1e400}"#);
        assert_eq!(code, "invalid_label", "{message}");
    }

    /// serde's derived structs take an array of their fields' values for the
    /// object; the schema has no such form, so each is refused, at any depth.
    #[test]
    fn an_object_written_as_an_array_is_refused_where_it_is() {
        for (code, message, (got_code, got_message)) in [
            (
                "invalid_settings",
                "settings: invalid type: sequence",
                refused::<types::CreateProjectRequest>(r#"{"name": "n", "settings": [60, 4]}"#),
            ),
            (
                "invalid_voice",
                "voice: invalid type: sequence",
                refused::<types::UpdatePersonaRequest>(r#"{"voice": ["tts", "v1", 1.0]}"#),
            ),
            (
                "invalid_steps",
                "steps[1]: invalid type: sequence",
                refused::<types::CreateScenarioRequest>(
                    r#"{"project_id": "p", "name": "n", "mode": "scripted", "steps": [{"say": "a", "expect": []}, ["b", []]]}"#,
                ),
            ),
            (
                "invalid_expect",
                "steps[0].expect[0]: invalid type: sequence",
                refused::<types::CreateScenarioRequest>(
                    r#"{"project_id": "p", "name": "n", "mode": "scripted", "steps": [{"say": "a", "expect": [[]]}]}"#,
                ),
            ),
            (
                "invalid_phone_numbers",
                "phone_numbers[0]: invalid type: sequence",
                refused::<types::UpdateIntegrationRequest>(r#"{"phone_numbers": [["+14155550100", "l", "both"]]}"#),
            ),
        ] {
            assert_eq!(got_code, code, "{got_message}");
            assert!(got_message.contains(message), "{got_message} names {message:?}");
        }
        // Arrays where the schema has them, and inside free-form objects,
        // are taken.
        let taken: types::RunBatchRequest = parse_json(br#"{"metadata": {"a": [[1], {"b": []}]}}"#).unwrap();
        assert_eq!(taken.metadata.len(), 1);
        let taken: types::CreateTestRequest = parse_json(
            br#"{"project_id": "p", "name": "n", "channel_id": "c", "scenario_id": "s", "persona_ids": ["a"],
                 "evaluators": [{"type": "tool_called", "name": "t", "tool": "t", "arguments": {"x": [1]}}]}"#,
        )
        .unwrap();
        assert_eq!(taken.persona_ids.len(), 1);
    }

    /// The one pass over a body ([`arrays_fit`]) finds every array the full
    /// check refuses, and passes what it takes: so the full check runs only
    /// for a body it would refuse.
    #[test]
    fn the_quick_pass_over_arrays_agrees_with_the_full_check() {
        fn agrees<T: JsonSchema + 'static>(body: &str) -> bool {
            let full = objects_as_objects(schema_of::<T>(), body.as_bytes()).is_ok();
            assert_eq!(arrays_fit::<T>(body.as_bytes()), full, "{body}");
            full
        }
        let scenario =
            |steps: &str| format!(r#"{{"project_id": "p", "name": "n", "mode": "scripted", "steps": {steps}}}"#);
        let test = |evaluators: &str| {
            format!(
                r#"{{"project_id": "p", "name": "n", "channel_id": "c", "scenario_id": "s", "persona_ids": ["a"],
                     "tags": ["x", "y"], "evaluators": {evaluators}}}"#
            )
        };
        for (fits, body) in [
            (false, scenario(r#"[{"say": "a", "expect": []}, ["b", []]]"#)),
            (false, scenario(r#"[{"say": "a", "expect": [[]]}]"#)),
            (false, scenario(r#"[{"say": "a", "expect": [{"type": "contains", "name": "n", "text": "t"}, []]}]"#)),
            (true, scenario(r#"[{"say": "a", "expect": [{"type": "contains", "name": "n", "text": "t"}]}]"#)),
            (true, scenario("[]")),
        ] {
            assert_eq!(agrees::<types::CreateScenarioRequest>(&body), fits, "{body}");
        }
        for (fits, body) in [
            (
                true,
                test(
                    r#"[{"type": "contains", "name": "c", "text": "t"}, {"type": "tool_called", "name": "t", "tool": "t", "arguments": {"x": [1, [2]]}}]"#,
                ),
            ),
            (true, test("[]")),
            (false, test(r#"[["contains", "c", "t"]]"#)),
            (false, test(r#"[{"type": "contains", "name": "c", "text": "t"}, []]"#)),
        ] {
            assert_eq!(agrees::<types::CreateTestRequest>(&body), fits, "{body}");
        }
        for (fits, body) in [
            (false, r#"{"name": "n", "settings": [60, 4]}"#),
            (true, r#"{"name": "n", "settings": {"max_concurrency": 4}, "tags": []}"#),
            (true, r#"{"name": "n\"[", "webhook_url": "https://x/[a]"}"#),
        ] {
            assert_eq!(agrees::<types::CreateProjectRequest>(body), fits, "{body}");
        }
        assert!(!agrees::<types::UpdatePersonaRequest>(r#"{"voice": ["tts", "v1", 1.0]}"#));
        assert!(!agrees::<types::UpdateIntegrationRequest>(r#"{"phone_numbers": [["+14155550100", "l", "both"]]}"#));
        assert!(agrees::<types::RunBatchRequest>(r#"{"metadata": {"a": [[1], {"b": []}]}}"#));
    }

    /// Inside an evaluator (a tagged variant, which serde reads from a copy
    /// of its fields), an error names the field, whichever it is and
    /// wherever it is in the object.
    #[test]
    fn an_error_inside_an_evaluator_names_its_field() {
        let test = |evaluator: &str| {
            format!(
                r#"{{"project_id": "p", "name": "n", "channel_id": "c", "scenario_id": "s",
                     "evaluators": [{{"type": "contains", "name": "ok", "text": "t"}}, {evaluator}]}}"#
            )
        };
        for (evaluator, code, message) in [
            (
                r#"{"type": "max_latency_ms", "name": "l", "percentile": "p90", "ms": 0}"#,
                "invalid_ms",
                "evaluators[1].ms: ",
            ),
            (
                r#"{"ms": "5", "name": "l", "percentile": "p90", "type": "max_latency_ms"}"#,
                "invalid_ms",
                "evaluators[1].ms: ",
            ),
            (
                r#"{"type": "max_latency_ms", "name": "l", "percentile": "p99", "ms": 5}"#,
                "invalid_percentile",
                "evaluators[1].percentile: ",
            ),
            (r#"{"type": "contains", "name": 5, "text": "t"}"#, "invalid_name", "evaluators[1].name: "),
            (
                r#"{"type": "contains", "name": "c", "text": "t", "critical": null}"#,
                "invalid_critical",
                "evaluators[1].critical: ",
            ),
            (r#"{"type": "regex", "name": "r", "pattern": ""}"#, "invalid_pattern", "evaluators[1].pattern: "),
            (
                r#"{"type": "tool_called", "name": "t", "tool": "t", "arguments": []}"#,
                "invalid_arguments",
                "evaluators[1].arguments: ",
            ),
            // Of two fields that fail, one is named, with its own error.
            (
                r#"{"type": "max_turns", "turns": 0, "name": 5}"#,
                "invalid_name",
                "evaluators[1].name: invalid type: integer",
            ),
            // What was named before is named as before.
            (r#"{"type": "contains", "name": "c"}"#, "invalid_text", "missing field `text`"),
            (r#"{"type": "nope", "name": "c"}"#, "invalid_type", "evaluators[1].type: "),
        ] {
            let (got_code, got_message) = refused::<types::CreateTestRequest>(&test(evaluator));
            assert_eq!(got_code, code, "{evaluator}: {got_message}");
            assert!(got_message.contains(message), "{evaluator}: {got_message} names {message:?}");
        }
    }

    /// A value that does not match its pattern is told what it must be,
    /// in words, and every pattern of the spec has them.
    #[test]
    fn a_value_off_its_pattern_is_told_in_words() {
        let channel = |value: &str| {
            format!(
                r#"{{"project_id": "p", "name": "n", "kind": "http", "target": "https://a.example",
                     "headers": {{"X-Team": {value}}}}}"#
            )
        };
        let (code, message) = refused::<types::CreateChannelRequest>(&channel(r#""two\nlines""#));
        assert_eq!(code, "invalid_headers");
        assert!(
            message.contains("headers.X-Team: must be visible ASCII, spaces and tabs (no line breaks) (the pattern"),
            "{message}"
        );
        let (code, message) =
            refused::<types::PhoneNumber>(r#"{"direction": "both", "label": "", "number": "+04155550100"}"#);
        assert_eq!(code, "invalid_number");
        assert!(message.contains("number: must be an E.164 number"), "{message}");

        let spec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/openapi.json")).unwrap(),
        )
        .unwrap();
        fn patterns<'a>(v: &'a serde_json::Value, found: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(p) = m.get("pattern").and_then(|p| p.as_str()) {
                        found.push(p);
                    }
                    m.values().for_each(|v| patterns(v, found));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| patterns(v, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        patterns(&spec, &mut found);
        assert!(!found.is_empty());
        for pattern in found {
            assert!(PATTERN_WORDS.iter().any(|(p, _)| *p == pattern), "no words for the spec's pattern {pattern}");
        }
    }

    #[test]
    fn body_fields_are_the_top_level_names_and_nulls() {
        let fields = BodyFields::of(
            br#"{"name": "n", "description": null, "metadata": {"a": null, "b": [1, {"c": null}]}, "tags": [],
                "again": null, "again": 1}"#,
        );
        for name in ["name", "description", "metadata", "tags", "again"] {
            assert!(fields.has(name), "{name}");
        }
        assert!(fields.is_null("description"));
        for name in ["name", "metadata", "tags", "again", "a", "c"] {
            assert!(!fields.is_null(name), "{name}");
        }
        assert!(!fields.has("a") && !fields.has("b") && !fields.has("c"));
        assert_eq!(BodyFields::of(b"[null]"), BodyFields::default());
        assert_eq!(BodyFields::of(br#"{"a": null"#), BodyFields::default());
    }

    #[test]
    fn a_query_error_names_the_parameter() {
        let message = |query: &str| {
            let e = parse_query::<params::ListActivityQuery>(query).err().unwrap_or_else(|| panic!("accepted {query}"));
            assert_eq!(e.error_code.as_deref(), Some(ErrorCode::INVALID_QUERY), "{query}");
            e.external_message
        };
        assert_eq!(message("limit=abc"), "invalid query string: limit: invalid digit found in string");
        let both = "since=2026-11-24T12:00:00Z&until=2026-11-24T12:00:00";
        assert_eq!(message(both), "invalid query string: until: premature end of input");
        assert!(message("limit=1&limit=2").contains("duplicate field `limit`"), "{}", message("limit=1&limit=2"));
        let ok = parse_query::<params::ListActivityQuery>("limit=7&since=2026-11-24T12%3A00%3A00Z").unwrap();
        assert_eq!(ok.limit, Some(7));
        assert!(ok.since.is_some());
    }
}
