//! `fix-permissions`: a deploy job that must run as the application user `nobody` fails
//! because of permissions (two of: the script is not executable, the output directory is not
//! writable for `nobody`, an input is unreadable for it, the release directory is closed).
//! The goal is the job's output, not the fix. `verify` reads: the rendered files' exact
//! contents, owned by `nobody`, and the deploy script as shipped. `confirm` runs the job the
//! way the system does: every process killed, the outputs removed, fresh inputs the agent has
//! never seen written into the release and source files (in place: their modes, owners and
//! inodes are the agent's), then the deploy script executed by its own path as uid/gid 65534
//! with no groups and no capabilities (switched by the sandbox, not by a program of the
//! agent's filesystem), from `/`, in the system's environment. It must succeed and write the
//! outputs of the fresh inputs, as nobody: only then do the permissions really let nobody
//! deploy, by the kernel's own checks. Before anything runs, the code that will run must be
//! the system's (see [`system`]).

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Check, Seen, Task, TaskError, TaskSetup, Verdict};
use crate::instance::Builder;
use crate::instance::{sh_quote, DEFAULT_PATH};
use crate::probe::{Confirm, Probe, ProbeError, StatOnce};
use rand::Rng;
use sandbox::protocol::FileKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub struct FixPermissions;

pub const NOBODY: u32 = 65534;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Fault {
    NotExecutable,
    OutputNotWritable,
    InputUnreadable,
    ReleaseDirClosed,
}

const FAULTS: &[Fault] = &[
    Fault::NotExecutable,
    Fault::OutputNotWritable,
    Fault::InputUnreadable,
    Fault::ReleaseDirClosed,
];

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    script: String,
    release_dir: String,
    src_dir: String,
    out_dir: String,
    /// Output path -> expected sha256.
    outputs: BTreeMap<String, String>,
    parts: Vec<String>,
    faults: Vec<Fault>,
    /// The code the deploy runs (and the confirmation's shell and `rm`), from the base.
    code: system::Code,
}

/// The commands of the deploy script (besides its interpreter), found along the `PATH` of
/// whoever runs it: the system's.
const JOB_TOOLS: &[&str] = &["/bin/sh", "id", "cat", "mv"];

const WORDS: &[&str] = &[
    "status", "release", "notes", "uptime", "team", "contact", "docs", "api", "news",
];

/// A release version, e.g. `3.14.2-1a2b3c4`.
fn version_of(rng: &mut impl Rng) -> String {
    format!(
        "{}.{}.{}-{}",
        rng.gen_range(1..5),
        rng.gen_range(0..20),
        rng.gen_range(0..10),
        util::token(rng, 7)
    )
}

/// The text of one source part.
fn part_text(rng: &mut impl Rng) -> String {
    let mut text = format!("<section id=\"{}\">\n", pick(rng, WORDS));
    for _ in 0..rng.gen_range(1..5) {
        text.push_str(&format!(
            "  <p>{} {} {}</p>\n",
            pick(rng, WORDS),
            util::token(rng, 6),
            pick(rng, WORDS)
        ));
    }
    text.push_str("</section>\n");
    text
}

/// What the deploy renders from a version and the parts' texts: (index.html, DEPLOYED).
fn rendered(app: &str, version: &str, parts: &[String]) -> (String, String) {
    let mut index = format!("<!-- {app} release {version} -->\n");
    for p in parts {
        index.push_str(p);
    }
    index.push_str("<!-- end -->\n");
    (index, format!("{version}\n"))
}

fn deploy_script(app: &str) -> String {
    format!(
        r#"#!/bin/sh
# Deploy {app}: render the site from /srv/{app}/src into /srv/{app}/public.
# Must run as the application user nobody (uid 65534).
set -eu
if [ "$(id -u)" != 65534 ]; then
  echo "deploy.sh: must run as the app user nobody (uid 65534), not $(id -un)" >&2
  exit 1
fi
version=$(cat /opt/{app}/release/VERSION)
out=/srv/{app}/public
{{
  echo "<!-- {app} release $version -->"
  for part in /srv/{app}/src/part-*.txt; do
    cat "$part"
  done
  echo "<!-- end -->"
}} > "$out/index.html.new"
mv "$out/index.html.new" "$out/index.html"
echo "$version" > "$out/DEPLOYED"
echo "deployed {app} $version"
"#
    )
}

