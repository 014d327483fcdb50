//! The house: `relay/` reads as its architecture. Its modules import one
//! another one way only (no module imports one that imports it back,
//! counting every `crate::`, `super::` and `self::` path outside tests,
//! and following `pub use` to the module that defines a name), each role
//! folder imports only the roles below it, the walls hold (connections
//! and LISTEN in store, HTTP requests in the trace exporter and the CLI's
//! client), no source file of the product or its tests grows past 800
//! lines, and no function of `relay/` past 100.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::common::files_under;

mod fields;
mod kinds;
mod lengths;
mod walls;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The role folders of `relay/`, lowest first: a role may import the roles
/// before it and never one after it (the README's architecture section).
/// The services run beside the engine without knowing it; the engine asks
/// one of them (destination health) before each attempt.
const ROLES: &[&str] = &[
    "state", "units", "kinds", "observe", "config", "store", "services", "engine", "console", "cli",
];

const MAX_LINES: usize = 800;

/// The first segments of the paths the layout counts.
const RELATIVE_ROOTS: &[&str] = &["crate", "super", "self"];

#[test]
fn the_modules_of_relay_import_one_another_one_way() {
    let graph = Graph::of(&Path::new(ROOT).join("relay"));
    let cycles = graph.cycles();
    assert!(
        cycles.is_empty(),
        "modules of relay/ import one another in a circle (each line: a module, \
         the modules it imports from the same circle, and the paths that do):\n{}",
        cycles.join("\n\n")
    );
}

