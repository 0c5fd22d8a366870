//! Who a sample belongs to beyond its process: container, Kubernetes pod and QoS class, systemd
//! unit, all read from cgroup paths (docker, containerd, cri-o, podman and systemd naming), and
//! the `--group-by` key that becomes the root frame of every stack.
use std::collections::HashMap;

use super::{Process, Profile, Sample};

/// What a cgroup path says about its owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Container id (64 hex digits) from `docker-<id>.scope`, `cri-containerd-<id>.scope`,
    /// `crio-<id>.scope`, `libpod-<id>.scope` or a bare `<id>` component.
    pub container: Option<String>,
    /// Kubernetes pod UID (dashed form) from a `pod<uid>` component.
    pub pod: Option<String>,
    /// Kubernetes QoS class: guaranteed, burstable or besteffort.
    pub qos: Option<&'static str>,
    /// The innermost systemd unit (`*.service` or `*.scope`).
    pub unit: Option<String>,
}

/// Parses a cgroup path such as
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`.
pub fn owner(path: &str) -> Owner {
    let mut o = Owner::default();
    let mut in_kubepods = false;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        let stem = comp
            .strip_suffix(".slice")
            .or_else(|| comp.strip_suffix(".scope"))
            .unwrap_or(comp);
        if stem == "kubepods" || stem.starts_with("kubepods-") || stem.starts_with("kubepods_") {
            in_kubepods = true;
        }
        if in_kubepods {
            if stem.contains("besteffort") {
                o.qos = Some("besteffort");
            } else if stem.contains("burstable") {
                o.qos = Some("burstable");
            }
        }
        if let Some(uid) = pod_uid(stem) {
            o.pod = Some(uid);
            o.qos.get_or_insert("guaranteed");
        }
        if let Some(id) = container_id(stem) {
            o.container = Some(id);
        }
        if [".service", ".scope"].iter().any(|s| comp.ends_with(s)) {
            o.unit = Some(comp.to_owned());
        }
    }
    if o.pod.is_none() {
        o.qos = None;
    }
    o
}

/// `pod<uid>` at the end of a component (`kubepods-burstable-pod<uid>`, `pod<uid>`), with the
/// systemd driver's underscores turned back into dashes.
fn pod_uid(stem: &str) -> Option<String> {
    let at = stem.rfind("pod")?;
    let uid = stem[at + 3..].replace('_', "-");
    let ok = uid.len() == 36
        && uid.chars().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    ok.then_some(uid)
}

fn container_id(stem: &str) -> Option<String> {
    let id = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
    ]
    .iter()
    .find_map(|p| stem.strip_prefix(p))
    .unwrap_or(stem);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// The root frame of every stack in folded output and flame graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum GroupBy {
    /// The thread's comm (as perf and inferno do).
    #[default]
    Comm,
    /// `comm [pid]`.
    Pid,
    /// The cgroup path (cgroup v2, else the v1 memory hierarchy).
    Cgroup,
    /// The container id (12 digits), or `[host]`.
    Container,
    /// The pod UID, or `[no pod]`.
    Pod,
    /// No root frame.
    None,
}

/// Computes the `--group-by` root label of samples.
pub struct Grouper<'a> {
    profile: &'a Profile,
    group: GroupBy,
    processes: HashMap<u32, &'a Process>,
    cgroups: HashMap<u64, &'a str>,
}

impl<'a> Grouper<'a> {
    pub fn new(profile: &'a Profile, group: GroupBy) -> Self {
        Self {
            profile,
            group,
            processes: profile.processes.iter().map(|p| (p.pid, p)).collect(),
            cgroups: profile
                .cgroups
                .iter()
                .map(|c| (c.id, c.path.as_str()))
                .collect(),
        }
    }

    /// The root frame for `s`; None with `GroupBy::None`.
    pub fn label(&self, s: &Sample) -> Option<String> {
        let comm = self.profile.str(s.comm);
        let process = self.processes.get(&s.pid).copied();
        Some(match self.group {
            GroupBy::None => return None,
            GroupBy::Comm => comm.to_owned(),
            GroupBy::Pid => format!("{comm} [{}]", s.pid),
            GroupBy::Cgroup => self.cgroup_path(s, process).to_owned(),
            GroupBy::Container => self
                .owners(s, process)
                .find_map(|o| o.container)
                .map_or_else(|| "[host]".to_owned(), |id| id[..12].to_owned()),
            GroupBy::Pod => self
                .owners(s, process)
                .find_map(|o| Some(format!("pod {} ({})", o.pod?, o.qos.unwrap_or("?"))))
                .unwrap_or_else(|| "[no pod]".to_owned()),
        })
    }

    /// The sample's cgroup v2 path; on hybrid hosts where that is the root, the v1 memory path.
    pub fn cgroup_path(&self, s: &Sample, process: Option<&'a Process>) -> &'a str {
        let v2 = self.cgroups.get(&s.cgroup_id).copied().unwrap_or("");
        if !v2.is_empty() && v2 != "/" {
            return v2;
        }
        match process {
            Some(p) if !p.memory_cgroup.is_empty() => &p.memory_cgroup,
            Some(p) if !p.cgroup.is_empty() => &p.cgroup,
            _ if !v2.is_empty() => v2,
            _ => "[unknown cgroup]",
        }
    }

    /// What each of the sample's cgroup paths says about its owner.
    fn owners(&self, s: &Sample, process: Option<&'a Process>) -> impl Iterator<Item = Owner> {
        let v2 = self.cgroups.get(&s.cgroup_id).copied().unwrap_or("");
        let p = process
            .map(|p| [p.cgroup.as_str(), &p.memory_cgroup, &p.cpu_cgroup])
            .unwrap_or_default();
        std::iter::once(v2).chain(p).map(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c2b9a8d7e6f50413c2b1a0f9e8d7c6b5a49382716051a2b3c4d5e6f708192";

    #[test]
    fn docker_cgroupfs_and_systemd() {
        let o = owner(&format!("/docker/{ID}"));
        assert_eq!(o.container.as_deref(), Some(ID));
        assert_eq!(o.pod, None);
        let o = owner(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(o.container.as_deref(), Some(ID));
        assert_eq!(o.unit, Some(format!("docker-{ID}.scope")));
    }

    #[test]
    fn containerd_under_kubepods_systemd_driver() {
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-{ID}.scope"
        );
        let o = owner(&path);
        assert_eq!(o.container.as_deref(), Some(ID));
        assert_eq!(
            o.pod.as_deref(),
            Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(o.qos, Some("burstable"));
    }

    #[test]
    fn crio_and_cgroupfs_driver_qos_classes() {
        let o = owner(&format!(
            "/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/crio-{ID}"
        ));
        assert_eq!(
            (o.qos, o.container.as_deref()),
            (Some("besteffort"), Some(ID))
        );
        // Guaranteed pods sit directly under kubepods.
        let o = owner(&format!(
            "/kubepods/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/{ID}"
        ));
        assert_eq!(o.qos, Some("guaranteed"));
        assert_eq!(o.container.as_deref(), Some(ID));
    }

    #[test]
    fn systemd_units_and_plain_paths() {
        let o = owner("/system.slice/kubelet.service");
        assert_eq!(o.unit.as_deref(), Some("kubelet.service"));
        assert_eq!(o.container, None);
        let o = owner("/user.slice/user-0.slice/session-3.scope");
        assert_eq!(o.unit.as_deref(), Some("session-3.scope"));
        assert_eq!(owner("/"), Owner::default());
        assert_eq!(
            owner("/process_api/15a99f1461919b7912de4f6c159e85c3"),
            Owner::default()
        );
    }
}
