//! The servers under load, as child processes: start, wait until they
//! answer, read their peak memory, stop.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub struct Server {
    pub name: &'static str,
    pub addr: SocketAddr,
    child: Child,
}

/// A port nobody listens on now (bound and released: the server binds it a
/// moment later).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where a server's log goes: a file while seeding (small, and useful if
/// something fails), nowhere under load (dropshot logs every request; both
/// servers format the same lines, neither pays for a disk).
pub enum Log<'a> {
    File(&'a Path),
    Discard,
}

impl Server {
    /// Spawns `command` (which must serve HTTP on `addr`) and waits until
    /// `ready_path` answers.
    pub async fn spawn(
        name: &'static str,
        mut command: Command,
        addr: SocketAddr,
        log: Log<'_>,
        ready_path: &str,
    ) -> anyhow::Result<Server> {
        let stderr = match log {
            Log::File(path) => Stdio::from(std::fs::File::create(path)?),
            Log::Discard => Stdio::null(),
        };
        let shown = format!("{command:?}");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {name}: {shown}"))?;
        let mut server = Server { name, addr, child };
        server.wait_ready(ready_path, &shown).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, path: &str, shown: &str) -> anyhow::Result<()> {
        let url = format!("http://{}{path}", self.addr);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("{} exited ({status}) before answering; run it by hand to see why: {shown}", self.name);
            }
            if http.get(&url).send().await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("{} did not answer {url} within a minute: {shown}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn status_field_kib(&self, field: &str) -> anyhow::Result<u64> {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
            .with_context(|| format!("no {field} in {path}"))
    }

    /// CPU time the process has used so far (user and system), in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        name_and_cpu_seconds(&stat).map(|(_, s)| s).with_context(|| format!("{path} is not as expected"))
    }

    /// CPU time each of the process's threads has used so far, in seconds,
    /// summed by thread name (`tokio-rt-worker`, `sparring-writer`, …). A
    /// thread that ends between the listing and its read is left out.
    pub fn cpu_seconds_by_thread(&self) -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
        let dir = format!("/proc/{}/task", self.pid());
        let mut out = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else { continue };
            if let Some((name, seconds)) = name_and_cpu_seconds(&stat) {
                *out.entry(name).or_insert(0.0) += seconds;
            }
        }
        Ok(out)
    }

    /// The most memory the process has held since it started or since the
    /// last [`Server::reset_peak`] (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        self.status_field_kib("VmHWM:")
    }

    /// Starts a new peak-RSS measurement: writing 5 to `clear_refs` sets
    /// `VmHWM` back to the current RSS (Linux 4.0 and later).
    pub fn reset_peak(&self) -> anyhow::Result<()> {
        let path = format!("/proc/{}/clear_refs", self.pid());
        std::fs::write(&path, "5").with_context(|| format!("writing {path}"))
    }

    /// SIGTERM, then waits for a clean exit (the server finishes in-flight
    /// requests and writes pending `last_used_at` times).
    pub fn stop(mut self) -> anyhow::Result<()> {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status()?;
        anyhow::ensure!(status.success(), "could not signal {} (pid {})", self.name, self.pid());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                anyhow::ensure!(status.success(), "{} exited with {status} on SIGTERM", self.name);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("{} did not stop within 30 s of SIGTERM", self.name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Never leave a server behind when the bench fails halfway.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `/proc/…/stat` line's command name and CPU time (user and system), in
/// seconds.
fn name_and_cpu_seconds(stat: &str) -> Option<(String, f64)> {
    // The command name is in parentheses and may hold spaces; of the fields
    // after it, state is field 3, utime 14, stime 15.
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    // Linux reports in clock ticks of 1/100 s (USER_HZ) on every
    // architecture it runs this on.
    Some((name, (ticks(11)? + ticks(12)?) / 100.0))
}

/// The machine's CPU time so far, from `/proc/stat`: (idle and waiting for
/// I/O, all), in ticks.
pub fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let cpu = stat.lines().next().and_then(|l| l.strip_prefix("cpu ")).context("no `cpu` line in /proc/stat")?;
    let ticks: Vec<u64> = cpu.split_whitespace().filter_map(|t| t.parse().ok()).collect();
    anyhow::ensure!(ticks.len() >= 5, "a short `cpu` line in /proc/stat");
    // user nice system idle iowait irq softirq steal (guest time is counted
    // in user already).
    Ok((ticks[3] + ticks[4], ticks.iter().take(8).sum()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stat_line_gives_its_name_and_cpu_time() {
        let stat = "4242 (sparring-writer) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 1 0 100";
        assert_eq!(super::name_and_cpu_seconds(stat), Some(("sparring-writer".to_string(), 3.25)));
        let spaced = "7 (tokio (rt) x) R 1 2 3 4 5 6 7 8 9 10 1 2 0";
        assert_eq!(super::name_and_cpu_seconds(spaced), Some(("tokio (rt) x".to_string(), 0.03)));
        assert_eq!(super::name_and_cpu_seconds("7 (short) R 1 2"), None);
    }
}
