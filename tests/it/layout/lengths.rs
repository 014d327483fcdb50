//! No function of `relay/` grows past 100 lines.

use super::*;

/// The longest a function of `relay/` may be, in lines (from its
/// signature to its closing brace; doc comments not counted).
const MAX_FN_LINES: usize = 100;

#[test]
fn no_function_of_relay_is_longer_than_100_lines() {
    let mut long = Vec::new();
    for file in files_under(&Path::new(ROOT).join("relay"), "rs") {
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut fns = FnLengths::default();
        fns.visit_file(&ast);
        for (name, lines) in fns.0 {
            if lines > MAX_FN_LINES {
                long.push(format!("{}: {name} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "split these by what they do: {long:?}");
}

#[test]
fn the_length_check_counts_a_function_from_signature_to_brace() {
    let body = "    let _ = 1;\n".repeat(MAX_FN_LINES - 1);
    let text = format!("/// doc\nfn long() {{\n{body}}}\nfn short() {{}}\n");
    let mut fns = FnLengths::default();
    fns.visit_file(&syn::parse_file(&text).unwrap());
    assert_eq!(
        fns.0,
        [
            ("long".to_string(), MAX_FN_LINES + 1),
            ("short".to_string(), 1)
        ]
    );
}

/// Each function's name and length in lines.
#[derive(Default)]
struct FnLengths(Vec<(String, usize)>);

impl FnLengths {
    fn add(&mut self, sig: &syn::Signature, block: &syn::Block) {
        use syn::spanned::Spanned;
        let from = sig.span().start().line;
        let to = block.span().end().line;
        self.0.push((sig.ident.to_string(), to + 1 - from));
    }
}

impl<'ast> Visit<'ast> for FnLengths {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.add(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.add(&f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
}
