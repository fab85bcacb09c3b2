//! Who calls the controller: spurctld's bearer-token check on every RPC (`[auth]`).
//!
//! Permissive (spurctld's default) admits a call without a token; `required` refuses it.
//! A token is always verified: HS256 under `[auth] jwt_key`, with an `exp` not past; a
//! token presented to a controller with no key is refused in every mode. A verified
//! token's subject is the caller, whatever the request's own `user` field says.

use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// What spurctld's token check allows past an expired `exp` (jsonwebtoken's default leeway).
const EXPIRY_LEEWAY_SECS: u64 = 60;

/// A caller a token named: its subject, and whether it may make the admin calls (its
/// `admin` claim, or the subject `root`, which spurctld takes for an admin while
/// accounting is off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub admin: bool,
}

/// How a replica checks its callers.
#[derive(Clone, Copy, Debug)]
pub struct AuthPolicy<'a> {
    /// `[auth] jwt_key`: the key tokens are verified with; `None` when none is configured.
    pub key: Option<&'a [u8]>,
    /// `[auth] mode = "required"`: every call needs a token, Ping included.
    pub required: bool,
}

impl AuthPolicy<'_> {
    /// The verified caller of a request with `metadata` at `now`: `Ok(None)` for a call
    /// without a token that the mode admits; the refusal spurctld answers otherwise.
    pub fn caller(
        &self,
        metadata: &MetadataMap,
        now: SystemTime,
    ) -> Result<Option<Caller>, Status> {
        let Some(header) = metadata.get("authorization") else {
            if self.required {
                return Err(Status::unauthenticated(
                    "authentication required: pass a token (see `spur token user`)",
                ));
            }
            return Ok(None);
        };
        let token = header
            .to_str()
            .ok()
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Status::unauthenticated("malformed authorization header: expected 'Bearer <token>'")
            })?;
        let Some(key) = self.key else {
            return Err(Status::unauthenticated(
                "a token was presented but no auth.jwt_key is configured",
            ));
        };
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        subject(token, key, now)
            .map(Some)
            .map_err(|e| Status::unauthenticated(format!("invalid credential: {e}")))
    }
}

/// The caller `token` names when it is an HS256 JWT signed with `key`, not expired at
/// `now` (seconds since the epoch), with the claims spurctld requires of a caller.
fn subject(token: &str, key: &[u8], now: u64) -> Result<Caller, String> {
    let claims = verify_hs256(token, key, now)?;
    if claims["uid"].as_u64().is_none() {
        return Err("JSON error: missing field `uid`".to_owned());
    }
    let user = claims["sub"]
        .as_str()
        .ok_or_else(|| "JSON error: missing field `sub`".to_owned())?;
    Ok(Caller {
        user: user.to_owned(),
        admin: claims["admin"].as_bool().unwrap_or(false) || user == "root",
    })
}

/// The claims of `token` when it is an HS256 JWT signed with `key` whose `exp` is not past
/// at `now` (with jsonwebtoken's leeway); else the error jsonwebtoken names, as spurctld
/// words it.
pub(crate) fn verify_hs256(token: &str, key: &[u8], now: u64) -> Result<serde_json::Value, String> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("InvalidToken".to_owned());
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| "Base64 error".to_owned())
    };
    let json = |bytes: Vec<u8>| {
        serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| format!("JSON error: {e}"))
    };
    if json(decode(header)?)?["alg"] != "HS256" {
        return Err("InvalidAlgorithm".to_owned());
    }
    let signed = &token[..header.len() + 1 + payload.len()];
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        signed.as_bytes(),
        &decode(signature)?,
    )
    .map_err(|_| "InvalidSignature".to_owned())?;
    let claims = json(decode(payload)?)?;
    let exp = claims["exp"]
        .as_u64()
        .ok_or_else(|| "Missing required claim: exp".to_owned())?;
    if exp + EXPIRY_LEEWAY_SECS < now {
        return Err("ExpiredSignature".to_owned());
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"model-auth-key";
    const NOW: u64 = 1_800_000_000;

    fn token(key: &[u8], exp: u64) -> String {
        spur_operator::sign_agent_token(
            key,
            &serde_json::json!({"sub": "alice", "uid": 1000, "iat": NOW, "exp": exp}),
        )
    }

    fn with(header: Option<&str>) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        if let Some(header) = header {
            metadata.insert("authorization", header.parse().unwrap());
        }
        metadata
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn a_valid_token_names_the_caller_and_a_missing_one_is_refused_only_when_required() {
        let bearer = format!("Bearer {}", token(KEY, NOW + 300));
        for required in [false, true] {
            let policy = AuthPolicy {
                key: Some(KEY),
                required,
            };
            let caller = policy.caller(&with(Some(&bearer)), at(NOW)).unwrap();
            let user = caller.as_ref().map(|c| (c.user.as_str(), c.admin));
            assert_eq!(user, Some(("alice", false)));
            assert_eq!(policy.caller(&with(None), at(NOW)).is_err(), required);
        }
    }

    #[test]
    fn forged_expired_malformed_or_keyless_tokens_are_refused() {
        let policy = AuthPolicy {
            key: Some(KEY),
            required: false,
        };
        let forged = format!("Bearer {}", token(b"other-key", NOW + 300));
        let expired = format!("Bearer {}", token(KEY, NOW - 61));
        for header in [forged.as_str(), expired.as_str(), "Basic abc", "Bearer "] {
            let refused = policy.caller(&with(Some(header)), at(NOW)).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{header}");
        }
        let keyless = AuthPolicy {
            key: None,
            required: false,
        };
        let valid = format!("Bearer {}", token(KEY, NOW + 300));
        let refused = keyless.caller(&with(Some(&valid)), at(NOW)).unwrap_err();
        assert!(refused.message().contains("no auth.jwt_key"), "{refused:?}");
    }
}
