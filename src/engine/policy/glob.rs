//! Tool-name globs of policy rules (docs/design.md section 2 `spec.policy.rules[].tools`).
//!
//! Owns: what `*` and `?` mean. Must not: allocate a regex or backtrack without bound.

/// Whether `name` matches `glob`: `*` matches any run of characters (also none), `?` exactly
/// one character, everything else itself; the whole name must match.
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let pattern: Vec<char> = glob.chars().collect();
    let text: Vec<char> = name.chars().collect();
    // Iterative wildcard matching with one backtrack point (the last `*`): linear space,
    // O(pattern × text) time at worst.
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some('?') => {
                p += 1;
                t += 1;
            }
            Some(c) if *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names_with_star_and_question_mark() {
        assert!(glob_matches("issue_refund", "issue_refund"));
        assert!(!glob_matches("issue_refund", "issue_refunds"));
        assert!(!glob_matches("issue", "issue_refund"));
        assert!(glob_matches("issue_*", "issue_refund"));
        assert!(glob_matches("issue_*", "issue_"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*_refund", "issue_refund"));
        assert!(glob_matches("*s*e*", "issue_refund"));
        assert!(glob_matches("issue_refun?", "issue_refund"));
        assert!(!glob_matches("issue_refun?", "issue_refun"));
        assert!(glob_matches("?ssue*", "éssue"));
        assert!(!glob_matches("[a]*", "a_tool"));
        assert!(glob_matches("[a]*", "[a]tool"));
        assert!(glob_matches("a.b", "a.b"));
        assert!(!glob_matches("a.b", "axb"));
        assert!(!glob_matches("a*b*c", "abca_b"));
    }
}
