//! The `Status` bodies kube-apiserver answers a refused write with: 422 Invalid with one cause per
//! field error (apimachinery's `errors.NewInvalid`), and the text of an aggregate of errors.

use serde_json::{json, Value};

use super::gofmt;
use super::FieldError;

/// utilerrors.NewAggregate's text: one message as it is, several (deduplicated) as `[a, b]`.
pub(super) fn aggregate(messages: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for m in messages {
        if !seen.contains(&m.as_str()) {
            seen.push(m);
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The 422 `Status` for `errors` on the object `name` of `kind` in API group `group`.
pub(super) fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Value {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let mut message = format!("{qualified} {} is invalid", gofmt::quote(name));
    if !messages.is_empty() {
        message.push_str(": ");
        message.push_str(&aggregate(&messages));
    }
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| {
            json!({
                "reason": e.kind.reason(),
                "message": e.body(),
                "field": e.field,
            })
        })
        .collect();
    // Go omits empty fields of StatusDetails.
    let mut details = json!({"kind": kind});
    if !name.is_empty() {
        details["name"] = Value::String(name.to_string());
    }
    if !group.is_empty() {
        details["group"] = Value::String(group.to_string());
    }
    if !causes.is_empty() {
        details["causes"] = Value::Array(causes);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": details,
        "code": 422,
    })
}
