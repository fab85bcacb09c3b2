//! The image table: which host program a container's image and command run, since a
//! cluster made of processes pulls no images.
//!
//! The table is a text file of lines `REPOSITORY COMMAND PROGRAM` (`#` starts a comment):
//!
//! ```text
//! # repository        command        program on the host
//! spur-operator       -              /work/main/target/debug/spur-operator
//! ghcr.io/rocm/spur   spurctld       /work/shared/peers/spurctld/spurctld
//! busybox             *              host
//! ```
//!
//! COMMAND `-` is the image's entrypoint (a container without `command`), `*` any command;
//! PROGRAM `host` resolves the container's own command on the host's `PATH`. Repositories
//! are compared without tag, digest, `docker.io/` and `library/` ([`repository`]).

use std::path::{Path, PathBuf};

/// What a container runs: a host program and the arguments before the container's args.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub program: PathBuf,
    /// The container's `command` after its first word (the program replaces that word).
    pub args: Vec<String>,
}

/// Why a container cannot start, as the kubelet reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// The image is not in the table: `ErrImagePull`, then `ImagePullBackOff`.
    NoImage(String),
    /// The image is, but not the command: a start error, as exec's ENOENT is on a node.
    NoCommand(String),
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    repository: String,
    /// `None`: any command (`*`); `Some("-")`: the entrypoint.
    command: Option<String>,
    /// `None`: the container's command on the host's PATH.
    program: Option<PathBuf>,
}

/// Image references to host programs; later entries win over earlier ones.
#[derive(Clone, Debug, Default)]
pub struct ImageTable {
    entries: Vec<Entry>,
}

/// Upstream Spur's image, as its manifests and users name it.
const UPSTREAM_IMAGES: [&str; 3] = ["spur", "ghcr.io/rocm/spur", "rocm/spur"];

/// Shell-style images whose commands are the host's own (`sh`, `sleep`, `python3`...).
const SHELL_IMAGES: [&str; 6] = ["busybox", "alpine", "debian", "ubuntu", "python", "bash"];

impl ImageTable {
    /// The built-in table: this project's operator, upstream's spurctld, shell images.
    /// `operator` is the `spur-operator` binary, `spurctld` the real controller, if found.
    pub fn builtin(operator: &Path, spurctld: Option<&Path>) -> Self {
        let mut table = Self::default();
        table.add("spur-operator", Some("-"), Some(operator.to_owned()));
        table.add(
            "spur-operator",
            Some("spur-operator"),
            Some(operator.to_owned()),
        );
        if let Some(spurctld) = spurctld {
            // Upstream's manifests run `spur:latest` with `command: [spurctld]`.
            for repo in UPSTREAM_IMAGES {
                table.add(repo, Some("spurctld"), Some(spurctld.to_owned()));
            }
        }
        // Upstream's operator Deployment runs the same image with `command:
        // [spur-k8s-operator]`: a migrating user swaps in ours under that name.
        for repo in UPSTREAM_IMAGES {
            table.add(repo, Some("spur-k8s-operator"), Some(operator.to_owned()));
        }
        for repo in SHELL_IMAGES {
            table.add(repo, None, None);
            table.add(repo, Some("-"), Some(PathBuf::from("/bin/sh")));
        }
        table
    }

