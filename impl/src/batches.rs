//! batches: not built yet; every operation answers 501.

use sparring_server::{params as p, types, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(_state: &AppState, _caller: Caller, _query: p::ListBatchesQuery) -> Result<types::BatchList> {
    Err(Failure::NotImplemented("list_batches"))
}

pub async fn create(_state: &AppState, _caller: Caller, _body: types::CreateBatchRequest) -> Result<types::Batch> {
    Err(Failure::NotImplemented("create_batch"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetBatchPath) -> Result<types::Batch> {
    Err(Failure::NotImplemented("get_batch"))
}

pub async fn replace(
    _state: &AppState,
    _caller: Caller,
    _path: p::ReplaceBatchPath,
    _body: types::ReplaceBatchRequest,
) -> Result<types::Batch> {
    Err(Failure::NotImplemented("replace_batch"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeleteBatchPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_batch"))
}
