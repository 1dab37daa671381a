//! `restore-service`: a local HTTP service (a perl script with its configuration, a secret and
//! a start script, all in the instance layer) is down because of one or two faults: a wrong
//! port in the configuration, a missing log directory, the script not executable, a wrong path
//! to the secret. The verifier makes a real HTTP request with a fresh random nonce each time;
//! the reply must carry a token derived from the nonce and the per-seed secret (a static reply
//! fails), and the socket listening on the port must belong to a process running the intended
//! script (a copy elsewhere, or another program, fails).
//!
//! The service follows the fault proxy's port convention (`perturb::net`): it listens on
//! [`SERVICE_PORT`] and clients reach it through a front proxy on [`FRONT_PORT`] that the task
//! declares, so the network perturbations' default ports land on this service's traffic and
//! `port-taken`'s default squats this service's port. The verifier talks to the service port
//! directly; only the agent's view goes through the (possibly faulty) front.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::instance::{plain_forward, FRONT_PORT, SERVICE_PORT};
use crate::probe::{Probe, ProbeError};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub struct RestoreService;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Fault {
    WrongPort,
    MissingLogDir,
    NotExecutable,
    WrongSecretPath,
}

const FAULTS: &[Fault] = &[
    Fault::WrongPort,
    Fault::MissingLogDir,
    Fault::NotExecutable,
    Fault::WrongSecretPath,
];

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    app: String,
    /// The port the service itself listens on (clients use the front, [`FRONT_PORT`]).
    port: u16,
    script: String,
    conf: String,
    /// The configuration that makes the service work.
    good_conf: String,
    log_dir: String,
    secret: String,
    faults: Vec<Fault>,
}

/// The token the server derives from a nonce: each nonce byte xor the secret's, in hex.
pub fn token(secret: &str, nonce: &str) -> String {
    let s = secret.as_bytes();
    if s.is_empty() {
        return String::new();
    }
    nonce
        .bytes()
        .enumerate()
        .map(|(i, b)| format!("{:02x}", b ^ s[i % s.len()]))
        .collect()
}

fn server_script(app: &str) -> String {
    format!(
        r#"#!/usr/bin/perl
# {app}: status service. Usage: server.pl CONFIG
use strict;
use warnings;
use IO::Socket::INET;

my $conf = shift // '/etc/{app}/{app}.conf';
my %c;
open my $fh, '<', $conf or die "{app}: cannot read $conf: $!\n";
while (<$fh>) {{
    next if /^\s*(#|$)/;
    $c{{$1}} = $2 if /^\s*(\w+)\s*=\s*(.*?)\s*$/;
}}
close $fh;
my $port = $c{{port}} or die "{app}: no port in $conf\n";
my $sfile = $c{{secret_file}} or die "{app}: no secret_file in $conf\n";
open my $sf, '<', $sfile or die "{app}: cannot read the secret $sfile: $!\n";
my $secret = <$sf> // '';
chomp $secret;
close $sf;
die "{app}: empty secret\n" unless length $secret;
my $dir = $c{{log_dir}} // '/var/log/{app}';
open my $log, '>>', "$dir/access.log" or die "{app}: cannot open $dir/access.log: $!\n";
$log->autoflush(1);
my $srv = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1', LocalPort => $port, Listen => 16, ReuseAddr => 1, Proto => 'tcp'
) or die "{app}: cannot listen on 127.0.0.1:$port: $!\n";
print STDERR "{app}: listening on 127.0.0.1:$port\n";
while (my $cl = $srv->accept) {{
    my $req = <$cl> // '';
    while (my $l = <$cl>) {{ last if $l =~ /^\r?\n$/ }}
    my ($nonce) = $req =~ /[?&]nonce=([A-Za-z0-9]+)/;
    $nonce //= '';
    my $tok = join '', map {{
        sprintf '%02x', ord(substr($nonce, $_, 1)) ^ ord(substr($secret, $_ % length($secret), 1))
    }} 0 .. length($nonce) - 1;
    my $body = "{app} ok\ntoken=$tok\n";
    print $cl "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
        . length($body) . "\r\n\r\n" . $body;
    print $log $req;
    close $cl;
}}
"#
    )
}

