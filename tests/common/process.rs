//! The real `sparring` binary as a child process, its output collected as
//! it comes.
//!
//! Nothing here sleeps to wait for an event: the child's output is read by
//! threads that wake the waiter on every line, and every wait has a deadline.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sparring");
pub const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub stdout_closed: bool,
    pub stderr_closed: bool,
}

impl Output {
    pub fn closed(&self) -> bool {
        self.stdout_closed && self.stderr_closed
    }
}

#[derive(Default)]
struct Captured {
    output: Mutex<Output>,
    changed: Condvar,
}

/// A child process whose stdout and stderr are collected as they come. It is
/// killed on drop, so a failing test never leaks it.
pub struct Proc {
    pub child: Child,
    captured: Arc<Captured>,
    what: String,
}

fn read_into(stream: impl Read + Send + 'static, captured: Arc<Captured>, stdout: bool) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).unwrap_or(0);
            let mut out = captured.output.lock().unwrap();
            if n == 0 {
                if stdout {
                    out.stdout_closed = true;
                } else {
                    out.stderr_closed = true;
                }
                captured.changed.notify_all();
                return;
            }
            let text = String::from_utf8_lossy(&line);
            if stdout {
                out.stdout.push_str(&text);
            } else {
                out.stderr.push_str(&text);
            }
            captured.changed.notify_all();
        }
    });
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        Proc::spawn_with_env(args, &[])
    }

    /// Spawns with these environment variables set (and no other of ours).
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Only the arguments configure it.
        for var in [
            "SPARRING_BIND",
            "SPARRING_DATA_DIR",
            "SPARRING_OIDC_ISSUER",
            "SPARRING_OIDC_AUDIENCE",
            "SPARRING_OIDC_JWKS",
            "SPARRING_LOG_FORMAT",
            "SPARRING_URL",
            "SPARRING_API_KEY",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        Proc::spawn_command(cmd, &format!("sparring {}", args.join(" ")))
    }

    /// Spawns `cmd` as it is set up (arguments, environment, working
    /// directory), its output collected; `what` names it in errors.
    pub fn spawn_command(mut cmd: Command, what: &str) -> Proc {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let captured = Arc::new(Captured::default());
        read_into(child.stdout.take().unwrap(), captured.clone(), true);
        read_into(child.stderr.take().unwrap(), captured.clone(), false);
        Proc { child, captured, what: what.to_string() }
    }

    /// Waits until `done` holds for the output so far. `Err` with the output
    /// if the process closed its output (exited) first or the deadline passed.
    pub fn wait_for(&self, done: impl Fn(&Output) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        let mut out = self.captured.output.lock().unwrap();
        loop {
            if done(&out) {
                return Ok(());
            }
            let why = if out.closed() {
                "the process ended"
            } else if Instant::now() >= deadline {
                "timed out"
            } else {
                let left = deadline.saturating_duration_since(Instant::now());
                out = self.captured.changed.wait_timeout(out, left).unwrap().0;
                continue;
            };
            return Err(format!("{}: {why}\n--- stdout\n{}\n--- stderr\n{}", self.what, out.stdout, out.stderr));
        }
    }

    pub fn expect(&self, what: &str, done: impl Fn(&Output) -> bool) {
        if let Err(e) = self.wait_for(done) {
            panic!("waiting for {what}: {e}");
        }
    }

    /// Waits (with the deadline) for the process to end.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.expect("the process to end", Output::closed);
        // Both pipes are closed: the process is exiting.
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "{}: closed its output but did not exit", self.what);
            std::thread::yield_now();
        }
    }

    /// `kill -SIGNAL` the process (`name`: `INT`, `TERM`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// SIGTERM, then wait for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit()
    }

    pub fn stdout(&self) -> String {
        self.captured.output.lock().unwrap().stdout.clone()
    }

    pub fn stderr(&self) -> String {
        self.captured.output.lock().unwrap().stderr.clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs an admin command to its end.
pub fn run(args: &[&str]) -> (ExitStatus, String, String) {
    let mut p = Proc::spawn(args);
    let status = p.wait_exit();
    (status, p.stdout(), p.stderr())
}

/// A running `sparring serve`, and its base URL.
pub struct Server {
    pub proc: Proc,
    pub base: String,
}

pub const SERVING: &str = "\"msg\":\"serving\"";

/// Starts `sparring serve` on a free loopback port and waits until it logs
/// that it is serving.
pub fn serve(data_dir: &Path) -> Server {
    serve_with(data_dir, &[])
}

/// `sparring serve` with extra arguments.
pub fn serve_with(data_dir: &Path, extra: &[&str]) -> Server {
    let data_dir = data_dir.to_str().unwrap();
    for _attempt in 0..3 {
        // The port is free now; another process could take it before the
        // server binds it, so a bind failure is retried on another port.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let bind = format!("127.0.0.1:{port}");
        let mut args = vec![
            "serve",
            "--bind",
            &bind,
            "--data-dir",
            data_dir,
            "--log-format",
            "json",
            // The tests' agents listen on loopback.
            "--allow-private-targets",
        ];
        args.extend_from_slice(extra);
        let proc = Proc::spawn(&args);
        match proc.wait_for(|o| o.stderr.contains(SERVING)) {
            Ok(()) => return Server { proc, base: format!("http://{bind}") },
            Err(e) if e.contains("starting the server") => continue,
            Err(e) => panic!("starting the server: {e}"),
        }
    }
    panic!("no free port after 3 attempts");
}

impl Server {
    /// SIGTERM, and waits for the graceful shutdown it asks for to exit 0.
    pub fn stop(&mut self) {
        let status = self.proc.terminate();
        assert!(status.success(), "the server did not stop cleanly ({status})\n--- stderr\n{}", self.proc.stderr());
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}
