//! `agentrt console` as a child process against a test's cluster, and a headless chromium
//! driven over chromedriver's WebDriver HTTP API (W3C WebDriver, with reqwest): Debian's
//! `chromium` and `chromium-driver`, installed by `scripts/install-browser` when missing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cluster::TestCluster;

/// A running `agentrt console`; killed when dropped.
pub struct ConsoleProcess {
    child: Child,
    /// The URL it printed last on standard output (with its token).
    pub url: String,
    /// Everything it printed on standard output.
    pub stdout: Arc<Mutex<Vec<String>>>,
    /// Everything it printed on standard error.
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl ConsoleProcess {
    /// `agentrt console --kubeconfig K ARGS` (e.g. `--addr 127.0.0.1:0`, `-n NS`); waits up to
    /// 30 s for the URL line. `Err` with what it printed when it exits or prints none.
    pub fn try_start(kubeconfig: &Path, args: &[&str]) -> Result<ConsoleProcess, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt"))
            .arg("console")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("agentrt console starts: {e}"))?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        for (pipe, lines) in [
            (
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
                stdout.clone(),
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
                stderr.clone(),
            ),
        ] {
            let pipe = pipe.expect("piped");
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().expect("lines").push(line);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let url = stdout
                .lock()
                .expect("lines")
                .last()
                .filter(|l| l.starts_with("http://"))
                .cloned();
            if let Some(url) = url {
                return Ok(ConsoleProcess {
                    child,
                    url,
                    stdout,
                    stderr,
                });
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                std::thread::sleep(Duration::from_millis(200));
                return Err(format!(
                    "agentrt console printed no URL ({exited:?}): {:?} {:?}",
                    stdout.lock().expect("lines"),
                    stderr.lock().expect("lines")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`ConsoleProcess::try_start`] on a free loopback port as the cluster's user, showing
    /// the test's namespace; panics when it does not start.
    pub fn start(cluster: &TestCluster) -> ConsoleProcess {
        Self::start_as(cluster, cluster.kubeconfig())
    }

    /// [`ConsoleProcess::start`] acting with `kubeconfig` (another user).
    pub fn start_as(cluster: &TestCluster, kubeconfig: &Path) -> ConsoleProcess {
        Self::try_start(
            kubeconfig,
            &["--addr", "127.0.0.1:0", "-n", cluster.namespace()],
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `http://host:port` of the URL.
    pub fn origin(&self) -> String {
        let rest = self.url.trim_start_matches("http://");
        format!("http://{}", rest.split('/').next().unwrap_or(rest))
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The chromedriver binary, installed once per test process by `scripts/install-browser`.
pub fn chromedriver() -> PathBuf {
    static DRIVER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DRIVER
        .get_or_init(|| super::installed_by("scripts/install-browser"))
        .clone()
}

/// Where screenshots are kept: `target/console-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// A chromedriver process and one headless chromium session; both ended when dropped.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    base: String,
    session: String,
}

/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Starts chromedriver on a free port and a headless chromium session.
    pub async fn start() -> Browser {
        let port = super::free_port();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver answers within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A confirm dialog stays open until the test accepts it ([`Browser::accept_alert`]).
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1400,1000"]
            }
        }}});
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session JSON");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Browser {
            driver,
            http,
            base,
            session,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        answer["value"].clone()
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The element matching CSS `selector`, waiting up to 15 s; panics with the page's source.
    pub async fn find(&self, selector: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let found = self
                .call(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": selector})),
                )
                .await;
            if let Some(id) = found[ELEMENT].as_str() {
                return id.to_string();
            }
            if Instant::now() > deadline {
                panic!(
                    "no {selector} in the page ({found}): {}",
                    self.source().await
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The visible text of the element matching `selector`.
    pub async fn text(&self, selector: &str) -> String {
        let id = self.find(selector).await;
        let text = self
            .call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await;
        text.as_str().unwrap_or_default().to_string()
    }

    /// Clicks the element matching `selector` (a submit waits for the next page).
    pub async fn click(&self, selector: &str) {
        let id = self.find(selector).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Types `text` into the element matching `selector`.
    pub async fn type_into(&self, selector: &str, text: &str) {
        let id = self.find(selector).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Presses and releases `key` (one character) on the page, as a person typing it.
    pub async fn press(&self, key: &str) {
        let actions = json!({"actions": [{"type": "key", "id": "keyboard", "actions": [
            {"type": "keyDown", "value": key}, {"type": "keyUp", "value": key}
        ]}]});
        self.call(reqwest::Method::POST, "/actions", Some(actions))
            .await;
    }

    /// Accepts the page's `confirm` dialog (WebDriver's user prompt), waiting up to 10 s for it
    /// to open; panics when none does.
    pub async fn accept_alert(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self
                .call(reqwest::Method::POST, "/alert/accept", Some(json!({})))
                .await;
            if answer.get("error").is_none() {
                return;
            }
            assert!(Instant::now() < deadline, "no dialog opened: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The page's HTML.
    pub async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The current URL.
    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Saves a PNG screenshot as `target/console-screenshots/<name>.png`; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine as _;
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("screenshot base64"))
            .expect("PNG");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, bytes).expect("screenshot written");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (chromium quits with it), then chromedriver.
        use std::io::{Read as _, Write as _};
        let addr = self.base.trim_start_matches("http://");
        if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                stream,
                "DELETE /session/{} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
                self.session
            );
            let _ = stream.read_to_end(&mut Vec::new());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
