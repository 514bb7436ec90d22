//! The JUnit XML report of `sparring run --junit PATH`: what CI systems
//! (GitLab, Jenkins, GitHub's test-report actions, …) show as a test report.
//! One test suite for the batch run, one test case per test: passed when the
//! test met the pass threshold the batch run kept, a failure when it did
//! not (with up to three failed results and their reasons), an error when
//! there is no verdict (the batch run cancelled, timed out, hidden).

use anyhow::Context as _;
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};
use sparring_client::types;

use super::passed_of;

/// The report of batch run `run` with its `tests` (or why they could not be
/// read); `gave_up` says why the command stopped waiting, if it did.
pub fn junit(
    run: &types::BatchRun,
    tests: Result<&Vec<types::BatchRunTest>, String>,
    gave_up: Option<&str>,
) -> anyhow::Result<String> {
    let mut suite = TestSuite::new(format!("sparring batch run {}", run.id));
    suite.set_timestamp(run.started_at.unwrap_or(run.created_at));
    if let (Some(start), Some(end)) = (run.started_at, run.finished_at) {
        suite.set_time((end - start).to_std().unwrap_or_default());
    }
    suite.add_property(Property::new("batch_run_id", run.id.as_str()));
    suite.add_property(Property::new("status", run.status.to_string()));
    for (source, id) in [("batch_id", &run.batch_id), ("channel_id", &run.channel_id), ("test_id", &run.test_id)] {
        if let Some(id) = id {
            suite.add_property(Property::new(source, id.as_str()));
        }
    }
    for (key, value) in &run.metadata {
        let value = value.as_str().map_or_else(|| value.to_string(), str::to_string);
        suite.add_property(Property::new(format!("metadata.{key}"), value));
    }

    // Why a test has no verdict, when it has none. A wait given up says
    // what became of the batch run (cancelled, stopping, left running): its
    // status as last seen would say `running` of one being cancelled.
    let no_verdict = match (gave_up, &run.status, &run.blinded) {
        (Some(why), _, _) => format!("no verdict: {why}"),
        (None, _, Some(blinded)) => format!("no verdict: {}", blinded.reason),
        (None, status, None) => format!("no verdict: the batch run is {status}"),
    };
    match tests {
        Ok(tests) => {
            for test in tests {
                suite.add_test_case(case(test, &no_verdict));
            }
        }
        Err(why) => {
            // The tests could not be read: the batch run as one case, with
            // its verdict only if it completed (a cancelled one has
            // `passed: false` and no verdict).
            let completed = matches!(run.status, types::BatchRunStatus::Completed);
            let status = match (gave_up, run.passed) {
                (None, Some(true)) if completed => TestCaseStatus::success(),
                (None, Some(false)) if completed => {
                    let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    s.set_message("some test did not meet its pass threshold").set_type("below_pass_threshold");
                    s
                }
                _ => no_verdict_status(&no_verdict),
            };
            let mut case = TestCase::new(format!("batch run {}", run.id), status);
            case.set_classname("sparring").set_system_err(format!("the tests could not be read: {why}"));
            suite.add_test_case(case);
        }
    }
    render(suite)
}

/// Writes the report `xml` (or says why it could not be made) at `path`.
pub fn write(path: &std::path::Path, xml: anyhow::Result<String>) -> anyhow::Result<()> {
    let xml = xml.context("writing the JUnit report")?;
    replace(path, xml.as_bytes()).with_context(|| format!("writing the JUnit report to {}", path.display()))
}

/// Writes `bytes` whole to a new file beside `path`, then renames it over
/// `path`: the file at `path` is always a whole report (the one before,
/// until the new one is complete), even if the command is killed while it
/// writes.
fn replace(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let name = path.file_name().context("the path names no file")?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp);
    // Each step says what failed: the OS's error alone may not fit the
    // path given (a file in `/proc` cannot be made beside: "No such file").
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        // On disk before it is named as the report, so that a power loss
        // does not leave an empty report either.
        f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to it", tmp.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The report of one suite, as XML.
fn render(suite: TestSuite) -> anyhow::Result<String> {
    let mut report = Report::new("sparring");
    report.add_test_suite(suite);
    Ok(report.to_string()?)
}

/// The report of a batch run that could not be started: one case, an
/// error saying why.
pub fn not_started(why: &str) -> anyhow::Result<String> {
    one_error("start the batch run", &format!("no batch run started: {why}"), "not_started")
}

/// The report of a start interrupted while an attempt may have reached the
/// server (`why` says where to look for the batch run).
pub fn start_unknown(why: &str) -> anyhow::Result<String> {
    one_error("start the batch run", why, "start_unknown")
}

/// The report written before anything starts, which stands if the command
/// is killed before it writes its own (a CI runner's SIGKILL).
pub fn unfinished() -> anyhow::Result<String> {
    one_error(
        "sparring run",
        "no verdict: `sparring run` was stopped before it wrote its report (killed?)",
        "unfinished",
    )
}

fn one_error(name: &str, message: &str, kind: &str) -> anyhow::Result<String> {
    let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
    status.set_message(message).set_type(kind);
    let mut case = TestCase::new(name, status);
    case.set_classname("sparring");
    let mut suite = TestSuite::new("sparring");
    suite.add_test_case(case);
    render(suite)
}

fn no_verdict_status(why: &str) -> TestCaseStatus {
    let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
    status.set_message(why).set_type("no_verdict");
    status
}

fn case(test: &types::BatchRunTest, no_verdict: &str) -> TestCase {
    let needs = format!("{:.0}%", test.pass_threshold * 100.0);
    let passed = passed_of(&test.counts).map_or_else(|| "?".to_string(), |(p, n)| format!("{p}/{n}"));
    let status = match test.passed {
        Some(true) => TestCaseStatus::success(),
        Some(false) => {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status.set_message(format!("{passed} runs passed, {needs} needed")).set_type("below_pass_threshold");
            let why: Vec<String> = test
                .failures
                .iter()
                .map(|f| {
                    let reason = f.failure_reason.as_deref().unwrap_or_default();
                    match &f.test_result_id {
                        Some(result) => format!("{result} ({}, run {}): {reason}", f.status, f.run_id),
                        None => format!("run {} ({}, no result): {reason}", f.run_id, f.status),
                    }
                })
                .collect();
            if !why.is_empty() {
                status.set_description(why.join("\n"));
            }
            status
        }
        None => no_verdict_status(no_verdict),
    };
    let mut case = TestCase::new(test.name.clone().unwrap_or_else(|| test.test_id.clone()), status);
    case.set_classname("sparring");
    case.add_property(Property::new("test_id", test.test_id.as_str()));
    case.add_property(Property::new("pass_threshold", test.pass_threshold.to_string()));
    case.set_system_out(format!("{passed} runs passed (pass threshold {needs}); test {}", test.test_id));
    case
}
