//! channels: not built yet; every operation answers 501.

use sparring_server::{params as p, types, BodyFields, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(_state: &AppState, _caller: Caller, _query: p::ListChannelsQuery) -> Result<types::ChannelList> {
    Err(Failure::NotImplemented("list_channels"))
}

pub async fn create(_state: &AppState, _caller: Caller, _body: types::CreateChannelRequest) -> Result<types::Channel> {
    Err(Failure::NotImplemented("create_channel"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetChannelPath) -> Result<types::Channel> {
    Err(Failure::NotImplemented("get_channel"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeleteChannelPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_channel"))
}

pub async fn update(
    _state: &AppState,
    _caller: Caller,
    _path: p::UpdateChannelPath,
    _body: types::UpdateChannelRequest,
    _fields: BodyFields,
) -> Result<types::Channel> {
    Err(Failure::NotImplemented("update_channel"))
}
