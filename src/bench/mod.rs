//! `agentrt bench`: the performance figures of docs/design.md section 10, measured end to end. It
//! starts the embedded API server in this process (or uses `--kubeconfig`), a loopback tool
//! server, and controllers as real child processes of this binary; runs the chosen workloads;
//! and prints one table (Markdown) with notes. `docs/performance.md` records one run of it.
//!
//! What it owns: driving workloads and measuring them. What it must not do: change how the
//! runtime behaves (the controllers are the real binary with default settings) or assert
//! anything: the targets are reported, not enforced.
//!
//! The rooms:
//! - [`target`]: the API server (embedded or a cluster), creating runs, watching them settle,
//!   counting writes from the audit log.
//! - [`controllers`]: controller child processes, their CPU time, memory and metrics.
//! - [`tools`]: the tool server and the step overheads it observes.
//! - [`manifests`]: the runs the workloads create.
//! - [`throughput`]: long runs, many concurrent runs, runs waiting for approval.
//! - [`takeover`]: SIGKILL of the active controller, repeatedly.
//! - [`recorder`]: a raw watch of a workload's runs: the largest object, and the statuses the
//!   floor replays.
//! - [`floor`]: the bare compare-and-set status-write loop the throughput is compared with.
//! - [`report`]: the table.

pub mod controllers;
pub mod floor;
pub mod manifests;
pub mod recorder;
pub mod report;
pub mod takeover;
pub mod target;
pub mod throughput;
pub mod tools;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use controllers::{Controller, Launch};
use target::Target;
use throughput::Plan;

/// The workloads `agentrt bench` can run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One run of many steps with small tool answers (default 1 × 2000; `--steps 400` for the
    /// older figure). Beyond 2,000 steps its agent is the tool server's webhook agent, not a
    /// scripted one (a scripted agent lists every decision in the run's spec).
    Long,
    /// One run of many steps with large tool answers (default 1 × 2000, 8 KiB answers).
    LongLarge,
    /// Many concurrent runs of a few steps (default 1000 × 10).
    Wide,
    /// Many runs parked waiting for approval; the controller's memory (default 10,000).
    Idle,
    /// SIGKILL of the controller holding a run, repeatedly; the takeover latency.
    Takeover,
    /// Many runs across three controllers, for a real API server (default 10,000 × 10,
    /// `--controllers` 3 unless given): runs/s, time from create to finished, requests per run.
    Scale,
}

/// Arguments of `agentrt bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The workloads to run, in order (repeat or comma-separate; default: all).
    #[arg(long = "workload", value_enum, value_delimiter = ',')]
    pub workloads: Vec<Workload>,
    /// Runs per workload (overrides the defaults: long 1, wide 1000, idle 10000).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Tool steps per run (overrides the defaults: long 2000, wide 10).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Controller processes per workload (default 2; `scale` 3; the takeover workload always
    /// runs an active one and a standby).
    #[arg(long)]
    pub controllers: Option<usize>,
    /// Size of the large tool answers, in bytes.
    #[arg(long, default_value_t = 8192)]
    pub answer_bytes: usize,
    /// SIGKILLs in the takeover workload.
    #[arg(long, default_value_t = 10)]
    pub kills: usize,
    /// The lease duration of the takeover workload's run, in seconds.
    #[arg(long, default_value_t = 5)]
    pub lease_seconds: i64,
    /// How long each call of the takeover workload's tool takes, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub slow_tool_ms: u64,
    /// Runs of the same slow tool the takeover workload creates after each standby starts, so
    /// that the replica taking over is busy (it executes some of them, and so waits out its
    /// watch's lag as any busy replica does); default 0: the standby executes nothing before.
    #[arg(long, default_value_t = 0)]
    pub busy_runs: usize,
    /// Skip the bare compare-and-set write loop.
    #[arg(long)]
    pub no_floor: bool,
    /// Run against this cluster (CRDs installed) instead of the embedded API server; API writes
    /// are then counted from the controllers' metrics.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// With `--kubeconfig`: that API server's audit log (JSON lines), from which every request
    /// of a workload is counted by verb and resource.
    #[arg(long, requires = "kubeconfig")]
    pub audit_log: Option<PathBuf>,
    /// Where the controllers' logs, the audit log and the kubeconfig go (default: a new
    /// directory under the system's temp directory, kept).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// `AGENTRT_LOG` for the controllers.
    #[arg(long, default_value = "info,kube=warn,hyper=warn,tower=warn")]
    pub controller_log: String,
    /// One more argument for every controller the workloads start, after the benchmark's own
    /// (repeat it; `--controller-arg=--max-concurrent-runs=32`), to measure a setting: for
    /// example `--event-batch-seconds=30` or `--max-concurrent-runs=32`.
    #[arg(
        long = "controller-arg",
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    pub controller_args: Vec<String>,
    /// Give up on a workload after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_seconds: u64,
}

/// What the workloads share.
pub struct Bench {
    /// The API server.
    pub target: Target,
    /// The tool server.
    pub tools: tools::ToolServer,
    /// An HTTP client for the controllers' metrics.
    pub http: reqwest::Client,
    /// How the takeover workload's tool is slow.
    pub slow: Duration,
    /// Measure the floor.
    pub floor: bool,
    /// How long a workload may take.
    pub timeout: Duration,
    launch: Launch,
    suffix: String,
}

