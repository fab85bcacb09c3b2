//! The object store: every object as JSON, a global resourceVersion, and the change history
//! watches are served from.
//!
//! Everything is kept in `BTreeMap`s and `VecDeque`s so iteration order is deterministic.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    ops::Bound,
    sync::Arc,
};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::clock::TimeSource;

use super::{
    error::{ApiError, ApiResult},
    patch::{PatchKind, apply_patch},
    resources::{ResourceKey, ResourceType, builtin_types, normalize, types_from_crd},
    selectors::Filter,
    service_ips::{self, ServiceIpRange},
};

/// `(namespace, name)`; the namespace is `""` for cluster-scoped objects.
pub type ObjectKey = (String, String);

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Changed (including a deletion that waits on finalizers).
    Modified,
    /// Gone.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One entry of the change history.
#[derive(Clone, Debug)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// The resource the object belongs to.
    pub resource: ResourceKey,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (for `Deleted`, its last state).
    pub object: Arc<Value>,
    /// The object before the change (`None` for `Added`).
    pub previous: Option<Arc<Value>>,
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ListPage {
    /// The matching objects of this page, ordered by namespace then name.
    pub items: Vec<Arc<Value>>,
    /// The resourceVersion the list is consistent with (the first page's, when paging).
    pub resource_version: u64,
    /// Token for the next page, when there is one.
    pub continue_token: Option<String>,
    /// How many matching objects the later pages hold.
    pub remaining: Option<u64>,
}

/// Preconditions a delete may carry.
#[derive(Clone, Debug, Default)]
pub struct Preconditions {
    /// The object's uid must be this.
    pub uid: Option<String>,
    /// The object's resourceVersion must be this.
    pub resource_version: Option<String>,
}

/// Tunables of the store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// How many changes are kept for watches; a watch from an older resourceVersion gets 410.
    pub history_limit: usize,
    /// Seeds uids and generated names, so two runs with the same seed agree.
    pub seed: u64,
    /// Where a Service's clusterIP comes from at its create; `None` gives none, as the
    /// simulation has it: its operator reads no clusterIP, and its seeded traces were
    /// recorded without one.
    pub service_cluster_ips: Option<ServiceIpRange>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        // Ten thousand changes cover hours of a simulated cluster's churn.
        Self {
            history_limit: 10_000,
            seed: 0,
            service_cluster_ips: None,
        }
    }
}

/// The in-memory state of the API server.
pub struct Store {
    types: BTreeMap<ResourceKey, ResourceType>,
    objects: BTreeMap<ResourceKey, BTreeMap<ObjectKey, Arc<Value>>>,
    rv: u64,
    counter: u64,
    history: VecDeque<Change>,
    /// Changes up to and including this resourceVersion are no longer in `history`.
    compacted_rv: u64,
    config: StoreConfig,
    clock: TimeSource,
    notify: watch::Sender<u64>,
    observers: Vec<Observer>,
}

