//! Users: created on first sign-in with an ID token (keyed by issuer and
//! subject), by `sparring admin create-key`, or as the admin of a fresh
//! database.

use rusqlite::{params, OptionalExtension as _};

use crate::api_keys::{self, ApiKeyLabel, RawKey};
use crate::auth::Actor;
use crate::ids;
use crate::oidc::Identity;
use crate::store::{Store, StoreError};

pub const ADMIN_EMAIL: &str = "admin@localhost";

/// The longest email address kept, as the members endpoint's `email` takes.
pub const MAX_EMAIL: usize = 320;

/// An email address as a user is made with it: trimmed, as adding a member
/// trims the address it looks up (both compare addresses case aside), with
/// a local part and a domain and no whitespace or control character, so
/// that the user can be found by the address people type. `Err` says why not.
pub fn email(raw: &str) -> Result<String, String> {
    let email = raw.trim();
    let Some((local, domain)) = email.rsplit_once('@') else {
        return Err(format!("`{}` is not an email address (no `@`)", email.escape_debug()));
    };
    if local.is_empty() || domain.is_empty() {
        return Err(format!("`{}` is not an email address (NAME@DOMAIN)", email.escape_debug()));
    }
    if email.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("`{}` has whitespace or a control character inside", email.escape_debug()));
    }
    if email.chars().count() > MAX_EMAIL {
        return Err(format!("an email address has at most {MAX_EMAIL} characters"));
    }
    Ok(email.to_string())
}

/// A display name from an ID token's `name` claim, kept as the API keeps
/// names (`validate::name`): control characters dropped, trimmed, at most
/// [`crate::validate::MAX_NAME`] characters; none if nothing is left. The
/// claim is only bounded by the size of a request's headers, and the name
/// is shown in every page of a project's members and reviewers.
pub fn display_name(raw: &str) -> Option<String> {
    let name: String = raw.chars().filter(|c| !c.is_control()).collect();
    let name: String = name.trim().chars().take(crate::validate::MAX_NAME).collect();
    let name = name.trim_end();
    (!name.is_empty()).then(|| name.to_string())
}

/// The user with this email (case aside, as sign-in and adding a member
/// compare addresses), created if there is none.
pub fn ensure_by_email(tx: &rusqlite::Transaction<'_>, email: &str) -> Result<String, StoreError> {
    if let Some(id) = tx
        .query_row(
            "SELECT id FROM users WHERE email = ?1 COLLATE NOCASE ORDER BY created_at, id",
            params![email],
            |r| r.get::<_, String>(0),
        )
        .optional()?
    {
        return Ok(id);
    }
    let id = ids::new_id("usr");
    let name = email.split('@').next().unwrap_or(email);
    tx.execute(
        "INSERT INTO users (id, email, name, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![id, email, name, ids::format_time(&ids::now())],
    )?;
    crate::credits::grant_starting(tx, &id)?;
    Ok(id)
}

/// The user an ID token identifies, as [`ensure_for_identity`] finds them.
#[derive(Clone, Debug)]
pub struct SignedIn {
    pub user_id: String,
    /// Whether they have an email: one who has none gets the verified
    /// address of a later token.
    pub has_email: bool,
    /// The token's address, found another user's: it never becomes theirs
    /// (no user is deleted, no address changed), so a token bringing it
    /// again need not be looked up.
    pub taken: Option<String>,
}

impl SignedIn {
    /// Whether signing in with a token bringing `email` would change
    /// nothing: they have an address, the token brings none, or the one
    /// it brings is another user's.
    pub fn settled_for(&self, email: Option<&str>) -> bool {
        match email {
            None => true,
            Some(_) if self.has_email => true,
            Some(email) => self.taken.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(email)),
        }
    }
}

/// Whether no user has this address, case aside (users are found by it).
fn email_free(tx: &rusqlite::Connection, email: &str) -> Result<bool, StoreError> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM users WHERE email = ?1 COLLATE NOCASE")?
        .query_row(params![email], |_| Ok(()))
        .optional()?
        .is_none())
}

