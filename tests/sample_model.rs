//! The sample model (`tools::samples::model`) against the openai agent's own wire: it reads the
//! request `agents::openai` renders and answers what `agents::openai::parse_reply` reads, so the
//! `openai` sample runs with no external model.

use agentrt::agents::openai::{parse_reply, render_request};
use agentrt::api::{OpenAiAgent, Step, ToolSpec};
use agentrt::tools::samples::model::{chat_completions, SAMPLE_MODEL};
use axum::body::Bytes;
use axum::Json;
use serde_json::{json, Value};

fn tools() -> Vec<ToolSpec> {
    serde_json::from_value(json!([{
        "name": "lookup_order", "description": "Read an order.", "sideEffect": "ReadOnly",
        "inputSchema": {"type": "object", "properties": {"order": {"type": "integer"}}},
    }]))
    .unwrap()
}

async fn ask(steps: &[Step]) -> Value {
    let agent = OpenAiAgent {
        base_url: "http://127.0.0.1:8089/v1".into(),
        model: SAMPLE_MODEL.into(),
        ..OpenAiAgent::default()
    };
    let request = render_request(
        "Look up order 1042 and report whether it arrived damaged.",
        &agent,
        &tools(),
        steps,
        Some(256),
    );
    let Json(reply) = chat_completions(Bytes::from(request.to_string()))
        .await
        .expect("an answer");
    let parsed = parse_reply(reply.to_string().as_bytes(), Some(256));
    assert!(parsed.usage.is_some_and(|u| u.output_tokens == 24));
    parsed.decision
}

#[tokio::test]
async fn the_sample_model_looks_the_order_up_then_completes_with_what_it_found() {
    let first = ask(&[]).await;
    assert_eq!(
        first,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1042}})
    );
    let steps: Vec<Step> = serde_json::from_value(json!([{
        "index": 0, "status": "done",
        "decision": first,
        "observation": {
            "kind": "tool_result", "summary": "ok",
            "content": {"order": 1042, "status": "delivered", "damaged": true},
        },
    }]))
    .unwrap();
    assert_eq!(
        ask(&steps).await,
        json!({"kind": "complete", "result": {"order": 1042, "status": "delivered", "damaged": true}})
    );
}
