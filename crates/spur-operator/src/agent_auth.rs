//! Who may call the virtual agent: spurctld proves itself with a bearer token, a JWT signed
//! with HS256 under a key both sides hold (`authorization: Bearer <jwt>`).
//!
//! Verified here with ring's HMAC (already linked for TLS) rather than a JWT crate: the
//! maintained one (jsonwebtoken) brings RSA and elliptic-curve stacks or a C build of
//! aws-lc for an HMAC over two base64url segments, and only HS256 is accepted anyway.
//! What a token must satisfy: three base64url segments; a header whose `alg` is `HS256`
//! (never `none`, never another algorithm); a valid signature; when present, `exp` not
//! passed and `nbf` reached, both within the configured leeway; and the subject `sub` is
//! `spurctld`, as spurd requires. spurctld mints `{sub: "spurctld", uid: 0, iat,
//! exp: iat + 300, admin: true}` per connection; the other claims are not interpreted (its
//! token carries no audience the operator could check).
//!
//! spurctld signs with its `jwt_key`'s raw bytes, whatever their length, so any non-empty
//! key is accepted here; one shorter than 32 bytes (RFC 7518's minimum for HS256) is
//! logged as a warning.

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::Deserialize;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::clock::WallClock;
use crate::metrics::Metrics;

/// How the agent treats tokens (`--agent-auth`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentAuthMode {
    /// Every call must carry a valid token (a key is required).
    Required,
    /// A call that carries a token must carry a valid one; a call without is accepted and
    /// counted, so a fleet can move to tokens before they are enforced.
    #[default]
    Permissive,
    /// Tokens are not looked at.
    Disabled,
}

/// Why a token was refused; the message names the part that is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("no bearer token")]
    Missing,
    #[error("the authorization metadata is not `Bearer <token>`")]
    NotBearer,
    #[error("the token is not a JWT (three base64url segments): {0}")]
    Malformed(&'static str),
    #[error("the token is signed with {0}, not HS256")]
    Algorithm(String),
    #[error("the token's signature does not match the agent key")]
    Signature,
    #[error("the token expired at {0} (unix seconds)")]
    Expired(u64),
    #[error("the token is not valid before {0} (unix seconds)")]
    NotYetValid(u64),
    #[error("the token's subject is {0:?}, not \"spurctld\"")]
    Subject(String),
}

/// The subject spurctld's agent tokens carry, and the only one the agent accepts.
pub const SUBJECT: &str = "spurctld";

/// The key length RFC 7518 (section 3.2) asks of an HS256 key: shorter keys are accepted
/// (spurctld signs with whatever it is given) with a warning.
pub const RECOMMENDED_KEY_BYTES: usize = 32;

/// What an agent that admits calls without a valid token opens, and to whom: one line for
/// the start-up log, naming what to set; `None` when every call needs a token.
pub fn open_calls_warning(mode: AgentAuthMode, has_key: bool, port: u16) -> Option<String> {
    let open = format!(
        "whoever reaches port {port} can run commands in a job's pods (ExecInJob), read their output (StreamJobOutput) and stop them (CancelJob, SuspendJob); only a NetworkPolicy the network plugin enforces keeps others out"
    );
    let (why, fix) = match (mode, has_key) {
        (AgentAuthMode::Required, _) => return None,
        (AgentAuthMode::Disabled, _) => (
            "the agent checks no token (--agent-auth disabled)",
            "set --agent-auth required with --agent-auth-key-file",
        ),
        (AgentAuthMode::Permissive, false) => (
            "the agent has no key (--agent-auth-key-file unset), so it checks no token",
            "give it spurctld's [auth] jwt_key with --agent-auth-key-file and set --agent-auth required (deploy/components/agent-auth)",
        ),
        (AgentAuthMode::Permissive, true) => (
            "the agent admits a call without a token (--agent-auth permissive)",
            "set --agent-auth required once spurctld signs its calls",
        ),
    };
    Some(format!("{why}: {open}; {fix}"))
}

/// The outcome of a call that was let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A valid token.
    Verified,
    /// No token, accepted by `permissive`.
    WithoutToken,
    /// Tokens are not checked (`disabled`, or no key).
    Unchecked,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<u64>,
    nbf: Option<u64>,
}

/// The agent's token check. Cloning shares the key.
#[derive(Clone)]
pub struct AgentAuth {
    mode: AgentAuthMode,
    key: Option<hmac::Key>,
    leeway: Duration,
    clock: WallClock,
}