impl Bench {
    /// A new namespace `bench-<name>-<suffix>`.
    ///
    /// # Errors
    /// When the API server refuses it.
    pub async fn fresh_namespace(&self, name: &str) -> anyhow::Result<String> {
        let ns = format!("bench-{name}-{}", self.suffix);
        self.target.namespace(&ns).await?;
        Ok(ns)
    }

    /// Starts `count` controllers watching `namespace` (named `names`, else `c0`, `c1`, …) and
    /// waits until they are ready.
    ///
    /// # Errors
    /// When one does not start or become ready.
    pub async fn start_controllers(
        &self,
        namespace: &str,
        count: usize,
        names: &[&str],
    ) -> anyhow::Result<Vec<Controller>> {
        let launch = Launch {
            namespace: namespace.to_string(),
            ..self.launch.clone()
        };
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let name = names
                .get(i)
                .map_or_else(|| format!("c{i}"), |n| (*n).to_string());
            out.push(Controller::spawn(&launch, &name)?);
        }
        for controller in &mut out {
            controller
                .wait_ready(&self.http, Duration::from_secs(60))
                .await?;
        }
        Ok(out)
    }
}

/// User + system CPU seconds of this process.
pub fn own_cpu_seconds() -> f64 {
    controllers::cpu_seconds_of(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
}

/// Runs `agentrt bench`.
///
/// # Errors
/// When the API server, the tool server or a workload fails.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let out_dir = match &args.out_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("agentrt-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let target = match &args.kubeconfig {
        Some(path) => Target::external(path, args.audit_log.as_deref()).await?,
        None => Target::embedded(&out_dir).await?,
    };
    let stop = CancellationToken::new();
    let slow = Duration::from_millis(args.slow_tool_ms);
    let tools = tools::ToolServer::start(args.answer_bytes, slow, stop.clone()).await?;
    let bench = Bench {
        launch: Launch {
            exe: std::env::current_exe().context("cannot find this binary to start controllers")?,
            kubeconfig: target.kubeconfig.clone(),
            namespace: String::new(),
            log_dir: out_dir.join("logs"),
            log_filter: args.controller_log.clone(),
            extra: args.controller_args.clone(),
        },
        target,
        tools,
        http: reqwest::Client::builder().no_proxy().build()?,
        slow,
        floor: !args.no_floor,
        timeout: Duration::from_secs(args.timeout_seconds),
        suffix: format!("{:04x}", rand::random::<u16>()),
    };
    let workloads = if args.workloads.is_empty() {
        vec![
            Workload::Long,
            Workload::LongLarge,
            Workload::Wide,
            Workload::Idle,
            Workload::Takeover,
        ]
    } else {
        args.workloads.clone()
    };
    eprintln!(
        "agentrt bench: API server {}, logs and audit log in {}",
        if bench.target.is_embedded() {
            "embedded (in this process)"
        } else {
            "from --kubeconfig"
        },
        out_dir.display()
    );
    if !args.controller_args.is_empty() {
        eprintln!(
            "agentrt bench: every controller also gets {}",
            args.controller_args.join(" ")
        );
    }
    let mut rows = Vec::new();
    for workload in workloads {
        let plan =
            |name: &str, runs: usize, steps: usize, tool: &'static str, waiting: bool| Plan {
                name: name.to_string(),
                runs: args.runs.unwrap_or(runs),
                steps: args.steps.unwrap_or(steps),
                tool,
                controllers: args
                    .controllers
                    .unwrap_or(if name == "scale" { 3 } else { 2 })
                    .max(1),
                waiting,
            };
        eprintln!("agentrt bench: {workload:?}…");
        let row = match workload {
            Workload::Long => throughput::run(&bench, &plan("long", 1, 2000, "small", false)).await,
            Workload::LongLarge => {
                throughput::run(&bench, &plan("long-large", 1, 2000, "large", false)).await
            }
            Workload::Wide => {
                throughput::run(&bench, &plan("wide", 1000, 10, "small", false)).await
            }
            Workload::Idle => {
                throughput::run(&bench, &plan("idle", 10_000, 1, "refund", true)).await
            }
            Workload::Takeover => {
                takeover::run(&bench, args.kills, args.lease_seconds, args.busy_runs).await
            }
            Workload::Scale => {
                throughput::run(&bench, &plan("scale", 10_000, 10, "small", false)).await
            }
        }
        .with_context(|| format!("workload {workload:?}"))?;
        let mut row = row;
        if !args.controller_args.is_empty() {
            // Saved with the figures, so a row measured with a setting never reads as defaults.
            row.notes.insert(
                0,
                format!(
                    "every controller also got {}",
                    args.controller_args.join(" ")
                ),
            );
        }
        eprint!("{}", report::table(std::slice::from_ref(&row)));
        rows.push(row);
    }
    println!("{}", report::table(&rows));
    println!("{}", report::notes(&rows));
    stop.cancel();
    bench.target.shutdown().await;
    Ok(())
}
