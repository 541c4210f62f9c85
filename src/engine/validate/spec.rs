//! The whole-spec check of an AgentRun (docs/behaviours.md 1): every mistake a manifest can
//! hold that no step can fix, found at once, each named by its field path and its fix.
//!
//! Owns: the one list of rules that `kubectl apply` (the controller's validating webhook and
//! `agentrt dev`'s admission), the engine before `run.started` (`invalid_spec`) and `agentrt
//! lint` all apply, so the three give the same verdict. It repeats the CRD schema's and CEL's
//! cheap rules (limits > 0, one agent, one executor, unique names) because the webhook may be
//! off and the embedded server is only a stand-in; it adds what the CRD cannot say: tool
//! names a model API accepts, http(s) URLs, input schemas that compile, `when`s that are CEL
//! over the policy's variables. Must not: fetch anything (schemas compile with no retriever),
//! or judge what only args can show (a `when` that fails on some args is decided at the call:
//! docs/behaviours.md 12).

use std::fmt;

use serde_json::Value;

use super::{check_storable_at, json_kind, ToolSchema};
use crate::api::{AgentRunSpec, HttpHeader, McpOAuth, PolicyRule, ToolSpec};
use crate::engine::conversation::{COMPLETE_FUNCTION, FAIL_FUNCTION};
use crate::engine::pins::{is_function_name, MAX_FUNCTION_NAME, SET_SEPARATOR};
use crate::engine::policy::check_when;

/// One mistake in a spec: where it is and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field's path from the object's root, e.g. `spec.policy.rules[2].when`.
    pub field: String,
    /// What is wrong and the fix, e.g. `"get weather!" is not a valid function name; use
    /// letters, digits, _ and - (1-64 characters)`.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The problems as one message: each `field: message`, joined by `; `.
