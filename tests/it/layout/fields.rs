//! No bags of fields: outside `relay/config`, no struct exposes more than
//! six public fields of which two or more are services or configuration
//! sections. Such a struct is built in one place and handed around for
//! its parts; a constructor and private fields say what it needs instead.
//!
//! A field is public when it is `pub` or `pub(crate)`. A service is the
//! `Store` or anything shared behind an `Arc`; a configuration section is a
//! type named `…Section`, `…Settings` or `…Config`.

use super::*;

const MAX_PUBLIC: usize = 6;
const MAX_PARTS: usize = 1;

#[test]
fn no_struct_of_relay_is_a_bag_of_services_and_sections() {
    let bags = bags(&Path::new(ROOT).join("relay"));
    assert!(
        bags.is_empty(),
        "structs exposing more than {MAX_PUBLIC} public fields, {} or more of them services \
         or configuration sections (give them a constructor and private fields):\n{}",
        MAX_PARTS + 1,
        bags.join("\n")
    );
}

#[test]
fn the_bag_check_sees_a_bag_and_nothing_else() {
    let dir = scratch_dir("fields");
    let write = |file: &str, text: &str| write_file(&dir, file, text);
    let fields = |vis: &str| {
        format!(
            "{vis} store: Store, {vis} retry: RetrySection, {vis} a: u32, {vis} b: String, \
             {vis} c: Duration, {vis} d: bool, {vis} e: Option<String>"
        )
    };
    write(
        "engine/mod.rs",
        &format!("pub struct Bag {{ {} }}\n", fields("pub")),
    );
    write(
        "console/mod.rs",
        &format!(
            "pub struct App {{ {} }}\npub struct Private {{ {} }}\n",
            fields("pub(crate)").replace("store: Store", "jobs: Arc<Jobs>"),
            fields("pub(super)")
        ),
    );
    write(
        "store/operator.rs",
        "pub struct Row { pub id: i64, pub key: String, pub kind: String, pub a: u8, \
         pub b: u8, pub c: u8, pub d: Option<String>, pub settings: HealthSettings }\n",
    );
    write(
        "config/mod.rs",
        &format!("pub struct Config {{ {} }}\n", fields("pub")),
    );
    let found = bags(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        [
            "console/mod.rs: App (7 public: jobs, retry)",
            "engine/mod.rs: Bag (7 public: retry, store)",
        ]
    );
}

/// Each struct outside `config/` with more than [`MAX_PUBLIC`] public
/// fields, more than [`MAX_PARTS`] of them services or sections.
fn bags(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for file in files_under(src, "rs") {
        let rel = file.strip_prefix(src).unwrap();
        if rel.starts_with("config") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut structs = Structs::default();
        structs.visit_file(&ast);
        for (name, public, mut parts) in structs.found {
            parts.sort();
            if public > MAX_PUBLIC && parts.len() > MAX_PARTS {
                out.push(format!(
                    "{}: {name} ({public} public: {})",
                    rel.display(),
                    parts.join(", ")
                ));
            }
        }
    }
    out.sort();
    out
}

/// `pub` or `pub(crate)`.
fn exposed(vis: &syn::Visibility) -> bool {
    match vis {
        syn::Visibility::Public(_) => true,
        syn::Visibility::Restricted(r) => r.path.is_ident("crate"),
        syn::Visibility::Inherited => false,
    }
}

/// A service (the `Store`, anything behind an `Arc`) or a configuration
/// section (`…Section`, `…Settings`, `…Config`), also inside an `Option`.
fn is_part(ty: &syn::Type) -> bool {
    let syn::Type::Path(p) = ty else {
        return false;
    };
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    let name = last.ident.to_string();
    if name == "Option" {
        if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
            return args.args.iter().any(|a| match a {
                syn::GenericArgument::Type(t) => is_part(t),
                _ => false,
            });
        }
    }
    name == "Store"
        || name == "Arc"
        || ["Section", "Settings", "Config"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// The structs of a file outside test-only items: each one's name, how
/// many fields it exposes, and which of those are services or sections.
#[derive(Default)]
struct Structs {
    found: Vec<(String, usize, Vec<String>)>,
}

impl<'ast> Visit<'ast> for Structs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            syn::Item::Mod(m) if is_test_only(&m.attrs) => {}
            syn::Item::Struct(s) if !is_test_only(&s.attrs) => {
                let syn::Fields::Named(named) = &s.fields else {
                    return;
                };
                let public: Vec<&syn::Field> =
                    named.named.iter().filter(|f| exposed(&f.vis)).collect();
                let parts = public
                    .iter()
                    .filter(|f| is_part(&f.ty))
                    .filter_map(|f| f.ident.as_ref().map(|i| i.to_string()))
                    .collect();
                self.found.push((s.ident.to_string(), public.len(), parts));
            }
            _ => syn::visit::visit_item(self, item),
        }
    }
}
