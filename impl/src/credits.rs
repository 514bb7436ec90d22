//! The credit ledger (DESIGN §7): every change to a user's credits is an
//! entry with its signed `amount` and the `balance_after` it leaves.
//!
//! Entries are appended only by the single writer, each from the previous
//! entry's balance, so the balance (the last `balance_after`) always equals
//! the sum of the amounts; the table's CHECK keeps it from going below zero
//! even if a bug tried. A run reserves its worst case up front
//! (`reservation`, negative) and gets the unused part back when it ends
//! (`refund`); what it cost is the difference.
//!
//! A conversation costs 1 credit per started minute, at least 1.

use rusqlite::{params, OptionalExtension as _};
use sparring_server::{params as p, types, Caller};
use std::sync::LazyLock;

use crate::failure::{Failure, Result};
use crate::pagination::{PageRequest, PageSql, AFTER};
use crate::{ids, AppState};

pub const DEFAULT_STARTING_CREDITS: i64 = 1000;
/// `server_settings` key of the grant a new user gets.
const STARTING_CREDITS_KEY: &str = "starting_credits";

/// What a conversation of `duration_ms` costs.
pub fn cost_of(duration_ms: u64) -> i64 {
    (duration_ms.div_ceil(60_000)).max(1) as i64
}

/// The most a conversation limited to `max_duration_s` can cost.
pub fn worst_case(max_duration_s: u32) -> i64 {
    cost_of(u64::from(max_duration_s) * 1000)
}

pub fn balance(tx: &rusqlite::Connection, user_id: &str) -> rusqlite::Result<i64> {
    Ok(tx
        .prepare_cached("SELECT balance_after FROM transactions WHERE user_id = ?1 ORDER BY seq DESC LIMIT 1")?
        .query_row(params![user_id], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Who pays for a project's batch runs (DESIGN §3: the owner): the owner
/// who chose to, its creator until another owner took billing over
/// (`projects::take_over_billing`); the payer stays an owner meanwhile.
pub fn payer_of(tx: &rusqlite::Connection, project_id: &str) -> rusqlite::Result<String> {
    tx.prepare_cached("SELECT billing_user_id FROM projects WHERE id = ?1")?
        .query_row(params![project_id], |r| r.get(0))
}

/// How an entry about a batch run names it: with the project it ran in, by
/// name and id as they are when the entry is written. The batch run goes
/// with its project when that is deleted, and is out of reach of a payer
/// who left it; the entry is the payer's, and says what they paid for.
pub fn batch_run_named(tx: &rusqlite::Connection, batch_run_id: &str, project_id: &str) -> rusqlite::Result<String> {
    let name: String =
        tx.prepare_cached("SELECT name FROM projects WHERE id = ?1")?.query_row(params![project_id], |r| r.get(0))?;
    Ok(format!("batch run {batch_run_id} in project \"{name}\" ({project_id})"))
}

/// Appends an entry, giving its id and the balance after it; fails (and so
/// rolls the transaction back) if it would take the balance below zero.
pub fn append(
    tx: &rusqlite::Transaction<'_>,
    user_id: &str,
    kind: types::TransactionKind,
    amount: i64,
    description: &str,
    batch_run_id: Option<&str>,
) -> rusqlite::Result<(String, i64)> {
    // Only an admin's grant can come near the limit (admin_grant refuses
    // one that would pass it); nothing is written past it.
    let after = balance(tx, user_id)?.checked_add(amount).ok_or_else(|| {
        rusqlite::Error::ToSqlConversionFailure(format!("a balance past {} credits", i64::MAX).into())
    })?;
    let id = ids::new_id("txn");
    tx.prepare_cached(
        "INSERT INTO transactions (id, user_id, kind, amount, balance_after, description, batch_run_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        id,
        user_id,
        kind.to_string(),
        amount,
        after,
        description,
        batch_run_id,
        ids::format_time(&ids::now())
    ])?;
    Ok((id, after))
}

/// Records the server's starting grant, for users created from now on.
pub fn set_starting_credits(tx: &rusqlite::Transaction<'_>, amount: i64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO server_settings (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![STARTING_CREDITS_KEY, amount.to_string()],
    )?;
    Ok(())
}

/// Gives a user created in this transaction the starting grant.
pub fn grant_starting(tx: &rusqlite::Transaction<'_>, user_id: &str) -> rusqlite::Result<()> {
    let amount: i64 = tx
        .query_row("SELECT value FROM server_settings WHERE key = ?1", params![STARTING_CREDITS_KEY], |r| {
            r.get::<_, String>(0)
        })
        .optional()?
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_STARTING_CREDITS);
    if amount > 0 {
        append(tx, user_id, types::TransactionKind::Grant, amount, "starting credits", None)?;
    }
    Ok(())
}

