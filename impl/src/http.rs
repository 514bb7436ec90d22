//! The API trait's implementation: each method pulls its inputs apart,
//! calls one domain function, and maps the result onto the wire types.
//! No SQL and no business rule here.

use dropshot::{Body, HttpError, RequestContext};
use http::Response;
use sparring_server::types;
use sparring_server::{params, ApiContext, ApiError, BodyFields, Caller, Json, SparringApi};

use crate::api_keys::{self, ApiKeyError, ApiKeyLabel};
use crate::auth::Actor;
use crate::pagination::{InvalidCursor, PageRequest};
use dropshot::ErrorStatusCode;

use crate::failure::Failure;
use crate::store::StoreError;
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
        ApiKeyError::CredentialRevoked => ApiError::new(ErrorStatusCode::UNAUTHORIZED, "unauthenticated", message),
        ApiKeyError::Store(e) => store_failure(e),
    }
}

fn failure<B>(f: Failure) -> ApiError<B> {
    match f {
        Failure::Invalid { code, message } => ApiError::bad_request(code, message),
        Failure::NotFound(message) => ApiError::not_found(message),
        Failure::Forbidden(message) => ApiError::new(ErrorStatusCode::FORBIDDEN, "forbidden", message),
        Failure::Conflict { code, message } => ApiError::conflict(code, message),
        Failure::InsufficientCredits(message) => {
            ApiError::new(ErrorStatusCode::PAYMENT_REQUIRED, "insufficient_credits", message)
        }
        Failure::Unsupported(message) => ApiError::new(ErrorStatusCode::NOT_IMPLEMENTED, "not_implemented", message),
        Failure::Store(e) => store_failure(e),
    }
}

/// A store's failure where dropshot's error is wanted (authentication):
/// as [`store_failure`] answers it.
pub(crate) fn store_http_error(e: StoreError) -> HttpError {
    store_failure::<()>(e).into()
}

/// What a client is told of a write the disk had no room for.
const STORAGE_FULL: &str =
    "the server's disk is full: the change was not made; try again once its operator has freed space";

/// What a client is told of a write the database could not be written for.
const STORAGE_UNAVAILABLE: &str = "the server cannot write to its storage (read-only, or failing): the change was not \
     made; try again once its operator has made it writable";

/// A store's failure: 503 `storage_full` when the disk is full, 503
/// `storage_unavailable` when the database cannot be written (nothing of
/// the write was kept; writes work again once there is room or the storage
/// is writable, and reads go on meanwhile), else a 500 whose details go to
/// the log only.
fn store_failure<B>(e: StoreError) -> ApiError<B> {
    let (code, message) = if e.is_full() {
        ("storage_full", STORAGE_FULL)
    } else if e.is_unwritable() {
        ("storage_unavailable", STORAGE_UNAVAILABLE)
    } else {
        return ApiError::internal(e);
    };
    let mut error = ApiError::new(ErrorStatusCode::SERVICE_UNAVAILABLE, code, message);
    error.set_internal(e);
    error
}

