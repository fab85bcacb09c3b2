//! A pod's volumes made on the host before its containers start: configMap, secret,
//! downwardAPI and projected volumes written as files, emptyDir a fresh directory, a
//! persistentVolumeClaim its bound directory, hostPath the host's own; and, as the
//! ServiceAccount admission plugin adds to every pod, the service-account token, CA and
//! namespace at `/var/run/secrets/kubernetes.io/serviceaccount`.
//!
//! Files are written at the pod's first start and brought up to date while it runs
//! ([`keep_fresh`]), as the kubelet's periodic sync does: in place, one file at a time, so
//! a container's bind of a volume's directory sees an edit, and a `subPath` bind of one of
//! its files (a bind of the old file) does not, as in Kubernetes.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, PersistentVolumeClaim, Pod, Secret, Volume,
};

use super::mounts::Bind;
use super::pod_state::PodRun;
use super::{KubeletConfig, ServiceAccountIssuer};

/// Where the ServiceAccount admission plugin mounts a pod's API credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The volume name the credentials get (a real cluster's `kube-api-access-<random>`).
const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access";

/// A volume file's mode when neither the item nor `defaultMode` sets one (0644, the API's).
const DEFAULT_MODE: u32 = 0o644;

/// What a pod's volumes are made from.
pub struct VolumeSources<'a> {
    pub client: &'a kube::Client,
    /// The pod's directory on the host; volumes go to `<dir>/volumes/<name>`.
    pub pod_dir: &'a Path,
    /// Where bound claims live: `<claims_dir>/<namespace>/<claim>`.
    pub claims_dir: &'a Path,
    pub service_accounts: Option<&'a ServiceAccountIssuer>,
}

/// Each volume's host path, by volume name; `Err` is a `FailedMount` message.
pub async fn prepare(
    sources: &VolumeSources<'_>,
    pod: &Pod,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    let mut paths = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        let path = prepare_one(sources, pod, namespace, volume)
            .await
            .map_err(|e| {
                format!(
                    "MountVolume.SetUp failed for volume \"{}\": {e}",
                    volume.name
                )
            })?;
        if let Some(gid) = fs_group
            && volume.host_path.is_none()
        {
            apply_fs_group(&path, gid as u32)
                .map_err(|e| format!("fsGroup on {}: {e}", volume.name))?;
        }
        paths.insert(volume.name.clone(), path);
    }
    if let Some(issuer) = sources.service_accounts
        && automounts(pod)
    {
        let dir = sources.pod_dir.join("volumes").join(SERVICE_ACCOUNT_VOLUME);
        write_service_account(issuer, pod, namespace, &dir)?;
        paths.insert(SERVICE_ACCOUNT_VOLUME.to_owned(), dir);
    }
    Ok(paths)
}

/// Whether the pod gets the ServiceAccount's credentials (`automountServiceAccountToken`
/// unset or true).
fn automounts(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.automount_service_account_token) != Some(false)
}

async fn prepare_one(
    sources: &VolumeSources<'_>,
    pod: &Pod,
    namespace: &str,
    volume: &Volume,
) -> Result<PathBuf, String> {
    let dir = sources.pod_dir.join("volumes").join(&volume.name);
    if let Some(host) = &volume.host_path {
        return host_path(&host.path, host.type_.as_deref());
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        return bound_claim(sources, namespace, &claim.claim_name).await;
    }
    fresh_dir(&dir)?;
    match volume_files(sources, pod, namespace, volume).await? {
        Some(files) => {
            files.sync(&dir)?;
        }
        None if volume.empty_dir.is_some() => {}
        None => return Err("only configMap, secret, downwardAPI, projected, emptyDir, hostPath and persistentVolumeClaim volumes are supported".into()),
    }
    Ok(dir)
}

/// The files of a configMap, secret, downwardAPI or projected volume as its sources are
/// now; `None` for a volume of another kind.
async fn volume_files(
    sources: &VolumeSources<'_>,
    pod: &Pod,
    namespace: &str,
    volume: &Volume,
) -> Result<Option<Files>, String> {
    let mut files = Files::default();
    if let Some(source) = &volume.config_map {
        let mode = source.default_mode;
        let data = config_map_data(sources.client, namespace, &source.name).await?;
        files.add_keys(
            data,
            source.items.as_deref(),
            mode,
            source.optional,
            "configmap",
            &source.name,
        )?;
    } else if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = secret_data(sources.client, namespace, &name).await?;
        files.add_keys(
            data,
            source.items.as_deref(),
            source.default_mode,
            source.optional,
            "secret",
            &name,
        )?;
    } else if let Some(source) = &volume.downward_api {
        for item in source.items.iter().flatten() {
            files.add_downward(pod, item, source.default_mode)?;
        }
    } else if let Some(source) = &volume.projected {
        files.add_projected(sources, pod, namespace, source).await?;
    } else {
        return Ok(None);
    }
    Ok(Some(files))
}

