//! MCP tasks (docs/design.md section 6, "MCP tasks") against the reference server
//! `@modelcontextprotocol/server-everything` (npm; MCP 2025-11-25 with sessions and the
//! experimental Tasks), not a stub: its `simulate-research-query` requires a task and takes
//! about 4 s. The client creates the task and another client follows it in the recorded
//! session; a controller killed after recording the task leaves it to the next, which takes
//! the task's result without a person and without a second call; one killed before recording it
//! leaves an `interrupted_side_effect` Approval, as for any call whose outcome is unknown.

mod support;

use std::time::{Duration, Instant};

use agentrt::tools::mcp::{CallOutcome, McpClient, ProtocolVersion, TaskStatus, ToolsCall};
use serde_json::{json, Value};
use support::controller::*;
use support::everything::EverythingServer;

const WAIT: Duration = Duration::from_secs(60);

fn client(url: &str) -> McpClient {
    McpClient::new(
        agentrt::tools::http::client().expect("the http client"),
        url,
        vec![],
    )
}

fn research(topic: &str, task: bool) -> ToolsCall {
    ToolsCall {
        name: "simulate-research-query".into(),
        arguments: json!({"topic": topic}),
        idempotency_key: "uid/0".into(),
        attempt: 1,
        run: "default/research".into(),
        holder: "replica-a".into(),
        timeout: Duration::from_secs(10),
        task_ttl: task.then(|| Duration::from_secs(60)),
    }
}

/// The tasks the server holds in session `session` (`tasks/list`, read raw: its answer is an
/// SSE stream whose `data:` line holds the response).
async fn tasks_in(url: &str, session: &str) -> Vec<Value> {
    let answer = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 99, "method": "tasks/list", "params": {}}))
        .send()
        .await
        .expect("tasks/list is answered")
        .text()
        .await
        .expect("its body");
    let response: Value = answer
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .find(|m: &Value| m["id"] == 99)
        .unwrap_or_else(|| panic!("no response to tasks/list in {answer}"));
    response["result"]["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("tasks/list: {response}"))
}

