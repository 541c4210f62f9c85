//! Making server- and model-chosen strings safe to show a person deciding an Approval
//! (docs/behaviours.md 51): every character that could hide, reorder or forge text on a terminal is
//! shown as a visible escape, and long strings are bounded to a head and a tail.

/// Default most characters of one string shown before it is cut to head and tail.
pub const DEFAULT_MAX_CHARS: usize = 400;

/// Whether `c` must never reach the terminal as itself.
///
/// Control characters (C0, DEL, C1), bidirectional controls (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069), zero-width and invisible characters (U+200B–U+200D, U+2060–U+2064,
/// U+FEFF, U+180E, U+00AD), line and paragraph separators (U+2028, U+2029) and tag characters
/// (U+E0000–U+E007F), plus variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF).
pub fn is_unsafe(c: char) -> bool {
    let u = c as u32;
    c.is_control()
        || matches!(u, 0x061C | 0x200E | 0x200F | 0x202A..=0x202E | 0x2066..=0x2069)
        || matches!(u, 0x200B..=0x200D | 0x2060..=0x2064 | 0xFEFF | 0x180E | 0x00AD)
        || matches!(u, 0x2028 | 0x2029)
        || matches!(u, 0xE0000..=0xE007F)
        || matches!(u, 0xFE00..=0xFE0F | 0xE0100..=0xE01EF)
}

/// `text` with every unsafe character (see [`is_unsafe`]) written as `\u{XXXX}`, backslashes
/// doubled, and, when it has more than `max_chars` characters, only its head and tail kept
/// around a marker saying how many characters were left out: `head…[1234 chars omitted]…tail`.
pub fn escape_bounded(text: &str, max_chars: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max_chars {
        return escape_all(chars.iter().copied());
    }
    let keep = max_chars.max(2);
    let head = keep / 2;
    let tail = keep - head;
    let omitted = chars.len() - head - tail;
    format!(
        "{}…[{omitted} chars omitted]…{}",
        escape_all(chars[..head].iter().copied()),
        escape_all(chars[chars.len() - tail..].iter().copied())
    )
}

