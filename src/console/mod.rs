//! `agentrt console` (also `kubectl agentrt console`): a web page on loopback for deciding
//! Approvals (docs/design.md section 2, "Console"; issue 39). It acts with the caller's
//! kubeconfig: every read and every decision is a request of that user to the API server, so
//! what they may not see or decide, the page cannot show or do.
//!
//! Owns: the HTTP server (axum) on `--addr` (default `127.0.0.1:8765`; another address only
//! when given, with a warning), its token and cookie sessions and CSRF checks, the inbox (every
//! Approval the user can list, pending first, oldest first, with filters and live updates from
//! a kube watch sent as server-sent events), one Approval's page and the decisions. Everything
//! shown is escaped and bounded by the CLI's helpers ([`crate::cli::escape`],
//! [`crate::cli::render`]) and rendered by minijinja templates that escape HTML.
//!
//! Must not: write anything but a decision, and only through the CLI's patch
//! ([`crate::cli::write_decision`]: the hash shown, the resourceVersion shown as a
//! precondition); decide anything itself (the engine's rule of whether an Approval can still
//! grant is asked through [`crate::cli::why_not_decidable`]); use any credential but the
//! caller's; build HTML by hand.
//!
//! Files:
//! - `guard`: the token, the cookie sessions, the Host, Origin and CSRF checks.
//! - `pages`: the handlers: the inbox, one Approval, decisions, the event stream.
//! - `view`: what the templates show of an Approval and its run, escaped and bounded.
//! - `templates/`: the pages (minijinja, HTML-escaped) and the inbox's small script.
//! - This file: the command line, the server and its routes.

mod guard;
mod pages;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::routing::{get, post};

/// `agentrt console` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ConsoleArgs {
    /// The address to serve on. Loopback by default; any other address serves the page to
    /// whoever reaches it (they still need the token), and is warned about.
    #[arg(long, default_value = "127.0.0.1:8765")]
    pub addr: SocketAddr,
    /// Who to act as and where: `--kubeconfig`, `--context`, and `-n` (only that namespace's
    /// Approvals; default: all namespaces the user can list).
    #[command(flatten)]
    pub target: crate::cli::Target,
}

/// What every request of the console shares: the user's client, the scope, the token and
/// sessions, and the templates.
pub(crate) struct Console {
    /// A client acting as the kubeconfig's user.
    client: kube::Client,
    /// `-n`: the one namespace shown; `None`: all.
    scope: Option<String>,
    /// The token of the printed URL, its sessions and the hosts the page answers to.
    guard: guard::Guard,
    /// The pages.
    templates: minijinja::Environment<'static>,
}

/// The templates, HTML-escaped (minijinja escapes every `.html` template's values).
fn templates() -> anyhow::Result<minijinja::Environment<'static>> {
    let mut env = minijinja::Environment::new();
    for (name, text) in [
        ("layout.html", include_str!("templates/layout.html")),
        ("inbox.html", include_str!("templates/inbox.html")),
        ("approval.html", include_str!("templates/approval.html")),
        ("decided.html", include_str!("templates/decided.html")),
        ("error.html", include_str!("templates/error.html")),
    ] {
        env.add_template(name, text)
            .with_context(|| format!("console template {name}"))?;
    }
    Ok(env)
}

/// Serves the console until interrupted: binds `--addr`, prints the URL with its token as the
/// last line on standard output, and answers until Ctrl-C.
///
/// # Errors
/// No kubeconfig, the address cannot be bound, or the server fails.
pub async fn run(args: ConsoleArgs) -> anyhow::Result<()> {
    let (client, _) = crate::cli::connect_as_user(&args.target).await?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}; choose another with --addr", args.addr))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() {
        eprintln!(
            "warning: the console listens on {local}, beyond loopback: anyone who reaches it and \
             has the token acts as you"
        );
    }
    let console = Arc::new(Console {
        client,
        scope: args.target.namespace.clone(),
        guard: guard::Guard::new(local),
        templates: templates()?,
    });
    let url = format!("http://{local}/?token={}", console.guard.token());
    crate::cli::emit(&format!(
        "agentrt console: deciding as your kubeconfig's user; open (the token is yours, keep it \
         private):\n{url}\n"
    ))?;
    let app = router(console);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the console's server failed")
}

