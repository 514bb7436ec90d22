//! The API trait's implementation: each method pulls its inputs apart,
//! calls one domain function, and maps the result onto the wire types.
//! No SQL and no business rule here.

use dropshot::{Body, HttpError, RequestContext};
use http::Response;
use sparring_server::types;
use sparring_server::{params, ApiContext, ApiError, Caller, SparringApi};

use crate::api_keys::{self, ApiKeyError, ApiKeyLabel};
use crate::auth::Actor;
use crate::pagination::{InvalidCursor, PageRequest};
use crate::AppState;

pub enum ServerImpl {}

fn state(rqctx: &RequestContext<ApiContext>) -> &AppState {
    rqctx.context().state::<AppState>().expect("the server context holds the AppState it was built with")
}

// Domain errors to responses: the one place that decides statuses and codes.

fn api_key_error<B>(e: ApiKeyError) -> ApiError<B> {
    let message = e.to_string();
    match e {
        ApiKeyError::InvalidLabel(_) => ApiError::bad_request("invalid_label", message),
        ApiKeyError::LimitReached => ApiError::conflict("key_limit_reached", message),
        ApiKeyError::NotFound(_) => ApiError::not_found(message),
        ApiKeyError::Revoked(_) => ApiError::conflict("key_revoked", message),
        ApiKeyError::Store(e) => ApiError::internal(e),
    }
}

fn cursor_error<B>(e: InvalidCursor) -> ApiError<B> {
    ApiError::bad_request("invalid_cursor", e.to_string())
}

fn api_key(key: api_keys::ApiKey, pending_use: Option<chrono::DateTime<chrono::Utc>>) -> types::ApiKey {
    let last_used_at = match (key.last_used_at, pending_use) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    types::ApiKey {
        id: key.id,
        label: key.label,
        prefix: key.prefix,
        revoked: key.revoked_at.is_some(),
        created_at: Some(key.created_at),
        last_used_at,
        revoked_at: key.revoked_at,
    }
}

fn api_key_secret(key: api_keys::ApiKey, raw: api_keys::RawKey) -> types::ApiKeySecret {
    types::ApiKeySecret {
        api_key: raw.expose(),
        id: key.id,
        label: key.label,
        prefix: key.prefix,
        created_at: key.created_at,
    }
}

/// `GET /v1/openapi.json`: the spec this server was built from. Needs no
/// credential; not an operation of the API.
#[dropshot::endpoint { method = GET, path = "/v1/openapi.json", unpublished = true }]
pub async fn openapi_document(_rqctx: RequestContext<ApiContext>) -> Result<Response<Body>, HttpError> {
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(SPEC))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

const SPEC: &str = include_str!("../../spec/openapi.json");

impl SparringApi for ServerImpl {
    type Context = ApiContext;

    async fn list_api_keys(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListApiKeysQuery,
    ) -> Result<types::ApiKeyList, ApiError<types::ApiKeyError>> {
        let state = state(&rqctx);
        let page = PageRequest::parse(query.limit, query.cursor.as_deref()).map_err(cursor_error)?;
        let page = api_keys::list(&state.store, caller.user_id, page).await.map_err(api_key_error)?;
        Ok(types::ApiKeyList {
            keys: page
                .items
                .into_iter()
                .map(|k| {
                    let pending = state.last_used.pending(&k.id);
                    api_key(k, pending)
                })
                .collect(),
            next_cursor: page.next_cursor,
        })
    }