/// What an admin's grant says it is for when not told: a negative amount
/// takes credits away, and its entry does not say they were granted.
pub fn admin_grant_description(amount: i64) -> &'static str {
    if amount < 0 {
        "taken away by an administrator"
    } else {
        "granted by an administrator"
    }
}

/// `sparring admin grant-credits`: a `grant` (positive) or an `adjustment`
/// (negative, never below zero) for the user with this email, or this
/// `usr_…` id (a user who signed in with no verified address has no email),
/// described as given or by [`admin_grant_description`], with its activity
/// record: by the system (the entry says "an administrator"), about the
/// entry, and about the user, who reads it as they read their own records.
/// Gives the user as named from here on (their stored email, or their id)
/// and the new balance.
pub fn admin_grant(
    tx: &rusqlite::Transaction<'_>,
    user: &str,
    amount: i64,
    description: Option<&str>,
) -> anyhow::Result<(String, i64)> {
    if amount == 0 {
        anyhow::bail!("--amount 0 grants nothing: give a positive amount, or a negative one to take credits away");
    }
    let description = description.unwrap_or_else(|| admin_grant_description(amount));
    // Shown to the user in their ledger: a line of text, as names are.
    crate::validate::check_name("--description", description).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The user is named by their stored address from here on, not as typed
    // (by their id when they have none).
    let by_id = crate::ids::is_id(user, "usr");
    let found: Option<(String, String)> = if by_id {
        tx.query_row("SELECT id, coalesce(email, id) FROM users WHERE id = ?1", params![user], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?
    } else {
        tx.query_row(
            "SELECT id, email FROM users WHERE email = ?1 COLLATE NOCASE ORDER BY created_at, id",
            params![user],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
    };
    let (user_id, email) = found.ok_or_else(|| {
        if by_id {
            anyhow::anyhow!("no user with id {user}")
        } else if !user.contains('@') && user.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("usr_")) {
            // Ids are lower case; this one was meant as an id, not an email.
            anyhow::anyhow!("no user with id {user} (a user id is `usr_` and 32 lower-case hex digits)")
        } else {
            anyhow::anyhow!("no user with email {user}")
        }
    })?;
    let kind = if amount >= 0 { types::TransactionKind::Grant } else { types::TransactionKind::Adjustment };
    let before = balance(tx, &user_id)?;
    match before.checked_add(amount) {
        None => {
            anyhow::bail!("{email} has {before} credits; adding {amount} would pass the largest balance, {}", i64::MAX)
        }
        Some(after) if after < 0 => {
            anyhow::bail!("{email} has {before} credits; taking {} would go below zero", amount.unsigned_abs())
        }
        Some(_) => {}
    }
    let (entry, after) = append(tx, &user_id, kind, amount, description, None)?;
    let (action, summary) = if amount >= 0 {
        ("transaction.grant", format!("an administrator granted {amount} credits; balance {after}"))
    } else {
        ("transaction.adjust", format!("an administrator took away {} credits; balance {after}", amount.unsigned_abs()))
    };
    crate::activity::record_about(
        tx,
        &crate::auth::Actor::System,
        Some(&user_id),
        crate::activity::Record {
            action,
            resource_type: "transaction",
            resource_id: &entry,
            project_id: None,
            summary,
            changes: serde_json::json!({
                "kind": kind.to_string(),
                "amount": amount,
                "balance_after": after,
                "description": description,
            })
            .into(),
        },
    )?;
    Ok((email, after))
}

/// [`admin_grant`] in its own write transaction: the user's stored email
/// (or id) and their new balance.
pub async fn admin_grant_async(
    store: &crate::store::Store,
    user: String,
    amount: i64,
    description: Option<String>,
) -> anyhow::Result<(String, i64)> {
    store
        .write(move |tx| {
            admin_grant(tx, &user, amount, description.as_deref()).map_err(|e| AdminError(format!("{e:#}")))
        })
        .await
        .map_err(|e| anyhow::anyhow!(e.0))
}

#[derive(Debug)]
pub struct AdminError(String);

impl From<crate::store::StoreError> for AdminError {
    fn from(e: crate::store::StoreError) -> Self {
        AdminError(e.to_string())
    }
}

const COLUMNS: &str = "id, kind, amount, balance_after, description, batch_run_id, created_at";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<types::Transaction> {
    let kind: String = row.get(1)?;
    let created: String = row.get(6)?;
    Ok(types::Transaction {
        id: row.get(0)?,
        kind: kind.parse().map_err(|e: types::error::ConversionError| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, e.to_string().into())
        })?,
        amount: row.get(2)?,
        balance_after: row.get(3)?,
        description: row.get(4)?,
        batch_run_id: row.get(5)?,
        created_at: ids::parse_time(&created).unwrap_or_default(),
    })
}