/// A function told of every change, in order, as it happens (under the store's lock: it
/// must not call back into the server).
pub type Observer = Arc<dyn Fn(&Change) + Send + Sync>;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rv", &self.rv)
            .field("compacted_rv", &self.compacted_rv)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store with the built-in kinds and the `default` namespace.
    pub fn new(clock: TimeSource, config: StoreConfig) -> Self {
        let (notify, _) = watch::channel(0);
        let mut store = Self {
            types: BTreeMap::new(),
            objects: BTreeMap::new(),
            rv: 0,
            counter: 0,
            history: VecDeque::new(),
            compacted_rv: 0,
            config,
            clock,
            notify,
            observers: Vec::new(),
        };
        for t in builtin_types() {
            store.types.insert(t.key(), t);
        }
        let ns = store
            .type_for("v1", "Namespace")
            .expect("Namespace is built in");
        for name in ["default", "kube-system"] {
            store
                .create(&ns, None, json!({"metadata": {"name": name}}))
                .expect("a fresh store takes the default namespaces");
        }
        store
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Watches of resourceVersions below this one get 410 Gone.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// A receiver woken whenever the resourceVersion moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// The clock timestamps come from.
    pub fn clock(&self) -> &TimeSource {
        &self.clock
    }

    /// Adds a function told of every later change (the simulation's checks and trace).
    pub fn observe(&mut self, observer: Observer) {
        self.observers.push(observer);
    }

    /// The served resource at a key.
    pub fn resource(&self, key: &ResourceKey) -> Option<&ResourceType> {
        self.types.get(key)
    }

    /// All served resources, in key order.
    pub fn resources(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }

    /// The resource serving `apiVersion`/`kind`.
    pub fn type_for(&self, api_version: &str, kind: &str) -> Option<ResourceType> {
        self.types
            .values()
            .find(|t| t.api_version() == api_version && t.kind == kind)
            .cloned()
    }

    /// Drops all history: every watch from a resourceVersion before now gets 410.
    ///
    /// The resourceVersion moves on by one (with no change attached), so a list made after
    /// the compaction reports a version that can be watched again.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.compacted_rv = self.rv;
        self.notify.send_replace(self.rv);
    }

    /// One object.
    pub fn get(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> ApiResult<Arc<Value>> {
        self.objects
            .get(&rt.key())
            .and_then(|objs| objs.get(&object_key(rt, namespace, name)))
            .cloned()
            .ok_or_else(|| not_found(rt, name))
    }

    /// A page of the objects passing `filter`, after the `continue` token if any.
    pub fn list(
        &self,
        rt: &ResourceType,
        filter: &Filter,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> ApiResult<ListPage> {
        let (list_rv, start) = match continue_token.filter(|t| !t.is_empty()) {
            Some(token) => {
                let (rv, key) = decode_continue(token).ok_or_else(|| {
                    ApiError::bad_request(format!("invalid continue token {token:?}"))
                })?;
                if rv < self.compacted_rv {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Bound::Excluded(key))
            }
            None => (self.rv, Bound::Unbounded),
        };
        let empty = BTreeMap::new();
        let objects = self.objects.get(&rt.key()).unwrap_or(&empty);
        let mut matching = objects
            .range((start, Bound::Unbounded))
            .filter(|(_, o)| filter.matches(o));
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last_key = None;
        for (key, obj) in matching.by_ref() {
            if items.len() == limit {
                // There is at least one more: count the rest and hand out a token.
                let remaining = 1 + matching.count() as u64;
                let token = encode_continue(list_rv, last_key.expect("a full page has a last key"));
                return Ok(ListPage {
                    items,
                    resource_version: list_rv,
                    continue_token: Some(token),
                    remaining: Some(remaining),
                });
            }
            items.push(obj.clone());
            last_key = Some(key);
        }
        Ok(ListPage {
            items,
            resource_version: list_rv,
            continue_token: None,
            remaining: None,
        })
    }

    /// Creates an object; 409 AlreadyExists when the name is taken.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        mut obj: Value,
    ) -> ApiResult<Arc<Value>> {
        check_type_fields(rt, &mut obj)?;
        normalize(rt, &mut obj)?;
        if let (true, Some(range)) = (is_service(rt), self.config.service_cluster_ips) {
            let services = self
                .objects
                .get(&rt.key())
                .into_iter()
                .flat_map(|o| o.values());
            service_ips::assign(range, services.map(|s| &**s), &mut obj)?;
        }
        let meta = metadata_mut(&mut obj)?;
        set_namespace(rt, meta, namespace)?;
        self.generate_missing_name(rt, meta)?;
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        validate_name(rt, &name)?;
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if rt.namespaced {
            self.check_namespace_exists(namespace.unwrap_or("default"))?;
        }
        let key = object_key(rt, namespace, &name);
        if self
            .objects
            .get(&rt.key())
            .is_some_and(|o| o.contains_key(&key))
        {
            return Err(ApiError::already_exists(
                &rt.qualified(),
                &rt.group,
                &rt.plural,
                &name,
            ));
        }
        self.stamp_created(meta);
        if rt.custom && rt.status_subresource {
            // Custom resources with a status subresource ignore status on create.
            obj.as_object_mut().expect("checked above").remove("status");
        }
        let new_types = if is_crd(rt) {
            Some(self.prepare_crd(&mut obj)?)
        } else {
            None
        };
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let obj = Arc::new(obj);
        self.objects
            .entry(rt.key())
            .or_default()
            .insert(key, obj.clone());
        if let Some(types) = new_types {
            self.register(types);
        }
        self.record(rt, ChangeKind::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Names an object created with only `generateName`: the prefix and a seeded suffix.
    fn generate_missing_name(
        &mut self,
        rt: &ResourceType,
        meta: &mut Map<String, Value>,
    ) -> ApiResult<()> {
        if meta
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if prefix.is_empty() {
                return Err(ApiError::invalid(format!(
                    "{} is invalid: metadata.name: Required value",
                    rt.kind
                )));
            }
            self.counter += 1;
            let suffix = generated_suffix(self.config.seed, self.counter);
            meta.insert("name".into(), Value::String(format!("{prefix}{suffix}")));
        }
        Ok(())
    }

    /// 404 unless namespace `ns` exists: a namespaced object is created only in one.
    fn check_namespace_exists(&self, ns: &str) -> ApiResult<()> {
        let namespaces = ResourceKey {
            group: String::new(),
            version: "v1".into(),
            plural: "namespaces".into(),
        };
        let exists = self
            .objects
            .get(&namespaces)
            .is_some_and(|o| o.contains_key(&(String::new(), ns.to_owned())));
        if !exists {
            return Err(ApiError::not_found("namespaces", "", "namespaces", ns));
        }
        Ok(())
    }

    /// Sets the metadata the server owns on a new object (a seeded uid, the creation time,
    /// generation 1) and drops what a client may not set.
    fn stamp_created(&mut self, meta: &mut Map<String, Value>) {
        self.counter += 1;
        meta.insert(
            "uid".into(),
            Value::String(uid(self.config.seed, self.counter)),
        );
        meta.insert(
            "creationTimestamp".into(),
            Value::String(self.clock.now_rfc3339()),
        );
        meta.insert("generation".into(), json!(1));
        for server_owned in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(server_owned);
        }
    }

    /// Replaces an object (or, with `status_only`, only its status), honouring the
    /// resourceVersion and uid in `obj` as preconditions.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        mut obj: Value,
        status_only: bool,
    ) -> ApiResult<Arc<Value>> {
        let key = object_key(rt, namespace, name);
        let existing = self.get(rt, namespace, name)?;
        check_type_fields(rt, &mut obj)?;
        normalize(rt, &mut obj)?;
        let meta = metadata_mut(&mut obj)?;
        match meta.get("name").and_then(Value::as_str) {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {}
        }
        set_namespace(rt, meta, namespace)?;
        let current_rv = check_update_preconditions(rt, name, meta, &existing)?;
        let mut next = if status_only {
            with_status_of(&existing, &obj)
        } else {
            replacement(rt, name, &existing, obj)?
        };
        if is_service(rt) && !status_only {
            service_ips::carry_over(&existing, &mut next)?;
        }
        next["metadata"]["resourceVersion"] = Value::String(current_rv);
        if next == *existing {
            // A no-op write changes nothing, not even the resourceVersion.
            return Ok(existing);
        }
        if existing["metadata"].get("deletionTimestamp").is_some() {
            let before = finalizers(&existing);
            if finalizers(&next).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(format!(
                    "{} \"{name}\" is invalid: metadata.finalizers: Forbidden: \
                     no new finalizers can be added if the object is being deleted",
                    rt.kind
                )));
            }
        }
        if spec_of(&next) != spec_of(&existing) {
            let generation = existing["metadata"]["generation"].as_i64().unwrap_or(0);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        self.commit_update(rt, key, existing, next)
    }

    /// Stores an update's new version under the next resourceVersion, or removes the
    /// object when it was being deleted and its last finalizer went.
    fn commit_update(
        &mut self,
        rt: &ResourceType,
        key: ObjectKey,
        existing: Arc<Value>,
        mut next: Value,
    ) -> ApiResult<Arc<Value>> {
        let new_types = if is_crd(rt) {
            Some(self.prepare_crd(&mut next)?)
        } else {
            None
        };
        self.rv += 1;
        next["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let next = Arc::new(next);
        if let Some(types) = new_types {
            self.register(types);
        }
        let finalized =
            next["metadata"].get("deletionTimestamp").is_some() && finalizers(&next).is_empty();
        if finalized {
            // The last finalizer went: the object goes now.
            self.remove(rt, &key, next.clone(), existing);
        } else {
            self.objects
                .entry(rt.key())
                .or_default()
                .insert(key, next.clone());
            self.record(rt, ChangeKind::Modified, next.clone(), Some(existing));
        }
        Ok(next)
    }

    /// Patches an object (or only its status). An apply patch creates a missing object.
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        kind: PatchKind,
        patch: &Value,
        status_only: bool,
    ) -> ApiResult<Arc<Value>> {
        let existing = match self.get(rt, namespace, name) {
            Ok(existing) => existing,
            Err(e) if kind == PatchKind::Apply && !status_only && e.code == 404 => {
                let mut obj = patch.clone();
                obj["metadata"]["name"] = Value::String(name.to_owned());
                if let Some(meta) = obj["metadata"].as_object_mut() {
                    meta.remove("resourceVersion");
                }
                return self.create(rt, namespace, obj);
            }
            Err(e) => return Err(e),
        };
        let patched = apply_patch(kind, &existing, patch)?;
        if kind == PatchKind::Apply {
            // Apply is forced: a resourceVersion it carries is not a precondition.
            let mut patched = patched;
            patched["metadata"]["resourceVersion"] =
                existing["metadata"]["resourceVersion"].clone();
            return self.update(rt, namespace, name, patched, status_only);
        }
        self.update(rt, namespace, name, patched, status_only)
    }

    /// Deletes an object: with finalizers only `deletionTimestamp` is set (a MODIFIED
    /// change); without, it goes (a DELETED change) and so do its orphaned dependents.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        pre: &Preconditions,
    ) -> ApiResult<Arc<Value>> {
        let key = object_key(rt, namespace, name);
        let existing = self.get(rt, namespace, name)?;
        let meta = &existing["metadata"];
        let uid_differs = pre
            .uid
            .as_deref()
            .is_some_and(|u| Some(u) != meta["uid"].as_str());
        let rv_differs = pre
            .resource_version
            .as_deref()
            .is_some_and(|r| Some(r) != meta["resourceVersion"].as_str());
        if uid_differs || rv_differs {
            return Err(ApiError::conflict(
                &rt.qualified(),
                &rt.group,
                &rt.plural,
                name,
            ));
        }
        if !finalizers(&existing).is_empty() {
            if meta.get("deletionTimestamp").is_some() {
                return Ok(existing);
            }
            let mut next = (*existing).clone();
            next["metadata"]["deletionTimestamp"] = Value::String(self.clock.now_rfc3339());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            self.rv += 1;
            next["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
            let next = Arc::new(next);
            self.objects
                .entry(rt.key())
                .or_default()
                .insert(key, next.clone());
            self.record(rt, ChangeKind::Modified, next.clone(), Some(existing));
            return Ok(next);
        }
        let mut last = (*existing).clone();
        self.rv += 1;
        last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let last = Arc::new(last);
        self.remove(rt, &key, last.clone(), existing);
        Ok(last)
    }

    /// Changes after `after` on one resource; 410 when they are no longer all kept.
    pub fn changes_after(&self, resource: &ResourceKey, after: u64) -> ApiResult<Vec<Change>> {
        if after < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {after} ({})",
                self.compacted_rv + 1
            )));
        }
        let start = self.history.partition_point(|c| c.rv <= after);
        Ok(self
            .history
            .range(start..)
            .filter(|c| &c.resource == resource)
            .cloned()
            .collect())
    }

    fn remove(
        &mut self,
        rt: &ResourceType,
        key: &ObjectKey,
        last: Arc<Value>,
        previous: Arc<Value>,
    ) {
        if let Some(objs) = self.objects.get_mut(&rt.key()) {
            objs.remove(key);
        }
        self.record(rt, ChangeKind::Deleted, last.clone(), Some(previous));
        if is_crd(rt) {
            self.unregister_crd(&last);
        }
        if let Some(uid) = last["metadata"]["uid"].as_str() {
            self.collect_garbage(uid);
        }
    }

    /// Deletes the dependents whose every owner is gone (what the garbage collector does,
    /// here at once).
    fn collect_garbage(&mut self, gone_uid: &str) {
        let live: BTreeSet<String> = self
            .objects
            .values()
            .flat_map(|objs| objs.values())
            .filter_map(|o| o["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        let mut orphans = Vec::new();
        for (rkey, objs) in &self.objects {
            for (okey, obj) in objs {
                let owners: Vec<&str> = obj["metadata"]["ownerReferences"]
                    .as_array()
                    .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
                    .unwrap_or_default();
                if owners.contains(&gone_uid) && owners.iter().all(|u| !live.contains(*u)) {
                    orphans.push((rkey.clone(), okey.clone()));
                }
            }
        }
        for (rkey, (ns, name)) in orphans {
            if let Some(rt) = self.types.get(&rkey).cloned() {
                let ns = (!ns.is_empty()).then_some(ns);
                // Already gone or racing: nothing to collect.
                let _ = self.delete(&rt, ns.as_deref(), &name, &Preconditions::default());
            }
        }
    }

    /// Validates a CRD, marks it established, and returns the resources it serves.
    fn prepare_crd(&self, crd: &mut Value) -> ApiResult<Vec<ResourceType>> {
        let types = types_from_crd(crd)?;
        for t in &types {
            if let Some(existing) = self.types.get(&t.key())
                && !existing.custom
            {
                return Err(ApiError::invalid(format!(
                    "{} is a built-in resource",
                    t.qualified()
                )));
            }
        }
        let now = self.clock.now_rfc3339();
        let condition = |kind: &str| json!({"type": kind, "status": "True", "reason": kind, "message": "", "lastTransitionTime": now});
        crd["status"] = json!({
            "acceptedNames": crd["spec"]["names"].clone(),
            "conditions": [condition("NamesAccepted"), condition("Established")],
            "storedVersions": types.iter().map(|t| t.version.clone()).collect::<Vec<_>>(),
        });
        Ok(types)
    }

    fn register(&mut self, types: Vec<ResourceType>) {
        for t in types {
            self.types.insert(t.key(), t);
        }
    }

    fn unregister_crd(&mut self, crd: &Value) {
        let Ok(types) = types_from_crd(crd) else {
            return;
        };
        for t in types {
            let objects = self.objects.remove(&t.key()).unwrap_or_default();
            for (_, obj) in objects {
                self.rv += 1;
                let mut last = (*obj).clone();
                last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
                self.record(&t, ChangeKind::Deleted, Arc::new(last), Some(obj));
            }
            self.types.remove(&t.key());
        }
    }

    fn record(
        &mut self,
        rt: &ResourceType,
        kind: ChangeKind,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        let change = Change {
            rv: self.rv,
            resource: rt.key(),
            kind,
            object,
            previous,
        };
        for observer in &self.observers {
            observer(&change);
        }
        self.history.push_back(change);
        while self.history.len() > self.config.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        self.notify.send_replace(self.rv);
    }
}

fn is_service(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "services"
}

fn is_crd(rt: &ResourceType) -> bool {
    rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions"
}

fn object_key(rt: &ResourceType, namespace: Option<&str>, name: &str) -> ObjectKey {
    let ns = if rt.namespaced {
        namespace.unwrap_or("default")
    } else {
        ""
    };
    (ns.to_owned(), name.to_owned())
}

fn not_found(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::not_found(&rt.qualified(), &rt.group, &rt.plural, name)
}

/// Checks `apiVersion` and `kind` against the resource (filling them in when absent).
fn check_type_fields(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    let fields = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    for (field, expected) in [("apiVersion", rt.api_version()), ("kind", rt.kind.clone())] {
        match fields.get(field).and_then(Value::as_str) {
            Some(given) if given != expected => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({given}) does not match the expected {field} ({expected})"
                )));
            }
            _ => {
                fields.insert(field.into(), Value::String(expected));
            }
        }
    }
    Ok(())
}

