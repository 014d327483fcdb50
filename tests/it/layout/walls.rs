//! The walls of `relay/`: connections and LISTEN live in the store, and
//! HTTP requests are made by the trace exporter and the CLI's client.

use super::*;

/// Where each wall lets a name through: database connections, pools and
/// LISTEN only in the store; HTTP requests only through the trace
/// exporter (in observe) and the CLI's real client (providers are a crate
/// of their own). Each entry: what is named, and the folders of `relay/`
/// that may name it.
const WALLS: &[(&str, &[&str])] = &[
    ("PgListener", &["store"]),
    ("PgPool", &["store"]),
    ("PgPoolOptions", &["store"]),
    ("PgConnection", &["store"]),
    ("PgConnectOptions", &["store"]),
    (".pool()", &["store"]),
    ("reqwest", &["observe", "cli"]),
    ("hyper", &["observe", "cli"]),
    ("TcpStream", &[]),
];

#[test]
fn the_walls_of_relay_hold() {
    let breaches = breaches(&Path::new(ROOT).join("relay"));
    assert!(
        breaches.is_empty(),
        "a name past its wall (connections and LISTEN live in store; HTTP is made by the \
         trace exporter and the CLI's client):\n{}",
        breaches.join("\n")
    );
}

#[test]
fn the_wall_check_sees_each_kind_of_breach() {
    let dir = scratch_dir("walls");
    let write = |file: &str, text: &str| write_file(&dir, file, text);
    write(
        "store/mod.rs",
        "pub struct Store { pool: sqlx::PgPool }\nimpl Store { pub fn pool(&self) -> &sqlx::PgPool { &self.pool } }\n",
    );
    write(
        "engine/claim.rs",
        "async fn f(s: &Store) { let l = sqlx::postgres::PgListener::connect_with(s.pool()).await; }\n\
         #[cfg(test)]\nmod tests { fn t(p: sqlx::PgPool) {} }\n",
    );
    write(
        "cli/mod.rs",
        "async fn h() { let _ = reqwest::get(\"http://x\").await; let _ = tokio::net::TcpStream::connect(\"x\").await; }\n",
    );
    write("console/api.rs", "use hyper::client::conn;\n");
    write("observe/trace.rs", "pub struct Client(reqwest::Client);\n");
    let found = breaches(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        [
            "cli/mod.rs names TcpStream",
            "console/api.rs names hyper",
            "engine/claim.rs names .pool()",
            "engine/claim.rs names PgListener",
        ],
        "{found:?}"
    );
}

/// Each file of `src` (outside test-only items) naming something past its
/// wall ([`WALLS`]): "file names thing".
fn breaches(src: &Path) -> Vec<String> {
    let mut out = BTreeSet::new();
    for file in files_under(src, "rs") {
        let rel = file.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut names = Names::default();
        names.visit_file(&ast);
        for (name, allowed) in WALLS {
            if allowed.contains(&top.as_str()) {
                continue;
            }
            let named = match name.strip_prefix('.') {
                Some(call) => names.calls.contains(call.trim_end_matches("()")),
                None => names.idents.contains(*name),
            };
            if named {
                out.insert(format!("{} names {name}", rel.display()));
            }
        }
    }
    out.into_iter().collect()
}

/// The identifiers of every path, and the methods called with no argument,
/// outside test-only items (macro arguments included, as tokens).
#[derive(Default)]
struct Names {
    idents: BTreeSet<String>,
    calls: BTreeSet<String>,
}

impl Names {
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        for t in tokens {
            match t {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id) => {
                    self.idents.insert(id.to_string());
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test_only = match item {
            syn::Item::Mod(m) => is_test_only(&m.attrs),
            syn::Item::Fn(f) => is_test_only(&f.attrs),
            syn::Item::Impl(i) => is_test_only(&i.attrs),
            syn::Item::Use(u) => is_test_only(&u.attrs),
            _ => false,
        };
        if !test_only {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_use_tree(&mut self, tree: &'ast syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                self.idents.insert(p.ident.to_string());
            }
            syn::UseTree::Name(n) => {
                self.idents.insert(n.ident.to_string());
            }
            syn::UseTree::Rename(r) => {
                self.idents.insert(r.ident.to_string());
            }
            _ => {}
        }
        syn::visit::visit_use_tree(self, tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        for s in &path.segments {
            self.idents.insert(s.ident.to_string());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if call.args.is_empty() {
            self.calls.insert(call.method.to_string());
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}