pub fn render(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The longest AgentRun name: the run's name is the value of its Approvals' label
/// `agentrt.dev/run`, and a label value has at most 63 characters (as a Job's name, for the
/// same reason; docs/behaviours.md 80).
pub const MAX_RUN_NAME: usize = 63;

/// Every problem of the run named `name` with `spec`: its name first (`metadata.name`, at most
/// [`MAX_RUN_NAME`] characters), then [`spec`]'s. What the admission webhook, `agentrt lint`
/// and the engine before `run.started` apply (the CRD's root CEL rule says the same).
pub fn run(name: &str, spec: &AgentRunSpec) -> Vec<Problem> {
    let mut out = Vec::new();
    let length = name.chars().count();
    if length > MAX_RUN_NAME {
        out.push(Problem {
            field: "metadata.name".into(),
            message: format!(
                "must be no more than {MAX_RUN_NAME} characters (got {length}): it is the value \
                 of the run's Approvals' label agentrt.dev/run; choose a shorter name"
            ),
        });
    }
    out.extend(self::spec(spec));
    out
}

/// Every problem of `spec`, in field order; empty when the spec is fine.
///
/// The rules:
/// - `spec.goal` not empty; `spec.agent` sets exactly one of scripted, openai, webhook;
///   `openai.baseURL`, `webhook.url` and `reconcile.webhook.url` are http(s) URLs;
///   `leaseDurationSeconds` within 2..=3600;
/// - `spec.limits.maxSteps`, `maxConsecutiveToolFailures`, `loopThreshold` > 0, and every
///   optional limit that is set > 0;
/// - each tool: a valid function name (`[a-zA-Z0-9_-]{1,64}`, what OpenAI-compatible APIs
///   accept), not `agentrt_complete` nor `agentrt_fail` (the openai agent's built-in
///   functions), unique among the tools and the toolsets; `timeoutSeconds` > 0; exactly one
///   executor (`http`, `mcp` or `job`); an http or mcp `url` that is an http(s) URL and whose
///   every header sets exactly one of `value` and `secretKeyRef`; a `job.template` that is a
///   Pod template with containers that name their image and a Job's `restartPolicy`; an http tool's `reconcile.statusURL` an
///   http(s) URL with `{key}` as its one placeholder; an `inputSchema` (required
///   for `http`, optional for `mcp`) that is a non-empty object, storable, referring to
///   nothing outside itself, and a valid JSON Schema;
/// - each toolset: a function name short enough for `<set>__<tool>`, a server URL that is
///   http(s), headers as a tool's, no empty include glob;
/// - each policy rule: no empty tool glob, a `when` that compiles as CEL over `tool`, `args`
///   and `sideEffect` ([`check_when`]), a capability and presentation that are storable JSON
///   objects;
/// - nothing nests deeper than [`MAX_SPEC_DEPTH`] levels (scripted args, results, schemas,
///   capabilities: any JSON a manifest holds), named by the path where it passes the bound.
pub fn spec(spec: &AgentRunSpec) -> Vec<Problem> {
    let mut out = Problems::default();
    if spec.goal.trim().is_empty() {
        out.add(
            "spec.goal",
            "must not be empty; say what the agent should achieve",
        );
    }
    agent(spec, &mut out);
    limits(spec, &mut out);
    for (index, tool) in spec.tools.iter().enumerate() {
        self::tool(spec, index, tool, &mut out);
    }
    tool_sets(spec, &mut out);
    policy(spec, &mut out);
    depth(spec, &mut out);
    out.0
}

/// The deepest a spec may nest, counted from `spec` itself (each object or list one level):
/// 64. A scripted run's args sit 5 levels down (`spec.agent.scripted.decisions[i].args`), so
/// they may nest 59 levels of their own. The schema cannot say it; past serde_json's 128 levels
/// (the bound of every Rust client reading the run, the controller's included) the run could
/// not even be read (issue 34; docs/design.md section 2, admission).
pub const MAX_SPEC_DEPTH: usize = 64;

/// The first place the spec nests deeper than [`MAX_SPEC_DEPTH`], walked without recursion.
fn depth(spec: &AgentRunSpec, out: &mut Problems) {
    let Ok(value) = serde_json::to_value(spec) else {
        return;
    };
    let mut stack: Vec<(&Value, String, usize)> = vec![(&value, "spec".to_string(), 0)];
    while let Some((value, path, level)) = stack.pop() {
        let children: Vec<(&Value, String)> = match value {
            Value::Object(fields) => fields
                .iter()
                .map(|(key, child)| (child, format!("{path}.{key}")))
                .collect(),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(index, child)| (child, format!("{path}[{index}]")))
                .collect(),
            _ => continue,
        };
        if level + 1 > MAX_SPEC_DEPTH {
            out.add(
                path,
                format!(
                    "nests deeper than {MAX_SPEC_DEPTH} levels from spec; flatten it (pass \
                     deep data as a string, or by reference)"
                ),
            );
            return;
        }
        for (child, child_path) in children.into_iter().rev() {
            stack.push((child, child_path, level + 1));
        }
    }
}

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    /// A sentence `"<path>: <message>"` from a check that names its own path (the path may go
    /// deeper than `field`); one without a path is put under `field`.
    fn add_sentence(&mut self, field: &str, sentence: String) {
        match sentence.split_once(": ") {
            Some((path, message)) if path.starts_with(field) && !path.contains(' ') => {
                self.add(path, message)
            }
            _ => self.add(field, sentence),
        }
    }
}

/// Why `url` is not an absolute http(s) URL, or `None`.
fn http_url_problem(url: &str) -> Option<String> {
    let example = "write e.g. \"https://tools.example.com/refund\"";
    if url.is_empty() {
        return Some(format!("must not be empty; {example}"));
    }
    match url.parse::<http::Uri>() {
        Ok(uri) => match (uri.scheme_str(), uri.authority()) {
            (Some("http" | "https"), Some(authority)) if !authority.host().is_empty() => None,
            (Some(scheme), _) if scheme != "http" && scheme != "https" => Some(format!(
                "{url:?} is not an http(s) URL (scheme {scheme:?}); {example}"
            )),
            _ => Some(format!(
                "{url:?} is not an absolute http(s) URL with a host; {example}"
            )),
        },
        Err(_) => Some(format!("{url:?} is not a URL; {example}")),
    }
}

