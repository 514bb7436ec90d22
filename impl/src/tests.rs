//! tests: not built yet; every operation answers 501.

use sparring_server::{params as p, types, BodyFields, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(_state: &AppState, _caller: Caller, _query: p::ListTestsQuery) -> Result<types::TestList> {
    Err(Failure::NotImplemented("list_tests"))
}

pub async fn create(_state: &AppState, _caller: Caller, _body: types::CreateTestRequest) -> Result<types::Test> {
    Err(Failure::NotImplemented("create_test"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetTestPath) -> Result<types::Test> {
    Err(Failure::NotImplemented("get_test"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeleteTestPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_test"))
}

pub async fn update(
    _state: &AppState,
    _caller: Caller,
    _path: p::UpdateTestPath,
    _body: types::UpdateTestRequest,
    _fields: BodyFields,
) -> Result<types::Test> {
    Err(Failure::NotImplemented("update_test"))
}
