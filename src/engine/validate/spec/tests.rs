//! One test per rule of [`super::spec`] (docs/behaviours.md 1).

use serde_json::json;

use super::{render, spec, Problem};
use crate::api::AgentRunSpec;

/// docs/design.md section 2's minimal run, with a policy rule.
const GOOD: &str = r#"
goal: Refund order 1042 if it arrived damaged.
agent:
  scripted:
    decisions:
    - {kind: complete, result: {}}
tools:
- name: lookup_order
  sideEffect: ReadOnly
  timeoutSeconds: 10
  inputSchema: {type: object, required: [order], properties: {order: {type: integer}}}
  http: {url: "http://127.0.0.1:8089/lookup_order"}
- name: issue_refund
  sideEffect: RemoteMutation
  inputSchema: {type: object, properties: {amount: {type: number}}}
  http: {url: "https://tools.example.com/issue_refund"}
policy:
  rules:
  - name: small-refunds
    tools: [issue_refund]
    when: "has(args.amount) && args.amount <= 100"
    outcome: Allow
"#;

fn good() -> AgentRunSpec {
    serde_yaml::from_str(GOOD).expect("the good spec decodes")
}

fn fields(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.field.as_str()).collect()
}

/// The one problem of `s`, asserting there is exactly one and it is at `field`.
fn only(s: &AgentRunSpec, field: &str) -> String {
    let problems = spec(s);
    assert_eq!(fields(&problems), vec![field], "{problems:?}");
    problems[0].message.clone()
}

#[test]
fn the_minimal_run_of_the_design_has_no_problem() {
    assert_eq!(spec(&good()), vec![]);
}

#[test]
fn a_tool_name_a_model_api_refuses_is_a_problem_naming_the_fix() {
    let mut s = good();
    s.tools[0].name = "get weather!".into();
    assert_eq!(
        spec(&s)[0].to_string(),
        "spec.tools[0].name: \"get weather!\" is not a valid function name; use letters, digits, \
         _ and - (1-64 characters)"
    );
    for bad in ["", &"a".repeat(65), "naïve", "a.b"] {
        s.tools[0].name = bad.to_string();
        only(&s, "spec.tools[0].name");
    }
    s.tools[0].name = "a".repeat(64);
    assert_eq!(spec(&s), vec![]);
}

#[test]
fn a_repeated_tool_name_or_one_taken_by_a_toolset_is_a_problem() {
    let mut s = good();
    s.tools[1].name = "lookup_order".into();
    assert!(only(&s, "spec.tools[1].name").contains("repeats spec.tools[0].name"));
    let mut s = good();
    s.tool_sets = serde_yaml::from_str(r#"[{name: lookup_order, mcp: {url: "http://m/mcp"}}]"#)
        .expect("toolset");
    assert!(only(&s, "spec.tools[0].name").contains("spec.toolSets[0].name"));
}

#[test]
fn a_tool_timeout_of_zero_is_a_problem() {
    let mut s = good();
    s.tools[1].timeout_seconds = 0;
    assert!(only(&s, "spec.tools[1].timeoutSeconds").contains("must be > 0 (got 0)"));
}

#[test]
fn a_tool_with_no_executor_or_two_is_a_problem() {
    let mut s = good();
    s.tools[0].http = None;
    assert!(only(&s, "spec.tools[0]").contains("has no executor"));
    let mut s = good();
    s.tools[0].mcp = Some(Box::new(
        serde_json::from_value(json!({"url": "http://m/mcp"})).expect("mcp"),
    ));
    assert!(only(&s, "spec.tools[0]").contains("more than one of http, mcp and job"));
}

#[test]
fn a_job_template_without_an_image_or_with_a_restart_policy_a_job_refuses_is_a_problem() {
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].job = Some(Box::new(
        serde_json::from_value(json!({"template": {"spec": {
            "restartPolicy": "Always",
            "containers": [{"name": "main"}],
        }}}))
        .expect("job"),
    ));
    let problems = spec(&s);
    let at = |field: &str| problem_at(&problems, field);
    assert!(at("spec.tools[0].job.template.spec.containers[0].image").contains("is missing"));
    assert!(at("spec.tools[0].job.template.spec.restartPolicy").contains("Never or OnFailure"));
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].job = Some(Box::new(
        serde_json::from_value(json!({"template": {"spec": {
            "containers": [{"name": "main", "image": "registry.local/work:1"}],
        }}}))
        .expect("job"),
    ));
    assert!(
        spec(&s).iter().all(|p| !p.field.contains("job")),
        "a good template passes"
    );
}