#[tokio::test]
async fn a_task_created_by_one_client_is_followed_to_its_result_by_another_in_its_session() {
    let server = EverythingServer::start();
    let url = server.url();
    let mut first = client(&url);
    let session = first.initialize().await.expect("initialize").clone();
    assert_eq!(session.protocol, ProtocolVersion::V2025_11_25);
    assert!(session.tasks, "the server offers task-augmented tools/call");
    let session_id = session.id.clone().expect("a session");
    let listed = first.list_tools().await.expect("tools/list");
    let tool = listed
        .iter()
        .find(|t| t["name"] == "simulate-research-query")
        .expect("the task tool is listed");
    assert_eq!(tool["execution"]["taskSupport"], json!("required"));
    // A plain call of another tool answers as before (the server answers in SSE).
    let echoed = first
        .call_tool(&ToolsCall {
            name: "echo".into(),
            arguments: json!({"message": "hi"}),
            ..research("x", false)
        })
        .await;
    assert!(
        matches!(&echoed, CallOutcome::Result { content, .. } if content.to_string().contains("hi")),
        "{echoed:?}"
    );

    let CallOutcome::TaskCreated { task, .. } = first.call_tool(&research("rust", true)).await
    else {
        panic!("no task was created:\n{}", server.log());
    };
    assert_eq!(task.status, TaskStatus::Working);
    assert!(task.poll_interval_ms.is_some());

    // Another replica, knowing only what the record keeps: the session and the task's id.
    let mut other = client(&url).resume_session(session.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = other.get_task(&task.id).await.expect("tasks/get");
        if now.status == TaskStatus::Completed {
            break;
        }
        assert!(!now.status.is_terminal(), "{now:?}");
        assert!(Instant::now() < deadline, "not done in 30 s: {now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    match other.task_result(&task.id, Duration::from_secs(10)).await {
        CallOutcome::Result { content, .. } => assert!(
            content.to_string().contains("Research Report: rust"),
            "{content}"
        ),
        other => panic!("not a result: {other:?}"),
    }
    assert_eq!(tasks_in(&url, &session_id).await.len(), 1, "one task ran");
    // A task the server does not know is an error, never a result.
    assert!(other.get_task("no-such-task").await.is_err());
    // The task of another session is not this one's.
    let mut stranger = client(&url);
    stranger.initialize().await.expect("initialize");
    assert!(stranger.get_task(&task.id).await.is_err());
}

fn run(server: &EverythingServer, name: &str, topic: &str) -> String {
    run_on_cancel(server, name, topic, "Leave")
}

fn run_on_cancel(server: &EverythingServer, name: &str, topic: &str, on_cancel: &str) -> String {
    RunFixture::at("controller/mcp-tasks.yaml")
        .set("MCP", server.url())
        .set("NAME", name)
        .set("TOPIC", topic)
        .set("ON_CANCEL", on_cancel)
        .set("AMBIGUOUS", "false")
        .yaml()
}

/// The task `step.task_created` records once it is on the record: (session, taskId).
async fn recorded_task(cluster: &support::cluster::TestCluster, run: &str) -> (String, String) {
    let status = cluster
        .wait_status(run, WAIT, "step.task_created", |s| {
            !events_of(s, "step.task_created").is_empty()
        })
        .await;
    let data = &events_of(&status, "step.task_created")[0]["data"];
    (
        data["session"].as_str().expect("a session").to_string(),
        data["taskId"].as_str().expect("a task").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_sends_tasks_cancel_only_when_the_tool_says_on_cancel_cancel() {
    let server = EverythingServer::start();
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "cancel");
    for (name, on_cancel) in [("cancelled", "Cancel"), ("left", "Leave")] {
        cluster
            .create_run(&run_on_cancel(&server, name, "rust", on_cancel))
            .await;
        let (session, task) = recorded_task(&cluster, name).await;
        cluster.cancel_run(name);
        let status = cluster
            .wait_status(name, WAIT, "the late outcome", |s| {
                s["phase"] == "Cancelled" && !events_of(s, "step.tool_finished").is_empty()
            })
            .await;
        let finished = events_of(&status, "step.tool_finished")[0]["data"].clone();
        let tasks = tasks_in(&server.url(), &session).await;
        let held = tasks
            .iter()
            .find(|t| t["taskId"] == task.as_str())
            .unwrap_or_else(|| panic!("the task is in its session: {tasks:?}"));
        if on_cancel == "Cancel" {
            assert_eq!(held["status"], json!("cancelled"), "{held}");
            assert!(finished.to_string().contains("cancelled"), "{finished}");
        } else {
            // Left to run: it completed, and its result is the late outcome.
            assert_eq!(held["status"], json!("completed"), "{held}");
            assert!(
                finished.to_string().contains("Research Report: rust"),
                "{finished}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_killed_after_recording_the_task_leaves_its_result_to_the_next_without_a_person(
) {
    if !crash_points() {
        return;
    }
    let server = EverythingServer::start();
    let cluster = agentrt_cluster().await;
    cluster.create_run(&run(&server, "tasked", "rust")).await;
    let (first, _second) = crash_then_take_over_in(&cluster, "after-task-recorded", WAIT);
    let status = cluster.wait_phase("tasked", "Completed", WAIT).await;
    cluster.assert_no_approval("tasked").await;
    let created = events_of(&status, "step.task_created");
    assert_eq!(created.len(), 1, "{}", first.log());
    let session = created[0]["data"]["session"]
        .as_str()
        .expect("the session is recorded")
        .to_string();
    let resumed = events_of(&status, "run.resumed");
    assert!(
        resumed.iter().any(|e| e["data"]["reconciliation"] == "task"
            && e["data"]["taskId"] == created[0]["data"]["taskId"]),
        "{resumed:?}"
    );
    let finished = events_of(&status, "step.tool_finished");
    assert_eq!(finished.len(), 1);
    assert!(
        finished[0]["data"]
            .to_string()
            .contains("Research Report: rust"),
        "{}",
        finished[0]
    );
    assert_eq!(status["steps"][0]["attempts"], json!(1), "one attempt");
    // The server ran the tool once: one task in the session, none in another.
    assert_eq!(tasks_in(&server.url(), &session).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_killed_before_recording_the_task_leaves_an_approval() {
    if !crash_points() {
        return;
    }
    let server = EverythingServer::start();
    let cluster = agentrt_cluster().await;
    cluster.create_run(&run(&server, "unrecorded", "go")).await;
    let (_first, _second) = crash_then_take_over_in(&cluster, "after-task-created", WAIT);
    let approval = cluster
        .wait_approval("unrecorded", "interrupted_side_effect", WAIT)
        .await;
    let status = cluster.run_status("unrecorded").await;
    assert!(events_of(&status, "step.task_created").is_empty());
    assert_eq!(approval.data["spec"]["presentation"]["task"], Value::Null);
}

#[tokio::test]
async fn a_10_mib_task_result_is_cut_and_hashed_by_the_client_and_the_controller() {
    let server = support::mcpserver::PyServer::start_tasks();
    let mut c = client(&server.url()).with_bounds(1024 * 1024, 64 * 1024 * 1024);
    c.initialize().await.expect("initialize");
    let call = ToolsCall {
        name: "big_report".into(),
        arguments: json!({"bytes": 10 * 1024 * 1024}),
        ..research("x", true)
    };
    let CallOutcome::TaskCreated { task, .. } = c.call_tool(&call).await else {
        panic!("no task was created");
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c
        .get_task(&task.id)
        .await
        .expect("tasks/get")
        .status
        .is_terminal()
    {
        assert!(Instant::now() < deadline, "the task did not end");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Asked twice (reading a result is safe to repeat): cut and hashed each time. The hashes
    // differ, as the JSON-RPC ids of the two answers do.
    let mut sizes = Vec::new();
    for _ in 0..2 {
        match c.task_result(&task.id, Duration::from_secs(20)).await {
            CallOutcome::TooLarge { max, answer, .. } => {
                assert_eq!(max, 1024 * 1024);
                assert!(answer.complete, "read to its end: {answer:?}");
                assert!(answer.bytes > 10 * 1024 * 1024, "{answer:?}");
                assert!(answer.sha256.starts_with("sha256:") && answer.sha256.len() == 71);
                sizes.push(answer.bytes);
            }
            other => panic!("not cut: {other:?}"),
        }
    }
    assert!(sizes[0].abs_diff(sizes[1]) < 16, "{sizes:?}");

    // The controller records it as response_too_large with its size and hash, not its bytes.
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "big");
    let yaml = RunFixture::at("controller/mcp-task-big.yaml")
        .set("MCP", server.url())
        .set("NAME", "big")
        .yaml();
    cluster.create_run(&yaml).await;
    let status = cluster.wait_phase("big", "Completed", WAIT).await;
    assert_eq!(events_of(&status, "step.task_created").len(), 1);
    let finished = &events_of(&status, "step.tool_finished")[0]["data"];
    let text = finished.to_string();
    assert!(text.contains("response_too_large"), "{text}");
    assert!(
        text.len() < 64 * 1024,
        "the record keeps no 10 MiB: {} bytes",
        text.len()
    );
    assert_eq!(finished["error"]["failure"], json!("response_too_large"));
    let content = &status["steps"][0]["observation"]["content"];
    assert!(
        content["bytes"]
            .as_u64()
            .is_some_and(|b| b > 10 * 1024 * 1024),
        "{content}"
    );
    assert!(
        content["sha256"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{content}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_asking_for_input_is_answered_through_an_input_required_approval() {
    let server = EverythingServer::start();
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "input");
    let yaml = RunFixture::at("controller/mcp-tasks.yaml")
        .set("MCP", server.url())
        .set("NAME", "asks")
        .set("TOPIC", "python")
        .set("ON_CANCEL", "Leave")
        .set("AMBIGUOUS", "true")
        .yaml();
    cluster.create_run(&yaml).await;
    let approval = cluster.wait_approval("asks", "input_required", WAIT).await;
    let presentation = &approval.data["spec"]["presentation"];
    assert!(
        presentation["message"]
            .as_str()
            .is_some_and(|m| m.contains("multiple interpretations")),
        "{presentation}"
    );
    assert_eq!(
        presentation["requestedSchema"]["required"],
        json!(["interpretation"]),
        "{presentation}"
    );
    let name = support::runs::name_of(&approval);
    // The CLI refuses an approval without an answer, and one that does not match the schema,
    // before any patch.
    let refused = support::cli::agentrt(&cluster, &["approve", &name, "--yes"]);
    assert!(!refused.status.success());
    assert!(
        support::cli::text(&refused).contains("--answer"),
        "{}",
        support::cli::text(&refused)
    );
    let refused = support::cli::agentrt(
        &cluster,
        &[
            "approve",
            &name,
            "--yes",
            "--answer",
            r#"{"interpretation": 7}"#,
        ],
    );
    assert!(
        !refused.status.success(),
        "{}",
        support::cli::text(&refused)
    );
    let approved = support::cli::agentrt(
        &cluster,
        &[
            "approve",
            &name,
            "--yes",
            "--answer",
            r#"{"interpretation": "snake"}"#,
        ],
    );
    assert!(
        approved.status.success(),
        "{}",
        support::cli::text(&approved)
    );

    let status = cluster.wait_phase("asks", "Completed", WAIT).await;
    let answered = events_of(&status, "step.input_answered");
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["data"]["action"], json!("accept"));
    let finished = events_of(&status, "step.tool_finished");
    assert_eq!(finished.len(), 1);
    assert!(
        finished[0]["data"].to_string().contains("snake"),
        "the server used the answer: {}",
        finished[0]
    );
    assert_eq!(status["steps"][0]["attempts"], json!(1), "one attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_s_question_is_answered_in_the_console_in_a_browser() {
    use support::console::{Browser, ConsoleProcess};
    let server = EverythingServer::start();
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "input-console");
    let yaml = RunFixture::at("controller/mcp-tasks.yaml")
        .set("MCP", server.url())
        .set("NAME", "asks-console")
        .set("TOPIC", "python")
        .set("ON_CANCEL", "Leave")
        .set("AMBIGUOUS", "true")
        .yaml();
    cluster.create_run(&yaml).await;
    let approval = cluster
        .wait_approval("asks-console", "input_required", WAIT)
        .await;
    let key = format!(
        "{}/{}",
        cluster.namespace(),
        support::runs::name_of(&approval)
    );
    let console = ConsoleProcess::start(&cluster);
    let browser = Browser::start().await;
    browser.goto(&console.url).await;
    let page = format!("{}/approvals/{key}", console.origin());
    browser.goto(&page).await;
    assert!(
        browser.source().await.contains("multiple interpretations"),
        "the page shows the server's question"
    );
    // An answer that does not match the schema is refused before any patch.
    browser
        .type_into(
            &format!("textarea[data-answer=\"{key}\"]"),
            r#"{"interpretation": 7}"#,
        )
        .await;
    browser.click("[data-approval] [data-action=approve]").await;
    let refused = browser.text("[data-outcome]").await;
    assert!(refused.contains("requestedSchema"), "{refused}");
    browser.goto(&page).await;
    browser
        .type_into(
            &format!("textarea[data-answer=\"{key}\"]"),
            r#"{"interpretation": "snake"}"#,
        )
        .await;
    browser.screenshot("input-required").await;
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome=decided]").await;
    assert!(outcome.contains("approved"), "{outcome}");
    let status = cluster.wait_phase("asks-console", "Completed", WAIT).await;
    let finished = events_of(&status, "step.tool_finished");
    assert!(
        finished[0]["data"].to_string().contains("snake"),
        "{}",
        finished[0]
    );
}