/// The files of a written volume: relative path, bytes, mode.
#[derive(Default)]
struct Files(Vec<(PathBuf, Vec<u8>, u32)>);

impl Files {
    /// A ConfigMap's or Secret's keys (all, or `items`); a missing object or key fails
    /// unless `optional`.
    fn add_keys(
        &mut self,
        data: Option<BTreeMap<String, Vec<u8>>>,
        items: Option<&[KeyToPath]>,
        default_mode: Option<i32>,
        optional: Option<bool>,
        kind: &str,
        name: &str,
    ) -> Result<(), String> {
        let mode = mode_of(None, default_mode);
        let Some(data) = data else {
            return if optional == Some(true) {
                Ok(())
            } else {
                Err(format!("{kind} \"{name}\" not found"))
            };
        };
        let Some(items) = items else {
            self.0
                .extend(data.into_iter().map(|(k, v)| (PathBuf::from(k), v, mode)));
            return Ok(());
        };
        for item in items {
            match data.get(&item.key) {
                Some(bytes) => {
                    self.push(&item.path, bytes.clone(), mode_of(item.mode, default_mode))?
                }
                None if optional == Some(true) => {}
                None => return Err(format!("{kind} \"{name}\" has no key \"{}\"", item.key)),
            }
        }
        Ok(())
    }

    fn add_downward(
        &mut self,
        pod: &Pod,
        item: &k8s_openapi::api::core::v1::DownwardAPIVolumeFile,
        default_mode: Option<i32>,
    ) -> Result<(), String> {
        let field = item
            .field_ref
            .as_ref()
            .ok_or_else(|| format!("downwardAPI {}: only fieldRef is supported", item.path))?;
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let value = super::containers::field_value(pod, &field.field_path, &ip)?;
        self.push(
            &item.path,
            value.into_bytes(),
            mode_of(item.mode, default_mode),
        )
    }

    async fn add_projected(
        &mut self,
        sources: &VolumeSources<'_>,
        pod: &Pod,
        namespace: &str,
        projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<(), String> {
        let mode = projected.default_mode;
        for source in projected.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                let data = config_map_data(sources.client, namespace, &cm.name).await?;
                self.add_keys(
                    data,
                    cm.items.as_deref(),
                    mode,
                    cm.optional,
                    "configmap",
                    &cm.name,
                )?;
            } else if let Some(secret) = &source.secret {
                let data = secret_data(sources.client, namespace, &secret.name).await?;
                self.add_keys(
                    data,
                    secret.items.as_deref(),
                    mode,
                    secret.optional,
                    "secret",
                    &secret.name,
                )?;
            } else if let Some(downward) = &source.downward_api {
                for item in downward.items.iter().flatten() {
                    self.add_downward(pod, item, mode)?;
                }
            } else if let Some(token) = &source.service_account_token {
                let issuer = sources
                    .service_accounts
                    .ok_or("this cluster issues no service-account tokens")?;
                let account = service_account(pod);
                let minted = (issuer.token)(namespace, &account)?;
                self.push(&token.path, minted.into_bytes(), mode_of(None, mode))?;
            }
        }
        Ok(())
    }

    /// One file; a path that is absolute or climbs out with `..` is refused, as the API
    /// refuses it.
    fn push(&mut self, path: &str, bytes: Vec<u8>, mode: u32) -> Result<(), String> {
        let relative = Path::new(path);
        let escapes = relative.is_absolute()
            || relative
                .components()
                .any(|c| c == std::path::Component::ParentDir);
        if escapes || path.is_empty() {
            return Err(format!(
                "volume file path {path:?} must be relative and stay inside"
            ));
        }
        self.0.push((relative.to_owned(), bytes, mode));
        Ok(())
    }

    /// Makes `dir` hold exactly these files: each one that differs written beside its
    /// place and renamed over it (a reader sees the old file or the new, never half), and
    /// the files no longer wanted removed. Whether anything changed.
    fn sync(&self, dir: &Path) -> Result<bool, String> {
        let mut changed = false;
        for (path, bytes, mode) in &self.0 {
            let file = dir.join(path);
            let same = std::fs::read(&file).is_ok_and(|old| old == *bytes)
                && std::fs::metadata(&file).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode);
            if same {
                continue;
            }
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
            }
            replace_file(&file, bytes, *mode)?;
            changed = true;
        }
        let wanted: Vec<PathBuf> = self.0.iter().map(|(p, _, _)| dir.join(p)).collect();
        changed |= remove_unwanted(dir, &wanted)?;
        Ok(changed)
    }
}

