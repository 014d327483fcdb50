//! One kind, one place: outside tests, the kinds' names are written as
//! string literals in at most two files of `relay/`; the kinds' own list
//! (`kinds!` in `relay/kinds/mod.rs`) names each once.

use outbox_relay::kinds::Kind;

use super::*;

const MAX_FILES: usize = 2;

#[test]
fn kind_names_are_written_in_at_most_two_files_of_relay() {
    let names = Kind::names();
    let found = files_naming(&Path::new(ROOT).join("relay"), &names);
    assert!(
        found.len() <= MAX_FILES,
        "kind names are written as literals in {} files of relay/ (at most {MAX_FILES}): \
         read a kind through relay/kinds (Kind::parse, Kind::name) instead:\n{}",
        found.len(),
        found
            .iter()
            .map(|(f, n)| format!("{f}: {}", n.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // the names are written once, in the kinds' list (`kinds!`), a line per
    // kind: its variant, its module (named as the kind) and its section
    let list = std::fs::read_to_string(Path::new(ROOT).join("relay/kinds/mod.rs")).unwrap();
    for name in names {
        assert!(
            list.lines().any(|l| {
                let words: Vec<&str> = l.trim().trim_end_matches(',').split(' ').collect();
                words.len() == 3 && words[1] == name && words[2].ends_with("Section")
            }),
            "the kinds' list in relay/kinds/mod.rs has a line for {name:?}"
        );
    }
}

#[test]
fn the_kind_check_sees_a_literal_outside_tests_only() {
    let dir = scratch_dir("kinds");
    let write = |file: &str, text: &str| write_file(&dir, file, text);
    write(
        "kinds/mod.rs",
        "const K: [&str; 2] = [\"webhook\", \"email\"];\n",
    );
    write(
        "console/pages.rs",
        "fn f(k: &str) -> bool { k == \"webhook\" }\n\
         #[cfg(test)]\nmod tests { const K: &str = \"email\"; }\n",
    );
    write(
        "cli/show.rs",
        "fn g(k: &str) -> String { format!(\"{k} {}\", \"kafka\") }\n#[cfg(test)]\nmod tests;\n",
    );
    write("cli/show/tests.rs", "const K: &str = \"nats\";\n");
    write(
        "engine/claim.rs",
        "const NOTE: &str = \"a webhook or an email\";\n",
    );
    let found = files_naming(&dir, &["webhook", "email", "kafka", "nats"]);
    std::fs::remove_dir_all(&dir).unwrap();
    let found: Vec<String> = found
        .into_iter()
        .map(|(f, n)| format!("{f}: {}", n.join(", ")))
        .collect();
    assert_eq!(
        found,
        [
            "cli/show.rs: kafka",
            "console/pages.rs: webhook",
            "kinds/mod.rs: email, webhook",
        ]
    );
}

/// Each file of `src` that writes one of `names` as a whole string literal
/// outside test-only items and test-only files, with the names it writes.
fn files_naming(src: &Path, names: &[&str]) -> BTreeMap<String, Vec<String>> {
    let files = files_under(src, "rs");
    let mut test_files = BTreeSet::new();
    let mut asts = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        for item in &ast.items {
            if let syn::Item::Mod(m) = item {
                if m.content.is_none() && is_test_only(&m.attrs) {
                    test_files.insert(dir.join(format!("{}.rs", m.ident)));
                    test_files.insert(dir.join(m.ident.to_string()).join("mod.rs"));
                }
            }
        }
        asts.push((file.clone(), ast));
    }
    let mut out = BTreeMap::new();
    for (file, ast) in asts {
        if test_files.contains(&file) {
            continue;
        }
        let mut lits = Literals::default();
        lits.visit_file(&ast);
        let named: Vec<String> = lits
            .strings
            .into_iter()
            .filter(|s| names.contains(&s.as_str()))
            .collect();
        if !named.is_empty() {
            let rel = file.strip_prefix(src).unwrap().display().to_string();
            out.insert(rel, named);
        }
    }
    out
}

/// The string literals outside test-only items, macro arguments included.
#[derive(Default)]
struct Literals {
    strings: BTreeSet<String>,
}

impl Literals {
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        for t in tokens {
            match t {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Literal(l) => {
                    if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                        self.strings.insert(s.value());
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Literals {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test_only = match item {
            syn::Item::Mod(m) => is_test_only(&m.attrs),
            syn::Item::Fn(f) => is_test_only(&f.attrs),
            syn::Item::Impl(i) => is_test_only(&i.attrs),
            syn::Item::Const(c) => is_test_only(&c.attrs),
            _ => false,
        };
        if !test_only {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        self.strings.insert(lit.value());
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
    }
}