/// A page of the caller's credit transactions (see [`PageSql`]), newest
/// first in the order they were written (`seq`, which each entry's
/// `balance_after` follows), not by id: an id is its writer's clock, and
/// the ledger has two writers (the server, and `admin grant-credits`
/// beside it) and outlives a clock set back. The cursor is the last
/// entry's id; `?4` is its `seq`. Of the kind `?2` and about the batch run
/// `?3` (each all when NULL), read from the index of the filter named `by`
/// (see [`page_sql`]), or, without one, from `transactions_by_user`: in
/// order, no sort, and the walk stops at the limit.
fn list_sql(by: Option<&str>) -> PageSql {
    let filter = |column: &str, param: &str| {
        if by == Some(column) {
            format!("{column} = {param}")
        } else if by.is_some() {
            // Only a check on what the index read by finds (`+`: no
            // index's).
            format!("({param} IS NULL OR +{column} = {param})")
        } else {
            format!("({param} IS NULL OR {column} = {param})")
        }
    };
    PageSql::new(
        &format!(
            "SELECT {COLUMNS} FROM transactions
             WHERE user_id = ?1 AND {} AND {}
               {AFTER}
             ORDER BY seq DESC LIMIT ?5",
            filter("kind", "?2"),
            filter("batch_run_id", "?3"),
        ),
        "AND seq < ?4",
    )
}

/// A page of the ledger without a filter that finds its entries.
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(None));
/// …about one batch run, in order from `transactions_by_batch_run`.
static BY_BATCH_RUN_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(Some("batch_run_id")));
/// …of one kind, in order from `transactions_by_kind`.
static BY_KIND_SQL: LazyLock<PageSql> = LazyLock::new(|| list_sql(Some("kind")));

/// The statement of a page of the ledger filtered by these: read by the
/// filter that finds the fewest (a batch run has a few entries: its
/// reservation and refund), so that a page costs about what passes its
/// filters, not a walk of the user's whole ledger to find them.
fn page_sql(kind: Option<&str>, batch_run_id: Option<&str>) -> &'static PageSql {
    match (batch_run_id, kind) {
        (Some(_), _) => &BY_BATCH_RUN_SQL,
        (None, Some(_)) => &BY_KIND_SQL,
        (None, None) => &LIST_SQL,
    }
}

pub async fn list(state: &AppState, caller: Caller, query: p::ListTransactionsQuery) -> Result<types::TransactionList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "txn").map_err(|e| Failure::invalid("cursor", e))?;
    let kind = query.kind.map(|k| k.to_string());
    state
        .store
        .read(move |tx| list_page(tx, &caller.user_id, kind.as_deref(), query.batch_run_id.as_deref(), page))
        .await
}

