//! Token admission, as spurctld's `[admission] mode = "token"` answers it (docs/specs.md,
//! fidelity row 12).
//!
//! A join token `<6 hex>.<64 hex>` is made by `CreateToken` and replicated through the log;
//! it is reusable until revoked or past its TTL. Every registration must carry one; the
//! answer's node token (an HS256 JWT `{sub: hostname, iat, exp}` under `[auth] jwt_key`, or
//! spurctld's well-known default key without one) must go with every heartbeat. Node tokens
//! are not recorded: revoking the join token leaves them valid until they expire.

use std::time::{Duration, SystemTime};

use ring::digest;
use serde_json::json;
use tonic::Status;

use super::auth;

/// The key spurctld signs node tokens with when `[auth] jwt_key` is unset.
pub const DEFAULT_NODE_TOKEN_KEY: &[u8] = b"spur-default-key";

/// spurctld's node-token lifetime: fixed at 7 days in its source.
pub const NODE_TOKEN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

const ID_LEN: usize = 6;
const SECRET_LEN: usize = 64;

/// A join token as the replicated state keeps it: the secret only as its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinTokenRecord {
    pub secret_sha256: String,
    pub expires_at: Option<SystemTime>,
    pub revoked: bool,
}

/// The `number`th join token the cluster makes: `(id, secret)`. Derived from a counter, not
/// drawn from entropy, so a seed replays the same tokens.
pub fn new_join_token(number: u64) -> (String, String) {
    let digest = digest::digest(
        &digest::SHA256,
        format!("spur-sim join token {number}").as_bytes(),
    );
    let secret = hex(digest.as_ref());
    let id = hex(&digest::digest(&digest::SHA256, secret.as_bytes()).as_ref()[..ID_LEN / 2]);
    (id, secret)
}

/// The record of a join token with `secret`, admitting until `expires_at`.
pub fn record(secret: &str, expires_at: Option<SystemTime>) -> JoinTokenRecord {
    JoinTokenRecord {
        secret_sha256: sha256(secret),
        expires_at,
        revoked: false,
    }
}

/// Checks `join_token` against the cluster's tokens at `now`, with spurctld's codes and
/// texts in its order: missing, format, unknown, revoked, expired, secret.
pub fn admit<'a>(
    join_token: &str,
    lookup: impl FnOnce(&str) -> Option<&'a JoinTokenRecord>,
    now: SystemTime,
) -> Result<(), Status> {
    if join_token.is_empty() {
        return Err(Status::unauthenticated("admission token required"));
    }
    let denied = |why: String| Err(Status::permission_denied(why));
    let Some((id, secret)) = join_token
        .split_once('.')
        .filter(|(id, secret)| id.len() == ID_LEN && secret.len() == SECRET_LEN)
    else {
        return denied("invalid token format".to_owned());
    };
    let Some(stored) = lookup(id) else {
        return denied(format!("token not found: {id}"));
    };
    if stored.revoked {
        return denied("token revoked".to_owned());
    }
    if stored.expires_at.is_some_and(|at| now > at) {
        return denied("token expired".to_owned());
    }
    if sha256(secret) != stored.secret_sha256 {
        return denied("invalid token secret".to_owned());
    }
    Ok(())
}

/// The node token an admitted `hostname` is given at `now`, valid for `lifetime`.
pub fn node_token(hostname: &str, key: &[u8], now: SystemTime, lifetime: Duration) -> String {
    let iat = seconds(now);
    spur_operator::sign_agent_token(
        key,
        &json!({"sub": hostname, "exp": iat + lifetime.as_secs(), "iat": iat}),
    )
}

