//! Scenarios: CRDs whose CEL rules kube-apiserver refuses when the CRD is created or updated
//! (undefined fields, type errors, undeclared functions, untyped schemas, costs over budget), sent
//! to the cluster under test (the embedded server, or a real one with `AGENTRT_TEST_KUBECONFIG`).
//! Each asserts the answer's status code, reason, and every cause's reason, field and message, as
//! kube-apiserver v1.34 gives them; CRDs that must be accepted are created with `dryRun=All`.

use serde_json::Value;

use crate::support::cluster::TestCluster;
use crate::support::fixtures;

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// `tests/fixtures/devcluster/cel/<name>` (a folder of its own: `agentrt dev --crds-dir` of
/// `tests/fixtures/devcluster` must not load these CRDs, some of which are refused on purpose).
fn fixture(name: &str) -> Value {
    let name = name.strip_prefix("cel-").unwrap_or(name);
    let text =
        std::fs::read_to_string(fixtures::devcluster("cel").join(name)).expect("fixture readable");
    serde_yaml::from_str(&text).expect("fixture is YAML")
}

/// Sends `body` (JSON) with `method` to `path`; returns the status code and the answer.
async fn send(c: &TestCluster, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let bytes = body
        .map(|b| serde_json::to_vec(b).expect("json"))
        .unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", "application/json")
        .body(kube::client::Body::from(bytes))
        .expect("request");
    let response = c.client().send(request).await.expect("answered");
    let code = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await.expect("body");
    (code, serde_json::from_slice(&bytes).expect("a JSON answer"))
}

/// Creates `crd` with `dryRun=All` (nothing is stored).
async fn create_dry_run(c: &TestCluster, crd: &Value) -> (u16, Value) {
    send(c, "POST", &format!("{CRDS}?dryRun=All"), Some(crd)).await
}

