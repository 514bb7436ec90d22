//! The table: per scenario, the medians over the rounds, against its target.

use serde::Serialize;

use crate::scenarios::Target;
use crate::wrk::Outcome;

/// A scenario's run and the baseline run just before it.
#[derive(Clone, Debug, Serialize)]
pub struct RunPair {
    pub baseline: Outcome,
    pub scenario: Outcome,
    /// The server's peak RSS during the scenario's run.
    pub peak_rss_kib: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub title: String,
    pub rps: f64,
    pub baseline_rps: f64,
    /// The median of the per-round ratios.
    pub ratio: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The highest p99 of any round.
    pub worst_p99_ms: f64,
    /// The baseline's own p99 beside the scenario's rounds (median): the
    /// tail of this machine with the load generator on it, under which no
    /// scenario's p99 can be expected to fall.
    pub baseline_p99_ms: f64,
    /// The server's CPU time per request, µs (median over the rounds).
    pub cpu_us: f64,
    pub baseline_cpu_us: f64,
    /// The same by the server's thread names, dearest first (each the
    /// median over the rounds).
    pub cpu_us_by_thread: Vec<(String, f64)>,
    /// The machine's idle share during the scenario's runs, and during the
    /// baseline's (medians).
    pub idle: f64,
    pub baseline_idle: f64,
    pub peak_rss_mb: f64,
    #[serde(skip)]
    pub target: Option<Target>,
    pub runs: Vec<RunPair>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per thread name, the median over the rounds of its µs a request (0 in
/// a round it did not run in), dearest first.
fn thread_medians(runs: &[RunPair]) -> Vec<(String, f64)> {
    let names: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|r| r.scenario.server_cpu_us_by_thread.keys()).collect();
    let mut out: Vec<(String, f64)> = names
        .into_iter()
        .map(|name| {
            let each = runs.iter().map(|r| r.scenario.server_cpu_us_by_thread.get(name).copied().unwrap_or(0.0));
            (name.clone(), median(each.collect()))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Threads and their µs a request, dearest first, those under 0.05 left
/// out: `tokio-rt-worker 24.5, sparring-writer 6.7`.
pub fn by_thread(threads: &std::collections::BTreeMap<String, f64>) -> String {
    let mut v: Vec<(&String, &f64)> = threads.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
    listed(v.into_iter().map(|(n, us)| (n.as_str(), *us)))
}

fn listed<'a>(threads: impl Iterator<Item = (&'a str, f64)>) -> String {
    threads.filter(|(_, us)| *us >= 0.05).map(|(n, us)| format!("{n} {us:.1}")).collect::<Vec<_>>().join(", ")
}

impl Row {
    pub fn new(title: &str, target: Option<Target>, runs: Vec<RunPair>) -> Row {
        let of = |f: &dyn Fn(&RunPair) -> f64| median(runs.iter().map(f).collect());
        Row {
            title: title.to_string(),
            rps: of(&|r| r.scenario.rps()),
            baseline_rps: of(&|r| r.baseline.rps()),
            ratio: of(&|r| r.scenario.rps() / r.baseline.rps()),
            p50_ms: of(&|r| r.scenario.p50_us as f64 / 1e3),
            p99_ms: of(&|r| r.scenario.p99_us as f64 / 1e3),
            worst_p99_ms: runs.iter().map(|r| r.scenario.p99_us as f64 / 1e3).fold(0.0, f64::max),
            baseline_p99_ms: of(&|r| r.baseline.p99_us as f64 / 1e3),
            cpu_us: of(&|r| r.scenario.server_cpu_us),
            baseline_cpu_us: of(&|r| r.baseline.server_cpu_us),
            cpu_us_by_thread: thread_medians(&runs),
            idle: of(&|r| r.scenario.machine_idle),
            baseline_idle: of(&|r| r.baseline.machine_idle),
            peak_rss_mb: runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
            target,
            runs,
        }
    }

    fn meets(&self) -> Option<bool> {
        self.target.map(|t| self.ratio >= t.ratio && self.p99_ms <= t.p99_ms)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub baseline_peak_rss_kib: u64,
    pub seeding: Vec<(String, f64)>,
    pub load: String,
    pub pending: Vec<String>,
}

pub const RSS_TARGET_MB: f64 = 150.0;

/// Markdown, as pasted into BENCHMARKS.md.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | req/s | baseline req/s | ratio (target) | p50 ms | p99 ms (target) | worst p99 ms \
         | baseline p99 ms | CPU µs/req (baseline) | peak RSS MB | met |\n",
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |\n");
    for row in &r.rows {
        let (ratio_t, p99_t) = match row.target {
            Some(t) => (format!(" (≥ {})", t.ratio), format!(" (≤ {})", t.p99_ms)),
            None => (String::new(), String::new()),
        };
        let met = match row.meets() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2}{ratio_t} | {:.2} | {:.2}{p99_t} | {:.2} | {:.2} | {:.0} ({:.0}) | {:.0} | {met} |\n",
            row.title,
            row.rps,
            row.baseline_rps,
            row.ratio,
            row.p50_ms,
            row.p99_ms,
            row.worst_p99_ms,
            row.baseline_p99_ms,
            row.cpu_us,
            row.baseline_cpu_us,
            row.peak_rss_mb
        ));
    }
    for p in &r.pending {
        out.push_str(&format!("| {p} | pending | | | | | | | | | |\n"));
    }
    let peak = r.rows.iter().map(|row| row.peak_rss_mb).fold(0.0, f64::max);
    out.push_str(&format!(
        "\nPeak RSS of `sparring serve` under load: {peak:.0} MB (target ≤ {RSS_TARGET_MB:.0} MB: {}); the baseline's: {:.0} MB.\n",
        if peak <= RSS_TARGET_MB { "met" } else { "**missed**" },
        r.baseline_peak_rss_kib as f64 / 1024.0
    ));
    out.push_str(&format!("Load: {}; medians over the rounds.\n", r.load));
    if !r.seeding.is_empty() {
        out.push_str("Seeding:");
        for (what, secs) in &r.seeding {
            out.push_str(&format!(" {what} in {secs:.1} s;"));
        }
        out.push('\n');
    }
    out.push_str(
        "\nThe server's CPU by thread, µs a request, and the machine's idle share (the baseline's beside it):\n\n",
    );
    for row in &r.rows {
        out.push_str(&format!(
            "- {}: {}; idle {:.1} % ({:.1} %)\n",
            row.title,
            listed(row.cpu_us_by_thread.iter().map(|(n, us)| (n.as_str(), *us))),
            row.idle * 100.0,
            row.baseline_idle * 100.0
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(requests: u64, p99_us: u64, server_cpu_us: f64) -> Outcome {
        Outcome {
            requests,
            duration_us: 1_000_000,
            p50_us: p99_us / 4,
            p99_us,
            max_us: p99_us * 2,
            status_errors: 0,
            socket_errors: 0,
            server_cpu_us,
            server_cpu_us_by_thread: [("tokio-rt-worker".to_string(), server_cpu_us * 0.75)]
                .into_iter()
                .chain((server_cpu_us > 20.0).then(|| ("sparring-writer".to_string(), server_cpu_us * 0.25)))
                .collect(),
            machine_idle: 1000.0 / requests as f64,
        }
    }

    /// Each figure is the median over the rounds (the ratio the median of
    /// each round's own ratio), the worst p99 the highest, and the row
    /// says whether both targets are met.
    #[test]
    fn a_row_is_its_rounds_medians_against_its_targets() {
        let pair = |rps, p99, base_rps, base_p99| RunPair {
            baseline: outcome(base_rps, base_p99, 13.0),
            scenario: outcome(rps, p99, 40.0),
            peak_rss_kib: 60 * 1024,
        };
        // Ratios 0.4, 0.5 and 0.3: the median 0.4, though the median req/s
        // over the median baseline is 40/90.
        let runs = vec![
            pair(40_000, 6_000, 100_000, 4_000),
            pair(45_000, 4_000, 90_000, 5_000),
            pair(24_000, 9_000, 80_000, 4_500),
        ];
        let row = Row::new("mix", Some(Target { ratio: 0.4, p99_ms: 5.0 }), runs);
        assert_eq!((row.rps, row.baseline_rps, row.ratio), (40_000.0, 90_000.0, 0.4));
        assert_eq!((row.p99_ms, row.worst_p99_ms, row.baseline_p99_ms), (6.0, 9.0, 4.5));
        assert_eq!(row.meets(), Some(false), "the p99 is over its target");
        let report = Report {
            rows: vec![row],
            baseline_peak_rss_kib: 16 * 1024,
            seeding: vec![],
            load: "wrk".into(),
            pending: vec![],
        };
        let text = render(&report);
        assert!(
            text.contains(
                "| mix | 40000 | 90000 | 0.40 (≥ 0.4) | 1.50 | 6.00 (≤ 5) | 9.00 | 4.50 | 40 (13) | 60 | **no** |"
            ),
            "{text}"
        );
        assert!(text.contains("baseline p99 ms"), "{text}");
        // Per thread, the medians dearest first; the idle share's median,
        // the baseline's beside it (1000 / its req/s here).
        assert!(text.contains("- mix: tokio-rt-worker 30.0, sparring-writer 10.0; idle 2.5 % (1.1 %)"), "{text}");
    }
}
