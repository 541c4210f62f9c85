//! The validating admission webhook the controller serves (docs/behaviours.md 1): an AgentRun
//! whose spec has problems is refused at `kubectl apply`, with every problem in the message
//! kube-apiserver shows (`admission webhook "..." denied the request: ...`).
//!
//! A run whose `spec.limits` exceed a ceiling of an admin policy that selects it
//! (`AgentPolicy`, `ClusterAgentPolicy`: docs/design.md section 6) is refused too
//! ([`refusal_under`]).
//!
//! A run naming a Secret its creator may not `get` is refused too, by a SubjectAccessReview
//! ([`access`]; on a cluster only: `agentrt dev`'s server has no authorization).
//!
//! Owns: the AdmissionReview (admission.k8s.io/v1) answer ([`review`]), the refusal message of
//! an object ([`refusal`], also handed to `agentrt dev`'s embedded server by `controller::dev`),
//! and the HTTPS server (`--webhook-addr`, `--webhook-cert-dir` with `tls.crt` and `tls.key`,
//! path [`PATH`]). Must not: judge a spec itself: the rules are
//! [`engine::validate::spec`](crate::engine::validate::spec), the same ones the engine applies
//! before `run.started` and `agentrt lint` offline.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

pub mod access;

use self::access::SecretAccess;
use super::admin_policy::AdminPolicyView;
use crate::engine::policy::admin::ceiling_refusals;
use crate::engine::validate::spec;

/// The webhook's name in `agentrt dev` (the chart names its own after the release; the one in
/// a denial is the configuration's).
pub const WEBHOOK_NAME: &str = "agentruns.agentrt.dev";

/// The path the webhook answers on.
pub const PATH: &str = "/validate-agentrun";

/// Why `object` (an AgentRun as sent to the API server) must be refused, or `None`.
///
/// The message is `AgentRun NAMESPACE/NAME: field: message; field: message` (the rules of
/// [`spec::spec`]); a spec that does not decode is refused naming `spec`. An object that is not
/// an AgentRun is never refused here. On an update (`old` is the object replaced) only problems
/// the old object did not have count, so a run created before a rule existed can still be
/// cancelled or have its policy fixed (as kube-apiserver ratchets CRD validation).
pub fn refusal(object: &Value, old: Option<&Value>) -> Option<String> {
    refusal_under(object, old, &AdminPolicyView::none())
}

/// [`refusal`], and also each of the run's `spec.limits` above a ceiling of an admin policy
/// that selects it (docs/design.md section 6, admin policies), as `admin` holds them now. When
/// the admin policies cannot be read the ceilings are not checked here (the run is admitted;
/// its effective limits are still lowered to them at each decision).
pub fn refusal_under(
    object: &Value,
    old: Option<&Value>,
    admin: &AdminPolicyView,
) -> Option<String> {
    if object["kind"] != "AgentRun" {
        return None;
    }
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = object["metadata"]["name"]
        .as_str()
        .or_else(|| object["metadata"]["generateName"].as_str())
        .unwrap_or("-");
    let before: Vec<String> = old.map(|o| problems(o, admin)).unwrap_or_default();
    let new: Vec<String> = problems(object, admin)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    (!new.is_empty()).then(|| format!("AgentRun {namespace}/{name}: {}", new.join("; ")))
}

/// Each problem of `object`'s spec as `field: message`, then each limit over an admin ceiling.
fn problems(object: &Value, admin: &AdminPolicyView) -> Vec<String> {
    match crate::api::decode_spec(&object["spec"]) {
        Ok(decoded) => {
            let mut found: Vec<String> = spec::run(
                object["metadata"]["name"].as_str().unwrap_or(""),
                &decoded.spec,
            )
            .iter()
            .map(ToString::to_string)
            .collect();
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            found.extend(
                ceiling_refusals(
                    &decoded.spec.limits,
                    &admin.for_run(namespace, &object["metadata"]),
                )
                .iter()
                .map(ToString::to_string),
            );
            found
        }
        Err(err) => vec![err],
    }
}

/// The AdmissionReview answering `review_request` (an `admission.k8s.io/v1` AdmissionReview):
/// `allowed: true`, or `allowed: false` with a Status (code 400, reason `BadRequest`) whose message
/// is [`refusal`]'s. A DELETE (no object) is allowed.
pub fn review(review_request: &Value) -> Value {
    review_under(review_request, &AdminPolicyView::none())
}

