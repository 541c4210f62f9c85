//! The webhook's Secret access check (docs/design.md section 6, "Secrets"; docs/behaviours.md
//! 103; issue 34 item 2): a run may name a Secret (a header's `secretKeyRef`, the openai key) only
//! when the user creating it may `get` that Secret, asked of the API server by a
//! `SubjectAccessReview` (authorization.k8s.io/v1) with the AdmissionReview's `userInfo`.
//! Otherwise creating an AgentRun would read any Secret of the namespace for its author.
//!
//! Asked on a create, and on an update only for the Secrets the update adds (a Secret the run
//! already named was checked when it was named). A review that cannot be made refuses the run
//! (fail closed). `agentrt dev`'s embedded server has no authorization (every request is
//! allowed), so it asks none: there every user may read every Secret anyway.
//!
//! Owns: which Secrets of a request are checked, the review sent, the refusal message. Must not:
//! judge the spec otherwise (that is `admission::refusal_under`), or read a Secret.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::Value;

use crate::tools::consent::{named_secrets, NamedSecret};

/// How long the reviews of one request may take in all, within the webhook configuration's
/// `timeoutSeconds` (the chart's is 10).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(6);

/// At most this many reviews of one request are in flight at once.
const CONCURRENT_REVIEWS: usize = 8;

/// What the API server answered about one user and one Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The user may `get` the Secret.
    Allowed,
    /// The user may not; the authorizer's reason when it gave one.
    Denied(String),
}

/// Asks whether a user may `get` a Secret (a `SubjectAccessReview` on a cluster).
#[async_trait]
pub trait SecretAccess: Send + Sync {
    /// Whether `user` may `get` Secret `name` of `namespace`.
    ///
    /// # Errors
    /// When the review could not be made (the API server unreachable, the controller not
    /// allowed to create reviews, an invalid user): a sentence saying why.
    async fn may_get(&self, user: &UserInfo, namespace: &str, name: &str)
        -> Result<Access, String>;

    /// Whether `user` may `create` Jobs (batch) in `namespace`: a run with a `job` tool makes
    /// the controller create Jobs, and so Pods as the template's ServiceAccount, for its author
    /// (docs/design.md section 6, "Job tools").
    ///
    /// # Errors
    /// As [`SecretAccess::may_get`].
    async fn may_create_jobs(&self, user: &UserInfo, namespace: &str) -> Result<Access, String>;
}

/// [`SecretAccess`] by `SubjectAccessReview`s created with the controller's client (its
/// ServiceAccount needs `create` on `subjectaccessreviews.authorization.k8s.io`, which the
/// chart's ClusterRole grants).
#[derive(Clone)]
pub struct SubjectAccessReviews {
    client: Client,
}

impl SubjectAccessReviews {
    /// Reviews made with `client`.
    pub fn new(client: Client) -> SubjectAccessReviews {
        SubjectAccessReviews { client }
    }
}

#[async_trait]
impl SecretAccess for SubjectAccessReviews {
    async fn may_get(
        &self,
        user: &UserInfo,
        namespace: &str,
        name: &str,
    ) -> Result<Access, String> {
        self.ask(review_of(user, namespace, name)).await
    }

    async fn may_create_jobs(&self, user: &UserInfo, namespace: &str) -> Result<Access, String> {
        let mut review = review_of(user, namespace, "");
        review.spec.resource_attributes = Some(ResourceAttributes {
            namespace: Some(namespace.to_string()),
            verb: Some("create".to_string()),
            group: Some("batch".to_string()),
            version: Some("v1".to_string()),
            resource: Some("jobs".to_string()),
            ..ResourceAttributes::default()
        });
        self.ask(review).await
    }
}

impl SubjectAccessReviews {
    /// Creates `review` and reads its answer.
    async fn ask(&self, review: SubjectAccessReview) -> Result<Access, String> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answered =
            api.create(&PostParams::default(), &review)
                .await
                .map_err(|err| match err {
                    kube::Error::Api(status) => format!(
                        "the SubjectAccessReview was refused ({}): {}",
                        status.code, status.message
                    ),
                    other => format!("the SubjectAccessReview failed: {other}"),
                })?;
        let Some(status) = answered.status else {
            return Err("the SubjectAccessReview came back without a status".to_string());
        };
        if status.allowed {
            return Ok(Access::Allowed);
        }
        let reason = [status.reason, status.evaluation_error]
            .into_iter()
            .flatten()
            .filter(|said| !said.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Ok(Access::Denied(reason))
    }
}