impl AgentAuth {
    /// `key` is the shared secret's bytes; `None` when no key file is configured (then
    /// nothing is checked, which `required` does not allow: see the config's validation).
    pub fn new(
        mode: AgentAuthMode,
        key: Option<&[u8]>,
        leeway: Duration,
        clock: WallClock,
    ) -> Self {
        if let Some(key) = key
            && key.len() < RECOMMENDED_KEY_BYTES
        {
            tracing::warn!(
                key_bytes = key.len(),
                "the agent key is shorter than the {RECOMMENDED_KEY_BYTES} bytes RFC 7518 asks of an HS256 key; accepted, as spurctld accepts it"
            );
        }
        AgentAuth {
            mode,
            key: key.map(|k| hmac::Key::new(hmac::HMAC_SHA256, k)),
            leeway,
            clock,
        }
    }

    /// Checks a call's metadata.
    pub fn check(&self, metadata: &MetadataMap) -> Result<Admitted, TokenError> {
        let key = match (&self.key, self.mode) {
            (_, AgentAuthMode::Disabled) | (None, AgentAuthMode::Permissive) => {
                return Ok(Admitted::Unchecked);
            }
            (Some(key), _) => key,
            (None, AgentAuthMode::Required) => return Err(TokenError::Missing),
        };
        let Some(value) = metadata.get("authorization") else {
            return match self.mode {
                AgentAuthMode::Required => Err(TokenError::Missing),
                _ => Ok(Admitted::WithoutToken),
            };
        };
        let value = value.to_str().map_err(|_| TokenError::NotBearer)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(TokenError::NotBearer)?
            .trim();
        self.verify(key, token)?;
        Ok(Admitted::Verified)
    }

    fn verify(&self, key: &hmac::Key, token: &str) -> Result<(), TokenError> {
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("not three segments"));
        };
        let decode = |segment: &str, what: &'static str| {
            URL_SAFE_NO_PAD
                .decode(segment)
                .map_err(|_| TokenError::Malformed(what))
        };
        let parsed: Header = serde_json::from_slice(&decode(header, "header is not base64url")?)
            .map_err(|_| TokenError::Malformed("header is not a JSON object with `alg`"))?;
        if parsed.alg != "HS256" {
            return Err(TokenError::Algorithm(parsed.alg));
        }
        let signature = decode(signature, "signature is not base64url")?;
        let signed = &token[..header.len() + 1 + claims.len()];
        // Constant-time comparison inside ring.
        hmac::verify(key, signed.as_bytes(), &signature).map_err(|_| TokenError::Signature)?;
        let claims: Claims = serde_json::from_slice(&decode(claims, "claims are not base64url")?)
            .map_err(|_| TokenError::Malformed("claims are not a JSON object"))?;
        let now = self
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let leeway = self.leeway.as_secs();
        if let Some(exp) = claims.exp
            && now > exp.saturating_add(leeway)
        {
            return Err(TokenError::Expired(exp));
        }
        if let Some(nbf) = claims.nbf
            && now.saturating_add(leeway) < nbf
        {
            return Err(TokenError::NotYetValid(nbf));
        }
        if claims.sub.as_deref() != Some(SUBJECT) {
            return Err(TokenError::Subject(claims.sub.unwrap_or_default()));
        }
        Ok(())
    }

    /// A tonic interceptor: refuses with UNAUTHENTICATED (naming why), counts each outcome.
    pub fn interceptor(
        self,
        metrics: Metrics,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
        move |request: Request<()>| match self.check(request.metadata()) {
            Ok(admitted) => {
                let result = match admitted {
                    Admitted::Verified => "verified",
                    Admitted::WithoutToken => "without_token",
                    Admitted::Unchecked => "unchecked",
                };
                metrics.agent_auth(result);
                Ok(request)
            }
            Err(e) => {
                metrics.agent_auth("refused");
                tracing::warn!(error = %e, "refused an agent call");
                Err(Status::unauthenticated(format!("agent: {e}")))
            }
        }
    }
}