/// [`review`] with the admin policies' ceilings ([`refusal_under`]).
pub fn review_under(review_request: &Value, admin: &AdminPolicyView) -> Value {
    let request = &review_request["request"];
    let uid = request["uid"].clone();
    let old = Some(&request["oldObject"]).filter(|o| !o.is_null());
    let refused = match request["object"] {
        Value::Null => None,
        ref object => refusal_under(object, old, admin),
    };
    let response = match refused {
        None => json!({"uid": uid, "allowed": true}),
        Some(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": {"code": 400, "reason": "BadRequest", "message": message},
        }),
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// [`review_under`], then, for a run admitted so far, the creator's access to each Secret it
/// names ([`access::refusal`]): refused with a Status 403 `Forbidden` naming each field and the
/// fix (docs/design.md section 6, "Secrets").
pub async fn review_with_access(
    review_request: &Value,
    admin: &AdminPolicyView,
    secrets: &dyn SecretAccess,
) -> Value {
    let answer = review_under(review_request, admin);
    if answer["response"]["allowed"] != true {
        return answer;
    }
    let request = &review_request["request"];
    let Some(problems) = access::refusal(request, secrets).await else {
        return answer;
    };
    let object = &request["object"];
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .or_else(|| request["namespace"].as_str())
        .unwrap_or("default");
    let name = object["metadata"]["name"]
        .as_str()
        .or_else(|| object["metadata"]["generateName"].as_str())
        .unwrap_or("-");
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": request["uid"].clone(),
            "allowed": false,
            "status": {
                "code": 403,
                "reason": "Forbidden",
                "message": format!("AgentRun {namespace}/{name}: {problems}"),
            },
        },
    })
}

/// Serves [`review_with_access`] at [`PATH`] over HTTPS on `addr` until `shutdown` fires, with the
/// certificate chain `cert_dir/tls.crt` and key `cert_dir/tls.key` (PEM; read once at start).
/// Returns the address bound.
///
/// # Errors
/// When the files cannot be read or are not a certificate and key, or `addr` cannot be bound;
/// the message names the file or address and the flag to change.
pub async fn serve(
    addr: SocketAddr,
    cert_dir: &Path,
    admin: AdminPolicyView,
    secrets: Arc<dyn SecretAccess>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(cert_dir)?));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|err| {
        anyhow::anyhow!("cannot serve the webhook on {addr}: {err}; pass another --webhook-addr")
    })?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        PATH,
        post(move |Json(body): Json<Value>| {
            let admin = admin.clone();
            let secrets = secrets.clone();
            async move { Json(review_with_access(&body, &admin, secrets.as_ref()).await) }
        }),
    );
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let Ok((tcp, peer)) = accepted else { continue };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(err) => {
                        tracing::debug!(%peer, %err, "webhook TLS handshake failed");
                        return;
                    }
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                if let Err(err) = served {
                    tracing::debug!(%peer, %err, "webhook connection ended with an error");
                }
            });
        }
    });
    Ok(bound)
}

