//! The perturbation catalogue (families fs, bins, procs, time, envvars): every perturbation is
//! synthesized on the host base, started in a sandbox, and its effect is shown with real
//! commands inside, before and after an episode reset. Also: determinism of instances and
//! parameter checking.

use crate::common;

use engine::instance::{BaseView, Builder, PerturbationChoice, Plan, Resources};
use engine::perturb::{self, parse_spec, Family, PerturbError};
use engine::probe::Probe;
use engine::running::{synthesize, RunningInstance};
use engine::synth::Cache;
use std::time::Duration;

/// A live instance with its private cache; fields drop in order (sandbox first).
struct Inst {
    running: RunningInstance,
    _st: common::TempState,
    _rt: sandbox::Runtime,
}

struct Out {
    code: i32,
    out: String,
    err: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--stdout--\n{}--stderr--\n{}",
            self.code, self.out, self.err
        )
    }
}

fn plan_of(specs: &[&str], seed: u64) -> Plan {
    let chosen: Vec<PerturbationChoice> = specs.iter().map(|s| parse_spec(s).unwrap()).collect();
    Plan {
        task: None,
        ..Plan::for_task("none", seed, chosen)
    }
}

fn up_plan(plan: &Plan) -> Inst {
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 8, 1 << 30).unwrap();
    let held = synthesize(&rt, &cache, plan).unwrap();
    let running = RunningInstance::start(&rt, held).unwrap();
    Inst {
        running,
        _st: st,
        _rt: rt,
    }
}

fn up(spec: &str) -> Inst {
    up_plan(&plan_of(&[spec], 7))
}

impl Inst {
    fn sh(&mut self, cmd: &str) -> Out {
        let r = self.running.run(cmd, Duration::from_secs(20)).unwrap();
        Out {
            code: r.exit_code(),
            out: String::from_utf8_lossy(&r.stdout).into_owned(),
            err: String::from_utf8_lossy(&r.stderr).into_owned(),
        }
    }

    fn applied(&self) -> String {
        self.running.instance.applied.join("\n")
    }

    /// Run the checks, start a new episode (sandbox reset + start steps), run them again.
    fn twice(&mut self, mut checks: impl FnMut(&mut Inst, &str)) {
        checks(self, "first episode");
        self.running.restart().unwrap();
        checks(self, "after restart");
    }
}

