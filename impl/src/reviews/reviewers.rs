//! `GET /reviews/reviewers`: the members who may review (reviewer, editor
//! or owner role) in the caller's projects, each once, with statistics over
//! their reviews in those projects.
//!
//! A *label* is one review's overall verdict, or one of its per-evaluator
//! labels. `agreement_with_automated` is the share of a reviewer's labels
//! equal to the automated one (the result's `status == passed`, or that
//! evaluation's `passed`); `agreement_with_peers` the share of pairs (their
//! label, another reviewer's label of the same thing) that are equal. Both
//! leave out reviews that count toward a still open calibration, and every
//! review of a result the caller labels blind now (an earlier, complete
//! calibration's included), so that watching statistics cannot unblind
//! anything; `reviews_count` and
//! `last_review_at` count every review.
//!
//! The automated labels come from `result_verdicts`, kept beside each
//! result when it is stored: no result's document (its whole conversation)
//! is read (`statistics_read_no_result_document` pins the plans).

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::params;
use sparring_server::{params as p, types, Caller};

use crate::access::{self, Need};
use crate::failure::{Failure, Result};
use crate::pagination::{PageRequest, PageSql, AFTER};
use crate::runs::conversion;
use crate::{ids, AppState};

/// The projects the statistics are over: `?1` the caller, `?2` an optional
/// project filter.
const SCOPE: &str = access::MEMBER_PROJECTS;

/// One review, reduced to its labels.
struct Labels {
    reviewer_id: String,
    result_id: String,
    verdict_pass: bool,
    evaluations: Vec<types::ReviewLabel>,
}

impl Labels {
    /// Every label: `(None, overall)` then `(Some(name), passed)`.
    fn each(&self) -> impl Iterator<Item = (Option<&str>, bool)> {
        std::iter::once((None, self.verdict_pass))
            .chain(self.evaluations.iter().map(|e| (Some(e.name.as_str()), e.passed)))
    }

    fn get(&self, evaluator: Option<&str>) -> Option<bool> {
        match evaluator {
            None => Some(self.verdict_pass),
            Some(name) => self.evaluations.iter().find(|e| e.name == name).map(|e| e.passed),
        }
    }
}

/// The automated labels of one result.
struct Automated {
    passed: bool,
    evaluations: HashMap<String, bool>,
}

impl Automated {
    fn get(&self, evaluator: Option<&str>) -> Option<bool> {
        match evaluator {
            None => Some(self.passed),
            Some(name) => self.evaluations.get(name).copied(),
        }
    }
}

fn share(agree: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| agree as f64 / total as f64)
}

/// The settled reviews (not in an open calibration) of the results the
/// reviewer `?3` reviewed, everyone's, to compare with peers; none of a
/// result the caller (`?1`) labels blind now, whatever calibration a review
/// was for: its labels beside the machine's and each other's would tell the
/// caller what they are not shown. In the projects of [`SCOPE`] (a result's
/// reviews are in its project).
///
/// Found from the reviewer's own reviews (`reviews_by_reviewer`), then each
/// of their results' reviews (the `(test_result_id, reviewer_id)` key): the
/// `CROSS JOIN` keeps that order, so that what is read is those reviews, not
/// every review of the caller's projects walked for each reviewer of a page.
static SETTLED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT r.reviewer_id, r.test_result_id, r.verdict, r.evaluations
         FROM reviews mine CROSS JOIN reviews r ON r.test_result_id = mine.test_result_id
         LEFT JOIN calibrations c ON c.id = r.calibration_id
         WHERE mine.reviewer_id = ?3 AND mine.project_id IN ({SCOPE})
           AND (c.status IS NULL OR c.status != 'open')
           AND r.test_result_id NOT IN ({})",
        crate::reviews::blind::blind_results("?1")
    )
});

/// How many reviews the reviewer `?3` wrote in the projects of [`SCOPE`],
/// and when the latest was.
static COUNTS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT count(*), max(updated_at) FROM reviews WHERE reviewer_id = ?3 AND project_id IN ({SCOPE})")
});

