//! A takeover during a model call (docs/behaviours.md 47): the new holder asks the model exactly
//! what the old one had, and the attempt that never answered is charged its projection.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_during_a_model_call_renders_the_same_request_and_charges_the_lost_one() {
    if !crash_points() {
        return;
    }
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![
        // The first attempt never answers: its controller dies while it is in flight.
        Reply::hang(),
        Reply::complete(json!({"damaged": true}), usage(1000, 30, 0)),
    ])
    .await;
    start_run(&cluster, &tools, "taken", &model.base_url(), |_| {}).await;
    let _controllers = crash_then_take_over(
        cluster.kubeconfig(),
        cluster.namespace(),
        "during-model",
        WAIT,
    );
    let done = wait_done(&cluster, "taken").await;
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(done["result"], json!({"damaged": true}));
    assert_seq_contiguous(&done);

    // The new holder asked the model exactly what the old one had.
    let received = model.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        String::from_utf8_lossy(&received[0].body),
        String::from_utf8_lossy(&received[1].body),
        "the same request bytes"
    );

    assert_eq!(
        journal(
            &done,
            &[
                "model.dispatched",
                "model.completed",
                "model.failed",
                "lease.taken_over",
                "step.interrupted",
                "run.resumed",
                "step.started",
                "step.decided",
            ]
        ),
        [
            "step.started@0",
            "model.dispatched@0",
            "lease.taken_over",
            "model.failed@0",
            "step.interrupted@0",
            "run.resumed",
            "step.started@1",
            "model.dispatched@1",
            "model.completed@1",
            "step.decided@1",
        ]
    );
    assert_eq!(step_statuses(&done), ["interrupted", "done"]);
    let lost = projected_input(&received[0].body);
    let failed = &data_of(&done, "model.failed")[0];
    assert_eq!(failed["outcome"], "unknown", "{failed}");
    assert_eq!(failed["charged"], "projection");
    assert_eq!(failed["inputTokens"], lost);
    assert_eq!(failed["outputTokens"], CAP);
    assert_eq!(failed["costMicros"], cost(lost, 0, CAP));
    assert_eq!(
        done["usage"],
        json!({
            "modelCalls": 2,
            "inputTokens": lost + 1000,
            "outputTokens": CAP + 30,
            "estimatedCostMicros": cost(lost, 0, CAP) + cost(1000, 0, 30),
        })
    );
}
