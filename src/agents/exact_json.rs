//! Reading an agent's answer as JSON the Kubernetes API stores exactly (docs/design.md section 6):
//! integers within int64, numbers within float64, and bounded nesting. serde_json alone would
//! turn an integer beyond int64 into a float silently, so a decision could reach a tool with
//! digits the agent never sent. The answer's bytes are scanned first; only JSON that passes is
//! parsed.
//!
//! The nesting bound is [`MAX_ANSWER_DEPTH`] (100), not docs/design.md's 256: the record stores a
//! decision's args about six levels down (`status.steps[i].decision.args`, and again in the
//! `step.tool_started` event), and serde_json-based readers of the AgentRun (kube-rs, which the
//! controller itself uses) refuse documents nested deeper than 128. Deeper args would make the
//! run unreadable to every replica, so they are an invalid decision here, where the run can
//! still go on.

use serde::Deserialize;
use serde_json::Value;

/// Deepest nesting accepted in an agent's answer (see the module doc for why not 256).
pub const MAX_ANSWER_DEPTH: usize = 100;

/// Why an answer was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExactJsonError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// JSON the Kubernetes API would not store as sent.
    #[error("{0}")]
    Unstorable(String),
}

/// Parses `bytes` as JSON that the Kubernetes API stores exactly.
///
/// # Errors
/// [`ExactJsonError::Unstorable`] for nesting deeper than [`MAX_ANSWER_DEPTH`], an integer
/// outside int64 or a number outside float64 (checked on the text, before parsing);
/// [`ExactJsonError::NotJson`] when it is not JSON.
pub fn read_exact(bytes: &[u8]) -> Result<Value, ExactJsonError> {
    scan(bytes)?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // The scan bounded the nesting, so recursion stays shallow.
    de.disable_recursion_limit();
    let value = Value::deserialize(&mut de).map_err(|e| ExactJsonError::NotJson(e.to_string()))?;
    de.end()
        .map_err(|e| ExactJsonError::NotJson(e.to_string()))?;
    Ok(value)
}

/// Walks the text outside strings: container depth and every number token.
fn scan(bytes: &[u8]) -> Result<(), ExactJsonError> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_ANSWER_DEPTH {
                    return Err(ExactJsonError::Unstorable(format!(
                        "the JSON nests deeper than {MAX_ANSWER_DEPTH} levels"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                check_number(&bytes[start..i])?;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn check_number(token: &[u8]) -> Result<(), ExactJsonError> {
    let text = String::from_utf8_lossy(token);
    let integer = !token.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
    if integer {
        if text.parse::<i64>().is_err() {
            return Err(ExactJsonError::Unstorable(format!(
                "the integer {text} does not fit int64; the Kubernetes API would store it as a \
                 float and lose digits (send it as a string)"
            )));
        }
    } else if text.parse::<f64>().map_or(true, |f| !f.is_finite()) {
        return Err(ExactJsonError::Unstorable(format!(
            "the number {text} is outside float64"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn nesting_up_to_the_bound_is_read_and_deeper_is_unstorable() {
        assert!(read_exact(nested(MAX_ANSWER_DEPTH).as_bytes()).is_ok());
        assert!(matches!(
            read_exact(nested(MAX_ANSWER_DEPTH + 1).as_bytes()),
            Err(ExactJsonError::Unstorable(_))
        ));
        assert!(matches!(
            read_exact(nested(300).as_bytes()),
            Err(ExactJsonError::Unstorable(_))
        ));
        assert!(matches!(
            read_exact(nested(100_000).as_bytes()),
            Err(ExactJsonError::Unstorable(_))
        ));
    }

    #[test]
    fn integers_beyond_int64_and_numbers_beyond_float64_are_unstorable() {
        let big = br#"{"n": 123456789012345678901234567890}"#;
        assert!(
            matches!(read_exact(big), Err(ExactJsonError::Unstorable(m)) if m.contains("int64"))
        );
        assert!(matches!(
            read_exact(br#"{"n": 1e400}"#),
            Err(ExactJsonError::Unstorable(_))
        ));
        assert_eq!(
            read_exact(br#"{"n": -9223372036854775808, "f": 2.5e10}"#).unwrap()["f"],
            2.5e10
        );
    }

    #[test]
    fn digits_and_brackets_inside_strings_are_text() {
        let text = br#"{"s": "[[[[ 123456789012345678901234567890 \" ]]", "t": "\\"}"#;
        assert_eq!(read_exact(text).unwrap()["t"], "\\");
    }

    #[test]
    fn what_is_not_json_says_so() {
        assert!(matches!(
            read_exact(b"{oops"),
            Err(ExactJsonError::NotJson(_))
        ));
        assert!(matches!(
            read_exact(b"{} trailing"),
            Err(ExactJsonError::NotJson(_))
        ));
    }
}