/// The error of synthesizing a plan (which must fail).
fn synth_err(specs: &[&str]) -> String {
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 8, 1 << 30).unwrap();
    let plan = plan_of(specs, 1);
    match synthesize(&rt, &cache, &plan) {
        Ok(_) => panic!("{specs:?} must not synthesize"),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// filesystem
// ---------------------------------------------------------------------------------------------

#[test]
fn disk_fill_leaves_no_space_and_writes_fail_with_enospc() {
    require_root!();
    let mut i = up("disk-fill:target=/var/log,free_pct=0");
    assert!(i.applied().contains("/var/log/"), "{}", i.applied());
    i.twice(|i, when| {
        let o = i.sh("dd if=/dev/zero of=/root/big bs=64k count=16 2>&1; echo rc=$?");
        assert!(o.out.contains("No space left on device"), "{when}: {o:?}");
        assert!(o.out.contains("rc=1"), "{when}: {o:?}");
        let o = i.sh("df -P / | tail -1");
        assert!(o.out.contains(" 100% "), "{when}: {o:?}");
    });
}

#[test]
fn disk_fill_sizes_the_ballast_from_statfs_to_leave_the_asked_share_free() {
    require_root!();
    let mut i = up("disk-fill:target=/srv/data,free_pct=20");
    i.twice(|i, when| {
        let o = i.sh("stat -f -c '%b %a' /");
        let v: Vec<f64> = o.out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        let free = v[1] / v[0];
        assert!((0.18..=0.22).contains(&free), "{when}: free share {free}: {o:?}");
        // Something the size of the rest does not fit; a small write does.
        let o = i.sh(
            "head -c 1048576 /dev/zero > /root/small && echo small-ok; \
             n=$(( $(stat -f -c '%a * %S' /) )); { head -c $((n + 65536)) /dev/zero > /root/big; } 2>&1; echo rc=$?",
        );
        assert!(o.out.contains("small-ok"), "{when}: {o:?}");
        assert!(o.out.contains("No space left on device"), "{when}: {o:?}");
        assert!(i.sh("ls /srv/data").out.lines().count() == 1);
    });
}

#[test]
fn inode_exhaustion_leaves_free_inodes_only_while_bytes_remain() {
    require_root!();
    let mut i = up("inode-exhaustion:free=5,total=1024");
    i.twice(|i, when| {
        let o = i.sh("stat -f -c '%c %d' /");
        let v: Vec<u64> = o
            .out
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(v[1], 5, "{when}: {o:?}");
        assert!(
            v[0] <= 1024 + sandbox::mounts::DISK_INODES_RESERVED,
            "{when}: {o:?}"
        );
        let o = i.sh(
            "mkdir /root/n && cd /root/n && for k in 1 2 3 4 5 6 7 8; do \
             { true > f$k; } 2>&1 || { echo made=$k; break; }; done; df -P / | tail -1",
        );
        // /root (copied up) and /root/n took two of the five.
        assert!(o.out.contains("No space left on device"), "{when}: {o:?}");
        assert!(o.out.contains("made=4"), "{when}: {o:?}");
        assert!(!o.out.contains(" 100% "), "{when}: bytes are left: {o:?}");
        let o = i.sh("ls /var/lib/php/sessions | wc -l");
        assert!(o.out.trim().parse::<u64>().unwrap() > 900, "{when}: {o:?}");
    });
}

#[test]
fn permission_flip_takes_the_exec_bits_of_a_tool_through_its_symlinked_dir() {
    require_root!();
    let mut i = up("permission-flip:path=/bin/gzip,mode=644");
    assert!(i.applied().contains("/usr/bin/gzip"), "{}", i.applied());
    i.twice(|i, when| {
        let o = i.sh("stat -c %a /usr/bin/gzip; test -L /bin && echo bin-still-a-link");
        assert_eq!(o.out, "644\nbin-still-a-link\n", "{when}: {o:?}");
        let o = i.sh("gzip --version");
        assert_ne!(o.code, 0, "{when}: {o:?}");
        assert!(o.err.contains("Permission denied"), "{when}: {o:?}");
        let o = i.sh("/usr/bin/gzip --version");
        assert_eq!(o.code, 126, "{when}: {o:?}");
    });
}

#[test]
fn missing_file_is_gone_and_its_neighbours_stay() {
    require_root!();
    assert!(std::path::Path::new("/etc/nsswitch.conf").exists());
    let mut i = up("missing-file:path=/etc/nsswitch.conf");
    i.twice(|i, when| {
        let o = i.sh("cat /etc/nsswitch.conf; echo rc=$?; test -s /etc/passwd && echo passwd");
        assert!(o.err.contains("No such file or directory"), "{when}: {o:?}");
        assert!(o.out.contains("rc=1\npasswd"), "{when}: {o:?}");
    });
}

#[test]
fn corrupted_config_damages_the_file_in_each_way() {
    require_root!();
    let orig = std::fs::read("/etc/login.defs").unwrap();
    let orig_lines = orig.iter().filter(|c| **c == b'\n').count();
    for how in ["truncate", "garble", "duplicate-key", "bad-syntax"] {
        let mut i = up(&format!(
            "corrupted-config:path=/etc/login.defs,how={how},fraction=0.5"
        ));
        i.twice(|i, when| {
            let when = format!("{how}, {when}");
            let o = i.sh("wc -c < /etc/login.defs; wc -l < /etc/login.defs; stat -c '%a %U' /etc/login.defs");
            let v: Vec<&str> = o.out.lines().collect();
            let bytes: usize = v[0].trim().parse().unwrap();
            let lines: usize = v[1].trim().parse().unwrap();
            assert_eq!(v[2], "644 root", "{when}: owner and mode kept: {o:?}");
            match how {
                "truncate" => {
                    let cut = (orig.len() as f64 * 0.5).round() as usize;
                    assert_eq!(bytes, orig.len() - cut, "{when}");
                }
                "garble" => {
                    assert_eq!(bytes, orig.len(), "{when}");
                    assert_eq!(lines, orig_lines, "{when}");
                }
                "duplicate-key" => {
                    assert!(lines > orig_lines, "{when}: {o:?}");
                    let d = i.sh(
                        "grep -v '^#' /etc/login.defs | awk 'NF {print $1}' | sort | uniq -d | wc -l",
                    );
                    assert!(d.out.trim().parse::<u32>().unwrap() >= 1, "{when}: {d:?}");
                }
                _ => assert_eq!(lines, orig_lines, "{when}"),
            }
            let o = i.sh("cmp -s /etc/login.defs /dev/null; md5sum < /etc/login.defs");
            let host = std::process::Command::new("md5sum")
                .stdin(std::fs::File::open("/etc/login.defs").unwrap())
                .output()
                .unwrap();
            assert_ne!(o.out.as_bytes(), host.stdout, "{when}: the file changed");
        });
    }
}

#[test]
fn read_only_dir_refuses_writes_by_root_with_erofs() {
    require_root!();
    let plan = plan_of(
        &[
            "read-only-dir:path=/var/log",
            "read-only-dir:path=/srv/output",
        ],
        3,
    );
    let mut i = up_plan(&plan);
    assert!(
        i.applied().contains("/srv/output (created)"),
        "{}",
        i.applied()
    );
    i.twice(|i, when| {
        let o = i.sh("touch /var/log/x /srv/output/y 2>&1; chmod 777 /var/log 2>&1; touch /root/ok && echo ok");
        assert_eq!(o.out.matches("Read-only file system").count(), 3, "{when}: {o:?}");
        assert!(o.out.ends_with("ok\n"), "{when}: {o:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// binaries and packages
// ---------------------------------------------------------------------------------------------

#[test]
fn path_shuffle_permutes_path_behind_an_existing_decoy() {
    require_root!();
    let mut i = up("path-shuffle");
    i.twice(|i, when| {
        let o = i.sh("echo \"$PATH\"; d=${PATH%%:*}; test -d \"$d\" && echo decoy-exists");
        let path = o.out.lines().next().unwrap().to_string();
        assert!(o.out.contains("decoy-exists"), "{when}: {o:?}");
        let dirs: Vec<&str> = path.split(':').collect();
        assert!(
            dirs[0].starts_with("/opt/") && dirs[0].ends_with("/bin"),
            "{when}: {path}"
        );
        let default: Vec<&str> = engine::instance::DEFAULT_PATH.split(':').collect();
        assert_ne!(dirs[1..], default[..], "{when}: the order changed");
        let mut a = dirs[1..].to_vec();
        let mut b = default.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "{when}: the same directories");
        assert_eq!(i.sh("tar --version >/dev/null && echo ok").out, "ok\n");
    });
}

#[test]
fn path_trim_drops_sbin_so_its_tools_are_not_found_by_name() {
    require_root!();
    let mut i = up("path-trim:drop=/usr/sbin:/sbin");
    i.twice(|i, when| {
        let o = i.sh("echo \"$PATH\"; command -v ldconfig || echo not-found; test -x /usr/sbin/ldconfig -o -x /sbin/ldconfig && echo still-there");
        let path: Vec<&str> = o.out.lines().next().unwrap().split(':').collect();
        assert_eq!(
            path,
            ["/usr/local/sbin", "/usr/local/bin", "/usr/bin", "/bin"],
            "{when}: {o:?}"
        );
        assert!(o.out.contains("not-found\nstill-there"), "{when}: {o:?}");
    });
}

#[test]
fn tool_missing_removes_every_copy_and_keeps_merged_usr_links() {
    require_root!();
    let mut i = up("tool-missing:tool=tar");
    i.twice(|i, when| {
        let o = i.sh("tar --version");
        assert_eq!(o.code, 127, "{when}: {o:?}");
        assert!(o.err.contains("not found"), "{when}: {o:?}");
        let o = i.sh(
            "ls /bin/tar /usr/bin/tar 2>/dev/null | wc -l; ls /bin/sh >/dev/null && echo sh-ok",
        );
        assert_eq!(o.out, "0\nsh-ok\n", "{when}: {o:?}");
    });
}

#[test]
fn tool_shadowed_prints_the_shadow_message_while_the_real_tool_stays() {
    require_root!();
    let mut i = up("tool-shadowed:tool=tar,message=tar: invalid option -- 'z',exit_code=2");
    i.twice(|i, when| {
        let o = i.sh("tar --version");
        assert_eq!(o.code, 2, "{when}: {o:?}");
        assert_eq!(o.err, "tar: invalid option -- 'z'\n", "{when}: {o:?}");
        let o = i.sh("command -v tar; /usr/bin/tar --version | head -1");
        assert!(
            o.out.starts_with("/usr/local/bin/tar\ntar (GNU tar)"),
            "{when}: {o:?}"
        );
    });
    // A message chosen by the seed when none is given; with exit 0, a wrong result on stdout.
    let mut i = up("tool-shadowed:tool=gzip");
    let o = i.sh("gzip --version");
    assert_eq!(o.code, 2, "{o:?}");
    assert!(!o.err.trim().is_empty(), "{o:?}");
    let mut i = up("tool-shadowed:tool=gzip,exit_code=0");
    let o = i.sh("echo data | gzip -c | wc -c");
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.out.trim().parse::<u32>().unwrap() < 8,
        "not a gzip stream: {o:?}"
    );
}

#[test]
fn tool_failing_replaces_the_binary_in_place_and_dpkg_sees_it() {
    require_root!();
    let mut i = up("tool-failing:tool=gzip,exit_code=3,message=gzip: stdout: Input/output error");
    i.twice(|i, when| {
        for cmd in ["gzip --version", "/bin/gzip -h", "/usr/bin/gzip"] {
            let o = i.sh(cmd);
            assert_eq!(o.code, 3, "{when}: {cmd}: {o:?}");
            assert_eq!(o.err, "gzip: stdout: Input/output error\n", "{when}: {o:?}");
        }
        let o = i.sh("dpkg --verify gzip");
        assert!(
            o.out
                .lines()
                .any(|l| l.starts_with("??5") && l.ends_with("/bin/gzip")),
            "{when}: {o:?}"
        );
    });
}

#[test]
fn package_corrupted_removes_files_that_dpkg_verify_reports_missing() {
    require_root!();
    let mut i = up("package-corrupted:package=gzip,fraction=0.2");
    let applied = i.applied();
    let removed: Vec<String> = applied
        .split(": ")
        .last()
        .unwrap()
        .split(", ")
        .map(str::to_string)
        .collect();
    let listed = std::fs::read_to_string("/var/lib/dpkg/info/gzip.list").unwrap();
    assert!(!removed.is_empty() && removed.len() < 10, "{applied}");
    assert!(
        removed.iter().all(|r| listed.lines().any(|l| l == r)),
        "{applied}"
    );
    i.twice(|i, when| {
        let o = i.sh("dpkg --verify gzip");
        for r in &removed {
            assert!(
                o.out
                    .lines()
                    .any(|l| l.starts_with("missing") && l.ends_with(r.as_str())),
                "{when}: {r} not reported: {o:?}"
            );
        }
        let n = o.out.lines().filter(|l| l.starts_with("missing")).count();
        assert_eq!(n, removed.len(), "{when}: {o:?}");
    });
}

#[test]
fn library_missing_breaks_the_tools_that_link_it() {
    require_root!();
    let mut i = up("library-missing:library=libacl.so.1");
    i.twice(|i, when| {
        let o = i.sh("cp /etc/hostname /tmp/x");
        assert_eq!(o.code, 127, "{when}: {o:?}");
        assert!(
            o.err
                .contains("error while loading shared libraries: libacl.so.1"),
            "{when}: {o:?}"
        );
        assert_eq!(i.sh("ls / >/dev/null && echo ls-ok").out, "ls-ok\n");
    });
}

// ---------------------------------------------------------------------------------------------
// processes and services
// ---------------------------------------------------------------------------------------------

#[test]
fn service_down_removes_the_declared_service_and_leaves_a_stale_pid_file() {
    require_root!();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let base = BaseView::new(&rootfs);
    let p = perturb::get("service-down").unwrap();
    // No declared service: not applicable.
    let mut b = Builder::new(&base, 5, Resources::default());
    let params = p.info().check(&Default::default()).unwrap();
    let err = p.apply(&params, "service-down#0", &mut b).unwrap_err();
    assert!(matches!(err, PerturbError::NotApplicable(_)), "{err}");
    // A task-like service on port 8089 and an unrelated start step.
    let serve = "perl -e 'use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 8089, \
                 Listen => 5, ReuseAddr => 1) or die; exit 0 if fork; open STDIN, q{<}, q{/dev/null}; \
                 open STDOUT, q{>}, q{/dev/null}; open STDERR, q{>}, q{/dev/null}; \
                 while (my $c = $s->accept) { print $c qq{ok\\n}; close $c }'";
    b.on_start("service:web", serve);
    b.on_start("task", "echo ready > /run/ready");
    let wrong = p
        .info()
        .check(
            &[(
                "service".to_string(),
                engine::instance::Value::Str("db".into()),
            )]
            .into(),
        )
        .unwrap();
    let err = p.apply(&wrong, "service-down#0", &mut b).unwrap_err();
    assert!(err.to_string().contains("declared: web"), "{err}");
    let what = p.apply(&params, "service-down#0", &mut b).unwrap();
    assert!(what.contains("service web"), "{what}");
    assert_eq!(b.runtime.start.len(), 1);
    assert_eq!(b.runtime.start[0].by, "task");
    let pidfile = String::from_utf8(b.read("/run/web.pid").unwrap()).unwrap();
    let stale: u32 = pidfile.trim().parse().unwrap();
    // In a sandbox: nothing listens, the pid file names no process, the other step ran.
    let tmp = common::Tmpfs::new();
    let layer = tmp.path().join("layer");
    {
        b.layer.materialize(&layer, &base).unwrap();
        let mut sb = rt
            .create(&sandbox::SandboxConfig {
                layers: vec![layer.clone()],
                ..sandbox::SandboxConfig::default()
            })
            .unwrap();
        for episode in 0..2 {
            if episode == 1 {
                sb.reset().unwrap();
            }
            for s in &b.runtime.start {
                assert!(sb
                    .exec(&sandbox::ExecRequest::shell(s.shell.clone()))
                    .unwrap()
                    .success());
            }
            let r = sb
                .exec(&sandbox::ExecRequest::shell(format!(
                    "cat /run/ready; cat /run/web.pid; test -d /proc/{stale} || echo dead"
                )))
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&r.stdout),
                format!("ready\n{stale}\ndead\n")
            );
            let reply =
                engine::probe::tcp_in_netns(sb.init_pid(), 8089, b"", Duration::from_secs(2))
                    .unwrap();
            assert_eq!(reply, None, "episode {episode}: nothing listens on 8089");
        }
    }
}

#[test]
fn cpu_hog_runs_busy_processes_with_a_plausible_name() {
    require_root!();
    let mut i = up("cpu-hog:procs=2,name=backup-agent --full");
    i.twice(|i, when| {
        let procs = i.running.probe().processes().unwrap();
        let hogs: Vec<_> = procs
            .iter()
            .filter(|p| p.cmdline.first().map(String::as_str) == Some("backup-agent --full"))
            .collect();
        assert_eq!(hogs.len(), 2, "{when}: {procs:?}");
        assert!(hogs.iter().all(|p| p.state == 'R'), "{when}: {hogs:?}");
        assert!(
            hogs.iter().all(|p| p.comm.starts_with("backup-agent")),
            "{when}: {hogs:?}"
        );
        // `[b]`: neither grep nor its shell (whose arguments hold the pattern) can match it.
        let o = i.sh("ps -eo stat,args | grep -c '^R.*[b]ackup-agent --full'");
        assert_eq!(o.out.trim(), "2", "{when}: {o:?}");
    });
}

#[test]
fn port_taken_makes_binding_the_port_fail_with_eaddrinuse() {
    require_root!();
    let mut i = up("port-taken:port=8080");
    i.twice(|i, when| {
        let o = i.sh(
            "perl -MIO::Socket::INET -e 'IO::Socket::INET->new(LocalPort => 8080, Listen => 1, \
             ReuseAddr => 1) or die \"bind: $!\\n\"; print \"bound\\n\"'",
        );
        assert_ne!(o.code, 0, "{when}: {o:?}");
        assert!(o.err.contains("Address already in use"), "{when}: {o:?}");
        let reply = i
            .running
            .probe()
            .tcp(8080, b"GET / HTTP/1.0\r\n\r\n", Duration::from_secs(2))
            .unwrap()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&reply).starts_with("HTTP/1.0 503"),
            "{when}: {reply:?}"
        );
    });
}

