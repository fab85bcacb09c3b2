//! Token admission (spurctld's `[admission] mode = "token"`, docs/specs.md row 12): the join
//! token every registration carries, when to register again for a fresh node token, and
//! the one line a refusal gets.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tonic::Code;

use crate::flags::{ConfigError, read_file};

const FLAG: &str = "--controller-join-token-file";

/// The join token registrations carry, from `--controller-join-token-file`. The file is
/// read again when it changed, so a Secret rotated in place (the kubelet swaps the mounted
/// file for a new one) is used without a restart; a read that fails keeps the last good
/// token.
#[derive(Clone)]
pub struct JoinToken {
    path: PathBuf,
    read: Arc<Mutex<Read>>,
}

/// The last token read well, the error of the last read that failed since (so a bad file
/// is logged once, not at every registration), and the file as it was at the last read.
struct Read {
    last_good: String,
    failing: Option<String>,
    stamp: Option<FileStamp>,
}

/// What tells a changed file without reading it: 5,000 nodes registering at start cost one
/// `stat` each instead of a read. The kubelet's rotation writes a new file (a new inode);
/// the length and modification time catch a file rewritten in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    device: u64,
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: metadata.modified().ok(),
        })
    }
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinToken({})", self.path.display())
    }
}

impl JoinToken {
    /// Reads the token at start; an unreadable, empty or malformed file is refused.
    pub fn load(path: &Path) -> Result<JoinToken, ConfigError> {
        let stamp = FileStamp::of(path);
        let token = parse(path, read_file(FLAG, path)?)?;
        let read = Read {
            last_good: token,
            failing: None,
            stamp,
        };
        Ok(JoinToken {
            path: path.to_owned(),
            read: Arc::new(Mutex::new(read)),
        })
    }

    /// The file the token comes from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token as the file holds it now, or the last good one if it cannot be read.
    pub fn current(&self) -> String {
        let stamp = FileStamp::of(&self.path);
        let mut read = self.read.lock().expect("join token lock");
        if stamp.is_some() && stamp == read.stamp {
            return read.last_good.clone();
        }
        read.stamp = stamp;
        let outcome = read_file(FLAG, &self.path).and_then(|bytes| parse(&self.path, bytes));
        match outcome {
            Ok(token) => {
                read.last_good = token;
                read.failing = None;
            }
            Err(e) => {
                let error = e.to_string();
                if read.failing.as_ref() != Some(&error) {
                    tracing::warn!(%error, "keeping the join token read before");
                    read.failing = Some(error);
                }
            }
        }
        read.last_good.clone()
    }
}

