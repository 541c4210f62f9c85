use serde_json::json;

use super::message::{slack_escape, ARGS_SUMMARY_CHARS};
use super::*;

fn approval() -> Value {
    json!({
        "metadata": {"namespace": "shop", "name": "refund-1-1", "uid": "u-1",
                     "creationTimestamp": "2026-12-06T10:00:00Z"},
        "spec": {"runName": "refund", "stepIndex": 1, "kind": "policy",
                 "hash": format!("sha256:{}", "ab".repeat(32)),
                 "request": {"tool": {"name": "issue_refund"},
                             "args": {"order": "<!channel> `x` & more", "zbig": "z".repeat(1000)}},
                 "decision": {"verdict": "Approved", "approver": "alice", "hash": "h"}},
        "status": {"phase": "Approved", "shortHash": "abababab", "decidedAt": "2026-12-06T10:00:30Z"}
    })
}

#[test]
fn a_phase_change_is_notified_once_and_a_rewrite_of_the_same_phase_never() {
    use ApprovalPhase::*;
    assert_eq!(transition(Pending, Approved), Some(NoticeKind::Decided));
    assert_eq!(transition(Pending, Rejected), Some(NoticeKind::Decided));
    assert_eq!(transition(Pending, Settled), Some(NoticeKind::Decided));
    assert_eq!(transition(Pending, Expired), Some(NoticeKind::Expired));
    assert_eq!(transition(Approved, Expired), Some(NoticeKind::Expired));
    assert_eq!(transition(Pending, Cancelled), Some(NoticeKind::Cancelled));
    assert_eq!(transition(Approved, Cancelled), Some(NoticeKind::Cancelled));
    assert_eq!(transition(Approved, Executed), None);
    assert_eq!(transition(Approved, Approved), None);
    assert_eq!(transition(Pending, Pending), None);
}

#[test]
fn a_webhook_flag_names_its_format_and_where_its_url_is_read() {
    let hook: Webhook = "name=ops,format=slack,url-file=/etc/agentrt/notify/ops/url"
        .parse()
        .expect("parses");
    assert_eq!(hook.name, "ops");
    assert_eq!(hook.format, Format::Slack);
    assert_eq!(
        hook.url,
        UrlSource::File("/etc/agentrt/notify/ops/url".into())
    );
    let hook: Webhook = "name=bus,format=cloudevents,url-env=BUS_URL"
        .parse()
        .expect("parses");
    assert_eq!(hook.format, Format::CloudEvents);
    assert_eq!(hook.url, UrlSource::Env("BUS_URL".into()));
    for bad in [
        "format=slack,url-env=X",
        "name=a,url-env=X",
        "name=a,format=teams,url-env=X",
        "name=a,format=slack",
        "name=a,format=slack,url=http://x",
    ] {
        assert!(bad.parse::<Webhook>().is_err(), "{bad} was accepted");
    }
}

#[test]
fn a_slack_message_names_the_run_tool_kind_command_and_link_escaped_and_bounded() {
    let notice = Notice::of(NoticeKind::Created, &approval(), "http://console:8765");
    let body = notice.body(Format::Slack);
    let text = body["text"].as_str().expect("text");
    assert!(text.contains("*shop/refund-1-1*"), "{text}");
    assert!(text.contains("run `refund`"), "{text}");
    assert!(text.contains("tool `issue_refund`"), "{text}");
    assert!(text.contains("kind `policy`"), "{text}");
    assert!(
        text.contains("`kubectl agentrt approve shop/refund-1-1`"),
        "{text}"
    );
    assert!(
        text.contains("<http://console:8765/approvals/shop/refund-1-1|Open in the console>"),
        "{text}"
    );
    assert!(
        !text.contains("<!channel>"),
        "a mention got through: {text}"
    );
    assert!(text.contains("&lt;!channel&gt; 'x' &amp; more"), "{text}");
    assert!(notice.args.chars().count() <= ARGS_SUMMARY_CHARS + 1);
    assert!(notice.args.ends_with('…'));
    let decided = Notice::of(NoticeKind::Decided, &approval(), "http://c").body(Format::Slack);
    assert!(
        decided["text"]
            .as_str()
            .is_some_and(|t| t.contains("decided: *Approved* by alice")),
        "{decided}"
    );
}

#[test]
fn a_cloud_event_is_structured_mode_1_0_with_a_stable_id() {
    let notice = Notice::of(NoticeKind::Decided, &approval(), "http://console:8765/");
    let event = notice.body(Format::CloudEvents);
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["id"], "u-1.decided");
    assert_eq!(event["type"], "dev.agentrt.approval.decided");
    assert_eq!(event["subject"], "shop/refund-1-1");
    assert_eq!(
        event["source"],
        "/apis/agentrt.dev/v1alpha1/namespaces/shop/approvals"
    );
    assert_eq!(event["time"], "2026-12-06T10:00:30Z");
    assert_eq!(event["datacontenttype"], "application/json");
    assert_eq!(event["data"]["run"]["name"], "refund");
    assert_eq!(event["data"]["tool"], "issue_refund");
    assert_eq!(event["data"]["approval"]["kind"], "policy");
    assert_eq!(event["data"]["decision"]["verdict"], "Approved");
    assert_eq!(
        event["data"]["approveCommand"],
        "kubectl agentrt approve shop/refund-1-1"
    );
    let created = Notice::of(NoticeKind::Created, &approval(), "x").body(Format::CloudEvents);
    assert_eq!(created["time"], "2026-12-06T10:00:00Z");
}

#[test]
fn slack_escaping_leaves_no_markup_control_or_direction_override() {
    assert_eq!(slack_escape("a<b>&`c`\u{202e}\n"), "a&lt;b&gt;&amp;'c'??");
}

#[test]
fn the_time_to_a_decision_is_measured_between_rfc3339_times() {
    assert_eq!(
        seconds_between("2026-12-06T10:00:00Z", "2026-12-06T10:00:30Z"),
        Some(30.0)
    );
    assert_eq!(
        seconds_between("2026-12-06T10:00:30Z", "2026-12-06T10:00:00Z"),
        None
    );
    assert_eq!(seconds_between("x", "2026-12-06T10:00:00Z"), None);
}