/// A page of `user_id`'s ledger, of entries of `kind` and about
/// `batch_run_id` when given.
fn list_page(
    tx: &rusqlite::Connection,
    user_id: &str,
    kind: Option<&str>,
    batch_run_id: Option<&str>,
    page: PageRequest,
) -> Result<types::TransactionList> {
    // Where the cursor's entry is in the ledger: one of the user's, or a
    // cursor this list never gave them.
    let after: Option<i64> = match &page.after {
        None => None,
        Some(id) => Some(
            tx.prepare_cached("SELECT seq FROM transactions WHERE id = ?1 AND user_id = ?2")?
                .query_row(params![id, user_id], |r| r.get(0))
                .optional()?
                .ok_or_else(|| Failure::invalid("cursor", crate::pagination::InvalidCursor))?,
        ),
    };
    let rows = tx
        .prepare_cached(page_sql(kind, batch_run_id).of(&page))?
        .query_map(params![user_id, kind, batch_run_id, after, page.fetch_limit()], from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let page = page.finish(rows, |t| t.id.clone());
    Ok(types::TransactionList { transactions: page.items, next_cursor: page.next_cursor })
}

pub async fn get(state: &AppState, caller: Caller, path: p::GetTransactionPath) -> Result<types::Transaction> {
    state
        .store
        .read(move |tx| {
            tx.prepare_cached(&format!("SELECT {COLUMNS} FROM transactions WHERE id = ?1 AND user_id = ?2"))?
                .query_row(params![path.id, caller.user_id], from_row)
                .optional()?
                .ok_or_else(|| Failure::not_found("transaction", &path.id))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ledger is listed newest first in the order it was written (each
    /// entry from the balance the one before it left), whatever its ids
    /// say. An id is made from its writer's clock: an entry written by
    /// another process (`admin grant-credits` beside a running server, in
    /// the same millisecond) or by a server restarted after its clock was
    /// set back has an id that sorts before entries written before it. A
    /// list in id order then showed an older entry as the newest, its
    /// `balance_after` as if it were the balance, and a page's cursor left
    /// the newest entry out of every page.
    #[test]
    fn the_ledger_is_listed_in_the_order_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute("INSERT INTO users (id, email, name, created_at) VALUES ('usr_1', 'a@b.c', 'a', 't')", [])?;
                append(tx, "usr_1", types::TransactionKind::Grant, 100, "starting credits", None)?;
                append(tx, "usr_1", types::TransactionKind::Reservation, -30, "reserved", Some("brn_1"))?;
                append(tx, "usr_1", types::TransactionKind::Grant, 5, "granted by an administrator", None)?;
                // The last entry as another clock made its id: a second
                // before the others'.
                let earlier = uuid::Uuid::now_v7().get_timestamp().unwrap().to_unix();
                let earlier = uuid::Timestamp::from_unix(uuid::NoContext, earlier.0 - 1, earlier.1);
                let id = format!("txn_{}", uuid::Uuid::new_v7(earlier).simple());
                tx.execute("UPDATE transactions SET id = ?1 WHERE seq = (SELECT max(seq) FROM transactions)", [&id])?;

                let written = |t: &types::Transaction| (t.amount, t.balance_after);
                let all = list_page(tx, "usr_1", None, None, PageRequest::parse(None, None, "txn").unwrap())?;
                let all: Vec<_> = all.transactions.iter().map(written).collect();
                assert_eq!(all, [(5, 75), (-30, 70), (100, 100)], "newest first, as written");
                // A page at a time, the same.
                let (mut paged, mut cursor) = (Vec::new(), None::<String>);
                loop {
                    let page = PageRequest::parse(Some(1), cursor.as_deref(), "txn").unwrap();
                    let page = list_page(tx, "usr_1", None, None, page)?;
                    paged.extend(page.transactions.iter().map(written));
                    match page.next_cursor {
                        Some(next) => cursor = Some(next),
                        None => break,
                    }
                    assert!(paged.len() <= 3, "{paged:?}");
                }
                assert_eq!(paged, all);
                // Filtered, the same order.
                let grants =
                    list_page(tx, "usr_1", Some("grant"), None, PageRequest::parse(None, None, "txn").unwrap())?;
                let grants: Vec<_> = grants.transactions.iter().map(written).collect();
                assert_eq!(grants, [(5, 75), (100, 100)]);
                // A cursor is an entry of the user's own ledger.
                let theirs = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &id);
                let page = PageRequest::parse(Some(1), Some(&theirs), "txn").unwrap();
                let refused = list_page(tx, "usr_2", None, None, page).map(|_| ()).unwrap_err();
                assert!(refused.to_string().contains("cursor"), "{refused}");
                Ok(())
            })
            .unwrap();
    }

    /// A user who signed in with an ID token that brought no verified
    /// address has no email; `admin grant-credits` found users by email
    /// only, so such a user (the payer of the projects they made) could
    /// never be given credits. They are named by their `usr_…` id, as the
    /// members list shows it.
    #[test]
    fn credits_are_granted_to_a_user_named_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(|tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, email, name, created_at) VALUES ('usr_01', NULL, 'no address', 't');
                     INSERT INTO users (id, email, name, created_at) VALUES ('usr_02', 'a@b.c', 'a', 't');",
                )?;
                let no_address = "usr_0000000000000000000000000000001a";
                tx.execute("UPDATE users SET id = ?1 WHERE id = 'usr_01'", [no_address])?;
                let granted = admin_grant(tx, no_address, 40, None).unwrap();
                assert_eq!(granted, (no_address.to_string(), 40), "named by their id, having no address");
                assert_eq!(balance(tx, no_address)?, 40);
                // Taken away again by id too, never below zero.
                let taken = admin_grant(tx, no_address, -15, None).unwrap();
                assert_eq!(taken.1, 25);
                let refused = admin_grant(tx, no_address, -26, None).unwrap_err().to_string();
                assert!(refused.contains("below zero"), "{refused}");
                // An id no user has is refused, as an unknown email is.
                let unknown = admin_grant(tx, "usr_0000000000000000000000000000002b", 1, None).unwrap_err();
                assert!(unknown.to_string().contains("no user"), "{unknown}");
                Ok(())
            })
            .unwrap();
    }

    /// SQLite's virtual machine steps (which no machine's noise moves) to
    /// read a page of `usr_1`'s ledger filtered by `kind` and
    /// `batch_run_id`, which two entries pass (the oldest two, so that a walk
    /// of the ledger newest first meets them last), beside `others` entries
    /// of theirs that pass neither: the first page, and the page after a
    /// cursor at the first of the two.
    fn steps_of_a_filtered_page(kind: Option<&str>, batch_run_id: Option<&str>, others: usize) -> (i32, i32) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(move |tx| {
                tx.execute("INSERT INTO users (id, email, name, created_at) VALUES ('usr_1', 'a@b.c', 'a', 't')", [])?;
                for _ in 0..2 {
                    append(tx, "usr_1", types::TransactionKind::Purchase, 10, "bought", Some("brn_1"))?;
                }
                for i in 0..others {
                    let other = format!("brn_x{i:06}");
                    append(tx, "usr_1", types::TransactionKind::Grant, 1, "granted", Some(&other))?;
                }
                Ok(())
            })
            .unwrap();
        store
            .read_blocking::<_, Failure, _>(move |tx| {
                let mut steps = Vec::new();
                let mut cursor = None::<String>;
                for (limit, want) in [(1, 1), (50, 1)] {
                    let page = PageRequest::parse(Some(limit), cursor.as_deref(), "txn").unwrap();
                    let after: Option<i64> = match &page.after {
                        None => None,
                        Some(id) => {
                            Some(tx.query_row("SELECT seq FROM transactions WHERE id = ?1", [id], |r| r.get(0))?)
                        }
                    };
                    let mut read = tx.prepare(page_sql(kind, batch_run_id).of(&page))?;
                    let rows = read
                        .query_map(params!["usr_1", kind, batch_run_id, after, page.fetch_limit()], from_row)?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    steps.push(read.get_status(rusqlite::StatementStatus::VmStep));
                    let page = page.finish(rows, |t| t.id.clone());
                    assert_eq!(page.items.len(), want, "{kind:?} {batch_run_id:?}");
                    cursor = page.next_cursor;
                }
                Ok((steps[0], steps[1]))
            })
            .unwrap()
    }

    /// A page of the ledger of one kind, or about one batch run, costs
    /// about what it holds, however long the rest of the ledger: not a walk
    /// of every entry of the user's to find those few.
    #[test]
    fn a_filtered_page_of_the_ledger_reads_only_what_passes_its_filter() {
        for (kind, batch_run_id) in [(Some("purchase"), None), (None, Some("brn_1")), (Some("purchase"), Some("brn_1"))]
        {
            let few = steps_of_a_filtered_page(kind, batch_run_id, 10);
            let many = steps_of_a_filtered_page(kind, batch_run_id, 2_000);
            assert_eq!(few, many, "{kind:?} {batch_run_id:?}: (first page, next) beside 10 other entries, and 2,000");
        }
    }

    /// Each filter's statement reads its index from the cursor on, in the
    /// ledger's order (no sort), not the user's whole ledger.
    #[test]
    fn a_filtered_page_of_the_ledger_reads_its_filters_index() {
        crate::pagination::tests::on_schema(|tx| {
            for (sql, index, column) in [
                (&BY_KIND_SQL, "transactions_by_kind", "kind"),
                (&BY_BATCH_RUN_SQL, "transactions_by_batch_run", "batch_run_id"),
            ] {
                for (after, range) in [(false, ""), (true, " AND seq<?")] {
                    let plan = crate::pagination::tests::plan(tx, sql.of_cursor(after))?;
                    let step = format!("SEARCH transactions USING INDEX {index} (user_id=? AND {column}=?{range})");
                    assert_eq!(plan, [step], "{}", sql.of_cursor(after));
                }
            }
            Ok(())
        });
    }

    #[test]
    fn a_started_minute_costs_one_credit() {
        assert_eq!(cost_of(0), 1);
        assert_eq!(cost_of(1), 1);
        assert_eq!(cost_of(60_000), 1);
        assert_eq!(cost_of(60_001), 2);
        assert_eq!(cost_of(600_000), 10);
        assert_eq!(worst_case(600), 10);
        assert_eq!(worst_case(61), 2);
        assert_eq!(worst_case(1), 1);
    }
}
