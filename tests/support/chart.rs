//! The Helm chart rendered for a test, and kubeconfigs authenticated as a ServiceAccount (a token
//! from `kubectl create token`), for scenarios that run the controller with exactly the chart's
//! RBAC on a real API server.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::cluster::TestCluster;

/// `helm template RELEASE charts/agentrt -n NAMESPACE [--set S]... [extra]...` as YAML text.
pub fn render(release: &str, namespace: &str, sets: &[String], extra: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(super::helm::helm());
    cmd.args([
        "template",
        release,
        "charts/agentrt",
        "--namespace",
        namespace,
    ])
    .current_dir(root);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd.args(extra);
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm prints UTF-8")
}

/// A release name no other test uses (cluster-scoped objects are named after it).
pub fn release() -> String {
    format!("agentrt-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// A kubeconfig for the cluster whose only credential is a token of ServiceAccount `sa` of the
/// test's namespace.
pub fn service_account_kubeconfig(cluster: &TestCluster, sa: &str) -> PathBuf {
    let token = cluster.kubectl_ok(&["create", "token", sa, "--duration=1h"]);
    let admin = std::fs::read_to_string(cluster.kubeconfig()).expect("kubeconfig readable");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).expect("kubeconfig YAML");
    let users = config["users"].as_sequence_mut().expect("kubeconfig users");
    for user in users.iter_mut() {
        let mut credentials = serde_yaml::Mapping::new();
        credentials.insert("token".into(), token.trim().into());
        user["user"] = serde_yaml::Value::Mapping(credentials);
    }
    let path = cluster.dir().join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}

/// Deletes the rendered objects (`yaml`) when dropped, however the test ends: the chart's
/// cluster-scoped roles outlive the test's namespace otherwise.
pub struct Installed<'a> {
    /// The cluster they were applied to.
    pub cluster: &'a TestCluster,
    /// The objects, as rendered.
    pub yaml: String,
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl_stdin(
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            &self.yaml,
        );
    }
}
