//! The benchmark tooling's own tests (`bench/tests`, Python's unittest): the rules that turn
//! stored measurements into the figures of docs/BENCHMARKS.md, checked on series whose right
//! answer is known. Needs python3 and no root; without python3 the test says why and passes,
//! unless the environment variable `CI` is set.

use std::path::Path;
use std::process::Command;

#[test]
fn the_rules_behind_the_published_figures_hold() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = match Command::new("python3")
        .args(["-B", "-m", "unittest", "discover", "-s", "bench/tests"])
        .current_dir(&repo)
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: the benchmark tooling's tests need python3 ({e})");
            return;
        }
        Err(e) => panic!("the benchmark tooling's tests need python3: {e}"),
    };
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench/tests failed:\n{said}");
    // unittest ends "Ran N tests": none found would pass silently
    assert!(
        said.contains("Ran ") && !said.contains("Ran 0 tests"),
        "{said}"
    );
}
