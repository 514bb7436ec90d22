//! integrations: not built yet; every operation answers 501.

use sparring_server::{params as p, types, BodyFields, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(
    _state: &AppState,
    _caller: Caller,
    _query: p::ListIntegrationsQuery,
) -> Result<types::IntegrationList> {
    Err(Failure::NotImplemented("list_integrations"))
}

pub async fn create(
    _state: &AppState,
    _caller: Caller,
    _body: types::CreateIntegrationRequest,
) -> Result<types::Integration> {
    Err(Failure::NotImplemented("create_integration"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetIntegrationPath) -> Result<types::Integration> {
    Err(Failure::NotImplemented("get_integration"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeleteIntegrationPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_integration"))
}

pub async fn update(
    _state: &AppState,
    _caller: Caller,
    _path: p::UpdateIntegrationPath,
    _body: types::UpdateIntegrationRequest,
    _fields: BodyFields,
) -> Result<types::Integration> {
    Err(Failure::NotImplemented("update_integration"))
}

pub async fn list_phone_numbers(
    _state: &AppState,
    _caller: Caller,
    _path: p::ListIntegrationPhoneNumbersPath,
    _query: p::ListIntegrationPhoneNumbersQuery,
) -> Result<types::PhoneNumberList> {
    Err(Failure::NotImplemented("list_integration_phone_numbers"))
}
