//! The builder that a task's setup and the perturbations write an instance through.

use super::base::{BaseView, Meta};
use super::id::rng_for;
use super::layer::{Entry, Layer};
use super::paths::{clean_path, resolve_link, DEFAULT_PATH};
use super::plan::Resources;
use super::runtime::{RuntimeSettings, StartStep};
use super::task_setup::TaskSetup;
use super::InstanceError;
use std::collections::BTreeSet;

/// Builds an instance: the task's setup and the perturbations write into the layer and the
/// runtime settings; reads see the layer first, then the base.
pub struct Builder<'a> {
    pub base: &'a BaseView,
    pub layer: Layer,
    pub runtime: RuntimeSettings,
    pub resources: Resources,
    /// The task being built, once its setup ran (perturbations may aim at its files).
    pub task: Option<TaskSetup>,
    seed: u64,
}

impl<'a> Builder<'a> {
    pub fn new(base: &'a BaseView, seed: u64, resources: Resources) -> Self {
        Self {
            base,
            layer: Layer::default(),
            runtime: RuntimeSettings::default(),
            resources,
            task: None,
            seed,
        }
    }

    /// The instance seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A generator for one purpose (a perturbation's name and index), independent of others.
    pub fn rng(&self, purpose: &str) -> rand_chacha::ChaCha8Rng {
        rng_for(self.seed, purpose)
    }

