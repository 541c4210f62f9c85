//! The controller's admission webhook registered with a real kube-apiserver for one test's
//! namespace: a CA and a serving certificate for 127.0.0.1 made with openssl, the controller
//! started with `--webhook-addr` and `--webhook-cert-dir`, and a ValidatingWebhookConfiguration
//! (deleted when the [`Registered`] guard drops) whose `namespaceSelector` keeps it to that
//! namespace. (`tests/admission_webhook.rs` carries its own copy of these steps.)

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::cluster::TestCluster;
use super::controller::{ControllerProcess, ControllerSpec};

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A controller serving the webhook, registered for the cluster's namespace; the registration
/// is deleted on drop (the controller stops with its process guard).
pub struct Registered<'a> {
    cluster: &'a TestCluster,
    name: String,
    /// The controller serving the webhook.
    pub controller: ControllerProcess,
    _certs: tempfile::TempDir,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
        ]);
    }
}

/// Starts a controller (named `prefix`) serving the webhook on a free loopback port and
/// registers it with the (real) API server for AgentRuns of the cluster's namespace.
pub async fn register<'a>(cluster: &'a TestCluster, prefix: &str) -> Registered<'a> {
    let ns = cluster.namespace().to_string();
    let certs = tempfile::tempdir().expect("tempdir");
    certificates(certs.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = std::fs::read(certs.path().join("ca.crt")).expect("ca.crt");
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
                "caBundle": base64_encode(&ca),
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
    Registered {
        cluster,
        name,
        controller,
        _certs: certs,
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
