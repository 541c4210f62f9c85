//! Access tokens for MCP servers that are OAuth 2.0 resource servers (docs/design.md section 6,
//! "MCP OAuth"): the client credentials grant (RFC 6749 section 4.4) at the authorization
//! server the MCP server's Protected Resource Metadata names (RFC 9728), the token asked for
//! the server as its `resource` (RFC 8707), cached until shortly before it expires.
//!
//! Discovery: `<origin>/.well-known/oauth-protected-resource<path>` of the server's URL, else
//! `<origin>/.well-known/oauth-protected-resource`; its `resource` must be the server's URL
//! (RFC 9728 section 3.3) and its first `authorization_servers` entry is the issuer. Then the
//! issuer's metadata, `<origin>/.well-known/oauth-authorization-server<path>` (RFC 8414
//! section 3.1), else `<issuer>/.well-known/openid-configuration`; its `issuer` must be the one
//! named, and its `token_endpoint` is asked. The client authenticates with HTTP Basic
//! (`client_secret_basic`, id and secret form-urlencoded first) unless the metadata offers only
//! `client_secret_post`.
//!
//! Owns: the token cache ([`TokenCache`], per server URL and client id) and the rule that no
//! client secret or access token ever appears in an error, a log line or `Debug`. Must not:
//! follow redirects (the caller's client does not), or read more than 64 KiB of any answer.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

use super::McpClient;

/// Most bytes of a metadata or token answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How long before its expiry a cached token is no longer used (30 s).
const EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// How long a token without `expires_in` is kept (5 minutes).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// How long each request of the grant may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An OAuth client's credentials, read from its Secret for one call. `Debug` shows the id only.
#[derive(Clone)]
pub struct ClientCredentials {
    /// `client_id`.
    pub client_id: String,
    /// `client_secret`.
    pub client_secret: String,
    /// The scopes asked for (none: the authorization server's default).
    pub scopes: Vec<String>,
}

impl fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// Why no token could be had. Texts name URLs and the authorization server's error code,
/// never a secret or a token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OAuthError {
    /// A metadata document could not be read or is not what the RFC says.
    #[error("OAuth discovery for {server} failed: {detail}")]
    Discovery {
        /// The MCP server.
        server: String,
        /// What went wrong, naming the URL asked.
        detail: String,
    },
    /// The token endpoint refused or answered something unusable.
    #[error(
        "the token endpoint {endpoint} refused the client credentials of {client_id}: {detail}"
    )]
    Token {
        /// The token endpoint.
        endpoint: String,
        /// The client id.
        client_id: String,
        /// The HTTP status and the server's `error` and `error_description` (bounded).
        detail: String,
    },
}

struct Cached {
    access_token: String,
    usable_until: Instant,
}

/// Access tokens by (MCP server URL, client id), shared by every call of the process.
#[derive(Default)]
pub struct TokenCache {
    tokens: Mutex<HashMap<(String, String), Cached>>,
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.tokens.lock().map(|t| t.len()).unwrap_or(0);
        f.debug_struct("TokenCache").field("tokens", &held).finish()
    }
}

impl TokenCache {
    /// `Bearer <token>` for `server` and `credentials`: a cached token still usable, else a
    /// new one from the authorization server the server names.
    ///
    /// # Errors
    /// [`OAuthError`] when discovery or the grant fails.
    pub async fn bearer(
        &self,
        http: &reqwest::Client,
        server: &str,
        credentials: &ClientCredentials,
    ) -> Result<String, OAuthError> {
        let key = (server.to_string(), credentials.client_id.clone());
        if let Ok(tokens) = self.tokens.lock() {
            if let Some(cached) = tokens.get(&key).filter(|c| c.usable_until > Instant::now()) {
                return Ok(format!("Bearer {}", cached.access_token));
            }
        }
        let (access_token, lifetime) = fetch(http, server, credentials).await?;
        let usable_until =
            Instant::now() + lifetime.saturating_sub(EXPIRY_MARGIN.min(lifetime / 2));
        let bearer = format!("Bearer {access_token}");
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.insert(
                key,
                Cached {
                    access_token,
                    usable_until,
                },
            );
        }
        Ok(bearer)
    }

    /// Forgets the token of `server` and `client_id` (the server answered 401: it no longer
    /// takes it), so the next [`TokenCache::bearer`] gets a new one.
    pub fn forget(&self, server: &str, client_id: &str) {
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.remove(&(server.to_string(), client_id.to_string()));
        }
    }
}

impl McpClient {
    /// Sends `Authorization: <value>` from now on, in place of any it sent.
    pub fn set_authorization(&mut self, value: String) {
        self.headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
        self.headers.push(("Authorization".to_string(), value));
    }
}

/// `url`'s well-known URL for `suffix`: `<origin>/.well-known/<suffix><path>` (the path
/// without a trailing `/`; none when it is `/`).
fn well_known(url: &reqwest::Url, suffix: &str) -> String {
    let path = url.path().trim_end_matches('/');
    format!(
        "{}/.well-known/{suffix}{path}",
        url.origin().ascii_serialization()
    )
}

/// Reads at most [`MAX_ANSWER_BYTES`] of a JSON answer: `(status, body)`.
async fn get_json(request: reqwest::RequestBuilder) -> Result<(u16, Value), String> {
    let mut response = request
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| crate::tools::http::error_chain(&e))?;
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| crate::tools::http::error_chain(&e))?
    {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err(format!("the answer is over {MAX_ANSWER_BYTES} bytes"));
        }
    }
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, body))
}

