//! Dependencies run one way (ARCHITECTURE.md, "Which room may name which"): every `crate::ROOM`
//! path in `src/**/*.rs` (`agentrt::ROOM` in `src/main.rs`) names a room its own room may use.
//! The allowed arrows are read from that section of ARCHITECTURE.md, so the map and the check
//! cannot diverge. `#[cfg(test)]` code (an inline `#[cfg(test)] mod x { … }`, a file declared by
//! `#[cfg(test)] mod x;` and everything below it) may also use the section's test-only arrows.
//!
//! What counts: any path in code, `use` or not, including `crate::{a::X, b::Y}` groups; comments
//! and string literals do not. `super::` paths are not followed (they stay inside a room).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The rooms: the top-level modules under `src/`, and the binary's `main`.
const ROOMS: &[&str] = &[
    "api",
    "engine",
    "controller",
    "agents",
    "tools",
    "devcluster",
    "cli",
    "console",
    "bench",
    "telemetry",
    "main",
    "lib",
];

const SECTION: &str = "## Which room may name which";

type Arrows = BTreeMap<String, BTreeSet<String>>;

/// The allowed arrows of ARCHITECTURE.md: `(always, test-only)`. Lines of the form
/// `` - `room` → `a`, `b` (remark) `` (nothing after the arrow: no room), the test-only ones
/// after a line starting `Test-only`.
fn arrows(root: &Path) -> (Arrows, Arrows) {
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = text
        .find(SECTION)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {SECTION:?}"));
    let section = &text[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let (mut always, mut test) = (Arrows::new(), Arrows::new());
    let mut in_test = false;
    for line in section.lines() {
        if line.starts_with("Test-only") {
            in_test = true;
        }
        let Some(rest) = line.strip_prefix("- `") else {
            continue;
        };
        let (from, to) = rest
            .split_once('→')
            .unwrap_or_else(|| panic!("ARCHITECTURE.md: {line:?} has no →"));
        let from = from.trim().trim_matches('`').to_string();
        assert!(
            ROOMS.contains(&from.as_str()),
            "ARCHITECTURE.md: unknown room in {line:?}"
        );
        // A remark in parentheses after the rooms is for the reader.
        let to = to.split('(').next().unwrap_or("");
        let targets: BTreeSet<String> = to
            .split(',')
            .filter_map(|t| t.split('`').nth(1))
            .map(str::to_string)
            .collect();
        for t in &targets {
            assert!(
                ROOMS.contains(&t.as_str()),
                "ARCHITECTURE.md: unknown room {t:?} in {line:?}"
            );
        }
        let map = if in_test { &mut test } else { &mut always };
        map.entry(from).or_default().extend(targets);
    }
    assert!(
        !always.is_empty(),
        "ARCHITECTURE.md: {SECTION:?} lists no arrow"
    );
    (always, test)
}

/// `text` with comments and string/char literals blanked (newlines kept, so offsets and line
/// numbers stay those of the file).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && !ident_before(&chars, i) {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let close: Vec<char> = close.chars().collect();
            let mut k = j + 1;
            while k < chars.len() && !chars[k..].starts_with(&close) {
                k += 1;
            }
            let end = (k + close.len()).min(chars.len());
            for &ch in &chars[i..end] {
                out.push(blank(ch));
            }
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let step = if chars[i] == '\\' { 2 } else { 1 };
                for &ch in &chars[i..(i + step).min(chars.len())] {
                    out.push(blank(ch));
                }
                i += step;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if next == Some('\\') {
                (i + 3..chars.len()).find(|&k| chars[k] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for _ in i..=end {
                        out.push(' ');
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The byte ranges of inline `#[cfg(test)] mod x { … }` blocks, and the names of the modules
/// declared `#[cfg(test)] mod x;`.
fn test_parts(code: &str) -> (Vec<(usize, usize)>, Vec<String>) {
    let (mut ranges, mut files) = (Vec::new(), Vec::new());
    for (at, _) in code.match_indices("#[cfg(test)]") {
        let after = &code[at + "#[cfg(test)]".len()..];
        let mut rest = after.trim_start();
        // Other attributes between it and the item.
        while rest.starts_with("#[") {
            rest = rest[rest.find(']').map_or(rest.len(), |e| e + 1)..].trim_start();
        }
        if let Some(vis) = rest.strip_prefix("pub") {
            rest = vis.trim_start();
            if rest.starts_with('(') {
                rest = rest[rest.find(')').map_or(rest.len(), |e| e + 1)..].trim_start();
            }
        }
        let Some(item) = rest.strip_prefix("mod ") else {
            continue;
        };
        let name: String = item
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let tail = item.trim_start()[name.len()..].trim_start();
        if tail.starts_with(';') {
            files.push(name);
        } else if tail.starts_with('{') {
            let open = code.len() - tail.len();
            let mut depth = 0usize;
            let mut close = code.len();
            for (k, ch) in code[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = open + k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            ranges.push((at, close));
        }
    }
    (ranges, files)
}

/// The rooms a path's first segment after `prefix` names, with the byte offset of each.
fn references(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // crate::{a::X, b::{Y, Z}}: the first segment of each top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        out.push((at + prefix.len() + 1 + k, name));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((at, name));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The directory a file's child modules live in: `x/` for `x.rs`, its own for `mod.rs`,
/// `lib.rs` and `main.rs`.
fn child_dir(file: &Path) -> PathBuf {
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parent = file.parent().expect("a parent");
    match stem {
        "mod" | "lib" | "main" => parent.to_path_buf(),
        _ => parent.join(stem),
    }
}

/// Every `.rs` file under `dir` with its code ([`code_only`]) and text, and the paths that are
/// test code as a whole: files declared `#[cfg(test)] mod x;`, and all below them.
fn sources(dir: &Path) -> (Vec<(PathBuf, String, String)>, Vec<PathBuf>) {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let codes: Vec<(PathBuf, String, String)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("a source file");
            (f.clone(), code_only(&text), text)
        })
        .collect();
    let mut test_roots: Vec<PathBuf> = Vec::new();
    for (file, code, _) in &codes {
        for name in test_parts(code).1 {
            let dir = child_dir(file);
            test_roots.push(dir.join(format!("{name}.rs")));
            test_roots.push(dir.join(&name));
        }
    }
    (codes, test_roots)
}

/// Every import of a room the importing room may not name: `file:line: room -> room`.
fn violations(root: &Path) -> Vec<String> {
    let (always, test_only) = arrows(root);
    let src = root.join("src");
    let (codes, test_roots) = sources(&src);
    let mut found = Vec::new();
    for (file, code, _) in &codes {
        let relative = file.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a component");
        let room = first
            .as_os_str()
            .to_str()
            .expect("UTF-8")
            .trim_end_matches(".rs");
        assert!(
            ROOMS.contains(&room),
            "src/{}: a room ARCHITECTURE.md does not know",
            relative.display()
        );
        let whole_file_test = test_roots.iter().any(|r| file.starts_with(r));
        let test_ranges = test_parts(code).0;
        let prefix = if room == "main" {
            "agentrt::"
        } else {
            "crate::"
        };
        let none = BTreeSet::new();
        for (at, target) in references(code, prefix) {
            if target == room || !ROOMS.contains(&target.as_str()) {
                continue;
            }
            let in_test =
                whole_file_test || test_ranges.iter().any(|(s, e)| (*s..*e).contains(&at));
            let allowed = always.get(room).unwrap_or(&none).contains(&target)
                || (in_test && test_only.get(room).unwrap_or(&none).contains(&target));
            if !allowed {
                let line = code[..at].matches('\n').count() + 1;
                let kind = if in_test { " (test code)" } else { "" };
                found.push(format!(
                    "src/{}:{line}: {room} may not name {target}{kind}",
                    relative.display()
                ));
            }
        }
    }
    found
}

#[test]
fn every_room_names_only_the_rooms_architecture_md_allows() {
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let found = violations(&root);
    assert!(
        found.is_empty(),
        "imports against ARCHITECTURE.md's {SECTION:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_paths_in_code_and_not_in_comments_or_strings() {
    let code = code_only(
        "use crate::{api::X, engine::{a, b}};\n// crate::agents\nlet s = \"crate::tools\";\nlet c = '{'; let q = '\\''; crate::cli::run();\n",
    );
    let names: Vec<String> = references(&code, "crate::")
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(names, ["api", "engine", "cli"]);
    let code = code_only(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() { crate::x(); }\n}\nfn c() {}\n",
    );
    let (ranges, files) = test_parts(&code);
    assert!(files.is_empty());
    let (start, end) = ranges[0];
    assert!(code[start..end].contains("crate::x") && !code[start..end].contains("fn c"));
    assert_eq!(test_parts("#[cfg(test)]\nmod tests;").1, ["tests"]);
}

/// The most lines a source file may have, its inline test modules and test files aside
/// (issue 35: a file a reader can hold; about 600 is the aim, this is the ceiling).
const MAX_FILE_LINES: usize = 700;

/// Every non-test file under `src/` over [`MAX_FILE_LINES`] lines, not counting its inline
/// `#[cfg(test)] mod x { … }` blocks: `file: N lines`.
fn oversized(root: &Path) -> Vec<String> {
    let src = root.join("src");
    let (codes, test_roots) = sources(&src);
    let mut found = Vec::new();
    for (file, code, text) in &codes {
        if test_roots.iter().any(|r| file.starts_with(r)) {
            continue;
        }
        let in_tests: usize = test_parts(code)
            .0
            .iter()
            .map(|(start, end)| code[*start..*end].matches('\n').count() + 1)
            .sum();
        let lines = text.lines().count().saturating_sub(in_tests);
        if lines > MAX_FILE_LINES {
            let relative = file.strip_prefix(&src).expect("under src");
            found.push(format!("src/{}: {lines} lines", relative.display()));
        }
    }
    found
}

#[test]
fn no_source_file_is_longer_than_a_reader_can_hold() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let found = oversized(&root);
    assert!(
        found.is_empty(),
        "source files over {MAX_FILE_LINES} lines (tests aside); split each along a \
         responsibility its name says:\n{}",
        found.join("\n")
    );
}

/// The modules of `src/controller` (its top-level files and folders; `mod.rs`, the wiring, aside)
/// and the others each names in its non-test code: `super::x` from a file right under it,
/// `super::super::x` from one a folder deeper, and so on, or `crate::controller::x`.
fn controller_imports(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let dir = root.join("src/controller");
    let (codes, test_roots) = sources(&dir);
    let modules: BTreeSet<String> = codes
        .iter()
        .filter_map(|(file, _, _)| {
            let first = file.strip_prefix(&dir).ok()?.components().next()?;
            let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
            (name != "mod").then(|| name.to_string())
        })
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, code, _) in &codes {
        let relative = file.strip_prefix(&dir).expect("under src/controller");
        let parts: Vec<&str> = relative
            .components()
            .map(|c| c.as_os_str().to_str().expect("UTF-8"))
            .collect();
        let from = parts[0].trim_end_matches(".rs").to_string();
        if from == "mod" || test_roots.iter().any(|r| file.starts_with(r)) {
            continue;
        }
        // How many `super::` lead from this file's module to `controller`.
        let own_module = if parts.last() == Some(&"mod.rs") {
            parts.len() - 1
        } else {
            parts.len()
        };
        let up = "super::".repeat(own_module);
        let tests = test_parts(code).0;
        for prefix in [up.as_str(), "crate::controller::"] {
            for (at, target) in references(code, prefix) {
                if tests.iter().any(|(s, e)| (*s..*e).contains(&at)) {
                    continue;
                }
                if target != from && modules.contains(&target) {
                    graph.entry(from.clone()).or_default().insert(target);
                }
            }
        }
        graph.entry(from).or_default();
    }
    graph
}

/// A circle in `graph`, as the modules on it (the first repeated at the end), if there is one.
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, done, path) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_controller_s_modules_form_layers_with_no_import_circle() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let graph = controller_imports(&root);
    assert!(
        graph.len() > 10,
        "the check sees the controller's modules: {graph:?}"
    );
    // The bottom layer names no other module of the controller.
    for bottom in ["identity", "fault", "pacing"] {
        assert_eq!(
            graph.get(bottom).map(BTreeSet::len),
            Some(0),
            "{bottom} is a primitive: {graph:?}"
        );
    }
    if let Some(circle) = a_circle(&graph) {
        panic!(
            "an import circle in src/controller: {} (ARCHITECTURE.md, the controller's layers)",
            circle.join(" -> ")
        );
    }
}

#[test]
fn the_circle_check_finds_a_circle_and_no_false_one() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        a_circle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        a_circle(&graph(&[("a", "b"), ("a", "c"), ("b", "c")])),
        None
    );
}