/// `file` replaced whole by `bytes` with `mode`, through a temporary name a key cannot have
/// (the API refuses keys that begin with `..`).
fn replace_file(file: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let temporary = file.with_file_name(format!("..writing.{name}"));
    std::fs::write(&temporary, bytes).map_err(|e| io_error(&temporary, e))?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_error(&temporary, e))?;
    std::fs::rename(&temporary, file).map_err(|e| io_error(file, e))
}

/// Removes the files under `dir` that are not `wanted`, and the directories that leaves
/// empty (not `dir`). Whether it removed any.
fn remove_unwanted(dir: &Path, wanted: &[PathBuf]) -> Result<bool, String> {
    let mut removed = false;
    for entry in std::fs::read_dir(dir)
        .map_err(|e| io_error(dir, e))?
        .flatten()
    {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            removed |= remove_unwanted(&path, wanted)?;
            // Only an empty one goes: a directory a wanted file is in stays.
            removed |= std::fs::remove_dir(&path).is_ok();
        } else if !wanted.contains(&path) {
            std::fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
            removed = true;
        }
    }
    Ok(removed)
}

/// When a running pod's volumes were last brought up to date, and the last reason they
/// could not be, so it is reported once.
#[derive(Debug, Default)]
pub struct Freshness {
    pub last: Option<std::time::Instant>,
    pub error: Option<String>,
}

/// Brings a running pod's configMap, secret, downwardAPI and projected volumes up to date
/// once each `volume_refresh`. A source that cannot be read (a ConfigMap deleted) leaves
/// its files as they are, as the kubelet leaves them, and is reported once on stderr.
pub async fn keep_fresh(client: &kube::Client, run: &mut PodRun, config: &KubeletConfig) {
    let Some(paths) = &run.volumes else { return };
    let freshness = &mut run.freshness;
    if freshness
        .last
        .is_some_and(|t| t.elapsed() < config.volume_refresh)
    {
        return;
    }
    freshness.last = Some(std::time::Instant::now());
    let sources = VolumeSources {
        client,
        pod_dir: &run.dir,
        claims_dir: &config.claims_dir,
        service_accounts: config.service_accounts.as_ref(),
    };
    let error = refresh(&sources, &run.pod, paths).await.err();
    if error.is_some() && error != freshness.error {
        let pod = format!("{}/{}", run.namespace, run.name);
        eprintln!(
            "kubelet: volumes of {pod}: {}",
            error.as_deref().unwrap_or_default()
        );
    }
    freshness.error = error;
}

