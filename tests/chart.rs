//! The Helm chart (issue 6): it lints, renders for the default values and each documented
//! combination, every rendered object is a valid Kubernetes object of its kind (checked by a
//! round trip through the k8s-openapi types: a misspelt or misplaced field does not survive it),
//! and its CRDs are the top-level `crds/`.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::helm::helm;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn render(sets: &[&str]) -> Vec<Value> {
    render_as("agentrt", sets)
}

/// The objects `helm template RELEASE charts/agentrt -n agentrt-system --set S...` renders.
fn render_as(release: &str, sets: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args([
        "template",
        release,
        "charts/agentrt",
        "--namespace",
        "agentrt-system",
    ])
    .current_dir(root());
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value: serde_yaml::Value =
                serde::Deserialize::deserialize(doc).expect("helm renders YAML");
            serde_json::to_value(value).expect("YAML converts to JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Round-trips `object` through the typed k8s-openapi struct of its kind and returns what did
/// not survive (empty when the object is valid for its kind).
fn round_trip<T>(object: &Value) -> Result<(), String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    if &back == object {
        Ok(())
    } else {
        Err(format!(
            "fields lost or changed in a round trip:\nrendered: {object:#}\nas typed: {back:#}"
        ))
    }
}

fn check_object(object: &Value) -> Result<(), String> {
    use k8s_openapi::api::{
        admissionregistration::v1 as adm, apps::v1 as apps, core::v1 as core, policy::v1 as policy,
        rbac::v1 as rbac,
    };
    let kind = object["kind"].as_str().unwrap_or_default();
    match kind {
        "Deployment" => round_trip::<apps::Deployment>(object),
        "ServiceAccount" => round_trip::<core::ServiceAccount>(object),
        "Service" => round_trip::<core::Service>(object),
        "Secret" => round_trip::<core::Secret>(object),
        "ValidatingWebhookConfiguration" => {
            round_trip::<adm::ValidatingWebhookConfiguration>(object)
        }
        "ClusterRole" => round_trip::<rbac::ClusterRole>(object),
        "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(object),
        "Role" => round_trip::<rbac::Role>(object),
        "RoleBinding" => round_trip::<rbac::RoleBinding>(object),
        "PodDisruptionBudget" => round_trip::<policy::PodDisruptionBudget>(object),
        "ValidatingAdmissionPolicy" => round_trip::<adm::ValidatingAdmissionPolicy>(object),
        "ValidatingAdmissionPolicyBinding" => {
            round_trip::<adm::ValidatingAdmissionPolicyBinding>(object)
        }
        "ServiceMonitor" => {
            // prometheus-operator's CRD, not in k8s-openapi: check the fields it requires.
            let endpoints = &object["spec"]["endpoints"];
            if object["apiVersion"] == "monitoring.coreos.com/v1"
                && object["spec"]["selector"]["matchLabels"].is_object()
                && endpoints.as_array().is_some_and(|e| !e.is_empty())
            {
                Ok(())
            } else {
                Err("ServiceMonitor needs apiVersion monitoring.coreos.com/v1, spec.selector and spec.endpoints".into())
            }
        }
        other => Err(format!("the chart renders an unexpected kind {other:?}")),
    }
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    kinds.sort();
    kinds
}

fn assert_valid(objects: &[Value]) {
    for object in objects {
        if let Err(err) = check_object(object) {
            panic!("{} {}: {err}", object["kind"], object["metadata"]["name"]);
        }
    }
}

#[test]
fn the_chart_lints() {
    let out = Command::new(helm())
        .args(["lint", "charts/agentrt", "--strict"])
        .current_dir(root())
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm lint failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn default_values_render_valid_objects_with_a_cluster_role() {
    let objects = render(&[]);
    assert_valid(&objects);
    assert_eq!(
        kinds(&objects),
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
            "ValidatingWebhookConfiguration"
        ]
    );
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2, "two replicas by default");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let pod_security = &deployment["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true);
    assert_eq!(pod_security["seccompProfile"]["type"], "RuntimeDefault");
    assert!(container["args"][0] == "controller");
    // docs/behaviours.md 1: the webhook is on by default, served by every replica with the
    // chart's certificate, for AgentRun creates and updates in every namespace.
    assert!(
        container["args"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a == "--webhook-addr=0.0.0.0:9443")),
        "{}",
        container["args"]
    );
    let webhook = objects
        .iter()
        .find(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .expect("a webhook configuration");
    let hook = &webhook["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
    assert_eq!(
        hook["clientConfig"]["service"]["path"],
        "/validate-agentrun"
    );
    assert_eq!(
        hook["rules"][0]["operations"],
        serde_json::json!(["CREATE", "UPDATE"])
    );
    assert!(hook["namespaceSelector"].is_null(), "every namespace");
    let secret = objects
        .iter()
        .find(|o| o["kind"] == "Secret")
        .expect("the webhook's Secret");
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let off = render(&["webhook.enabled=false"]);
    assert!(
        !off.iter()
            .any(|o| o["kind"] == "ValidatingWebhookConfiguration" || o["kind"] == "Secret"),
        "webhook.enabled=false renders no webhook"
    );
}

#[test]
fn watch_namespaces_render_a_role_per_namespace_and_no_cluster_role_for_the_controller() {
    let objects = render(&["watchNamespaces={team-a,team-b}"]);
    assert_valid(&objects);
    let roles: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Role").collect();
    let namespaces: Vec<&str> = roles
        .iter()
        .filter_map(|r| r["metadata"]["namespace"].as_str())
        .collect();
    assert_eq!(namespaces, ["team-a", "team-b"]);
    // The one cluster-wide binding reads the admin policies (ClusterAgentPolicies, Namespaces'
    // labels) and creates the webhook's SubjectAccessReviews; nothing of the runs, no Secret.
    let bindings: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(bindings.len(), 1, "{bindings:?}");
    assert_eq!(
        bindings[0]["roleRef"]["name"],
        "agentrt-controller-policies"
    );
    let cluster_role = objects
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole" && o["metadata"]["name"] == "agentrt-controller-policies"
        })
        .expect("the admin policies' ClusterRole");
    let resources: Vec<&Value> = cluster_role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| r["resources"].as_array().expect("resources"))
        .collect();
    assert_eq!(
        resources,
        [
            &serde_json::json!("clusteragentpolicies"),
            &serde_json::json!("namespaces"),
            &serde_json::json!("subjectaccessreviews")
        ]
    );
    // Secrets: get only, and only in the watched namespaces' Roles.
    for role in &roles {
        let secrets: Vec<&Value> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["resources"] == serde_json::json!(["secrets"]))
            .collect();
        assert_eq!(secrets.len(), 1, "{role}");
        assert_eq!(secrets[0]["verbs"], serde_json::json!(["get"]), "{role}");
    }
    let subject_access = |objects: &[Value]| {
        objects.iter().any(|o| {
            o["kind"] == "ClusterRole"
                && o["rules"].as_array().is_some_and(|rules| {
                    rules
                        .iter()
                        .any(|r| r["resources"] == serde_json::json!(["subjectaccessreviews"]))
                })
        })
    };
    assert!(subject_access(&objects));
    assert!(
        !subject_access(&render(&[
            "watchNamespaces={team-a}",
            "webhook.enabled=false"
        ])),
        "no SubjectAccessReviews without the webhook"
    );
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let args: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        args.contains(&"--namespace=team-a") && args.contains(&"--namespace=team-b"),
        "{args:?}"
    );
    let webhook = objects
        .iter()
        .find(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .expect("a webhook configuration");
    assert_eq!(
        webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0],
        serde_json::json!({
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["team-a", "team-b"]
        })
    );
}

