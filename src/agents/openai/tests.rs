//! Tests of the openai agent: the rendering pinned byte for byte, replies read into decisions,
//! the key and the endpoint; real HTTP attempts against a local axum server speaking chat
//! completions are in `attempts`.

use serde_json::{json, Value};

use super::*;
use crate::api::{Step, ToolSpec};
use crate::engine::model::{retry_plan, RetryDecision, RunClock};

const KEY: &str = "sk-test-7f3a9c-do-not-leak";

// --- rendering ---

fn agent(base_url: &str) -> OpenAiAgent {
    OpenAiAgent {
        base_url: base_url.to_string(),
        model: "gpt-4o-mini".to_string(),
        temperature: Some(0.2),
        ..OpenAiAgent::default()
    }
}

fn tools() -> Vec<ToolSpec> {
    serde_json::from_value(json!([
        {"name": "lookup_order", "description": "Read an order.", "sideEffect": "ReadOnly",
         "timeoutSeconds": 10,
         "inputSchema": {"type": "object", "required": ["order"],
                         "properties": {"order": {"type": "integer"}}},
         "http": {"url": "http://127.0.0.1:8089/lookup_order"}},
        {"name": "issue_refund", "description": "Refund an order.", "sideEffect": "RemoteMutation",
         "timeoutSeconds": 30,
         "inputSchema": {"type": "object", "required": ["order", "amount"],
                         "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}},
         "http": {"url": "http://127.0.0.1:8089/issue_refund"}}
    ]))
    .expect("tool specs decode")
}

/// Steps as the record stores them: a result, a denial, a reply without a call, args that are
/// not JSON, an interrupted call, and the step being decided.
fn steps() -> Vec<Step> {
    serde_json::from_value(json!([
        {"index": 0, "status": "done",
         "decision": {"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1042}},
         "observation": {"kind": "tool_result", "summary": "HTTP 200",
                         "content": {"order": 1042, "state": "damaged"},
                         "contentHash": "sha256:00"}},
        {"index": 1, "status": "failed",
         "decision": {"kind": "tool_call", "tool": "issue_refund",
                      "args": {"order": 1042, "amount": 2500}},
         "observation": {"kind": "policy_denied", "summary": "denied by rule big-refunds",
                         "content": {"rule": "big-refunds"}, "contentHash": "sha256:01"}},
        {"index": 2, "status": "failed",
         "decision": {"kind": "invalid", "failure": "no_tool_call",
                      "content": {"role": "assistant", "content": "I will refund 250."}},
         "observation": {"kind": "invalid_decision", "summary": "the reply has no function call",
                         "content": {"failure": "no_tool_call"}, "contentHash": "sha256:02"}},
        {"index": 3, "status": "failed",
         "decision": {"kind": "tool_call", "tool": "issue_refund", "invalidArgs": "{order: 1042"},
         "observation": {"kind": "invalid_decision", "summary": "args are not JSON",
                         "contentHash": "sha256:03"}},
        {"index": 4, "status": "interrupted",
         "decision": {"kind": "tool_call", "tool": "issue_refund",
                      "args": {"order": 1042, "amount": 250}},
         "observation": {"kind": "interrupted", "summary": "interrupted while executing",
                         "content": {"previousStatus": "executing"}, "contentHash": "sha256:04"}},
        {"index": 5, "status": "deciding"}
    ]))
    .expect("steps decode")
}

const GOAL: &str = "Refund order 1042 if it arrived damaged.";

#[test]
fn rendering_is_pinned_byte_for_byte() {
    let body = render_request(
        GOAL,
        &agent("https://api.example/v1"),
        &tools(),
        &steps(),
        Some(512),
    );
    let bytes = encode(&body);
    let pinned = include_str!("../../../tests/fixtures/model/request.json");
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        pinned.trim_end(),
        "the rendering changed; if on purpose, update tests/fixtures/model/request.json"
    );
}

#[test]
fn rendering_is_the_same_from_the_record_as_read_back() {
    let steps = steps();
    let stored = serde_json::to_string(&steps).expect("steps encode");
    let read_back: Vec<Step> = serde_json::from_str(&stored).expect("steps decode");
    let a = agent("https://api.example/v1");
    assert_eq!(
        encode(&render_request(GOAL, &a, &tools(), &steps, Some(512))),
        encode(&render_request(GOAL, &a, &tools(), &read_back, Some(512))),
    );
}

#[test]
fn rendering_offers_tools_sorted_then_the_two_built_ins() {
    let mut specs = tools();
    let mut reserved = specs[0].clone();
    reserved.name = COMPLETE_FUNCTION.to_string();
    specs.push(reserved);
    let body = render_request(GOAL, &agent("https://x/v1"), &specs, &[], None);
    let names: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "issue_refund",
            "lookup_order",
            "agentrt_complete",
            "agentrt_fail"
        ]
    );
    assert_eq!(
        body["tools"][0]["function"]["parameters"],
        specs[1].input_schema
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": GOAL}
        ])
    );
    assert!(body.get("max_tokens").is_none());
}

