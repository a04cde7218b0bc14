//! Runs the Python test suite (`tests/test_*.py`) against a fresh build of the package, so
//! that `cargo test --release --workspace --all-features` tests the binding too.
//!
//! It lives here, in the binding's own crate, although the crate's library is only a
//! `cdylib`: an integration test needs nothing from the library (it drives `pip` and
//! `pytest` as programs), so cargo builds and runs it all the same, next to the code and
//! the Python tests it exercises.
//!
//! Steps: a new virtual environment in `CARGO_TARGET_TMPDIR` (`--system-site-packages`, so
//! that an installed maturin and pytest are used; either is pip-installed only when it
//! cannot be imported), `pip install --no-build-isolation` of this crate with its own
//! `CARGO_TARGET_DIR` under `target/` (the outer `cargo test` holds the lock of the usual
//! one until it ends; a directory of its own never waits for it, and keeps its build
//! between runs), then `python -m pytest`. Without python3 (>= 3.9) or its `venv` module
//! the test says why and passes, unless the environment variable `CI` is set: then it
//! fails, as the lab tests do.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most the Python suite may take (it takes seconds; a hang must not stall `cargo test`).
const PYTEST_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Says why the test cannot run: a failure under CI, a note (and a pass) elsewhere.
fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("the Python binding's tests cannot run: {why}");
    }
    eprintln!("skipped: the Python binding's tests need {why}");
}

/// Runs `cmd` to its end with its output in `log`; whether it succeeded, and the output.
fn run_logged(cmd: &mut Command, log: &Path, limit: Duration) -> (bool, String) {
    let out = File::create(log).expect("create the log file");
    let err = out.try_clone().expect("clone the log file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let ok = loop {
        match child.try_wait().expect("wait for the child") {
            Some(status) => break status.success(),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let mut output = std::fs::read_to_string(log).unwrap_or_default();
    if Instant::now() >= deadline {
        output.push_str(&format!("\n(killed after {limit:?})\n"));
    }
    (ok, output)
}

fn imports(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn python_suite() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));

    let version = Command::new("python3")
        .args(["-c", "import sys; print(sys.version_info >= (3, 9))"])
        .output();
    match version {
        Err(e) => return skip(&format!("python3 (cannot run it: {e})")),
        Ok(v) if String::from_utf8_lossy(&v.stdout).trim() != "True" => {
            return skip("python3 >= 3.9 (python3 is older, or broken)")
        }
        Ok(_) => {}
    }

    let venv = tmp.join("ri2n-python-venv");
    if venv.exists() {
        std::fs::remove_dir_all(&venv).expect("remove the previous virtual environment");
    }
    let (ok, output) = run_logged(
        Command::new("python3")
            .args(["-m", "venv", "--system-site-packages"])
            .arg(&venv),
        &tmp.join("ri2n-python-venv.log"),
        Duration::from_secs(300),
    );
    if !ok {
        return skip(&format!(
            "python3's venv module (python3 -m venv failed):\n{output}"
        ));
    }
    let python: PathBuf = venv.join("bin").join("python");

    for module in ["maturin", "pytest"] {
        if !imports(&python, module) {
            let (ok, output) = run_logged(
                Command::new(&python).args(["-m", "pip", "install", "--quiet", module]),
                &tmp.join(format!("ri2n-python-pip-{module}.log")),
                Duration::from_secs(600),
            );
            assert!(ok, "pip install {module} failed:\n{output}");
        }
    }

    // `target/ri2n-python-pytest`: next to the workspace's own build directories
    let build_dir = tmp.parent().unwrap_or(tmp).join("ri2n-python-pytest");
    // the environment's programs first, as activating it would: maturin's build hook runs
    // the `maturin` program, which a pip install into the environment put only there
    let path = std::env::join_paths(std::iter::once(venv.join("bin")).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH with the environment's bin first");
    let started = Instant::now();
    let (ok, output) = run_logged(
        Command::new(&python)
            .args(["-m", "pip", "install", "--no-build-isolation", "--no-deps"])
            .args(["--disable-pip-version-check"])
            .arg(crate_dir)
            .env("CARGO_TARGET_DIR", &build_dir)
            .env("PATH", &path)
            .env("VIRTUAL_ENV", &venv),
        &tmp.join("ri2n-python-pip-install.log"),
        Duration::from_secs(1800),
    );
    assert!(ok, "building and installing the package failed:\n{output}");
    eprintln!("built and installed in {:.1?}", started.elapsed());

    let started = Instant::now();
    let (ok, output) = run_logged(
        Command::new(&python)
            // no .pytest_cache or __pycache__ left in the source tree
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(crate_dir),
        &tmp.join("ri2n-python-pytest.log"),
        PYTEST_LIMIT,
    );
    assert!(ok, "the Python tests failed:\n{output}");
    let summary = output.lines().last().unwrap_or_default();
    eprintln!("pytest: {summary} (in {:.1?})", started.elapsed());
}
