//! `spur-sim kube-api` over real TCP in a child process, and kubectl driven against it.
//! kubectl is required, not optional: ci/install-deps.sh installs it, and a test that
//! skipped without it would report a check as passed that never ran.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The kubectl binary (`KUBECTL` picks another); panics, naming the fix, when absent.
pub fn kubectl_binary() -> String {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let found = Command::new(&kubectl)
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{kubectl} is not on PATH: run ci/install-deps.sh (it installs Debian's kubernetes-client)"
    );
    kubectl
}

/// A running `spur-sim kube-api`, killed (and its kubeconfig removed) when dropped.
pub struct KubeApiProcess {
    child: Child,
    dir: PathBuf,
    pub kubeconfig: PathBuf,
    kubectl: String,
}

impl KubeApiProcess {
    /// Starts the server with `seed_nodes` labelled nodes; returns once it serves.
    pub fn start(name: &str, seed_nodes: usize) -> KubeApiProcess {
        let kubectl = kubectl_binary();
        let dir = std::env::temp_dir().join(format!("spur-sim-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let mut child = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
            .args(["kube-api", "--listen", "127.0.0.1:0", "--seed-nodes"])
            .arg(seed_nodes.to_string())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The server prints its address once the kubeconfig is in place.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("serving on http://127.0.0.1:"), "{line}");
        KubeApiProcess {
            child,
            dir,
            kubeconfig,
            kubectl,
        }
    }

    /// Runs kubectl with `args` (and `stdin`); its success and its stdout and stderr.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Runs kubectl and fails the test, with kubectl's output, when it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, text) = self.try_kubectl(args, stdin);
        assert!(ok, "kubectl {args:?} failed: {text}");
        text
    }
}

impl Drop for KubeApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
