use std::fmt;
use std::marker::PhantomData;

use dropshot::{ErrorStatusCode, HttpError};

/// Stable, machine-readable error codes shared by every operation.
///
/// Codes specific to one resource (`invalid_label`, `key_limit_reached`)
/// are plain strings at their call site; these are the ones the generated
/// code and extractors produce.
pub struct ErrorCode;

impl ErrorCode {
    pub const UNAUTHENTICATED: &'static str = "unauthenticated";
    pub const INVALID_BODY: &'static str = "invalid_body";
    pub const INVALID_QUERY: &'static str = "invalid_query";
    pub const INVALID_PATH: &'static str = "invalid_path";
    pub const INVALID_HEADER: &'static str = "invalid_header";
    pub const BODY_TOO_LARGE: &'static str = "body_too_large";
    pub const REQUEST_TIMEOUT: &'static str = "request_timeout";
    pub const UNSUPPORTED_MEDIA_TYPE: &'static str = "unsupported_media_type";
    pub const NOT_FOUND: &'static str = "not_found";
    pub const METHOD_NOT_ALLOWED: &'static str = "method_not_allowed";
    pub const NOT_IMPLEMENTED: &'static str = "not_implemented";
    pub const INTERNAL: &'static str = "internal_error";
}

/// An error response: `{error_code, message, request_id}` with its status.
///
/// `B` is the spec schema the body is documented as (`types::Error`,
/// `types::ApiKeyError`), which the implementation's method signatures
/// state; the generated endpoint turns it into dropshot's `HttpError`.
pub struct ApiError<B> {
    status: ErrorStatusCode,
    error_code: String,
    message: String,
    /// Logged by dropshot, never sent: details for the operator.
    internal: Option<String>,
    schema: PhantomData<fn() -> B>,
}

/// The longest error message sent (and logged): messages quote what the
/// client sent (an id, a field's name, an enum value), which only the body
/// limit bounds otherwise. Longer ones end in `…`.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `message`, cut to [`MAX_MESSAGE_BYTES`] at a character boundary.
pub fn clip_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

impl<B> ApiError<B> {
    pub fn new(status: ErrorStatusCode, error_code: impl Into<String>, message: impl Into<String>) -> Self {
        let message = clip_message(message.into());
        ApiError { status, error_code: error_code.into(), message, internal: None, schema: PhantomData }
    }

    pub fn bad_request(error_code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorStatusCode::BAD_REQUEST, error_code, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorStatusCode::NOT_FOUND, ErrorCode::NOT_FOUND, message)
    }

    pub fn conflict(error_code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorStatusCode::CONFLICT, error_code, message)
    }

    /// A 500 whose details go to the log only.
    pub fn internal(detail: impl fmt::Display) -> Self {
        let mut e = Self::new(ErrorStatusCode::INTERNAL_SERVER_ERROR, ErrorCode::INTERNAL, "internal error");
        e.internal = Some(detail.to_string());
        e
    }

    /// Details for the log only, beside the message the client gets.
    pub fn set_internal(&mut self, detail: impl fmt::Display) {
        self.internal = Some(detail.to_string());
    }

    /// The same error documented under another schema.
    pub fn retype<C>(self) -> ApiError<C> {
        ApiError {
            status: self.status,
            error_code: self.error_code,
            message: self.message,
            internal: self.internal,
            schema: PhantomData,
        }
    }

    pub fn status(&self) -> ErrorStatusCode {
        self.status
    }

    pub fn error_code(&self) -> &str {
        &self.error_code
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<B> fmt::Debug for ApiError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiError")
            .field("status", &self.status)
            .field("error_code", &self.error_code)
            .field("message", &self.message)
            .field("internal", &self.internal)
            .finish()
    }
}

impl<B> fmt::Display for ApiError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.internal {
            Some(internal) => write!(f, "{}: {} ({internal})", self.error_code, self.message),
            None => write!(f, "{}: {}", self.error_code, self.message),
        }
    }
}

/// What dropshot sends. Endpoints return `HttpError` because only it can
/// carry response headers (the 401's `WWW-Authenticate`) and the request id
/// dropshot assigns; its body is `{error_code, message, request_id}`.
impl<B> From<ApiError<B>> for HttpError {
    fn from(e: ApiError<B>) -> Self {
        let mut error = HttpError {
            status_code: e.status,
            internal_message: e.internal.unwrap_or_else(|| e.message.clone()),
            external_message: e.message,
            error_code: Some(e.error_code),
            headers: None,
        };
        // A credential refused by an operation (a key revoked while its
        // request waited) is answered as one refused on the way in.
        if error.status_code == ErrorStatusCode::UNAUTHORIZED {
            crate::input::add_challenges(&mut error);
        }
        error
    }
}

pub(crate) fn code_for_status(status: ErrorStatusCode) -> &'static str {
    match status.as_u16() {
        401 => ErrorCode::UNAUTHENTICATED,
        404 => ErrorCode::NOT_FOUND,
        408 => ErrorCode::REQUEST_TIMEOUT,
        413 => ErrorCode::BODY_TOO_LARGE,
        415 => ErrorCode::UNSUPPORTED_MEDIA_TYPE,
        501 => ErrorCode::NOT_IMPLEMENTED,
        s if s >= 500 => ErrorCode::INTERNAL,
        _ => "bad_request",
    }
}