fn check_url(out: &mut Problems, field: &str, url: &str) {
    if let Some(message) = http_url_problem(url) {
        out.add(field, message);
    }
}

/// `spec.tools[].http.reconcile.statusURL`: an http(s) URL once `{key}` is filled in, naming
/// `{key}` (the only placeholder) at least once.
fn status_url(out: &mut Problems, field: &str, template: &str) {
    if !template.contains("{key}") {
        out.add(
            field,
            format!(
                "{template:?} has no {{key}}; write where the call's idempotency key goes, as \
                 in https://tool.example/calls/{{key}}"
            ),
        );
        return;
    }
    let filled = template.replace("{key}", "k");
    if filled.contains('{') || filled.contains('}') {
        out.add(
            field,
            format!("{template:?}: {{key}} is the only placeholder; remove the other braces"),
        );
        return;
    }
    if http_url_problem(&filled).is_some() {
        out.add(
            field,
            format!(
                "{template:?} is not an http or https URL; write one such as \
                 https://tools.example.com/calls/{{key}}"
            ),
        );
        return;
    }
    // The key holds a `/` (sent as %2F): it belongs in the path or the query, never the host.
    let after_scheme = template.find("://").map_or(0, |at| at + 3);
    let path_starts = template[after_scheme..]
        .find(['/', '?'])
        .map_or(template.len(), |at| after_scheme + at);
    if template.find("{key}").is_some_and(|at| at < path_starts) {
        out.add(
            field,
            format!(
                "{template:?} puts {{key}} in the host; put it in the path or the query, as in \
                 https://tools.example.com/calls/{{key}}"
            ),
        );
    }
}