    /// The built-in table with this project's usual paths: target/debug/spur-operator
    /// beside the workspace (or `$SPUR_OPERATOR_BIN`) and the real spurctld when found.
    pub fn with_defaults(workspace: &Path) -> Self {
        let operator = std::env::var_os("SPUR_OPERATOR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target/debug/spur-operator"));
        let spurctld = crate::real_peer::binary();
        Self::builtin(&operator, spurctld.as_deref())
    }

    fn add(&mut self, repository: &str, command: Option<&str>, program: Option<PathBuf>) {
        self.entries.push(Entry {
            repository: repository.to_owned(),
            command: command.map(str::to_owned),
            program,
        });
    }

    /// Adds the lines of a table file (relative programs are relative to the file).
    pub fn extend_from_file(&mut self, path: &Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("image table {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        self.extend_from_text(&text, base)
            .map_err(|e| anyhow::anyhow!("image table {}: {e}", path.display()))
    }

    /// Adds the lines of a table's text; relative programs are relative to `base`.
    pub fn extend_from_text(&mut self, text: &str, base: &Path) -> anyhow::Result<()> {
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let [repo, command, program] = words.as_slice() else {
                anyhow::bail!("line {}: expected `REPOSITORY COMMAND PROGRAM`", n + 1);
            };
            let command = (*command != "*").then_some(*command);
            let program = (*program != "host").then(|| base.join(program));
            self.add(&repository(repo), command, program);
        }
        Ok(())
    }

    /// The table in its file's format, the winning (later) lines last.
    pub fn describe(&self) -> String {
        let mut text = String::from("# repository  command  program\n");
        for entry in &self.entries {
            let command = entry.command.as_deref().unwrap_or("*");
            let program = entry
                .program
                .as_ref()
                .map_or_else(|| "host".to_owned(), |p| p.display().to_string());
            text.push_str(&format!("{}  {command}  {program}\n", entry.repository));
        }
        text
    }

    /// The program a container of `image` runs for `command` (empty: the entrypoint).
    pub fn resolve(&self, image: &str, command: &[String]) -> Result<Resolved, Unresolved> {
        let repo = repository(image);
        let of_image: Vec<&Entry> = self
            .entries
            .iter()
            .rev()
            .filter(|e| e.repository == repo)
            .collect();
        if of_image.is_empty() {
            return Err(Unresolved::NoImage(format!(
                "Failed to pull image \"{image}\": repository {repo} not found: the \
                 kubelet's image table maps no program to it"
            )));
        }
        let first = command.first().map_or("-", |c| basename(c));
        let entry = of_image
            .iter()
            .find(|e| e.command.as_deref() == Some(first))
            .or_else(|| {
                of_image
                    .iter()
                    .find(|e| e.command.is_none() && first != "-")
            });
        let Some(entry) = entry else {
            return Err(Unresolved::NoCommand(format!(
                "exec: \"{first}\": the image table maps no program to it in {repo}"
            )));
        };
        let rest = command.iter().skip(1).cloned().collect();
        match &entry.program {
            Some(program) => Ok(Resolved {
                program: program.clone(),
                args: rest,
            }),
            None => on_path(&command[0])
                .map(|program| Resolved {
                    program,
                    args: rest,
                })
                .ok_or_else(|| {
                    Unresolved::NoCommand(format!(
                        "exec: \"{}\": executable file not found in $PATH",
                        command[0]
                    ))
                }),
        }
    }
}

/// An image reference's repository: no digest, no tag, no `docker.io/` or `library/`.
pub fn repository(image: &str) -> String {
    let image = image.split('@').next().unwrap_or_default();
    // A tag's colon comes after the last slash; a registry's port's before it.
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    let image = match image[last_slash..].find(':') {
        Some(colon) => &image[..last_slash + colon],
        None => image,
    };
    let image = image
        .strip_prefix("docker.io/")
        .or_else(|| image.strip_prefix("index.docker.io/"))
        .unwrap_or(image);
    image.strip_prefix("library/").unwrap_or(image).to_owned()
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A command on the host: a path as it is, a bare name looked up on `PATH`.
fn on_path(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Path::new(command).is_file().then(|| PathBuf::from(command));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_drop_tags_digests_and_the_default_registry() {
        assert_eq!(repository("busybox:1.36"), "busybox");
        assert_eq!(repository("docker.io/library/busybox"), "busybox");
        assert_eq!(
            repository("ghcr.io/rocm/spur:v1@sha256:ab"),
            "ghcr.io/rocm/spur"
        );
        assert_eq!(
            repository("localhost:5000/spur-operator"),
            "localhost:5000/spur-operator"
        );
    }

    #[test]
    fn images_resolve_to_host_programs_or_explain_why_not() {
        let mut table = ImageTable::builtin(Path::new("/op"), Some(Path::new("/ctld")));
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let op = table.resolve("spur-operator:dev", &[]).unwrap();
        assert_eq!(op.program, PathBuf::from("/op"));
        let ctld = table
            .resolve("ghcr.io/rocm/spur:latest", &words(&["spurctld", "--x"]))
            .unwrap();
        assert_eq!(
            (ctld.program, ctld.args),
            (PathBuf::from("/ctld"), words(&["--x"]))
        );
        let upstream_operator = table
            .resolve(
                "spur:latest",
                &words(&["spur-k8s-operator", "--listen=[::]:6818"]),
            )
            .unwrap();
        assert_eq!(upstream_operator.program, PathBuf::from("/op"));
        assert!(table.describe().contains("spur  spur-k8s-operator  /op\n"));
        assert!(matches!(
            table.resolve("spur:latest", &words(&["spurd"])),
            Err(Unresolved::NoCommand(_))
        ));
        let sh = table
            .resolve("busybox", &words(&["sh", "-c", "true"]))
            .unwrap();
        assert!(sh.program.ends_with("sh"), "{sh:?}");
        assert!(matches!(
            table.resolve("nginx", &[]),
            Err(Unresolved::NoImage(m)) if m.contains("nginx")
        ));
        table
            .extend_from_text(
                "nginx * host # a comment\n\nmine - bin/mine\n",
                Path::new("/t"),
            )
            .unwrap();
        assert!(table.resolve("nginx:1", &words(&["sh"])).is_ok());
        assert_eq!(
            table.resolve("mine", &[]).unwrap().program,
            PathBuf::from("/t/bin/mine")
        );
        assert!(
            table
                .extend_from_text("two words\n", Path::new("/"))
                .is_err()
        );
    }
}
