//! scenarios: not built yet; every operation answers 501.

use sparring_server::{params as p, types, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(_state: &AppState, _caller: Caller, _query: p::ListScenariosQuery) -> Result<types::ScenarioList> {
    Err(Failure::NotImplemented("list_scenarios"))
}

pub async fn create(
    _state: &AppState,
    _caller: Caller,
    _body: types::CreateScenarioRequest,
) -> Result<types::Scenario> {
    Err(Failure::NotImplemented("create_scenario"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetScenarioPath) -> Result<types::Scenario> {
    Err(Failure::NotImplemented("get_scenario"))
}

pub async fn replace(
    _state: &AppState,
    _caller: Caller,
    _path: p::ReplaceScenarioPath,
    _body: types::ReplaceScenarioRequest,
) -> Result<types::Scenario> {
    Err(Failure::NotImplemented("replace_scenario"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeleteScenarioPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_scenario"))
}
