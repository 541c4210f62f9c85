//! The `agentrt` command line (docs/design.md section 7): `controller`, `dev`, `crds`, `bench`,
//! `console`.
//!
//! Exit codes (docs/behaviours.md 53): 0 success, 1 error, 2 usage (clap's own exit code for bad
//! arguments). Arguments are validated by clap before any API server is contacted.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: the controller and the embedded API server build
/// and drop many short-lived JSON trees per request, where glibc's malloc spent a fifth of their
/// CPU time (docs/performance.md). The `system-allocator` feature leaves the system's in place
/// for heap profilers that hook `malloc`.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`), before any
/// thread starts: mimalloc asks for them on its arenas, and the kernel then backs each fresh
/// span with a zeroed 2 MiB page and counts all of it as resident. With them, clearing those pages
/// was a tenth of the embedded API server's CPU samples in `agentrt bench --workload wide`, and a
/// controller's peak RSS was 81-115 MiB where without them it is 58-75 MiB (docs/performance.md,
/// session 19). The setting is the process's own (children get it too); nothing else changes. A
/// kernel without the call leaves things as they were.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// agentrt runs tool-using AI agents durably on Kubernetes.
///
/// Apply an AgentRun with kubectl; the controller runs its loop, pauses on Approvals a person
/// patches, and never repeats a side effect because a process died.
#[derive(Parser, Debug)]
#[command(name = "agentrt", version, propagate_version = true)]
struct Cli {
    /// Log format: `text` (human) or `json` (one object per line).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the operator: watch AgentRuns and execute the runs whose Lease this replica holds.
    Controller(agentrt::controller::ControllerArgs),
    /// Start the embedded Kubernetes-API-compatible server (loopback only) for trying agentrt
    /// and for tests; writes a kubeconfig that kubectl can use.
    Dev(agentrt::controller::dev::DevArgs),
    /// Print the AgentRun, AgentRunSegment and Approval CustomResourceDefinitions as YAML (what
    /// crds/ holds), or with `--markdown` the field reference docs/reference.md holds.
    Crds(CrdsArgs),
    /// Measure the runtime: writes per tool step, throughput against the API server's bare
    /// compare-and-set write loop, takeover latency after SIGKILL, controller memory and CPU
    /// (starts an embedded API server, a tool server and controller processes).
    Bench(agentrt::bench::BenchArgs),
    /// Serve a web page on loopback for deciding Approvals as your kubeconfig's user: the
    /// inbox, each Approval, approve and reject. Prints the URL, with its token, last.
    Console(agentrt::console::ConsoleArgs),
    #[command(flatten)]
    Operator(agentrt::cli::OperatorCommand),
}

/// `agentrt crds` options.
#[derive(clap::Args, Debug)]
struct CrdsArgs {
    /// Print the field reference (Markdown, one table per CRD, as docs/reference.md holds)
    /// instead of the CRDs' YAML.
    #[arg(long)]
    markdown: bool,
}

/// The error chain as one line, with an API server's answer given once, as its message (the
/// `Status` it sent: `agentruns.agentrt.dev "nosuch" not found`), never as a Rust debug dump nor
/// followed by the same message again from the error's own source.
fn describe(err: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in err.chain() {
        if let Some(kube_err @ kube::Error::Api(_)) = cause.downcast_ref::<kube::Error>() {
            // Its source is the same Status displayed as `message: reason`: said once here.
            parts.push(agentrt::controller::cluster::server_message(kube_err));
            break;
        }
        parts.push(cause.to_string());
    }
    parts.into_iter().fold(String::new(), |mut line, part| {
        // Many errors repeat their source in their own message; say each thing once.
        if !line.contains(&part) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&part);
        }
        line
    })
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    // Installed as `kubectl-agentrt`, kubectl runs this binary with the words after
    // `kubectl agentrt`, so the plugin needs no parsing of its own.
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Operator(_) | Command::Bench(_) | Command::Console(_) => "warn",
        _ => "info",
    };
    let _telemetry = agentrt::telemetry::init(&cli.log_format, default_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let outcome: anyhow::Result<()> = runtime.block_on(async move {
        match cli.command {
            Command::Controller(args) => agentrt::controller::run(args).await,
            Command::Dev(args) => agentrt::controller::dev::run(args).await,
            Command::Operator(command) => agentrt::cli::run(command).await,
            Command::Console(args) => agentrt::console::run(args).await,
            Command::Bench(args) => agentrt::bench::run(args).await,
            Command::Crds(args) => {
                let text = if args.markdown {
                    agentrt::api::reference_markdown()?
                } else {
                    agentrt::api::crds_yaml()?
                };
                agentrt::cli::emit(&text)?;
                Ok(())
            }
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::from(1)
        }
    }
}
