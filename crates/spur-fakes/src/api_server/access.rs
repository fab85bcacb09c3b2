//! Who may do what, as the server applies it: authentication from the request's bearer
//! token, authorization by [`rbac`] over the RBAC objects in the store, the owner-reference
//! admission check, and a log of every refusal (what the least-privilege tests read).

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::Ordering},
};

use http::{HeaderMap, Method, header};
use serde_json::Value;

use super::{
    auth::UserInfo,
    error::{ApiError, ApiResult},
    rbac::{self, Attributes, Binding, Decision, Policy},
    resources::ResourceKey,
    selectors::Filter,
    server::Shared,
    store::Store,
};

/// How the server decides who may do what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authorization {
    /// Every request needs a known bearer token and is authorised by RBAC, as in a cluster.
    #[default]
    Rbac,
    /// Every request is allowed, token or not: only for tests of the store itself.
    AllowAll,
}

/// A request the server refused with 401 or 403.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// 401 or 403.
    pub code: u16,
    /// The authenticated user, if any.
    pub user: Option<String>,
    /// The host the request came from (in a simulation).
    pub host: Option<Arc<str>>,
    /// `METHOD path`.
    pub request: String,
    /// The refusal's `Status` message.
    pub message: String,
}

/// Authenticates and authorises one request: the user (`None` when everything is allowed),
/// or the 401 or 403 to answer, logged.
pub(crate) fn check(
    shared: &Shared,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    host: Option<Arc<str>>,
) -> ApiResult<Option<UserInfo>> {
    if shared.authorization == Authorization::AllowAll {
        return Ok(None);
    }
    let user = match headers.get(header::AUTHORIZATION) {
        None => shared.anonymous.clone(),
        Some(_) => shared
            .tokens
            .lock()
            .expect("token lock")
            .authenticate(headers),
    };
    let result = match &user {
        None => Err(ApiError::unauthorized()),
        Some(user) => {
            let query = query_of(uri);
            let upgrade = headers.contains_key(header::UPGRADE)
                && !shared.exec_upgrade_as_get.load(Ordering::Relaxed);
            let attrs = Attributes::of_request(method.as_str(), uri.path(), &query, upgrade);
            let store = shared.store.lock().expect("store lock");
            match policy(&store).authorize(user, &attrs) {
                Decision::Allow => Ok(()),
                Decision::Deny(reason) => Err(rbac::forbidden(user, &attrs, reason.as_deref())),
            }
        }
    };
    match result {
        Ok(()) => Ok(user),
        Err(err) => {
            let request = format!("{method} {uri}");
            record(shared, &err, user.as_ref(), host, request);
            Err(err)
        }
    }
}

/// Logs a refusal.
pub(crate) fn record(
    shared: &Shared,
    err: &ApiError,
    user: Option<&UserInfo>,
    host: Option<Arc<str>>,
    request: String,
) {
    tracing::debug!(code = err.code, message = %err.message, "kube-api refused a request");
    shared.denials.lock().expect("denial lock").push(Denial {
        code: err.code,
        user: user.map(|u| u.name.clone()),
        host,
        request,
        message: err.message.clone(),
    });
}

fn query_of(uri: &http::Uri) -> BTreeMap<String, String> {
    axum::extract::Query::<BTreeMap<String, String>>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

/// The RBAC objects the store holds now.
pub(crate) fn policy(store: &Store) -> Policy {
    let mut policy = Policy::default();
    for plural in ["roles", "clusterroles"] {
        for role in objects(store, plural) {
            policy.add_role(&role);
        }
    }
    let bindings = |plural| {
        objects(store, plural)
            .iter()
            .map(Binding::from_json)
            .collect()
    };
    policy.cluster_role_bindings = bindings("clusterrolebindings");
    policy.role_bindings = bindings("rolebindings");
    policy
}

fn objects(store: &Store, plural: &str) -> Vec<Value> {
    let key = ResourceKey {
        group: "rbac.authorization.k8s.io".to_owned(),
        version: "v1".to_owned(),
        plural: plural.to_owned(),
    };
    let Some(rt) = store.resource(&key).cloned() else {
        return Vec::new();
    };
    store
        .list(&rt, &Filter::default(), None, None)
        .map(|page| page.items.iter().map(|o| (**o).clone()).collect())
        .unwrap_or_default()
}

/// Kubernetes' `OwnerReferencesPermissionEnforcement` admission on create: setting an
/// owner reference needs `delete` on the object itself, and `blockOwnerDeletion` needs
/// `update` on the owner's `finalizers` subresource. (Updates are not checked: nothing
/// here sets an owner reference after creation.)
pub(crate) fn admit_owner_references(
    store: &Store,
    user: &UserInfo,
    created: &Attributes,
    obj: &Value,
) -> ApiResult<()> {
    let Some(owners) = obj["metadata"]["ownerReferences"].as_array() else {
        return Ok(());
    };
    if owners.is_empty() {
        return Ok(());
    }
    let policy = policy(store);
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let refuse =
        |why: String| ApiError::forbidden(&created.api_group, &created.resource, name, &why);
    let delete = Attributes {
        verb: "delete".to_owned(),
        name: name.to_owned(),
        ..created.clone()
    };
    if let Decision::Deny(_) = policy.authorize(user, &delete) {
        let why = rbac::forbidden(user, &delete, None).message;
        return Err(refuse(format!(
            "cannot set an ownerRef on a resource you can't delete: {}",
            why_of(&why)
        )));
    }
    for owner in owners.iter().filter(|o| o["blockOwnerDeletion"] == true) {
        let finalizers = owner_finalizers(store, owner, &created.namespace);
        let allowed = finalizers
            .as_ref()
            .is_some_and(|f| policy.authorize(user, f) == Decision::Allow);
        if !allowed {
            let why = finalizers.map_or_else(
                || "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for the owner".to_owned(),
                |f| why_of(&rbac::forbidden(user, &f, None).message).to_owned(),
            );
            return Err(refuse(format!(
                "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: {why}, {owner}"
            )));
        }
    }
    Ok(())
}

/// The `update` of an owner's `finalizers` the admission check asks about.
fn owner_finalizers(store: &Store, owner: &Value, namespace: &str) -> Option<Attributes> {
    let api_version = owner["apiVersion"].as_str()?;
    let rt = store.type_for(api_version, owner["kind"].as_str()?)?;
    Some(Attributes {
        verb: "update".to_owned(),
        resource_request: true,
        path: String::new(),
        api_group: rt.group.clone(),
        resource: rt.plural.clone(),
        subresource: "finalizers".to_owned(),
        namespace: if rt.namespaced {
            namespace.to_owned()
        } else {
            String::new()
        },
        name: owner["name"].as_str().unwrap_or_default().to_owned(),
    })
}

/// The authorizer's own words within a 403 message (after `... is forbidden: `).
fn why_of(message: &str) -> &str {
    message
        .split_once("is forbidden: ")
        .map_or(message, |(_, why)| why)
}