/// Checks the node token a heartbeat of `hostname` carries, as spurctld does at `now`.
pub fn check_node_token(
    token: &str,
    hostname: &str,
    key: &[u8],
    now: SystemTime,
) -> Result<(), Status> {
    if token.is_empty() {
        return Err(Status::unauthenticated("node token required"));
    }
    let claims = auth::verify_hs256(token, key, seconds(now)).map_err(|e| match e.as_str() {
        "ExpiredSignature" => Status::unauthenticated("node token expired"),
        _ => Status::unauthenticated(format!("invalid node token: {e}")),
    })?;
    let subject = claims["sub"].as_str().ok_or_else(|| {
        Status::unauthenticated("invalid node token: JSON error: missing field `sub`")
    })?;
    if subject != hostname {
        return Err(Status::permission_denied("node token hostname mismatch"));
    }
    Ok(())
}

fn seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn sha256(text: &str) -> String {
    hex(digest::digest(&digest::SHA256, text.as_bytes()).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_made_token_admits_until_revoked_or_expired_and_refusals_name_why() {
        let (id, secret) = new_join_token(0);
        assert_eq!((id.len(), secret.len()), (ID_LEN, SECRET_LEN));
        assert_ne!(new_join_token(1), (id.clone(), secret.clone()));
        let token = format!("{id}.{secret}");
        let mut stored = record(&secret, Some(at(NOW + 10)));
        let check = |token: &str, stored: &JoinTokenRecord, now| {
            admit(token, |asked| (asked == id).then_some(stored), at(now))
        };
        assert!(check(&token, &stored, NOW).is_ok());
        let refusal = |result: Result<(), Status>| {
            let status = result.unwrap_err();
            (status.code(), status.message().to_owned())
        };
        use tonic::Code::{PermissionDenied, Unauthenticated};
        let required = (Unauthenticated, "admission token required".to_owned());
        assert_eq!(refusal(check("", &stored, NOW)), required);
        let format = (PermissionDenied, "invalid token format".to_owned());
        assert_eq!(refusal(check("abc", &stored, NOW)), format);
        let wrong_secret = format!("{id}.{}", "0".repeat(SECRET_LEN));
        let secret_refused = (PermissionDenied, "invalid token secret".to_owned());
        assert_eq!(refusal(check(&wrong_secret, &stored, NOW)), secret_refused);
        let expired = (PermissionDenied, "token expired".to_owned());
        assert_eq!(refusal(check(&token, &stored, NOW + 11)), expired);
        stored.revoked = true;
        let revoked = (PermissionDenied, "token revoked".to_owned());
        assert_eq!(refusal(check(&token, &stored, NOW)), revoked);
    }

    #[test]
    fn a_node_token_serves_its_own_host_until_it_expires() {
        let key = DEFAULT_NODE_TOKEN_KEY;
        let token = node_token("n1", key, at(NOW), Duration::from_secs(600));
        assert!(check_node_token(&token, "n1", key, at(NOW + 600)).is_ok());
        let code_and_text = |result: Result<(), Status>| {
            let status = result.unwrap_err();
            (status.code(), status.message().to_owned())
        };
        use tonic::Code::{PermissionDenied, Unauthenticated};
        let (code, text) = code_and_text(check_node_token(&token, "n2", key, at(NOW)));
        assert_eq!(
            (code, text.as_str()),
            (PermissionDenied, "node token hostname mismatch")
        );
        // jsonwebtoken's 60 s leeway past `exp`.
        let (code, text) = code_and_text(check_node_token(&token, "n1", key, at(NOW + 661)));
        assert_eq!(
            (code, text.as_str()),
            (Unauthenticated, "node token expired")
        );
        let (code, text) = code_and_text(check_node_token("garbage", "n1", key, at(NOW)));
        assert_eq!(
            (code, text.as_str()),
            (Unauthenticated, "invalid node token: InvalidToken")
        );
        let (code, text) = code_and_text(check_node_token(&token, "n1", b"other", at(NOW)));
        assert_eq!(
            (code, text.as_str()),
            (Unauthenticated, "invalid node token: InvalidSignature")
        );
        let (code, _) = code_and_text(check_node_token("", "n1", key, at(NOW)));
        assert_eq!(code, Unauthenticated);
    }
}
