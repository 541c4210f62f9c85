//! Who may use the console (docs/design.md section 2, "Console"): the token of the printed URL
//! (as Jupyter's), exchanged once for an `HttpOnly; SameSite=Strict` session cookie; every
//! request needs that cookie (or the token) and a `Host` the console answers to (no DNS
//! rebinding); a POST also needs a same-origin `Origin` when the browser sends one and the
//! session's CSRF token in its form ([`Session::csrf`]). Must not: let any request through
//! without a session.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rand::Rng as _;

use super::Console;

/// The session cookie's name.
const COOKIE: &str = "agentrt_console";

/// The token, the sessions it opened and the hosts the console answers to (none listed: any).
pub(super) struct Guard {
    token: String,
    sessions: Mutex<HashMap<String, Session>>,
    hosts: Vec<String>,
}

/// One browser's session: found by its cookie; its CSRF token goes in every form.
#[derive(Clone, Debug)]
pub(super) struct Session {
    /// The per-session CSRF token each POST must carry as the form field `csrf`.
    pub csrf: String,
}

/// 32 random bytes as hex.
fn secret() -> String {
    hex::encode(rand::rng().random::<[u8; 32]>())
}

/// Equal, in time that does not depend on where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Guard {
    /// A fresh token for a console listening on `local`.
    pub(super) fn new(local: SocketAddr) -> Guard {
        let port = local.port();
        // An unspecified address (`0.0.0.0`) is reached by any of the machine's names: no
        // Host check then (`--addr` said so, with a warning).
        let mut hosts = match local.ip().is_unspecified() {
            true => Vec::new(),
            false => vec![local.to_string()],
        };
        if local.ip().is_loopback() {
            hosts.extend([
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                format!("[::1]:{port}"),
            ]);
        }
        Guard {
            token: secret(),
            sessions: Mutex::new(HashMap::new()),
            hosts,
        }
    }

    /// The token of the printed URL.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    fn session(&self, id: &str) -> Option<Session> {
        self.sessions.lock().ok().and_then(|s| s.get(id).cloned())
    }

    fn open(&self) -> (String, Session) {
        let (id, session) = (secret(), Session { csrf: secret() });
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(id.clone(), session.clone());
        }
        (id, session)
    }
}

fn refused(status: StatusCode, why: &str) -> Response {
    (status, format!("{why}\n")).into_response()
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

fn token_in(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "token")
        .map(|(_, value)| value.to_string())
}

/// The middleware in front of every route: `Host` checked; the token exchanged for a session
/// cookie (303 to the same path without it); otherwise the cookie's session required (403
/// without one) and put in the request's extensions; a POST refused (403) when its `Origin` or
/// `Sec-Fetch-Site` says another site sent it.
pub(super) async fn check(
    State(console): State<Arc<Console>>,
    mut request: Request,
    next: Next,
) -> Response {
    let guard = &console.guard;
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !guard.hosts.is_empty() && !guard.hosts.iter().any(|h| h == host) {
        return refused(
            StatusCode::FORBIDDEN,
            "refused: this console answers only to the host it printed",
        );
    }
    if let Some(token) = token_in(request.uri().query()) {
        if !same(&token, &guard.token) {
            return refused(StatusCode::FORBIDDEN, "refused: wrong token");
        }
        let (id, _) = guard.open();
        let path = request.uri().path().to_string();
        return (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, path),
                (
                    header::SET_COOKIE,
                    format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/"),
                ),
            ],
        )
            .into_response();
    }
    let Some(session) = cookie(headers).and_then(|id| guard.session(&id)) else {
        return refused(
            StatusCode::FORBIDDEN,
            "refused: no session; open the URL `agentrt console` printed, with its token",
        );
    };
    if request.method() == Method::POST {
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        if origin.is_some_and(|o| o != format!("http://{host}")) {
            return refused(
                StatusCode::FORBIDDEN,
                "refused: a request from another origin",
            );
        }
        let site = headers.get("sec-fetch-site").and_then(|o| o.to_str().ok());
        if site.is_some_and(|s| s != "same-origin" && s != "none") {
            return refused(
                StatusCode::FORBIDDEN,
                "refused: a request from another site",
            );
        }
    }
    request.extensions_mut().insert(session);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "a=1; agentrt_console=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&headers).as_deref(), Some("abc"));
        assert_eq!(token_in(Some("x=1&token=t")).as_deref(), Some("t"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
