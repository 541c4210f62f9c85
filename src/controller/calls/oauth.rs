//! The credentials of an MCP server for one run's call (docs/design.md section 6, "MCP
//! OAuth"): the server's headers (Secrets read now, with their owner's consent) and, when the
//! server is an OAuth resource server (`mcp.oauth`), `Authorization: Bearer` with a token from
//! the process's cache ([`crate::tools::mcp::oauth::TokenCache`]), renewed once after a 401.
//!
//! Owns: reading the client's id and secret from its Secret. Must not: log or return a secret
//! value or a token (errors name the Secret and the key).

use super::ApiSecrets;
use crate::api::{HttpHeader, McpOAuth, SecretKeyRef};
use crate::controller::cluster::RunState;
use crate::controller::context::Context;
use crate::tools::http::{self, SecretSource};
use crate::tools::mcp::oauth::ClientCredentials;
use crate::tools::mcp::McpClient;

/// An MCP server's headers for one call, and the OAuth client they came with.
pub(super) struct ServerAuth {
    /// The headers to send (with `Authorization: Bearer` under `oauth`).
    pub headers: Vec<(String, String)>,
    url: String,
    credentials: Option<ClientCredentials>,
}

/// The client's id and secret from `oauth.clientSecretRef`, read for the run (consent checked).
async fn credentials(
    ctx: &Context,
    state: &RunState,
    oauth: &McpOAuth,
) -> Result<ClientCredentials, String> {
    let secrets = ApiSecrets::of(ctx, state);
    let namespace = &state.run.snapshot.namespace;
    let reference = &oauth.client_secret_ref;
    let read = |key: Option<&String>, default: &str| SecretKeyRef {
        name: reference.name.clone(),
        key: key.cloned().unwrap_or_else(|| default.to_string()),
    };
    let id = read(reference.client_id_key.as_ref(), "client_id");
    let secret = read(reference.client_secret_key.as_ref(), "client_secret");
    Ok(ClientCredentials {
        client_id: secrets.secret_value(namespace, &id).await?,
        client_secret: secrets.secret_value(namespace, &secret).await?,
        scopes: oauth.scopes.clone(),
    })
}

/// The headers of the server at `url` for this run: `headers` resolved and, with `oauth`, the
/// bearer token.
///
/// # Errors
/// A sentence naming the Secret or the OAuth step that failed, never a value.
pub(super) async fn server_auth(
    ctx: &Context,
    state: &RunState,
    url: &str,
    headers: &[HttpHeader],
    oauth: Option<&McpOAuth>,
) -> Result<ServerAuth, String> {
    let namespace = &state.run.snapshot.namespace;
    let mut resolved =
        http::resolve_header_list(headers, namespace, &ApiSecrets::of(ctx, state)).await?;
    let credentials = match oauth {
        Some(oauth) => Some(credentials(ctx, state, oauth).await?),
        None => None,
    };
    if let Some(credentials) = &credentials {
        let bearer = ctx
            .executors
            .oauth
            .bearer(&ctx.executors.http, url, credentials)
            .await
            .map_err(|e| e.to_string())?;
        resolved.push(("Authorization".to_string(), bearer));
    }
    Ok(ServerAuth {
        headers: resolved,
        url: url.to_string(),
        credentials,
    })
}

impl ServerAuth {
    /// After the server answered 401: forgets the token, gets a new one and gives it to
    /// `client`. `false` without OAuth, or when no new token could be had.
    pub(super) async fn renew(&self, ctx: &Context, client: &mut McpClient) -> bool {
        let Some(credentials) = &self.credentials else {
            return false;
        };
        let cache = &ctx.executors.oauth;
        cache.forget(&self.url, &credentials.client_id);
        match cache
            .bearer(&ctx.executors.http, &self.url, credentials)
            .await
        {
            Ok(bearer) => {
                client.set_authorization(bearer);
                true
            }
            Err(err) => {
                tracing::warn!(server = %self.url, %err, "a new OAuth token could not be had");
                false
            }
        }
    }
}
