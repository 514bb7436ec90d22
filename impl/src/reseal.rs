//! Re-sealing every stored secret with the current key (`sparring admin
//! rotate-secret-key`), in the caller's transaction.

use rusqlite::params;

use crate::failure::{Failure, Result};
use crate::secrets::Secrets;

/// Each sealed column: `(table, column, context prefix)`; a value's context
/// is `<prefix>:<row id>:<column>`.
const SEALED: &[(&str, &str, &str)] = &[
    ("projects", "webhook_secret", "project"),
    ("integrations", "credentials", "integration"),
    ("channels", "headers", "channel"),
];

/// Opens every sealed value (with any key `secrets` holds) and seals it
/// again with the current key. Returns how many values were re-sealed.
pub fn reseal_all(tx: &rusqlite::Transaction<'_>, secrets: &Secrets) -> Result<usize> {
    let mut count = 0;
    for (table, column, prefix) in SEALED {
        let rows: Vec<(String, Vec<u8>)> = tx
            .prepare(&format!("SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL"))?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (id, sealed) in rows {
            let context = format!("{prefix}:{id}:{column}");
            let plain = secrets
                .open(&sealed, &context)
                .map_err(|e| Failure::Conflict { code: "secret_unreadable", message: format!("{context}: {e}") })?;
            let resealed = secrets.seal(&plain, &context);
            tx.execute(&format!("UPDATE {table} SET {column} = ?2 WHERE id = ?1"), params![id, resealed])?;
            count += 1;
        }
    }
    Ok(count)
}