/// For the trials: a perl server that answers like the real one (the right token, read from
/// the secret file) without its configuration, its log or its code. With arguments, it first
/// forks them as a child that inherits the listening socket (`$^F`: not closed on exec).
fn fake_pl(secret_file: &str, port: u16) -> String {
    format!(
        r#"use IO::Socket::INET;
$^F = 1000;
open my $f, '<', '{secret_file}' or die "fake: $!\n";
my $s = <$f>; chomp $s;
my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => {port}, Listen => 16, ReuseAddr => 1) or die "fake: $!\n";
if (@ARGV) {{ defined(my $p = fork) or die; if (!$p) {{ exec {{ $ARGV[0] }} @ARGV; exit 1 }} }}
while (my $c = $l->accept) {{
    my $r = <$c> // ''; my ($n) = $r =~ /[?&]nonce=([A-Za-z0-9]+)/; $n //= '';
    my $t = join '', map {{ sprintf '%02x', ord(substr($n, $_, 1)) ^ ord(substr($s, $_ % length($s), 1)) }} 0 .. length($n) - 1;
    print $c "HTTP/1.0 200 OK\r\n\r\nfake ok\ntoken=$t\n"; close $c;
}}
"#
    )
}

/// The same fake in python (for a `sitecustomize` that runs before any script).
fn fake_py(secret_file: &str, port: u16) -> String {
    format!(
        r#"import re, socket
s = open('{secret_file}').read().strip()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', {port}))
l.listen(16)
while True:
    c, _ = l.accept()
    m = re.search(r'[?&]nonce=([A-Za-z0-9]+)', c.recv(4096).decode('latin1'))
    n = m.group(1) if m else ''
    t = ''.join('%02x' % (ord(ch) ^ ord(s[i % len(s)])) for i, ch in enumerate(n))
    c.sendall(('HTTP/1.0 200 OK\r\n\r\nfake ok\ntoken=' + t + '\n').encode())
    c.close()
"#
    )
}

/// Shell that waits (up to ~10 s) until something accepts on the port; perl only.
fn wait_listening(port: u16) -> String {
    format!(
        "/usr/bin/perl -MIO::Socket::INET -e 'for (1..200) {{ exit 0 if IO::Socket::INET->new(PeerAddr => \"127.0.0.1:{port}\"); select undef, undef, undef, 0.05 }} exit 1'"
    )
}

