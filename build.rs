// Re-embed the migrations whenever schema/ changes.
fn main() {
    println!("cargo:rerun-if-changed=schema");
}
