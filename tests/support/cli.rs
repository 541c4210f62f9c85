//! The `agentrt` command line (the binary under test) against a test's cluster, and what it
//! printed.

use std::process::{Command, Output, Stdio};

use super::cluster::TestCluster;

/// Its standard output followed by its standard error, as text (for assertions on what a
/// person reads, and for the message of one that fails).
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `agentrt ARGS --kubeconfig K -n NS` against `cluster`'s namespace, standard input closed;
/// waits for it to exit and returns what it printed and its status. Panics only when the
/// binary cannot be started.
pub fn agentrt(cluster: &TestCluster, args: &[&str]) -> Output {
    agentrt_in(cluster, cluster.namespace(), args)
}

/// [`agentrt`] in namespace `namespace` instead of the test's own.
pub fn agentrt_in(cluster: &TestCluster, namespace: &str, args: &[&str]) -> Output {
    agentrt_with_env(cluster, namespace, args, &[])
}

/// [`agentrt_in`] with the environment variables `env` set for it.
pub fn agentrt_with_env(
    cluster: &TestCluster,
    namespace: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentrt"));
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .arg("-n")
        .arg(namespace)
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("agentrt runs")
}

/// The words of line `n` of a table kubectl printed (`0`: the header), split at white space;
/// none when it has no such line. (A cell left empty shifts the words after it.)
pub fn table_row(table: &str, n: usize) -> Vec<&str> {
    table
        .lines()
        .nth(n)
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}
