//! What one workload measured ([`Row`]) and the table the benchmark prints (Markdown, so it can
//! be pasted into `docs/performance.md` as is).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The figures of one workload; `None` where a figure does not apply to it.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The workload's name.
    pub workload: String,
    /// Runs created.
    pub runs: usize,
    /// Tool steps each run asks for.
    pub steps_per_run: usize,
    /// Controller processes.
    pub controllers: usize,
    /// Tool calls the tool server answered.
    pub tool_steps: u64,
    /// AgentRun status writes (audit log, else the controllers' metrics).
    pub status_writes: Option<u64>,
    /// AgentRunSegment creates (audit log, else the segments left in the namespace).
    pub segment_creates: Option<u64>,
    /// Segments in the namespace when the workload ended.
    pub segments: Option<u64>,
    /// The largest AgentRun object (compact JSON bytes, spec and status) the workload's watch
    /// saw.
    pub largest_object_bytes: Option<u64>,
    /// Every write request in the workload's namespace, by resource (audit log only).
    pub writes_by_resource: BTreeMap<String, u64>,
    /// Every API request in the namespace (audit log), by (verb, `resource[/subresource]`).
    pub requests: BTreeMap<(String, String), u64>,
    /// From the first create to the last run settling.
    pub elapsed: Option<Duration>,
    /// Step overheads: from one tool answer to the next call of the same run.
    pub overheads: Vec<Duration>,
    /// The bare compare-and-set status-write loop on the same server, in writes/s.
    pub floor_writes_per_sec: Option<f64>,
    /// Takeover latencies: SIGKILL to the new holder's `lease.taken_over` write.
    pub takeovers: Vec<Duration>,
    /// The lease duration the takeover workload's run used.
    pub lease_seconds: Option<i64>,
    /// The controllers' highest peak resident memory (bytes).
    pub peak_rss: Option<u64>,
    /// Controller CPU seconds spent on the workload (all controllers).
    pub controller_cpu: f64,
    /// CPU seconds of this process (embedded API server, tool server, the watch) meanwhile.
    pub bench_cpu: f64,
    /// How the runs ended (`1000 Completed`).
    pub outcome: String,
    /// More to say.
    pub notes: Vec<String>,
}

impl Row {
    /// API writes per tool step that the record costs: status writes plus segment creates
    /// (docs/design.md section 4a: sealing rides on a status write and adds one create).
    pub fn writes_per_step(&self) -> Option<f64> {
        let writes = self.status_writes? + self.segment_creates.unwrap_or(0);
        (self.tool_steps > 0).then(|| writes as f64 / self.tool_steps as f64)
    }

    /// Tool steps per second.
    pub fn steps_per_sec(&self) -> Option<f64> {
        let elapsed = self.elapsed?.as_secs_f64();
        (self.tool_steps > 0 && elapsed > 0.0).then(|| self.tool_steps as f64 / elapsed)
    }

    /// Runs settled per second.
    pub fn runs_per_sec(&self) -> Option<f64> {
        let elapsed = self.elapsed?.as_secs_f64();
        (elapsed > 0.0).then(|| self.runs as f64 / elapsed)
    }

    /// The runtime's steps/s over the floor's (bare writes/s ÷ writes per step).
    pub fn floor_ratio(&self) -> Option<f64> {
        let floor_steps = self.floor_writes_per_sec? / self.writes_per_step()?;
        Some(self.steps_per_sec()? / floor_steps)
    }

    /// Controller CPU seconds per 1000 tool steps.
    pub fn cpu_per_1000_steps(&self) -> Option<f64> {
        (self.tool_steps > 0).then(|| self.controller_cpu * 1000.0 / self.tool_steps as f64)
    }
}

/// The `q` quantile (0..=1) of `samples` by nearest rank; `None` when empty.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1000.0))
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()))
}

fn num(v: Option<f64>, places: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.places$}"))
}