fn escape_all(chars: impl Iterator<Item = char>) -> String {
    let mut out = String::new();
    for c in chars {
        if c == '\\' {
            out.push_str("\\\\");
        } else if is_unsafe(c) {
            out.push_str(&format!("\\u{{{:04X}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON value rendered for a person: pretty-printed with every string (keys included)
/// escaped and bounded by `max_chars`, nested at most `max_depth` levels (deeper parts shown
/// as `…`), at most `max_items` entries per object or array.
pub fn render_json(value: &serde_json::Value, max_chars: usize) -> String {
    let mut out = String::new();
    render_into(value, 0, max_chars, &mut out);
    out
}

/// A JSON value on one line for a person (an event's data): compact JSON whose strings (keys
/// included) are escaped once, as [`escape_bounded`] does with `"` written `\"` (a stored
/// `{"err": "boom"}` string shows as `"{\"err\": \"boom\"}"`, never with its backslashes
/// doubled again), each bounded by `max_chars`, nested at most 12 levels; the whole line is
/// then cut to `max_line` characters, head and tail kept, like a long string.
pub fn render_json_line(value: &serde_json::Value, max_chars: usize, max_line: usize) -> String {
    let mut out = String::new();
    line_into(value, 0, max_chars, &mut out);
    bound(&out, max_line)
}

fn quoted(text: &str, max_chars: usize, out: &mut String) {
    out.push('"');
    out.push_str(&escape_bounded(text, max_chars).replace('"', "\\\""));
    out.push('"');
}

fn line_into(value: &serde_json::Value, depth: usize, max_chars: usize, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::String(s) => quoted(s, max_chars, out),
        Value::Array(items) if depth >= MAX_DEPTH && !items.is_empty() => out.push_str("[…]"),
        Value::Object(map) if depth >= MAX_DEPTH && !map.is_empty() => out.push_str("{…}"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                line_into(item, depth + 1, max_chars, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                quoted(key, max_chars, out);
                out.push(':');
                line_into(item, depth + 1, max_chars, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `text` (already escaped: nothing in it is unsafe) cut to its head and tail when it has
/// more than `max_chars` characters, as [`escape_bounded`] cuts, without escaping it again.
fn bound(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        return text.to_string();
    }
    let keep = max_chars.max(2);
    let head = keep / 2;
    let tail = keep - head;
    let omitted = count - head - tail;
    let head_text: String = text.chars().take(head).collect();
    let tail_text: String = text.chars().skip(count - tail).collect();
    format!("{head_text}…[{omitted} chars omitted]…{tail_text}")
}

const MAX_DEPTH: usize = 12;
const MAX_ITEMS: usize = 50;

fn render_into(value: &serde_json::Value, depth: usize, max_chars: usize, out: &mut String) {
    use serde_json::Value;
    let indent = |n: usize| "  ".repeat(n);
    match value {
        Value::String(s) => {
            out.push('"');
            out.push_str(&escape_bounded(s, max_chars).replace('"', "\\\""));
            out.push('"');
        }
        Value::Array(items) if !items.is_empty() => {
            if depth >= MAX_DEPTH {
                out.push_str("[…]");
                return;
            }
            out.push_str("[\n");
            for (i, item) in items.iter().take(MAX_ITEMS).enumerate() {
                out.push_str(&indent(depth + 1));
                render_into(item, depth + 1, max_chars, out);
                if i + 1 < items.len().min(MAX_ITEMS) || items.len() > MAX_ITEMS {
                    out.push(',');
                }
                out.push('\n');
            }
            if items.len() > MAX_ITEMS {
                out.push_str(&format!(
                    "{}…[{} more items]\n",
                    indent(depth + 1),
                    items.len() - MAX_ITEMS
                ));
            }
            out.push_str(&indent(depth));
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            if depth >= MAX_DEPTH {
                out.push_str("{…}");
                return;
            }
            out.push_str("{\n");
            let count = map.len();
            for (i, (key, item)) in map.iter().take(MAX_ITEMS).enumerate() {
                out.push_str(&indent(depth + 1));
                out.push('"');
                out.push_str(&escape_bounded(key, max_chars).replace('"', "\\\""));
                out.push_str("\": ");
                render_into(item, depth + 1, max_chars, out);
                if i + 1 < count.min(MAX_ITEMS) || count > MAX_ITEMS {
                    out.push(',');
                }
                out.push('\n');
            }
            if count > MAX_ITEMS {
                out.push_str(&format!(
                    "{}…[{} more keys]\n",
                    indent(depth + 1),
                    count - MAX_ITEMS
                ));
            }
            out.push_str(&indent(depth));
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_as_escapes() {
        assert_eq!(
            escape_bounded("a\x1b[31mred\x07\n", 100),
            "a\\u{001B}[31mred\\u{0007}\\u{000A}"
        );
        assert_eq!(
            escape_bounded("del\u{7f} c1\u{9b}", 100),
            "del\\u{007F} c1\\u{009B}"
        );
    }

    #[test]
    fn bidi_controls_cannot_reorder_the_text() {
        let text = "amount: 100\u{202E}0001\u{202C}";
        assert_eq!(
            escape_bounded(text, 100),
            "amount: 100\\u{202E}0001\\u{202C}"
        );
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            assert!(
                escape_bounded(&c.to_string(), 10).starts_with("\\u{"),
                "{:?}",
                c
            );
        }
    }

    #[test]
    fn zero_width_and_separator_characters_are_made_visible() {
        assert_eq!(escape_bounded("ap\u{200B}prove", 100), "ap\\u{200B}prove");
        assert_eq!(
            escape_bounded("x\u{FEFF}\u{2060}", 100),
            "x\\u{FEFF}\\u{2060}"
        );
        assert_eq!(
            escape_bounded("line\u{2028}para\u{2029}", 100),
            "line\\u{2028}para\\u{2029}"
        );
    }

    #[test]
    fn tag_characters_are_made_visible() {
        let hidden: String = "ok"
            .chars()
            .chain(
                "ignore"
                    .chars()
                    .map(|c| char::from_u32(0xE0000 + c as u32).unwrap()),
            )
            .collect();
        let shown = escape_bounded(&hidden, 100);
        assert!(shown.starts_with("ok\\u{E0069}"), "{shown}");
        assert!(!shown.chars().any(is_unsafe));
    }

    #[test]
    fn backslashes_are_doubled_so_escapes_cannot_be_forged() {
        assert_eq!(escape_bounded("\\u{202E}", 100), "\\\\u{202E}");
    }

    #[test]
    fn long_strings_keep_head_and_tail() {
        let text = format!("{}{}", "a".repeat(600), "b".repeat(600));
        let shown = escape_bounded(&text, 100);
        assert!(shown.starts_with(&"a".repeat(50)));
        assert!(shown.ends_with(&"b".repeat(50)));
        assert!(shown.contains("…[1100 chars omitted]…"), "{shown}");
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        assert_eq!(
            escape_bounded("Refund order 1042: 250 €, naïve café", 100),
            "Refund order 1042: 250 €, naïve café"
        );
    }

    /// Issue 14: a tool error body that is JSON text was shown `{\\"err\\": …}`.
    #[test]
    fn an_event_line_escapes_a_json_text_string_once() {
        let value = serde_json::json!({"error": "{\"err\": \"boom\"}"});
        assert_eq!(
            render_json_line(&value, 100, 160),
            r#"{"error":"{\"err\": \"boom\"}"}"#
        );
        let hostile = serde_json::json!({"k\u{1b}": "a\u{202E}b\\u{202E}\n"});
        let shown = render_json_line(&hostile, 100, 160);
        assert_eq!(shown, r#"{"k\u{001B}":"a\u{202E}b\\u{202E}\u{000A}"}"#);
        let long = serde_json::json!({"big": "z".repeat(1000)});
        let shown = render_json_line(&long, 400, 160);
        assert!(shown.contains("chars omitted"), "{shown}");
        assert!(shown.chars().count() < 200, "{shown}");
        assert!(!shown.chars().any(is_unsafe));
    }

    #[test]
    fn json_strings_and_keys_are_escaped_and_bounded() {
        let value =
            serde_json::json!({"note\u{202E}": "x\u{200B}y", "big": "z".repeat(1000), "n": 250});
        let shown = render_json(&value, 40);
        assert!(shown.contains("\"note\\u{202E}\": "), "{shown}");
        assert!(shown.contains("\"x\\u{200B}y\""), "{shown}");
        assert!(shown.contains("chars omitted"), "{shown}");
        assert!(shown.contains("\"n\": 250"), "{shown}");
        assert!(!shown.chars().any(|c| is_unsafe(c) && c != '\n'));
    }
}