#[test]
fn rendering_uses_the_agents_system_prompt_and_leaves_out_unset_fields() {
    let a = OpenAiAgent {
        system_prompt: Some("Be brief.".to_string()),
        temperature: None,
        ..agent("https://x/v1")
    };
    let body = render_request(GOAL, &a, &[], &[], Some(64));
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(body["max_tokens"], json!(64));
    assert!(body.get("temperature").is_none());
}

// --- reading replies ---

fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
                  "prompt_tokens_details": {"cached_tokens": 20}}
    })
}

fn tool_message(calls: &[(&str, &str)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

fn parse(reply: &Value, cap: Option<i64>) -> ParsedReply {
    parse_reply(reply.to_string().as_bytes(), cap)
}

#[test]
fn tool_call_reply_is_a_tool_call_decision_with_its_usage() {
    let reply = completion(
        tool_message(&[("lookup_order", r#"{"order": 1042}"#)]),
        "tool_calls",
    );
    let parsed = parse(&reply, Some(512));
    assert_eq!(
        parsed.decision,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1042}})
    );
    assert_eq!(
        parsed.usage,
        Some(ReportedUsage {
            input_tokens: 120,
            cached_input_tokens: 20,
            output_tokens: 30
        })
    );
}

#[test]
fn agentrt_complete_and_agentrt_fail_are_the_final_answers() {
    let done = completion(
        tool_message(&[(COMPLETE_FUNCTION, r#"{"result": {"refunded": 250}}"#)]),
        "tool_calls",
    );
    assert_eq!(
        parse(&done, None).decision,
        json!({"kind": "complete", "result": {"refunded": 250}})
    );
    let gave_up = completion(
        tool_message(&[(FAIL_FUNCTION, r#"{"message": "order not found"}"#)]),
        "tool_calls",
    );
    assert_eq!(
        parse(&gave_up, None).decision,
        json!({"kind": "fail", "message": "order not found"})
    );
    let no_result = completion(tool_message(&[(COMPLETE_FUNCTION, "{}")]), "tool_calls");
    assert_eq!(
        parse(&no_result, None).decision["failure"],
        json!("unparseable")
    );
}

#[test]
fn reply_cut_at_the_output_cap_is_truncated() {
    let message = tool_message(&[("lookup_order", r#"{"ord"#)]);
    let parsed = parse(&completion(message.clone(), "length"), Some(30));
    assert_eq!(
        parsed.decision,
        json!({"kind": "invalid", "failure": "truncated", "content": message})
    );
    // A server that gives no finish_reason: the reported output reached the cap.
    let mut silent = completion(message, "stop");
    silent["choices"][0]["finish_reason"] = Value::Null;
    assert_eq!(
        parse(&silent, Some(30)).decision["failure"],
        json!("truncated")
    );
    assert_eq!(
        parse(&silent, Some(31)).decision["kind"],
        json!("tool_call")
    );
}

#[test]
fn reply_without_a_tool_call_is_no_tool_call() {
    for (message, finish) in [
        (
            json!({"role": "assistant", "content": "I will refund 250."}),
            "content_filter",
        ),
        (
            json!({"role": "assistant", "content": "I will refund 250."}),
            "function_call",
        ),
    ] {
        assert_eq!(
            parse(&completion(message.clone(), finish), None).decision,
            json!({"kind": "invalid", "failure": "no_tool_call", "content": message})
        );
    }
}

#[test]
fn reply_that_stopped_with_no_tool_call_says_so_for_the_engine_to_read_its_text() {
    let message = json!({"role": "assistant", "content": "Refunded 250."});
    assert_eq!(
        parse(&completion(message.clone(), "stop"), None).decision,
        json!({"kind": "invalid", "failure": "no_tool_call", "finishReason": "stop",
               "content": message})
    );
}

#[test]
fn args_that_are_not_json_are_kept_verbatim_in_invalid_args() {
    let reply = completion(
        tool_message(&[("issue_refund", "{order: 1042")]),
        "tool_calls",
    );
    assert_eq!(
        parse(&reply, None).decision,
        json!({"kind": "tool_call", "tool": "issue_refund", "invalidArgs": "{order: 1042"})
    );
}

#[test]
fn several_tool_calls_take_the_first_and_note_the_rest() {
    let reply = completion(
        tool_message(&[
            ("lookup_order", r#"{"order": 1}"#),
            ("issue_refund", r#"{"order": 1, "amount": 5}"#),
            ("lookup_order", r#"{"order": 2}"#),
        ]),
        "tool_calls",
    );
    assert_eq!(
        parse(&reply, None).decision,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1},
               "ignoredToolCalls": ["issue_refund", "lookup_order"]})
    );
}

#[test]
fn servers_that_send_argument_objects_or_legacy_function_calls_are_understood() {
    let mut object_args = tool_message(&[("lookup_order", "")]);
    object_args["tool_calls"][0]["function"]["arguments"] = json!({"order": 7});
    assert_eq!(
        parse(&completion(object_args, "tool_calls"), None).decision,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 7}})
    );
    let legacy = json!({"role": "assistant", "content": null,
                        "function_call": {"name": "lookup_order", "arguments": "{\"order\":8}"}});
    assert_eq!(
        parse(&completion(legacy, "function_call"), None).decision,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 8}})
    );
}

#[test]
fn body_that_is_not_a_chat_completion_is_unparseable_without_usage() {
    let parsed = parse_reply(b"<html>bad gateway</html>", None);
    assert_eq!(
        parsed.decision,
        json!({"kind": "invalid", "failure": "unparseable", "content": "<html>bad gateway</html>"})
    );
    assert_eq!(parsed.usage, None);
    let no_choices = json!({"usage": {"prompt_tokens": 1, "completion_tokens": 0}});
    let parsed = parse(&no_choices, None);
    assert_eq!(parsed.decision["failure"], json!("unparseable"));
    assert_eq!(parsed.usage.map(|u| u.input_tokens), Some(1));
}

#[test]
fn usage_is_kept_as_reported_or_absent_when_unreadable() {
    let mut reply = completion(tool_message(&[("lookup_order", "{}")]), "tool_calls");
    reply["usage"] = json!({"prompt_tokens": -5, "completion_tokens": 3});
    assert_eq!(
        parse(&reply, None).usage,
        Some(ReportedUsage {
            input_tokens: -5,
            cached_input_tokens: 0,
            output_tokens: 3
        })
    );
    reply["usage"] = json!({"prompt_tokens": "5", "completion_tokens": 3});
    assert_eq!(parse(&reply, None).usage, None);
    reply.as_object_mut().expect("object").remove("usage");
    assert_eq!(parse(&reply, None).usage, None);
}

// --- the key and the endpoint ---

#[test]
fn api_key_prints_as_stars() {
    let key = ApiKey::new(KEY);
    assert_eq!(format!("{key}"), "***");
    assert_eq!(format!("{key:?}"), "ApiKey(***)");
    assert_eq!(format!("{:?}", Some(&key)), "Some(ApiKey(***))");
    assert_eq!(key.expose(), KEY);
}

#[test]
fn loopback_hosts_are_127_0_0_0_8_ipv6_loopback_and_localhost() {
    let loopback = |url: &str| is_loopback(&Url::parse(url).expect("url"));
    for url in [
        "http://127.0.0.1:8080/v1",
        "http://127.5.6.7/v1",
        "http://127.1/v1",
        "http://[::1]:11434/v1",
        "http://[::ffff:127.0.0.1]/v1",
        "http://localhost:11434/v1",
        "http://LocalHost/v1",
    ] {
        assert!(loopback(url), "{url}");
    }
    for url in [
        "http://10.255.255.1/v1",
        "http://128.0.0.1/v1",
        "http://[::2]/v1",
        "http://localhost.example.com/v1",
        "http://0.0.0.0/v1",
        "http://api.openai.com/v1",
    ] {
        assert!(!loopback(url), "{url}");
    }
}

#[test]
fn retry_after_is_read_from_retry_after_ms_seconds_or_a_date() {
    let headers = |pairs: &[(&'static str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    };
    assert_eq!(
        retry_after_millis(&headers(&[("retry-after", "7")])),
        Some(7_000)
    );
    assert_eq!(
        retry_after_millis(&headers(&[
            ("retry-after", "7"),
            ("retry-after-ms", "1500.2")
        ])),
        Some(1_501)
    );
    assert_eq!(
        retry_after_millis(&headers(&[(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT"
        )])),
        Some(0)
    );
    assert_eq!(
        retry_after_millis(&headers(&[("retry-after", "soon")])),
        None
    );
    assert_eq!(retry_after_millis(&headers(&[])), None);
    // Issue 14: too large to parse is longer than any budget, not "no Retry-After".
    for huge in [
        ("retry-after", "99999999999999999999"),
        ("retry-after", "18446744073709551615"),
    ] {
        assert_eq!(
            retry_after_millis(&headers(&[huge])),
            Some(super::RETRY_AFTER_SATURATED_MILLIS),
            "{huge:?}"
        );
    }
    assert_eq!(
        retry_after_millis(&headers(&[("retry-after-ms", "1e30")])),
        Some(super::RETRY_AFTER_SATURATED_MILLIS)
    );
}

mod attempts;
