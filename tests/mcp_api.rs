//! The CRD's MCP fields as an API server enforces them (docs/design.md section 6): an
//! `mcp` tool without `inputSchema`, a `job` tool and a toolset are accepted; two executors or none, an
//! `http` tool without `inputSchema`, and a toolset name that is not a valid function name,
//! leaves no room for `<name>__<tool>` or repeats a tool's name are refused with a message
//! naming the field. Runs against the embedded API server, or a real cluster when
//! `AGENTRT_TEST_KUBECONFIG` is set.

mod support;

use support::cli::text;
use support::cluster::TestCluster;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(support::fixtures::path(&format!("mcp/{name}"))).expect("fixture")
}

fn refused(c: &TestCluster, name: &str) -> String {
    let out = c.apply(&fixture(name));
    assert!(!out.status.success(), "the API server accepted {name}");
    text(&out)
}

#[tokio::test]
async fn an_mcp_tool_and_a_toolset_are_accepted_with_their_defaults() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let out = c.apply(&fixture("run.yaml"));
    assert!(out.status.success(), "{}", text(&out));
    let spec: serde_json::Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "agentrun",
        "mcp-shop",
        "-o",
        "jsonpath={.spec}",
    ]))
    .expect("spec is JSON");
    assert_eq!(spec["toolSets"][0]["sideEffect"], "RemoteMutation");
    assert_eq!(spec["tools"][0]["timeoutSeconds"], 30);
    assert!(spec["tools"][0].get("inputSchema").is_none(), "{spec}");
    assert_eq!(spec["tools"][1]["mcp"]["tool"], "lookup_order");
}

#[tokio::test]
async fn a_tool_needs_exactly_one_executor_and_an_http_tool_its_input_schema() {
    let c = TestCluster::start_with_agentrt_crds().await;
    for name in ["refused-both-executors.yaml", "refused-no-executor.yaml"] {
        let msg = refused(&c, name);
        assert!(
            msg.contains("spec.tools[0]") && msg.contains("exactly one executor: http, mcp or job"),
            "{name}: {msg}"
        );
    }
    let msg = refused(&c, "refused-http-without-schema.yaml");
    assert!(
        msg.contains("spec.tools[1]")
            && msg.contains("inputSchema is required for an http or job tool"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_toolset_name_is_a_function_name_with_room_and_differs_from_the_tools() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let msg = refused(&c, "refused-set-name-invalid.yaml");
    assert!(
        msg.contains("spec.toolSets[0]") && msg.contains("valid function name"),
        "{msg}"
    );
    let msg = refused(&c, "refused-set-name-long.yaml");
    assert!(msg.contains("spec.toolSets[0].name"), "{msg}");
    let msg = refused(&c, "refused-set-name-clash.yaml");
    assert!(
        msg.contains("spec.toolSets[].name must differ from every spec.tools[].name"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_pin_in_the_status_is_kept_as_written_unknown_annotations_included() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let out = c.apply(&fixture("run.yaml"));
    assert!(out.status.success(), "{}", text(&out));
    let pin = serde_json::json!({
        "tool": "lookup_order",
        "server": "http://127.0.0.1:8089/mcp",
        "serverTool": "lookup_order",
        "sha256": format!("sha256:{}", "ab".repeat(32)),
        "definition": {
            "name": "lookup_order",
            "title": "Look up an order",
            "description": "Read an order.",
            "inputSchema": {"type": "object", "properties": {"order": {"type": "integer", "minimum": 1}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false, "vendorHint": {"x": 1}}
        }
    });
    let patch = serde_json::json!({"status": {"toolPins": [pin]}}).to_string();
    let out = c.kubectl(&[
        "patch",
        "agentrun",
        "mcp-shop",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let pins: serde_json::Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "agentrun",
        "mcp-shop",
        "-o",
        "jsonpath={.status.toolPins}",
    ]))
    .expect("toolPins is JSON");
    assert_eq!(pins, serde_json::json!([pin]));
}

/// A `job` tool is an executor the CRD accepts (docs/design.md section 6, "Job tools"), on the
/// embedded server and a real one alike; with `http` beside it the tool has two and is refused.
#[tokio::test]
async fn a_job_tool_is_one_executor_and_with_http_beside_it_two() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let run = |name: &str, extra: &str| {
        format!(
            r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata:
  name: {name}
spec:
  goal: Build a report.
  agent:
    scripted:
      decisions:
      - {{kind: complete, result: {{}}}}
  tools:
  - name: report
    description: Builds a report in a Job.
    sideEffect: LocalMutation
    inputSchema: {{type: object}}
    job:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: report, image: registry.local/report:1}}]
{extra}"#
        )
    };
    let out = c.apply(&run("job-tool", ""));
    assert!(
        out.status.success(),
        "a Job tool is accepted: {}",
        text(&out)
    );
    let job = c.kubectl_ok(&[
        "get",
        "agentrun",
        "job-tool",
        "-o",
        "jsonpath={.spec.tools[0].job.template.spec.containers[0].image}",
    ]);
    assert_eq!(job.trim(), "registry.local/report:1");
    let out = c.apply(&run(
        "job-and-http",
        "    http: {url: \"http://127.0.0.1:1/x\"}\n",
    ));
    assert!(!out.status.success(), "two executors were accepted");
    let msg = text(&out);
    assert!(
        msg.contains("spec.tools[0]") && msg.contains("exactly one executor: http, mcp or job"),
        "{msg}"
    );
}
