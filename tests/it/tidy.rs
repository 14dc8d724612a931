//! Structure checks over the sources of `core/src` and `io/src`, in the manner of
//! rust-analyzer's tidy tests: they read the code as text and fail with the file to fix.
//!
//! - The top-level modules of each crate form no import cycle: a layer knows the layers below
//!   it and nothing above (`docs/ARCHITECTURE.md` lists the order).
//! - No function is longer than [`MAX_FN_LINES`] lines, except the parsers' state machines
//!   listed in [`LONG_FN_ALLOWED`], each with its reason.
//!
//! Comments, string and character literals are blanked before anything is read, so a path in
//! a doc comment or a brace in a string counts for nothing; a file's `#[cfg(test)] mod tests`
//! (at its end, by the project's convention) is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function, in lines from its `fn` to its closing brace.
const MAX_FN_LINES: usize = 200;

/// Functions allowed over the limit: (file under the repository, function, why).
const LONG_FN_ALLOWED: &[(&str, &str, &str)] = &[];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The source with comments, strings and character literals replaced by spaces (line breaks
/// kept, so line numbers stay right) and the trailing test module cut off.
fn code_of(src: &str) -> String {
    let body = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => src,
    };
    let b = body.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if let Some(len) = raw_string_len(&b[i..]) {
            for &x in &b[i..i + len] {
                blank(&mut out, x);
            }
            i += len;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let len = if next == Some(b'\\') {
                b.get(i + 3..)
                    .and_then(|r| r.iter().position(|&x| x == b'\''))
                    .map(|p| p + 4)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(3)
            } else {
                // Multi-byte UTF-8 character.
                std::str::from_utf8(&b[i + 1..(i + 6).min(b.len())])
                    .ok()
                    .or_else(|| {
                        (2..6)
                            .rev()
                            .find_map(|n| std::str::from_utf8(b.get(i + 1..i + n)?).ok())
                    })
                    .and_then(|s| s.chars().next())
                    .filter(|ch| ch.len_utf8() > 1)
                    .filter(|ch| b.get(i + 1 + ch.len_utf8()) == Some(&b'\''))
                    .map(|ch| ch.len_utf8() + 2)
            };
            match len {
                Some(n) => {
                    out.extend(std::iter::repeat_n(b' ', n));
                    i += n;
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
    String::from_utf8(out).expect("blanking keeps UTF-8")
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`) starting at `b`.
fn raw_string_len(b: &[u8]) -> Option<usize> {
    let start = match b {
        [b'r', b'"' | b'#', ..] => 1,
        [b'b', b'r', b'"' | b'#', ..] => 2,
        _ => return None,
    };
    let hashes = b[start..].iter().take_while(|&&x| x == b'#').count();
    if b.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let body = start + hashes + 1;
    let closing: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let end = b[body..]
        .windows(closing.len())
        .position(|w| w == closing.as_slice())?;
    Some(body + end + closing.len())
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Identifiers that follow `crate::` in `code`, and the names in `use crate::{…}` groups.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let b = code.as_bytes();
    let mut at = 0;
    while let Some(p) = code[at..].find("crate::") {
        let i = at + p;
        at = i + 7;
        if i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'$') {
            continue;
        }
        let rest = &code[at..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .bytes()
                    .take_while(|&c| is_ident(c))
                    .map(char::from)
                    .collect();
                if !name.is_empty() {
                    names.insert(name);
                }
            }
        } else {
            let name: String = rest
                .bytes()
                .take_while(|&c| is_ident(c))
                .map(char::from)
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The top-level modules of a crate's `src` (a file `x.rs` or a folder `x/`) and, for each,
/// the other top-level modules it refers to with the files that do.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn module_graph(src: &Path) -> Graph {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src readable") {
        let p = entry.expect("entry").path();
        let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if matches!(stem, "lib" | "main") {
            continue;
        }
        let files = modules.entry(stem.to_string()).or_default();
        if p.is_dir() {
            rust_files(&p, files);
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    let mut graph = Graph::new();
    for (name, files) in &modules {
        let edges = graph.entry(name.clone()).or_default();
        for f in files {
            let code = code_of(&std::fs::read_to_string(f).expect("source readable"));
            for target in crate_references(&code) {
                if &target != name && modules.contains_key(&target) {
                    let shown = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
                    edges.entry(target).or_default().insert(shown);
                }
            }
        }
    }
    graph
}

/// A cycle through `graph`, as the list of modules on it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

fn assert_acyclic(krate: &str) {
    let graph = module_graph(&repo().join(krate).join("src"));
    assert!(graph.len() > 5, "{krate}/src: too few modules found");
    if let Some(cycle) = find_cycle(&graph) {
        let mut why = format!(
            "import cycle between top-level modules of {krate}/src: {}\n",
            cycle.join(" -> ")
        );
        for pair in cycle.windows(2) {
            let files = &graph[&pair[0]][&pair[1]];
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            why.push_str(&format!(
                "  {} -> {} in {}\n",
                pair[0],
                pair[1],
                files.join(", ")
            ));
        }
        panic!("{why}");
    }
}

#[test]
fn core_modules_form_no_import_cycle() {
    assert_acyclic("core");
}

#[test]
fn io_modules_form_no_import_cycle() {
    assert_acyclic("io");
}

/// Every function of `code`: (name, first line, number of lines).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let line_of = |i: usize| code[..i].bytes().filter(|&c| c == b'\n').count() + 1;
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(p) = code[at..].find("fn ") {
        let i = at + p;
        at = i + 3;
        if i > 0 && is_ident(b[i - 1]) {
            continue;
        }
        let name: String = code[at..]
            .bytes()
            .take_while(|&c| is_ident(c))
            .map(char::from)
            .collect();
        if name.is_empty() {
            continue; // `fn(` types
        }
        // The body starts at the first `{` before any `;` (a declaration without a body).
        let Some(open) = code[at..].find(['{', ';']).map(|o| at + o) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, &c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { break };
        let first = line_of(i);
        out.push((name, first, line_of(close) - first + 1));
    }
    out
}

/// Every error status the shell answers comes from a kind of the registry in
/// `core/src/error.rs` (`ErrorCode`, `ReceiptErrorKind`, `AdminErrorKind`): no literal 4xx or
/// 5xx status is written into a response outside the HTTP server itself (`io/src/http/`, whose
/// own answers for malformed input are the codec's statuses).
#[test]
fn error_statuses_come_from_the_registry() {
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("io").join("src"), &mut files);
    rust_files(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for f in &files {
        let shown = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        if shown.starts_with("io/src/http/") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).expect("source readable"));
        let flat: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        for call in [
            "Response::json(",
            "Response::text(",
            "Response::new(",
            "diagnostic(",
        ] {
            let mut rest = flat.as_str();
            while let Some(i) = rest.find(call) {
                rest = &rest[i + call.len()..];
                let arg = rest.trim_start();
                if arg.len() >= 3
                    && (arg.starts_with('4') || arg.starts_with('5'))
                    && arg[..3].bytes().all(|b| b.is_ascii_digit())
                {
                    found.push(format!("{shown}: {call}{}", &arg[..3]));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "literal error statuses (use the registry kind's http_status):\n{}",
        found.join("\n")
    );
}

/// One `MAX_*` or `MIN_*` constant: where, its value's expression, and its doc comment.
struct Limit {
    file: String,
    name: String,
    value: String,
    doc: String,
}

/// Every `MAX_*` and `MIN_*` constant outside test modules of `core/src` and `io/src`, in file
/// and line order.
fn limits() -> Vec<Limit> {
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("core").join("src"), &mut files);
    rust_files(&root.join("io").join("src"), &mut files);
    let mut out = Vec::new();
    for f in &files {
        let shown = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        let src = std::fs::read_to_string(f).expect("source readable");
        let src = match src.find("#[cfg(test)]\nmod tests") {
            Some(i) => &src[..i],
            None => &src[..],
        };
        let lines: Vec<&str> = src.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let decl = ["pub const ", "pub(crate) const ", "const "]
                .iter()
                .find_map(|p| t.strip_prefix(p));
            let Some(decl) = decl else { continue };
            if !(decl.starts_with("MAX_") || decl.starts_with("MIN_")) {
                continue;
            }
            let name = decl.split(':').next().unwrap_or("").trim().to_string();
            // The value: from `=` to the `;`, which may be lines later.
            let mut text = decl.to_string();
            let mut j = i;
            while !text.contains(';') && j + 1 < lines.len() {
                j += 1;
                text.push(' ');
                text.push_str(lines[j].trim());
            }
            let value = text
                .split_once('=')
                .map_or("", |(_, v)| v)
                .trim()
                .trim_end_matches(';')
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            // The doc comment just above, attributes skipped.
            let mut doc = Vec::new();
            let mut k = i;
            while k > 0 {
                k -= 1;
                let above = lines[k].trim();
                if let Some(d) = above.strip_prefix("///") {
                    doc.push(d.trim());
                } else if !above.starts_with("#[") {
                    break;
                }
            }
            doc.reverse();
            out.push(Limit {
                file: shown.clone(),
                name,
                value,
                doc: doc.join(" "),
            });
        }
    }
    out
}

/// `docs/limits.md`: every limit, grouped by file, the contract's first.
fn render_limits(limits: &[Limit]) -> String {
    let mut s = String::from(
        "# Limits\n\nRendered from the sources by `tests/it/tidy.rs` \
         (`limits_are_named_documented_and_listed`); do not edit by hand: run \
         `SORTIE_BLESS=1 cargo test --test it tidy::`.\n\n\
         Every bound on what a client, worker, upstream or operator can make the gateway hold or \
         do is a named constant. The contract's limits are in `core/src/limits.rs`; every other \
         one is declared beside the code that enforces it, with a doc comment saying what it \
         bounds; the ranges a configuration key accepts are here too.\n",
    );
    let mut files: Vec<&str> = limits.iter().map(|l| l.file.as_str()).collect();
    files.dedup();
    files.sort_by_key(|f| (*f != "core/src/limits.rs", f.to_string()));
    files.dedup();
    for f in files {
        s.push_str(&format!(
            "\n## `{f}`\n\n| constant | value | what it bounds |\n|---|---|---|\n"
        ));
        for l in limits.iter().filter(|l| l.file == f) {
            s.push_str(&format!(
                "| `{}` | `{}` | {} |\n",
                l.name,
                l.value.replace('|', "\\|"),
                l.doc.replace('|', "\\|")
            ));
        }
    }
    s
}

/// The rule for limits (see `docs/limits.md`): every `MAX_*`/`MIN_*` constant has a doc comment
/// that says what it bounds, and the rendered list is current.
#[test]
fn limits_are_named_documented_and_listed() {
    let all = limits();
    assert!(all.len() > 50, "only {} limits found", all.len());
    let undocumented: Vec<String> = all
        .iter()
        .filter(|l| l.doc.is_empty())
        .map(|l| format!("{}: {}", l.file, l.name))
        .collect();
    assert!(
        undocumented.is_empty(),
        "limits without a doc comment:\n{}",
        undocumented.join("\n")
    );
    let rendered = render_limits(&all);
    let path = repo().join("docs").join("limits.md");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != rendered {
        if std::env::var_os("SORTIE_BLESS").is_some() {
            std::fs::write(&path, &rendered).expect("write docs/limits.md");
        } else {
            panic!("docs/limits.md is stale: run `SORTIE_BLESS=1 cargo test --test it tidy::`");
        }
    }
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let root = repo();
    let mut files = Vec::new();
    for krate in ["core", "io", "src"] {
        let dir = if krate == "src" {
            root.join("src")
        } else {
            root.join(krate).join("src")
        };
        rust_files(&dir, &mut files);
    }
    let mut long = Vec::new();
    for f in &files {
        let shown = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        let code = code_of(&std::fs::read_to_string(f).expect("source readable"));
        for (name, line, len) in functions(&code) {
            let allowed = LONG_FN_ALLOWED
                .iter()
                .any(|(file, func, _)| *file == shown && *func == name);
            if len > MAX_FN_LINES && !allowed {
                long.push(format!("{shown}:{line}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them, or list a parser's state machine in \
         LONG_FN_ALLOWED with its reason):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_scanner_blanks_comments_and_literals_and_finds_functions() {
    let src = "use crate::a::X; // crate::b\nfn f() { let s = \"crate::c {\"; let c = '{'; let q = '\\''; }\n\
               /* crate::d */ fn g<'a>(x: &'a str) -> &'a str { r#\"crate::e }\"# ; x }\n\
               use crate::{f, g::h};\n";
    let code = code_of(src);
    let refs: Vec<String> = crate_references(&code).into_iter().collect();
    assert_eq!(refs, ["a", "f", "g"]);
    let fns = functions(&code);
    assert_eq!(fns, vec![("f".to_string(), 2, 1), ("g".to_string(), 3, 1)]);
    let mut graph = Graph::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x")] {
        graph
            .entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default();
    }
    assert_eq!(find_cycle(&graph).expect("a cycle"), ["x", "y", "z", "x"]);
    graph.get_mut("z").expect("z").clear();
    assert!(find_cycle(&graph).is_none());
}

/// A `major.minor.patch` version as numbers, for comparing.
fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The workspace's `rust-version` is no older than any locked dependency's, so the toolchain
/// the README names can build what `Cargo.lock` holds (a dependency update that raises its own
/// minimum fails here, naming it, instead of on a user's older toolchain). Not `--offline`: the
/// metadata covers every platform's dependencies, which a build on this one never downloads.
#[test]
fn rust_version_covers_every_locked_dependency() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--features", "fingerprints"])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let ours = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "sortie")
        .and_then(|p| p["rust_version"].as_str())
        .expect("the workspace sets rust-version")
        .to_string();
    let newer: Vec<String> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, p["rust_version"].as_str()?)))
        .filter(|(_, v)| version(v) > version(&ours))
        .map(|(n, v)| format!("{n} needs {v}"))
        .collect();
    assert!(
        newer.is_empty(),
        "rust-version is {ours}, but {newer:?}: raise it in Cargo.toml and README.md"
    );
}