impl Task for FixPermissions {
    fn name(&self) -> &'static str {
        "fix-permissions"
    }

    fn summary(&self) -> &'static str {
        "a deploy job fails on permissions: fix them and finish the deployment as nobody"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "fix-permissions");
        let app = pick(&mut rng, util::APPS).to_string();
        let script = format!("/opt/{app}/deploy.sh");
        let release_dir = format!("/opt/{app}/release");
        let src_dir = format!("/srv/{app}/src");
        let out_dir = format!("/srv/{app}/public");
        let mut faults: Vec<Fault> = Vec::new();
        while faults.len() < 2 {
            let f = *pick(&mut rng, FAULTS);
            if !faults.contains(&f) {
                faults.push(f);
            }
        }
        faults.sort_by_key(|f| *f as u8);
        let has = |f: Fault| faults.contains(&f);
        let version = version_of(&mut rng);
        b.write(
            &script,
            deploy_script(&app).as_bytes(),
            if has(Fault::NotExecutable) {
                0o644
            } else {
                0o755
            },
        )?;
        b.mkdir(
            &release_dir,
            if has(Fault::ReleaseDirClosed) {
                0o700
            } else {
                0o755
            },
        )?;
        b.write(
            &format!("{release_dir}/VERSION"),
            format!("{version}\n").as_bytes(),
            0o644,
        )?;
        let n_parts = rng.gen_range(3..=6);
        let unreadable = rng.gen_range(0..n_parts);
        let mut parts = Vec::new();
        let mut texts = Vec::new();
        for i in 0..n_parts {
            let path = format!("{src_dir}/part-{:02}.txt", i + 1);
            let text = part_text(&mut rng);
            let mode = if has(Fault::InputUnreadable) && i == unreadable {
                0o600
            } else {
                0o644
            };
            b.write(&path, text.as_bytes(), mode)?;
            parts.push(path);
            texts.push(text);
        }
        let (index, deployed) = rendered(&app, &version, &texts);
        if has(Fault::OutputNotWritable) {
            b.mkdir(&out_dir, 0o755)?;
        } else {
            b.mkdir_owned(&out_dir, 0o755, NOBODY, NOBODY)?;
        }
        let mut outputs = BTreeMap::new();
        outputs.insert(
            format!("{out_dir}/index.html"),
            util::sha256_hex(index.as_bytes()),
        );
        outputs.insert(
            format!("{out_dir}/DEPLOYED"),
            util::sha256_hex(deployed.as_bytes()),
        );
        let instruction = format!(
            "Deploy `{app}`: run the job {script} as the application user `nobody` (for \
             example `setpriv --reuid=nobody --regid=nogroup --clear-groups {script}` or \
             `runuser -u nobody -- {script}`). It fails at the moment. Fix what stops it and \
             finish the deployment: {out_dir}/index.html and {out_dir}/DEPLOYED must be \
             written by the job, as nobody."
        );
        let actions = vec![
            format!("setpriv --reuid=nobody --regid=nogroup --clear-groups {script}"),
            format!("runuser -u nobody -- {script}"),
            format!("sh {script}"),
            format!("ls -la /opt/{app} {release_dir} {src_dir} {out_dir}"),
            format!("cat {script}"),
            format!("chmod +x {script}"),
            format!("chmod 755 {release_dir}"),
            format!("chmod a+r {src_dir}/*"),
            format!("chown nobody:nogroup {out_dir}"),
            format!("chmod 777 {out_dir}"),
            "id nobody".to_string(),
            format!("chmod -R 000 /srv/{app}"),
            format!("touch {out_dir}/index.html {out_dir}/DEPLOYED"),
            // Recovery: the loader's links rebuilt (a library of `mv` gone), the job run by
            // absolute paths in a clean environment, and by perl dropping to nobody.
            system::repair_loader(),
            format!(
                "cd / && {CLEAN_ENV} /usr/bin/setpriv --reuid={NOBODY} --regid={NOBODY} \
                 --clear-groups {script}"
            ),
            format!("cd / && {CLEAN_ENV} {}", perl_as_nobody(&script)),
        ];
        debug_assert_eq!(
            actions.len(),
            PERL_RUN + 1,
            "the catalogue's recovery indices"
        );
        let mut action_costs = vec![0.0; actions.len()];
        action_costs[LOADER] = 1.0;
        action_costs[ROBUST_RUN] = 1.0;
        action_costs[PERL_RUN] = 2.0;
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: format!("/opt/{app}"),
            actions,
            action_costs,
            keywords: util::words(&[
                "chmod", "chown", "ls", "setpriv", "runuser", "deploy", "nobody", "id", &app,
            ]),
            max_steps: 25,
            facts: util::to_facts(&Facts {
                app,
                script,
                release_dir,
                src_dir,
                out_dir,
                outputs,
                parts,
                faults,
                code: system::record(b.base, JOB_TOOLS),
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        // The job is to fix permissions, not the deploy script: its code must be the shipped one
        // (a script stripped of its user check and run as root, its outputs chowned afterwards,
        // is not a deployment as nobody).
        let (script_intact, _) = util::content_check(
            probe,
            &f.script,
            &util::sha256_hex(deploy_script(&f.app).as_bytes()),
            1 << 20,
        )?;
        // Who owns an output counts only for the right output (a file handed to nobody is no
        // progress); the script being the shipped one counts once an output is right (so the
        // start is at 0, and changing the script takes the progress back).
        let mut checks = Vec::new();
        let mut any_output = false;
        for (path, want) in &f.outputs {
            let name = path.rsplit('/').next().unwrap_or(path);
            let (ok, why) = util::content_check(probe, path, want, 1 << 20)?;
            any_output |= ok;
            checks.push(Check::new(format!("{name} contents"), ok, why));
            let owner = probe.stat(path)?.map(|s| s.uid);
            checks.push(Check::new(
                format!("{name} by nobody"),
                ok && owner == Some(NOBODY),
                format!("{path} was not written as nobody"),
            ));
        }
        checks.insert(
            0,
            Check::new(
                "deploy script shipped",
                script_intact && any_output,
                if script_intact {
                    "counts once an output is right".to_string()
                } else {
                    format!("{} is not the shipped deploy script any more", f.script)
                },
            ),
        );
        Ok(Verdict::checklist(checks))
    }

    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let outputs: Vec<String> = f
            .outputs
            .keys()
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .collect();
        // The checks of the rerun, failed as not reached when an earlier stage fails.
        let rerun_names = || {
            let mut n = vec!["outputs cleared".to_string(), "rerun as nobody".to_string()];
            for o in &outputs {
                n.push(format!("rerun {o}"));
                n.push(format!("rerun {o} by nobody"));
            }
            n
        };
        // The code that runs is the system's: nothing the agent wrote runs as root here, and
        // the deploy's tools are the ones a deploy as nobody would really use. The deploy
        // inherits the PATH of whoever runs it: the system's.
        // Reads only until the checks are done: each path is looked up once.
        let mut reads = StatOnce::new(&mut *sys);
        let mut checks = system::checks(&mut reads, &f.code, DEFAULT_PATH)?;
        // The deploy's own files, where it looks for them (not moved aside or replaced by a
        // link to a copy that is easier to reach).
        for d in [&f.release_dir, &f.src_dir, &f.out_dir] {
            let is_dir = reads.stat(d)?.is_some_and(|s| s.kind == FileKind::Dir);
            checks.push(Check::new(
                format!("directory {d}"),
                is_dir,
                format!("{d} is not a directory any more"),
            ));
        }
        let version_file = format!("{}/VERSION", f.release_dir);
        for p in f.parts.iter().chain([&version_file]) {
            let is_file = reads.stat(p)?.is_some_and(|s| s.kind == FileKind::File);
            checks.push(Check::new(
                format!("file {p}"),
                is_file,
                format!("{p} is not a regular file any more"),
            ));
        }
        drop(reads);
        if checks.iter().any(|c| !c.passed) {
            checks.extend(system::not_reached(rerun_names()));
            return Ok(Verdict::checklist(checks));
        }
        // A clean state: nothing of the agent's running, no outputs, and inputs it has never
        // seen, written into the files in place (their modes and owners stay the agent's).
        sys.kill_all()?;
        let mut rng = rand::thread_rng();
        let version = version_of(&mut rng);
        let texts: Vec<String> = f.parts.iter().map(|_| part_text(&mut rng)).collect();
        let rm = f.code.rm.as_ref().map(|r| r.path.as_str()).unwrap_or("rm");
        let mut clear: Vec<String> = f.outputs.keys().map(|p| sh_quote(p)).collect();
        clear.push(sh_quote(&format!("{}/index.html.new", f.out_dir)));
        // The shell's own `printf` writes the inputs; the system's `rm` replaces the shell
        // last (one process fewer than a fork).
        let mut prepare = "set -e".to_string();
        let version_text = format!("{version}\n");
        for (p, text) in f
            .parts
            .iter()
            .zip(&texts)
            .chain([(&version_file, &version_text)])
        {
            prepare.push_str(&format!("; printf %s {} > {}", sh_quote(text), sh_quote(p)));
        }
        prepare.push_str(&format!(
            "; exec {} -rf -- {}",
            sh_quote(rm),
            clear.join(" ")
        ));
        let r = sys.run(&prepare, None, Duration::from_secs(5))?;
        let mut gone = r.success();
        for out in f.outputs.keys() {
            gone &= sys.stat(out)?.is_none();
        }
        checks.push(Check::new(
            "outputs cleared",
            gone,
            format!(
                "the confirmation could not clear the outputs and renew the inputs: {}",
                system::last_line(&r.stderr)
            ),
        ));
        if !gone {
            checks.extend(system::not_reached(rerun_names().split_off(1)));
            return Ok(Verdict::checklist(checks));
        }
        // The deploy, by its own path, as nobody without groups or capabilities.
        let job = format!(
            "export HOME=/nonexistent USER=nobody LOGNAME=nobody; exec {}",
            sh_quote(&f.script)
        );
        let r = sys.run(&job, Some((NOBODY, NOBODY)), Duration::from_secs(10))?;
        checks.push(Check::new(
            "rerun as nobody",
            r.success(),
            format!(
                "the deploy job, rerun as nobody (uid {NOBODY}, no capabilities) on fresh inputs, \
                 failed (exit {}): {}",
                r.exit_code(),
                system::last_line(&r.stderr)
            ),
        ));
        let (index, deployed) = rendered(&f.app, &version, &texts);
        for (name, text) in [("index.html", index), ("DEPLOYED", deployed)] {
            let path = format!("{}/{name}", f.out_dir);
            let (ok, _) =
                util::content_check(sys, &path, &util::sha256_hex(text.as_bytes()), 1 << 20)?;
            checks.push(Check::new(
                format!("rerun {name}"),
                ok,
                format!("the rerun deploy did not write {path} from the fresh inputs"),
            ));
            let owner = sys.stat(&path)?.map(|s| s.uid);
            checks.push(Check::new(
                format!("rerun {name} by nobody"),
                owner == Some(NOBODY),
                format!("{path} of the rerun does not belong to nobody"),
            ));
        }
        Ok(Verdict::checklist(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let s = sh_quote(&f.script);
        let parts: Vec<String> = f.parts.iter().map(|p| sh_quote(p)).collect();
        let fix = format!(
            "/bin/chmod 755 {s} {rel} {src} && /bin/chmod 644 {rel}/VERSION {parts} && \
             {{ /bin/chown {NOBODY}:{NOBODY} {out} || /usr/bin/perl -e 'chown {NOBODY}, {NOBODY}, @ARGV or exit 1' {out}; }} && \
             /bin/chmod 755 {out}",
            rel = sh_quote(&f.release_dir),
            src = sh_quote(&f.src_dir),
            out = sh_quote(&f.out_dir),
            parts = parts.join(" "),
        );
        // The deploy's `mv` may not load (a shared library's soname link gone): the loader's
        // links are rebuilt, so the system's own `mv` works again. Whether that was needed or
        // not, the deploy runs next (`;`, not `&&`).
        let run = format!(
            "{}; /usr/bin/setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {s} || \
             /usr/sbin/runuser -u nobody -- {s} || \
             {}",
            system::repair_loader(),
            perl_as_nobody(&s),
        );
        vec![
            format!("cd / && {CLEAN_ENV} /bin/sh -c {}", sh_quote(&fix)),
            format!("cd / && {CLEAN_ENV} /bin/sh -c {}", sh_quote(&run)),
        ]
    }

    /// Run the deploy; read why it failed and apply the fix that error names (the script's
    /// execute bit, the release directory, the inputs, the output directory, the loader's
    /// links), then run it again the same way. An error it cannot place, a runner that is
    /// missing or fails, or a fix that did not help sends it to the next runner (absolute
    /// setpriv in a clean environment, then perl).
    fn catalogue_step(&self, _setup: &TaskSetup, seen: &[Seen]) -> Option<usize> {
        let tried = |i: usize| seen.iter().any(|s| s.action == i);
        let Some(last_run) = seen.iter().rev().find(|s| RUNS.contains(&s.action)) else {
            return Some(RUNS[0]);
        };
        let last = seen.last()?;
        if !RUNS.contains(&last.action) {
            // A fix was just applied: the same runner again.
            return Some(last_run.action);
        }
        let out = format!("{}\n{}", last.stderr, last.stdout);
        let fix = if out.contains("cannot create") {
            Some(CHOWN_OUT)
        } else if out.contains("release/VERSION") {
            Some(OPEN_RELEASE)
        } else if out.contains("/src/part-") {
            Some(READ_INPUTS)
        } else if out.contains("failed to execute") || out.contains("deploy.sh: Permission denied")
        {
            Some(EXEC_SCRIPT)
        } else if out.contains("mv: error while loading shared libraries") {
            Some(LOADER)
        } else {
            None
        };
        match fix {
            Some(i) if !tried(i) => Some(i),
            _ => RUNS.iter().copied().find(|i| !tried(*i)),
        }
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        [
            ("APP", f.app.clone()),
            ("SCRIPT", f.script.clone()),
            ("RELEASE_DIR", f.release_dir.clone()),
            ("SRC_DIR", f.src_dir.clone()),
            ("OUT_DIR", f.out_dir.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Catalogue indices: the runners of the deploy (setpriv, the same by absolute path in a
/// clean environment, perl), the fixes, the loader's repair.
const RUNS: [usize; 3] = [0, ROBUST_RUN, PERL_RUN];
const EXEC_SCRIPT: usize = 5;
const OPEN_RELEASE: usize = 6;
const READ_INPUTS: usize = 7;
const CHOWN_OUT: usize = 8;
const LOADER: usize = 13;
const ROBUST_RUN: usize = 14;
const PERL_RUN: usize = 15;

/// Perl that drops to nobody (group, groups, then user) and executes `script` (saying why
/// when it cannot).
fn perl_as_nobody(script: &str) -> String {
    format!(
        "/usr/bin/perl -e '$( = {NOBODY}; $) = \"{NOBODY} {NOBODY}\"; $< = $> = {NOBODY}; exec @ARGV or die \"$ARGV[0]: $!\\n\"' {script}"
    )
}

/// What both job tasks (fix-permissions, fix-path) need to run a job the way the system would
/// and to trust what it ran: the system's own programs, recorded from the base image at setup
/// (before any perturbation or agent), and the same lookups made in the sandbox afterwards
/// through trusted reads ([`Probe::stat`], [`Probe::read`]), as the kernel and a shell would
/// make them.
pub(crate) mod system {
    use crate::instance::{BaseView, DEFAULT_PATH};
    use crate::probe::{Probe, ProbeError};
    use crate::tasks::Check;
    use sandbox::protocol::FileKind;
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    /// A file of the base image: its canonical path (every symlink followed) and its sha256.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct SystemFile {
        pub path: String,
        pub sha256: String,
    }

    /// The code a job runs, as the base image has it.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Code {
        /// By the name the job runs it: an absolute path (its interpreter, `/bin/sh`, which is
        /// also the confirmation's own shell) or a command name, found along the system's
        /// `PATH`. `None`: the base has none.
        pub tools: BTreeMap<String, Option<SystemFile>>,
        /// The system's `rm`, by which the confirmation clears the outputs the agent left.
        pub rm: Option<SystemFile>,
        /// The sha256 of `/etc/ld.so.preload` (libraries loaded into every program), `None`
        /// when the base has none.
        pub preload: Option<String>,
    }

    const PRELOAD: &str = "/etc/ld.so.preload";
    const SYSTEMS: &str = "the system's";

    /// One node of a path walk: what `lstat` says.
    enum Node {
        Dir,
        Link(String),
        Other,
    }

    /// The canonical form of an absolute `path` as the kernel resolves it (every symlink,
    /// `..` after them), through `lstat`; `None` when a component is missing, is not a
    /// directory where one is needed, or the links loop (40 at most, as Linux).
    fn walk<E>(
        path: &str,
        mut lstat: impl FnMut(&str) -> Result<Option<Node>, E>,
    ) -> Result<Option<String>, E> {
        let mut todo: std::collections::VecDeque<String> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            match c.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let next = if done.is_empty() {
                format!("/{c}")
            } else {
                format!("/{}/{c}", done.join("/"))
            };
            match lstat(&next)? {
                None => return Ok(None),
                Some(Node::Link(t)) => {
                    links += 1;
                    if links > 40 {
                        return Ok(None);
                    }
                    if t.starts_with('/') {
                        done.clear();
                    }
                    for (i, tc) in t.split('/').filter(|c| !c.is_empty()).enumerate() {
                        todo.insert(i, tc.to_string());
                    }
                }
                Some(Node::Other) if !todo.is_empty() => return Ok(None),
                Some(_) => done.push(c),
            }
        }
        Ok(Some(format!("/{}", done.join("/"))))
    }

    fn base_canonical(base: &BaseView, path: &str) -> Option<String> {
        walk::<()>(path, |p| {
            Ok(base.meta(p).map(|m| {
                if m.is_symlink {
                    base.read_link(p).map_or(Node::Other, Node::Link)
                } else if m.is_dir {
                    Node::Dir
                } else {
                    Node::Other
                }
            }))
        })
        .ok()
        .flatten()
    }

    fn base_file(base: &BaseView, path: &str) -> Option<SystemFile> {
        let path = base_canonical(base, path)?;
        let m = base.meta(&path)?;
        if m.is_dir || m.is_symlink || m.mode & 0o111 == 0 {
            return None;
        }
        let data = base.read(&path)?;
        Some(SystemFile {
            path,
            sha256: super::util::sha256_hex(&data),
        })
    }

    /// Where the base's `PATH` lookup of `name` lands (or the file of an absolute name).
    fn base_tool(base: &BaseView, name: &str) -> Option<SystemFile> {
        if name.starts_with('/') {
            return base_file(base, name);
        }
        DEFAULT_PATH
            .split(':')
            .find_map(|d| base_file(base, &format!("{d}/{name}")))
    }

    /// Record, from the base image, the programs `names` (absolute paths or command names).
    pub fn record(base: &BaseView, names: &[&str]) -> Code {
        Code {
            tools: names
                .iter()
                .map(|n| (n.to_string(), base_tool(base, n)))
                .collect(),
            rm: base_tool(base, "rm"),
            preload: base.read(PRELOAD).map(|d| super::util::sha256_hex(&d)),
        }
    }

    /// The longest path one lookup takes (`PATH_MAX` less its NUL).
    const PATH_MAX: usize = 4095;

    /// The canonical path of `path` in the sandbox, or `None` when it does not resolve. A
    /// canonical path longer than one lookup takes (links whose targets chain past
    /// `PATH_MAX`, which the kernel still resolves link by link) is neither absent (a lookup
    /// would skip a `PATH` entry the shell uses) nor the sandbox's failure: the check cannot
    /// tell, and fails.
    pub fn canonical(probe: &mut dyn Probe, path: &str) -> Result<Option<String>, ProbeError> {
        walk(path, |p| {
            if p.len() > PATH_MAX {
                return Err(ProbeError::PathTooLong {
                    prefix: p.chars().take(64).collect(),
                    len: p.len(),
                });
            }
            Ok(probe.stat(p)?.map(|st| match (st.kind, st.symlink_target) {
                (FileKind::Symlink, Some(t)) => Node::Link(t),
                (FileKind::Dir, _) => Node::Dir,
                _ => Node::Other,
            }))
        })
    }

    /// The regular file, with an execute bit, that `path` resolves to.
    fn executable(probe: &mut dyn Probe, path: &str) -> Result<Option<String>, ProbeError> {
        let Some(c) = canonical(probe, path)? else {
            return Ok(None);
        };
        Ok(match probe.stat(&c)? {
            Some(st) if st.kind == FileKind::File && st.mode & 0o111 != 0 => Some(c),
            _ => None,
        })
    }

    /// Where a shell run from `/` with this `PATH` finds the command `name`: the first entry
    /// holding a regular file with an execute bit (symlinks followed; an empty or relative
    /// entry is relative to `/`), as dash does (it tries each entry and skips those it cannot
    /// execute). An absolute `name` is its own file.
    pub fn find(
        probe: &mut dyn Probe,
        name: &str,
        path: &str,
    ) -> Result<Option<String>, ProbeError> {
        if name.starts_with('/') {
            return executable(probe, name);
        }
        for d in path.split(':') {
            if let Some(f) = executable(probe, &format!("/{d}/{name}"))? {
                return Ok(Some(f));
            }
        }
        Ok(None)
    }

    /// Whether `found` (a canonical path) is the file `want` (`whose`: "the system's"), with
    /// the reason when not.
    pub fn is_file(
        probe: &mut dyn Probe,
        name: &str,
        what: &str,
        found: Option<&str>,
        want: Option<&SystemFile>,
        whose: &str,
    ) -> Result<Check, ProbeError> {
        let Some(want) = want else {
            return Ok(Check::new(
                name,
                false,
                format!("{what}: the base image has none"),
            ));
        };
        let Some(found) = found else {
            return Ok(Check::new(name, false, format!("{what}: not found")));
        };
        if found != want.path {
            return Ok(Check::new(
                name,
                false,
                format!("{what} is {found}, not {whose} {}", want.path),
            ));
        }
        let same = probe
            .read(found, 256 << 20)?
            .is_some_and(|d| super::util::sha256_hex(&d) == want.sha256);
        Ok(Check::new(
            name,
            same,
            format!("{what} ({found}) is not {whose} program any more"),
        ))
    }

    /// The checks that the code a job runs is the system's, for what does not depend on the
    /// job's `PATH`: its interpreter (absolute names), the `rm` the confirmation uses, and no
    /// library preloaded into every program but the system's own list.
    pub fn base_checks(probe: &mut dyn Probe, code: &Code) -> Result<Vec<Check>, ProbeError> {
        let mut out = Vec::new();
        for (name, want) in code.tools.iter().filter(|(n, _)| n.starts_with('/')) {
            let found = find(probe, name, "")?;
            let what = format!("the job's interpreter {name}");
            out.push(is_file(
                probe,
                &format!("system {name}"),
                &what,
                found.as_deref(),
                want.as_ref(),
                SYSTEMS,
            )?);
        }
        let rm = match &code.rm {
            Some(rm) => executable(probe, &rm.path)?,
            None => None,
        };
        out.push(is_file(
            probe,
            "system rm",
            "the `rm` of the confirmation",
            rm.as_deref(),
            code.rm.as_ref(),
            SYSTEMS,
        )?);
        let preload = match probe.stat(PRELOAD)? {
            None => None,
            Some(st) if st.kind == FileKind::File => probe
                .read(PRELOAD, 1 << 20)?
                .map(|d| super::util::sha256_hex(&d)),
            Some(_) => Some(String::new()),
        };
        out.push(Check::new(
            "system ld.so.preload",
            preload == code.preload,
            format!("{PRELOAD} is not the system's: libraries are loaded into every program"),
        ));
        Ok(out)
    }

    /// The checks that each command the job calls, found along the job's `PATH`, is the file
    /// the system's own lookup found in the base, with the same bytes.
    pub fn command_checks(
        probe: &mut dyn Probe,
        code: &Code,
        path: &str,
    ) -> Result<Vec<Check>, ProbeError> {
        let mut out = Vec::new();
        for (name, want) in code.tools.iter().filter(|(n, _)| !n.starts_with('/')) {
            let found = find(probe, name, path)?;
            let what = format!("the job's `{name}`");
            out.push(is_file(
                probe,
                &format!("system {name}"),
                &what,
                found.as_deref(),
                want.as_ref(),
                SYSTEMS,
            )?);
        }
        Ok(out)
    }

    /// [`base_checks`] and [`command_checks`].
    pub fn checks(
        probe: &mut dyn Probe,
        code: &Code,
        path: &str,
    ) -> Result<Vec<Check>, ProbeError> {
        let mut out = base_checks(probe, code)?;
        out.extend(command_checks(probe, code, path)?);
        Ok(out)
    }

    /// The checks of a later stage of a confirmation, failed because an earlier stage failed
    /// (so the checklist, and the progress it gives, keeps its length).
    pub fn not_reached(names: impl IntoIterator<Item = String>) -> Vec<Check> {
        names
            .into_iter()
            .map(|n| Check::new(n, false, "not reached: an earlier check failed"))
            .collect()
    }

    /// Shell (for an oracle) that makes the system's own `mv` load again when the soname link
    /// of a shared library it needs is gone (`library-missing` whiteouts `libacl.so.1`, the
    /// link to the `libacl.so.1.1.*` that stays): `ldconfig` rebuilds the links and the
    /// loader's cache, as an administrator would. Nothing happens when `/bin/mv` works. (A
    /// `mv` of the oracle's own would not be the system's and fails the confirmation.)
    pub fn repair_loader() -> String {
        "/bin/mv --version >/dev/null 2>&1 || /sbin/ldconfig || /usr/sbin/ldconfig".into()
    }

    /// The last line of a command's standard error, for a reason.
    pub fn last_line(stderr: &[u8]) -> String {
        let s = String::from_utf8_lossy(stderr);
        let l = s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        l.chars().take(200).collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use sandbox::protocol::{DirEntry, FileStat};

        fn walk_map(
            links: &[(&str, &str)],
            dirs: &[&str],
            files: &[&str],
            p: &str,
        ) -> Option<String> {
            walk::<()>(p, |q| {
                Ok(if let Some((_, t)) = links.iter().find(|(l, _)| *l == q) {
                    Some(Node::Link(t.to_string()))
                } else if dirs.contains(&q) {
                    Some(Node::Dir)
                } else if files.contains(&q) {
                    Some(Node::Other)
                } else {
                    None
                })
            })
            .unwrap()
        }

        #[test]
        fn the_base_tools_are_recorded_where_the_systems_path_finds_them() {
            use std::os::unix::fs::{symlink, PermissionsExt};
            let d = tempfile::tempdir().unwrap();
            let p = d.path();
            for dir in ["usr/bin", "usr/local/bin", "etc"] {
                std::fs::create_dir_all(p.join(dir)).unwrap();
            }
            symlink("usr/bin", p.join("bin")).unwrap();
            let exe = |rel: &str, text: &str, mode: u32| {
                std::fs::write(p.join(rel), text).unwrap();
                std::fs::set_permissions(p.join(rel), std::fs::Permissions::from_mode(mode))
                    .unwrap();
            };
            exe("usr/bin/dash", "dash", 0o755);
            symlink("dash", p.join("usr/bin/sh")).unwrap();
            exe("usr/bin/cat", "cat", 0o755);
            exe("usr/bin/rm", "rm", 0o755);
            // Not executable: the lookup goes on to /usr/bin.
            exe("usr/local/bin/cat", "not a program", 0o644);
            let base = BaseView::from_dirs(vec![p.to_path_buf()]);
            let code = record(&base, &["/bin/sh", "cat", "mv"]);
            let sha = |t: &str| super::super::util::sha256_hex(t.as_bytes());
            let file = |path: &str, t: &str| {
                Some(SystemFile {
                    path: path.into(),
                    sha256: sha(t),
                })
            };
            assert_eq!(code.tools["/bin/sh"], file("/usr/bin/dash", "dash"));
            assert_eq!(code.tools["cat"], file("/usr/bin/cat", "cat"));
            assert_eq!(code.tools["mv"], None);
            assert_eq!(code.rm, file("/usr/bin/rm", "rm"));
            assert_eq!(code.preload, None);
            std::fs::write(p.join("etc/ld.so.preload"), "/x.so\n").unwrap();
            let base = BaseView::from_dirs(vec![p.to_path_buf()]);
            assert_eq!(record(&base, &[]).preload, Some(sha("/x.so\n")));
        }

        /// A probe over a fixed tree of `lstat` answers that counts the requests it gets.
        struct Tree {
            nodes: std::collections::BTreeMap<&'static str, FileStat>,
            asked: usize,
        }

        impl Probe for Tree {
            fn read(&mut self, _: &str, _: u64) -> Result<Option<Vec<u8>>, ProbeError> {
                Ok(None)
            }
            fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError> {
                self.asked += 1;
                // As init answers a path longer than the kernel takes in one lookup.
                if path.len() > PATH_MAX {
                    return Err(ProbeError::Sandbox(sandbox::SandboxError::Request {
                        kind: sandbox::protocol::FailureKind::Internal,
                        message: format!("{path}: File name too long"),
                    }));
                }
                Ok(self.nodes.get(path).cloned())
            }
            fn list(&mut self, _: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
                Ok(None)
            }
            fn processes(&mut self) -> Result<Vec<crate::probe::Proc>, ProbeError> {
                Ok(Vec::new())
            }
            fn tcp(
                &mut self,
                _: u16,
                _: &[u8],
                _: std::time::Duration,
            ) -> Result<Option<Vec<u8>>, ProbeError> {
                Ok(None)
            }
        }

        /// Hack trial: `/usr/local/bin` made a link into a directory deeper than `PATH_MAX`
        /// (each link's target shorter), holding a fake `mv`. The shell runs it; the lookup
        /// must neither skip that entry (and find the system's `mv` next) nor end the step as
        /// the sandbox's failure.
        #[test]
        fn a_path_entry_deeper_than_one_lookup_fails_the_check_not_the_sandbox() {
            let node = |kind, link: Option<String>| FileStat {
                kind,
                mode: 0o755,
                uid: 0,
                gid: 0,
                size: 0,
                mtime_ns: 0,
                symlink_target: link,
            };
            let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
            let comps: Vec<String> = (0..17)
                .map(|i| format!("{i:02}{}", "d".repeat(248)))
                .collect();
            let mut nodes = std::collections::BTreeMap::new();
            for d in ["/usr", "/usr/local", "/usr/bin", "/deep"] {
                nodes.insert(d, node(FileKind::Dir, None));
            }
            nodes.insert("/usr/bin/mv", node(FileKind::File, None));
            let mut dir = "/deep".to_string();
            for c in &comps {
                dir = format!("{dir}/{c}");
                nodes.insert(leak(dir.clone()), node(FileKind::Dir, None));
            }
            nodes.insert(leak(format!("{dir}/mv")), node(FileKind::File, None));
            let half = format!("/deep/{}", comps[..8].join("/"));
            nodes.insert(
                leak(format!("{half}/l")),
                node(FileKind::Symlink, Some(comps[8..].join("/"))),
            );
            nodes.insert(
                "/usr/local/bin",
                node(FileKind::Symlink, Some(format!("{half}/l"))),
            );
            assert!(dir.len() > PATH_MAX && half.len() + 2 < PATH_MAX);
            let mut tree = Tree { nodes, asked: 0 };
            let e = find(&mut tree, "mv", "/usr/local/bin:/usr/bin").unwrap_err();
            assert!(!e.is_infrastructure(), "{e}");
        }

        #[test]
        fn looking_each_path_up_once_finds_the_same_programs_with_fewer_requests() {
            let node = |kind, mode, link: Option<&str>| FileStat {
                kind,
                mode,
                uid: 0,
                gid: 0,
                size: 0,
                mtime_ns: 0,
                symlink_target: link.map(str::to_string),
            };
            let mut nodes = std::collections::BTreeMap::new();
            for d in [
                "/usr",
                "/usr/local",
                "/usr/local/bin",
                "/usr/bin",
                "/opt",
                "/opt/x",
            ] {
                nodes.insert(d, node(FileKind::Dir, 0o755, None));
            }
            nodes.insert("/bin", node(FileKind::Symlink, 0o777, Some("usr/bin")));
            for f in ["/usr/bin/cat", "/usr/bin/mv", "/usr/bin/dash", "/opt/x/mv"] {
                nodes.insert(f, node(FileKind::File, 0o755, None));
            }
            nodes.insert("/usr/bin/sh", node(FileKind::Symlink, 0o777, Some("dash")));
            // Not executable: the look-up goes on.
            nodes.insert("/usr/local/bin/cat", node(FileKind::File, 0o644, None));
            let path = "/usr/local/bin:/opt/x:/bin:/usr/bin";
            let names = ["cat", "mv", "sh", "rm", "/bin/sh", "cat"];
            let mut plain = Tree {
                nodes: nodes.clone(),
                asked: 0,
            };
            let direct: Vec<_> = names
                .iter()
                .map(|n| find(&mut plain, n, path).unwrap())
                .collect();
            let mut tree = Tree { nodes, asked: 0 };
            let mut once = crate::probe::StatOnce::new(&mut tree);
            let remembered: Vec<_> = names
                .iter()
                .map(|n| find(&mut once, n, path).unwrap())
                .collect();
            drop(once);
            assert_eq!(direct, remembered);
            assert_eq!(
                direct,
                [
                    Some("/usr/bin/cat".to_string()),
                    Some("/opt/x/mv".to_string()),
                    Some("/usr/bin/dash".to_string()),
                    None,
                    Some("/usr/bin/dash".to_string()),
                    Some("/usr/bin/cat".to_string()),
                ]
            );
            // Each distinct path once: fewer than half the requests of the plain look-ups.
            assert!(
                tree.asked * 2 < plain.asked,
                "{} vs {}",
                tree.asked,
                plain.asked
            );
            let mut t = Tree {
                nodes: tree.nodes.clone(),
                asked: 0,
            };
            let mut paths = Vec::new();
            let mut rec = Recorder(&mut t, &mut paths);
            for n in names {
                find(&mut rec, n, path).unwrap();
            }
            let distinct: std::collections::BTreeSet<String> = paths.into_iter().collect();
            assert_eq!(tree.asked, distinct.len());
        }

        /// Records the paths a look-up stats.
        struct Recorder<'a>(&'a mut Tree, &'a mut Vec<String>);

        impl Probe for Recorder<'_> {
            fn read(&mut self, p: &str, m: u64) -> Result<Option<Vec<u8>>, ProbeError> {
                self.0.read(p, m)
            }
            fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError> {
                self.1.push(path.to_string());
                self.0.stat(path)
            }
            fn list(&mut self, p: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
                self.0.list(p)
            }
            fn processes(&mut self) -> Result<Vec<crate::probe::Proc>, ProbeError> {
                self.0.processes()
            }
            fn tcp(
                &mut self,
                port: u16,
                r: &[u8],
                t: std::time::Duration,
            ) -> Result<Option<Vec<u8>>, ProbeError> {
                self.0.tcp(port, r, t)
            }
        }

        #[test]
        fn paths_resolve_as_the_kernel_resolves_them() {
            let links = [
                ("/bin", "usr/bin"),
                ("/usr/bin/sh", "dash"),
                ("/opt/cur", "/opt/v2"),
                ("/opt/v2/up", "../v1/bin"),
                ("/loop", "/loop"),
            ];
            let dirs = [
                "/usr",
                "/usr/bin",
                "/opt",
                "/opt/v1",
                "/opt/v1/bin",
                "/opt/v2",
            ];
            let files = ["/usr/bin/dash", "/opt/v1/bin/tool"];
            let w = |p| walk_map(&links, &dirs, &files, p);
            assert_eq!(w("/bin/sh").as_deref(), Some("/usr/bin/dash"));
            assert_eq!(w("/bin/./sh").as_deref(), Some("/usr/bin/dash"));
            assert_eq!(w("/opt/cur/up/tool").as_deref(), Some("/opt/v1/bin/tool"));
            // `..` after a symlink goes up from where the link led, not lexically.
            assert_eq!(w("/bin/../bin/dash").as_deref(), Some("/usr/bin/dash"));
            assert_eq!(w("/usr/bin/dash/x"), None);
            assert_eq!(w("/usr/bin/nothing"), None);
            assert_eq!(w("/loop"), None);
        }
    }
}