/// The causes of a refusal: (reason, field, message).
fn causes(status: &Value) -> Vec<(String, String, String)> {
    status["details"]["causes"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|c| {
                    let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
                    (s("reason"), s("field"), s("message"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn cause(reason: &str, field: &str, message: &str) -> (String, String, String) {
    (reason.to_string(), field.to_string(), message.to_string())
}

fn assert_invalid(code: u16, status: &Value, expected: &[(String, String, String)]) {
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid", "{status}");
    assert_eq!(status["details"]["kind"], "CustomResourceDefinition");
    assert_eq!(causes(status), expected, "{status:#}");
}

const SPEC: &str = "spec.validation.openAPIV3Schema.properties[spec]";

#[tokio::test]
async fn rule_naming_an_untyped_field_is_refused_as_undefined() {
    let c = TestCluster::start().await;
    let (code, status) = create_dry_run(&c, &fixture("cel-undefined-field-crd.yaml")).await;
    assert_invalid(
        code,
        &status,
        &[cause(
            "FieldValueInvalid",
            &format!("{SPEC}.x-kubernetes-validations[0].rule"),
            "Invalid value: {\"Rule\":\"has(self.capability) == has(oldSelf.capability)\",\"Message\":\"capability is write-once\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: \
ERROR: <input>:1:4: undefined field 'capability'\n | has(self.capability) == has(oldSelf.capability)\n | ...^\n\
ERROR: <input>:1:28: undefined field 'capability'\n | has(self.capability) == has(oldSelf.capability)\n | ...........................^",
        )],
    );
    // The message kubectl shows names the field and the rule.
    assert!(status["message"]
        .as_str()
        .unwrap_or("")
        .starts_with("CustomResourceDefinition.apiextensions.k8s.io \"celundefineds.cel.example.dev\" is invalid: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: "));
}

#[tokio::test]
async fn type_errors_and_undeclared_functions_are_refused_rule_by_rule() {
    let c = TestCluster::start().await;
    let (code, status) = create_dry_run(&c, &fixture("cel-type-errors-crd.yaml")).await;
    let rule = |i: usize| format!("{SPEC}.x-kubernetes-validations[{i}].rule");
    let value = |rule: &str, extra: &str| {
        format!("Invalid value: {{\"Rule\":\"{rule}\",\"Message\":\"\",\"MessageExpression\":\"{extra}\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}}")
    };
    assert_invalid(
        code,
        &status,
        &[
            cause(
                "FieldValueInvalid",
                &rule(0),
                &format!("{}: compilation failed: ERROR: <input>:1:12: found no matching overload for '_==_' applied to '(int, string)'\n | self.count == 'x'\n | ...........^", value("self.count == 'x'", "")),
            ),
            cause(
                "FieldValueInvalid",
                &rule(1),
                &format!("{}: compilation failed: ERROR: <input>:1:4: undeclared reference to 'foo' (in container '')\n | foo(self.count)\n | ...^", value("foo(self.count)", "")),
            ),
            cause(
                "FieldValueInvalid",
                &rule(2),
                &format!("{}: compilation failed: ERROR: <input>:1:14: undeclared reference to 'foo' (in container '')\n | self.name.foo()\n | .............^", value("self.name.foo()", "")),
            ),
            cause(
                "FieldValueInvalid",
                &rule(3),
                &format!("{}: cel expression must evaluate to a bool", value("self.count + 1", "")),
            ),
            cause(
                "FieldValueInvalid",
                &format!("{SPEC}.x-kubernetes-validations[4].messageExpression"),
                &format!("{}: messageExpression must evaluate to a string", value("self.count \\u003e 0", "self.count")),
            ),
            cause(
                "FieldValueInvalid",
                &rule(5),
                "Invalid value: {\"Rule\":\"self.count.value \\u003e 0 \\u0026\\u0026 self.name.size() \\u003c 10\",\"Message\":\"\",\"MessageExpression\":\"\",\"Reason\":\"FieldValueForbidden\",\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:11: type 'int' does not support field selection\n | self.count.value > 0 && self.name.size() < 10\n | ..........^",
            ),
        ],
    );
}

#[tokio::test]
async fn rule_on_a_schema_without_a_type_is_an_internal_error() {
    let c = TestCluster::start().await;
    let (code, status) = create_dry_run(&c, &fixture("cel-untyped-rule-crd.yaml")).await;
    assert_invalid(
        code,
        &status,
        &[cause(
            "InternalError",
            &format!("{SPEC}.properties[raw].x-kubernetes-validations"),
            "Internal error: internal error: failed to construct type information for x-kubernetes-validations rules: unable to convert structural schema to CEL declarations",
        )],
    );
}

#[tokio::test]
async fn rules_over_their_cost_budget_are_forbidden_per_version() {
    let c = TestCluster::start().await;
    let (code, status) = create_dry_run(&c, &fixture("cel-cost-crd.yaml")).await;
    let advice = "(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)";
    let v0 = "spec.versions[0].schema.openAPIV3Schema";
    assert_invalid(
        code,
        &status,
        &[
            cause(
                "FieldValueForbidden",
                &format!("{v0}.properties[spec].properties[tags].x-kubernetes-validations[0].rule"),
                &format!("Forbidden: estimated rule cost exceeds budget by factor of more than 100x {advice}"),
            ),
            cause(
                "FieldValueForbidden",
                &format!("{v0}.properties[spec].properties[tags].x-kubernetes-validations[0].rule"),
                "Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ),
            cause(
                "FieldValueForbidden",
                v0,
                &format!("Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x {advice}"),
            ),
            cause(
                "FieldValueForbidden",
                "spec.versions[1].schema.openAPIV3Schema.properties[spec].properties[tags].items.x-kubernetes-validations[0].rule",
                &format!("Forbidden: estimated rule cost exceeds budget by factor of 3.1x {advice}"),
            ),
        ],
    );
}

#[tokio::test]
async fn rules_that_type_check_within_budget_are_accepted() {
    let c = TestCluster::start().await;
    let (code, status) = create_dry_run(&c, &fixture("cel-accepted-crd.yaml")).await;
    assert_eq!(code, 201, "{status:#}");
    assert_eq!(status["kind"], "CustomResourceDefinition");
}

/// Our own CRDs, under another plural so that a cluster which has them installed still answers
/// the dry-run create.
#[tokio::test]
async fn our_crds_are_accepted() {
    let c = TestCluster::start().await;
    for file in ["agentruns.yaml", "agentrunsegments.yaml", "approvals.yaml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(file);
        let text = std::fs::read_to_string(path).expect("crd readable");
        let mut crd: Value = serde_yaml::from_str(&text).expect("crd is YAML");
        let plural = format!(
            "celcheck{}",
            crd["spec"]["names"]["plural"].as_str().unwrap_or("")
        );
        let group = crd["spec"]["group"].as_str().unwrap_or("").to_string();
        crd["metadata"] = serde_json::json!({"name": format!("{plural}.{group}")});
        crd["spec"]["names"]["plural"] = Value::String(plural.clone());
        crd["spec"]["names"]["singular"] = Value::String(plural.trim_end_matches('s').to_string());
        crd["spec"]["names"]["kind"] = Value::String(format!(
            "CelCheck{}",
            crd["spec"]["names"]["kind"].as_str().unwrap_or("")
        ));
        crd["spec"]["names"]["listKind"] = Value::Null;
        crd["spec"]["names"]["shortNames"] = Value::Null;
        let (code, status) = create_dry_run(&c, &crd).await;
        assert_eq!(code, 201, "{file}: {status:#}");
    }
}

#[tokio::test]
async fn update_adding_a_rule_that_does_not_compile_is_refused_and_keeps_the_crd() {
    let c = TestCluster::start().await;
    let suffix = c.namespace().rsplit('-').next().unwrap_or("x").to_string();
    let plural = format!("celupdates{suffix}");
    let mut crd = fixture("cel-accepted-crd.yaml");
    crd["metadata"]["name"] = Value::String(format!("{plural}.cel.example.dev"));
    crd["spec"]["names"] = serde_json::json!({"plural": plural, "singular": format!("celupdate{suffix}"),
        "kind": format!("CelUpdate{suffix}"), "listKind": format!("CelUpdate{suffix}List")});
    let (code, created) = send(&c, "POST", CRDS, Some(&crd)).await;
    assert_eq!(code, 201, "{created:#}");
    let name = format!("{plural}.cel.example.dev");

    // The server writes the CRD's status after creating it: update the latest version, and again
    // when that changes under us (409).
    let mut answer = (0, Value::Null);
    for _ in 0..10 {
        let (_, mut changed) = send(&c, "GET", &format!("{CRDS}/{name}"), None).await;
        let spec_rules = &mut changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            ["properties"]["spec"]["x-kubernetes-validations"];
        if let Some(list) = spec_rules.as_array_mut() {
            list.push(serde_json::json!({"rule": "self.nothing == 1"}));
        }
        answer = send(&c, "PUT", &format!("{CRDS}/{name}"), Some(&changed)).await;
        if answer.0 != 409 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (code, status) = answer;
    let (_, stored) = send(&c, "GET", &format!("{CRDS}/{name}"), None).await;
    let _ = send(&c, "DELETE", &format!("{CRDS}/{name}"), None).await;
    assert_invalid(
        code,
        &status,
        &[cause(
            "FieldValueInvalid",
            &format!("{SPEC}.x-kubernetes-validations[7].rule"),
            "Invalid value: {\"Rule\":\"self.nothing == 1\",\"Message\":\"\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:5: undefined field 'nothing'\n | self.nothing == 1\n | ....^",
        )],
    );
    let kept = &stored["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["x-kubernetes-validations"];
    assert_eq!(
        kept.as_array().map(Vec::len),
        Some(7),
        "the CRD is unchanged"
    );
}