#[test]
fn a_job_template_setting_what_agentrt_sets_or_a_pod_refuses_is_a_problem_naming_it() {
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].job = Some(Box::new(
        serde_json::from_value(json!({"template": {
            "metadata": {"namespace": "kube-system", "finalizers": ["x"],
                         "labels": {"agentrt.dev/run-uid": "someone"}},
            "spec": {
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "containers": [
                    {"name": "main", "image": "registry.local/work:1",
                     "env": [{"name": "AGENTRT_ARGS", "value": "{}"}]},
                    {"name": "main", "image": "registry.local/work:1"},
                    {"name": "Bad_Name", "image": "registry.local/work:1"},
                ],
            },
        }}))
        .expect("job"),
    ));
    let problems = spec(&s);
    let at = |field: &str| problem_at(&problems, field);
    let t = "spec.tools[0].job.template";
    assert!(at(&format!("{t}.metadata.namespace")).contains("set by the Job"));
    assert!(at(&format!("{t}.metadata.finalizers")).contains("remove it"));
    assert!(at(&format!("{t}.metadata.labels")).contains("agentrt.dev/run-uid"));
    assert!(at(&format!("{t}.spec.ephemeralContainers")).contains("remove them"));
    assert!(at(&format!("{t}.spec.containers[0].env[0].name")).contains("AGENTRT_ARGS"));
    assert!(at(&format!("{t}.spec.containers[1].name")).contains("taken by another"));
    assert!(at(&format!("{t}.spec.containers[2].name")).contains("not a container name"));
}

#[test]
fn headers_agentrt_or_the_transport_set_and_invalid_values_are_problems() {
    let header = |name: &str, value: &str| -> crate::api::HttpHeader {
        serde_json::from_value(json!({"name": name, "value": value})).expect("header")
    };
    let mut s = good();
    s.tools[0].http.as_mut().expect("http").headers = vec![
        header("Idempotency-Key", "mine"),
        header("X-A", "a\r\nX-Injected: 1"),
        header("Bad Name", "x"),
        header("Accept", "application/json"),
    ];
    let problems = spec(&s);
    let at = |field: &str| problem_at(&problems, field);
    let h = "spec.tools[0].http.headers";
    assert!(at(&format!("{h}[0].name")).contains("Idempotency-Key is set by agentrt"));
    assert!(at(&format!("{h}[1].value")).contains("not a valid HTTP header value"));
    assert!(at(&format!("{h}[2].name")).contains("not a valid HTTP header name"));
    assert!(
        problems.iter().all(|p| p.field != format!("{h}[3].name")),
        "an http tool may say what it accepts"
    );
    // An mcp tool may not set the transport's headers.
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].input_schema = serde_json::Value::Null;
    s.tools[0].mcp = Some(Box::new(
        serde_json::from_value(json!({"url": "http://127.0.0.1:1/mcp",
            "headers": [{"name": "mcp-protocol-version", "value": "2025-03-26"},
                        {"name": "Authorization", "value": "Bearer x"}]}))
        .expect("mcp"),
    ));
    let problems = spec(&s);
    assert!(
        problems
            .iter()
            .any(|p| p.field == "spec.tools[0].mcp.headers[0].name"
                && p.message.contains("MCP-Protocol-Version")),
        "{problems:?}"
    );
    assert!(problems
        .iter()
        .all(|p| p.field != "spec.tools[0].mcp.headers[1].name"));
}

#[test]
fn an_http_url_that_is_not_http_or_https_is_a_problem() {
    for bad in [
        "ftp://x/y",
        "localhost:8080/x",
        "/relative",
        "not a url",
        "",
        "http://",
    ] {
        let mut s = good();
        s.tools[0].http.as_mut().expect("http").url = bad.into();
        let message = only(&s, "spec.tools[0].http.url");
        assert!(
            message.contains("https://tools.example.com"),
            "{bad}: {message}"
        );
    }
}

#[test]
fn agent_and_hook_urls_must_be_http_or_https_too() {
    let mut s = good();
    s.agent = serde_yaml::from_str("{webhook: {url: 'tcp://agent'}}").expect("agent");
    s.reconcile = serde_yaml::from_str("{webhook: {url: 'hook'}}").expect("hook");
    assert_eq!(
        fields(&spec(&s)),
        vec!["spec.agent.webhook.url", "spec.reconcile.webhook.url"]
    );
    let mut s = good();
    s.agent =
        serde_yaml::from_str("{openai: {baseURL: 'api.openai.com/v1', model: m}}").expect("openai");
    only(&s, "spec.agent.openai.baseURL");
}

