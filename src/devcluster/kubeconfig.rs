//! The kubeconfig `agentrt dev` writes: one cluster, user and context named `agentrt-dev`,
//! pointing at `http://<addr>` with the bearer token when one is required.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::json;

use super::error::DevClusterError;

/// Name of the cluster, user and context in the kubeconfig.
pub const CONTEXT: &str = "agentrt-dev";

/// The kubeconfig YAML for a server at `addr` (with `token` when it requires one).
pub fn render(addr: SocketAddr, token: Option<&str>) -> String {
    let user = match token {
        Some(t) => json!({"token": t}),
        None => json!({}),
    };
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": format!("http://{addr}")}}],
        "users": [{"name": CONTEXT, "user": user}],
        "contexts": [{"name": CONTEXT, "context": {
            "cluster": CONTEXT, "user": CONTEXT, "namespace": "default"}}],
        "current-context": CONTEXT,
        "preferences": {},
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

/// Writes `yaml` to `path` atomically (temporary file, fsync, rename), readable only by the
/// owner since it may hold the token; creates the parent directory.
///
/// # Errors
/// [`DevClusterError::Io`] naming the path that could not be written.
pub fn write(path: &Path, yaml: &str) -> Result<(), DevClusterError> {
    super::persist::write_atomically(path, yaml.as_bytes(), 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_names_the_context_and_carries_the_token() {
        let addr: SocketAddr = "127.0.0.1:4567".parse().expect("addr");
        let yaml = render(addr, Some("s3cret"));
        let doc: serde_yaml::Value = serde_yaml::from_str(&yaml).expect("yaml");
        assert_eq!(doc["current-context"].as_str(), Some("agentrt-dev"));
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"].as_str(),
            Some("http://127.0.0.1:4567")
        );
        assert_eq!(doc["users"][0]["user"]["token"].as_str(), Some("s3cret"));
    }
}