fn cursor_error<B>(e: InvalidCursor) -> ApiError<B> {
    failure(Failure::invalid("cursor", e))
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
    ) -> Result<Json<types::ApiKeyList>, ApiError<types::ApiKeyError>> {
        let state = state(&rqctx);
        let page = PageRequest::parse(query.limit, query.cursor.as_deref(), "key").map_err(cursor_error)?;
        let json = api_keys::list(&state.store, &state.key_pages, caller.user_id, page, &state.last_used)
            .await
            .map_err(api_key_error)?;
        Ok(Json::written(json))
    }

    async fn create_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateApiKeyRequest,
    ) -> Result<Json<types::ApiKeySecret>, ApiError<types::ApiKeyError>> {
        let label = ApiKeyLabel::parse(&body.label).map_err(api_key_error)?;
        let user_id = caller.user_id.clone();
        let (key, raw) = api_keys::create(&state(&rqctx).store, Actor::Caller(caller), user_id, label)
            .await
            .map_err(api_key_error)?;
        Ok(api_key_secret(key, raw).into())
    }

    async fn revoke_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RevokeApiKeyPath,
    ) -> Result<Json<types::ApiKeySuccessMessage>, ApiError<types::ApiKeyError>> {
        let user_id = caller.user_id.clone();
        let revoked =
            api_keys::revoke(&state(&rqctx).store, &state(&rqctx).keys, Actor::Caller(caller), user_id, path.id)
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
        }
        .into())
    }

    async fn rotate_api_key(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RotateApiKeyPath,
        _body: Option<types::RotateApiKeyRequest>,
    ) -> Result<Json<types::ApiKeySecret>, ApiError<types::ApiKeyError>> {
        let user_id = caller.user_id.clone();
        let (key, raw) =
            api_keys::rotate(&state(&rqctx).store, &state(&rqctx).keys, Actor::Caller(caller), user_id, path.id)
                .await
                .map_err(api_key_error)?;
        Ok(api_key_secret(key, raw).into())
    }

    // Everything else delegates to the module that owns the resource.
    async fn list_activity(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListActivityQuery,
    ) -> Result<Json<types::ActivityList>, ApiError<types::Error>> {
        crate::activity::list(&state(&rqctx).store, caller, query).await.map(Json::from).map_err(failure)
    }
    async fn list_resource_activity(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListResourceActivityPath,
        query: params::ListResourceActivityQuery,
    ) -> Result<Json<types::ActivityList>, ApiError<types::Error>> {
        crate::activity::list_for_resource(&state(&rqctx).store, caller, path, query)
            .await
            .map(Json::from)
            .map_err(failure)
    }
    async fn get_activity(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetActivityPath,
    ) -> Result<Json<types::Activity>, ApiError<types::Error>> {
        crate::activity::get(&state(&rqctx).store, caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_batches(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListBatchesQuery,
    ) -> Result<Json<types::BatchList>, ApiError<types::Error>> {
        crate::batches::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_batch(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateBatchRequest,
    ) -> Result<Json<types::Batch>, ApiError<types::Error>> {
        crate::batches::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_batch(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetBatchPath,
    ) -> Result<Json<types::Batch>, ApiError<types::Error>> {
        crate::batches::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn replace_batch(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ReplaceBatchPath,
        body: types::ReplaceBatchRequest,
    ) -> Result<Json<types::Batch>, ApiError<types::Error>> {
        crate::batches::replace(state(&rqctx), caller, path, body).await.map(Json::from).map_err(failure)
    }
    async fn delete_batch(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteBatchPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::batches::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_channels(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListChannelsQuery,
    ) -> Result<Json<types::ChannelList>, ApiError<types::Error>> {
        crate::channels::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_channel(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateChannelRequest,
    ) -> Result<Json<types::Channel>, ApiError<types::Error>> {
        crate::channels::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_channel(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetChannelPath,
    ) -> Result<Json<types::Channel>, ApiError<types::Error>> {
        crate::channels::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn delete_channel(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteChannelPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::channels::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn update_channel(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::UpdateChannelPath,
        body: types::UpdateChannelRequest,
        fields: BodyFields,
    ) -> Result<Json<types::Channel>, ApiError<types::Error>> {
        crate::channels::update(state(&rqctx), caller, path, body, fields).await.map(Json::from).map_err(failure)
    }
    async fn list_integrations(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListIntegrationsQuery,
    ) -> Result<Json<types::IntegrationList>, ApiError<types::Error>> {
        crate::integrations::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_integration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateIntegrationRequest,
    ) -> Result<Json<types::Integration>, ApiError<types::Error>> {
        crate::integrations::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_integration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetIntegrationPath,
    ) -> Result<Json<types::Integration>, ApiError<types::Error>> {
        crate::integrations::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn delete_integration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteIntegrationPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::integrations::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn update_integration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::UpdateIntegrationPath,
        body: types::UpdateIntegrationRequest,
        fields: BodyFields,
    ) -> Result<Json<types::Integration>, ApiError<types::Error>> {
        crate::integrations::update(state(&rqctx), caller, path, body, fields).await.map(Json::from).map_err(failure)
    }
    async fn list_integration_phone_numbers(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListIntegrationPhoneNumbersPath,
        query: params::ListIntegrationPhoneNumbersQuery,
    ) -> Result<Json<types::PhoneNumberList>, ApiError<types::Error>> {
        crate::integrations::list_phone_numbers(state(&rqctx), caller, path, query)
            .await
            .map(Json::from)
            .map_err(failure)
    }
    async fn list_personas(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListPersonasQuery,
    ) -> Result<Json<types::PersonaList>, ApiError<types::Error>> {
        crate::personas::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_persona(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreatePersonaRequest,
    ) -> Result<Json<types::Persona>, ApiError<types::Error>> {
        crate::personas::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_persona(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetPersonaPath,
    ) -> Result<Json<types::Persona>, ApiError<types::Error>> {
        crate::personas::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn delete_persona(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeletePersonaPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::personas::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn update_persona(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::UpdatePersonaPath,
        body: types::UpdatePersonaRequest,
        fields: BodyFields,
    ) -> Result<Json<types::Persona>, ApiError<types::Error>> {
        crate::personas::update(state(&rqctx), caller, path, body, fields).await.map(Json::from).map_err(failure)
    }
    async fn list_projects(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListProjectsQuery,
    ) -> Result<Json<types::ProjectList>, ApiError<types::Error>> {
        crate::projects::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_project(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateProjectRequest,
    ) -> Result<Json<types::Project>, ApiError<types::Error>> {
        crate::projects::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_project(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetProjectPath,
    ) -> Result<Json<types::Project>, ApiError<types::Error>> {
        crate::projects::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn replace_project(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ReplaceProjectPath,
        body: types::ReplaceProjectRequest,
    ) -> Result<Json<types::Project>, ApiError<types::Error>> {
        crate::projects::replace(state(&rqctx), caller, path, body).await.map(Json::from).map_err(failure)
    }
    async fn delete_project(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteProjectPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::projects::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_project_members(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListProjectMembersPath,
        query: params::ListProjectMembersQuery,
    ) -> Result<Json<types::ProjectMemberList>, ApiError<types::Error>> {
        crate::projects::list_members(state(&rqctx), caller, path, query).await.map(Json::from).map_err(failure)
    }
    async fn add_project_member(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::AddProjectMemberPath,
        body: types::AddProjectMemberRequest,
    ) -> Result<Json<types::ProjectMember>, ApiError<types::Error>> {
        crate::projects::add_member(state(&rqctx), caller, path, body).await.map(Json::from).map_err(failure)
    }
    async fn remove_project_member(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RemoveProjectMemberPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::projects::remove_member(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn take_over_project_billing(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::TakeOverProjectBillingPath,
    ) -> Result<Json<types::Project>, ApiError<types::Error>> {
        crate::projects::take_over_billing(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn update_project_member(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::UpdateProjectMemberPath,
        body: types::UpdateProjectMemberRequest,
        fields: BodyFields,
    ) -> Result<Json<types::ProjectMember>, ApiError<types::Error>> {
        crate::projects::update_member(state(&rqctx), caller, path, body, fields).await.map(Json::from).map_err(failure)
    }
    async fn list_scenarios(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListScenariosQuery,
    ) -> Result<Json<types::ScenarioList>, ApiError<types::Error>> {
        crate::scenarios::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_scenario(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateScenarioRequest,
    ) -> Result<Json<types::Scenario>, ApiError<types::Error>> {
        crate::scenarios::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_scenario(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetScenarioPath,
    ) -> Result<Json<types::Scenario>, ApiError<types::Error>> {
        crate::scenarios::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn replace_scenario(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ReplaceScenarioPath,
        body: types::ReplaceScenarioRequest,
    ) -> Result<Json<types::Scenario>, ApiError<types::Error>> {
        crate::scenarios::replace(state(&rqctx), caller, path, body).await.map(Json::from).map_err(failure)
    }
    async fn delete_scenario(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteScenarioPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::scenarios::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_tests(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListTestsQuery,
    ) -> Result<Json<types::TestList>, ApiError<types::Error>> {
        crate::tests::list(state(&rqctx), caller, query).await.map_err(failure)
    }
    async fn create_test(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateTestRequest,
    ) -> Result<Json<types::Test>, ApiError<types::Error>> {
        crate::tests::create(state(&rqctx), caller, body).await.map_err(failure)
    }
    async fn get_test(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetTestPath,
    ) -> Result<Json<types::Test>, ApiError<types::Error>> {
        crate::tests::get(state(&rqctx), caller, path).await.map_err(failure)
    }
    async fn delete_test(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteTestPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::tests::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn update_test(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::UpdateTestPath,
        body: types::UpdateTestRequest,
        fields: BodyFields,
    ) -> Result<Json<types::Test>, ApiError<types::Error>> {
        crate::tests::update(state(&rqctx), caller, path, body, fields).await.map(Json::from).map_err(failure)
    }

    async fn run_test(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RunTestPath,
        headers: params::RunTestHeaders,
        body: Option<types::RunTestRequest>,
    ) -> Result<Json<types::BatchRun>, ApiError<types::Error>> {
        // An omitted body is `{}`.
        crate::runs::run_test(state(&rqctx), caller, path, headers, body.unwrap_or_default())
            .await
            .map(Json::from)
            .map_err(failure)
    }
    async fn list_batch_runs(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListBatchRunsQuery,
    ) -> Result<Json<types::BatchRunList>, ApiError<types::Error>> {
        crate::runs::list_batch_runs(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn cancel_batch_run(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::CancelBatchRunPath,
    ) -> Result<Json<types::BatchRun>, ApiError<types::Error>> {
        crate::runs::cancel(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_webhook_deliveries(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListWebhookDeliveriesPath,
        query: params::ListWebhookDeliveriesQuery,
    ) -> Result<Json<types::WebhookDeliveryList>, ApiError<types::Error>> {
        crate::engine::webhooks::list(state(&rqctx), caller, path, query).await.map(Json::from).map_err(failure)
    }
    async fn list_batch_run_runs(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListBatchRunRunsPath,
        query: params::ListBatchRunRunsQuery,
    ) -> Result<Json<types::RunList>, ApiError<types::Error>> {
        crate::runs::list_runs(state(&rqctx), caller, path, query).await.map(Json::from).map_err(failure)
    }
    async fn list_batch_run_tests(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListBatchRunTestsPath,
        query: params::ListBatchRunTestsQuery,
    ) -> Result<Json<types::BatchRunTestList>, ApiError<types::Error>> {
        crate::runs::list_tests(state(&rqctx), caller, path, query).await.map(Json::from).map_err(failure)
    }
    async fn get_batch_run(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetBatchRunPath,
    ) -> Result<Json<types::BatchRun>, ApiError<types::Error>> {
        crate::runs::get_batch_run(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn run_batch(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RunBatchPath,
        headers: params::RunBatchHeaders,
        body: Option<types::RunBatchRequest>,
    ) -> Result<Json<types::BatchRun>, ApiError<types::Error>> {
        // An omitted body is `{}`.
        crate::runs::run_batch(state(&rqctx), caller, path, headers, body.unwrap_or_default())
            .await
            .map(Json::from)
            .map_err(failure)
    }
    async fn run_channel(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::RunChannelPath,
        headers: params::RunChannelHeaders,
        body: Option<types::RunChannelRequest>,
    ) -> Result<Json<types::BatchRun>, ApiError<types::Error>> {
        // An omitted body is `{}`.
        crate::runs::run_channel(state(&rqctx), caller, path, headers, body.unwrap_or_default())
            .await
            .map(Json::from)
            .map_err(failure)
    }
    async fn get_queue_stats(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
    ) -> Result<Json<types::QueueStats>, ApiError<types::Error>> {
        crate::runs::queue_stats(state(&rqctx), caller).await.map(Json::from).map_err(failure)
    }
    async fn list_reviews(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListReviewsQuery,
    ) -> Result<Json<types::ReviewList>, ApiError<types::Error>> {
        crate::reviews::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_review(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateReviewRequest,
    ) -> Result<Json<types::Review>, ApiError<types::Error>> {
        crate::reviews::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn delete_review(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::DeleteReviewPath,
    ) -> Result<Json<types::Deleted>, ApiError<types::Error>> {
        crate::reviews::delete(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_calibrations(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListCalibrationsQuery,
    ) -> Result<Json<types::CalibrationList>, ApiError<types::Error>> {
        crate::reviews::calibration::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn create_calibration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        body: types::CreateCalibrationRequest,
    ) -> Result<Json<types::Calibration>, ApiError<types::Error>> {
        crate::reviews::calibration::create(state(&rqctx), caller, body).await.map(Json::from).map_err(failure)
    }
    async fn get_calibration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetCalibrationPath,
    ) -> Result<Json<types::Calibration>, ApiError<types::Error>> {
        crate::reviews::calibration::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn close_calibration(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::CloseCalibrationPath,
    ) -> Result<Json<types::Calibration>, ApiError<types::Error>> {
        crate::reviews::calibration::close(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
    async fn list_reviewers(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListReviewersQuery,
    ) -> Result<Json<types::ReviewerList>, ApiError<types::Error>> {
        crate::reviews::reviewers::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn get_test_result_by_call(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetTestResultByCallPath,
    ) -> Result<Json<types::TestResult>, ApiError<types::Error>> {
        crate::runs::get_test_result_by_call(state(&rqctx), caller, path).await.map_err(failure)
    }
    async fn get_test_result(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetTestResultPath,
    ) -> Result<Json<types::TestResult>, ApiError<types::Error>> {
        crate::runs::get_test_result(state(&rqctx), caller, path).await.map_err(failure)
    }
    async fn list_test_results(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::ListTestResultsPath,
        query: params::ListTestResultsQuery,
    ) -> Result<Json<types::TestResultList>, ApiError<types::Error>> {
        crate::runs::list_test_results(state(&rqctx), caller, path, query).await.map_err(failure)
    }
    async fn list_transactions(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        query: params::ListTransactionsQuery,
    ) -> Result<Json<types::TransactionList>, ApiError<types::Error>> {
        crate::credits::list(state(&rqctx), caller, query).await.map(Json::from).map_err(failure)
    }
    async fn get_transaction(
        rqctx: RequestContext<ApiContext>,
        caller: Caller,
        path: params::GetTransactionPath,
    ) -> Result<Json<types::Transaction>, ApiError<types::Error>> {
        crate::credits::get(state(&rqctx), caller, path).await.map(Json::from).map_err(failure)
    }
}

#[cfg(test)]
mod tests {
    use dropshot::ErrorStatusCode;

    use super::{api_key_error, failure, store_http_error};
    use crate::api_keys::ApiKeyError;
    use crate::failure::Failure;
    use crate::store::StoreError;

    /// A write whose commit finds the database unwritable (a file made
    /// read-only or immutable, a file system remounted read-only, a failing
    /// disk) is the client's 503 `storage_unavailable`, not a bare 500:
    /// nothing of it is kept, reads go on, and writes once the storage is
    /// writable again.
    #[tokio::test]
    async fn an_unwritable_database_is_a_503_and_reads_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = crate::store::Store::open(&path).unwrap();
        let add = |id: &'static str| {
            store.write::<(), StoreError, _>(move |tx| {
                tx.execute("INSERT INTO users (id, name, created_at) VALUES (?1, 'a', 'now')", [id])?;
                Ok(())
            })
        };
        let users = || {
            store.read_blocking::<i64, StoreError, _>(|c| {
                Ok(c.query_row("SELECT count(*) FROM users", [], |r| r.get(0))?)
            })
        };
        add("usr_before").await.unwrap();
        crate::wal_writes::full_disk::set_unwritable(&path, true);
        let refused = add("usr_refused").await;
        let read = users();
        crate::wal_writes::full_disk::set_unwritable(&path, false);
        let e = failure::<()>(Failure::Store(refused.expect_err("a commit to an unwritable WAL")));
        assert_eq!((e.status(), e.error_code()), (ErrorStatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"));
        assert!(e.message().contains("cannot write"), "{}", e.message());
        assert_eq!(read.unwrap(), 1, "reads go on, and nothing of the refused write was kept");
        add("usr_after").await.unwrap();
        assert_eq!(users().unwrap(), 2);
    }

    /// A full disk is the client's 503 `storage_full`, from a domain write
    /// and from a key's; any other store failure stays a 500 whose details
    /// go to the log only.
    #[test]
    fn a_full_disk_is_a_503_and_other_store_failures_500s() {
        let full = || StoreError::Full("database or disk is full".into());
        for e in [failure::<()>(Failure::Store(full())), api_key_error::<()>(ApiKeyError::Store(full()))] {
            assert_eq!((e.status(), e.error_code()), (ErrorStatusCode::SERVICE_UNAVAILABLE, "storage_full"));
            assert!(e.message().contains("disk is full"), "{}", e.message());
        }
        let other = failure::<()>(Failure::Store(StoreError::Task("the database writer has stopped".into())));
        assert_eq!((other.status(), other.error_code()), (ErrorStatusCode::INTERNAL_SERVER_ERROR, "internal_error"));
        assert_eq!(other.message(), "internal error");
        // The same, as dropshot's error (a first sign-in's write).
        let full = store_http_error(full());
        assert_eq!(
            (full.status_code, full.error_code.as_deref()),
            (ErrorStatusCode::SERVICE_UNAVAILABLE, Some("storage_full"))
        );
        assert!(full.external_message.contains("disk is full"), "{}", full.external_message);
        let other = store_http_error(StoreError::Task("x".into()));
        assert_eq!(
            (other.status_code, other.error_code.as_deref()),
            (ErrorStatusCode::INTERNAL_SERVER_ERROR, Some("internal_error"))
        );
        assert_eq!(other.external_message, "internal error");
    }

    /// A key revoked while its request waited to create or rotate a key
    /// is refused as any invalid credential is: a 401 `unauthenticated`
    /// with the `WWW-Authenticate` challenge every 401 carries.
    #[test]
    fn a_key_revoked_meanwhile_is_a_401_with_the_challenge() {
        let challenges = |e: &dropshot::HttpError| -> Vec<String> {
            let Some(headers) = e.headers.as_deref() else { return Vec::new() };
            headers.get_all(http::header::WWW_AUTHENTICATE).iter().map(|v| v.to_str().unwrap().to_string()).collect()
        };
        let e: dropshot::HttpError = api_key_error::<()>(ApiKeyError::CredentialRevoked).into();
        assert_eq!((e.status_code, e.error_code.as_deref()), (ErrorStatusCode::UNAUTHORIZED, Some("unauthenticated")));
        let refused = challenges(&sparring_server::unauthorized("invalid API key"));
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert_eq!(challenges(&e), refused);
    }
}