/// One pass of [`keep_fresh`] over every volume; `Err` names the first that failed.
async fn refresh(
    sources: &VolumeSources<'_>,
    pod: &Pod,
    paths: &BTreeMap<String, PathBuf>,
) -> Result<(), String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    let mut first_error = None;
    for volume in spec.volumes.iter().flatten() {
        let Some(dir) = paths.get(&volume.name) else {
            continue;
        };
        let updated = match volume_files(sources, pod, namespace, volume).await {
            Ok(Some(files)) => files.sync(dir),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        let result = updated.and_then(|changed| match fs_group {
            Some(gid) if changed => apply_fs_group(dir, gid as u32).map_err(|e| io_error(dir, e)),
            _ => Ok(()),
        });
        if let Err(e) = result {
            first_error.get_or_insert(format!("volume \"{}\": {e}", volume.name));
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn mode_of(item: Option<i32>, default_mode: Option<i32>) -> u32 {
    item.or(default_mode)
        .map_or(DEFAULT_MODE, |m| (m as u32) & 0o7777)
}

fn service_account(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// The credentials kube-rs's and client-go's in-cluster configuration read.
fn write_service_account(
    issuer: &ServiceAccountIssuer,
    pod: &Pod,
    namespace: &str,
    dir: &Path,
) -> Result<(), String> {
    let token = (issuer.token)(namespace, &service_account(pod)).map_err(|e| {
        format!("MountVolume.SetUp failed for volume \"{SERVICE_ACCOUNT_VOLUME}\": {e}")
    })?;
    fresh_dir(dir)?;
    let mut files = Files::default();
    files.push("token", token.into_bytes(), DEFAULT_MODE)?;
    files.push("ca.crt", issuer.ca_pem.clone().into_bytes(), DEFAULT_MODE)?;
    files.push("namespace", namespace.as_bytes().to_vec(), DEFAULT_MODE)?;
    files.sync(dir).map(|_| ())
}

/// A ConfigMap's keys (`data` and `binaryData`) as bytes; `None` if it does not exist.
async fn config_map_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let found: Option<ConfigMap> = get_opt(client, namespace, name).await?;
    Ok(found.map(|cm| {
        let text = (cm.data.into_iter().flatten()).map(|(k, v)| (k, v.into_bytes()));
        let binary = (cm.binary_data.into_iter().flatten()).map(|(k, v)| (k, v.0));
        text.chain(binary).collect()
    }))
}

/// A Secret's keys as bytes, `data` over `stringData` for a key in both, as the env's
/// `secretKeyRef` reads them (`containers::secret_key`); `None` if it does not exist.
async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let found: Option<Secret> = get_opt(client, namespace, name).await?;
    Ok(found.map(|s| {
        let strings = (s.string_data.into_iter().flatten()).map(|(k, v)| (k, v.into_bytes()));
        let data = (s.data.into_iter().flatten()).map(|(k, v)| (k, v.0));
        strings.chain(data).collect()
    }))
}

/// A namespaced object, or `None` if it does not exist; `Err` is the API server's answer.
async fn get_opt<K>(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = kube::Api::<K>::namespaced(client.clone(), namespace);
    api.get_opt(name).await.map_err(|e| e.to_string())
}

/// A claim's directory, once the claim is Bound.
async fn bound_claim(
    sources: &VolumeSources<'_>,
    namespace: &str,
    claim: &str,
) -> Result<PathBuf, String> {
    let found: Option<PersistentVolumeClaim> = get_opt(sources.client, namespace, claim).await?;
    let found = found.ok_or_else(|| format!("persistentvolumeclaim \"{claim}\" not found"))?;
    let phase = found.status.and_then(|s| s.phase).unwrap_or_default();
    if phase != "Bound" {
        return Err(format!(
            "persistentvolumeclaim \"{claim}\" is not bound (phase {phase:?})"
        ));
    }
    let dir = sources.claims_dir.join(namespace).join(claim);
    if !dir.is_dir() {
        return Err(format!(
            "the directory {} of claim \"{claim}\" is missing",
            dir.display()
        ));
    }
    Ok(dir)
}

/// A hostPath volume, checked (or made) as its `type` says.
fn host_path(path: &str, kind: Option<&str>) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    match kind.unwrap_or_default() {
        "" => {}
        "DirectoryOrCreate" => std::fs::create_dir_all(&path).map_err(|e| io_error(&path, e))?,
        "Directory" if path.is_dir() => {}
        "FileOrCreate" if !path.exists() => {
            std::fs::write(&path, b"").map_err(|e| io_error(&path, e))?;
        }
        "FileOrCreate" | "File" if path.is_file() => {}
        other => {
            return Err(format!(
                "hostPath type check failed: {} is not a {other}",
                path.display()
            ));
        }
    }
    Ok(path)
}

/// `<dir>` emptied and made again, so a restarted kubelet does not reuse stale files.
fn fresh_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io_error(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))
}

/// `fsGroup`: everything in the volume owned by the group, group-writable, directories
/// set-group-ID so new files inherit it, as the kubelet does.
fn apply_fs_group(path: &Path, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, None, Some(gid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    let extra = if meta.is_dir() { 0o2070 } else { 0o060 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | extra))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            apply_fs_group(&entry?.path(), gid)?;
        }
    }
    Ok(())
}

fn io_error(path: &Path, error: std::io::Error) -> String {
    format!("{}: {error}", path.display())
}