fn agent(spec: &AgentRunSpec, out: &mut Problems) {
    let agent = &spec.agent;
    let set = [
        agent.scripted.is_some(),
        agent.openai.is_some(),
        agent.webhook.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set != 1 {
        out.add(
            "spec.agent",
            format!("sets {set} of scripted, openai, webhook; set exactly one"),
        );
    }
    if let Some(openai) = &agent.openai {
        check_url(out, "spec.agent.openai.baseURL", &openai.base_url);
        if openai.model.is_empty() {
            out.add(
                "spec.agent.openai.model",
                "must not be empty; name the model, e.g. \"gpt-4o-mini\"",
            );
        }
    }
    if let Some(webhook) = &agent.webhook {
        check_url(out, "spec.agent.webhook.url", &webhook.url);
    }
    if let Some(hook) = spec.reconcile.as_ref().and_then(|r| r.webhook.as_ref()) {
        check_url(out, "spec.reconcile.webhook.url", &hook.url);
    }
    if !(2..=3600).contains(&spec.lease_duration_seconds) {
        out.add(
            "spec.leaseDurationSeconds",
            format!(
                "must be between 2 and 3600 (got {}); leave it out for 30",
                spec.lease_duration_seconds
            ),
        );
    }
}

fn limits(spec: &AgentRunSpec, out: &mut Problems) {
    let l = &spec.limits;
    let required = [
        ("maxSteps", l.max_steps),
        (
            "maxConsecutiveToolFailures",
            l.max_consecutive_tool_failures,
        ),
        ("loopThreshold", l.loop_threshold),
    ];
    for (field, value) in required {
        if value <= 0 {
            out.add(
                format!("spec.limits.{field}"),
                format!("must be > 0 (got {value}); leave it out for the default"),
            );
        }
    }
    let optional = [
        ("maxModelCalls", l.max_model_calls),
        ("maxTotalTokens", l.max_total_tokens),
        ("maxOutputTokensPerCall", l.max_output_tokens_per_call),
        ("maxEstimatedCostMicros", l.max_estimated_cost_micros),
        ("maxActiveSeconds", l.max_active_seconds),
        ("maxElapsedSeconds", l.max_elapsed_seconds),
        ("approvalTTLSeconds", l.approval_ttl_seconds),
        ("grantTTLSeconds", l.grant_ttl_seconds),
    ];
    for (field, value) in optional {
        if let Some(value) = value.filter(|v| *v <= 0) {
            out.add(
                format!("spec.limits.{field}"),
                format!("must be > 0 (got {value}); leave it out for no limit"),
            );
        }
    }
}

fn function_name_problem(name: &str) -> String {
    format!(
        "{name:?} is not a valid function name; use letters, digits, _ and - (1-{MAX_FUNCTION_NAME} \
         characters)"
    )
}

fn tool(spec: &AgentRunSpec, index: usize, tool: &ToolSpec, out: &mut Problems) {
    let field = format!("spec.tools[{index}]");
    if !is_function_name(&tool.name) {
        out.add(format!("{field}.name"), function_name_problem(&tool.name));
    } else if [COMPLETE_FUNCTION, FAIL_FUNCTION].contains(&tool.name.as_str()) {
        out.add(
            format!("{field}.name"),
            format!(
                "{:?} is the name of a built-in function the openai agent offers                  ({COMPLETE_FUNCTION}, {FAIL_FUNCTION}); rename the tool",
                tool.name
            ),
        );
    } else if let Some(first) = spec.tools[..index].iter().position(|t| t.name == tool.name) {
        out.add(
            format!("{field}.name"),
            format!(
                "{:?} repeats spec.tools[{first}].name; tool names must be unique",
                tool.name
            ),
        );
    } else if let Some(set) = spec.tool_sets.iter().position(|s| s.name == tool.name) {
        out.add(
            format!("{field}.name"),
            format!(
                "{:?} is also spec.toolSets[{set}].name; rename one of them",
                tool.name
            ),
        );
    }
    if tool.timeout_seconds <= 0 {
        out.add(
            format!("{field}.timeoutSeconds"),
            format!(
                "must be > 0 (got {}); leave it out for 30",
                tool.timeout_seconds
            ),
        );
    }
    match (&tool.http, &tool.mcp, &tool.job) {
        (Some(http), None, None) => {
            check_url(out, &format!("{field}.http.url"), &http.url);
            headers(out, &format!("{field}.http.headers"), &http.headers);
            reserved_headers(out, &format!("{field}.http.headers"), &http.headers, false);
            if let Some(url) = http.reconcile.as_ref().and_then(|r| r.status_url.as_ref()) {
                status_url(out, &format!("{field}.http.reconcile.statusURL"), url);
            }
        }
        (None, Some(mcp), None) => {
            check_url(out, &format!("{field}.mcp.url"), &mcp.url);
            headers(out, &format!("{field}.mcp.headers"), &mcp.headers);
            reserved_headers(out, &format!("{field}.mcp.headers"), &mcp.headers, true);
            oauth(
                out,
                &format!("{field}.mcp"),
                &mcp.headers,
                mcp.oauth.as_ref(),
            );
        }
        (None, None, Some(job)) => {
            job::job_template(out, &format!("{field}.job.template"), &job.template);
        }
        (None, None, None) => out.add(
            field.clone(),
            "has no executor; set http: {url: \"https://...\"}, mcp: {url: \"https://...\"} \
             or job: {template: {spec: {containers: [...]}}}",
        ),
        _ => out.add(
            field.clone(),
            "sets more than one of http, mcp and job; a tool has exactly one executor",
        ),
    }
    let schema_field = format!("{field}.inputSchema");
    match &tool.input_schema {
        // An mcp tool may leave its schema to the server's, pinned at start.
        Value::Null if tool.mcp.is_some() => {}
        Value::Object(map) if map.is_empty() => out.add(
            schema_field,
            "must be a non-empty JSON Schema object; write e.g. {type: object, properties: {...}}",
        ),
        Value::Object(_) => {
            if let Err(sentence) = ToolSchema::compile(index, tool) {
                out.add_sentence(&schema_field, sentence);
            }
        }
        other => out.add(
            schema_field,
            format!(
                "must be a JSON Schema object (got {}); write e.g. {{type: object}}",
                json_kind(other)
            ),
        ),
    }
}

/// Headers agentrt sets on every call (the idempotency key, the attempt, the run, the holder:
/// `tools::http`'s constants) and those the HTTP client owns: a tool may not set them.
const RESERVED_HEADERS: [&str; 8] = [
    "Idempotency-Key",
    "Agentrt-Attempt",
    "Agentrt-Run",
    "Agentrt-Holder",
    "Host",
    "Content-Length",
    "Transfer-Encoding",
    "Connection",
];

/// Headers the MCP transport sets (the revision, the routing headers, the session, what is
/// sent and accepted: `tools::mcp`'s constants): an `mcp` tool may not set them either.
const RESERVED_MCP_HEADERS: [&str; 6] = [
    "MCP-Protocol-Version",
    "Mcp-Method",
    "Mcp-Name",
    "Mcp-Session-Id",
    "Content-Type",
    "Accept",
];

/// A header's name is an HTTP token not reserved for agentrt or the transport, and a literal
/// value is a valid header value (no CR, LF or other control characters); a Secret's value is
/// checked when it is read (docs/design.md section 6).
fn reserved_headers(out: &mut Problems, field: &str, headers: &[HttpHeader], mcp: bool) {
    for (j, header) in headers.iter().enumerate() {
        let at = format!("{field}[{j}]");
        if http::HeaderName::from_bytes(header.name.as_bytes()).is_err() {
            out.add(
                format!("{at}.name"),
                format!(
                    "{:?} is not a valid HTTP header name; use letters, digits and -",
                    header.name
                ),
            );
            continue;
        }
        let reserved = RESERVED_HEADERS
            .iter()
            .chain(if mcp { &RESERVED_MCP_HEADERS[..] } else { &[] })
            .find(|r| r.eq_ignore_ascii_case(&header.name));
        if let Some(reserved) = reserved {
            out.add(
                format!("{at}.name"),
                format!(
                    "{reserved} is set by agentrt or the transport on every request; remove \
                     this header"
                ),
            );
        }
        if let Some(value) = &header.value {
            if http::HeaderValue::from_str(value).is_err() {
                out.add(
                    format!("{at}.value"),
                    "is not a valid HTTP header value (it holds a line break or another \
                     control character); remove them",
                );
            }
        }
    }
}

/// `oauth` (docs/design.md section 6, "MCP OAuth") sends its own `Authorization`: a header of
/// that name beside it is refused, and each scope is a non-empty token without spaces.
fn oauth(out: &mut Problems, field: &str, headers: &[HttpHeader], oauth: Option<&McpOAuth>) {
    let Some(oauth) = oauth else {
        return;
    };
    if let Some(j) = headers
        .iter()
        .position(|h| h.name.eq_ignore_ascii_case("Authorization"))
    {
        out.add(
            format!("{field}.headers[{j}].name"),
            "Authorization is sent by oauth (the access token it gets); remove this header or \
             oauth",
        );
    }
    for (k, scope) in oauth.scopes.iter().enumerate() {
        if scope.is_empty() {
            out.add(
                format!("{field}.oauth.scopes[{k}]"),
                "is empty; remove it or name a scope",
            );
        } else if scope.contains(char::is_whitespace) {
            out.add(
                format!("{field}.oauth.scopes[{k}]"),
                format!("{scope:?} is not one scope; write each scope as its own item"),
            );
        }
    }
}

/// Each header sets exactly one of `value` and `secretKeyRef`.
fn headers(out: &mut Problems, field: &str, headers: &[HttpHeader]) {
    for (j, header) in headers.iter().enumerate() {
        let problem = match (&header.value, &header.secret_key_ref) {
            (Some(_), Some(_)) => "sets both value and secretKeyRef; keep one",
            (None, None) => {
                "sets neither value nor secretKeyRef; write value: \"...\" or \
                 secretKeyRef: {name: SECRET, key: KEY}"
            }
            _ => continue,
        };
        out.add(format!("{field}[{j}]"), problem);
    }
}

fn tool_sets(spec: &AgentRunSpec, out: &mut Problems) {
    let longest = MAX_FUNCTION_NAME - SET_SEPARATOR.len() - 1;
    for (index, set) in spec.tool_sets.iter().enumerate() {
        let field = format!("spec.toolSets[{index}]");
        if !is_function_name(&set.name) || set.name.len() > longest {
            out.add(
                format!("{field}.name"),
                format!(
                    "{:?} is not a valid toolset name; use letters, digits, _ and - (1-{longest} \
                     characters, so that <name>__<tool> fits in {MAX_FUNCTION_NAME})",
                    set.name
                ),
            );
        } else if let Some(first) = spec.tool_sets[..index]
            .iter()
            .position(|s| s.name == set.name)
        {
            out.add(
                format!("{field}.name"),
                format!(
                    "{:?} repeats spec.toolSets[{first}].name; toolset names must be unique",
                    set.name
                ),
            );
        }
        check_url(out, &format!("{field}.mcp.url"), &set.mcp.url);
        headers(out, &format!("{field}.mcp.headers"), &set.mcp.headers);
        reserved_headers(out, &format!("{field}.mcp.headers"), &set.mcp.headers, true);
        oauth(
            out,
            &format!("{field}.mcp"),
            &set.mcp.headers,
            set.mcp.oauth.as_ref(),
        );
        for (j, glob) in set.include.iter().enumerate() {
            if glob.is_empty() {
                out.add(
                    format!("{field}.include[{j}]"),
                    "an empty glob matches no tool; remove it, or write \"*\"",
                );
            }
        }
        for (j, over) in set.overrides.iter().enumerate() {
            if let Some(t) = over.timeout_seconds.filter(|t| *t <= 0) {
                out.add(
                    format!("{field}.overrides[{j}].timeoutSeconds"),
                    format!("must be > 0 (got {t}); leave it out for 30"),
                );
            }
        }
    }
}

fn policy(spec: &AgentRunSpec, out: &mut Problems) {
    rules("spec.policy.rules", &spec.policy.rules, out);
}

/// Every problem of the policy `rules` found at `field` (a run's `spec.policy.rules`, an admin
/// policy's `spec.rules`): the rule checks of [`spec`], each problem named by its path under
/// `field`. `agentrt lint` applies it to AgentPolicy and ClusterAgentPolicy files.
pub fn policy_rules(field: &str, rules_at: &[PolicyRule]) -> Vec<Problem> {
    let mut out = Problems::default();
    rules(field, rules_at, &mut out);
    out.0
}

fn rules(prefix: &str, rules: &[PolicyRule], out: &mut Problems) {
    for (index, rule) in rules.iter().enumerate() {
        let field = format!("{prefix}[{index}]");
        if rule.name.is_empty() {
            out.add(
                format!("{field}.name"),
                "must not be empty; name the rule, the record shows it",
            );
        }
        for (j, glob) in rule.tools.iter().enumerate() {
            if glob.is_empty() {
                out.add(
                    format!("{field}.tools[{j}]"),
                    "an empty glob matches no tool; remove it, or write \"*\" for every tool",
                );
            }
        }
        if let Some(when) = &rule.when {
            if let Err(message) = check_when(when) {
                out.add(format!("{field}.when"), message);
            }
        }
        for (name, value) in [
            ("capability", &rule.capability),
            ("presentation", &rule.presentation),
        ] {
            let Some(value) = value else { continue };
            let at = format!("{field}.{name}");
            if !value.is_object() {
                out.add(
                    at,
                    format!("must be a JSON object (got {})", json_kind(value)),
                );
            } else if let Err(sentence) = check_storable_at(value, &at) {
                out.add_sentence(&at, sentence);
            }
        }
    }
}

mod job;

#[cfg(test)]
mod tests;
