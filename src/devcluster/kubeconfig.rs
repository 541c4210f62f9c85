//! The kubeconfig `agentrt dev` writes: one cluster, user and context named `agentrt-dev`,
//! pointing at `http://<addr>` with the bearer token when one is required.
//!
//! kubectl (client-go) never sends credentials over plain HTTP, so a bearer token alone would
//! lock kubectl out. When a token is required the server URL therefore also carries it as a
//! path prefix, `http://<addr>/token/<token>`, which the server accepts in place of the
//! `Authorization` header (and strips before routing). Clients that send the header (kube-rs,
//! curl) may use either.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::json;

use super::error::DevClusterError;

/// Name of the cluster, user and context in the kubeconfig.
pub const CONTEXT: &str = "agentrt-dev";

/// The path prefix that authenticates like the bearer token: `/token/<percent-encoded>`.
pub fn token_prefix(token: &str) -> String {
    let mut out = String::from("/token/");
    for b in token.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The kubeconfig YAML for a server at `addr` (with `token` when it requires one).
pub fn render(addr: SocketAddr, token: Option<&str>) -> String {
    let (user, server) = match token {
        Some(t) => (
            json!({"token": t}),
            format!("http://{addr}{}", token_prefix(t)),
        ),
        None => (json!({}), format!("http://{addr}")),
    };
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server}}],
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
            Some("http://127.0.0.1:4567/token/s3cret")
        );
        assert_eq!(doc["users"][0]["user"]["token"].as_str(), Some("s3cret"));
        let open: serde_yaml::Value = serde_yaml::from_str(&render(addr, None)).expect("yaml");
        assert_eq!(
            open["clusters"][0]["cluster"]["server"].as_str(),
            Some("http://127.0.0.1:4567")
        );
    }

    #[test]
    fn token_prefixes_are_percent_encoded() {
        assert_eq!(token_prefix("a b/c"), "/token/a%20b%2Fc");
    }
}
