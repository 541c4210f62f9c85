//! The controllers a benchmark runs: real `agentrt controller` child processes of the current
//! binary (so their CPU time and memory are their own, and SIGKILL is a real crash), each
//! watching the workload's namespace, serving metrics on a loopback port, logging to a file.
//!
//! What it reads of them: CPU seconds (`/proc/PID/stat`, user + system), resident memory now
//! and at its peak (`VmRSS`, `VmHWM` of `/proc/PID/status`), `/readyz`, and `/metrics`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// One controller child process; killed when dropped.
pub struct Controller {
    child: Child,
    /// Its `--holder-id` prefix.
    pub name: String,
    /// Where it serves `/metrics`.
    pub metrics_addr: SocketAddr,
    log: PathBuf,
}

/// How to start the controllers of one workload.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The binary (`agentrt`).
    pub exe: PathBuf,
    /// The kubeconfig the controllers use.
    pub kubeconfig: PathBuf,
    /// The namespace they watch.
    pub namespace: String,
    /// Where their logs go.
    pub log_dir: PathBuf,
    /// `AGENTRT_LOG` for them.
    pub log_filter: String,
    /// More arguments (`--max-concurrent-runs`, ...).
    pub extra: Vec<String>,
}

/// A free loopback port (bound and let go; the controller binds it right after).
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

impl Controller {
    /// Starts `agentrt controller` named `name`.
    ///
    /// # Errors
    /// When the process cannot be started or its log file created.
    pub fn spawn(launch: &Launch, name: &str) -> anyhow::Result<Controller> {
        std::fs::create_dir_all(&launch.log_dir)?;
        let log = launch
            .log_dir
            .join(format!("{}-{name}.log", launch.namespace));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let metrics_addr = free_port()?;
        // AGENTRT_BENCH_CONTROLLER_WRAPPER (e.g. `heaptrack`) starts each controller under
        // that program (docs/performance.md, "Profiling memory").
        let mut command = match std::env::var_os("AGENTRT_BENCH_CONTROLLER_WRAPPER") {
            Some(wrapper) if !wrapper.is_empty() => {
                let mut command = Command::new(wrapper);
                command.arg(&launch.exe);
                command
            }
            _ => Command::new(&launch.exe),
        };
        let child = command
            .arg("controller")
            .arg("--kubeconfig")
            .arg(&launch.kubeconfig)
            .arg("--namespace")
            .arg(&launch.namespace)
            .arg("--holder-id")
            .arg(name)
            .arg("--metrics-addr")
            .arg(metrics_addr.to_string())
            .args(&launch.extra)
            .env("AGENTRT_LOG", &launch.log_filter)
            .env_remove("AGENTRT_FAULT")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {}", launch.exe.display()))?;
        Ok(Controller {
            child,
            name: name.to_string(),
            metrics_addr,
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// Where its log is.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits until `/readyz` answers 200 (its watches started).
    ///
    /// # Errors
    /// When it exits or is not ready within `timeout`.
    pub async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://{}/readyz", self.metrics_addr);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                anyhow::bail!(
                    "controller {} exited ({status}) before it was ready; see {}",
                    self.name,
                    self.log.display()
                );
            }
            if let Ok(response) = http.get(&url).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "controller {} not ready within {timeout:?}; see {}",
                    self.name,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its `/metrics` text.
    ///
    /// # Errors
    /// When it does not answer.
    pub async fn metrics(&self, http: &reqwest::Client) -> anyhow::Result<String> {
        Ok(http
            .get(format!("http://{}/metrics", self.metrics_addr))
            .send()
            .await?
            .text()
            .await?)
    }

    /// User + system CPU seconds so far (0 when `/proc` cannot tell).
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(self.pid())
    }

    /// Resident memory now and at its peak, in bytes (`VmRSS`, `VmHWM`).
    pub fn rss(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        (
            kib_field(&status, "VmRSS:") * 1024,
            kib_field(&status, "VmHWM:") * 1024,
        )
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (graceful: leases released), then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        // SAFETY: kill(2) on a child this process started and has not reaped.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// User + system CPU seconds of process `pid` (fields 14 and 15 of `/proc/PID/stat`).
pub fn cpu_seconds_of(pid: i32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name (field 2) may hold spaces; the fields after it follow its `)`.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After `)`: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    ticks as f64 / hz
}

fn kib_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The metrics exposition of each controller that answers (one GET each; one that does not is
/// left out).
pub async fn expositions(controllers: &[Controller], http: &reqwest::Client) -> Vec<String> {
    let mut texts = Vec::with_capacity(controllers.len());
    for controller in controllers {
        if let Ok(text) = controller.metrics(http).await {
            texts.push(text);
        }
    }
    texts
}

/// Sums metric `name` (every label set) over the controllers' `expositions`.
pub fn summed(expositions: &[String], name: &str) -> f64 {
    expositions.iter().map(|text| metric_sum(text, name)).sum()
}

/// Sums the samples of metric `name` (every label set) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The value of the one sample `series` (name and labels exactly as exposed; 0 when absent).
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_time_of_this_process_is_read_from_proc() {
        let pid = i32::try_from(std::process::id()).unwrap();
        assert!(cpu_seconds_of(pid) >= 0.0);
        assert_eq!(cpu_seconds_of(-1), 0.0);
    }

    #[test]
    fn metric_samples_are_summed_over_their_labels() {
        let text = "# HELP x\nagentrt_status_writes_total{outcome=\"ok\"} 3\nagentrt_status_writes_total{outcome=\"conflict\"} 1\nagentrt_other 9\n";
        assert_eq!(metric_sum(text, "agentrt_status_writes_total"), 4.0);
        assert_eq!(metric_sum(text, "agentrt_missing"), 0.0);
        assert_eq!(
            metric_value(text, "agentrt_status_writes_total{outcome=\"conflict\"}"),
            1.0
        );
    }
}
