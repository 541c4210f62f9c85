//! The engine's rule modules working together on the docs/design.md section 2 example run: schemas
//! compile, args are checked, the policy decides, the approval hash binds the request as
//! kube-apiserver stores it, and content is bounded.

use agentrt::api::{AgentRun, ApprovalRequest, PolicyDecisionKind, RunRef, ToolRef};
use agentrt::engine::canonical::{canonical_json, content_hash};
use agentrt::engine::content::bound;
use agentrt::engine::hash::approval_hash;
use agentrt::engine::policy::evaluate;
use agentrt::engine::validate::{check_storable, ToolSchema};
use serde_json::{json, Value};

const MANIFEST: &str = r#"
apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {name: refund-1042, namespace: default}
spec:
  goal: Refund order 1042 if it arrived damaged.
  agent:
    scripted:
      decisions:
      - {kind: tool_call, tool: lookup_order, args: {order: 1042}}
      - {kind: tool_call, tool: issue_refund, args: {order: 1042, amount: 250}}
      - {kind: complete, result: {refunded: 250}}
  tools:
  - name: lookup_order
    description: Read an order.
    sideEffect: ReadOnly
    timeoutSeconds: 10
    inputSchema: {type: object, required: [order], properties: {order: {type: integer}}}
    http: {url: "http://127.0.0.1:8089/lookup_order"}
  - name: issue_refund
    description: Refund an order.
    sideEffect: RemoteMutation
    timeoutSeconds: 30
    inputSchema: {type: object, required: [order, amount], properties: {order: {type: integer}, amount: {type: number}}}
    http: {url: "http://127.0.0.1:8089/issue_refund"}
  policy:
    sideEffects: {ReadOnly: Allow, LocalMutation: Allow, RemoteMutation: RequireApproval, Destructive: Deny}
    rules:
    - name: small-refunds
      tools: [issue_refund]
      when: "args.amount <= 100"
      outcome: Allow
"#;

fn run() -> AgentRun {
    serde_yaml::from_str(MANIFEST).expect("the docs/design.md example decodes")
}

fn decision_args(run: &AgentRun, i: usize) -> Value {
    let decisions = &run
        .spec
        .agent
        .scripted
        .as_ref()
        .expect("scripted")
        .decisions;
    decisions[i]["args"].clone()
}

#[test]
fn the_design_example_refund_waits_for_approval_and_a_small_one_does_not() {
    let run = run();
    let tools = &run.spec.tools;
    let schemas: Vec<ToolSchema> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| ToolSchema::compile(i, t).expect("schema compiles"))
        .collect();

    let lookup = decision_args(&run, 0);
    check_storable(&lookup).expect("storable");
    schemas[0].check(&lookup).expect("lookup args pass");
    let d = evaluate(&run.spec.policy, &tools[0], &lookup).expect("policy");
    assert_eq!(d.decision, PolicyDecisionKind::Allow);

    let refund = decision_args(&run, 1);
    schemas[1].check(&refund).expect("refund args pass");
    let d = evaluate(&run.spec.policy, &tools[1], &refund).expect("policy");
    assert_eq!(d.decision, PolicyDecisionKind::RequireApproval);
    assert_eq!(d.approval_kind.as_deref(), Some("policy"));

    let small = json!({"order": 1042, "amount": 50.0});
    let d = evaluate(&run.spec.policy, &tools[1], &small).expect("policy");
    assert_eq!(d.decision, PolicyDecisionKind::Allow);
    assert_eq!(d.rule.as_deref(), Some("small-refunds"));

    let bad = json!({"order": "1042", "amount": 250});
    assert_eq!(
        schemas[1].check(&bad),
        Err(vec![
            r#"/order: "1042" is not of type "integer""#.to_string()
        ])
    );
}

#[test]
fn the_approval_hash_is_the_same_over_the_request_as_kubernetes_stores_it() {
    let run = run();
    let tool = &run.spec.tools[1];
    let request = |args: Value| ApprovalRequest {
        run: RunRef {
            namespace: "default".into(),
            name: "refund-1042".into(),
            uid: "uid-1".into(),
        },
        step: agentrt::api::StepIndex(1),
        tool: ToolRef {
            name: tool.name.clone(),
            description: tool.description.clone(),
            input_schema: tool.input_schema.clone(),
            side_effect: tool.side_effect,
            timeout_seconds: tool.timeout_seconds,
            terminal: tool.terminal,
            pin_sha256: None,
        },
        args,
    };
    let proposed = request(json!({"order": 1042, "amount": 250.0}));
    let hash = approval_hash("policy", None, None, &proposed).expect("hash");

    // kube-apiserver stores 250.0 as 250; the request read back hashes the same.
    let stored = serde_json::to_string(&proposed)
        .expect("json")
        .replace("250.0", "250");
    let read_back: ApprovalRequest = serde_json::from_str(&stored).expect("decodes");
    assert_eq!(read_back.args, json!({"order": 1042, "amount": 250}));
    assert_eq!(
        approval_hash("policy", None, None, &read_back).expect("hash"),
        hash
    );
}

#[test]
fn a_large_tool_result_is_bounded_with_its_hash_kept() {
    let content =
        json!({"orders": (0..5000).map(|i| json!({"id": i, "note": "x\"y"})).collect::<Vec<_>>()});
    let full = content_hash(&content).expect("hash");
    let bounded = bound(content, 16 * 1024);
    assert!(canonical_json(&bounded.content).expect("canonical").len() <= 16 * 1024);
    assert_eq!(bounded.content_hash, full);
    assert_eq!(bounded.truncated.map(|t| t.sha256), Some(full));
}
