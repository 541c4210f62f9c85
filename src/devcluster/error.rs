//! The errors of the devcluster library boundary: starting the server, its state directory,
//! the CRDs it installs, and the client it hands out. (Refusals of API requests are
//! `status::ApiError`, rendered as Kubernetes `Status` objects instead.)

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the embedded API server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum DevClusterError {
    /// `--addr` is not a loopback address.
    #[error(
        "refusing to listen on {0}: agentrt dev serves without TLS or authorization and only \
         listens on loopback; use 127.0.0.1:<port> or [::1]:<port>"
    )]
    NotLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state file under `--data-dir` is torn or corrupt; it is never silently replaced.
    #[error(
        "state file {path} is corrupt ({reason}); refusing to start rather than lose it. Move \
         it away to start with an empty cluster"
    )]
    CorruptState {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Another `agentrt dev` already uses the data directory.
    #[error("data directory {0} is in use by another agentrt dev process")]
    DataDirLocked(PathBuf),
    /// A CRD could not be installed.
    #[error("cannot install CustomResourceDefinition {name}: {reason}")]
    Crd {
        /// The CRD's name, or the file it came from.
        name: String,
        /// Why (the API server's message).
        reason: String,
    },
    /// The server could not set itself up (built-in namespaces, the snapshot task).
    #[error("cannot set up the embedded API server: {0}")]
    Bootstrap(String),
    /// The first resourceVersion reservation under `--data-dir` could not be made.
    #[error(
        "cannot set up the embedded API server: cannot reserve resourceVersions in the data \
         directory: {0}"
    )]
    Reserve(#[source] Box<DevClusterError>),
    /// The kube client for the server could not be built.
    #[error("cannot build a client for the embedded API server: {0}")]
    Client(String),
}