/// The user with this identity: their id and whether they have an email.
fn find_identity(tx: &rusqlite::Connection, identity: &Identity) -> Result<Option<(String, bool)>, StoreError> {
    Ok(tx
        .prepare_cached("SELECT id, email IS NOT NULL FROM users WHERE oidc_issuer = ?1 AND oidc_subject = ?2")?
        .query_row(params![identity.issuer, identity.subject], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// The user an ID token identifies, created on first sign-in. The token's
/// email (verified: see `oidc::Identity`) becomes theirs if no other user
/// has it, at their first sign-in or, if they had no address then, at the
/// first that brings one: users are found by email (adding a member, `admin
/// create-key`), so one who signed in with a verified address is found by
/// it, whatever their first token carried.
pub async fn ensure_for_identity(store: &Store, identity: Identity) -> Result<SignedIn, StoreError> {
    let lookup = identity.clone();
    let found = store
        .read(move |tx| {
            let Some((user_id, has_email)) = find_identity(tx, &lookup)? else { return Ok(None) };
            // Nothing to write unless an address they lack is free.
            let taken = match &lookup.email {
                Some(email) if !has_email => match email_free(tx, email)? {
                    true => return Ok(None),
                    false => Some(email.clone()),
                },
                _ => None,
            };
            Ok::<_, StoreError>(Some(SignedIn { user_id, has_email, taken }))
        })
        .await?;
    if let Some(found) = found {
        return Ok(found);
    }
    store
        .write(move |tx| {
            // Free: kept only if no other user has it, case aside.
            let (email, taken) = match &identity.email {
                Some(e) if email_free(tx, e)? => (Some(e.clone()), None),
                other => (None, other.clone()),
            };
            // Another request may have created it since the read.
            if let Some((user_id, has_email)) = find_identity(tx, &identity)? {
                if has_email || email.is_none() {
                    return Ok(SignedIn { user_id, has_email, taken });
                }
                tx.execute("UPDATE users SET email = ?2 WHERE id = ?1", params![user_id, email])?;
                return Ok(SignedIn { user_id, has_email: true, taken: None });
            }
            let id = ids::new_id("usr");
            // A name as names are kept (`display_name`), whichever it is.
            let name = identity
                .name
                .clone()
                .or_else(|| identity.email.as_deref().and_then(display_name))
                .or_else(|| display_name(&identity.subject))
                .unwrap_or_else(|| identity.subject.chars().take(crate::validate::MAX_NAME).collect());
            tx.execute(
                "INSERT INTO users (id, email, name, oidc_issuer, oidc_subject, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, email, name, identity.issuer, identity.subject, ids::format_time(&ids::now())],
            )?;
            crate::credits::grant_starting(tx, &id)?;
            Ok(SignedIn { user_id: id, has_email: email.is_some(), taken })
        })
        .await
}

/// On a database with no admin and no API key yet: creates the admin user
/// and one API key for it, and returns the key (to print once). Not asked
/// whether there is any user: the server answers requests before this runs,
/// and a first sign-in with an ID token then must not stand in for the
/// admin; a key made with `sparring admin create-key` before the first
/// start does.
pub async fn bootstrap_admin(store: &Store) -> Result<Option<RawKey>, api_keys::ApiKeyError> {
    store
        .write(|tx| {
            let admins_or_keys: i64 = tx
                .query_row(
                    "SELECT (SELECT count(*) FROM users WHERE is_admin = 1) + (SELECT count(*) FROM api_keys)",
                    [],
                    |r| r.get(0),
                )
                .map_err(StoreError::from)?;
            if admins_or_keys > 0 {
                return Ok(None);
            }
            let id = ensure_by_email(tx, ADMIN_EMAIL)?;
            tx.execute("UPDATE users SET is_admin = 1 WHERE id = ?1", params![id]).map_err(StoreError::from)?;
            let label = ApiKeyLabel::parse("admin (first start)")?;
            let (_, raw) = api_keys::insert(tx, &Actor::System, &id, &label)?;
            Ok(Some(raw))
        })
        .await
}

/// `sparring admin create-key`: a key for the user with this email, created
/// if needed.
pub async fn create_key_for_email(
    store: &Store,
    email: String,
    label: ApiKeyLabel,
) -> Result<RawKey, api_keys::ApiKeyError> {
    store
        .write(move |tx| {
            let id = ensure_by_email(tx, &email)?;
            let (_, raw) = api_keys::insert(tx, &Actor::System, &id, &label)?;
            Ok(raw)
        })
        .await
}

#[cfg(test)]
mod tests {
    /// A user made before the first start's admin (a sign-in in the moment
    /// the server answers before it makes the admin) does not take the
    /// admin's place; the admin is made once. (A key made before the first
    /// start does: `tests/binary.rs`, `admin_create_key_prints_the_key_alone`.)
    #[tokio::test]
    async fn the_admin_is_made_once_whoever_came_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::open_store(dir.path()).unwrap();
        store.write(|tx| super::ensure_by_email(tx, "early@example.com").map(drop)).await.unwrap();
        assert!(super::bootstrap_admin(&store).await.unwrap().is_some(), "the admin is made, and its key shown");
        assert!(super::bootstrap_admin(&store).await.unwrap().is_none(), "once");
        let admins: i64 = store
            .read(|c| {
                c.query_row("SELECT count(*) FROM users WHERE is_admin = 1 AND email = ?1", [super::ADMIN_EMAIL], |r| {
                    r.get(0)
                })
                .map_err(crate::store::StoreError::from)
            })
            .await
            .unwrap();
        assert_eq!(admins, 1);
    }

    #[test]
    fn an_email_is_trimmed_and_needs_a_name_and_a_domain() {
        assert_eq!(super::email("  Bob@Example.com \n").as_deref(), Ok("Bob@Example.com"));
        assert_eq!(super::email("admin@localhost").as_deref(), Ok("admin@localhost"));
        for bad in ["@", "bob@", "@example.com", "bob", "bob smith@example.com", "bob@exa\u{7}mple.com", ""] {
            assert!(super::email(bad).is_err(), "{bad:?}");
        }
        assert!(super::email(&format!("{}@example.com", "a".repeat(320))).is_err());
    }

    #[test]
    fn a_display_name_is_a_name_as_the_api_keeps_names() {
        assert_eq!(super::display_name(" Ana Lima\n").as_deref(), Some("Ana Lima"));
        assert_eq!(super::display_name("Ana\u{7} Lima").as_deref(), Some("Ana Lima"));
        assert_eq!(super::display_name(&"é".repeat(150)), Some("é".repeat(100)));
        // Cut at 100 characters, then trimmed again.
        assert_eq!(super::display_name(&format!("{} x", "a".repeat(99))), Some("a".repeat(99)));
        assert_eq!(super::display_name(" \u{1b} \t"), None);
    }
}