/// docs/design.md section 6, "Secrets": cluster-wide, the controller may get Secrets only in the
/// namespaces `secretNamespaces` lists (a Role each), none in its ClusterRole; get only.
#[test]
fn secret_namespaces_move_the_secret_read_into_a_role_per_namespace() {
    let grants_secrets = |object: &Value| {
        object["rules"].as_array().is_some_and(|rules| {
            rules
                .iter()
                .any(|r| r["resources"] == serde_json::json!(["secrets"]))
        })
    };
    let default = render(&[]);
    let cluster_role = default
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "agentrt-controller")
        .expect("the controller's ClusterRole");
    assert!(grants_secrets(cluster_role), "{cluster_role}");

    let objects = render(&["secretNamespaces={team-a,team-b}"]);
    assert_valid(&objects);
    let cluster_role = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "agentrt-controller")
        .expect("the controller's ClusterRole");
    assert!(!grants_secrets(cluster_role), "{cluster_role}");
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Role" && grants_secrets(o))
        .collect();
    let namespaces: Vec<&str> = roles
        .iter()
        .filter_map(|r| r["metadata"]["namespace"].as_str())
        .collect();
    assert_eq!(namespaces, ["team-a", "team-b"]);
    for role in &roles {
        assert_eq!(
            role["rules"],
            serde_json::json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
            "{role}"
        );
    }
    let bound: Vec<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding")
        .filter_map(|b| b["roleRef"]["name"].as_str())
        .collect();
    assert_eq!(
        bound,
        ["agentrt-controller-secrets", "agentrt-controller-secrets"]
    );
}

