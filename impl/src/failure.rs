//! The domain's error: what went wrong, in the user's terms. `http.rs`
//! turns it into a status and an `error_code`; nothing else does.

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// 400: bad input. `code` is `invalid_<field>` or another stable word;
    /// the message names the field.
    #[error("{message}")]
    Invalid { code: String, message: String },
    /// 404: does not exist, or is not the caller's to see.
    #[error("{0}")]
    NotFound(String),
    /// 403: the caller can see it, but their role does not allow this.
    #[error("{0}")]
    Forbidden(String),
    /// 409: the state does not allow it.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// 402: the caller's credits do not cover what was asked.
    #[error("{0}")]
    InsufficientCredits(String),
    /// 501 `not_implemented`: the request needs a feature not built yet.
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub type Result<T, E = Failure> = std::result::Result<T, E>;

impl Failure {
    /// 400 `invalid_<field>` with a message that starts with the field.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> Failure {
        let code = field.rsplit(['.', '[']).next().unwrap_or(field).trim_end_matches(']');
        let code = if code.chars().all(|c| c.is_ascii_digit()) {
            field.split(['.', '[']).next().unwrap_or(field)
        } else {
            code
        };
        Failure::Invalid { code: format!("invalid_{code}"), message: format!("{field}: {problem}") }
    }

    pub fn not_found(what: &str, id: &str) -> Failure {
        Failure::NotFound(format!("no {what} with id `{id}`"))
    }

    /// 409 `in_use`, naming what still refers to the resource.
    /// 409 `runs_active`: `held` ("batch `bat_…` has 2 batch runs") stays
    /// while they are queued or running; `cancel` says what to cancel.
    pub fn runs_active(held: std::fmt::Arguments<'_>, cancel: &str) -> Failure {
        Failure::Conflict {
            code: "runs_active",
            message: format!(
                "{held} queued or running; {cancel} (POST /batch-runs/{{id}}/cancel) or let them finish first"
            ),
        }
    }

    pub fn in_use(what: &str, id: &str, referrers: &[String]) -> Failure {
        Failure::Conflict {
            code: "in_use",
            message: format!("{what} `{id}` is in use by {}; change or delete those first", referrers.join(", ")),
        }
    }
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Store(e.into())
    }
}
