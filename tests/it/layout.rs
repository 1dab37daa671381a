//! The shape of the root package: its module graph has no cycles, the vocabulary
//! (`engine::instance`) is a leaf, and no source file grows past 1,200 lines.
//!
//! The graph is read from the sources: an edge `a -> b` for every `crate::b` path (in `use`
//! lines, groups `crate::{b, c}` and inline paths) in a file of top-level module `a`, comments
//! stripped. The library's modules only (`main.rs` and `cli/` are the binary, which sees the
//! library as `engine::`). Within a module folder, a parent and its children may use each
//! other (`perturb/mod.rs` declares the families, which take its vocabulary through
//! `super::`); the graph is of top-level modules, where the factory's layers are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text without `//` comments (doc links such as [`crate::x`] are not dependencies).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal (a URL) is rare in this code base and only ever
            // hides a reference, never invents one.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level modules named after `crate::` in `text`.
fn references(text: &str) -> BTreeSet<String> {
    let text = strip_comments(text);
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        // `$crate::` in macros and `sandbox_crate::` style names are not this crate.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            for item in split_top_level(&group[..end]) {
                if let Some(name) = ident(item.trim()) {
                    out.insert(name);
                }
            }
        } else if let Some(name) = ident(rest) {
            out.insert(name);
        }
    }
    out
}

fn ident(s: &str) -> Option<String> {
    let n: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!n.is_empty() && n != "self").then_some(n)
}

fn matching_brace(s: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

fn split_top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The module graph of the library under `root` (the `engine/` directory).
fn library_graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    sources(root, &mut files);
    let mut g = Graph::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if ["lib", "main", "bin_init", "cli"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let refs = references(&text);
        let deps = g.entry(module.clone()).or_default();
        deps.extend(refs.into_iter().filter(|r| *r != module));
    }
    g
}

/// A cycle of `g` (its modules in order, the first repeated at the end), if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        n: &str,
        g: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(n) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut cycle = stack[at..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(n.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn engine_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engine")
}

#[test]
fn the_cycle_finder_finds_cycles_and_reads_every_reference_form() {
    let refs = references(
        "use crate::a::X;\nuse crate::{b::{Y, Z}, c, self};\nfn f() { crate::d::g(); }\n\
         // crate::e in a comment\n/// [`crate::f`]\nmacro_rules! m { () => { $crate::h!() } }",
    );
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "d"].map(String::from)
    );
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    let cycle = find_cycle(&g).expect("a -> b -> c -> a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
}

#[test]
fn the_library_module_graph_has_no_cycles() {
    let g = library_graph(&engine_dir());
    assert!(g.len() >= 10, "read too few modules: {g:?}");
    if let Some(c) = find_cycle(&g) {
        panic!("module cycle: {}\ngraph: {g:#?}", c.join(" -> "));
    }
}

#[test]
fn the_vocabulary_is_a_leaf_and_the_chain_points_one_way() {
    let g = library_graph(&engine_dir());
    let deps = |m: &str| g.get(m).cloned().unwrap_or_default();
    assert!(
        deps("instance").is_empty(),
        "engine::instance must depend on nothing else of the engine: {:?}",
        deps("instance")
    );
    // The factory chain: instance <- perturb, tasks <- synth <- running.
    for (lower, upper) in [
        ("perturb", "synth"),
        ("tasks", "synth"),
        ("perturb", "tasks"),
        ("tasks", "perturb"),
        ("synth", "running"),
        ("netfault", "perturb"),
    ] {
        assert!(
            !deps(lower).contains(upper),
            "{lower} must not depend on {upper}: {:?}",
            deps(lower)
        );
    }
}

#[test]
fn no_source_file_of_the_root_package_is_over_1200_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["engine", "tests", "benches"] {
        sources(&root.join(d), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 1200).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 1,200 lines: {long:?}");
}
