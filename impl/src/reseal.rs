//! Re-sealing every stored secret with the current key (`sparring admin
//! rotate-secret-key`), in the caller's transaction.

use rusqlite::{params, OptionalExtension as _};

use crate::failure::{Failure, Result};
use crate::secrets::Secrets;

/// Each sealed column: `(table, column, context prefix)`; a value's context
/// is `<prefix>:<row id>:<column>`.
const SEALED: &[(&str, &str, &str)] = &[
    ("projects", "webhook_secret", "project"),
    ("integrations", "credentials", "integration"),
    ("channels", "headers", "channel"),
];

/// How many sealed values the database holds.
pub fn count_sealed(conn: &rusqlite::Connection) -> rusqlite::Result<usize> {
    let mut count = 0;
    for (table, column, _) in SEALED {
        let n: i64 =
            conn.query_row(&format!("SELECT count(*) FROM {table} WHERE {column} IS NOT NULL"), [], |r| r.get(0))?;
        count += n as usize;
    }
    Ok(count)
}

/// The refusal of a key that [`key_opens`] found opening nothing of what
/// `database` holds sealed (`context`, a value that did not open), with
/// `advice` on what to do.
pub fn wrong_key(key_path: &std::path::Path, database: &str, context: &str, advice: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the secret key at {} does not open what {database} holds sealed ({context}, and the first value of each \
         sealed column): is it this data dir's key? {advice}",
        key_path.display()
    )
}

/// Whether `secrets` opens what the database holds: `None` when it holds
/// nothing sealed or the first value of some sealed column opens (one
/// damaged value does not make the key wrong); otherwise the context of a
/// value that did not open.
pub fn key_opens(conn: &rusqlite::Connection, secrets: &Secrets) -> rusqlite::Result<Option<String>> {
    let mut refused = None;
    for (table, column, prefix) in SEALED {
        let first: Option<(String, Vec<u8>)> = conn
            .query_row(&format!("SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL LIMIT 1"), [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((id, sealed)) = first else { continue };
        let context = format!("{prefix}:{id}:{column}");
        if secrets.open(&sealed, &context).is_ok() {
            return Ok(None);
        }
        refused.get_or_insert(context);
    }
    Ok(refused)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::{self, KEY_FILE};
    use crate::store::{Store, StoreError};

    const NOW: &str = "2025-01-01T00:00:00.000000Z";

    /// `(table, id, column, context)` of every sealed value the fixture
    /// stores.
    const SEALED_VALUES: &[(&str, &str, &str, &str)] = &[
        ("projects", "prj_1", "webhook_secret", "project:prj_1:webhook_secret"),
        ("integrations", "int_1", "credentials", "integration:int_1:credentials"),
        ("channels", "chn_1", "headers", "channel:chn_1:headers"),
    ];

    fn plaintext(id: &str) -> Vec<u8> {
        format!("plaintext of {id}").into_bytes()
    }

    fn stored(store: &Store, table: &str, column: &str, id: &str) -> Vec<u8> {
        let sql = format!("SELECT {column} FROM {table} WHERE id = ?1");
        let id = id.to_string();
        store.write_blocking::<_, StoreError, _>(|tx| Ok(tx.query_row(&sql, params![id], |r| r.get(0))?)).unwrap()
    }

    /// A project, an integration and a channel with a secret each, and one
    /// of each without.
    fn fixture(store: &Store, secrets: &Secrets) {
        let seal = |id: &str, context: &str| secrets.seal(&plaintext(id), context);
        let (p, i, c) =
            (seal("prj_1", SEALED_VALUES[0].3), seal("int_1", SEALED_VALUES[1].3), seal("chn_1", SEALED_VALUES[2].3));
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                for (id, secret) in [("prj_1", Some(p)), ("prj_2", None)] {
                    tx.execute(
                        "INSERT INTO projects (id, name, description, webhook_url, webhook_secret,
                                               max_call_duration_s, default_concurrency, created_at, updated_at)
                         VALUES (?1, ?1, '', NULL, ?2, 600, 10, ?3, ?3)",
                        params![id, secret, NOW],
                    )?;
                }
                for (id, secret) in [("int_1", Some(i)), ("int_2", None)] {
                    tx.execute(
                        "INSERT INTO integrations (id, project_id, provider, name, config, credentials, created_at,
                                                   updated_at)
                         VALUES (?1, 'prj_1', 'twilio', ?1, '{}', ?2, ?3, ?3)",
                        params![id, secret, NOW],
                    )?;
                }
                for (id, secret) in [("chn_1", Some(c)), ("chn_2", None)] {
                    tx.execute(
                        "INSERT INTO channels (id, project_id, name, kind, target, integration_id, header_names,
                                               headers, turn_timeout_ms, max_call_duration_s, created_at, updated_at)
                         VALUES (?1, 'prj_1', ?1, 'http', 'https://agent.example.com', NULL, '[]', ?2, 10000, 600,
                                 ?3, ?3)",
                        params![id, secret, NOW],
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn every_sealed_value_is_resealed_with_the_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let key = dir.path().join(KEY_FILE);
        let old = Secrets::load_or_create(&key).unwrap();
        fixture(&store, &old);

        let n = secrets::rotate(&key, |s| store.write_blocking(|tx| reseal_all(tx, s))).unwrap();
        assert_eq!(n, SEALED_VALUES.len());

        let new = Secrets::load_or_create(&key).unwrap();
        for (table, id, column, context) in SEALED_VALUES {
            let value = stored(&store, table, column, id);
            assert!(new.is_current(&value), "{table}.{column} of {id} is sealed with the new key");
            assert_eq!(new.open(&value, context).unwrap(), plaintext(id));
            assert!(old.open(&value, context).is_err(), "the old key no longer opens {table}.{column}");
        }
    }

    #[test]
    fn a_value_that_does_not_open_stops_the_rotation_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).unwrap();
        let key = dir.path().join(KEY_FILE);
        let old = Secrets::load_or_create(&key).unwrap();
        fixture(&store, &old);
        // A sealed value copied to another row does not open there.
        let moved = stored(&store, "channels", "headers", "chn_1");
        store
            .write_blocking::<_, StoreError, _>(|tx| {
                tx.execute("UPDATE channels SET headers = ?1 WHERE id = 'chn_2'", params![moved])?;
                Ok(())
            })
            .unwrap();
        let before: Vec<Vec<u8>> = SEALED_VALUES.iter().map(|(t, id, c, _)| stored(&store, t, c, id)).collect();

        let r = secrets::rotate(&key, |s| store.write_blocking(|tx| reseal_all(tx, s)));
        let message = r.unwrap_err().to_string();
        assert!(message.contains("channel:chn_2:headers"), "{message}");
        assert!(!message.contains("plaintext"), "{message}");

        let after: Vec<Vec<u8>> = SEALED_VALUES.iter().map(|(t, id, c, _)| stored(&store, t, c, id)).collect();
        assert_eq!(before, after, "the transaction rolled back");
        // The previous key is kept, so every value still opens.
        let recovered = Secrets::load_or_create(&key).unwrap();
        for ((_, id, _, context), value) in SEALED_VALUES.iter().zip(&after) {
            assert_eq!(recovered.open(value, context).unwrap(), plaintext(id));
        }
    }
}