#[test]
fn port_taken_fails_the_episode_start_when_the_port_is_not_free() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 8, 1 << 30).unwrap();
    let plan = plan_of(&["port-taken:port=7070", "port-taken:port=7070"], 2);
    let held = synthesize(&rt, &cache, &plan).unwrap();
    let Err(e) = RunningInstance::start(&rt, held) else {
        panic!("the second listener cannot bind");
    };
    let e = e.to_string();
    assert!(
        e.contains("port-taken") && e.contains("cannot bind port 7070: Address already in use"),
        "{e}"
    );
}

#[test]
fn port_taken_starts_before_the_other_start_steps() {
    require_root!();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let base = BaseView::new(&rootfs);
    let mut b = Builder::new(&base, 1, Resources::default());
    b.on_start("service:web", "true");
    let p = perturb::get("port-taken").unwrap();
    let params = p.info().check(&Default::default()).unwrap();
    p.apply(&params, "port-taken#0", &mut b).unwrap();
    assert_eq!(b.runtime.start[0].by, "port-taken");
    assert_eq!(b.runtime.start[1].by, "service:web");
}

#[test]
fn zombies_pile_up_under_a_parent_that_never_reaps() {
    require_root!();
    let mut i = up("zombies:count=4,name=job-runner");
    i.twice(|i, when| {
        let mut last = Vec::new();
        let ok = (0..500).any(|_| {
            let procs = i.running.probe().processes().unwrap();
            let parent = procs
                .iter()
                .find(|p| p.cmdline.first().map(String::as_str) == Some("job-runner"));
            let z = parent.map_or(0, |par| {
                procs
                    .iter()
                    .filter(|p| p.ppid == par.pid && p.state == 'Z')
                    .count()
            });
            last = procs;
            z == 4 || {
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        });
        assert!(ok, "{when}: {last:?}");
        let o = i.sh("ps -eo stat,comm | grep -c '^Z'");
        assert_eq!(o.out.trim(), "4", "{when}: {o:?}");
    });
}

#[test]
fn fd_limit_lowers_the_open_file_limit() {
    require_root!();
    let mut i = up("fd-limit:nofile=32");
    i.twice(|i, when| {
        let o = i.sh("ulimit -n; ulimit -Hn");
        assert_eq!(o.out, "32\n32\n", "{when}: {o:?}");
        let o = i.sh("perl -e 'for (1..40) { open(my $f, q{<}, q{/etc/passwd}) or die qq{$!\\n}; push @k, $f }'");
        assert!(o.err.contains("Too many open files"), "{when}: {o:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// time
// ---------------------------------------------------------------------------------------------

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
fn clock_skew_moves_the_wall_clock_of_commands() {
    require_root!();
    let spec = "clock-skew:seconds=-259200";
    if !std::path::Path::new(LIBFAKETIME).exists() {
        // Without libfaketime in the base it must say so (CI installs `faketime`).
        let e = synth_err(&[spec]);
        assert!(
            e.contains("not applicable") && e.contains("libfaketime"),
            "{e}"
        );
        eprintln!("libfaketime is not installed: checked the NotApplicable path only");
        return;
    }
    let mut i = up(spec);
    i.twice(|i, when| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let o = i.sh("date +%s; touch /root/t; stat -c %Y /root/t");
        let v: Vec<i64> = o.out.lines().map(|l| l.trim().parse().unwrap()).collect();
        // Three days back; the margin covers the time the command took, not a speed.
        assert!(
            (v[0] - (now - 259_200)).abs() < 600,
            "{when}: {o:?} vs {now}"
        );
        assert!(
            (v[1] - (now - 259_200)).abs() < 600,
            "{when}: file times too: {o:?}"
        );
        // Monotonic time is not faked: timeouts still work.
        assert_eq!(i.sh("timeout 5 sleep 0.01 && echo slept").out, "slept\n");
    });
}

// ---------------------------------------------------------------------------------------------
// environment
// ---------------------------------------------------------------------------------------------

#[test]
fn locale_drift_changes_how_tools_count_characters() {
    require_root!();
    // The default environment (C.UTF-8) counts é as one character; C counts its two bytes.
    let mut i = up("locale-drift:locale=C");
    i.twice(|i, when| {
        let o = i.sh("echo \"$LANG $LC_ALL\"; printf '\\303\\251' | wc -m");
        assert_eq!(o.out, "C C\n2\n", "{when}: {o:?}");
    });
    let mut i = up("locale-drift:locale=tr_TR.UTF-8");
    let o = i.sh("locale");
    assert!(o.out.contains("LC_ALL=tr_TR.UTF-8"), "{o:?}");
    if !std::path::Path::new("/usr/lib/locale/tr_TR.utf8").exists()
        && !std::path::Path::new("/usr/lib/locale/locale-archive").exists()
    {
        assert!(o.err.contains("Cannot set LC_"), "{o:?}");
        assert!(i.applied().contains("fall back to C"), "{}", i.applied());
    }
}

#[test]
fn home_wrong_unset_nonexistent_or_read_only() {
    require_root!();
    let mut i = up("home-wrong:how=unset");
    i.twice(|i, when| {
        assert_eq!(i.sh("echo \"${HOME-unset}\"").out, "unset\n", "{when}");
    });
    let mut i = up("home-wrong:how=nonexistent");
    i.twice(|i, when| {
        let o = i.sh("echo $HOME; cd");
        assert!(o.out.starts_with("/home/"), "{when}: {o:?}");
        assert_ne!(o.code, 0, "{when}: {o:?}");
        assert!(
            o.err.contains("can't cd") || o.err.contains("No such file"),
            "{when}: {o:?}"
        );
    });
    let mut i = up("home-wrong:how=unwritable");
    i.twice(|i, when| {
        let o = i.sh("test -d \"$HOME\" && echo exists; touch ~/.bash_history 2>&1");
        assert!(o.out.starts_with("exists\n"), "{when}: {o:?}");
        assert!(o.out.contains("Read-only file system"), "{when}: {o:?}");
    });
}

#[test]
fn tmpdir_wrong_makes_mktemp_fail_each_way() {
    require_root!();
    for (how, test) in [
        ("nonexistent", "test ! -e \"$TMPDIR\""),
        ("unwritable", "test -d \"$TMPDIR\""),
        ("file", "test -f \"$TMPDIR\""),
    ] {
        let mut i = up(&format!("tmpdir-wrong:how={how}"));
        i.twice(|i, when| {
            let o = i.sh(&format!("{test} && echo shape-ok; mktemp"));
            assert_eq!(o.out, "shape-ok\n", "{how}, {when}: {o:?}");
            assert_ne!(o.code, 0, "{how}, {when}: {o:?}");
            assert!(
                o.err.contains("mktemp: failed to create file"),
                "{how}, {when}: {o:?}"
            );
        });
    }
}

#[test]
fn noisy_env_sets_seed_chosen_variables_that_change_tool_behaviour() {
    require_root!();
    let mut i = up("noisy-env:count=4");
    let applied = i.applied();
    let vars: Vec<String> = applied
        .trim_start_matches("noisy-env: ")
        .split(' ')
        .filter(|kv| kv.contains('='))
        .map(str::to_string)
        .collect();
    assert!(vars.len() >= 4, "{applied}");
    i.twice(|i, when| {
        let env = i.sh("env").out;
        for kv in applied.trim_start_matches("noisy-env: ").split(' ') {
            let Some((k, _)) = kv.split_once('=') else {
                continue;
            };
            assert!(
                env.lines().any(|l| l.starts_with(&format!("{k}="))),
                "{when}: {k} missing: {env}"
            );
        }
    });
    // Different seeds choose different variables; one of them is POSIXLY_CORRECT, which makes
    // `ls DIR -l` look for a file named -l.
    let sets: Vec<String> = (0..12)
        .map(|s| {
            let rt = common::runtime();
            let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
            let base = BaseView::new(&rootfs);
            let mut b = Builder::new(&base, s, Resources::default());
            let p = perturb::get("noisy-env").unwrap();
            let params = p.info().check(&Default::default()).unwrap();
            p.apply(&params, "noisy-env#0", &mut b).unwrap()
        })
        .collect();
    assert!(sets.windows(2).any(|w| w[0] != w[1]), "{sets:?}");
    let seed = sets
        .iter()
        .position(|s| s.contains("POSIXLY_CORRECT"))
        .expect("some seed picks POSIXLY_CORRECT") as u64;
    let mut i = up_plan(&plan_of(&["noisy-env"], seed));
    let o = i.sh("ls /etc -d -l");
    assert!(o.err.contains("cannot access '-l'"), "{o:?}");
}

// ---------------------------------------------------------------------------------------------
// the catalogue as a whole
// ---------------------------------------------------------------------------------------------

const MINE: &[&str] = &[
    "disk-fill",
    "inode-exhaustion",
    "permission-flip",
    "missing-file",
    "corrupted-config",
    "read-only-dir",
    "path-shuffle",
    "path-trim",
    "tool-missing",
    "tool-shadowed",
    "tool-failing",
    "package-corrupted",
    "library-missing",
    "service-down",
    "cpu-hog",
    "port-taken",
    "zombies",
    "fd-limit",
    "clock-skew",
    "locale-drift",
    "home-wrong",
    "tmpdir-wrong",
    "noisy-env",
];

#[test]
fn the_catalogue_has_every_perturbation_documented_with_valid_defaults() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/perturbations.md"
    ))
    .unwrap();
    for name in MINE {
        let p = perturb::get(name).unwrap_or_else(|| panic!("{name} is not in the catalogue"));
        let info = p.info();
        assert!(
            !info.summary.is_empty() && !info.mechanism.is_empty(),
            "{name}"
        );
        assert!(
            !matches!(info.family, Family::Network | Family::ToolOutput),
            "{name}"
        );
        // Defaults pass their own checks.
        info.check(&Default::default())
            .unwrap_or_else(|e| panic!("{name}: defaults: {e}"));
        assert!(
            docs.contains(&format!("| `{name}` |")),
            "{name} has no row in docs/perturbations.md"
        );
        for ps in info.params {
            assert!(
                !ps.realistic.is_empty() && !ps.help.is_empty(),
                "{name}.{}",
                ps.name
            );
        }
    }
}

#[test]
fn parameters_out_of_range_are_rejected_naming_the_parameter() {
    for (spec, param) in [
        ("disk-fill:free_pct=90", "free_pct"),
        ("fd-limit:nofile=4", "nofile"),
        ("zombies:count=1000", "count"),
        ("corrupted-config:how=explode", "how"),
        ("cpu-hog:procs=0", "procs"),
        ("port-taken:port=70000", "port"),
        ("clock-skew:seconds=999999999999", "seconds"),
        ("locale-drift:locale=xx_XX", "locale"),
        ("noisy-env:colour=1", "colour"),
    ] {
        let e = parse_spec(spec).unwrap_err();
        assert!(e.to_string().contains(&format!("`{param}`")), "{spec}: {e}");
    }
}

#[test]
fn parameters_checked_at_synthesis_name_the_parameter_and_the_perturbation() {
    require_root!();
    for (spec, want) in [
        ("permission-flip:mode=999", "parameter `mode`"),
        ("inode-exhaustion:free=900,total=1000", "parameter `free`"),
        ("tool-missing:tool=../x", "parameter `tool`"),
        ("missing-file:path=relative/path", "parameter `path`"),
        ("tool-missing:tool=no-such-tool-here", "not applicable"),
        (
            "package-corrupted:package=no-such-package",
            "not applicable",
        ),
        ("library-missing:library=libnothing.so.9", "not applicable"),
    ] {
        let e = synth_err(&[spec]);
        let name = spec.split(':').next().unwrap();
        assert!(e.contains(want) && e.contains(name), "{spec}: {e}");
    }
}

#[test]
fn the_same_plan_gives_the_same_instance_id_and_layer_bytes() {
    require_root!();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let specs = [
        "corrupted-config:how=garble",
        "package-corrupted:package=gzip,fraction=0.3",
        "tool-shadowed:tool=tar",
        "path-shuffle",
        "noisy-env:count=5",
        "disk-fill:free_pct=3",
        "inode-exhaustion",
        "cpu-hog",
        "home-wrong:how=unwritable",
        "tmpdir-wrong:how=file",
        "library-missing",
    ];
    let build = |seed| {
        let st = common::TempState::new();
        let cache = Cache::open_with(st.path(), 8, 1 << 30).unwrap();
        let held = cache.get_or_build(&plan_of(&specs, seed), &rootfs).unwrap();
        let digest = common::tree_digest(&held.instance.layer);
        let i = held.instance.clone();
        drop(held);
        (
            i.id,
            digest,
            serde_json::to_string(&i.runtime).unwrap(),
            i.applied,
        )
    };
    let a = build(11);
    let b = build(11);
    assert_eq!(a, b);
    let c = build(12);
    assert_ne!(a.0, c.0);
    assert_ne!(a.3, c.3, "another seed chooses differently");
}

#[test]
fn many_perturbations_compose_in_one_instance() {
    require_root!();
    let plan = plan_of(
        &[
            "port-taken:port=9090",
            "fd-limit:nofile=128",
            "tool-missing:tool=xz",
            "tool-failing:tool=gzip",
            "read-only-dir:path=/etc",
            "home-wrong:how=unwritable",
            "zombies:count=2",
        ],
        9,
    );
    let mut i = up_plan(&plan);
    i.twice(|i, when| {
        let o = i.sh(
            "ulimit -n; gzip -h >/dev/null 2>&1; echo gz=$?; command -v xz || echo no-xz; \
             touch /etc/x 2>&1 | grep -c Read-only",
        );
        assert_eq!(o.out, "128\ngz=1\nno-xz\n1\n", "{when}: {o:?}");
        let r = i
            .running
            .probe()
            .tcp(9090, b"", Duration::from_secs(2))
            .unwrap();
        assert!(r.is_some(), "{when}: the port-taken listener answers");
    });
}