fn metadata_mut(obj: &mut Value) -> ApiResult<&mut Map<String, Value>> {
    let fields = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    fields
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

fn set_namespace(
    rt: &ResourceType,
    meta: &mut Map<String, Value>,
    namespace: Option<&str>,
) -> ApiResult<()> {
    if !rt.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let ns = namespace.unwrap_or("default");
    match meta.get("namespace").and_then(Value::as_str) {
        Some(given) if !given.is_empty() && given != ns => Err(ApiError::bad_request(format!(
            "the namespace of the provided object ({given}) does not match the namespace sent on the request ({ns})"
        ))),
        _ => {
            meta.insert("namespace".into(), Value::String(ns.to_owned()));
            Ok(())
        }
    }
}

/// A DNS subdomain: lower-case alphanumerics, `-` and `.`, alphanumeric at both ends.
fn validate_name(rt: &ResourceType, name: &str) -> ApiResult<()> {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = name.len() <= 253
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{} \"{name}\" is invalid: metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of \
             lower case alphanumeric characters, '-' or '.'",
            rt.kind
        )))
    }
}

fn finalizers(obj: &Value) -> Vec<&str> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The object without metadata and status: what bumps `generation` when it changes.
fn spec_of(obj: &Value) -> Value {
    let mut rest = obj.clone();
    if let Some(fields) = rest.as_object_mut() {
        fields.remove("metadata");
        fields.remove("status");
    }
    rest
}