/// A page of `GET /v1/reviewers` (see [`PageSql`]).
pub(crate) static LIST_SQL: LazyLock<PageSql> = LazyLock::new(|| {
    PageSql::new(
        &format!(
            "SELECT u.id, u.email, u.name FROM users u
             WHERE u.id IN (SELECT user_id FROM project_members
                            WHERE role IN ('reviewer', 'editor', 'owner') AND project_id IN ({SCOPE}))
               {AFTER}
             ORDER BY u.id DESC LIMIT ?4"
        ),
        "AND u.id < ?3",
    )
});

pub async fn list(state: &AppState, caller: Caller, query: p::ListReviewersQuery) -> Result<types::ReviewerList> {
    let page =
        PageRequest::parse(query.limit, query.cursor.as_deref(), "usr").map_err(|e| Failure::invalid("cursor", e))?;
    state
        .store
        .read(move |tx| {
            if let Some(project_id) = &query.project_id {
                access::require(tx, &caller.user_id, project_id, Need::Read)?;
            }
            type UserRow = (String, Option<String>, String);
            let users: Vec<UserRow> = tx
                .prepare_cached(LIST_SQL.of(&page))?
                .query_map(params![caller.user_id, query.project_id, page.after, page.fetch_limit()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let page = page.finish(users, |u| u.0.clone());

            let mut settled = tx.prepare_cached(&SETTLED_SQL)?;
            let mut counts = tx.prepare_cached(&COUNTS_SQL)?;
            // `None` for a result whose automated labels are unknown.
            let mut automated: HashMap<String, Option<Automated>> = HashMap::new();
            let mut reviewers = Vec::new();
            for (user_id, email, name) in page.items {
                let (reviews_count, last): (i64, Option<String>) = counts
                    .query_row(params![caller.user_id, query.project_id, user_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let all: Vec<Labels> = settled
                    .query_map(params![caller.user_id, query.project_id, user_id], |r| {
                        let verdict: String = r.get(2)?;
                        let evaluations: String = r.get(3)?;
                        Ok(Labels {
                            reviewer_id: r.get(0)?,
                            result_id: r.get(1)?,
                            verdict_pass: verdict == "pass",
                            evaluations: serde_json::from_str(&evaluations).map_err(|e| conversion(3, e))?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                // Each result's labels, found once: looked up per label of
                // the reviewer's, a scan of all would be quadratic in them.
                let mut by_result: HashMap<&str, Vec<&Labels>> = HashMap::new();
                for labels in &all {
                    by_result.entry(labels.result_id.as_str()).or_default().push(labels);
                }
                let (mut machine_agree, mut machine_total, mut peer_agree, mut peer_total) = (0, 0, 0, 0);
                for mine in all.iter().filter(|l| l.reviewer_id == user_id) {
                    if !automated.contains_key(&mine.result_id) {
                        let machine = super::AutomatedVerdicts::kept(tx, &mine.result_id)?.map(|kept| Automated {
                            passed: kept.passed,
                            evaluations: kept.evaluations.into_iter().map(|e| (e.name, e.passed)).collect(),
                        });
                        automated.insert(mine.result_id.clone(), machine);
                    }
                    let machine = automated[&mine.result_id].as_ref();
                    let peers: Vec<&Labels> = by_result[mine.result_id.as_str()]
                        .iter()
                        .copied()
                        .filter(|l| l.reviewer_id != user_id)
                        .collect();
                    for (evaluator, label) in mine.each() {
                        if let Some(m) = machine.and_then(|machine| machine.get(evaluator)) {
                            machine_total += 1;
                            machine_agree += u64::from(m == label);
                        }
                        for peer in &peers {
                            if let Some(theirs) = peer.get(evaluator) {
                                peer_total += 1;
                                peer_agree += u64::from(theirs == label);
                            }
                        }
                    }
                }
                reviewers.push(types::Reviewer {
                    user_id,
                    email,
                    name,
                    reviews_count,
                    agreement_with_automated: share(machine_agree, machine_total),
                    agreement_with_peers: share(peer_agree, peer_total),
                    last_review_at: last.as_deref().and_then(ids::parse_time),
                });
            }
            Ok(types::ReviewerList { reviewers, next_cursor: page.next_cursor })
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagination::tests::{on_schema, plan};

    /// Reviewer statistics read no result's document: no statement they
    /// run reads `test_results` (whose rows hold the documents), and a
    /// result's automated labels are its one `result_verdicts` row, found by
    /// its key. A reviewer's reviews are found from them, by their keys.
    #[test]
    fn statistics_read_no_result_document() {
        on_schema(|tx| {
            for sql in [
                LIST_SQL.of_cursor(false),
                LIST_SQL.of_cursor(true),
                SETTLED_SQL.as_str(),
                &COUNTS_SQL,
                crate::reviews::VERDICTS_SQL,
            ] {
                let steps = plan(tx, sql)?;
                assert!(!steps.iter().any(|s| s.contains("test_results")), "{sql}\n{steps:#?}");
            }
            let settled = plan(tx, &SETTLED_SQL)?;
            for step in [
                "SEARCH mine USING INDEX reviews_by_reviewer (reviewer_id=? AND project_id=?)",
                "SEARCH r USING INDEX sqlite_autoindex_reviews_2 (test_result_id=?)",
            ] {
                assert!(settled.iter().any(|s| s == step), "{step}\n{settled:#?}");
            }
            assert!(!settled.iter().any(|s| s.contains("reviews_by_project")), "{settled:#?}");
            assert_eq!(
                plan(tx, crate::reviews::VERDICTS_SQL)?,
                ["SEARCH result_verdicts USING PRIMARY KEY (test_result_id=?)"]
            );
            Ok(())
        });
    }

    /// SQLite's virtual machine steps (which no machine's noise moves) to
    /// read what one reviewer's statistics compare ([`SETTLED_SQL`]): their
    /// two reviews and a peer's of the same two results, in a project where
    /// the peer also reviewed `others` other results.
    fn steps_for_one_reviewer(others: usize) -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("t.db")).unwrap();
        store
            .write_blocking::<_, Failure, _>(move |tx| {
                tx.execute_batch(
                    "INSERT INTO users (id, name, created_at) VALUES ('usr_a', 'a', 't'), ('usr_b', 'b', 't');
                     INSERT INTO projects VALUES ('prj_1', 'p', '', NULL, NULL, 600, 10, 't', 't', NULL);
                     INSERT INTO project_members (project_id, user_id, role, added_at)
                     VALUES ('prj_1', 'usr_a', 'reviewer', 't'), ('prj_1', 'usr_b', 'reviewer', 't');",
                )?;
                let mut result = tx.prepare(
                    "INSERT INTO test_results (id, project_id, run_id, batch_run_id, test_id, call_id, status,
                                               created_at, document)
                     VALUES (?1, 'prj_1', ?1, 'brn_1', 'tst_1', ?1, 'passed', 't', '{}')",
                )?;
                let mut review = tx.prepare(
                    "INSERT INTO reviews (id, project_id, test_result_id, reviewer_id, verdict, evaluations, notes,
                                          calibration_id, created_at, updated_at)
                     VALUES (?1 || ?2, 'prj_1', ?1, ?2, 'pass', '[]', '', NULL, 't', 't')",
                )?;
                for i in 0..2 + others {
                    let id = format!("trs_{i:06}");
                    result.execute(params![id])?;
                    review.execute(params![id, "usr_b"])?;
                    if i < 2 {
                        review.execute(params![id, "usr_a"])?;
                    }
                }
                Ok(())
            })
            .unwrap();
        store
            .read_blocking::<_, Failure, _>(|tx| {
                let mut read = tx.prepare(&SETTLED_SQL)?;
                let rows = read
                    .query_map(params!["usr_a", None::<String>, "usr_a"], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                assert_eq!(rows.len(), 4, "{rows:?}");
                Ok(read.get_status(rusqlite::StatementStatus::VmStep))
            })
            .unwrap()
    }

    /// What one reviewer's statistics read is their own reviews and the
    /// others' of the same results, however many other reviews their
    /// projects hold: not every review of every project of the caller's,
    /// for each reviewer on the page.
    #[test]
    fn one_reviewers_statistics_read_only_the_results_they_reviewed() {
        let (few, many) = (steps_for_one_reviewer(10), steps_for_one_reviewer(2_000));
        assert_eq!(few, many, "{few} steps beside 10 other reviews, {many} beside 2,000");
    }
}