#[test]
fn an_agent_that_sets_none_or_two_of_its_kinds_is_a_problem() {
    let mut s = good();
    s.agent.scripted = None;
    assert!(only(&s, "spec.agent").contains("sets 0"));
    let mut s = good();
    s.agent.webhook = Some(serde_yaml::from_str("{url: 'http://a/b'}").expect("webhook"));
    assert!(only(&s, "spec.agent").contains("sets 2"));
}

#[test]
fn an_input_schema_that_is_not_a_json_schema_is_a_problem() {
    let mut s = good();
    s.tools[0].input_schema = json!({"type": "objekt"});
    let message = only(&s, "spec.tools[0].inputSchema");
    assert!(message.contains("not a valid JSON Schema"), "{message}");
    s.tools[0].input_schema = json!({});
    only(&s, "spec.tools[0].inputSchema");
    s.tools[0].input_schema = json!(null);
    only(&s, "spec.tools[0].inputSchema");
    s.tools[0].input_schema = json!("object");
    only(&s, "spec.tools[0].inputSchema");
    s.tools[0].input_schema = json!({"$ref": "https://example.com/s.json"});
    assert!(only(&s, "spec.tools[0].inputSchema").contains("outside the schema"));
}

#[test]
fn an_mcp_tool_may_leave_its_input_schema_to_the_server() {
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].mcp = Some(Box::new(
        serde_json::from_value(json!({"url": "http://m/mcp"})).expect("mcp"),
    ));
    s.tools[0].input_schema = json!(null);
    assert_eq!(spec(&s), vec![]);
}

#[test]
fn a_when_that_is_not_cel_is_a_problem() {
    let mut s = good();
    s.policy.rules[0].when = Some("args.amount <=> 100 &&".into());
    assert!(only(&s, "spec.policy.rules[0].when").contains("does not compile"));
    s.policy.rules[0].when = Some("amount <= 100".into());
    assert!(only(&s, "spec.policy.rules[0].when").contains("`amount`"));
}

#[test]
fn an_empty_glob_or_a_capability_that_is_not_an_object_is_a_problem() {
    let mut s = good();
    s.policy.rules[0].tools = vec![String::new()];
    only(&s, "spec.policy.rules[0].tools[0]");
    let mut s = good();
    s.policy.rules[0].presentation = Some(json!([1]));
    only(&s, "spec.policy.rules[0].presentation");
    let mut s = good();
    s.policy.rules[0].capability = Some(json!({"max": u64::MAX}));
    only(&s, "spec.policy.rules[0].capability.max");
}

#[test]
fn limits_at_zero_or_below_are_problems() {
    let mut s = good();
    s.limits.max_steps = 0;
    s.limits.loop_threshold = -1;
    s.limits.max_model_calls = Some(0);
    assert_eq!(
        fields(&spec(&s)),
        vec![
            "spec.limits.maxSteps",
            "spec.limits.loopThreshold",
            "spec.limits.maxModelCalls"
        ]
    );
    let mut s = good();
    s.lease_duration_seconds = 1;
    only(&s, "spec.leaseDurationSeconds");
    let mut s = good();
    s.goal = " ".into();
    only(&s, "spec.goal");
}