    async fn create_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateApiKeyRequest,
    ) -> Result<types::ApiKeySecret, ApiError<types::ApiKeyError>> {
        let label = ApiKeyLabel::parse(&body.label).map_err(api_key_error)?;
        let user_id = caller.user_id.clone();
        let (key, raw) = api_keys::create(&state(&rqctx).store, Actor::Caller(caller), user_id, label)
            .await
            .map_err(api_key_error)?;
        Ok(api_key_secret(key, raw))
    }

    async fn revoke_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RevokeApiKeyPath,
    ) -> Result<types::ApiKeySuccessMessage, ApiError<types::ApiKeyError>> {
        let user_id = caller.user_id.clone();
        let revoked = api_keys::revoke(&state(&rqctx).store, Actor::Caller(caller), user_id, path.id)
            .await
            .map_err(api_key_error)?;
        let message = if revoked.already_revoked {
            format!("API key `{}` was already revoked", revoked.key.id)
        } else {
            format!("API key `{}` revoked", revoked.key.id)
        };
        Ok(types::ApiKeySuccessMessage {
            id: revoked.key.id,
            message,
            already_revoked: revoked.already_revoked,
            revoked_at: revoked.key.revoked_at.unwrap_or_default(),
        })
    }

    async fn rotate_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RotateApiKeyPath,
        _body: Option<types::RotateApiKeyRequest>,
    ) -> Result<types::ApiKeySecret, ApiError<types::ApiKeyError>> {
        let user_id = caller.user_id.clone();
        let (key, raw) = api_keys::rotate(&state(&rqctx).store, Actor::Caller(caller), user_id, path.id)
            .await
            .map_err(api_key_error)?;
        Ok(api_key_secret(key, raw))
    }
    // Operations built by later work answer 501 `not_implemented`.
    async fn list_activity(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListActivityQuery,
    ) -> Result<types::ActivityList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_activity"))
    }
    async fn list_resource_activity(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ListResourceActivityPath,
        _query: params::ListResourceActivityQuery,
    ) -> Result<types::ActivityList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_resource_activity"))
    }
    async fn get_activity(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetActivityPath,
    ) -> Result<types::Activity, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_activity"))
    }
    async fn list_batch_run_runs(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ListBatchRunRunsPath,
        _query: params::ListBatchRunRunsQuery,
    ) -> Result<types::RunList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_batch_run_runs"))
    }
    async fn get_batch_run(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetBatchRunPath,
    ) -> Result<types::BatchRun, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_batch_run"))
    }
    async fn list_batches(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListBatchesQuery,
    ) -> Result<types::BatchList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_batches"))
    }
    async fn run_batch(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::RunBatchPath,
        _body: types::RunBatchRequest,
    ) -> Result<types::BatchRun, ApiError<types::Error>> {
        Err(ApiError::not_implemented("run_batch"))
    }
    async fn run_channel(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::RunChannelPath,
        _body: types::RunChannelRequest,
    ) -> Result<types::BatchRun, ApiError<types::Error>> {
        Err(ApiError::not_implemented("run_channel"))
    }
    async fn create_integration(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _body: types::CreateIntegrationRequest,
    ) -> Result<types::Integration, ApiError<types::Error>> {
        Err(ApiError::not_implemented("create_integration"))
    }
    async fn delete_integration(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::DeleteIntegrationPath,
    ) -> Result<types::Deleted, ApiError<types::Error>> {
        Err(ApiError::not_implemented("delete_integration"))
    }
    async fn update_integration(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::UpdateIntegrationPath,
        _body: types::UpdateIntegrationRequest,
    ) -> Result<types::Integration, ApiError<types::Error>> {
        Err(ApiError::not_implemented("update_integration"))
    }
    async fn list_integration_phone_numbers(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ListIntegrationPhoneNumbersPath,
        _query: params::ListIntegrationPhoneNumbersQuery,
    ) -> Result<types::PhoneNumberList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_integration_phone_numbers"))
    }
    async fn create_persona(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _body: types::CreatePersonaRequest,
    ) -> Result<types::Persona, ApiError<types::Error>> {
        Err(ApiError::not_implemented("create_persona"))
    }
    async fn delete_persona(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::DeletePersonaPath,
    ) -> Result<types::Deleted, ApiError<types::Error>> {
        Err(ApiError::not_implemented("delete_persona"))
    }
    async fn list_projects(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListProjectsQuery,
    ) -> Result<types::ProjectList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_projects"))
    }
    async fn replace_project(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ReplaceProjectPath,
        _body: types::ReplaceProjectRequest,
    ) -> Result<types::Project, ApiError<types::Error>> {
        Err(ApiError::not_implemented("replace_project"))
    }
    async fn delete_project(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::DeleteProjectPath,
    ) -> Result<types::Deleted, ApiError<types::Error>> {
        Err(ApiError::not_implemented("delete_project"))
    }
    async fn get_queue_stats(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
    ) -> Result<types::QueueStats, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_queue_stats"))
    }
    async fn list_reviews(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListReviewsQuery,
    ) -> Result<types::ReviewList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_reviews"))
    }
    async fn get_calibration(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetCalibrationPath,
    ) -> Result<types::Calibration, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_calibration"))
    }
    async fn list_reviewers(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListReviewersQuery,
    ) -> Result<types::ReviewerList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_reviewers"))
    }
    async fn get_scenario(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetScenarioPath,
    ) -> Result<types::Scenario, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_scenario"))
    }
    async fn replace_scenario(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ReplaceScenarioPath,
        _body: types::ReplaceScenarioRequest,
    ) -> Result<types::Scenario, ApiError<types::Error>> {
        Err(ApiError::not_implemented("replace_scenario"))
    }
    async fn get_test_result_by_call(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetTestResultByCallPath,
    ) -> Result<types::TestResult, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_test_result_by_call"))
    }
    async fn get_test_result(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetTestResultPath,
    ) -> Result<types::TestResult, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_test_result"))
    }
    async fn create_test(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _body: types::CreateTestRequest,
    ) -> Result<types::Test, ApiError<types::Error>> {
        Err(ApiError::not_implemented("create_test"))
    }
    async fn get_test(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetTestPath,
    ) -> Result<types::Test, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_test"))
    }
    async fn delete_test(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::DeleteTestPath,
    ) -> Result<types::Deleted, ApiError<types::Error>> {
        Err(ApiError::not_implemented("delete_test"))
    }
    async fn list_test_results(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::ListTestResultsPath,
        _query: params::ListTestResultsQuery,
    ) -> Result<types::TestResultList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_test_results"))
    }
    async fn list_transactions(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _query: params::ListTransactionsQuery,
    ) -> Result<types::TransactionList, ApiError<types::Error>> {
        Err(ApiError::not_implemented("list_transactions"))
    }
    async fn get_transaction(
        _rqctx: RequestContext<ApiContext>,
        _caller: Caller,
        _path: params::GetTransactionPath,
    ) -> Result<types::Transaction, ApiError<types::Error>> {
        Err(ApiError::not_implemented("get_transaction"))
    }
}