/// The routes, every one behind [`guard::check`].
fn router(console: Arc<Console>) -> axum::Router {
    axum::Router::new()
        .route("/", get(pages::inbox))
        .route("/approvals/{namespace}/{name}", get(pages::approval))
        .route("/decide", post(pages::decide))
        .route("/events", get(pages::events))
        .route("/console.js", get(pages::script))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            guard::check,
        ))
        .layer(axum::middleware::map_response(hardened))
        .with_state(console)
}

/// Every answer refuses to be framed by another page (clickjacking: any page on loopback is
/// the same site, so the cookie alone would not stop it), is never cached (it carries CSRF
/// tokens and args) and is taken as the type it says.
async fn hardened(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    let set = [
        ("x-frame-options", "DENY"),
        ("content-security-policy", "frame-ancestors 'none'"),
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-store"),
    ];
    for (name, value) in set {
        headers.insert(
            axum::http::HeaderName::from_static(name),
            axum::http::HeaderValue::from_static(value),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        console: ConsoleArgs,
    }

    #[test]
    fn the_console_listens_on_loopback_by_default() {
        let cli = Cli::parse_from(["agentrt-console"]);
        assert_eq!(cli.console.addr, "127.0.0.1:8765".parse().unwrap());
        assert!(cli.console.addr.ip().is_loopback());
    }

    #[test]
    fn what_a_model_chose_is_escaped_on_the_page() {
        let yaml = include_str!("../../tests/fixtures/api/approval.yaml").replace(
            "args: {order: 1042, amount: 250}",
            "args: {order: \"<script>alert(1)</script>\\u202e\", amount: 250}",
        );
        let approval: crate::api::Approval = serde_yaml::from_str(&yaml).unwrap();
        let html = templates()
            .unwrap()
            .get_template("approval.html")
            .unwrap()
            .render(minijinja::context! { a => view::detail(&approval), csrf => "c" })
            .unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{html}"
        );
        assert!(
            !html.contains('\u{202e}'),
            "a bidi control is shown escaped"
        );
        assert!(html.contains("\\u{202E}"), "{html}");
        assert!(html.contains("data-action=\"approve\""), "{html}");
    }

    #[test]
    fn an_mcp_call_shows_its_server_pin_and_annotations_and_the_policy_that_asked() {
        let yaml = include_str!("../../tests/fixtures/api/approval.yaml").replace(
            "  hash: sha256:",
            "  presentation:\n    mcp: {server: \"https://mcp.example/<x>\", tool: refund, \
             pinSha256: abc123, annotations: {destructiveHint: true}}\n    policy: {kind: \
             AgentPolicy, namespace: team-a, name: strict, ruleIndex: 0, rule: needs-ok}\n  \
             hash: sha256:",
        );
        let approval: crate::api::Approval = serde_yaml::from_str(&yaml).unwrap();
        let html = templates()
            .unwrap()
            .get_template("approval.html")
            .unwrap()
            .render(minijinja::context! { a => view::detail(&approval), csrf => "c" })
            .unwrap();
        let mcp = html.split("id=\"mcp\">").nth(1).expect("an MCP section");
        let mcp = mcp.split("</pre>").next().unwrap();
        for shown in ["abc123", "destructiveHint", "mcp.example&#x2f;&lt;x&gt;"] {
            assert!(mcp.contains(shown), "{shown} in {mcp}");
        }
        assert!(
            html.contains("AgentPolicy team-a&#x2f;strict rule spec.rules[0] &quot;needs-ok&quot;"),
            "{html}"
        );
    }
}
