//! The differential test: one set of requests (`tests/fixtures/differential/cases.yaml`: CRDs
//! with CEL rules good and bad, good and bad objects, merge/JSON/strategic patches,
//! resourceVersion conflicts, server-side apply, list pagination, field selectors over a CRD's
//! `selectableFields`) sent to the embedded server and to a real kube-apiserver in the same run.
//! For every case it compares the status code, the `reason`, the causes' field paths and the
//! fields the case names (of a success, or of the Status of a refusal, e.g. its `message`). Any
//! difference not in [`ALLOWED`] fails the test.
//!
//! The real server is `AGENTRT_DIFF_KUBECONFIG`, else `AGENTRT_TEST_KUBECONFIG`; with neither,
//! the test says in one line that it compared nothing and passes.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize;
use serde_json::Value;
use support::cluster::{Options, TestCluster};

/// Differences known today, each with why: (case, what differs, reason). `what` is `status`
/// (code, reason and causes), `causes` (the causes' reasons and field paths only) or
/// `field <path>` (a compared field of a success).
const ALLOWED: &[(&str, &str, &str)] = &[];

/// One request of `cases.yaml`.
#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    body: Option<serde_yaml::Value>,
    #[serde(default)]
    body_file: Option<String>,
    #[serde(default)]
    raw_body: Option<String>,
    #[serde(default)]
    compare: Vec<String>,
    #[serde(default)]
    wait_served: Option<String>,
}

/// What a server answered, reduced to what is compared.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    code: u16,
    reason: String,
    causes: Vec<String>,
    fields: Vec<(String, Value)>,
    body: Value,
}

/// One server under test: a client, the namespace of this run, and the continue tokens it gave.
struct Side {
    name: &'static str,
    client: kube::Client,
    namespace: String,
    tokens: HashMap<String, String>,
}

fn fixture_dir() -> PathBuf {
    support::fixtures::path("differential")
}

async fn client_for(path: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig readable");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig usable");
    kube::Client::try_from(config).expect("client")
}

fn substitute(text: &str, group: &str, side: &Side) -> String {
    let mut out = text
        .replace("{group}", group)
        .replace("{ns}", &side.namespace);
    while let Some(start) = out.find("{continue:") {
        let Some(len) = out[start..].find('}') else {
            break;
        };
        let case = &out[start + "{continue:".len()..start + len];
        let token = side.tokens.get(case).cloned().unwrap_or_default();
        out.replace_range(start..start + len + 1, &token);
    }
    out
}

/// The body to send: YAML for a YAML content type, JSON otherwise.
fn body_bytes(case: &Case, group: &str, side: &Side) -> Vec<u8> {
    if let Some(raw) = &case.raw_body {
        return substitute(raw, group, side).into_bytes();
    }
    let text = match (&case.body, &case.body_file) {
        (Some(v), _) => serde_yaml::to_string(v).expect("body serializes"),
        (None, Some(file)) => std::fs::read_to_string(fixture_dir().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}")),
        (None, None) => return Vec::new(),
    };
    let yaml: serde_yaml::Value = serde_yaml::from_str(&substitute(&text, group, side))
        .unwrap_or_else(|e| panic!("{}: body is not YAML: {e}", case.name));
    let is_yaml = case
        .content_type
        .as_deref()
        .is_some_and(|c| c.contains("yaml"));
    if is_yaml {
        serde_yaml::to_string(&yaml)
            .expect("YAML serializes")
            .into_bytes()
    } else {
        serde_json::to_vec(&serde_json::to_value(yaml).expect("JSON value")).expect("JSON")
    }
}

async fn send(client: &kube::Client, method: &str, path: &str, ct: &str, body: Vec<u8>) -> Answer {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, ct)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = client.send(req).await.expect("server answers");
    let code = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect_bytes()
        .await
        .expect("body readable");
    // As deep as the servers answer (a case nests 150 levels, past serde_json's default 128).
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    de.disable_recursion_limit();
    let body: Value = Deserialize::deserialize(&mut de).unwrap_or(Value::Null);
    let mut causes: Vec<String> = body["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {}",
                c["reason"].as_str().unwrap_or(""),
                c["field"].as_str().unwrap_or("")
            )
        })
        .collect();
    causes.sort();
    let reason = if body["kind"] == "Status" {
        body["reason"].as_str().unwrap_or("").to_string()
    } else {
        String::new()
    };
    Answer {
        code,
        reason,
        causes,
        fields: Vec::new(),
        body,
    }
}

/// The value at `path` (dot-separated, `*` for every item of an array). A trailing `?` asks
/// only whether it is a non-empty string; a trailing `~` sorts the array found, for lists
/// kube-apiserver builds in Go map order (the causes of several schema errors in one object).
fn select(v: &Value, path: &str) -> Value {
    if let Some(path) = path.strip_suffix('~') {
        let mut items = select(v, path).as_array().cloned().unwrap_or_default();
        items.sort_by_key(|item| item.to_string());
        return Value::Array(items);
    }
    let (path, presence) = match path.strip_suffix('?') {
        Some(p) => (p, true),
        None => (path, false),
    };
    fn walk(v: &Value, segs: &[&str]) -> Value {
        match segs.split_first() {
            None => v.clone(),
            Some((&"*", rest)) => Value::Array(
                v.as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| walk(x, rest))
                    .collect(),
            ),
            Some((seg, rest)) => walk(&v[*seg], rest),
        }
    }
    let found = walk(v, &path.split('.').collect::<Vec<_>>());
    if presence {
        Value::Bool(found.as_str().is_some_and(|s| !s.is_empty()))
    } else {
        found
    }
}