#[test]
fn a_toolset_with_a_bad_name_url_or_glob_is_a_problem() {
    let mut s = good();
    s.tool_sets = serde_yaml::from_str(&format!(
        "[{{name: '{}', mcp: {{url: 'mcp'}}, include: ['']}}]",
        "s".repeat(62)
    ))
    .expect("toolset");
    assert_eq!(
        fields(&spec(&s)),
        vec![
            "spec.toolSets[0].name",
            "spec.toolSets[0].mcp.url",
            "spec.toolSets[0].include[0]"
        ]
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut s = good();
    s.tools[0].name = "get weather!".into();
    s.tools[1].input_schema = json!({"type": "objekt"});
    s.tools[1].http.as_mut().expect("http").url = "file:///etc/passwd".into();
    s.policy.rules[0].when = Some("args.amount <=> 100 &&".into());
    let problems = spec(&s);
    assert_eq!(
        fields(&problems),
        vec![
            "spec.tools[0].name",
            "spec.tools[1].http.url",
            "spec.tools[1].inputSchema",
            "spec.policy.rules[0].when"
        ]
    );
    let all = render(&problems);
    assert!(
        all.starts_with("spec.tools[0].name: \"get weather!\""),
        "{all}"
    );
    assert_eq!(all.matches("; spec.").count(), 3, "{all}");
}

#[test]
fn a_header_with_neither_value_nor_secret_or_both_is_a_problem() {
    let mut s = good();
    s.tools[0].http.as_mut().expect("http").headers = serde_yaml::from_str(
        "[{name: A, value: x}, {name: B}, {name: C, value: y, secretKeyRef: {name: s, key: k}}]",
    )
    .expect("headers");
    let problems = spec(&s);
    assert_eq!(
        fields(&problems),
        vec![
            "spec.tools[0].http.headers[1]",
            "spec.tools[0].http.headers[2]"
        ],
        "{problems:?}"
    );
    assert!(problems[0]
        .message
        .contains("neither value nor secretKeyRef"));
    assert!(problems[1].message.contains("both value and secretKeyRef"));
}

#[test]
fn a_tool_named_like_a_built_in_function_is_a_problem() {
    for name in ["agentrt_complete", "agentrt_fail"] {
        let mut s = good();
        s.tools[0].name = name.to_string();
        let message = only(&s, "spec.tools[0].name");
        assert!(message.contains("built-in function"), "{message}");
    }
}

#[test]
fn a_spec_nested_deeper_than_the_bound_is_a_problem_naming_where() {
    fn nested(depth: usize) -> serde_json::Value {
        let mut value = json!(1);
        for _ in 0..depth {
            value = json!({ "a": value });
        }
        value
    }
    // spec.agent.scripted.decisions[0].result is 5 levels down: 59 more still fit.
    for (depth, fits) in [(58, true), (59, true), (60, false), (100, false)] {
        let mut s = good();
        let mut spec_json = serde_json::to_value(&s).expect("encodes");
        spec_json["agent"]["scripted"]["decisions"][0]["result"] = nested(depth);
        s = serde_json::from_value(spec_json).expect("decodes");
        let problems = spec(&s);
        if fits {
            assert!(problems.is_empty(), "{depth}: {problems:?}");
        } else {
            assert_eq!(problems.len(), 1, "{depth}: {problems:?}");
            let field = &problems[0].field;
            assert!(
                field.starts_with("spec.agent.scripted.decisions[0].result.a.a"),
                "{field}"
            );
            assert!(problems[0].message.contains("deeper than 64 levels"));
        }
    }
}

#[test]
fn a_status_url_names_the_key_as_its_one_placeholder_and_is_http() {
    let field = "spec.tools[0].http.reconcile.statusURL";
    for (bad, says) in [
        ("https://tool.example/calls", "has no {key}"),
        ("https://tool.example/{run}/{key}", "only placeholder"),
        (
            "ftp://tool.example/{key}",
            "https://tools.example.com/calls/{key}",
        ),
        ("http://{key}.tool.example/status", "in the host"),
    ] {
        let mut s = good();
        s.tools[0].http.as_mut().expect("http").reconcile =
            Some(serde_yaml::from_str(&format!("{{statusURL: '{bad}'}}")).expect("reconcile"));
        let message = only(&s, field);
        assert!(message.contains(says), "{bad}: {message}");
    }
    let mut s = good();
    s.tools[0].http.as_mut().expect("http").reconcile = Some(
        serde_yaml::from_str(
            "{statusURL: 'https://tool.example/calls/{key}', idempotencyKeys: Honored}",
        )
        .expect("reconcile"),
    );
    assert!(spec(&s).is_empty(), "{:?}", spec(&s));
}

/// The message of the problem at `field`; panics listing every problem when there is none.
fn problem_at(problems: &[Problem], field: &str) -> String {
    problems
        .iter()
        .find(|p| p.field == field)
        .map(|p| p.message.clone())
        .unwrap_or_else(|| panic!("no problem at {field}: {problems:?}"))
}

#[test]
fn oauth_beside_an_authorization_header_or_with_bad_scopes_is_a_problem_naming_the_field() {
    let mut s = good();
    s.tools[0].http = None;
    s.tools[0].input_schema = serde_json::Value::Null;
    s.tools[0].mcp = Some(Box::new(
        serde_json::from_value(json!({"url": "http://127.0.0.1:1/mcp",
            "headers": [{"name": "authorization", "value": "Bearer x"}],
            "oauth": {"clientSecretRef": {"name": "client"}, "scopes": ["tools", "", "read write"]}}))
        .expect("mcp"),
    ));
    let problems = spec(&s);
    let at = |field: &str| problem_at(&problems, field);
    let header = at("spec.tools[0].mcp.headers[0].name");
    assert!(
        header.contains("Authorization is sent by oauth") && !header.contains("  "),
        "{header}"
    );
    assert!(at("spec.tools[0].mcp.oauth.scopes[1]").contains("is empty"));
    assert!(at("spec.tools[0].mcp.oauth.scopes[2]").contains("not one scope"));
    assert!(problems
        .iter()
        .all(|p| p.field != "spec.tools[0].mcp.oauth.scopes[0]"));
}