/// An update's preconditions on the stored object: 422 for a custom resource's update
/// without a resourceVersion, 409 for another resourceVersion or uid. Returns the stored
/// resourceVersion.
fn check_update_preconditions(
    rt: &ResourceType,
    name: &str,
    meta: &Map<String, Value>,
    existing: &Value,
) -> ApiResult<String> {
    let current_rv = existing["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let stale_rv = meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty() && rv != current_rv);
    let other_uid = meta
        .get("uid")
        .and_then(Value::as_str)
        .is_some_and(|u| !u.is_empty() && Some(u) != existing["metadata"]["uid"].as_str());
    let missing_rv = meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    if rt.custom && missing_rv {
        // Custom resources take no unconditional update, as on a real server.
        return Err(ApiError::invalid(format!(
            "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: \
             must be specified for an update",
            rt.kind
        )));
    }
    if stale_rv || other_uid {
        return Err(ApiError::conflict(
            &rt.qualified(),
            &rt.group,
            &rt.plural,
            name,
        ));
    }
    Ok(current_rv)
}

/// A status update's result: the stored object with `obj`'s status (none if it has none).
fn with_status_of(existing: &Value, obj: &Value) -> Value {
    let mut next = existing.clone();
    match obj.get("status") {
        Some(status) => next["status"] = status.clone(),
        None => {
            next.as_object_mut()
                .expect("stored objects are objects")
                .remove("status");
        }
    }
    next
}

/// A full update's result: `obj` under the URL's name, with the server-owned metadata of
/// the stored object and, where a status subresource owns it, the stored status.
fn replacement(
    rt: &ResourceType,
    name: &str,
    existing: &Value,
    mut obj: Value,
) -> ApiResult<Value> {
    let old_meta = &existing["metadata"];
    let meta = metadata_mut(&mut obj)?;
    meta.insert("name".into(), Value::String(name.to_owned()));
    for server_owned in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(server_owned) {
            Some(v) => meta.insert(server_owned.into(), v.clone()),
            None => meta.remove(server_owned),
        };
    }
    meta.remove("selfLink");
    if rt.status_subresource {
        // The main resource never changes status; `.../status` does.
        let fields = obj.as_object_mut().expect("checked above");
        match existing.get("status") {
            Some(status) => fields.insert("status".into(), status.clone()),
            None => fields.remove("status"),
        };
    }
    Ok(obj)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A version-4-shaped uid derived from the seed and a counter.
fn uid(seed: u64, n: u64) -> String {
    let hi = splitmix64(seed ^ splitmix64(n));
    let lo = splitmix64(hi ^ n);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xfff,
        0x8000 | ((lo >> 48) & 0x3fff),
        lo & 0xffff_ffff_ffff
    )
}

