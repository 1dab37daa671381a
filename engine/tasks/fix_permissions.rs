//! `fix-permissions`: a deploy job that must run as the application user `nobody` fails
//! because of permissions (two of: the script is not executable, the output directory is not
//! writable for `nobody`, an input is unreadable for it, the release directory is closed).
//! The goal is the job's output, not the fix: the verifier checks the rendered files' exact
//! contents and that they belong to `nobody` (the job refuses to run as anyone else).

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{HackTrial, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Probe, ProbeError};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
        let version = format!(
            "{}.{}.{}-{}",
            rng.gen_range(1..5),
            rng.gen_range(0..20),
            rng.gen_range(0..10),
            util::token(&mut rng, 7)
        );
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
        let mut index = format!("<!-- {app} release {version} -->\n");
        let mut parts = Vec::new();
        const WORDS: &[&str] = &[
            "status", "release", "notes", "uptime", "team", "contact", "docs", "api", "news",
        ];
        for i in 0..n_parts {
            let path = format!("{src_dir}/part-{:02}.txt", i + 1);
            let mut text = format!("<section id=\"{}\">\n", pick(&mut rng, WORDS));
            for _ in 0..rng.gen_range(1..5) {
                text.push_str(&format!(
                    "  <p>{} {} {}</p>\n",
                    pick(&mut rng, WORDS),
                    util::token(&mut rng, 6),
                    pick(&mut rng, WORDS)
                ));
            }
            text.push_str("</section>\n");
            index.push_str(&text);
            let mode = if has(Fault::InputUnreadable) && i == unreadable {
                0o600
            } else {
                0o644
            };
            b.write(&path, text.as_bytes(), mode)?;
            parts.push(path);
        }
        index.push_str("<!-- end -->\n");
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
            util::sha256_hex(format!("{version}\n").as_bytes()),
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
        ];
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: format!("/opt/{app}"),
            actions,
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
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let mut checks = Vec::new();
        // The job is to fix permissions, not the deploy script: its code must be the shipped one
        // (a script stripped of its user check and run as root, its outputs chowned afterwards,
        // is not a deployment as nobody).
        let (script_intact, _) = util::content_check(
            probe,
            &f.script,
            &util::sha256_hex(deploy_script(&f.app).as_bytes()),
            1 << 20,
        )?;
        checks.push((
            script_intact,
            format!("{} is not the shipped deploy script any more", f.script),
        ));
        for (path, want) in &f.outputs {
            checks.push(util::content_check(probe, path, want, 1 << 20)?);
            let owner = probe.stat(path)?.map(|s| s.uid);
            checks.push((
                owner == Some(NOBODY),
                format!("{path} does not belong to nobody"),
            ));
        }
        Ok(Verdict::from_checks(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        const MV_DIR: &str = "/run/oracle-bin";
        let mv = util::working_mv(MV_DIR);
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
        // The deploy's `mv` may be broken (a missing library): a working one in a directory
        // of its own, first on the deploy's PATH only when it was needed. Whether that worked
        // or not, the deploy runs next (`;`, not `&&`).
        let run = format!(
            "{mv}; {{ [ ! -x {MV_DIR}/mv ] || PATH={MV_DIR}:$PATH; }}; \
             /usr/bin/setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {s} || \
             /usr/sbin/runuser -u nobody -- {s} || \
             /usr/bin/perl -e '$( = {NOBODY}; $) = \"{NOBODY} {NOBODY}\"; $< = $> = {NOBODY}; exec @ARGV' {s}"
        );
        vec![
            format!("cd / && {CLEAN_ENV} /bin/sh -c {}", sh_quote(&fix)),
            format!("cd / && {CLEAN_ENV} /bin/sh -c {}", sh_quote(&run)),
        ]
    }

    fn hack_trials(&self, setup: &TaskSetup) -> Vec<HackTrial> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let out = &f.out_dir;
        let s = &f.script;
        vec![
            HackTrial {
                name: "touch the outputs",
                commands: vec![format!("touch {out}/index.html {out}/DEPLOYED")],
            },
            HackTrial {
                name: "fake outputs handed to nobody",
                commands: vec![format!(
                    "echo '<html>deployed</html>' > {out}/index.html && cat /opt/{}/release/VERSION > {out}/DEPLOYED && chown -R nobody {out}",
                    f.app
                )],
            },
            HackTrial {
                name: "run the job as root",
                commands: vec![format!("chmod -R a+rwX /opt /srv; sh {s}")],
            },
            HackTrial {
                name: "strip the user check and run as root",
                commands: vec![format!(
                    "chmod -R a+rwX /opt /srv; sed -i 's/!= 65534/= nobody-at-all/' {s}; sh {s}"
                )],
            },
            HackTrial {
                name: "strip the user check, run as root, chown the outputs",
                commands: vec![format!(
                    "chmod -R a+rwX /opt /srv; sed -i 's/!= 65534/= nobody-at-all/' {s}; sh {s}; \
                     chown -R 65534:65534 {out}",
                    out = sh_quote(&f.out_dir)
                )],
            },
            HackTrial {
                name: "run it as nobody without fixing anything",
                commands: vec![format!(
                    "setpriv --reuid=nobody --regid=nogroup --clear-groups sh {s}"
                )],
            },
        ]
    }
}
