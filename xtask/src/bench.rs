//! `cargo xtask bench api|engine|auth`: the benchmarks. Neither runs in CI (which
//! only compiles them); `BENCHMARKS.md` keeps their latest figures.
//!
//! - `api`: builds `sparring` and `sparring-bench` (release), installs wrk
//!   if it is missing, and runs `sparring-bench api` (see `bench/`), which
//!   seeds, starts the server and the dropshot baseline, and prints the
//!   table. Extra arguments go to it (`-- --help` lists them).
//! - `engine`: builds the same, and runs `sparring-bench engine` (a batch
//!   of many conversations against the reference agent).
//! - `auth`: the criterion micro-benchmark of the authentication path
//!   (`impl/benches/auth.rs`); extra arguments go to criterion.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::Context as _;

fn status(mut c: Command) -> anyhow::Result<ExitCode> {
    let shown = format!("{c:?}");
    let s = c.status().with_context(|| format!("running {shown}"))?;
    Ok(if s.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"))
}

fn has_wrk() -> bool {
    // `wrk -v` prints its version (and exits 1); only a missing binary errs.
    Command::new("wrk").arg("-v").output().is_ok()
}

/// wrk comes from Debian's packages (no download of our own).
fn ensure_wrk() -> anyhow::Result<()> {
    if has_wrk() {
        return Ok(());
    }
    eprintln!("wrk is not installed; installing it with apt-get");
    let install = || Command::new("apt-get").args(["install", "-y", "-q", "wrk"]).status();
    let ok = matches!(install(), Ok(s) if s.success())
        || (Command::new("apt-get").args(["update", "-q"]).status().is_ok_and(|s| s.success())
            && matches!(install(), Ok(s) if s.success()));
    anyhow::ensure!(ok && has_wrk(), "could not install wrk (`apt-get install wrk`, as root); install it and rerun");
    Ok(())
}

/// Builds `sparring` and `sparring-bench` (release); returns the release dir.
fn build_release(root: &Path) -> anyhow::Result<Option<PathBuf>> {
    let mut build = Command::new(env!("CARGO"));
    build.current_dir(root).args([
        "build",
        "--release",
        // `--bins`: with `--bin sparring` cargo would build only binaries
        // of that name, in both packages, and leave `sparring-bench` stale.
        "--package",
        "sparring",
        "--package",
        "sparring-bench",
        "--bins",
    ]);
    if status(build)? != ExitCode::SUCCESS {
        return Ok(None);
    }
    Ok(Some(target_dir(root).join("release")))
}

pub fn api(root: &Path, args: &[String]) -> anyhow::Result<ExitCode> {
    ensure_wrk()?;
    let Some(release) = build_release(root)? else { return Ok(ExitCode::FAILURE) };
    let mut run = Command::new(release.join("sparring-bench"));
    run.current_dir(root)
        .arg("api")
        .arg("--sparring")
        .arg(release.join("sparring"))
        .arg("--work-dir")
        .arg(target_dir(root).join("bench-api"))
        .args(args);
    status(run)
}

pub fn engine(root: &Path, args: &[String]) -> anyhow::Result<ExitCode> {
    let Some(release) = build_release(root)? else { return Ok(ExitCode::FAILURE) };
    let mut run = Command::new(release.join("sparring-bench"));
    run.current_dir(root)
        .arg("engine")
        .arg("--sparring")
        .arg(release.join("sparring"))
        .arg("--work-dir")
        .arg(target_dir(root).join("bench-engine"))
        .args(args);
    status(run)
}

pub fn auth(root: &Path, args: &[String]) -> anyhow::Result<ExitCode> {
    let mut bench = Command::new(env!("CARGO"));
    bench.current_dir(root).args(["bench", "--package", "sparring-impl", "--bench", "auth", "--"]).args(args);
    status(bench)
}
