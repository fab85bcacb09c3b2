//! `--version` says whether the binary was built with `--cfg tokio_unstable`, which only the
//! simulation needs: `ci/image.sh` reads it from the image to check that the release build
//! was made without it. The binary and this test are built with the same flags.

use std::process::Command;

#[test]
fn version_says_whether_this_is_a_tokio_unstable_build() {
    let out = Command::new(env!("CARGO_BIN_EXE_spur-operator"))
        .arg("--version")
        .output()
        .expect("run spur-operator");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.starts_with(concat!("spur-operator ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert_eq!(
        text.contains("tokio_unstable"),
        cfg!(tokio_unstable),
        "{text}"
    );

    // `-V` stays the bare version, as scripts parse it.
    let short = Command::new(env!("CARGO_BIN_EXE_spur-operator"))
        .arg("-V")
        .output()
        .expect("run spur-operator");
    assert_eq!(
        String::from_utf8_lossy(&short.stdout).trim(),
        concat!("spur-operator ", env!("CARGO_PKG_VERSION"))
    );
}
