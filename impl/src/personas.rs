//! personas: not built yet; every operation answers 501.

use sparring_server::{params as p, types, BodyFields, Caller};

use crate::failure::{Failure, Result};
use crate::AppState;

pub async fn list(_state: &AppState, _caller: Caller, _query: p::ListPersonasQuery) -> Result<types::PersonaList> {
    Err(Failure::NotImplemented("list_personas"))
}

pub async fn create(_state: &AppState, _caller: Caller, _body: types::CreatePersonaRequest) -> Result<types::Persona> {
    Err(Failure::NotImplemented("create_persona"))
}

pub async fn get(_state: &AppState, _caller: Caller, _path: p::GetPersonaPath) -> Result<types::Persona> {
    Err(Failure::NotImplemented("get_persona"))
}

pub async fn delete(_state: &AppState, _caller: Caller, _path: p::DeletePersonaPath) -> Result<types::Deleted> {
    Err(Failure::NotImplemented("delete_persona"))
}

pub async fn update(
    _state: &AppState,
    _caller: Caller,
    _path: p::UpdatePersonaPath,
    _body: types::UpdatePersonaRequest,
    _fields: BodyFields,
) -> Result<types::Persona> {
    Err(Failure::NotImplemented("update_persona"))
}