/// A container's binds: its volumeMounts (with `subPath`), and the credentials at
/// [`SERVICE_ACCOUNT_DIR`] unless it mounts something there itself.
pub fn binds(
    container: &Container,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Vec<Bind>, String> {
    let mut binds = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let source = volumes
            .get(&mount.name)
            .ok_or_else(|| format!("volumeMount {} names no volume of the pod", mount.name))?;
        let source = match mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
            Some(sub) => source.join(sub),
            None => source.clone(),
        };
        binds.push(Bind {
            source,
            target: PathBuf::from(&mount.mount_path),
            read_only: mount.read_only == Some(true),
        });
    }
    let own = binds
        .iter()
        .any(|b| b.target == Path::new(SERVICE_ACCOUNT_DIR));
    if let Some(dir) = volumes.get(SERVICE_ACCOUNT_VOLUME)
        && !own
    {
        binds.push(Bind {
            source: dir.clone(),
            target: PathBuf::from(SERVICE_ACCOUNT_DIR),
            read_only: true,
        });
    }
    Ok(binds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_path_that_leaves_its_volume_is_refused() {
        let mut files = Files::default();
        assert!(files.push("../etc/passwd", Vec::new(), 0o644).is_err());
        assert!(files.push("/etc/passwd", Vec::new(), 0o644).is_err());
        assert!(files.push("conf/spur.conf", Vec::new(), 0o644).is_ok());
    }

    #[test]
    fn items_pick_keys_and_a_missing_key_names_itself() {
        let data: BTreeMap<String, Vec<u8>> = [("a".to_owned(), b"1".to_vec())].into();
        let item = |key: &str| KeyToPath {
            key: key.into(),
            path: format!("dir/{key}"),
            mode: Some(0o600),
        };
        let mut files = Files::default();
        files
            .add_keys(
                Some(data.clone()),
                Some(&[item("a")]),
                None,
                None,
                "configmap",
                "c",
            )
            .expect("present key");
        assert_eq!(
            files.0,
            vec![(PathBuf::from("dir/a"), b"1".to_vec(), 0o600)]
        );
        let missing =
            Files::default().add_keys(Some(data), Some(&[item("b")]), None, None, "configmap", "c");
        assert_eq!(missing, Err("configmap \"c\" has no key \"b\"".into()));
        let absent = Files::default().add_keys(None, None, None, None, "secret", "s");
        assert_eq!(absent, Err("secret \"s\" not found".into()));
        assert!(
            Files::default()
                .add_keys(None, None, None, Some(true), "secret", "s")
                .is_ok()
        );
    }

    #[test]
    fn a_container_gets_the_credentials_unless_it_mounts_its_own() {
        let volumes: BTreeMap<String, PathBuf> = [
            ("config".to_owned(), PathBuf::from("/v/config")),
            (SERVICE_ACCOUNT_VOLUME.to_owned(), PathBuf::from("/v/sa")),
        ]
        .into();
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "volumeMounts": [{"name": "config", "mountPath": "/etc/spur", "readOnly": true}],
        }))
        .expect("container");
        let binds = binds(&container, &volumes).expect("binds");
        assert_eq!(binds.len(), 2);
        assert_eq!(binds[0].target, PathBuf::from("/etc/spur"));
        assert!(binds[0].read_only);
        assert_eq!(binds[1].target, PathBuf::from(SERVICE_ACCOUNT_DIR));
        let stray: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "volumeMounts": [{"name": "nope", "mountPath": "/x"}],
        }))
        .expect("container");
        assert!(binds_err(&stray, &volumes).contains("nope"));
    }

    #[test]
    fn a_sync_rewrites_changed_files_in_place_and_drops_removed_keys() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = std::env::temp_dir().join(format!("spur-volume-sync-{}", std::process::id()));
        fresh_dir(&dir).expect("dir");
        let files = |entries: &[(&str, &str)]| {
            let mut files = Files::default();
            for (path, text) in entries {
                files
                    .push(path, text.as_bytes().to_vec(), 0o644)
                    .expect("path");
            }
            files
        };
        let first = files(&[("greeting", "hello"), ("nested/old", "x")]);
        assert!(first.sync(&dir).expect("first"));
        let inode = std::fs::metadata(&dir).expect("dir").ino();
        let pinned = std::fs::File::open(dir.join("greeting")).expect("a subPath's view");
        assert!(!first.sync(&dir).expect("again"), "nothing changed");
        assert!(files(&[("greeting", "goodbye")]).sync(&dir).expect("edit"));
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).ok();
        assert_eq!(read("greeting").as_deref(), Some("goodbye"));
        assert_eq!(read("nested/old"), None);
        assert!(!dir.join("nested").exists(), "an emptied directory goes");
        assert_eq!(
            std::fs::metadata(&dir).expect("dir").ino(),
            inode,
            "in place"
        );
        let old = std::io::read_to_string(pinned).expect("old file");
        assert_eq!(old, "hello", "a bind of the old file keeps the old content");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    fn binds_err(container: &Container, volumes: &BTreeMap<String, PathBuf>) -> String {
        binds(container, volumes).expect_err("refused")
    }
}
