//! A controller's `/metrics` and probes over HTTP (the controller started with
//! [`super::controller::ControllerSpec::metrics_on`]), and the samples of a metrics text.

/// The value of the one sample `series` of a metrics text (name and labels exactly as
/// exposed, e.g. `agentrt_status_writes_total{outcome="conflict"}`); `None` when it has none
/// or its value is not a number.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// `GET url` (no proxy, no timeout but the server's): its status code and body. Panics when
/// nothing answers or the body cannot be read.
pub async fn get(url: &str) -> (u16, String) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(url)
        .send()
        .await
        .unwrap_or_else(|err| panic!("GET {url}: {err}"));
    (
        response.status().as_u16(),
        response.text().await.expect("body"),
    )
}

/// The metrics text the controller serving on `127.0.0.1:port` exposes now (`GET /metrics`,
/// whatever its status); panics as [`get`] does.
pub async fn scrape(port: u16) -> String {
    get(&format!("http://127.0.0.1:{port}/metrics")).await.1
}