async fn wait_served(side: &Side, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = send(&side.client, "GET", path, "application/json", Vec::new()).await;
        if a.code == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {path} not served within 30 s: {}",
            side.name,
            a.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run_case(case: &Case, group: &str, side: &mut Side) -> Option<Answer> {
    if let Some(path) = &case.wait_served {
        let path = substitute(path, group, side);
        wait_served(side, &path).await;
        return None;
    }
    let method = case.method.as_deref().unwrap_or("GET");
    let path = substitute(case.path.as_deref().unwrap_or("/"), group, side);
    let ct = case.content_type.as_deref().unwrap_or("application/json");
    let body = body_bytes(case, group, side);
    let mut answer = send(&side.client, method, &path, ct, body).await;
    if let Some(token) = answer.body["metadata"]["continue"].as_str() {
        side.tokens.insert(case.name.clone(), token.to_string());
    }
    answer.fields = case
        .compare
        .iter()
        .map(|p| (p.clone(), select(&answer.body, p)))
        .collect();
    Some(answer)
}

/// The differences between two answers, as (what, embedded, real).
fn differences(embedded: &Answer, real: &Answer) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    if embedded.code != real.code || embedded.reason != real.reason {
        out.push((
            "status".into(),
            format!(
                "{} {} {:?}",
                embedded.code, embedded.reason, embedded.causes
            ),
            format!("{} {} {:?}", real.code, real.reason, real.causes),
        ));
    } else if embedded.causes != real.causes {
        out.push((
            "causes".into(),
            format!("{:?}", embedded.causes),
            format!("{:?}", real.causes),
        ));
    }
    if embedded.code == real.code {
        for ((path, e), (_, r)) in embedded.fields.iter().zip(&real.fields) {
            if e != r {
                out.push((format!("field {path}"), e.to_string(), r.to_string()));
            }
        }
    }
    out
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .expect("JSON");
    let a = send(
        client,
        "POST",
        "/api/v1/namespaces",
        "application/json",
        body,
    )
    .await;
    assert_eq!(a.code, 201, "cannot create namespace {name}: {}", a.body);
}

#[tokio::test]
async fn the_embedded_server_answers_as_kube_apiserver_does() {
    let real_kubeconfig = ["AGENTRT_DIFF_KUBECONFIG", "AGENTRT_TEST_KUBECONFIG"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.is_empty());
    let Some(real_kubeconfig) = real_kubeconfig else {
        println!(
            "devcluster_differential: compared nothing: no real server was given \
             (set AGENTRT_DIFF_KUBECONFIG or AGENTRT_TEST_KUBECONFIG)"
        );
        return;
    };
    let text = std::fs::read_to_string(fixture_dir().join("cases.yaml")).expect("cases.yaml");
    let cases: Vec<Case> = serde_yaml::from_str(&text).expect("cases.yaml parses");

    let embedded = TestCluster::start_with(Options {
        embedded_only: true,
        ..Options::default()
    })
    .await;
    let suffix = format!("{:08x}", rand::random::<u32>());
    let group = format!("d{suffix}.agentrt.dev");
    let mut sides = [
        Side {
            name: "embedded",
            client: embedded.client(),
            namespace: embedded.namespace().to_string(),
            tokens: HashMap::new(),
        },
        Side {
            name: "real",
            client: client_for(Path::new(&real_kubeconfig)).await,
            namespace: format!("agentrt-diff-{suffix}"),
            tokens: HashMap::new(),
        },
    ];
    create_namespace(&sides[1].client, &sides[1].namespace).await;

    let mut unlisted = Vec::new();
    let mut used = vec![false; ALLOWED.len()];
    for case in &cases {
        let e = run_case(case, &group, &mut sides[0]).await;
        let r = run_case(case, &group, &mut sides[1]).await;
        let (Some(e), Some(r)) = (e, r) else {
            continue;
        };
        for (what, ev, rv) in differences(&e, &r) {
            let allowed = |(c, w, _): &&(&str, &str, &str)| {
                *c == case.name && (*w == what || (*w == "status" && what == "causes"))
            };
            match ALLOWED.iter().position(|e| allowed(&e)) {
                Some(i) => used[i] = true,
                None => unlisted.push(format!(
                    "{}: {what} differs: embedded {ev}, real {rv}\n  embedded answered: {}\n  \
                     real answered: {}",
                    case.name, e.body, r.body
                )),
            }
        }
    }

    // Clean up the real server (the embedded one goes with its process).
    let real = &sides[1];
    let _ = send(
        &real.client,
        "DELETE",
        &format!("/api/v1/namespaces/{}", real.namespace),
        "application/json",
        Vec::new(),
    )
    .await;
    for plural in [
        "gadgets",
        "badundefineds",
        "badtypeerrors",
        "badnofunctions",
        "badsyntaxs",
        "badcosts",
        "badnontypes",
        "baduncorrelatables",
        "badmessageexpressions",
        "badselectables",
    ] {
        let path =
            format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}");
        let _ = send(
            &real.client,
            "DELETE",
            &path,
            "application/json",
            Vec::new(),
        )
        .await;
    }

    let mut stale = Vec::new();
    for (i, (case, what, reason)) in ALLOWED.iter().enumerate() {
        if !used[i] {
            stale.push(format!("{case}: {what} ({reason})"));
        }
    }
    assert!(
        stale.is_empty(),
        "allowlist entries that no longer match a difference (remove them):\n{}",
        stale.join("\n")
    );
    assert!(
        unlisted.is_empty(),
        "{} difference(s) between the embedded server and kube-apiserver not in the \
         allowlist:\n{}",
        unlisted.len(),
        unlisted.join("\n")
    );
}
