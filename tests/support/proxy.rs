//! A TCP proxy in front of the API server that can cut (reset) every connection through it, or refuse
//! new ones for a while: connection cuts and outages as a client of either server sees them
//! (the bytes are passed through untouched, so TLS to a real API server works too).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    cuts: watch::Sender<u64>,
    refusing: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let (cuts, _) = watch::channel(0u64);
        let refusing = Arc::new(AtomicBool::new(false));
        let (cut_rx, refused) = (cuts.subscribe(), refusing.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((downstream, _)) = listener.accept().await else {
                    return;
                };
                if refused.load(Ordering::SeqCst) {
                    drop(downstream);
                    continue;
                }
                let mut cut = cut_rx.clone();
                cut.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut down, mut up) = (downstream, upstream);
                    let was_cut = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => false,
                        _ = cut.changed() => true,
                    };
                    if was_cut {
                        // A reset, as a proxy or load balancer dropping the connection sends:
                        // the client sees an error, not an orderly end of the stream. (A zero
                        // linger resets at once; nothing blocks on the drop.)
                        #[allow(deprecated)]
                        let _ = down.set_linger(Some(std::time::Duration::ZERO));
                    }
                });
            }
        });
        Proxy {
            addr,
            cuts,
            refusing,
            task,
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every connection open through the proxy with a TCP reset (new ones are accepted).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and refuses new ones until [`Proxy::accept`]: the API server is
    /// down, as far as the proxy's clients can tell.
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.cut();
    }

    /// Accepts connections again after [`Proxy::refuse`].
    pub fn accept(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Writes to `out` a copy of `kubeconfig` whose servers are `proxy` (same scheme and host,
    /// the proxy's port).
    pub fn kubeconfig_through(
        kubeconfig: &std::path::Path,
        out: &std::path::Path,
        proxy: SocketAddr,
    ) {
        let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig readable");
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
        if let Some(clusters) = doc["clusters"].as_sequence_mut() {
            for cluster in clusters {
                let server = cluster["cluster"]["server"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                let rewritten = rewrite_port(&server, proxy.port());
                cluster["cluster"]["server"] = serde_yaml::Value::String(rewritten);
            }
        }
        std::fs::write(out, serde_yaml::to_string(&doc).expect("YAML"))
            .expect("kubeconfig written");
    }
}

/// The `host:port` a kubeconfig's (current) server URL names.
pub fn upstream_of(kubeconfig: &std::path::Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig readable");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("a server URL")
        .to_string();
    let authority = server
        .split("://")
        .nth(1)
        .unwrap_or(&server)
        .split('/')
        .next()
        .unwrap_or("");
    let authority = authority.replace("localhost", "127.0.0.1");
    authority
        .parse()
        .unwrap_or_else(|err| panic!("server {server}: not host:port ({err})"))
}

fn rewrite_port(server: &str, port: u16) -> String {
    let (scheme, rest) = server.split_once("://").unwrap_or(("https", server));
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    format!("{scheme}://{host}:{port}{path}")
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