/// The first of `urls` answering 200 with a JSON object: `(url, document)`.
async fn first_document(
    http: &reqwest::Client,
    urls: &[String],
) -> Result<(String, Value), String> {
    let mut said = Vec::new();
    for url in urls {
        match get_json(http.get(url)).await {
            Ok((200, body)) if body.is_object() => return Ok((url.clone(), body)),
            Ok((status, _)) => said.push(format!("{url} answered {status}")),
            Err(err) => said.push(format!("{url}: {err}")),
        }
    }
    Err(said.join("; "))
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The grant: discovery, then the token endpoint. Returns the token and its lifetime.
async fn fetch(
    http: &reqwest::Client,
    server: &str,
    credentials: &ClientCredentials,
) -> Result<(String, Duration), OAuthError> {
    let discovery = |detail: String| OAuthError::Discovery {
        server: server.to_string(),
        detail,
    };
    let url = reqwest::Url::parse(server).map_err(|e| discovery(e.to_string()))?;
    let candidates = [
        well_known(&url, "oauth-protected-resource"),
        format!(
            "{}/.well-known/oauth-protected-resource",
            url.origin().ascii_serialization()
        ),
    ];
    let (_, resource_metadata) = first_document(http, &candidates)
        .await
        .map_err(|e| discovery(format!("no Protected Resource Metadata (RFC 9728): {e}")))?;
    let resource = resource_metadata
        .get("resource")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !same_url(&resource, server) {
        return Err(discovery(format!(
            "its Protected Resource Metadata is for {resource:?}, not for this server"
        )));
    }
    let issuer = resource_metadata
        .get("authorization_servers")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| discovery("its metadata names no authorization_servers".to_string()))?
        .to_string();
    let issuer_url =
        reqwest::Url::parse(&issuer).map_err(|e| discovery(format!("{issuer}: {e}")))?;
    let candidates = [
        well_known(&issuer_url, "oauth-authorization-server"),
        format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ),
    ];
    let (_, server_metadata) = first_document(http, &candidates)
        .await
        .map_err(|e| discovery(format!("no authorization server metadata (RFC 8414): {e}")))?;
    let said_issuer = server_metadata
        .get("issuer")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !same_url(said_issuer, &issuer) {
        return Err(discovery(format!(
            "the authorization server says it is {said_issuer:?}, not {issuer:?}"
        )));
    }
    let endpoint = server_metadata
        .get("token_endpoint")
        .and_then(Value::as_str)
        .ok_or_else(|| discovery(format!("{issuer} names no token_endpoint")))?
        .to_string();
    let methods: Vec<&str> = server_metadata
        .get("token_endpoint_auth_methods_supported")
        .and_then(Value::as_array)
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let basic = methods.is_empty()
        || methods.contains(&"client_secret_basic")
        || !methods.contains(&"client_secret_post");
    let mut form: Vec<(&str, &str)> = vec![
        ("grant_type", "client_credentials"),
        ("resource", resource.as_str()),
    ];
    let scope = credentials.scopes.join(" ");
    if !scope.is_empty() {
        form.push(("scope", &scope));
    }
    if !basic {
        form.push(("client_id", &credentials.client_id));
        form.push(("client_secret", &credentials.client_secret));
    }
    let mut request = http.post(&endpoint).form(&form);
    if basic {
        // RFC 6749 section 2.3.1: each form-urlencoded before they are joined.
        let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let pair = format!(
            "{}:{}",
            encode(&credentials.client_id),
            encode(&credentials.client_secret)
        );
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        request = request.header(http::header::AUTHORIZATION, format!("Basic {encoded}"));
    }
    let refused = |detail: String| OAuthError::Token {
        endpoint: endpoint.clone(),
        client_id: credentials.client_id.clone(),
        detail,
    };
    let (status, body) = get_json(request).await.map_err(&refused)?;
    let text = |key: &str| {
        body.get(key)
            .and_then(Value::as_str)
            .map(|s| s.chars().take(256).collect::<String>())
    };
    if status != 200 {
        return Err(refused(format!(
            "HTTP {status}: {} {}",
            text("error").unwrap_or_default(),
            text("error_description").unwrap_or_default()
        )));
    }
    let token = body
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| refused("the answer has no access_token".to_string()))?;
    let kind = text("token_type").unwrap_or_default();
    if !kind.eq_ignore_ascii_case("bearer") {
        return Err(refused(format!("token_type {kind:?} is not Bearer")));
    }
    let lifetime = body
        .get("expires_in")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_LIFETIME, Duration::from_secs);
    tracing::info!(server, client_id = %credentials.client_id, expires_in_s = lifetime.as_secs(), "got an OAuth access token for the MCP server");
    Ok((token.to_string(), lifetime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_urls_insert_the_suffix_before_the_path() {
        let url = reqwest::Url::parse("https://mcp.example.com/tools/mcp").unwrap();
        assert_eq!(
            well_known(&url, "oauth-protected-resource"),
            "https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp"
        );
        let issuer = reqwest::Url::parse("https://as.example.com/").unwrap();
        assert_eq!(
            well_known(&issuer, "oauth-authorization-server"),
            "https://as.example.com/.well-known/oauth-authorization-server"
        );
        assert!(same_url("http://a/", "http://a"));
    }

    #[test]
    fn credentials_show_no_secret() {
        let credentials = ClientCredentials {
            client_id: "agent".into(),
            client_secret: "s3cr3t-value".into(),
            scopes: vec![],
        };
        let shown = format!("{credentials:?}");
        assert!(
            shown.contains("agent") && !shown.contains("s3cr3t"),
            "{shown}"
        );
    }
}