#[test]
fn admission_policies_render_valid_policies_and_bindings() {
    let objects = render(&["admissionPolicies.enabled=true"]);
    assert_valid(&objects);
    assert_eq!(
        objects
            .iter()
            .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
            .count(),
        3
    );
    let with_four_eyes = render(&[
        "admissionPolicies.enabled=true",
        "admissionPolicies.fourEyes=true",
    ]);
    assert_valid(&with_four_eyes);
    assert_eq!(
        with_four_eyes
            .iter()
            .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
            .count(),
        5
    );
    assert_eq!(
        with_four_eyes
            .iter()
            .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
            .count(),
        5
    );
}

#[test]
fn service_monitor_renders_when_enabled() {
    let objects = render(&["metrics.serviceMonitor.enabled=true"]);
    assert_valid(&objects);
    assert_eq!(
        objects
            .iter()
            .filter(|o| o["kind"] == "ServiceMonitor")
            .count(),
        1
    );
}

/// `helm template agentrt charts/agentrt --set SET` (no namespace), unchecked: for values the
/// chart's schema must refuse.
fn template_setting(set: &str) -> std::process::Output {
    Command::new(helm())
        .args(["template", "agentrt", "charts/agentrt", "--set", set])
        .current_dir(root())
        .output()
        .expect("helm runs")
}

#[test]
fn values_outside_the_schema_are_refused() {
    let out = template_setting("replicaCount=-1");
    assert!(
        !out.status.success(),
        "replicaCount=-1 must be refused by values.schema.json"
    );
    let out = template_setting("image.digest=latest");
    assert!(
        !out.status.success(),
        "an image.digest that is not sha256:<64 hex> must be refused"
    );
    let out = template_setting("replicas=3");
    assert!(
        !out.status.success(),
        "an unknown value must be refused by values.schema.json"
    );
}

#[test]
fn chart_crds_are_the_generated_crds() {
    for name in [
        "agentpolicies.yaml",
        "agentruns.yaml",
        "agentrunsegments.yaml",
        "approvals.yaml",
        "clusteragentpolicies.yaml",
    ] {
        let top = std::fs::read_to_string(root().join("crds").join(name)).expect("crds/ file");
        let chart = std::fs::read_to_string(root().join("charts/agentrt/crds").join(name))
            .expect("charts/agentrt/crds file");
        assert!(
            top == chart,
            "charts/agentrt/crds/{name} differs from crds/{name}; run scripts/gen-crds"
        );
    }
}