/// The fields `spec.tools[i].job` of the `job` tools of an AgentRun object.
fn job_fields(object: &Value) -> Vec<String> {
    object["spec"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, tool)| tool.get("job").is_some_and(|j| !j.is_null()))
        .map(|(i, _)| format!("spec.tools[{i}].job"))
        .collect()
}

/// The review asking whether `user` (all of it: name, uid, groups, extra) may `get` Secret
/// `name` of `namespace`.
fn review_of(user: &UserInfo, namespace: &str, name: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("get".to_string()),
                group: Some(String::new()),
                version: Some("v1".to_string()),
                resource: Some("secrets".to_string()),
                name: Some(name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Why the AgentRun of `request` (an AdmissionReview's `request`) may not be admitted for its
/// user's access to the Secrets it names, or `None`: each field naming a Secret the user may not
/// `get`, with the fix, as `field: message; field: message`.
///
/// Checked: on a `CREATE`, every Secret the spec names; on an `UPDATE`, the Secrets the new
/// spec names that the old did not; nothing for another operation, another kind or a spec that
/// does not decode (the spec's own check refuses that). A review that fails or takes longer than
/// [`REVIEW_TIMEOUT`] refuses the run saying so (fail closed).
pub async fn refusal(request: &Value, access: &dyn SecretAccess) -> Option<String> {
    let object = &request["object"];
    if object["kind"] != "AgentRun" {
        return None;
    }
    let named = |object: &Value| {
        crate::api::decode_spec(&object["spec"])
            .map(|decoded| named_secrets(&decoded.spec))
            .ok()
    };
    let checked: Vec<NamedSecret> = match request["operation"].as_str() {
        Some("CREATE") => named(object)?,
        Some("UPDATE") => {
            let before: BTreeSet<String> = named(&request["oldObject"])
                .unwrap_or_default()
                .into_iter()
                .map(|secret| secret.name)
                .collect();
            named(object)?
                .into_iter()
                .filter(|secret| !before.contains(&secret.name))
                .collect()
        }
        _ => return None,
    };
    let jobs = job_fields(object);
    let jobs_before = job_fields(&request["oldObject"]);
    let jobs_added = match request["operation"].as_str() {
        Some("UPDATE") => !jobs.is_empty() && jobs_before.is_empty(),
        _ => !jobs.is_empty(),
    };
    if checked.is_empty() && !jobs_added {
        return None;
    }
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .or_else(|| request["namespace"].as_str())
        .unwrap_or("default")
        .to_string();
    let user: UserInfo = match serde_json::from_value(request["userInfo"].clone()) {
        Ok(user) => user,
        Err(err) => {
            return Some(format!(
                "cannot check access to the Secrets the run names: the request's userInfo does \
                 not decode ({err}); the run is refused until it can be checked"
            ))
        }
    };
    let who = user.username.clone().unwrap_or_else(|| "(no name)".into());
    let mut problems = Vec::new();
    if jobs_added {
        let field = jobs.join(", ");
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, access.may_create_jobs(&user, &namespace))
                .await
                .unwrap_or_else(|_| Err("the SubjectAccessReview took too long".to_string()));
        match answer {
            Ok(Access::Allowed) => {}
            Ok(Access::Denied(reason)) => {
                let why = if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                };
                problems.push(format!(
                    "{field}: {who} may not create jobs in namespace {namespace}{why}; a Job tool \
                     runs its calls as Jobs for the run's author: ask for create on \
                     jobs.batch there, or use an http or mcp tool"
                ));
            }
            Err(err) => problems.push(format!(
                "{field}: cannot check that {who} may create jobs in namespace {namespace}: \
                 {err}; the run is refused until it can be checked"
            )),
        }
    }
    let names: BTreeSet<String> = checked.iter().map(|s| s.name.clone()).collect();
    let reviews = futures::stream::iter(names)
        .map(|name| {
            let user = &user;
            let namespace = &namespace;
            async move {
                let answer = access.may_get(user, namespace, &name).await;
                (name, answer)
            }
        })
        .buffered(CONCURRENT_REVIEWS)
        .collect::<Vec<_>>();
    let answers = match tokio::time::timeout(REVIEW_TIMEOUT, reviews).await {
        Ok(answers) => answers,
        Err(_) => {
            return Some(format!(
                "cannot check that {who} may get the Secrets the run names: the \
                 SubjectAccessReviews took longer than {}s; the run is refused until they \
                 answer (try again)",
                REVIEW_TIMEOUT.as_secs()
            ))
        }
    };
    for secret in &checked {
        let Some((_, answer)) = answers.iter().find(|(name, _)| *name == secret.name) else {
            continue;
        };
        match answer {
            Ok(Access::Allowed) => {}
            Ok(Access::Denied(reason)) => {
                let why = if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                };
                problems.push(format!(
                    "{}: {who} may not get Secret {namespace}/{}{why}; ask for get on that \
                     Secret or use one you can read",
                    secret.field, secret.name
                ));
            }
            Err(err) => problems.push(format!(
                "{}: cannot check that {who} may get Secret {namespace}/{}: {err}; the run is \
                 refused until it can be checked (the controller's ServiceAccount needs create \
                 on subjectaccessreviews.authorization.k8s.io)",
                secret.field, secret.name
            )),
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    /// Allows the Secrets named in `readable`, fails the review of `broken`, records each ask.
    struct Fake {
        readable: Vec<&'static str>,
        broken: Option<&'static str>,
        asked: Mutex<Vec<(String, String, String)>>,
    }

    #[async_trait]
    impl SecretAccess for Fake {
        async fn may_get(
            &self,
            user: &UserInfo,
            namespace: &str,
            name: &str,
        ) -> Result<Access, String> {
            self.asked.lock().expect("lock").push((
                user.username.clone().unwrap_or_default(),
                namespace.to_string(),
                name.to_string(),
            ));
            if self.broken == Some(name) {
                return Err("the SubjectAccessReview failed: connection refused".into());
            }
            Ok(if self.readable.contains(&name) {
                Access::Allowed
            } else {
                Access::Denied("RBAC: no rule".into())
            })
        }

        async fn may_create_jobs(
            &self,
            user: &UserInfo,
            namespace: &str,
        ) -> Result<Access, String> {
            self.asked.lock().expect("lock").push((
                user.username.clone().unwrap_or_default(),
                namespace.to_string(),
                "create jobs".to_string(),
            ));
            Ok(if self.readable.contains(&"jobs") {
                Access::Allowed
            } else {
                Access::Denied("RBAC: no rule".into())
            })
        }
    }

    fn fake(readable: &[&'static str], broken: Option<&'static str>) -> Fake {
        Fake {
            readable: readable.to_vec(),
            broken,
            asked: Mutex::new(Vec::new()),
        }
    }

    fn run(secrets: &[&str]) -> Value {
        let headers: Vec<Value> = secrets
            .iter()
            .map(|s| json!({"name": "Authorization", "secretKeyRef": {"name": s, "key": "k"}}))
            .collect();
        json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "leak", "namespace": "team-a"},
            "spec": {
                "goal": "g",
                "agent": {"scripted": {"decisions": []}},
                "tools": [{"name": "t", "sideEffect": "ReadOnly", "inputSchema": {"type": "object"},
                           "http": {"url": "http://127.0.0.1:1/t", "headers": headers}}]
            }
        })
    }

    fn request(operation: &str, object: Value, old: Option<Value>) -> Value {
        json!({
            "uid": "u",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["team-a"], "uid": "42",
                         "extra": {"scopes": ["x"]}},
            "object": object,
            "oldObject": old,
        })
    }

    #[tokio::test]
    async fn a_secret_the_creator_may_not_get_is_refused_naming_the_field_and_the_fix() {
        let access = fake(&["open"], None);
        let said = refusal(
            &request("CREATE", run(&["open", "db-admin"]), None),
            &access,
        )
        .await
        .expect("refused");
        assert_eq!(
            said,
            "spec.tools[0].http.headers[1].secretKeyRef.name: alice may not get Secret \
             team-a/db-admin (RBAC: no rule); ask for get on that Secret or use one you can read"
        );
        let mut asked = access.asked.lock().expect("lock").clone();
        asked.sort();
        assert_eq!(
            asked,
            [
                ("alice".into(), "team-a".into(), "db-admin".into()),
                ("alice".into(), "team-a".into(), "open".into())
            ]
        );
        let admitted = refusal(&request("CREATE", run(&["open"]), None), &access).await;
        assert_eq!(admitted, None);
    }

    #[tokio::test]
    async fn a_review_that_cannot_be_made_refuses_the_run() {
        let access = fake(&[], Some("db-admin"));
        let said = refusal(&request("CREATE", run(&["db-admin"]), None), &access)
            .await
            .expect("refused");
        assert!(
            said.starts_with("spec.tools[0].http.headers[0].secretKeyRef.name: cannot check")
                && said.contains("connection refused")
                && said.contains("create on subjectaccessreviews"),
            "{said}"
        );
        let said = refusal(
            &json!({"operation": "CREATE", "userInfo": {"groups": 5}, "object": run(&["s"])}),
            &access,
        )
        .await
        .expect("refused");
        assert!(said.contains("userInfo does not decode"), "{said}");
    }

    #[tokio::test]
    async fn an_update_checks_only_the_secrets_it_adds() {
        let access = fake(&[], None);
        let same = request("UPDATE", run(&["db-admin"]), Some(run(&["db-admin"])));
        assert_eq!(refusal(&same, &access).await, None);
        assert!(
            access.asked.lock().expect("lock").is_empty(),
            "nothing asked"
        );
        let added = request(
            "UPDATE",
            run(&["db-admin", "new"]),
            Some(run(&["db-admin"])),
        );
        let said = refusal(&added, &access).await.expect("refused");
        assert!(
            said.starts_with("spec.tools[0].http.headers[1].secretKeyRef.name: alice may not get Secret team-a/new"),
            "{said}"
        );
        assert!(!said.contains("db-admin"), "{said}");
        let delete = json!({"operation": "DELETE", "object": run(&["x"])});
        assert_eq!(refusal(&delete, &access).await, None);
    }

    #[test]
    fn the_review_asks_for_get_on_the_secret_as_the_whole_user() {
        let user: UserInfo =
            serde_json::from_value(request("CREATE", run(&[]), None)["userInfo"].clone())
                .expect("userInfo");
        let review = serde_json::to_value(review_of(&user, "team-a", "db-admin")).expect("JSON");
        assert_eq!(
            review["spec"],
            json!({
                "user": "alice",
                "uid": "42",
                "groups": ["team-a"],
                "extra": {"scopes": ["x"]},
                "resourceAttributes": {"namespace": "team-a", "verb": "get", "group": "",
                                       "version": "v1", "resource": "secrets", "name": "db-admin"}
            })
        );
        assert_eq!(review["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(review["kind"], "SubjectAccessReview");
    }

    #[tokio::test]
    async fn a_job_tool_whose_author_may_not_create_jobs_is_refused_naming_the_tool() {
        let mut object = run(&[]);
        object["spec"]["tools"][0]["job"] =
            json!({"template": {"spec": {"containers": [{"name": "m", "image": "i"}]}}});
        let denied = fake(&[], None);
        let said = refusal(&request("CREATE", object.clone(), None), &denied)
            .await
            .expect("refused");
        assert!(
            said.starts_with("spec.tools[0].job: alice may not create jobs in namespace team-a"),
            "{said}"
        );
        let allowed = fake(&["jobs"], None);
        assert_eq!(
            refusal(&request("CREATE", object.clone(), None), &allowed).await,
            None
        );
        // An update of a run that had its Job tool already asks nothing again.
        assert_eq!(
            refusal(&request("UPDATE", object.clone(), Some(object)), &denied).await,
            None
        );
    }
}
