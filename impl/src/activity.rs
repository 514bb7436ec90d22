//! The activity log: one record per successful mutation, written in the
//! same transaction as the change, so a change and its record exist together
//! or not at all.

use rusqlite::params;

use crate::auth::Actor;
use crate::ids;
use crate::store::StoreError;

pub struct Record<'a> {
    pub action: &'a str,
    pub resource_type: &'a str,
    pub resource_id: &'a str,
    pub project_id: Option<&'a str>,
    pub summary: String,
    /// The fields that changed. Never a secret: mask before passing.
    pub changes: serde_json::Value,
}

pub fn record(tx: &rusqlite::Transaction<'_>, actor: &Actor, r: Record<'_>) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO activity (id, actor_user_id, credential, api_key_id, action, resource_type, resource_id,
                               project_id, summary, changes, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            ids::new_id("act"),
            actor.user_id(),
            actor.credential_kind(),
            actor.api_key_id(),
            r.action,
            r.resource_type,
            r.resource_id,
            r.project_id,
            r.summary,
            r.changes.to_string(),
            ids::format_time(&ids::now()),
        ],
    )?;
    Ok(())
}
