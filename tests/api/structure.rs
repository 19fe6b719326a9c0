//! The shape of the source tree (issue 41, "Structure"): no import circle among src/'s modules.
//! A circle (`a` uses `b`, which uses `a`) means neither can be read, tested or moved alone; four
//! of them had grown in (core's ack floor, dispatcher and drain; the idempotency types and the
//! offset store; config reaching up into the HTTP edge; the connection, lingering and TLS
//! streams). Edges are the `use crate::...`/`use super::...` lines and inline `crate::`/`super::`
//! paths of each file, its unit tests left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`core::reader`) -> its file's text, tests cut off.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            let Some(rel) = path.strip_prefix(root).unwrap().to_str().and_then(|r| r.strip_suffix(".rs")) else { continue };
            let mut parts: Vec<&str> = rel.split('/').collect();
            if parts.last() == Some(&"mod") || parts == ["lib"] || parts == ["main"] {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap().to_string();
            out.insert(parts.join("::"), code);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The module a `crate::`/`super::` path written in `module` names: its longest prefix that is a
/// module.
fn resolve(modules: &BTreeMap<String, String>, module: &str, path: &[&str]) -> Option<String> {
    let mut base: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
    let mut rest = path;
    match rest.first() {
        Some(&"crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some(&"super") => {
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let full: Vec<&str> = base.into_iter().chain(rest.iter().copied()).collect();
    (1..=full.len()).rev().map(|n| full[..n].join("::")).find(|candidate| modules.contains_key(candidate))
}

/// Every `crate::a::b` / `super::a` path in `code` (use lines, their `{...}` lists, and inline).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if code[..at].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let tail: String =
            code[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':' || *c == '{' || *c == '}' || *c == ',' || *c == ' ').collect();
        let (head, list) = match tail.split_once("::{") {
            Some((head, list)) => (head, Some(list.split('}').next().unwrap_or(""))),
            None => (tail.as_str(), None),
        };
        let head: Vec<String> = head.split_whitespace().next().unwrap_or("").split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
        found.push(head.clone());
        for item in list.into_iter().flat_map(|l| l.split(',')) {
            let first = item.trim().split("::").next().unwrap_or("").split_whitespace().next().unwrap_or("");
            if first.starts_with(|c: char| c.is_ascii_lowercase()) && first != "self" {
                found.push(head.iter().cloned().chain([first.to_string()]).collect());
            }
        }
    }
    found
}

/// The modules each module uses.
fn edges(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(module, code)| {
            let targets = paths(code)
                .iter()
                .filter_map(|path| resolve(modules, module, &path.iter().map(String::as_str).collect::<Vec<_>>()))
                .filter(|target| target != module)
                .collect();
            (module.clone(), targets)
        })
        .collect()
}

/// The groups of modules that reach each other (Tarjan's strongly connected components), larger
/// than one.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Search<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    group.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut search = Search { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in edges.keys() {
        if !search.index.contains_key(v.as_str()) {
            search.visit(v);
        }
    }
    search.found
}

#[test]
fn no_module_of_src_imports_itself_through_others() {
    let modules = modules();
    let edges = edges(&modules);
    // The check itself: it sees a module's uses (a check that sees nothing finds no circle).
    assert!(edges["core::session"].contains("core::dispatcher"), "{:?}", edges["core::session"]);
    assert!(edges["http::connections"].contains("http::lingering"), "{:?}", edges["http::connections"]);
    let found = circles(&edges);
    assert!(found.is_empty(), "import circles: {found:?}");
}

/// The search finds a circle when there is one.
#[test]
fn a_circle_is_found() {
    let edges: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
        .into_iter()
        .map(|(m, ts)| (m.to_string(), ts.into_iter().map(str::to_string).collect()))
        .collect();
    assert_eq!(circles(&edges), vec![["a", "b", "c"].into_iter().map(str::to_string).collect::<BTreeSet<_>>()]);
}