impl Task for RestoreService {
    fn name(&self) -> &'static str {
        "restore-service"
    }

    fn summary(&self) -> &'static str {
        "bring a broken local HTTP service back up (the real server, on its port)"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "restore-service");
        let app = pick(&mut rng, util::APPS).to_string();
        let (port, front) = (SERVICE_PORT, FRONT_PORT);
        let script = format!("/opt/{app}/server.pl");
        let start = format!("/opt/{app}/start.sh");
        let conf = format!("/etc/{app}/{app}.conf");
        let secret_file = format!("/etc/{app}/secret");
        let log_dir = format!("/var/log/{app}");
        let secret = util::token(&mut rng, 24);
        let mut faults: Vec<Fault> = Vec::new();
        let n = rng.gen_range(1..=2);
        while faults.len() < n {
            let f = *pick(&mut rng, FAULTS);
            if !faults.contains(&f) {
                faults.push(f);
            }
        }
        faults.sort_by_key(|f| *f as u8);
        let conf_text = |port: u16, secret_file: &str| {
            format!(
                "# {app} service\nport = {port}\nsecret_file = {secret_file}\nlog_dir = {log_dir}\n"
            )
        };
        let good_conf = conf_text(port, &secret_file);
        let bad_port = if faults.contains(&Fault::WrongPort) {
            port + rng.gen_range(1..50)
        } else {
            port
        };
        let bad_secret = if faults.contains(&Fault::WrongSecretPath) {
            format!("/etc/{app}/secret.key")
        } else {
            secret_file.clone()
        };
        b.write(&conf, conf_text(bad_port, &bad_secret).as_bytes(), 0o644)?;
        b.write(&secret_file, format!("{secret}\n").as_bytes(), 0o600)?;
        let mode = if faults.contains(&Fault::NotExecutable) {
            0o644
        } else {
            0o755
        };
        b.write(&script, server_script(&app).as_bytes(), mode)?;
        b.write(
            &start,
            format!(
                "#!/bin/sh\n# Start the {app} service in the background.\ncd /opt/{app} || exit 1\n\
                 {script} {conf} >> {log_dir}/server.out 2>&1 < /dev/null &\necho \"{app} started\"\n"
            )
            .as_bytes(),
            0o755,
        )?;
        if !faults.contains(&Fault::MissingLogDir) {
            b.mkdir(&log_dir, 0o755)?;
        }
        // The front: a plain forward that network perturbations (applied after the task) add
        // their faults to.
        b.runtime.proxies.push(plain_forward(front, port));
        let instruction = format!(
            "The HTTP service `{app}` must answer on http://127.0.0.1:{front}/ but it is down. \
             A front proxy on port {front} forwards to the service itself, which must listen \
             on 127.0.0.1:{port}. It is the perl script {script}, configured by {conf} and \
             started by {start}. Find out what is wrong, fix it and leave the real service \
             running on port {port}."
        );
        let actions = vec![
            format!("cat {conf}"),
            format!("cat {start}"),
            format!("sh {start}"),
            format!("ls -la /opt/{app} /etc/{app} {log_dir}"),
            format!("perl -c {script}"),
            format!("chmod +x {script}"),
            format!("mkdir -p {log_dir}"),
            format!("sed -i 's/^port = .*/port = {port}/' {conf}"),
            format!("sed -i 's#^secret_file = .*#secret_file = {secret_file}#' {conf}"),
            format!("curl -s http://127.0.0.1:{front}/"),
            format!("curl -s http://127.0.0.1:{port}/"),
            format!("cat {log_dir}/server.out"),
            "ps aux".to_string(),
            format!("rm -f {conf}"),
            format!("python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &"),
        ];
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            keywords: util::words(&[
                "curl", "perl", "chmod", "mkdir", "sed", "cat", "ps", "ss", "port", "service",
                "start", &app,
            ]),
            max_steps: 30,
            facts: util::to_facts(&Facts {
                app,
                port,
                script,
                conf,
                good_conf,
                log_dir,
                secret,
                faults,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let mut rng = rand::thread_rng();
        let nonce: String = (0..16)
            .map(|_| {
                let c = rng.gen_range(0..36u32);
                char::from_digit(c, 36).unwrap_or('x')
            })
            .collect();
        let req = format!(
            "GET /status?nonce={nonce} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            f.port
        );
        let reply = probe.tcp(f.port, req.as_bytes(), Duration::from_secs(3))?;
        let want = format!("token={}", token(&f.secret, &nonce));
        let (answered, right) = match &reply {
            None => (false, false),
            Some(r) => {
                let text = String::from_utf8_lossy(r);
                let status_ok = text.lines().next().is_some_and(|l| {
                    l.starts_with("HTTP/1.") && l.split(' ').nth(1) == Some("200")
                });
                let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
                (true, status_ok && body.lines().any(|l| l.trim() == want))
            }
        };
        let owner = listener_runs_script(probe, f.port, &f.script)?;
        // The script itself must be the shipped one (its mode may change, not its code).
        let (script_intact, _) = util::content_check(
            probe,
            &f.script,
            &util::sha256_hex(server_script(&f.app).as_bytes()),
            1 << 20,
        )?;
        Ok(Verdict::from_checks(vec![
            (
                script_intact,
                format!("{} is not the shipped server any more", f.script),
            ),
            (answered, format!("nothing answers on 127.0.0.1:{}", f.port)),
            (
                right,
                "the reply is not a 200 carrying the nonce's token".to_string(),
            ),
            (
                owner,
                format!("the listener on port {} is not {}", f.port, f.script),
            ),
        ]))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        // Whatever already listens on the port (a squatter) goes first: the sockets' inodes
        // from /proc/net/tcp{,6}, their owners from /proc/PID/fd.
        let evict = r#"my $port = shift; my %ino;
for my $t ("/proc/net/tcp", "/proc/net/tcp6") {
  open my $f, "<", $t or next; <$f>;
  while (<$f>) { my @c = split; next unless $c[3] eq "0A";
    my ($p) = $c[1] =~ /:([0-9A-F]+)$/; $ino{$c[9]} = 1 if hex($p) == $port }
}
exit 0 unless %ino; my @k;
for my $d (glob "/proc/[0-9]*") {
  my ($pid) = $d =~ /(\d+)$/; next if $pid == $$; opendir my $fd, "$d/fd" or next;
  for (readdir $fd) { my $l = readlink("$d/fd/$_") // next;
    if ($l =~ /^socket:\[(\d+)\]$/ && $ino{$1}) { push @k, $pid; last } }
}
kill 9, @k; select undef, undef, undef, 0.2; exit 0;"#;
        let script = format!(
            "/usr/bin/perl -e {evict} {port}; \
             /bin/chmod 644 {conf} 2>/dev/null; printf %s {good} > {conf} && /bin/mkdir -p {log} && \
             /bin/chmod 755 {s} && ( /usr/bin/perl {s} {conf} >/dev/null 2>&1 < /dev/null & ) && {wait}",
            evict = sh_quote(evict),
            port = f.port,
            conf = sh_quote(&f.conf),
            good = sh_quote(&f.good_conf),
            log = sh_quote(&f.log_dir),
            s = sh_quote(&f.script),
            wait = wait_listening(f.port),
        );
        vec![format!(
            "cd / && {CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&script)
        )]
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let port = f.port;
        let secret_file = format!("/etc/{}/secret", f.app);
        let static_server = format!(
            "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => \"127.0.0.1\", LocalPort => {port}, Listen => 5, ReuseAddr => 1) or die; \
             while ($c = $s->accept) {{ <$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n{app} ok\\ntoken=00\\n\"; close $c }}'",
            app = f.app
        );
        let other_conf = f
            .good_conf
            .replace(&format!("port = {port}"), &format!("port = {}", port + 1000));
        let private_conf = f.good_conf.replace(
            &format!("log_dir = {}", f.log_dir),
            "log_dir = /tmp/hacklog",
        );
        let fix = format!(
            "printf %s {good} > {conf} && mkdir -p {log} && chmod 755 {s}",
            good = sh_quote(&f.good_conf),
            conf = f.conf,
            log = f.log_dir,
            s = f.script
        );
        [
            ("APP", f.app.clone()),
            ("PORT", port.to_string()),
            ("SCRIPT", f.script.clone()),
            ("CONF", f.conf.clone()),
            ("START", format!("/opt/{}/start.sh", f.app)),
            ("LOG_DIR", f.log_dir.clone()),
            ("SECRET_FILE", secret_file.clone()),
            ("GOOD_CONF", sh_quote(&f.good_conf)),
            ("OTHER_CONF", sh_quote(&other_conf)),
            ("PRIVATE_CONF", sh_quote(&private_conf)),
            ("FIX", fix),
            ("WAIT", wait_listening(port)),
            ("STATIC_SERVER", static_server),
            ("FAKE_PL", sh_quote(&fake_pl(&secret_file, port))),
            ("FAKE_PY", sh_quote(&fake_py(&secret_file, port))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Whether a socket listening on `127.0.0.1:port` (or any address) belongs to a live process
/// whose command line runs `script`: the socket's inode from `/proc/net/tcp`, matched against
/// the `socket:[inode]` links in the processes' `/proc/PID/fd`.
fn listener_runs_script(
    probe: &mut dyn Probe,
    port: u16,
    script: &str,
) -> Result<bool, ProbeError> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Some(text) = probe.read(table, 4 << 20)? else {
            continue;
        };
        for line in String::from_utf8_lossy(&text).lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let Some(p) = f[1].rsplit(':').next() else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return Ok(false);
    }
    for p in probe.processes()? {
        // The real server: perl running the script itself (`perl SCRIPT ...`, which is also
        // what the kernel makes of `SCRIPT ...` with its shebang), not a copy that merely
        // names the script among its arguments.
        let runs_it = p.cmdline.len() >= 2
            && p.cmdline[1] == script
            && p.cmdline[0]
                .rsplit('/')
                .next()
                .is_some_and(|b| b.starts_with("perl"));
        if p.state == 'Z' || !runs_it {
            continue;
        }
        let dir = format!("/proc/{}/fd", p.pid);
        let Some(fds) = probe.list(&dir)? else {
            continue;
        };
        for fd in fds {
            if let Some(st) = probe.stat(&format!("{dir}/{}", fd.name))? {
                if st
                    .symlink_target
                    .as_ref()
                    .is_some_and(|t| inodes.contains(t))
                {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_matches_the_perl_definition() {
        // ord('a') ^ ord('k') = 0x0a, ord('b') ^ ord('e') = 0x07, ord('c') ^ ord('k') = 0x08.
        assert_eq!(token("ke", "abc"), "0a0708");
        assert_eq!(token("", "abc"), "");
    }
}
