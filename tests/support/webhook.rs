//! The controller's admission webhook served to a real kube-apiserver: a CA and a serving
//! certificate for 127.0.0.1 (openssl), a controller child process with `--webhook-addr`, and a
//! ValidatingWebhookConfiguration (`clientConfig.url` on loopback, its caBundle) holding only in
//! the test's namespace, deleted when the test ends however it ends.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::cli::text;
use super::cluster::TestCluster;
use super::controller::{ControllerProcess, ControllerSpec};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
}

/// A CA and a serving certificate for 127.0.0.1 in `dir` (`ca.crt`, `tls.crt`, `tls.key`).
pub fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=agentrt-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("san.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "tls.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

/// A served webhook: the controller answering it and its registration, deleted on drop.
pub struct ServedWebhook<'a> {
    /// The controller child process serving the webhook (and running the namespace's runs).
    pub controller: ControllerProcess,
    cluster: &'a TestCluster,
    name: String,
    _certs: tempfile::TempDir,
}

impl Drop for ServedWebhook<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
        ]);
    }
}

/// Starts a controller (`prefix`) on `kubeconfig` serving the webhook, and registers it for
/// AgentRun creates and updates in the test's namespace. kube-apiserver loads a new webhook
/// configuration on its own time: a test waits for a first refusal before relying on it.
pub fn serve<'a>(cluster: &'a TestCluster, kubeconfig: &Path, prefix: &str) -> ServedWebhook<'a> {
    let ns = cluster.namespace().to_string();
    let certs = tempfile::tempdir().expect("tempdir");
    certificates(certs.path());
    let port = super::free_port();
    let addr = format!("127.0.0.1:{port}");
    let controller = ControllerProcess::spawn(
        kubeconfig,
        &ns,
        ControllerSpec {
            extra: vec![
                "--webhook-addr".into(),
                addr.clone(),
                "--webhook-cert-dir".into(),
                certs.path().display().to_string(),
            ],
            ..ControllerSpec::named(prefix)
        },
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the webhook never listened on {addr}:\n{}",
            controller.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ca = std::fs::read(certs.path().join("ca.crt")).expect("ca.crt");
    let ca_bundle = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&ca)
    };
    let name = format!("agentrt-test-{ns}");
    let configuration = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "agentruns.agentrt.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "url": format!("https://{addr}/validate-agentrun"),
                "caBundle": ca_bundle,
            },
            "rules": [{
                "apiGroups": ["agentrt.dev"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["agentruns"],
            }],
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": [ns],
            }]},
        }],
    });
    let out = cluster.kubectl_stdin(&["apply", "-f", "-"], &configuration.to_string());
    assert!(out.status.success(), "{}", text(&out));
    ServedWebhook {
        controller,
        cluster,
        name,
        _certs: certs,
    }
}

/// [`serve`] with the cluster's own (admin) kubeconfig for the controller.
pub async fn register<'a>(cluster: &'a TestCluster, prefix: &str) -> ServedWebhook<'a> {
    serve(cluster, cluster.kubeconfig(), prefix)
}