/// The token in a file's bytes: one line, `<id>.<secret>` as `spur token create` prints it
/// (spurctld checks the lengths and answers which part is wrong).
fn parse(path: &Path, bytes: Vec<u8>) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { flag: FLAG, reason };
    let text =
        String::from_utf8(bytes).map_err(|_| invalid(format!("{} is not text", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(invalid(format!(
            "{} is empty: put in it the join token `spur token create` printed",
            path.display()
        )));
    }
    let well_formed = token.split_once('.').is_some_and(|(id, secret)| {
        let hex = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_hexdigit());
        hex(id) && hex(secret)
    });
    if !well_formed {
        return Err(invalid(format!(
            "{} does not hold a join token: expected <id>.<secret> in hex, as `spur token create` prints it",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// The soonest a node token is renewed, whatever its lifetime says: a token claiming a
/// lifetime of nothing must not have its node register in a loop.
const SOONEST_RENEWAL: Duration = Duration::from_secs(60);

/// How long after it was issued a node token should be replaced: `renew_before` ahead of
/// its expiry, but never before half its life (nor [`SOONEST_RENEWAL`]), so a short-lived
/// token is not renewed in a loop. Reckoned from the token's own `iat` and `exp`, so
/// neither clock's skew matters. `None` for a token without a lifetime (open admission
/// answers an empty one). Renewals need no jitter: they follow the registrations, which
/// `--register-concurrency` already spreads.
pub fn renewal_delay(node_token: &str, renew_before: Duration) -> Option<Duration> {
    let payload = node_token.split('.').nth(1)?;
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let lifetime = claims["exp"]
        .as_u64()?
        .checked_sub(claims["iat"].as_u64()?)?;
    let lifetime = Duration::from_secs(lifetime);
    Some(
        lifetime
            .saturating_sub(renew_before)
            .max(lifetime / 2)
            .max(SOONEST_RENEWAL),
    )
}

/// Whether a heartbeat refusal is of the node token (missing, expired, forged or another
/// host's): registering again gets a new one.
pub fn node_token_refused(code: Code, message: &str) -> bool {
    match code {
        Code::Unauthenticated => message.contains("node token"),
        Code::PermissionDenied => message.contains("node token hostname mismatch"),
        _ => false,
    }
}

/// The line a registration refused for admission or authentication gets, naming what to
/// set; `None` for any other failure.
pub fn registration_problem(
    code: Code,
    message: &str,
    join_token: Option<&JoinToken>,
) -> Option<String> {
    match (code, join_token) {
        (Code::Unauthenticated, None) if message.contains("admission token required") => {
            Some(format!(
                "spurctld admits nodes only with a join token ([admission] mode = \"token\"): set {FLAG} \
                 (SPUR_OPERATOR_CONTROLLER_JOIN_TOKEN_FILE) to a file holding one, such as a Secret \
                 made from `spur token create`"
            ))
        }
        (Code::PermissionDenied, Some(token)) if is_join_token_refusal(message) => Some(format!(
            "spurctld refused the join token in {} ({FLAG}): {message}; put a valid one there \
             (`spur token create`)",
            token.path().display()
        )),
        (Code::Unauthenticated, _) => Some(format!(
            "spurctld refuses the operator's calls as unauthenticated ({message}): give the \
             operator a credential spurctld accepts with --controller-token-file \
             (SPUR_OPERATOR_CONTROLLER_TOKEN_FILE)"
        )),
        _ => None,
    }
}

/// spurctld's refusals of a join token (its `AdmissionError`s).
fn is_join_token_refusal(message: &str) -> bool {
    [
        "invalid token format",
        "token not found",
        "token revoked",
        "token expired",
        "invalid token secret",
    ]
    .iter()
    .any(|refusal| message.contains(refusal))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        crate::sign_agent_token(b"k", &claims)
    }

    #[test]
    fn a_token_is_renewed_ahead_of_its_expiry_but_never_before_half_its_life() {
        let week = 7 * 24 * 3600;
        let spurctlds = jwt(serde_json::json!({"sub": "n1", "iat": 1000, "exp": 1000 + week}));
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(renewal_delay(&spurctlds, day), Some(6 * day));
        let short = jwt(serde_json::json!({"sub": "n1", "iat": 1000, "exp": 1600}));
        assert_eq!(renewal_delay(&short, day), Some(Duration::from_secs(300)));
        let nothing = jwt(serde_json::json!({"sub": "n1", "iat": 1000, "exp": 1000}));
        assert_eq!(renewal_delay(&nothing, day), Some(SOONEST_RENEWAL));
        assert_eq!(renewal_delay("", day), None);
        assert_eq!(renewal_delay("not.a.jwt", day), None);
    }

    #[test]
    fn a_join_token_file_is_trimmed_and_refused_empty_or_malformed_naming_the_flag() {
        let dir = std::env::temp_dir().join(format!("spur-join-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "a1b2c3.00ff\n").unwrap();
        let token = JoinToken::load(&file).unwrap();
        assert_eq!(token.current(), "a1b2c3.00ff");
        std::fs::write(&file, "d4e5f6.11ee").unwrap();
        assert_eq!(
            token.current(),
            "d4e5f6.11ee",
            "a rotated Secret is read again"
        );
        let unchanged = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&file, "d4e5f6.22dd").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_modified(unchanged))
            .unwrap();
        assert_eq!(
            token.current(),
            "d4e5f6.11ee",
            "a file whose inode, length and time are unchanged is not read again"
        );
        std::fs::remove_file(&file).unwrap();
        assert_eq!(token.current(), "d4e5f6.11ee", "the last good one is kept");
        for (content, says) in [("\n", "is empty"), ("not a token", "<id>.<secret>")] {
            std::fs::write(&file, content).unwrap();
            let error = JoinToken::load(&file).unwrap_err().to_string();
            assert!(error.starts_with(FLAG) && error.contains(says), "{error}");
        }
        let missing = JoinToken::load(&dir.join("absent"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with(FLAG) && missing.contains("cannot read"),
            "{missing}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_admission_refusal_names_what_to_set_and_other_failures_are_not_one() {
        let required =
            registration_problem(Code::Unauthenticated, "admission token required", None);
        assert!(required.unwrap().contains(FLAG));
        let dir = std::env::temp_dir().join(format!("spur-join-refused-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t"), "a1b2c3.00ff").unwrap();
        let token = JoinToken::load(&dir.join("t")).unwrap();
        let revoked = registration_problem(Code::PermissionDenied, "token revoked", Some(&token));
        let revoked = revoked.unwrap();
        assert!(
            revoked.contains("token revoked") && revoked.contains("/t"),
            "{revoked}"
        );
        let unsigned = registration_problem(
            Code::Unauthenticated,
            "authentication required: pass a token (see `spur token user`)",
            None,
        );
        assert!(unsigned.unwrap().contains("--controller-token-file"));
        assert_eq!(
            registration_problem(Code::Unavailable, "not the Raft leader", None),
            None
        );
        assert!(node_token_refused(
            Code::Unauthenticated,
            "node token expired"
        ));
        assert!(node_token_refused(
            Code::PermissionDenied,
            "node token hostname mismatch"
        ));
        assert!(!node_token_refused(
            Code::Unauthenticated,
            "authentication required"
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