/// Signs `claims` (a JSON object) with HS256 under `key`: what spurctld does, for tests and
/// for `spur-sim`'s controllers.
pub fn sign(key: &[u8], claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    const KEY: &[u8] = b"agent-key-of-at-least-32-bytes!!";
    const NOW: u64 = 1_800_000_000;

    fn auth(mode: AgentAuthMode, key: Option<&[u8]>) -> AgentAuth {
        let clock = WallClock::from_fn(|| UNIX_EPOCH + Duration::from_secs(NOW));
        AgentAuth::new(mode, key, Duration::from_secs(30), clock)
    }

    fn with(token: Option<&str>) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        if let Some(token) = token {
            metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        metadata
    }

    #[test]
    fn a_valid_token_is_verified_in_both_checking_modes() {
        let token = sign(KEY, &json!({"sub": "spurctld", "exp": NOW + 60}));
        for mode in [AgentAuthMode::Required, AgentAuthMode::Permissive] {
            assert_eq!(
                auth(mode, Some(KEY)).check(&with(Some(&token))),
                Ok(Admitted::Verified)
            );
        }
    }

    #[test]
    fn without_a_token_required_refuses_and_permissive_admits() {
        assert_eq!(
            auth(AgentAuthMode::Required, Some(KEY)).check(&with(None)),
            Err(TokenError::Missing)
        );
        assert_eq!(
            auth(AgentAuthMode::Permissive, Some(KEY)).check(&with(None)),
            Ok(Admitted::WithoutToken)
        );
    }

    #[test]
    fn a_bad_token_is_refused_even_when_permissive() {
        let permissive = auth(AgentAuthMode::Permissive, Some(KEY));
        let other_key = sign(
            b"another key entirely, 32 bytes..",
            &json!({"sub": "spurctld"}),
        );
        assert_eq!(
            permissive.check(&with(Some(&other_key))),
            Err(TokenError::Signature)
        );
        let expired = sign(KEY, &json!({"exp": NOW - 31}));
        assert_eq!(
            permissive.check(&with(Some(&expired))),
            Err(TokenError::Expired(NOW - 31))
        );
        // Within the leeway, clock skew is forgiven.
        let just_expired = sign(KEY, &json!({"sub": "spurctld", "exp": NOW - 29}));
        assert_eq!(
            permissive.check(&with(Some(&just_expired))),
            Ok(Admitted::Verified)
        );
        let early = sign(KEY, &json!({"nbf": NOW + 31}));
        assert_eq!(
            permissive.check(&with(Some(&early))),
            Err(TokenError::NotYetValid(NOW + 31))
        );
        assert!(matches!(
            permissive.check(&with(Some("not-a-jwt"))),
            Err(TokenError::Malformed(_))
        ));
        let mut basic = MetadataMap::new();
        basic.insert("authorization", "Basic dXNlcjpwdw==".parse().unwrap());
        assert_eq!(permissive.check(&basic), Err(TokenError::NotBearer));
    }

    #[test]
    fn an_unsigned_or_differently_signed_token_is_refused() {
        let claims = URL_SAFE_NO_PAD.encode(json!({"exp": NOW + 60}).to_string());
        let none = format!("{}.{claims}.", URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#));
        assert_eq!(
            auth(AgentAuthMode::Required, Some(KEY)).check(&with(Some(&none))),
            Err(TokenError::Algorithm("none".into()))
        );
        // A valid HS256 signature over a header that claims another algorithm.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS512"}"#);
        let signed = format!("{header}.{claims}");
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, KEY), signed.as_bytes());
        let hs512 = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        assert_eq!(
            auth(AgentAuthMode::Required, Some(KEY)).check(&with(Some(&hs512))),
            Err(TokenError::Algorithm("HS512".into()))
        );
        // A token whose claims were changed after signing.
        let token = sign(KEY, &json!({"exp": NOW - 100}));
        let mut parts: Vec<&str> = token.split('.').collect();
        parts[1] = &claims;
        assert_eq!(
            auth(AgentAuthMode::Required, Some(KEY)).check(&with(Some(&parts.join(".")))),
            Err(TokenError::Signature)
        );
    }

    #[test]
    fn only_spurctld_is_the_subject() {
        let required = auth(AgentAuthMode::Required, Some(KEY));
        // Exactly what spurctld mints.
        let spurctld = sign(
            KEY,
            &json!({"sub": "spurctld", "uid": 0, "iat": NOW, "exp": NOW + 300, "admin": true}),
        );
        assert_eq!(
            required.check(&with(Some(&spurctld))),
            Ok(Admitted::Verified)
        );
        let user = sign(KEY, &json!({"sub": "alice", "uid": 1000, "exp": NOW + 300}));
        assert_eq!(
            required.check(&with(Some(&user))),
            Err(TokenError::Subject("alice".into()))
        );
        let none = sign(KEY, &json!({"exp": NOW + 300}));
        assert_eq!(
            required.check(&with(Some(&none))),
            Err(TokenError::Subject(String::new()))
        );
        let not_a_string = sign(KEY, &json!({"sub": 7, "exp": NOW + 300}));
        assert!(matches!(
            required.check(&with(Some(&not_a_string))),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn a_key_of_any_length_spurctld_signs_with_is_accepted() {
        for key in [&b"k"[..], b"short-key", KEY, &[7u8; 100]] {
            let token = sign(key, &json!({"sub": "spurctld", "exp": NOW + 300}));
            assert_eq!(
                auth(AgentAuthMode::Required, Some(key)).check(&with(Some(&token))),
                Ok(Admitted::Verified),
                "{} bytes",
                key.len()
            );
        }
    }

    #[test]
    fn disabled_or_keyless_permissive_checks_nothing() {
        let garbage = with(Some("garbage"));
        assert_eq!(
            auth(AgentAuthMode::Disabled, Some(KEY)).check(&garbage),
            Ok(Admitted::Unchecked)
        );
        assert_eq!(
            auth(AgentAuthMode::Permissive, None).check(&garbage),
            Ok(Admitted::Unchecked)
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn segment() -> impl Strategy<Value = String> {
            "[A-Za-z0-9_-]{0,60}"
        }

        proptest! {
            /// Random bytes after `Bearer ` are refused with a reason, never a panic.
            #[test]
            fn random_bytes_are_refused_with_a_reason(text in "\\PC{0,80}") {
                let Ok(value) = format!("Bearer {text}").parse() else {
                    return Ok(());
                };
                let mut metadata = MetadataMap::new();
                metadata.insert("authorization", value);
                let answer = auth(AgentAuthMode::Required, Some(KEY)).check(&metadata);
                prop_assert!(answer.is_err(), "{text:?} was admitted");
                prop_assert!(!answer.unwrap_err().to_string().is_empty());
            }

            /// JWT-shaped strings (three base64url segments, or any number of them) are
            /// refused unless signed with the key: never a panic.
            #[test]
            fn jwt_shaped_strings_are_refused_unless_signed(
                parts in prop::collection::vec(segment(), 1..5)
            ) {
                let token = parts.join(".");
                let answer = auth(AgentAuthMode::Required, Some(KEY)).check(&with(Some(&token)));
                prop_assert!(answer.is_err(), "{token} was admitted");
            }

            /// Signed tokens with random claims: admitted exactly when the subject is
            /// spurctld and the times allow it.
            #[test]
            fn signed_tokens_are_judged_by_their_claims(
                sub in "(spurctld|[a-z]{0,10})",
                exp in prop::option::of(0u64..2 * NOW),
                nbf in prop::option::of(0u64..2 * NOW),
                extra in "\\PC{0,20}",
            ) {
                let mut claims = json!({"sub": sub, "note": extra});
                if let Some(exp) = exp {
                    claims["exp"] = json!(exp);
                }
                if let Some(nbf) = nbf {
                    claims["nbf"] = json!(nbf);
                }
                let token = sign(KEY, &claims);
                let answer = auth(AgentAuthMode::Required, Some(KEY)).check(&with(Some(&token)));
                let leeway = 30;
                let in_time = exp.is_none_or(|e| e + leeway >= NOW)
                    && nbf.is_none_or(|n| n <= NOW + leeway);
                if sub == "spurctld" && in_time {
                    prop_assert_eq!(answer, Ok(Admitted::Verified), "{}", claims);
                } else {
                    prop_assert!(answer.is_err(), "{claims} was admitted");
                }
                let wrong_key = sign(b"another-key-of-at-least-32-bytes", &claims);
                prop_assert!(auth(AgentAuthMode::Required, Some(KEY))
                    .check(&with(Some(&wrong_key)))
                    .is_err());
            }
        }
    }

    #[test]
    fn an_agent_that_admits_calls_without_a_token_says_what_is_open_and_what_to_set() {
        assert_eq!(
            open_calls_warning(AgentAuthMode::Required, true, 6818),
            None
        );
        let cases = [
            (AgentAuthMode::Permissive, false, "--agent-auth-key-file"),
            (AgentAuthMode::Permissive, true, "--agent-auth required"),
            (AgentAuthMode::Disabled, true, "--agent-auth disabled"),
        ];
        for (mode, has_key, names) in cases {
            let line = open_calls_warning(mode, has_key, 6818).expect("a warning");
            for says in [
                "port 6818",
                "ExecInJob",
                "StreamJobOutput",
                "CancelJob",
                names,
            ] {
                assert!(line.contains(says), "{mode:?} {has_key}: {line}");
            }
        }
    }
}