/// Five characters from the alphabet Kubernetes uses for `generateName`.
fn generated_suffix(seed: u64, n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = splitmix64(seed.rotate_left(17) ^ n);
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// `{rv}.{hex namespace}.{hex name}`: opaque to clients, and free of characters that need escaping.
fn encode_continue(rv: u64, (ns, name): &ObjectKey) -> String {
    format!("{rv}.{}.{}", hex(ns.as_bytes()), hex(name.as_bytes()))
}

fn decode_continue(token: &str) -> Option<(u64, ObjectKey)> {
    let mut parts = token.split('.');
    let rv = parts.next()?.parse().ok()?;
    let ns = unhex(parts.next()?)?;
    let name = unhex(parts.next()?)?;
    parts.next().is_none().then_some((rv, (ns, name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_server::selectors::LabelSelector;

    fn store() -> Store {
        Store::new(
            TimeSource::from_fn(|| k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            StoreConfig {
                history_limit: 100,
                seed: 7,
                service_cluster_ips: None,
            },
        )
    }

    fn lease_type(s: &Store) -> ResourceType {
        s.type_for("coordination.k8s.io/v1", "Lease").unwrap()
    }

    #[test]
    fn a_namespace_carries_its_name_as_a_label_that_no_write_removes() {
        let mut s = store();
        let rt = s.type_for("v1", "Namespace").unwrap();
        let label = |obj: &Value| obj["metadata"]["labels"]["kubernetes.io/metadata.name"].clone();
        assert_eq!(label(&s.get(&rt, None, "default").unwrap()), "default");
        let created = s
            .create(
                &rt,
                None,
                json!({"metadata": {"name": "spur", "labels": {"team": "a"}}}),
            )
            .unwrap();
        assert_eq!(label(&created), "spur");
        assert_eq!(created["metadata"]["labels"]["team"], "a");
        let mut unlabelled = (*created).clone();
        unlabelled["metadata"]["labels"] = json!({});
        let updated = s.update(&rt, None, "spur", unlabelled, false).unwrap();
        assert_eq!(label(&updated), "spur", "an update without it keeps it");
        let patch = json!({"metadata": {"labels": {"kubernetes.io/metadata.name": "other"}}});
        let patched = s
            .patch(&rt, None, "spur", PatchKind::Merge, &patch, false)
            .unwrap();
        assert_eq!(label(&patched), "spur", "a patch cannot rename it");
    }

    #[test]
    fn create_get_conflict_and_noop() {
        let mut s = store();
        let rt = lease_type(&s);
        let created = s
            .create(
                &rt,
                Some("default"),
                json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}),
            )
            .unwrap();
        assert_eq!(created["metadata"]["namespace"], "default");
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(
            s.create(&rt, Some("default"), json!({"metadata": {"name": "l"}}))
                .unwrap_err()
                .code,
            409
        );
        let rv = created["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
        let same = s
            .update(&rt, Some("default"), "l", (*created).clone(), false)
            .unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"],
            rv.as_str(),
            "a no-op keeps the resourceVersion"
        );
        let mut changed = (*created).clone();
        changed["spec"]["holderIdentity"] = json!("b");
        let updated = s
            .update(&rt, Some("default"), "l", changed.clone(), false)
            .unwrap();
        assert_eq!(updated["metadata"]["generation"], 2);
        changed["spec"]["holderIdentity"] = json!("c");
        assert_eq!(
            s.update(&rt, Some("default"), "l", changed, false)
                .unwrap_err()
                .reason,
            "Conflict"
        );
    }

    #[test]
    fn paging_walks_every_match_once() {
        let mut s = store();
        let rt = s.type_for("v1", "Node").unwrap();
        for i in 0..7 {
            let labels = if i % 2 == 0 {
                json!({"even": "yes"})
            } else {
                json!({})
            };
            s.create(
                &rt,
                None,
                json!({"metadata": {"name": format!("n{i}"), "labels": labels}}),
            )
            .unwrap();
        }
        let filter = Filter {
            labels: LabelSelector::parse("even").unwrap(),
            ..Filter::default()
        };
        let mut names = Vec::new();
        let mut token = None;
        let mut pages = 0;
        loop {
            let page = s.list(&rt, &filter, Some(3), token.as_deref()).unwrap();
            pages += 1;
            names.extend(
                page.items
                    .iter()
                    .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()),
            );
            match page.continue_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(names, ["n0", "n2", "n4", "n6"]);
        assert_eq!(pages, 2);
    }

    #[test]
    fn history_limit_expires_old_versions() {
        let mut s = store();
        let rt = lease_type(&s);
        let start = s.resource_version();
        for i in 0..150 {
            s.create(
                &rt,
                Some("default"),
                json!({"metadata": {"name": format!("l{i}")}}),
            )
            .unwrap();
        }
        assert_eq!(s.changes_after(&rt.key(), start).unwrap_err().code, 410);
        let recent = s.resource_version() - 10;
        assert_eq!(s.changes_after(&rt.key(), recent).unwrap().len(), 10);
    }

    #[test]
    fn real_server_refusals() {
        let mut s = store();
        let lease = lease_type(&s);
        let missing_ns = s.create(&lease, Some("nowhere"), json!({"metadata": {"name": "l"}}));
        assert_eq!(missing_ns.unwrap_err().code, 404);
        let with_rv = json!({"metadata": {"name": "l", "resourceVersion": "3"}});
        assert_eq!(
            s.create(&lease, Some("default"), with_rv).unwrap_err().code,
            400
        );

        let held = json!({"metadata": {"name": "h", "finalizers": ["a"]}});
        s.create(&lease, Some("default"), held).unwrap();
        let deleting = s
            .delete(&lease, Some("default"), "h", &Preconditions::default())
            .unwrap();
        let mut more = (*deleting).clone();
        more["metadata"]["finalizers"] = json!(["a", "b"]);
        let err = s
            .update(&lease, Some("default"), "h", more, false)
            .unwrap_err();
        assert_eq!(err.code, 422, "{err}");

        let crd = json!({"metadata": {"name": "ks.g"}, "spec": {"group": "g", "scope": "Cluster",
            "names": {"kind": "K", "plural": "ks"}, "versions": [{"name": "v1", "served": true}]}});
        let crd_type = s
            .type_for("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            .unwrap();
        s.create(&crd_type, None, crd).unwrap();
        let k = s.type_for("g/v1", "K").expect("the CRD serves K");
        s.create(
            &k,
            None,
            json!({"metadata": {"name": "k"}, "spec": {"a": 1}}),
        )
        .unwrap();
        let unconditional = json!({"metadata": {"name": "k"}, "spec": {"a": 2}});
        assert_eq!(
            s.update(&k, None, "k", unconditional, false)
                .unwrap_err()
                .code,
            422
        );
    }

    #[test]
    fn uids_are_deterministic_and_distinct() {
        assert_eq!(uid(1, 2), uid(1, 2));
        assert_ne!(uid(1, 2), uid(1, 3));
        assert_ne!(uid(1, 2), uid(2, 2));
        assert_eq!(uid(1, 2).len(), 36);
    }
}
