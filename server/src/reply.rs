//! Success bodies: a value of the spec's type, or that value already
//! written as JSON.
//!
//! Most operations build a value of the generated type and dropshot encodes
//! it. Reads of stored documents (a test, a page of tests, a test result)
//! would spend most of their time decoding a document into the generated
//! type only to encode it again; their implementation writes the JSON once
//! and hands it over as [`Json::written`]. The schema an endpoint documents
//! is `T`'s either way: [`Reply`] takes its metadata from dropshot's own
//! `HttpResponseOk<T>` (or `Created`, `Accepted`), so the published document
//! cannot tell the two apart.

use dropshot::{ApiEndpointResponse, Body, HttpError, HttpResponse};
use http::StatusCode;
use schemars::JsonSchema;
use serde::Serialize;

/// The body of a successful response, typed by the spec schema `T`.
pub struct Json<T>(Repr<T>);

enum Repr<T> {
    Value(T),
    Written(Vec<u8>),
}

impl<T> Json<T> {
    /// A body already written as JSON. The caller promises it is one JSON
    /// value that `T` would deserialize from (tests compare the two paths).
    pub fn written(json: String) -> Self {
        Json(Repr::Written(json.into_bytes()))
    }

    /// [`Json::written`], from JSON text as stored bytes: a body is bytes,
    /// so text that the server itself encoded is not checked to be UTF-8
    /// again on its way out (4 % of the instructions of a test result read).
    pub fn written_bytes(json: Vec<u8>) -> Self {
        Json(Repr::Written(json))
    }
}

impl<T> From<T> for Json<T> {
    fn from(value: T) -> Self {
        Json(Repr::Value(value))
    }
}

/// A success response with status `S` (200, 201 or 202) and a [`Json<T>`]
/// body: what every generated endpoint returns.
pub struct Reply<T, const S: u16>(pub Json<T>);

impl<T, const S: u16> Reply<T, S> {
    const STATUS: StatusCode = match S {
        200 => StatusCode::OK,
        201 => StatusCode::CREATED,
        202 => StatusCode::ACCEPTED,
        _ => panic!("a Reply's status is 200, 201 or 202"),
    };
}

impl<T, const S: u16> HttpResponse for Reply<T, S>
where
    T: JsonSchema + Serialize + Send + Sync + 'static,
{
    fn to_result(self) -> Result<http::Response<Body>, HttpError> {
        match self.0 .0 {
            Repr::Value(v) => match S {
                201 => dropshot::HttpResponseCreated(v).to_result(),
                202 => dropshot::HttpResponseAccepted(v).to_result(),
                _ => dropshot::HttpResponseOk(v).to_result(),
            },
            Repr::Written(json) => http::Response::builder()
                .status(Self::STATUS)
                .header(http::header::CONTENT_TYPE, dropshot::CONTENT_TYPE_JSON)
                .body(Body::from(json))
                .map_err(|e| HttpError::for_internal_error(e.to_string())),
        }
    }

    fn response_metadata() -> ApiEndpointResponse {
        match S {
            201 => dropshot::HttpResponseCreated::<T>::response_metadata(),
            202 => dropshot::HttpResponseAccepted::<T>::response_metadata(),
            _ => dropshot::HttpResponseOk::<T>::response_metadata(),
        }
    }

    fn status_code(&self) -> StatusCode {
        Self::STATUS
    }
}
