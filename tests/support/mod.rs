//! Test support shared by the integration tests (`mod support;` in a test file).
//!
//! - [`cluster`]: a Kubernetes API to test against: the real `agentrt dev` binary as a child
//!   process, or a real cluster when `AGENTRT_TEST_KUBECONFIG` is set; a fresh namespace per
//!   test; a `kube::Client`; and kubectl.
//! - [`fixtures`]: paths of the YAML manifests under `tests/fixtures/`.
#![allow(dead_code)]

pub mod cluster;

/// Paths of the YAML manifests under `tests/fixtures/`.
pub mod fixtures {
    use std::path::PathBuf;

    /// `tests/fixtures/<relative>`.
    pub fn path(relative: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(relative)
    }

    /// `tests/fixtures/devcluster/<name>`.
    pub fn devcluster(name: &str) -> PathBuf {
        path("devcluster").join(name)
    }
}
pub mod controller;
pub mod modelserver;
pub mod proxy;
pub mod toolserver;