#[test]
fn each_role_of_relay_imports_only_the_roles_below_it() {
    let graph = Graph::of(&Path::new(ROOT).join("relay"));
    let mut wrong = Vec::new();
    let mut unplaced = BTreeSet::new();
    // the crate root declares every module and re-exports a few: it is
    // above them all
    for (from, edges) in graph.edges.iter().filter(|(m, _)| !m.is_empty()) {
        let Some(a) = role(from) else {
            unplaced.insert(from.clone());
            continue;
        };
        for (to, paths) in edges {
            match role(to) {
                _ if to.is_empty() => wrong.push(format!(
                    "{from} imports the crate root: name the module ({})",
                    paths.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                Some(b) if b > a => wrong.push(format!(
                    "{from} ({}) imports {to} ({}): {}",
                    ROLES[a],
                    ROLES[b],
                    paths.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                Some(_) => {}
                None => {
                    unplaced.insert(to.clone());
                }
            }
        }
    }
    for module in graph.files.keys() {
        if role(module).is_none() && !module.is_empty() {
            unplaced.insert(module.clone());
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules of relay/ outside every role folder ({ROLES:?}): {unplaced:?}"
    );
    assert!(
        wrong.is_empty(),
        "a role imports one above it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_source_file_of_the_product_is_longer_than_800_lines() {
    let long = files_longer_than_max(&["relay", "providers", "bench/src"]);
    assert!(long.is_empty(), "split these by meaning: {long:?}");
}

/// The tests are held to the same size as the code: a file of tests is
/// one feature's, split by meaning when it grows.
#[test]
fn no_test_file_is_longer_than_800_lines() {
    let long = files_longer_than_max(&["tests", "bench/tests"]);
    assert!(long.is_empty(), "split these by feature: {long:?}");
}

/// The Rust files under these folders of the repository longer than
/// [`MAX_LINES`], with their lengths.
fn files_longer_than_max(dirs: &[&str]) -> Vec<String> {
    let mut long = Vec::new();
    for dir in dirs {
        for file in files_under(&Path::new(ROOT).join(dir), "rs") {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    long
}

#[test]
fn the_layout_check_sees_a_circle_and_a_role_upside_down() {
    let dir = scratch_dir("layout");
    let write = |file: &str, text: &str| write_file(&dir, file, text);
    write(
        "lib.rs",
        "pub mod engine;\npub mod config;\npub mod store;\n",
    );
    write(
        "engine/mod.rs",
        "pub mod claim;\nuse crate::{config::{Config, retry::Retry}};\nfn g() { self::claim::go(); }\n\
         #[cfg(test)]\nmod tests { use crate::console::X; }\n",
    );
    write(
        "engine/claim.rs",
        "use super::super::config::Config;\npub fn go() {}\n",
    );
    write(
        "config/mod.rs",
        "pub mod retry;\npub mod a;\npub mod b;\npub use retry::Retry;\npub struct Config;\n\
         fn f() { let _ = format!(\"{}\", crate::engine::name()); }\n",
    );
    write(
        "config/retry.rs",
        "pub struct Retry(super::Config);\n#[cfg(test)]\nmod tests;\n",
    );
    write("config/retry/tests.rs", "use crate::console::Page;\n");
    write("config/a.rs", "use super::b::B;\npub struct A;\n");
    write("config/b.rs", "pub struct B(pub super::a::A);\n");
    write("store.rs", "pub fn keep(_: crate::config::Retry) {}\n");
    let graph = Graph::of(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let edges = |m: &str| graph.edges[m].keys().cloned().collect::<Vec<_>>();
    // a path inside a macro counts, and `self::` and `super::` ones (to
    // any depth); a test module's does not
    assert_eq!(
        edges("engine"),
        ["config", "config::retry", "engine::claim"]
    );
    assert_eq!(edges("engine::claim"), ["config"]);
    assert_eq!(edges("config"), ["engine"]);
    assert_eq!(edges("config::retry"), ["config"]);
    // a name a module re-exports leads to the module that defines it
    assert_eq!(edges("store"), ["config::retry"]);
    assert!(!graph.files.contains_key("config::retry::tests"));
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 2, "{cycles:?}");
    assert!(
        cycles.iter().any(|c| c.contains("engine imports config")),
        "{cycles:?}"
    );
    // siblings in a circle through `super::`
    assert!(
        cycles
            .iter()
            .any(|c| c.contains("config::a imports config::b (super::b::B)")),
        "{cycles:?}"
    );
    assert!(role("config::retry") < role("engine"));
}

/// A fresh directory under the system's temporary one for a fixture.
fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "outbox-{name}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ))
}

/// Write `text` to `file` under `dir`, making its folders.
fn write_file(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The role a module belongs to: its first path segment's place in ROLES.
fn role(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or("");
    ROLES.iter().position(|r| *r == top)
}

/// Modules of one crate (file paths as `a::b`, the root as ""), and the
/// modules each imports through `crate::` paths, with the paths.
struct Graph {
    files: BTreeMap<String, PathBuf>,
    edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Graph {
    fn of(src: &Path) -> Graph {
        let mut files = BTreeMap::new();
        for file in files_under(src, "rs") {
            let rel = file.strip_prefix(src).unwrap().with_extension("");
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts == ["main"] {
                continue;
            }
            let module = match parts.as_slice() {
                [only] if only == "lib" => String::new(),
                [dirs @ .., last] if last == "mod" => dirs.join("::"),
                all => all.join("::"),
            };
            files.insert(module, file);
        }
        let mut found = BTreeMap::new();
        let mut exports = BTreeMap::new();
        let mut tests = BTreeSet::new();
        for (module, file) in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let ast = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
            let mut paths = Paths::default();
            paths.visit_file(&ast);
            for name in paths.test_modules {
                tests.insert(match module.as_str() {
                    "" => name,
                    parent => format!("{parent}::{name}"),
                });
            }
            found.insert(module.clone(), paths.found);
            exports.insert(module.clone(), paths.exports);
        }
        // a test module's files, and theirs, are tests
        files.retain(|m, _| {
            !tests
                .iter()
                .any(|t| m == t || m.starts_with(&format!("{t}::")))
        });
        let mut edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for module in files.keys() {
            for path in found.remove(module).unwrap_or_default() {
                let target = target_of(&files, &exports, module, &path);
                // a module's own `super` alone names no module (`pub(super)`)
                if target != *module {
                    edges
                        .entry(module.clone())
                        .or_default()
                        .entry(target)
                        .or_default()
                        .insert(path);
                }
            }
        }
        Graph { files, edges }
    }

    /// Each circle of imports (a strongly connected set of two or more
    /// modules), described.
    fn cycles(&self) -> Vec<String> {
        let nodes: Vec<&String> = self.files.keys().collect();
        let index: BTreeMap<&String, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let next: Vec<Vec<usize>> = nodes
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .map(|e| e.keys().filter_map(|t| index.get(t).copied()).collect())
                    .unwrap_or_default()
            })
            .collect();
        strongly_connected(&next)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|component| {
                let members: BTreeSet<&String> = component.iter().map(|i| nodes[*i]).collect();
                members
                    .iter()
                    .map(|m| {
                        let imports: Vec<String> = self.edges[*m]
                            .iter()
                            .filter(|(t, _)| members.contains(t))
                            .map(|(t, paths)| {
                                let p: Vec<&str> = paths.iter().map(String::as_str).collect();
                                format!("{m} imports {t} ({})", p.join(", "))
                            })
                            .collect();
                        imports.join("\n")
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect()
    }
}

/// The module a path written in `module` leads to: the deepest module it
/// names, or, where that module re-exports the next name with `pub use`,
/// the module the re-export leads to.
fn target_of(
    files: &BTreeMap<String, PathBuf>,
    exports: &BTreeMap<String, BTreeMap<String, String>>,
    module: &str,
    path: &str,
) -> String {
    let mut segments = absolute(module, path);
    let mut from = module.to_string();
    // a re-export of a re-export, and so on (bounded: a cycle of them
    // does not compile)
    for _ in 0..8 {
        let Some(n) = (0..=segments.len())
            .rev()
            .find(|n| files.contains_key(&segments[..*n].join("::")))
        else {
            return String::new();
        };
        let target = segments[..n].join("::");
        let via = segments
            .get(n)
            .and_then(|name| exports.get(&target)?.get(name));
        match via {
            Some(p) if target != from => {
                segments = absolute(&target, p);
                from = target;
            }
            _ => return target,
        }
    }
    segments.join("::")
}

/// A path written in `module` (`crate::a::b`, `super::a`, `self::a`), as
/// the segments after the crate root.
fn absolute(module: &str, path: &str) -> Vec<String> {
    let mut base: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let mut segments = path.split("::").peekable();
    match segments.peek().copied() {
        Some("crate") => {
            base.clear();
            segments.next();
        }
        Some("self") => {
            segments.next();
        }
        _ => {
            while segments.peek() == Some(&"super") {
                base.pop();
                segments.next();
            }
        }
    }
    base.extend(segments.map(str::to_string));
    base
}

/// Tarjan's strongly connected components, iteratively.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = next.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut out) = (vec![false; n], Vec::new(), Vec::new());
    let mut counter = 0;
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some((v, i)) = work.pop() {
            if i == 0 {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = next[v].get(i) {
                work.push((v, i + 1));
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
        }
    }
    out
}

/// Every `crate::…` path a file names outside `#[cfg(test)]` items: in
/// `use` trees, in code, and in macro arguments.
#[derive(Default)]
struct Paths {
    /// `crate::`, `super::` and `self::` paths, as written.
    found: BTreeSet<String>,
    /// What `pub use` items export: name → the path as written.
    exports: BTreeMap<String, String>,
    /// `#[cfg(test)] mod name;`: files that are tests
    test_modules: Vec<String>,
}

/// `#[cfg(test)]` and the like: compiled for tests only.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && quote::ToTokens::to_token_stream(&a.meta)
                .to_string()
                .contains("test")
    })
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.add(prefix, Some(n.ident.to_string())),
            syn::UseTree::Rename(r) => self.add(prefix, Some(r.ident.to_string())),
            syn::UseTree::Glob(_) => self.add(prefix, None),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn add(&mut self, prefix: &[String], last: Option<String>) {
        let mut all: Vec<String> = prefix.to_vec();
        all.extend(last.filter(|l| l != "self"));
        // (`crate` alone is `pub(crate)`, not an import; `super` alone is
        // `pub(super)`)
        if all.len() > 1 && RELATIVE_ROOTS.contains(&all[0].as_str()) {
            self.found.insert(all.join("::"));
        }
    }

    /// A `pub use` item: each name it exports, and the path it names.
    fn re_export(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.re_export(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.exports.insert(n.ident.to_string(), path.join("::"));
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.exports.insert(r.rename.to_string(), path.join("::"));
            }
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.re_export(prefix, t);
                }
            }
        }
    }

    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let flat: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        for (i, t) in flat.iter().enumerate() {
            match t {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id)
                    if RELATIVE_ROOTS.contains(&id.to_string().as_str()) =>
                {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    // `::` is two `:` puncts, then an identifier
                    while let (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                        Some(proc_macro2::TokenTree::Ident(name)),
                    ) = (flat.get(j), flat.get(j + 1), flat.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(name.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.found.insert(path.join("::"));
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        } else if let syn::Item::Mod(m) = item {
            self.test_modules.push(m.ident.to_string());
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
        if !matches!(u.vis, syn::Visibility::Inherited) {
            self.re_export(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.add(&segments, None);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}