/// Issue 36, what a fresh user hit: `replicaCount: 0` is accepted (and renders no
/// PodDisruptionBudget); two releases' cluster-scoped objects do not collide; people who create
/// runs have a role; `image.digest` pins the image; the shutdown grace and the probes reach the
/// Deployment.
#[test]
fn the_chart_serves_a_second_release_zero_replicas_a_digest_and_run_creators() {
    let zero = render(&["replicaCount=0"]);
    assert_valid(&zero);
    let deployment = zero
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    assert_eq!(deployment["spec"]["replicas"], 0);
    assert!(!zero.iter().any(|o| o["kind"] == "PodDisruptionBudget"));

    let cluster_scoped = |objects: &[Value]| -> Vec<String> {
        objects
            .iter()
            .filter(|o| o["metadata"]["namespace"].is_null())
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    let sets = [
        "admissionPolicies.enabled=true",
        "admissionPolicies.fourEyes=true",
    ];
    let first = cluster_scoped(&render_as("agentrt", &sets));
    let second = cluster_scoped(&render_as("team-b", &sets));
    assert!(
        first.contains(&"ClusterRole/agentrt-approver".to_string()),
        "{first:?}"
    );
    assert!(
        first.contains(&"ClusterRole/agentrt-editor".to_string()),
        "{first:?}"
    );
    assert!(
        first.contains(&"ClusterRole/agentrt-viewer".to_string()),
        "{first:?}"
    );
    let shared: Vec<&String> = first.iter().filter(|n| second.contains(n)).collect();
    assert!(shared.is_empty(), "two releases both render {shared:?}");

    let objects = render(&[]);
    let editor = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "agentrt-editor")
        .expect("the editor role");
    assert!(
        editor["rules"][0]["verbs"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v == "create")),
        "{editor}"
    );
    let container = |objects: &[Value]| -> Value {
        objects
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment")["spec"]["template"]["spec"]["containers"][0]
            .clone()
    };
    let digest = format!("sha256:{}", "ab".repeat(32));
    let pinned = render(&[
        "image.repository=registry.local/agentrt",
        &format!("image.digest={digest}"),
    ]);
    assert_eq!(
        container(&pinned)["image"],
        format!("registry.local/agentrt@{digest}")
    );
    let c = container(&objects);
    assert!(
        c["args"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a == "--shutdown-grace-seconds=20")),
        "{}",
        c["args"]
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz");
    let grace = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert!(
        grace > 20,
        "terminationGracePeriodSeconds {grace} covers the shutdown grace"
    );
}

#[test]
fn notification_webhooks_mount_their_secret_and_pass_only_its_path() {
    let objects = render(&[
        "notifications.webhooks[0].name=ops",
        "notifications.webhooks[0].format=slack",
        "notifications.webhooks[0].secretKeyRef.name=agentrt-slack",
        "notifications.webhooks[0].secretKeyRef.key=url",
        "notifications.webhooks[1].name=bus",
        "notifications.webhooks[1].format=cloudevents",
        "notifications.webhooks[1].secretKeyRef.name=bus-hook",
        "notifications.webhooks[1].secretKeyRef.key=endpoint",
        "notifications.queue=50",
    ]);
    assert_valid(&objects);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for arg in [
        "--notify-webhook=name=ops,format=slack,url-file=/etc/agentrt/notify/ops/url",
        "--notify-webhook=name=bus,format=cloudevents,url-file=/etc/agentrt/notify/bus/url",
        "--notify-queue=50",
        "--notify-attempts=10",
        "--notify-console-url=http://127.0.0.1:8765",
    ] {
        assert!(args.contains(&arg), "{arg} missing: {args:?}");
    }
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "notify-bus"))
        .expect("the bus webhook's volume");
    assert_eq!(volume["secret"]["secretName"], "bus-hook");
    assert_eq!(
        volume["secret"]["items"],
        serde_json::json!([{"key": "endpoint", "path": "url"}])
    );
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "notify-ops"))
        .expect("the ops webhook's mount");
    assert_eq!(mount["mountPath"], "/etc/agentrt/notify/ops");
    assert_eq!(mount["readOnly"], true);
    // Without the webhook's certificate, the notification volumes stand alone.
    let objects = render(&[
        "webhook.enabled=false",
        "notifications.webhooks[0].name=ops",
        "notifications.webhooks[0].format=slack",
        "notifications.webhooks[0].secretKeyRef.name=agentrt-slack",
        "notifications.webhooks[0].secretKeyRef.key=url",
    ]);
    assert_valid(&objects);
    // A literal URL is not a value the chart takes.
    let out = template_setting("notifications.webhooks[0].url=https://hooks.example/x");
    assert!(!out.status.success(), "a literal URL must be refused");
    // No webhook: no notification flag.
    let objects = render(&[]);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    assert!(
        !deployment.to_string().contains("--notify-"),
        "notification flags rendered without a webhook"
    );
}