/// The table: one line per workload.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let header = [
        "workload",
        "runs",
        "steps/run",
        "controllers",
        "writes/tool step",
        "steps/s",
        "runs/s",
        "overhead p50 ms",
        "overhead p99 ms",
        "bare CAS writes/s",
        "ratio to floor",
        "takeover p50 s",
        "takeover p99 s",
        "peak RSS MiB",
        "largest run KiB",
        "segments",
        "CPU s/1000 steps",
        "outcome",
    ];
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        header.iter().map(|_| "---|").collect::<String>()
    );
    for row in rows {
        let cells = [
            row.workload.clone(),
            row.runs.to_string(),
            row.steps_per_run.to_string(),
            row.controllers.to_string(),
            num(row.writes_per_step(), 3),
            num(row.steps_per_sec(), 1),
            num(row.runs_per_sec(), 2),
            ms(quantile(&row.overheads, 0.5)),
            ms(quantile(&row.overheads, 0.99)),
            num(row.floor_writes_per_sec, 0),
            num(row.floor_ratio(), 2),
            secs(quantile(&row.takeovers, 0.5)),
            secs(quantile(&row.takeovers, 0.99)),
            num(row.peak_rss.map(|b| b as f64 / (1024.0 * 1024.0)), 1),
            num(row.largest_object_bytes.map(|b| b as f64 / 1024.0), 0),
            row.segments.map_or("-".into(), |n| n.to_string()),
            num(row.cpu_per_1000_steps(), 2),
            row.outcome.clone(),
        ];
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// The notes under the table: per workload, what else was measured.
pub fn notes(rows: &[Row]) -> String {
    let mut out = String::new();
    for row in rows {
        let _ = writeln!(out, "- {}:", row.workload);
        if !row.writes_by_resource.is_empty() {
            let writes: Vec<String> = row
                .writes_by_resource
                .iter()
                .map(|(what, n)| format!("{what} {n}"))
                .collect();
            let _ = writeln!(
                out,
                "  - API writes in the namespace: {} (tool steps {})",
                writes.join(", "),
                row.tool_steps
            );
        }
        if !row.requests.is_empty() && row.runs > 0 {
            let total: u64 = row.requests.values().sum();
            let per_run = |n: u64| n as f64 / row.runs as f64;
            let each: Vec<String> = row
                .requests
                .iter()
                .map(|((verb, what), n)| format!("{verb} {what} {:.2}", per_run(*n)))
                .collect();
            let own: u64 = row
                .requests
                .iter()
                .filter(|((_, what), _)| super::target::is_cluster_own(what))
                .map(|(_, n)| n)
                .sum();
            let split = if own > 0 {
                format!(
                    "; agentrt and the workload {:.2}, the cluster's own components {:.2}",
                    per_run(total - own),
                    per_run(own)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  - API requests per run: {:.2}{split} ({})",
                per_run(total),
                each.join(", ")
            );
        }
        if row.tool_steps > 0 {
            let _ = writeln!(
                out,
                "  - CPU: controllers {:.2} s, benchmark process (embedded API server, tool server, watch) {:.2} s",
                row.controller_cpu, row.bench_cpu
            );
        }
        for note in &row.notes {
            let _ = writeln!(out, "  - {note}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_taken_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&samples, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(
            quantile(&samples[..1], 0.99),
            Some(Duration::from_millis(1))
        );
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_ratio_compares_steps_per_second_with_the_floor() {
        let row = Row {
            tool_steps: 100,
            status_writes: Some(110),
            elapsed: Some(Duration::from_secs(1)),
            floor_writes_per_sec: Some(220.0),
            ..Row::default()
        };
        // The floor allows 220 / 1.1 = 200 steps/s; the runtime made 100.
        assert!((row.floor_ratio().unwrap() - 0.5).abs() < 1e-9);
        assert!(table(std::slice::from_ref(&row)).lines().count() == 3);
        // A segment create is an API write the record costs too.
        let sealed = Row {
            segment_creates: Some(10),
            ..row
        };
        assert!((sealed.writes_per_step().unwrap() - 1.2).abs() < 1e-9);
    }
}
