//! Names the commit the `ri2n` binary was built from in `ri2n --version` ("ri2n 0.1.0
//! (commit abc1234)", "+dirty" with changes under crates/ not committed), so that a figure
//! measured with a binary names the code that ran, not whatever the checkout beside it holds
//! (`bench/run-all --ri2n OTHER`). Built outside a git checkout, or without git, the line is
//! the version alone.

use std::path::Path;
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_owned())
    };
    let mut version = env!("CARGO_PKG_VERSION").to_owned();
    if let Some(commit) = git(&["rev-parse", "--short=7", "HEAD"]) {
        let dirty = git(&[
            "status",
            "--porcelain",
            "--",
            "crates",
            "Cargo.toml",
            "Cargo.lock",
        ])
        .is_some_and(|s| !s.is_empty());
        version += &format!(" (commit {commit}{})", if dirty { "+dirty" } else { "" });
        // again when HEAD moves (a checkout, or a commit on its branch), or the sources change
        for what in ["HEAD", "index"] {
            if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", what]) {
                println!("cargo:rerun-if-changed={path}");
            }
        }
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &branch])
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
        println!("cargo:rerun-if-changed={}", root.join("crates").display());
        println!(
            "cargo:rerun-if-changed={}",
            root.join("Cargo.toml").display()
        );
        println!(
            "cargo:rerun-if-changed={}",
            root.join("Cargo.lock").display()
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=RI2N_VERSION={version}");
}
