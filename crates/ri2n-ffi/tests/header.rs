//! The committed header, `include/ri2n/ri2n.h`, is what cbindgen generates from the source
//! with `cbindgen.toml` (the same generation `cargo cinstall` runs): a C program built
//! against the checkout sees the functions the library exports. After changing the interface,
//! regenerate it with `RI2N_BLESS=1 cargo test -p ri2n-ffi --test header`.

use std::path::Path;

#[test]
fn the_committed_header_is_the_generated_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/ri2n/ri2n.h");
    if std::env::var_os("RI2N_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing the header");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is not what cbindgen generates from the source: regenerate it with \
         RI2N_BLESS=1 cargo test -p ri2n-ffi --test header",
        path.display()
    );
}
