//! Authentication: bearer tokens the server minted, each standing for a user and its groups.
//!
//! Token values are a counter and a hash of the subject, never drawn from the OS RNG, so a
//! seed gives the same run in any process.

use std::collections::BTreeMap;

use http::{HeaderMap, header};

use super::rbac::{AUTHENTICATED_GROUP, MASTERS_GROUP};
use spur_judge::trace::fnv1a;

/// The user the cluster's own components and the tests' kubectl act as.
pub const ADMIN_USER: &str = "kubernetes-admin";

/// Who a request comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The cluster admin: `kubernetes-admin` in `system:masters`, as kubeadm makes it.
    pub fn admin() -> Self {
        Self {
            name: ADMIN_USER.to_owned(),
            groups: vec![MASTERS_GROUP.to_owned(), AUTHENTICATED_GROUP.to_owned()],
        }
    }

    /// ServiceAccount `namespace/name`, with the groups Kubernetes gives every one.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: service_account_user(namespace, name),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                AUTHENTICATED_GROUP.to_owned(),
            ],
        }
    }
}

/// The user name of ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The tokens the server accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    users: BTreeMap<String, UserInfo>,
}

impl Tokens {
    /// A new token for `user`: its ordinal and a hash of the user, so two mints differ.
    pub fn mint(&mut self, user: UserInfo) -> String {
        let n = self.users.len() + 1;
        let token = format!("spur-sim-{n}-{:016x}", fnv1a(user.name.as_bytes()));
        self.users.insert(token.clone(), user);
        token
    }

    /// The user a request's `Authorization: Bearer` header names, if the token is known.
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.users.get(token.trim()).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    #[test]
    fn a_minted_token_names_its_user_and_others_name_nobody() {
        let mut tokens = Tokens::default();
        let sa = tokens.mint(UserInfo::service_account("spur-system", "spur-operator"));
        let admin = tokens.mint(UserInfo::admin());
        assert_ne!(sa, admin);
        let user = tokens.authenticate(&bearer(&sa)).unwrap();
        assert_eq!(user.name, "system:serviceaccount:spur-system:spur-operator");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:spur-system",
                "system:authenticated"
            ]
        );
        assert_eq!(
            tokens.authenticate(&bearer(&admin)),
            Some(UserInfo::admin())
        );
        assert_eq!(tokens.authenticate(&bearer("guess")), None);
        assert_eq!(tokens.authenticate(&HeaderMap::new()), None);
    }

    #[test]
    fn tokens_are_the_same_in_every_process() {
        let mint = || Tokens::default().mint(UserInfo::admin());
        assert_eq!(mint(), mint());
        assert_eq!(
            mint(),
            format!("spur-sim-1-{:016x}", fnv1a(b"kubernetes-admin"))
        );
    }
}
