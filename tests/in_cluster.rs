//! The chart's controller running as Pods (issue 36): `helm install` of the image `scripts/image`
//! builds onto a one-node cluster (envtest with `NODE=1`: kube-scheduler, a kubelet on
//! containerd, kube-proxy), then the ways replicas die in real clusters, each during a tool call:
//! a force-deleted Pod, `kubectl rollout restart`, `helm upgrade` to another image tag, two
//! evictions through the Eviction API (what `kubectl drain` does) under the PodDisruptionBudget,
//! a memory limit, and `helm uninstall`.
//!
//! It runs only where `scripts/test`'s in-cluster stage sets `AGENTRT_IN_CLUSTER_IMAGE` (the
//! image reference, loaded into the node) and `AGENTRT_IN_CLUSTER_IMAGE_TAG2` (a second tag of
//! it, for the upgrade), with `AGENTRT_TEST_KUBECONFIG` naming that cluster; elsewhere it prints
//! one line and checks nothing. The tool server listens on the host at 10.244.0.1 (the node's
//! bridge address, which Pods reach). One test, in phases that share one installation: a Pod
//! start costs seconds on 2 cores. Each phase prints what it measured (`in_cluster: ...`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;
use support::cluster::TestCluster;
use support::controller::*;
use support::helm::helm;
use support::toolserver::{Behaviour, ToolServer};

/// The node's bridge address: Pods reach the host there.
const NODE_IP: &str = "10.244.0.1";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The installation under test: its release, namespace and the cluster's kubeconfig.
struct Install {
    kubeconfig: PathBuf,
    release: String,
    namespace: String,
    repository: String,
    tag: String,
}

impl Install {
    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["-n", &self.namespace])
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn helm(&self, args: &[&str]) -> Output {
        Command::new(helm())
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .args(["--namespace", &self.namespace])
            .current_dir(root())
            .output()
            .expect("helm runs")
    }

    fn helm_ok(&self, args: &[&str]) -> String {
        let start = Instant::now();
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed after {:?}: {}\n{}",
            start.elapsed(),
            text(&out),
            self.diagnose()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Deployment's name.
    fn deployment(&self) -> String {
        format!("{}-controller", self.release)
    }

    /// Pods, events and the controllers' last log lines, for a failure message.
    fn diagnose(&self) -> String {
        let pods = self.kubectl(&["get", "pods", "-o", "wide"]);
        let events = self.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
        let logs = self.kubectl(&[
            "logs",
            "-l",
            "app.kubernetes.io/component=controller",
            "--tail=30",
            "--prefix",
        ]);
        format!(
            "pods:\n{}\nevents:\n{}\nlogs:\n{}",
            text(&pods),
            text(&events),
            text(&logs)
        )
    }

    fn pods_api(&self, client: &kube::Client) -> Api<Pod> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// The controller Pods that are not being deleted, Ready or not.
    async fn live_pods(&self, client: &kube::Client) -> Vec<Pod> {
        self.pods_api(client)
            .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Waits until `n` controller Pods are Ready and none other is left (a rollout finished).
    async fn wait_ready(&self, client: &kube::Client, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let all = self
                .pods_api(client)
                .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
                .await
                .expect("list pods")
                .items;
            let ready = all.iter().filter(|p| ready(p)).count();
            if ready == n && all.len() == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} Ready controller Pods not reached within {within:?}:\n{}",
                self.diagnose()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The live Pod whose name the holder identity starts with.
    async fn holder_pod(&self, client: &kube::Client, holder: &str) -> String {
        let pods = self.live_pods(client).await;
        pods.iter()
            .filter_map(|p| p.metadata.name.clone())
            .find(|name| holder.starts_with(name.as_str()))
            .unwrap_or_else(|| panic!("no live Pod holds {holder}:\n{}", self.diagnose()))
    }
}

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A run with one RemoteMutation call of the tool at `${TOOLS}/${NAME}` (`calls` of them when
/// more than one, each `item: i`), then complete. Its timeoutSeconds (40) outlasts every call
/// here and is what an approved re-run of an interrupted call waits out (docs/design.md section 5).
fn mutation_run(tools: &str, name: &str, lease_seconds: u32, calls: usize) -> String {
    let decisions: String = (1..=calls)
        .map(|i| format!("      - {{kind: tool_call, tool: change, args: {{item: {i}}}}}\n"))
        .collect();
    format!(
        r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata:
  name: {name}
spec:
  goal: Change things remotely.
  leaseDurationSeconds: {lease_seconds}
  agent:
    scripted:
      decisions:
{decisions}      - {{kind: complete, result: {{done: true}}}}
  tools:
  - name: change
    description: Changes something remote; takes a while.
    sideEffect: RemoteMutation
    timeoutSeconds: 40
    inputSchema: {{type: object}}
    http: {{url: "{tools}/{name}"}}
  policy:
    sideEffects: {{ReadOnly: Allow, LocalMutation: Allow, RemoteMutation: Allow, Destructive: Allow}}
"#
    )
}

/// The user this kubeconfig authenticates as (what an approver must name).
fn whoami(install: &Install) -> String {
    install
        .kubectl_ok(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .trim()
        .to_string()
}

/// Decides `approval` as `user`, naming the user (the chart's admission policies require it).
async fn decide_as(
    client: &kube::Client,
    namespace: &str,
    approval: &DynamicObject,
    verdict: &str,
    user: &str,
) {
    let name = approval.metadata.name.clone().expect("name");
    approvals_api(client, namespace)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"decision": {
                "verdict": verdict,
                "hash": approval.data["spec"]["hash"],
                "approver": user,
            }}})),
        )
        .await
        .expect("the decision is accepted");
}

