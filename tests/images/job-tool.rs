//! The container of the Job-tool scenarios (tests/job_tools.rs): a static program with no
//! dependencies, packaged by `scripts/in-cluster-stage` as `registry.local/agentrt-job-tool:test`.
//!
//! It answers one call the way docs/design.md section 6 "Job tools" says a Job tool's container
//! does: the call's args arrive as JSON in `AGENTRT_ARGS` (or in the file
//! `AGENTRT_ARGS_FILE` names when they are large), with `AGENTRT_IDEMPOTENCY_KEY`,
//! `AGENTRT_RUN` and `AGENTRT_STEP`. Its result is
//! `{"ok": true, "args": <the args>, "key": "<key>", "run": "<run>", "step": <step>}`.
//!
//! Flags (the tool's pod template sets them as the container's args):
//! - `--sleep-ms N`: work N milliseconds first;
//! - `--log`: print the result as the last line of stdout (`result: Log`) instead of writing it
//!   to the termination message `/dev/termination-log`;
//! - `--fail`: write `{"error": "refused"}` to the termination message and exit 3;
//! - `--not-json`: write a result that is not JSON.

use std::io::Write;

fn main() {
    let flags: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| flags.iter().any(|f| f == flag);
    if let Some(i) = flags.iter().position(|f| f == "--sleep-ms") {
        let ms: u64 = flags
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .expect("--sleep-ms takes milliseconds");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let mut args = var("AGENTRT_ARGS");
    if args.is_empty() {
        if let Ok(path) = std::env::var("AGENTRT_ARGS_FILE") {
            args = std::fs::read_to_string(path).expect("the args file is readable");
        }
    }
    if args.is_empty() {
        args = "null".to_string();
    }
    let step = var("AGENTRT_STEP");
    let step = if step.is_empty() { "null".to_string() } else { step };
    println!("job-tool: starting step {step} with key {}", var("AGENTRT_IDEMPOTENCY_KEY"));
    let result = if has("--not-json") {
        "this is not JSON".to_string()
    } else if has("--fail") {
        "{\"error\": \"refused\"}".to_string()
    } else {
        format!(
            "{{\"ok\": true, \"args\": {args}, \"key\": \"{}\", \"run\": \"{}\", \"step\": {step}}}",
            var("AGENTRT_IDEMPOTENCY_KEY"),
            var("AGENTRT_RUN")
        )
    };
    if has("--log") {
        println!("{result}");
    } else {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open("/dev/termination-log")
            .expect("the termination message file is writable");
        file.write_all(result.as_bytes()).expect("the result is written");
    }
    if has("--fail") {
        std::process::exit(3);
    }
}