/// The server's TLS configuration from `cert_dir/tls.crt` and `cert_dir/tls.key`.
fn tls_config(cert_dir: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let cert_file = cert_dir.join("tls.crt");
    let key_file = cert_dir.join("tls.key");
    let fix = "pass --webhook-cert-dir naming a directory with tls.crt and tls.key (PEM)";
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|err| anyhow::anyhow!("{}: {err}; {fix}", cert_file.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: holds no certificate; {fix}", cert_file.display());
    }
    let key = PrivateKeyDer::from_pem_file(&key_file)
        .map_err(|err| anyhow::anyhow!("{}: {err}; {fix}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "{} and {} are not a certificate and its key",
                cert_file.display(),
                key_file.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tool_name: &str) -> Value {
        json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "weather", "namespace": "demo"},
            "spec": {
                "goal": "Say the weather.",
                "agent": {"scripted": {"decisions": []}},
                "tools": [{
                    "name": tool_name,
                    "sideEffect": "ReadOnly",
                    "inputSchema": {"type": "object"},
                    "http": {"url": "http://127.0.0.1:1/w"}
                }]
            }
        })
    }

    #[test]
    fn a_review_of_a_bad_run_is_refused_with_every_problem_and_a_good_one_allowed() {
        let answer = review(&json!({"request": {"uid": "u1", "object": run("get weather!")}}));
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 400);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or("");
        assert!(
            message.starts_with(
                "AgentRun demo/weather: spec.tools[0].name: \"get weather!\" is not a valid"
            ),
            "{message}"
        );
        let answer = review(&json!({"request": {"uid": "u2", "object": run("get_weather")}}));
        assert_eq!(answer["response"], json!({"uid": "u2", "allowed": true}));
        let answer = review(&json!({"request": {"uid": "u3", "object": null}}));
        assert_eq!(answer["response"]["allowed"], true, "a DELETE is allowed");
    }

    /// Denies every Secret.
    struct NoSecrets;

    #[async_trait::async_trait]
    impl SecretAccess for NoSecrets {
        async fn may_get(
            &self,
            _: &k8s_openapi::api::authentication::v1::UserInfo,
            _: &str,
            _: &str,
        ) -> Result<access::Access, String> {
            Ok(access::Access::Denied(String::new()))
        }

        async fn may_create_jobs(
            &self,
            _: &k8s_openapi::api::authentication::v1::UserInfo,
            _: &str,
        ) -> Result<access::Access, String> {
            Ok(access::Access::Denied(String::new()))
        }
    }

    #[tokio::test]
    async fn a_run_naming_a_secret_its_creator_may_not_get_is_refused_with_403() {
        let mut object = run("get_weather");
        object["spec"]["tools"][0]["http"]["headers"] =
            json!([{"name": "Authorization", "secretKeyRef": {"name": "db-admin", "key": "pw"}}]);
        let request = json!({"request": {"uid": "u", "operation": "CREATE",
            "userInfo": {"username": "alice"}, "object": object}});
        let answer = review_with_access(&request, &AdminPolicyView::none(), &NoSecrets).await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["uid"], "u");
        assert_eq!(answer["response"]["status"]["code"], 403);
        assert_eq!(
            answer["response"]["status"]["message"],
            "AgentRun demo/weather: spec.tools[0].http.headers[0].secretKeyRef.name: alice may \
             not get Secret demo/db-admin; ask for get on that Secret or use one you can read"
        );
        // A spec with problems is refused for them first, as before (400).
        let mut bad = request.clone();
        bad["request"]["object"]["spec"]["tools"][0]["name"] = json!("bad name!");
        let answer = review_with_access(&bad, &AdminPolicyView::none(), &NoSecrets).await;
        assert_eq!(answer["response"]["status"]["code"], 400, "{answer}");
    }

    #[test]
    fn a_run_named_longer_than_63_characters_is_refused_naming_metadata_name() {
        let mut object = run("get_weather");
        object["metadata"]["name"] = json!("w".repeat(64));
        let message = refusal(&object, None).expect("refused");
        assert!(
            message.contains(": metadata.name: must be no more than 63 characters (got 64)"),
            "{message}"
        );
        object["metadata"]["name"] = json!("w".repeat(63));
        assert_eq!(refusal(&object, None), None);
    }

    #[test]
    fn a_spec_that_does_not_decode_is_refused_naming_the_field_by_its_path() {
        let mut object = run("ok");
        object["spec"]["tools"][0]["sideEffect"] = json!("Harmless");
        let message = refusal(&object, None).expect("refused");
        assert!(
            message.starts_with("AgentRun demo/weather: spec.tools[0].sideEffect: unknown variant"),
            "{message}"
        );
        assert_eq!(refusal(&json!({"kind": "ConfigMap"}), None), None);
    }

    #[test]
    fn an_update_is_refused_only_for_problems_the_old_object_did_not_have() {
        let old = run("get weather!");
        let mut cancelled = old.clone();
        cancelled["spec"]["cancel"] = json!(true);
        let answer =
            review(&json!({"request": {"uid": "u", "object": cancelled, "oldObject": old}}));
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        let mut broken = old.clone();
        broken["spec"]["policy"] =
            json!({"rules": [{"name": "r", "when": "1 <=>", "outcome": "Allow"}]});
        let message = refusal(&broken, Some(&old)).expect("a new problem");
        assert!(message.contains("spec.policy.rules[0].when"), "{message}");
        assert!(!message.contains("spec.tools[0].name"), "{message}");
    }
}
