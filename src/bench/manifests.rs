//! The AgentRuns the workloads create: scripted agents (so the runtime, not a model, sets the
//! pace) calling the benchmark's tool server.

use serde_json::{json, Value};

/// The tools every benchmark run declares (`{base}/{tool}` on the tool server). `refund` is a
/// `RemoteMutation`, so the default policy pauses it on an Approval; the others are `ReadOnly`.
fn tools(base: &str) -> Value {
    let tool = |name: &str, side_effect: &str, description: &str| {
        json!({
            "name": name,
            "description": description,
            "sideEffect": side_effect,
            "timeoutSeconds": 60,
            "inputSchema": {"type": "object", "properties": {"item": {"type": "integer"}}},
            "http": {"url": format!("{base}/{name}")},
        })
    };
    json!([
        tool("small", "ReadOnly", "Answers a small JSON object."),
        tool("large", "ReadOnly", "Answers a large JSON object."),
        tool("slow", "ReadOnly", "Answers after a while."),
        tool(
            "refund",
            "RemoteMutation",
            "Changes something remote (needs an approval)."
        ),
    ])
}

/// The most steps a benchmark run's agent is scripted for; a longer run asks the tool server's
/// webhook agent ([`super::tools`], `{base}/agent/{steps}/{tool}`) instead. A scripted agent's
/// spec holds every decision (10,000 decisions are 557 KiB), and the whole object is sent and
/// validated again with every status write, which on kube-apiserver slowed a 10,000-step run
/// to about one step a second.
pub const MAX_SCRIPTED_STEPS: usize = 2_000;

/// A run whose agent calls `tool` `steps` times (distinct args, so no loop is detected) and
/// then completes: a scripted agent up to [`MAX_SCRIPTED_STEPS`], the tool server's webhook
/// agent beyond (same decisions, a small spec). Interrupted steps (the takeover workload kills
/// the holder during calls) count as failed tool calls, so the consecutive-failure limit is
/// lifted.
pub fn tool_loop(name: &str, base: &str, tool: &str, steps: usize, lease_seconds: i64) -> Value {
    let agent = if steps > MAX_SCRIPTED_STEPS {
        json!({"webhook": {"url": format!("{base}/agent/{steps}/{tool}"), "timeoutSeconds": 60}})
    } else {
        let mut decisions: Vec<Value> = (0..steps)
            .map(|i| json!({"kind": "tool_call", "tool": tool, "args": {"item": i}}))
            .collect();
        decisions.push(json!({"kind": "complete", "result": {"steps": steps}}));
        json!({"scripted": {"decisions": decisions}})
    };
    json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": format!("Call {tool} {steps} times."),
            "agent": agent,
            "tools": tools(base),
            "limits": {"maxSteps": steps + 10, "maxConsecutiveToolFailures": steps + 10},
            "leaseDurationSeconds": lease_seconds,
        }
    })
}

/// A run whose first decision is a `RemoteMutation` the default policy sends to a person: it
/// waits for approval from its first write on.
pub fn waiting(name: &str, base: &str) -> Value {
    json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": "Change something once a person agrees.",
            "agent": {"scripted": {"decisions": [
                {"kind": "tool_call", "tool": "refund", "args": {"item": 1}},
                {"kind": "complete", "result": {"done": true}},
            ]}},
            "tools": tools(base),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_benchmark_runs_decode_as_agent_runs() {
        for run in [
            tool_loop("a", "http://127.0.0.1:1", "small", 3, 5),
            tool_loop(
                "c",
                "http://127.0.0.1:1",
                "small",
                MAX_SCRIPTED_STEPS + 1,
                5,
            ),
            waiting("b", "http://127.0.0.1:1"),
        ] {
            let spec: crate::api::AgentRunSpec =
                serde_json::from_value(run["spec"].clone()).expect("a valid spec");
            assert_eq!(spec.tools.len(), 4);
        }
    }

    #[test]
    fn a_long_run_asks_the_tool_servers_webhook_agent_and_its_spec_stays_small() {
        let run = tool_loop("a", "http://127.0.0.1:1", "small", 10_000, 5);
        let spec: crate::api::AgentRunSpec =
            serde_json::from_value(run["spec"].clone()).expect("a valid spec");
        assert!(spec.agent.scripted.is_none());
        assert_eq!(
            spec.agent.webhook.expect("a webhook agent").url,
            "http://127.0.0.1:1/agent/10000/small"
        );
        let bytes = serde_json::to_vec(&run).unwrap().len();
        assert!(bytes < 4 * 1024, "{bytes} bytes");
    }
}