/// `GET url` from the host; (status, body).
async fn http_get(url: &str) -> Result<(u16, String), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let response = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// `http_get` through a Service's cluster IP, retrying failed connections for up to 30 s
/// (kube-proxy programs the Service after its endpoints turn Ready); an answer of any
/// status ends the wait. Err: the last connection error after 30 s.
async fn http_get_through_service(url: &str) -> Result<(u16, String), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http_get(url).await {
            Ok(answer) => return Ok(answer),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Waits for the first call of run `namespace/name` at the tool server; returns its holder.
async fn first_call(server: &ToolServer, install: &Install, run: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(call) = server.calls_of_run(run).first() {
            return call.holder.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{run}: no tool call within 60 s:\n{}",
            install.diagnose()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a call of `run` that lasts `call_ms` through `disrupt` (which makes the holder's Pod
/// go away gracefully): the call finishes, nothing pauses, the tool is called once, the run
/// completes; returns the run's event types. Asserts the holder's Pod was asked to stop while
/// its call was still running.
async fn graceful_handover(
    cluster: &TestCluster,
    install: &Install,
    server: &ToolServer,
    name: &str,
    call_ms: u64,
    disrupt: impl FnOnce(&Install),
) -> Vec<String> {
    let client = cluster.client();
    let ns = cluster.namespace();
    server.set(name, Behaviour::sleeping(call_ms));
    create_run(&client, ns, &mutation_run(&server.base(), name, 6, 1)).await;
    let run = format!("{ns}/{name}");
    let holder = first_call(server, install, &run).await;
    let holder_pod = install.holder_pod(&client, &holder).await;
    let started = Instant::now();
    disrupt(install);
    // The holder's Pod is asked to stop (deletionTimestamp set) while its call still runs.
    let mut stopped_during_call = false;
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        let status = status(&client, ns, name).await;
        if !stopped_during_call {
            let pod = install
                .pods_api(&client)
                .get_opt(&holder_pod)
                .await
                .ok()
                .flatten();
            let stopping = pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            let answered = server.calls_of_run(&run).iter().any(|c| c.ended.is_some());
            stopped_during_call = stopping && !answered;
        }
        if status["phase"] == "Completed" || status["phase"] == "Failed" {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{run} did not finish within 180 s: {status}\n{}",
            install.diagnose()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        status["phase"],
        "Completed",
        "{run}: {status}\n{}",
        install.diagnose()
    );
    assert!(
        stopped_during_call,
        "{run}: the holder {holder_pod} was not stopped while its call ran (the call took \
         {call_ms} ms); the scenario proved nothing"
    );
    let calls = server.calls_of_run(&run);
    assert_eq!(
        calls.len(),
        1,
        "{run}: the tool was called again: {calls:?}"
    );
    assert!(
        approvals(&client, ns, name).await.is_empty(),
        "{run}: a graceful stop asked a person"
    );
    let types = event_types(&status);
    assert!(
        !types.iter().any(|t| t == "step.interrupted"),
        "{run}: a graceful stop interrupted the step: {types:?}"
    );
    eprintln!(
        "in_cluster: {name}: completed {:.1} s after the disruption; holder {holder_pod}; \
         journal: {}",
        started.elapsed().as_secs_f64(),
        types.join(", ")
    );
    let takeovers = events_of(&status, "lease.taken_over");
    eprintln!("in_cluster: {name}: lease.taken_over events: {takeovers:?}");
    types
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_runs_as_pods_through_rollouts_deletions_evictions_and_limits() {
    let (image, tag2) = match (
        std::env::var("AGENTRT_IN_CLUSTER_IMAGE"),
        std::env::var("AGENTRT_IN_CLUSTER_IMAGE_TAG2"),
    ) {
        (Ok(image), Ok(tag2)) if !image.is_empty() && !tag2.is_empty() => (image, tag2),
        _ => {
            eprintln!(
                "in_cluster: not run: it needs a node and the image (scripts/test's in-cluster \
                 stage sets AGENTRT_IN_CLUSTER_IMAGE and AGENTRT_IN_CLUSTER_IMAGE_TAG2)"
            );
            return;
        }
    };
    let (repository, tag) = image
        .rsplit_once(':')
        .expect("AGENTRT_IN_CLUSTER_IMAGE is repository:tag");
    std::env::set_var("AGENTRT_DEV_NO_CONTROLLER", "1");
    let cluster = TestCluster::start().await;
    assert!(
        !cluster.is_embedded(),
        "AGENTRT_IN_CLUSTER_IMAGE is set but AGENTRT_TEST_KUBECONFIG is not"
    );
    let client = cluster.client();
    let runs_ns = cluster.namespace().to_string();
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let install = Install {
        kubeconfig: cluster.kubeconfig().to_path_buf(),
        release: format!("agentrt-{suffix}"),
        namespace: format!("agentrt-system-{suffix}"),
        repository: repository.to_string(),
        tag: tag.to_string(),
    };
    let user = whoami(&install);

    // 1. helm install into a namespace that enforces the restricted Pod Security Standard, with
    //    the webhook and the admission policies on.
    cluster.kubectl_ok(&["create", "namespace", &install.namespace]);
    cluster.kubectl_ok(&[
        "label",
        "namespace",
        &install.namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    ]);
    let started = Instant::now();
    let out = install.helm_ok(&[
        "install",
        &install.release,
        "charts/agentrt",
        "--wait",
        "--timeout",
        "240s",
        "--set",
        &format!("image.repository={}", install.repository),
        "--set",
        &format!("image.tag={}", install.tag),
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "admissionPolicies.enabled=true",
        "--set",
        "controller.shutdownGraceSeconds=40",
        "--set",
        "terminationGracePeriodSeconds=50",
        "--set",
        "controller.logFormat=text",
    ]);
    assert!(
        out.contains("NOTES"),
        "helm install printed no NOTES: {out}"
    );
    install
        .wait_ready(&client, 2, Duration::from_secs(120))
        .await;
    eprintln!(
        "in_cluster: install: 2 replicas Ready {:.1} s after helm install",
        started.elapsed().as_secs_f64()
    );
    // /readyz answers 200 on each replica; the metrics Service answers with synced watches.
    for pod in install.live_pods(&client).await {
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("a Ready Pod has an IP");
        let (code, body) = http_get(&format!("http://{ip}:8080/readyz"))
            .await
            .unwrap_or_else(|e| panic!("/readyz of {ip}: {e}"));
        assert_eq!(code, 200, "/readyz of a Ready replica: {body}");
    }
    let cluster_ip = install
        .kubectl_ok(&[
            "get",
            "service",
            &format!("{}-metrics", install.release),
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .trim()
        .to_string();
    // kube-proxy programs a Service's rules a moment after its endpoints turn Ready
    // (seen once in CI: the first request failed to connect), so connecting is retried.
    let (code, metrics) = http_get_through_service(&format!("http://{cluster_ip}:8080/metrics"))
        .await
        .unwrap_or_else(|e| panic!("the metrics Service {cluster_ip}: {e}"));
    assert_eq!(code, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("agentrt_watches_synced") && l.ends_with(" 1")),
        "the metrics Service's answer has no synced watch:\n{metrics}"
    );

    // 2. A bad AgentRun is refused by the webhook, through its Service, naming the field.
    let bad = r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata:
  name: bad
spec:
  goal: Refused.
  agent:
    scripted:
      decisions:
      - {kind: complete, result: {}}
  tools:
  - name: "get weather!"
    description: Bad name.
    sideEffect: ReadOnly
    inputSchema: {type: object}
    http: {url: "http://127.0.0.1:1/x"}
"#;
    // The webhook's Service answers once kube-proxy has its endpoints, which may be a moment
    // after the replicas are Ready: a refused connection to it is asked again (up to 60 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    let (out, said) = loop {
        let out = cluster.kubectl_stdin(&["apply", "-f", "-"], bad);
        let said = text(&out);
        let not_reachable_yet = said.contains("failed calling webhook")
            && (said.contains("connection refused") || said.contains("no endpoints available"));
        if !not_reachable_yet || Instant::now() > deadline {
            break (out, said);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(!out.status.success(), "a bad run was admitted: {said}");
    assert!(
        said.contains("denied the request") && said.contains("spec.tools[0].name"),
        "the webhook's refusal names the field: {said}"
    );
    eprintln!("in_cluster: webhook: {}", said.trim());

    // 2b. A run with a Job tool whose creator may create AgentRuns but not Jobs is refused at
    //     apply, naming the tool (docs/design.md section 6, "Job tools").
    let author = "run-author-without-jobs";
    cluster.kubectl_ok(&["create", "serviceaccount", author, "-n", &runs_ns]);
    cluster.kubectl_ok(&[
        "create",
        "role",
        author,
        "-n",
        &runs_ns,
        "--verb=create,get,list,watch",
        "--resource=agentruns.agentrt.dev",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "rolebinding",
        author,
        "-n",
        &runs_ns,
        &format!("--role={author}"),
        &format!("--serviceaccount={runs_ns}:{author}"),
    ]);
    let job_run = r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata:
  name: jobless
spec:
  goal: Refused for its author.
  agent:
    scripted:
      decisions:
      - {kind: complete, result: {}}
  tools:
  - name: report
    description: Runs a report as a Job.
    sideEffect: ReadOnly
    inputSchema: {type: object}
    job:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: report, image: registry.local/report:1}]
"#;
    let out = cluster.kubectl_stdin(
        &[
            "create",
            "-n",
            &runs_ns,
            &format!("--as=system:serviceaccount:{runs_ns}:{author}"),
            "-f",
            "-",
        ],
        job_run,
    );
    let said = text(&out);
    assert!(
        !out.status.success(),
        "a run with a Job tool was admitted for an author who may not create Jobs: {said}"
    );
    assert!(
        said.contains("spec.tools[0].job") && said.contains("may not create jobs"),
        "the refusal names the tool and the missing permission: {said}"
    );
    eprintln!("in_cluster: job tool author: {}", said.trim());

    let server = ToolServer::start_on(NODE_IP).await;

    // 3. The Pod holding a run's Lease is force-deleted during a RemoteMutation call: the other
    //    replica takes over and pauses on interrupted_side_effect; approving calls once more
    //    with the same idempotency key.
    {
        let name = "forced";
        server.set(name, Behaviour::sleeping(20_000));
        create_run(&client, &runs_ns, &mutation_run(&server.base(), name, 6, 1)).await;
        let run = format!("{runs_ns}/{name}");
        let holder = first_call(&server, &install, &run).await;
        let pod = install.holder_pod(&client, &holder).await;
        server.set(name, Behaviour::default());
        let killed = Instant::now();
        install.kubectl_ok(&["delete", "pod", &pod, "--grace-period=0", "--force"]);
        let approval = wait_approval(
            &client,
            &runs_ns,
            name,
            "interrupted_side_effect",
            Duration::from_secs(90),
        )
        .await;
        let takeover = killed.elapsed();
        eprintln!(
            "in_cluster: forced: {pod} force-deleted; the run paused on interrupted_side_effect \
             {:.1} s later (lease 6 s)",
            takeover.as_secs_f64()
        );
        decide_as(&client, &runs_ns, &approval, "Approved", &user).await;
        let status = wait_phase(
            &client,
            &runs_ns,
            name,
            "Completed",
            Duration::from_secs(90),
        )
        .await;
        let calls = server.calls_of_run(&run);
        assert_eq!(calls.len(), 2, "{run}: {calls:?}");
        assert_eq!(
            calls[0].key, calls[1].key,
            "the re-run carries the same idempotency key"
        );
        assert_ne!(
            calls[1].holder, calls[0].holder,
            "another replica ran the approved call"
        );
        assert!(
            !events_of(&status, "lease.taken_over").is_empty(),
            "{run}: no lease.taken_over: {status}"
        );
        install
            .wait_ready(&client, 2, Duration::from_secs(120))
            .await;
    }

    // 4. `kubectl rollout restart` during a call.
    let restart = install.deployment();
    graceful_handover(&cluster, &install, &server, "restarted", 25_000, |i| {
        i.kubectl_ok(&["rollout", "restart", "deployment", &restart]);
    })
    .await;
    install
        .wait_ready(&client, 2, Duration::from_secs(180))
        .await;

    // 5. `helm upgrade` to another image tag during a call.
    let release = install.release.clone();
    let tag2_set = format!("image.tag={tag2}");
    graceful_handover(&cluster, &install, &server, "upgraded", 25_000, |i| {
        i.helm_ok(&[
            "upgrade",
            &release,
            "charts/agentrt",
            "--reuse-values",
            "--set",
            &tag2_set,
        ]);
    })
    .await;
    install
        .wait_ready(&client, 2, Duration::from_secs(180))
        .await;
    let images = install.kubectl_ok(&[
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=controller",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image}",
    ]);
    assert!(
        images
            .split_whitespace()
            .all(|i| i.ends_with(&format!(":{tag2}"))),
        "after the upgrade every replica runs :{tag2}: {images}"
    );

    // 6. Both replicas evicted one after the other through the Eviction API, as `kubectl drain`
    //    does, while runs proceed: the PodDisruptionBudget refuses the second eviction until the
    //    first replica's replacement is Ready; nothing is lost or called twice.
    {
        let names: Vec<String> = (0..4).map(|i| format!("drained-{i}")).collect();
        for name in &names {
            server.set(name, Behaviour::sleeping(3_000));
            create_run(&client, &runs_ns, &mutation_run(&server.base(), name, 6, 3)).await;
        }
        let _ = first_call(&server, &install, &format!("{runs_ns}/{}", names[0])).await;
        let pods: Vec<String> = install
            .live_pods(&client)
            .await
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        assert_eq!(pods.len(), 2, "{pods:?}");
        let api = install.pods_api(&client);
        let mut refused = 0;
        for pod in &pods {
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                match api.evict(pod, &EvictParams::default()).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 429 => {
                        refused += 1;
                        assert!(
                            Instant::now() < deadline,
                            "the eviction of {pod} was refused for 180 s:\n{}",
                            install.diagnose()
                        );
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => panic!("evicting {pod}: {e}"),
                }
            }
        }
        // The second eviction is refused (429) while the PodDisruptionBudget allows no
        // disruption; how many times depends on how fast the first replacement is Ready, so
        // the count is reported, not asserted.
        for name in &names {
            let status = wait_phase(
                &client,
                &runs_ns,
                name,
                "Completed",
                Duration::from_secs(240),
            )
            .await;
            let run = format!("{runs_ns}/{name}");
            let calls = server.calls_of_run(&run);
            assert_eq!(calls.len(), 3, "{run}: each of 3 calls once: {calls:?}");
            let mut keys: Vec<&str> = calls.iter().map(|c| c.key.as_str()).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), 3, "{run}: a key called twice: {calls:?}");
            assert!(
                approvals(&client, &runs_ns, name).await.is_empty(),
                "{run}: an eviction asked a person: {status}"
            );
        }
        eprintln!(
            "in_cluster: drained: both replicas evicted ({refused} evictions refused by the \
             PodDisruptionBudget meanwhile); 4 runs x 3 calls completed, each call once"
        );
        install
            .wait_ready(&client, 2, Duration::from_secs(180))
            .await;
    }

    // 7. A tool answer far larger than a small memory limit, during a call: either the
    //    controller bounds what it reads (the step fails, the replica lives) or the kernel
    //    kills the replica and the run is taken over like any crash (it pauses on
    //    interrupted_side_effect). Either way the run settles; which one happened is printed.
    {
        install.helm_ok(&[
            "upgrade",
            &install.release,
            "charts/agentrt",
            "--reuse-values",
            "--wait",
            "--timeout",
            "240s",
            "--set",
            "resources.limits.memory=64Mi",
            "--set",
            "resources.requests.memory=48Mi",
        ]);
        install
            .wait_ready(&client, 2, Duration::from_secs(180))
            .await;
        let name = "huge";
        server.set(name, Behaviour::answering_bytes(256 * 1024 * 1024));
        create_run(&client, &runs_ns, &mutation_run(&server.base(), name, 6, 1)).await;
        let deadline = Instant::now() + Duration::from_secs(180);
        let outcome = loop {
            let status = status(&client, &runs_ns, name).await;
            if status["phase"] == "Completed" || status["phase"] == "Failed" {
                break format!("the run ended {} ({})", status["phase"], status["reason"]);
            }
            if let Some(a) = approvals(&client, &runs_ns, name)
                .await
                .into_iter()
                .find(|a| a.data["spec"]["kind"] == "interrupted_side_effect")
            {
                decide_as(&client, &runs_ns, &a, "Rejected", &user).await;
                wait_phase(
                    &client,
                    &runs_ns,
                    name,
                    "Cancelled",
                    Duration::from_secs(60),
                )
                .await;
                break "the run paused on interrupted_side_effect (rejected: Cancelled)"
                    .to_string();
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not settle within 180 s: {status}\n{}",
                install.diagnose()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        let pods = install
            .pods_api(&client)
            .list(&ListParams::default())
            .await
            .expect("pods");
        let oom_killed = pods.items.iter().any(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.last_state
                            .as_ref()
                            .and_then(|l| l.terminated.as_ref())
                            .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
                    })
                })
        });
        let calls = server.calls_of_run(&format!("{runs_ns}/{name}"));
        assert!(
            !calls.is_empty() && calls.len() <= 1,
            "{name}: the answer was asked for once (a re-run needs an approval): {calls:?}"
        );
        if oom_killed {
            assert!(
                outcome.contains("interrupted_side_effect"),
                "{name}: a replica was OOMKilled but the run did not pause: {outcome}"
            );
        }
        eprintln!(
            "in_cluster: memory limit 64Mi, a 256 MiB answer: {}; {outcome}",
            if oom_killed {
                "the kernel killed the replica (OOMKilled)"
            } else {
                "no replica was OOMKilled (the controller bounded what it read)"
            }
        );
    }

    // 8. helm uninstall leaves the CRDs and every run.
    let before = cluster.kubectl_ok(&["get", "agentruns", "-o", "name"]);
    install.helm_ok(&["uninstall", &install.release, "--wait"]);
    cluster.kubectl_ok(&[
        "get",
        "crd",
        "agentruns.agentrt.dev",
        "approvals.agentrt.dev",
    ]);
    let after = cluster.kubectl_ok(&["get", "agentruns", "-o", "name"]);
    assert_eq!(before, after, "helm uninstall changed the runs");
    assert_eq!(
        after.lines().count(),
        1 + 2 + 4 + 1,
        "every run is still there: {after}"
    );
    let _ = cluster.kubectl(&["delete", "namespace", &install.namespace, "--wait=false"]);
    eprintln!(
        "in_cluster: uninstall: the CRDs and the {} runs are left",
        after.lines().count()
    );
}