    fn hidden_by_layer(&self, path: &str) -> bool {
        // A whiteout (or a file) on an ancestor hides the base's path.
        let mut cur = String::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            cur.push('/');
            cur.push_str(c);
            if cur.len() == path.len() {
                break;
            }
            match self.layer.entries.get(&cur) {
                Some(Entry::Whiteout | Entry::File { .. } | Entry::Symlink { .. }) => return true,
                Some(Entry::Dir { opaque: true, .. }) => return true,
                _ => {}
            }
        }
        false
    }

    /// Metadata as the sandbox will see it.
    pub fn meta(&self, path: &str) -> Option<Meta> {
        let path = clean_path(path).ok()?;
        match self.layer.entries.get(&path) {
            Some(Entry::Whiteout) => None,
            Some(Entry::File {
                data,
                mode,
                uid,
                gid,
            }) => Some(Meta {
                is_dir: false,
                is_symlink: false,
                mode: *mode,
                uid: *uid,
                gid: *gid,
                size: data.len() as u64,
            }),
            Some(Entry::Dir { mode, uid, gid, .. }) => Some(Meta {
                is_dir: true,
                is_symlink: false,
                mode: *mode,
                uid: *uid,
                gid: *gid,
                size: 0,
            }),
            Some(Entry::Symlink { .. }) => Some(Meta {
                is_dir: false,
                is_symlink: true,
                mode: 0o777,
                uid: 0,
                gid: 0,
                size: 0,
            }),
            None if self.hidden_by_layer(&path) => None,
            None => self.base.meta(&path),
        }
    }

    pub fn exists(&self, path: &str) -> bool {
        self.meta(path).is_some()
    }

    /// Contents of a regular file as the sandbox will see it (symlinks in the last component
    /// are followed once, within the rootfs).
    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        let path = clean_path(path).ok()?;
        match self.layer.entries.get(&path) {
            Some(Entry::File { data, .. }) => Some(data.clone()),
            Some(Entry::Symlink { target }) => {
                let t = resolve_link(&path, target);
                (t != path).then(|| self.read(&t)).flatten()
            }
            Some(_) => None,
            None if self.hidden_by_layer(&path) => None,
            None => {
                if let Some(t) = self.base.read_link(&path) {
                    let t = resolve_link(&path, &t);
                    return (t != path).then(|| self.read(&t)).flatten();
                }
                self.base.read(&path)
            }
        }
    }

    /// Names in a directory as the sandbox will see it (sorted).
    pub fn list(&self, path: &str) -> Vec<String> {
        let Ok(path) = clean_path(path) else {
            return self.base.list("/");
        };
        let mut names: BTreeSet<String> = if self.hidden_by_layer(&path)
            || matches!(
                self.layer.entries.get(&path),
                Some(Entry::Dir { opaque: true, .. })
            ) {
            BTreeSet::new()
        } else {
            self.base.list(&path).into_iter().collect()
        };
        let prefix = format!("{path}/");
        for (p, e) in self.layer.entries.range(prefix.clone()..) {
            let Some(rest) = p.strip_prefix(&prefix) else {
                break;
            };
            if let Some((dir, _)) = rest.split_once('/') {
                // An implicit parent directory of something the layer writes.
                names.insert(dir.to_string());
                continue;
            }
            if matches!(e, Entry::Whiteout) {
                names.remove(rest);
            } else {
                names.insert(rest.to_string());
            }
        }
        names.into_iter().collect()
    }

    /// Find an executable by name in a `PATH`-style list, as the sandbox would.
    pub fn which(&self, tool: &str, path_var: &str) -> Option<String> {
        path_var.split(':').filter(|d| !d.is_empty()).find_map(|d| {
            let p = format!("{}/{tool}", d.trim_end_matches('/'));
            let m = self.meta(&p)?;
            (m.is_symlink || (!m.is_dir && m.mode & 0o111 != 0)).then_some(p)
        })
    }

    pub fn write(
        &mut self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Result<(), InstanceError> {
        self.write_owned(path, data, mode, 0, 0)
    }

    pub fn write_owned(
        &mut self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), InstanceError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        self.layer.entries.insert(
            path,
            Entry::File {
                data: data.into(),
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<(), InstanceError> {
        self.mkdir_owned(path, mode, 0, 0)
    }

    pub fn mkdir_owned(
        &mut self,
        path: &str,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), InstanceError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        let opaque = matches!(self.layer.entries.get(&path), Some(Entry::Whiteout))
            || matches!(
                self.layer.entries.get(&path),
                Some(Entry::Dir { opaque: true, .. })
            );
        self.layer.entries.insert(
            path,
            Entry::Dir {
                mode,
                uid,
                gid,
                opaque,
            },
        );
        Ok(())
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), InstanceError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        self.layer.entries.insert(
            path,
            Entry::Symlink {
                target: target.into(),
            },
        );
        Ok(())
    }

    /// Delete a path (and everything under it) from the sandbox's view.
    pub fn remove(&mut self, path: &str) -> Result<(), InstanceError> {
        let path = clean_path(path)?;
        let prefix = format!("{path}/");
        self.layer.entries.retain(|p, _| !p.starts_with(&prefix));
        if self.base.meta(&path).is_some() && !self.hidden_by_layer(&path) {
            self.layer.entries.insert(path, Entry::Whiteout);
        } else {
            self.layer.entries.remove(&path);
        }
        Ok(())
    }

    /// Change the mode of an existing path (copying a base file up into the layer).
    pub fn chmod(&mut self, path: &str, mode: u32) -> Result<(), InstanceError> {
        let p = clean_path(path)?;
        let m = self.meta(&p).ok_or_else(|| InstanceError::BadPath {
            path: p.clone(),
            reason: "does not exist".into(),
        })?;
        match self.layer.entries.get_mut(&p) {
            Some(Entry::File { mode: m0, .. } | Entry::Dir { mode: m0, .. }) => {
                *m0 = mode;
                Ok(())
            }
            _ if m.is_dir => self.mkdir_owned(&p, mode, m.uid, m.gid),
            _ if m.is_symlink => Err(InstanceError::BadPath {
                path: p,
                reason: "is a symbolic link".into(),
            }),
            _ => {
                let data = self.read(&p).ok_or_else(|| InstanceError::BadPath {
                    path: p.clone(),
                    reason: "cannot be read".into(),
                })?;
                self.write_owned(&p, data, mode, m.uid, m.gid)
            }
        }
    }

    /// A parent that the layer deleted becomes an (opaque) directory again when something is
    /// written under it.
    fn unhide_parents(&mut self, path: &str) {
        let mut cur = String::new();
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        for c in &comps[..comps.len().saturating_sub(1)] {
            cur.push('/');
            cur.push_str(c);
            if let Some(Entry::Whiteout | Entry::File { .. } | Entry::Symlink { .. }) =
                self.layer.entries.get(&cur)
            {
                self.layer.entries.insert(
                    cur.clone(),
                    Entry::Dir {
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        opaque: true,
                    },
                );
            }
        }
    }

    /// Add a step run at every episode start.
    pub fn on_start(&mut self, by: &str, shell: impl Into<String>) {
        self.runtime.start.push(StartStep {
            by: by.into(),
            shell: shell.into(),
        });
    }

    /// The `PATH` the sandbox's commands will get.
    pub fn path_var(&self) -> String {
        match self.runtime.env.get("PATH") {
            Some(Some(p)) => p.clone(),
            Some(None) => String::new(),
            None => DEFAULT_PATH.into(),
        }
    }
}
