//! Every crate in Cargo.lock, for every platform, under a licence `ci/licences-allowed.txt`
//! allows. The check reads what `cargo metadata` reports (each crate's declared licence
//! expression) and evaluates it with the `spdx` crate, the parser cargo-deny uses, rather
//! than installing cargo-deny itself: CI builds on a fresh machine, and this is the one check
//! of cargo-deny the project needs.

use std::path::PathBuf;
use std::process::Command;

use spdx::{Expression, ParseMode};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn allowed() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("ci/licences-allowed.txt"))
        .expect("ci/licences-allowed.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Why `license` (a crate's declared expression, or None) is not allowed, if it is not.
fn refusal(license: Option<&str>, allowed: &[String]) -> Option<String> {
    let Some(license) = license else {
        return Some("declares no licence expression (only a licence file, or none)".into());
    };
    // Lax: crates.io still carries the old "MIT/Apache-2.0" form.
    let expression = match Expression::parse_mode(license, ParseMode::LAX) {
        Ok(e) => e,
        Err(e) => return Some(format!("licence {license:?} does not parse: {e}")),
    };
    match expression.evaluate_with_failures(|req| allowed.contains(&req.to_string())) {
        Ok(()) => None,
        Err(failed) => {
            let failed: Vec<String> = failed.iter().map(|r| r.req.to_string()).collect();
            Some(format!(
                "licence {license:?} needs {} (not in ci/licences-allowed.txt)",
                failed.join(", ")
            ))
        }
    }
}

#[test]
fn every_locked_crate_has_an_allowed_licence() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // No --filter-platform: every crate of the lockfile, Windows-only ones included (cargo
    // fetches the manifests it lacks; --locked keeps it from changing the lockfile).
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(repo())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let allowed = allowed();
    let packages = metadata["packages"].as_array().unwrap();
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    assert_eq!(
        packages.len(),
        lock.matches("\n[[package]]\n").count(),
        "cargo metadata lists every package of Cargo.lock"
    );
    let refused: Vec<String> = packages
        .iter()
        .filter_map(|p| {
            let why = refusal(p["license"].as_str(), &allowed)?;
            let name = p["name"].as_str().unwrap_or("?");
            let version = p["version"].as_str().unwrap_or("?");
            Some(format!("{name} {version}: {why}"))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "crates under licences not allowed:\n{}",
        refused.join("\n")
    );
}

#[test]
fn the_check_refuses_what_the_list_does_not_allow() {
    let allowed = allowed();
    assert_eq!(refusal(Some("MIT OR Apache-2.0"), &allowed), None);
    assert_eq!(
        refusal(Some("MIT/Apache-2.0"), &allowed),
        None,
        "the old form"
    );
    assert_eq!(
        refusal(Some("MIT OR LGPL-2.1-or-later"), &allowed),
        None,
        "one side suffices"
    );
    let copyleft = refusal(Some("GPL-3.0-only"), &allowed).expect("refused");
    assert!(copyleft.contains("GPL-3.0-only"), "{copyleft}");
    let both = refusal(Some("MIT AND MPL-2.0"), &allowed).expect("an AND needs both");
    assert!(both.contains("MPL-2.0") && !both.contains("MIT,"), "{both}");
    assert!(
        refusal(None, &allowed)
            .unwrap()
            .contains("no licence expression")
    );
    assert!(
        refusal(Some("MIT OR NOPE-1"), &allowed)
            .unwrap()
            .contains("does not parse")
    );
}
